//! A namespace's clear record, so that a clear costs the store one write
//! whatever the number of keys: what
//! [`Store::clear_namespace`](super::Store::clear_namespace) keeps under
//! `<key_prefix><namespace>:c`, and the rule every backend applies to it.
//!
//! # The record
//!
//! Five decimal numbers joined by `:`: `N:H:T:W:L`.
//!
//! - `N`, the namespace generation: every entry written since the first
//!   clear records the generation its load began under (`entry`, extension
//!   kind 3). The first clear starts it at a fresh value drawn at random
//!   (as a tag counter's), so entries recorded under a lost record match
//!   nothing; each clear adds one.
//! - `H`, the hard floor: an entry whose generation is below it was
//!   cleared hard (a miss). A hard clear sets it to the new `N`; a soft one
//!   leaves it.
//! - `T`, the store-clock millisecond of the last soft clear, and `W`, its
//!   spread window in milliseconds: an entry whose generation is at least
//!   `H` but below `N` stays fresh until a moment in `[T, T + W)` (see
//!   `cache::clear`), then is stale.
//! - `L`, the generation of entries that record none (written before the
//!   first clear): the first clear's `N` minus one, fixed from then on
//!   (and the first `H`, so a first soft clear leaves them soft).
//!
//! No record (none was ever made, or it was lost) leaves entries that
//! record no generation valid, and makes every entry that records one a
//! miss: a lost record never validates a recorded generation. Anything
//! else under the key (foreign bytes) counts as no record. The record has
//! no TTL (`SET` without `PX`), so no `volatile-*` eviction policy drops it.

use super::generation::{MAX_GENERATION, parse_generation};

/// A namespace's clear record; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NamespaceState {
    /// `N`: the current generation.
    pub(crate) generation: u64,
    /// `H`: entries recorded below it are cleared hard.
    pub(crate) floor: u64,
    /// `T`: when the last soft clear was made, store-clock ms.
    pub(crate) soft_at: u64,
    /// `W`: the last soft clear's spread window, ms.
    pub(crate) window: u64,
    /// `L`: the generation of entries that record none.
    pub(crate) legacy: u64,
}

impl NamespaceState {
    /// The record as stored.
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{}:{}:{}:{}:{}",
            self.generation, self.floor, self.soft_at, self.window, self.legacy
        )
        .into_bytes()
    }

    /// A record as stored; `None` for anything that is not one (five
    /// numbers of 1 to 16 digits, below [`MAX_GENERATION`], with `H <= N`
    /// and `L < N`).
    pub(crate) fn parse(stored: &[u8]) -> Option<NamespaceState> {
        let mut parts = stored.split(|&b| b == b':');
        let mut next = || parts.next().and_then(parse_generation);
        let state = NamespaceState {
            generation: next()?,
            floor: next()?,
            soft_at: next()?,
            window: next()?,
            legacy: next()?,
        };
        if parts.next().is_some()
            || state.floor > state.generation
            || state.legacy >= state.generation
        {
            return None;
        }
        Some(state)
    }

    /// The record after one more clear made at store-clock `now_ms`: over
    /// `held` (the record found, `None` for none or foreign bytes), `hard`
    /// or soft over `window_ms`; `fresh` starts a record (a value from
    /// `[2^40, 2^52)` drawn at random by the caller).
    pub(crate) fn cleared(
        held: Option<NamespaceState>,
        hard: bool,
        window_ms: u64,
        now_ms: u64,
        fresh: u64,
    ) -> NamespaceState {
        let mut state = match held {
            Some(mut state) => {
                state.generation = (state.generation + 1).min(MAX_GENERATION - 1);
                state
            }
            // A first clear (or one over a lost record): entries that
            // record a generation match nothing; those that record none
            // are the legacy generation, the floor of a soft clear.
            None => NamespaceState {
                generation: fresh + 1,
                floor: fresh,
                soft_at: 0,
                window: 0,
                legacy: fresh,
            },
        };
        if hard {
            state.floor = state.generation;
        } else {
            state.soft_at = now_ms;
            state.window = window_ms;
        }
        state
    }

    /// How an entry that recorded `recorded` (`None`: it records none)
    /// stands: [`Standing::Current`], cleared soft, or cleared hard.
    pub(crate) fn standing(state: Option<&NamespaceState>, recorded: Option<u64>) -> Standing {
        match (state, recorded) {
            (None, None) => Standing::Current,
            (None, Some(_)) => Standing::Cleared,
            (Some(state), recorded) => {
                let generation = recorded.unwrap_or(state.legacy);
                if generation == state.generation {
                    Standing::Current
                } else if generation >= state.floor && generation < state.generation {
                    Standing::Soft {
                        at: state.soft_at,
                        window: state.window,
                    }
                } else {
                    Standing::Cleared
                }
            }
        }
    }
}

/// How an entry stands against its namespace's clear record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Written under the current generation (or no clear was made).
    Current,
    /// Cleared soft, at store-clock `at`, spread over `window` ms.
    Soft { at: u64, window: u64 },
    /// Cleared hard, or recorded under a record that was lost: a miss.
    Cleared,
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH: u64 = 1 << 45;

    #[test]
    fn records_round_trip_and_foreign_bytes_are_none() {
        let state = NamespaceState::cleared(None, true, 0, 5, FRESH);
        assert_eq!(NamespaceState::parse(&state.encode()), Some(state));
        for foreign in [
            &b""[..],
            b"1",
            b"1:1:0:0",
            b"2:1:0:0:1:9",
            b"2:3:0:0:1",
            b"2:1:0:0:2",
            b"a:1:0:0:0",
            b"2:1:0:0:-1",
            b"9007199254740992:1:0:0:0",
        ] {
            assert_eq!(NamespaceState::parse(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn hard_and_soft_clears_stand_as_documented() {
        // Before any clear, entries that record nothing are current.
        assert_eq!(NamespaceState::standing(None, None), Standing::Current);
        assert_eq!(NamespaceState::standing(None, Some(7)), Standing::Cleared);
        // A first soft clear: old entries soft, new ones current.
        let soft = NamespaceState::cleared(None, false, 60_000, 1_000, FRESH);
        assert_eq!(
            NamespaceState::standing(Some(&soft), None),
            Standing::Soft {
                at: 1_000,
                window: 60_000
            }
        );
        assert_eq!(
            NamespaceState::standing(Some(&soft), Some(soft.generation)),
            Standing::Current
        );
        // Then a hard one: everything before it is a miss.
        let hard = NamespaceState::cleared(Some(soft), true, 0, 2_000, FRESH + 99);
        assert_eq!(hard.generation, soft.generation + 1);
        for before in [None, Some(soft.generation)] {
            assert_eq!(
                NamespaceState::standing(Some(&hard), before),
                Standing::Cleared
            );
        }
        // A soft one after it: entries since the hard clear are soft,
        // entries from before it still a miss.
        let again = NamespaceState::cleared(Some(hard), false, 5_000, 3_000, FRESH + 7);
        assert_eq!(
            NamespaceState::standing(Some(&again), Some(hard.generation)),
            Standing::Soft {
                at: 3_000,
                window: 5_000
            }
        );
        assert_eq!(
            NamespaceState::standing(Some(&again), Some(soft.generation)),
            Standing::Cleared
        );
        assert_eq!(
            NamespaceState::standing(Some(&again), None),
            Standing::Cleared
        );
        // A generation from a lost record (or from the future) matches
        // nothing.
        assert_eq!(
            NamespaceState::standing(Some(&again), Some(again.generation + 1)),
            Standing::Cleared
        );
    }
}
