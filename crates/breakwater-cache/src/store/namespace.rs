//! A namespace's clear record, so that a clear costs the store one write
//! whatever the number of keys: what
//! [`Store::clear_namespace`](super::Store::clear_namespace) keeps under
//! `<key_prefix><namespace>:c`, and the rule every backend applies to it.
//!
//! # The record
//!
//! Seven decimal numbers joined by `:`: `N:H:T:W:L:S:E` (a record of
//! five, `N:H:T:W:L`, reads as one with `S = H` and `E = 0`).
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
//! - `S` and `E`: an entry whose generation is at least `H` but below `S`
//!   is stale from store-clock `E` at the latest, whatever `T` and `W`
//!   say.
//!
//! One soft mark (`T`, `W`) is kept, and a later soft clear never makes an
//! entry fresher than an earlier one left it. A soft clear made while the
//! previous one's window is still open keeps `T` and ends the window no
//! later than either would (`W = min(W, now + window − T)`: the moments
//! only move earlier). One made after it ended moves that window's
//! entries (`g < N`) under `S = N`, `E = T + W` (stale by then already),
//! and starts its own mark. A hard clear leaves nothing below `H` to
//! judge.
//!
//! No record (none was ever made, or it was lost) leaves entries that
//! record no generation valid; an entry that records one was written
//! under a record that was lost, and is judged as an adopting pin (below)
//! judges it, until a process puts the record back or makes that pin (see
//! `cache::clear`). Anything else under the key (foreign bytes) counts as
//! no record. The record has
//! no TTL (`SET` without `PX`), so no `volatile-*` eviction policy drops it.
//!
//! # A pin: the record a write makes
//!
//! Every entry records a generation, also before the first clear: a write
//! that finds no record makes one first (a pin, `NamespaceClear::pin`),
//! which clears nothing: `N = fresh + 1`, `H = 0`, `T` the store's now,
//! `W` = [`PIN_WINDOW`] (a window no clear has), `L = fresh`, `S = E = 0`.
//! `H = 0` makes it an *adopting* pin: an entry of any generation but `N`
//! (one a lost record's process wrote, above or below `N`; or none) is
//! judged as after a soft clear over one TTL made at `T`: stale at its own
//! expiry, at the latest at a moment within one TTL from `T`
//! ([`Standing::Adopted`]). So a lost record never turns the namespace
//! into a miss. A clear over a pin is a first clear: a hard one leaves
//! nothing from before it; a soft one judges everything from before it
//! (with `H = 0`, of any generation) by its own window.
//!
//! A pin may instead put back a record a process knew (`restore`): written
//! only over none, not published (it changes nothing anyone knew).
//!
//! Pins made by builds before adopting pins have `H = L = S = fresh`:
//! entries in `[H, N)` are current under them, others a miss. Read by a
//! build that does not know pins, a pin is a soft clear whose window never
//! ends: every entry keeps its own expiry (one that does not know adopting
//! pins also takes generations above `N` for a miss).

use super::generation::{MAX_GENERATION, parse_generation};

/// A pin's `W`: a window no clear has (they are at most a year), which
/// says no clear was made over the record's generation.
pub(crate) const PIN_WINDOW: u64 = MAX_GENERATION - 1;

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
    /// `S`: entries recorded at or above `H` but below it are stale from
    /// `E` at the latest.
    pub(crate) stale_below: u64,
    /// `E`: see `S`.
    pub(crate) stale_by: u64,
}

impl NamespaceState {
    /// The record as stored.
    pub(crate) fn encode(&self) -> Vec<u8> {
        format!(
            "{}:{}:{}:{}:{}:{}:{}",
            self.generation,
            self.floor,
            self.soft_at,
            self.window,
            self.legacy,
            self.stale_below,
            self.stale_by
        )
        .into_bytes()
    }

