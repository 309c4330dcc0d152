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
/// `T` the store-clock ms of the bump), or `G:H:T:F` once a write of tags
/// chosen after a load has read it (`F` the store-clock ms of the
/// counter's last hard change: see
/// [`Store::tag_states`](super::Store::tag_states)); each part 1 to 16
/// digits below [`MAX_GENERATION`], and `H <= G`. Anything else is
/// foreign: no state, which validates nothing ([`parse_tag_state`]).
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
    /// `F`: the store-clock ms of the counter's last hard change (its
    /// start, or the first [`Store::tag_states`](super::Store::tag_states)
    /// read after a hard bump, which writes plain digits); 0 if unknown.
    pub(crate) hard_at: u64,
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
            hard_at: 0,
        }
    }

    /// A counter started at `generation` at store-clock `now_ms` (by
    /// [`Store::tag_states`](super::Store::tag_states)).
    pub(crate) fn started(generation: u64, now_ms: u64) -> TagState {
        TagState {
            hard_at: now_ms.max(1),
            ..TagState::plain(generation)
        }
    }

    /// This state as [`Store::tag_states`](super::Store::tag_states)
    /// leaves it at store-clock `now_ms`: a last hard change of unknown
    /// time is taken to be now.
    pub(crate) fn dated(self, now_ms: u64) -> TagState {
        if self.hard_at != 0 {
            return self;
        }
        TagState {
            hard_at: now_ms.max(1),
            ..self
        }
    }

    /// The generation a write of a value whose load started at store-clock
    /// `started_ms` records for this counter when its tag was chosen after
    /// the load (read with [`Store::tag_states`](super::Store::tag_states)):
    /// `None` if the counter may have changed hard since the load started
    /// (`F` not before it, less `skew_ms`: the value may be older than
    /// that change, so it is not written); one below the current
    /// generation if a soft bump came since (the entry lands stale from
    /// it); else the current one.
    pub(crate) fn stamp_after(&self, started_ms: u64, skew_ms: u64) -> Option<u64> {
        let since = started_ms.saturating_sub(skew_ms);
        if self.hard_at == 0 || self.hard_at >= since {
            return None;
        }
        if self.floor < self.generation && self.expired_at >= since {
            return Some(self.generation - 1);
        }
        Some(self.generation)
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
            hard_at: self.hard_at,
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
    /// (`G:H:T:F` once the time of its last hard change is known.)
    pub(crate) fn encode(&self) -> Vec<u8> {
        if self.hard_at != 0 {
            format!(
                "{}:{}:{}:{}",
                self.generation, self.floor, self.expired_at, self.hard_at
            )
            .into_bytes()
        } else if self.floor == self.generation {
            self.generation.to_string().into_bytes()
        } else {
            format!("{}:{}:{}", self.generation, self.floor, self.expired_at).into_bytes()
        }
    }
}

/// A tag counter's state as stored (see [`TagState`]): `G`, `G:H:T` or
/// `G:H:T:F` with `H <= G`, each part 1 to 16 decimal digits below
/// [`MAX_GENERATION`]; `None` for anything else. No allocation: the read
/// path parses a counter on every store read of a tagged entry.
pub(crate) fn parse_tag_state(stored: &[u8]) -> Option<TagState> {
    let mut parts = stored.split(|&b| b == b':');
    let generation = parse_generation(parts.next()?)?;
    let Some(floor) = parts.next() else {
        return Some(TagState::plain(generation));
    };
    let floor = parse_generation(floor)?;
    let expired_at = parse_generation(parts.next()?)?;
    let hard_at = match parts.next() {
        None => 0,
        Some(hard_at) => parse_generation(hard_at)?,
    };
    (parts.next().is_none() && floor <= generation).then_some(TagState {
        generation,
        floor,
        expired_at,
        hard_at,
    })
}
