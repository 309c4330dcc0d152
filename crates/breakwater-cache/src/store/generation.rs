//! Generations, as tag counters and clear records hold them: decimal
//! numbers below 2^53 (exact in a Lua number), started at a value drawn
//! at random from [`FRESH_GENERATIONS`], and a tag counter's state.

/// Where the cache draws a [`Store::bump_generation`](super::Store::bump_generation) or
/// [`Store::tag_generations`](super::Store::tag_generations) `fresh` value: `[2^40, 2^52)`, far from any
/// small count and exact in a Lua number (a double), with room to be
/// bumped below [`MAX_GENERATION`].
pub(crate) const FRESH_GENERATIONS: std::ops::Range<u64> = (1 << 40)..(1 << 52);

/// Generations are below 2^53, where Lua numbers stop being exact.
pub(crate) const MAX_GENERATION: u64 = 1 << 53;

/// A tag counter's generation as stored: 1 to 16 decimal digits, below
/// [`MAX_GENERATION`]; `None` for anything else (the counter is then
/// recreated with a fresh value by a write, and validates nothing).
pub(crate) fn parse_generation(stored: &[u8]) -> Option<u64> {
    if stored.is_empty() || stored.len() > 16 {
        return None;
    }
    let mut n = 0u64;
    for &digit in stored {
        if !digit.is_ascii_digit() {
            return None;
        }
        n = n * 10 + u64::from(digit - b'0');
    }
    (n < MAX_GENERATION).then_some(n)
}

/// What a tag counter holds: its current generation, the oldest generation
/// an entry may have recorded and still be served (stale), and when the
/// last soft bump ([`Store::expire_generation`](super::Store::expire_generation)) happened.
///
/// Stored as decimal digits: `G` alone (no soft bump since the last hard
/// one: the floor is `G`), or `G:H:T` after a soft bump (`H` the floor,
/// `T` the store-clock ms of the bump); each part 1 to 16 digits below
/// [`MAX_GENERATION`], and `H <= G`. Anything else is foreign: no state,
/// which validates nothing ([`parse_tag_state`]).
///
/// An entry that recorded generation `g` of the counter is, by
/// [`judge`](TagState::judge): valid if `g == G`; stale as of `T` if
/// `H <= g < G` (a soft bump came after its load); a miss otherwise (a hard
/// bump came after it, or the counter was lost and started again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TagState {
    /// `G`: what a write records now.
    pub(crate) generation: u64,
    /// `H`: the generation of the last hard bump (or the counter's
    /// start); entries that recorded one below it are misses.
    pub(crate) floor: u64,
    /// `T`: the store-clock ms of the last soft bump; 0 without one.
    pub(crate) expired_at: u64,
}

/// What a tag counter's state says of an entry that recorded one of its
/// generations; see [`TagState::judge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TagJudgment {
    /// Recorded the current generation.
    Valid,
    /// Recorded one from before a soft bump (and after the last hard one):
    /// stale from the bump's store-clock ms on.
    StaleFrom(u64),
    /// Recorded one from before a hard bump, or one the counter never had.
    Miss,
}

impl TagState {
    /// A counter that starts (again) at `generation`, or was hard-bumped to
    /// it: nothing below it is served.
    pub(crate) fn plain(generation: u64) -> TagState {
        TagState {
            generation,
            floor: generation,
            expired_at: 0,
        }
    }

    /// The state after a hard bump ([`Store::bump_generation`](super::Store::bump_generation)) of this one.
    pub(crate) fn bumped(self) -> TagState {
        TagState::plain(self.generation + 1)
    }

    /// The state after a soft bump ([`Store::expire_generation`](super::Store::expire_generation)) at
    /// store-clock `at_ms`: one generation on, the floor kept.
    pub(crate) fn expired(self, at_ms: u64) -> TagState {
        TagState {
            generation: self.generation + 1,
            floor: self.floor,
            expired_at: at_ms,
        }
    }

    /// What this state says of an entry that recorded `recorded`.
    pub(crate) fn judge(&self, recorded: u64) -> TagJudgment {
        if recorded == self.generation {
            TagJudgment::Valid
        } else if self.floor <= recorded && recorded < self.generation {
            TagJudgment::StaleFrom(self.expired_at)
        } else {
            TagJudgment::Miss
        }
    }

    /// The state as stored: `G`, or `G:H:T` once a soft bump left a floor
    /// below `G`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        if self.floor == self.generation {
            self.generation.to_string().into_bytes()
        } else {
            format!("{}:{}:{}", self.generation, self.floor, self.expired_at).into_bytes()
        }
    }
}

/// A tag counter's state as stored (see [`TagState`]): `G`, or `G:H:T`
/// with `H <= G`, each part 1 to 16 decimal digits below
/// [`MAX_GENERATION`]; `None` for anything else. No allocation: the read
/// path parses a counter on every store read of a tagged entry.
pub(crate) fn parse_tag_state(stored: &[u8]) -> Option<TagState> {
    let Some(first) = stored.iter().position(|&b| b == b':') else {
        return parse_generation(stored).map(TagState::plain);
    };
    let generation = parse_generation(&stored[..first])?;
    let rest = &stored[first + 1..];
    let second = rest.iter().position(|&b| b == b':')?;
    let floor = parse_generation(&rest[..second])?;
    let expired_at = parse_generation(&rest[second + 1..])?;
    (floor <= generation).then_some(TagState {
        generation,
        floor,
        expired_at,
    })
}