    /// A record as stored; `None` for anything that is not one (seven or
    /// five numbers of 1 to 16 digits, below [`MAX_GENERATION`], with
    /// `H <= N`, `L < N` and `S <= N`).
    pub(crate) fn parse(stored: &[u8]) -> Option<NamespaceState> {
        let mut parts = stored.split(|&b| b == b':');
        let mut next = || parts.next().map(parse_generation);
        let mut state = NamespaceState {
            generation: next()??,
            floor: next()??,
            soft_at: next()??,
            window: next()??,
            legacy: next()??,
            stale_below: 0,
            stale_by: 0,
        };
        match (next(), next(), next()) {
            (None, None, None) => state.stale_below = state.floor,
            (Some(Some(below)), Some(Some(by)), None) => {
                state.stale_below = below;
                state.stale_by = by;
            }
            _ => return None,
        }
        if state.floor > state.generation
            || state.legacy >= state.generation
            || state.stale_below > state.generation
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
                stale_below: fresh,
                stale_by: 0,
            },
        };
        // The soft mark judges the generations in [H, N) before this
        // clear: none after a hard clear, or before any record.
        let marked = held.is_some_and(|held| held.floor < held.generation && !held.is_pin());
        let ends = state.soft_at.saturating_add(state.window);
        if hard {
            state.floor = state.generation;
            state.stale_below = state.generation;
            state.stale_by = 0;
        } else if marked && ends > now_ms {
            // The earlier window still open: its start kept, its end no
            // later than either's.
            let end = now_ms.saturating_add(window_ms);
            state.window = state.window.min(end.saturating_sub(state.soft_at));
        } else {
            if marked {
                // Its window over: everything it judged is stale by its end.
                state.stale_below = state.generation - 1;
                state.stale_by = ends;
            }
            state.soft_at = now_ms;
            state.window = window_ms;
        }
        state
    }

    /// The record a pin makes over `held` (what the key held; a record
    /// held is kept): `restore`, the record a process knew, put back as it
    /// was; else an adopting pin at store-clock `now_ms`, starting at
    /// `fresh` (see the module docs). Also whether it is new.
    pub(crate) fn pinned(
        held: Option<NamespaceState>,
        restore: Option<NamespaceState>,
        now_ms: u64,
        fresh: u64,
    ) -> (NamespaceState, bool) {
        match (held, restore) {
            (Some(held), _) => (held, false),
            (None, Some(restore)) => (restore, true),
            (None, None) => (NamespaceState::adopting(now_ms, fresh), true),
        }
    }

    /// The pin a write (or a process that found the record lost) makes
    /// over none at store-clock `now_ms`: `N = fresh + 1`, `H = 0`, `T`
    /// now, `W` = [`PIN_WINDOW`], `L = fresh`, `S = E = 0`. Entries of any
    /// other generation (a lost record's) are adopted: each turns stale at
    /// its own expiry, at the latest at a moment within one TTL from `T`.
    pub(crate) fn adopting(now_ms: u64, fresh: u64) -> NamespaceState {
        NamespaceState {
            generation: fresh + 1,
            floor: 0,
            soft_at: now_ms,
            window: PIN_WINDOW,
            legacy: fresh,
            stale_below: 0,
            stale_by: 0,
        }
    }

    /// The record after a clear (`pin`: a pin, putting back `restore` if
    /// given) over `held` at store-clock `now_ms`, and what the store does
    /// with it: what every backend does with a `NamespaceClear` of these
    /// fields.
    pub(crate) fn applied(
        held: Option<NamespaceState>,
        clear: Clear<'_>,
        now_ms: u64,
    ) -> (NamespaceState, Applied) {
        if clear.pin {
            let restore = clear.restore.and_then(NamespaceState::parse);
            let (state, new) = NamespaceState::pinned(held, restore, now_ms, clear.fresh);
            let applied = match (new, restore.is_some()) {
                (false, _) => Applied::Kept,
                // A record put back changes nothing anyone knows: not
                // published (its hearers would take it for a clear).
                (true, true) => Applied::Written,
                (true, false) => Applied::Published,
            };
            return (state, applied);
        }
        let state = NamespaceState::cleared(held, clear.hard, clear.window_ms, now_ms, clear.fresh);
        (state, Applied::Published)
    }

    /// Whether this is a pin no clear was made over (see the module docs).
    pub(crate) fn is_pin(&self) -> bool {
        self.floor < self.generation && self.window == PIN_WINDOW
    }

    /// Whether entries of generation `g` are among those this record
    /// judges by its soft mark (or, a pin, leaves as they are): `H <= g <
    /// N`, or, with `H = 0` (an adopting pin, or a clear over one), any `g`
    /// but `N` (a lost record's generations may lie above the new one).
    fn covers(&self, g: u64) -> bool {
        (g >= self.floor && g < self.generation) || (self.floor == 0 && g != self.generation)
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
                } else if state.is_pin() && state.floor == 0 {
                    // An adopting pin: a lost record's entries.
                    Standing::Adopted { at: state.soft_at }
                } else if state.is_pin() && state.covers(generation) {
                    // Nothing was cleared over a pin.
                    Standing::Current
                } else if state.covers(generation) {
                    Standing::Soft {
                        at: state.soft_at,
                        window: state.window,
                        by: (generation < state.stale_below).then_some(state.stale_by),
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
    /// Cleared soft, at store-clock `at`, spread over `window` ms; stale
    /// from store-clock `by` at the latest, if given.
    Soft {
        at: u64,
        window: u64,
        by: Option<u64>,
    },
    /// Written under a record that was lost, adopted by a pin made at
    /// store-clock `at`: stale at its own expiry, at the latest at a
    /// moment within one TTL from `at` (a soft clear over one TTL).
    Adopted { at: u64 },
    /// Cleared hard, or recorded under a record other than the one held (a
    /// hard clear's floor is above it): a miss.
    Cleared,
}

/// The fields of a `NamespaceClear` the record's rule reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clear<'a> {
    pub(crate) pin: bool,
    pub(crate) restore: Option<&'a [u8]>,
    pub(crate) hard: bool,
    pub(crate) window_ms: u64,
    pub(crate) fresh: u64,
}

/// What a store does with the record [`NamespaceState::applied`] made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// The record held stays (a pin over a record): nothing written.
    Kept,
    /// Written, not published (a record put back).
    Written,
    /// Written and published.
    Published,
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRESH: u64 = 1 << 45;

    #[test]
    fn records_round_trip_and_foreign_bytes_are_none() {
        let state = NamespaceState::cleared(None, true, 0, 5, FRESH);
        assert_eq!(NamespaceState::parse(&state.encode()), Some(state));
        // A record of five numbers (before `S` and `E`).
        let five = NamespaceState::parse(b"9:4:100:50:3").unwrap();
        assert_eq!((five.stale_below, five.stale_by), (4, 0));
        for foreign in [
            &b""[..],
            b"1",
            b"1:1:0:0",
            b"2:1:0:0:1:9",
            b"2:1:0:0:1:3:0",
            b"2:1:0:0:1:1:0:0",
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
                window: 60_000,
                by: None
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
                window: 5_000,
                by: None
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

    #[test]
    fn a_pin_clears_nothing_and_a_clear_over_it_is_a_first_clear() {
        // A pin made before PIN_WINDOW's adopting form (`H = fresh`).
        let pin = NamespaceState {
            generation: FRESH + 1,
            floor: FRESH,
            soft_at: 1_000,
            window: PIN_WINDOW,
            legacy: FRESH,
            stale_below: FRESH,
            stale_by: 0,
        };
        assert!(pin.is_pin());
        assert_eq!(NamespaceState::parse(&pin.encode()), Some(pin));
        for recorded in [None, Some(pin.generation)] {
            assert_eq!(
                NamespaceState::standing(Some(&pin), recorded),
                Standing::Current
            );
        }
        // A record held is kept; one given is put back over none.
        let soft = NamespaceState::cleared(Some(pin), false, 60_000, 5_000, FRESH + 9);
        assert_eq!(
            NamespaceState::pinned(Some(soft), None, 6_000, FRESH + 3),
            (soft, false)
        );
        assert_eq!(
            NamespaceState::pinned(None, Some(soft), 6_000, FRESH + 3),
            (soft, true)
        );
        // A soft clear over it: its own window, from its own start, for
        // what was written under the pin and before it.
        assert!(!soft.is_pin());
        for recorded in [None, Some(pin.generation)] {
            assert_eq!(
                NamespaceState::standing(Some(&soft), recorded),
                Standing::Soft {
                    at: 5_000,
                    window: 60_000,
                    by: None
                }
            );
        }
        let hard = NamespaceState::cleared(Some(pin), true, 0, 5_000, FRESH + 9);
        assert_eq!(
            NamespaceState::standing(Some(&hard), Some(pin.generation)),
            Standing::Cleared
        );
        // Another pin's generation matches nothing.
        let other = NamespaceState {
            generation: FRESH + 6,
            floor: FRESH + 5,
            legacy: FRESH + 5,
            stale_below: FRESH + 5,
            ..pin
        };
        assert_eq!(
            NamespaceState::standing(Some(&pin), Some(other.generation)),
            Standing::Cleared
        );
    }

    /// The pin made over none adopts every entry a lost record left,
    /// whatever its generation (above or below its own), and the entries
    /// that record none; what is written under it is current. A hard
    /// clear over it leaves nothing from before; a soft one judges all of
    /// it by its window.
    #[test]
    fn an_adopting_pin_judges_a_lost_records_entries_as_a_soft_clear_over_one_ttl() {
        let (pin, new) = NamespaceState::pinned(None, None, 1_000, FRESH);
        assert!(new && pin.is_pin() && pin.floor == 0);
        assert_eq!(NamespaceState::parse(&pin.encode()), Some(pin));
        assert_eq!(
            NamespaceState::standing(Some(&pin), Some(pin.generation)),
            Standing::Current
        );
        for lost in [None, Some(3), Some(FRESH - 7), Some(FRESH + 100)] {
            assert_eq!(
                NamespaceState::standing(Some(&pin), lost),
                Standing::Adopted { at: 1_000 },
                "{lost:?}"
            );
        }
        let hard = NamespaceState::cleared(Some(pin), true, 0, 2_000, FRESH + 9);
        for before in [Some(pin.generation), Some(FRESH + 100), None] {
            assert_eq!(
                NamespaceState::standing(Some(&hard), before),
                Standing::Cleared
            );
        }
        let soft = NamespaceState::cleared(Some(pin), false, 5_000, 2_000, FRESH + 9);
        for before in [Some(pin.generation), Some(FRESH + 100), None] {
            assert_eq!(
                NamespaceState::standing(Some(&soft), before),
                Standing::Soft {
                    at: 2_000,
                    window: 5_000,
                    by: None
                }
            );
        }
    }

    #[test]
    fn a_later_soft_clear_never_makes_an_entry_fresher() {
        let first = NamespaceState::cleared(None, false, 60_000, 1_000, FRESH);
        let old = Some(first.generation - 1);
        // Another soft clear inside the first's window: its start kept,
        // its end the earlier of the two.
        let second = NamespaceState::cleared(Some(first), false, 100_000, 11_000, FRESH);
        assert_eq!((second.soft_at, second.window), (1_000, 60_000));
        let third = NamespaceState::cleared(Some(second), false, 10_000, 21_000, FRESH);
        assert_eq!((third.soft_at, third.window), (1_000, 30_000));
        assert_eq!(
            NamespaceState::standing(Some(&third), old),
            Standing::Soft {
                at: 1_000,
                window: 30_000,
                by: None
            }
        );
        // One after the window ended: the entries it judged are stale by
        // its end; those written since, over the new window.
        let fourth = NamespaceState::cleared(Some(third), false, 50_000, 40_000, FRESH);
        assert_eq!((fourth.soft_at, fourth.window), (40_000, 50_000));
        assert_eq!(
            NamespaceState::standing(Some(&fourth), old),
            Standing::Soft {
                at: 40_000,
                window: 50_000,
                by: Some(31_000)
            }
        );
        assert_eq!(
            NamespaceState::standing(Some(&fourth), Some(third.generation)),
            Standing::Soft {
                at: 40_000,
                window: 50_000,
                by: None
            }
        );
        assert_eq!(NamespaceState::parse(&fourth.encode()), Some(fourth));
        // After a hard clear, a soft one starts its own mark.
        let hard = NamespaceState::cleared(Some(fourth), true, 0, 45_000, FRESH);
        let soft = NamespaceState::cleared(Some(hard), false, 5_000, 46_000, FRESH);
        assert_eq!(
            (soft.soft_at, soft.window, soft.stale_below),
            (46_000, 5_000, hard.generation)
        );
        assert_eq!(
            NamespaceState::standing(Some(&soft), Some(hard.generation)),
            Standing::Soft {
                at: 46_000,
                window: 5_000,
                by: None
            }
        );
    }
}
