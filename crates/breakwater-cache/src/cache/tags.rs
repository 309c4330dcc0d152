//! Tag invalidation: entries written with tags, and
//! [`Cache::invalidate_tag`](crate::Cache::invalidate_tag), which makes every entry carrying a tag
//! unreachable, fleet-wide, in one store operation (and
//! [`Cache::expire_tag`](crate::Cache::expire_tag), which makes them stale).
//!
//! # Generations, checked on read
//!
//! Each tag has a generation counter in the store, under
//! `<key_prefix><namespace>:t:{<tag>}` (no version in it: both versions of
//! a version transition share their tags; its own hash tag, so the tags of
//! a namespace spread over a Redis Cluster). One rule: **a lost counter
//! never validates an entry.** The store forgets (a counter is evicted
//! under `maxmemory`, deleted, expired, lost in a failover), so an entry
//! only ever records generations of counters that exist, and a counter
//! that is missing equals nothing.
//!
//! - **Write**: a load with tags reads its tags' generations *after* it has
//!   taken the key's lease and *before* its loader runs, and records them
//!   in the entry (format version 2, see `entry`). The read creates what
//!   is missing ([`Store::tag_generations`](crate::Store::tag_generations): one script, one per slot on a
//!   Cluster, atomic per counter): a missing counter, or one that holds no
//!   generation, is set to a fresh value drawn at random from `[2^40,
//!   2^52)` (from the OS, never from a seed: two processes seeded alike
//!   must not draw alike), which no entry can have recorded. The write
//!   goes through the lease fence as every load's does. If the
//!   generations cannot be read, the value is served and kept in L1, not
//!   written (as a direct load is). A `set` with tags reads them (and
//!   creates), then replaces.
//! - **Invalidate**: [`Cache::invalidate_tag`](crate::Cache::invalidate_tag) bumps the counter, atomically
//!   with its notice ([`Store::bump_generation`](crate::Store::bump_generation)): one more if it holds a
//!   generation, else a fresh value. O(1) store work whatever the number
//!   of entries carrying the tag.
//! - **Expire**: [`Cache::expire_tag`](crate::Cache::expire_tag) bumps it softly
//!   ([`Store::expire_generation`](crate::Store::expire_generation)): one more, keeping the floor of the
//!   last hard bump and recording the store-clock ms of this one (see the
//!   counter's format below); a fresh value if it holds no generation.
//! - **Read**: an entry with tags is judged by every tag's counter
//!   (`TagState::judge`): it is valid while each one exists and *equals*
//!   what it recorded (`!=`, not `<`); stale if some recorded a generation
//!   a soft bump moved past but not a hard one (below); a miss if any
//!   counter is missing, holds anything but a generation, or moved past
//!   it with a hard bump. The read only looks and creates nothing: a
//!   call that names its tags reads their counters in the entry's own
//!   `MGET` (one round trip, `Lookup::read`); counters it did not name
//!   (tags its loader chose) are one more `GET`/`MGET`. An untagged
//!   entry is format version 1, read exactly as before, at no extra
//!   cost. A tag-invalidated entry is a miss, never served stale. A value carried
//!   in a fill's bus message is taken only if it has no tags (a tagged one
//!   is read from the store, which checks it).
//!
//! # The counter's state
//!
//! A counter holds decimal digits, in one of two forms (`TagState`; each
//! part 1 to 16 digits, below 2^53; anything else is foreign, which
//! validates nothing):
//!
//! - `G`: the current generation, what a write records now. No soft bump
//!   since the last hard one (the form every counter had before
//!   `expire_tag`, and every hard bump or fresh start writes).
//! - `G:H:T` (with `H <= G`), after a soft bump: `G` the current
//!   generation, `H` the floor (the generation of the last hard bump, or
//!   of the counter's start), `T` the store-clock ms of the last soft
//!   bump.
//! - `G:H:T:F`, once a write of tags chosen by its loader read it (below):
//!   `F` the store-clock ms of the counter's last hard change (`T` 0
//!   without a soft bump).
//!
//! An entry that recorded `g` for the tag is, by that counter: valid if
//! `g == G`; stale if `H <= g < G` (plain `G` has `H = G`): its fresh
//! window is treated as ending `EXPIRE_SKEW` (100 ms) before `T`, if it
//! did not end earlier, so within grace from then it is served
//! [`Stale`](crate::Served::Stale) while one load refreshes it, and it
//! stands in for a failed load up to its `stale_until`; a miss otherwise
//! (`g < H`: a hard bump came after its load; `g > G`: the counter was
//! lost and started again). With several tags, a miss if any says so;
//! else stale as of the earliest `T` among those that say stale. A hard
//! bump writes `G+1` (so `H = G+1`: everything before a miss); a soft bump
//! writes `G+1:H:now`. Every counter operation reads both forms
//! ([`Store::tag_generations`](crate::Store::tag_generations) replies `G`). Only the last soft bump's
//! time is kept: an entry two soft bumps old is judged stale as of the
//! later one (its grace starts again then; it is never fresh).
//!
//! So an entry written while its tag had no counter recorded the counter
//! its own write created, and when that counter is lost later, the entry
//! is a miss; the next write starts the counter again at another fresh
//! value. (Entries of builds before this rule recorded 0 for a missing
//! counter; they read as misses now unless their counter exists, and are
//! loaded again once.)
//!
//! # Tags chosen by the loader
//!
//! A loader may tag its value with what only the value tells
//! ([`Loaded::tags`](crate::Loaded::tags): a product's shop). Those tags'
//! generations cannot be read before the load, so they are read after it
//! ([`Store::tag_states`](crate::Store::tag_states), one script for a
//! write, one for a whole batch), and the question becomes whether the
//! counter changed while the value was loaded. The counter answers it with
//! `F`, the store-clock ms of its last hard change: the read creates a
//! missing counter with `F` = now (it may have been lost with an
//! invalidation in it), and dates one without `F` now (a hard bump writes
//! plain digits, so builds that do not know `F` keep reading every counter;
//! the first read after a bump dates it). With the load's start `S` (the
//! store clock before its loader was called, queue and retries included)
//! and the skew `EXPIRE_SKEW`:
//!
//! - `F >= S - skew`: the counter changed hard (or started) during the
//!   load, or may have; the value may be older than that change. It is
//!   served to the load's callers and kept in L1 (where the invalidation's
//!   notice reaches it; see below), not written.
//! - else, a soft bump since (`T >= S - skew`, with `H < G`): the entry
//!   records `G - 1`, so it is stale from `T` on.
//! - else it records `G`, as a write of the call's own tags does.
//!
//! So a tag's first load, and the first after each `invalidate_tag` of it,
//! is not written (nor is one that starts within the skew after either):
//! one more load, never a value from before an invalidation. Tags the
//! call names too are recorded as read before the load.
//!
//! # Counter TTLs
//!
//! Counters expire, so a tag whose entries are all gone does not keep a
//! key forever; a counter outlives every entry that recorded it. Each
//! write asks for a TTL from its own settings (a per-call
//! [`CacheEntry`](super::CacheEntry) `ttl`, `jitter` or `max_stale`
//! counts): the longest physical TTL such a write can give an entry
//! (`ttl` at the top of its jitter plus `max_stale`, or `negative_ttl` at
//! the top of its jitter), plus `load_timeout` (the load runs between the
//! counter's read and the entry's write) and a minute of slack, and at
//! least an hour; an invalidation asks for the one the cache's defaults
//! give. The store only ever lengthens a counter's TTL (a counter left
//! without one by an earlier build gets one), so every entry that recorded
//! a counter expires before it, unless the counter is evicted first, which
//! invalidates them: a miss, never a wrong value. Under a `volatile-*`
//! eviction policy counters are now eviction candidates, as entries are.
//!
//! A load that began before `invalidate_tag` recorded the generation from
//! before the bump, so its entry is invalid the moment it lands (no
//! resurrection, without revoking any lease: the fence is the generation).
//! One that began before `expire_tag` lands stale, never fresh.
//!
//! # In this process, and elsewhere
//!
//! An entry's tags are known only once it is read, so a tag invalidation
//! (hard or soft: `expire_tag` does the same here) treats every key as
//! possibly affected (`Local::tags_invalidated`): L1
//! refuses every read or load that began before (its epoch floor moves)
//! and is emptied, unless it has kept no tagged entry since the last tag
//! invalidation; every load, background refresh and shared read in the
//! air is detached (its own callers still get its result; callers from
//! now on start anew). In the invalidating process this happens before
//! `invalidate_tag` returns; other processes do the same when its message
//! (kind `t`) reaches them on the namespace bus. Without L1, another
//! process reads the store, whose generations have already moved on.

use std::collections::HashMap;
use std::time::Duration;

use super::keys::{hash_tagged, hash_tagged_into};
use super::options::Options;
use crate::clock::millis;
use crate::entry::{Entry, MAX_TAG_LEN, MAX_TAGS, TagStamp};
use crate::error::{Error, ErrorKind};
use crate::store::{TagJudgment, TagState, fnv1a, parse_tag_state};

/// The shortest TTL a tag counter is given (see the module docs).
const COUNTER_TTL_FLOOR: Duration = Duration::from_secs(3600);

/// What a counter's TTL adds to the longest entry it guards and the load
/// before it: room for the write's own round trip and the store clock's
/// uncertainty.
const COUNTER_TTL_SLACK: Duration = Duration::from_secs(60);

/// The TTL a tag counter gets from a write with `options` (and from an
/// invalidation, with the cache's defaults): longer than the physical TTL
/// of any entry such a write can make (`ttl` at its jitter's top plus
/// `max_stale`, or the negative TTL at its top), plus the load that runs
/// between the counter's read and the write (`load_timeout`) and
/// [`COUNTER_TTL_SLACK`]; at least [`COUNTER_TTL_FLOOR`]. (The store cuts
/// it to its longest TTL, 10 years; windows are at most 365 days each.)
pub(super) fn counter_ttl(options: &Options) -> Duration {
    let (_, fresh) = options.jitter.bounds(options.ttl);
    let (_, negative) = options.jitter.bounds(options.negative_ttl);
    let longest = fresh.saturating_add(options.max_stale()).max(negative);
    longest
        .saturating_add(options.load_timeout)
        .saturating_add(COUNTER_TTL_SLACK)
        .max(COUNTER_TTL_FLOOR)
}

/// The tags one call named: distinct and sorted, with the TTL their
/// counters get from this call's write ([`counter_ttl`] of its options).
/// (Their counters' keys are built only when a read or a load reads
/// them: an L1 hit needs none.)
#[derive(Debug)]
pub(crate) struct TagSet {
    pub(super) tags: Vec<Vec<u8>>,
    pub(super) counter_ttl: Duration,
    /// [`set_hash`] of the tags: an L1 copy serves this call only if its
    /// entry's tags hash the same.
    pub(super) hash: u64,
}

impl TagSet {
    /// The tags of a write with `options`, each checked; duplicates are
    /// dropped.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty tag, a tag over
    /// [`MAX_TAG_LEN`] bytes, or more than [`MAX_TAGS`] distinct tags.
    pub(super) fn new(mut tags: Vec<Vec<u8>>, options: &Options) -> Result<Self, Error> {
        for tag in &tags {
            check_tag(tag)?;
        }
        tags.sort_unstable();
        tags.dedup();
        if tags.len() > MAX_TAGS {
            return Err(Error::new(
                ErrorKind::InvalidKey,
                format!(
                    "{} tags on one entry, the limit is {MAX_TAGS}; tag a broader group instead",
                    tags.len()
                ),
            ));
        }
        Ok(TagSet {
            hash: set_hash(tags.iter().map(Vec::as_slice)),
            tags,
            counter_ttl: counter_ttl(options),
        })
    }
}

impl TagSet {
    /// Whether `entry` was written with every one of these tags (an entry
    /// written without them would escape their invalidation).
    pub(super) fn carried_by(&self, entry: &Entry) -> bool {
        self.tags
            .iter()
            .all(|tag| entry.tags.iter().any(|stamp| stamp.tag == *tag))
    }
}

/// A set of tags as one number, whatever their order: 0 for none, else
/// one more than the sum of their FNV-1a hashes (a different set hashes
/// the same with a chance of 2^-64).
pub(super) fn set_hash<'t>(tags: impl Iterator<Item = &'t [u8]>) -> u64 {
    let mut hash = 0u64;
    let mut any = false;
    for tag in tags {
        hash = hash.wrapping_add(fnv1a(tag));
        any = true;
    }
    if any { hash.wrapping_add(1).max(1) } else { 0 }
}

/// A tag is 1 to [`MAX_TAG_LEN`] bytes.
pub(super) fn check_tag(tag: &[u8]) -> Result<(), Error> {
    if tag.is_empty() {
        return Err(Error::new(ErrorKind::InvalidKey, "a tag must not be empty"));
    }
    if tag.len() > MAX_TAG_LEN {
        return Err(Error::new(
            ErrorKind::InvalidKey,
            format!("a tag is {} bytes, the limit is {MAX_TAG_LEN}", tag.len()),
        ));
    }
    Ok(())
}

/// The key of `tag`'s generation counter, hash-tagged as storage keys are.
pub(super) fn tag_key(tag_prefix: &[u8], tag: &[u8]) -> Vec<u8> {
    hash_tagged(tag_prefix, tag)
}

/// [`tag_key`], appended to `out` (several counters' keys in one buffer).
pub(super) fn tag_key_into(out: &mut Vec<u8>, tag_prefix: &[u8], tag: &[u8]) {
    hash_tagged_into(out, tag_prefix, tag);
}

/// A counter's state as stored (`G` or `G:H:T`, see [`TagState`]);
/// `None` for a missing counter or one that holds anything else, which
/// validates nothing.
pub(super) fn tag_state(stored: Option<&[u8]>) -> Option<TagState> {
    stored.and_then(parse_tag_state)
}

/// How long before a soft bump's store-clock ms (an `expire`, an
/// `expire_tag`) the entries it concerns stop being fresh: more than the
/// error of any process's view of the store's clock (half a round trip),
/// so none judges them fresh once the call has returned.
pub(super) const EXPIRE_SKEW: Duration = Duration::from_millis(100);

/// Judges a tagged `entry` by its tags' counters (`state_of(i, stamp)`: the
/// state of the counter of its `i`th stamp, `None` if missing or foreign;
/// see [`TagState::judge`]): `false` (a miss) if any tag says so; else
/// `true`, and if some tags were soft-bumped since the entry recorded them
/// (`expire_tag`), its fresh window ends [`EXPIRE_SKEW`] before the
/// earliest such bump (never later than it did), so it is served stale
/// within grace from then, and stands in for a failed load up to its
/// `stale_until`.
pub(super) fn judge_tagged(
    entry: &mut Entry,
    mut state_of: impl FnMut(usize, &TagStamp) -> Option<TagState>,
) -> bool {
    let mut stale_from: Option<u64> = None;
    for (i, stamp) in entry.tags.iter().enumerate() {
        let judgment = state_of(i, stamp).map_or(TagJudgment::Miss, |s| s.judge(stamp.generation));
        match judgment {
            TagJudgment::Valid => {}
            TagJudgment::StaleFrom(at) => {
                stale_from = Some(stale_from.map_or(at, |earliest| earliest.min(at)));
            }
            TagJudgment::Miss => return false,
        }
    }
    if let Some(at) = stale_from {
        let until = at.saturating_sub(millis(EXPIRE_SKEW));
        entry.fresh_until = entry.fresh_until.min(until);
    }
    true
}

/// Tag counters' states, by tag (`None`: missing or foreign).
pub(super) type States = HashMap<Vec<u8>, Option<TagState>>;

/// What a write of tags its loader chose ([`Loaded::tags`](crate::Loaded::tags))
/// needs to know of its load: when it began, and, for a batch, the states
/// of every tag its loader chose, read once after the load.
pub(super) struct AfterLoad {
    /// The store-clock ms just before the load began (its bulkhead queue
    /// and retries included).
    pub(super) started_ms: u64,
    /// The store-clock ms the load ended, if it ended before the write's
    /// own steps began (a batch: its chosen tags read in between); `None`:
    /// when the write begins.
    pub(super) ended_ms: Option<u64>,
    /// The chosen tags' counters, read once for a whole batch, by tag
    /// (`None` for a missing or foreign reply); `None`: read by each write.
    pub(super) states: Option<Result<States, Error>>,
}

impl AfterLoad {
    /// A load beginning now, its chosen tags read by its own write.
    pub(super) fn starting(now_ms: u64) -> Self {
        AfterLoad {
            started_ms: now_ms,
            ended_ms: None,
            states: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_limit::show_key;

    impl Options {
        /// A 5-minute TTL without jitter or grace.
        fn test_defaults() -> Options {
            Options {
                ttl: Duration::from_secs(300),
                negative_ttl: Duration::from_secs(30),
                jitter: crate::Jitter::none(),
                grace: Duration::ZERO,
                max_stale: None,
                early_refresh: crate::freshness::EarlyRefresh::none(),
                soft_timeout: None,
                load_timeout: Duration::from_secs(30),
                fail_safe_throttle: Duration::from_secs(5),
                poll_scale: 1,
            }
        }
    }

    #[test]
    fn tag_keys_are_hash_tagged_like_storage_keys() {
        assert_eq!(tag_key(b"bw:ns:t:", b"user:7"), b"bw:ns:t:{user:7}");
        let braced = tag_key(b"bw:ns:t:", b"a{b}");
        assert!(braced.starts_with(b"bw:ns:t:{#"), "{}", show_key(&braced));
        assert!(braced.ends_with(b"}a{b}"));
        assert_ne!(tag_key(b"p:", b"a{b}"), tag_key(b"p:", b"a{c}"));
    }

    #[test]
    fn tag_sets_are_checked_sorted_and_deduplicated() {
        let options = Options::test_defaults();
        let set = TagSet::new(vec![b"b".to_vec(), b"a".to_vec(), b"b".to_vec()], &options).unwrap();
        assert_eq!(set.tags, vec![b"a".to_vec(), b"b".to_vec()]);

        let empty = TagSet::new(vec![Vec::new()], &options).unwrap_err();
        assert_eq!(empty.kind(), ErrorKind::InvalidKey);
        assert!(
            empty.to_string().contains("a tag must not be empty"),
            "{empty}"
        );
        let long = TagSet::new(vec![vec![b'x'; MAX_TAG_LEN + 1]], &options).unwrap_err();
        assert!(long.to_string().contains("the limit is 256"), "{long}");
        assert!(TagSet::new(vec![vec![b'x'; MAX_TAG_LEN]], &options).is_ok());
        let many: Vec<Vec<u8>> = (0..=MAX_TAGS).map(|i| i.to_string().into_bytes()).collect();
        let err = TagSet::new(many.clone(), &options).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey);
        assert!(
            err.to_string()
                .contains("17 tags on one entry, the limit is 16"),
            "{err}"
        );
        assert!(TagSet::new(many[..MAX_TAGS].to_vec(), &options).is_ok());
    }

    /// A missing or foreign counter is no generation: it equals nothing an
    /// entry recorded (0 included, what entries of earlier builds recorded
    /// for a missing counter).
    #[test]
    fn missing_and_foreign_counters_are_no_generation() {
        let generation = |stored: Option<&[u8]>| tag_state(stored).map(|s| s.generation);
        assert_eq!(generation(None), None);
        assert_eq!(generation(Some(b"1700000000000")), Some(1_700_000_000_000));
        assert_eq!(generation(Some(b"0")), Some(0));
        for foreign in [
            &b"not a number"[..],
            b"",
            b"-1",
            b"+1",
            b" 1",
            b"1.5",
            b"9007199254740992",
            b"12345678901234567",
        ] {
            assert_eq!(generation(Some(foreign)), None, "{foreign:?}");
        }
        assert_eq!(
            generation(Some(b"9007199254740991")),
            Some(9_007_199_254_740_991)
        );
    }

    /// Both forms of a counter's state parse (`G`, `G:H:T` with `H <= G`,
    /// each part 1 to 16 digits below 2^53) and encode back to themselves;
    /// everything else is foreign: no state, which validates nothing.
    #[test]
    fn counter_states_parse_in_both_forms_and_nothing_else() {
        let plain = tag_state(Some(b"1700000000000")).unwrap();
        assert_eq!(plain, TagState::plain(1_700_000_000_000));
        assert_eq!(plain.floor, plain.generation);
        assert_eq!(plain.encode(), b"1700000000000");

        let soft = tag_state(Some(b"12:10:1700000000123")).unwrap();
        assert_eq!(
            soft,
            TagState {
                generation: 12,
                floor: 10,
                expired_at: 1_700_000_000_123,
                hard_at: 0,
            }
        );
        assert_eq!(soft.encode(), b"12:10:1700000000123");
        // The floor may equal the generation (nothing stale), encoded plain.
        let level = tag_state(Some(b"7:7:5")).unwrap();
        assert_eq!(level.judge(6), TagJudgment::Miss);
        assert_eq!(level.encode(), b"7");
        // Bounds: 16 digits below 2^53 in each part.
        let top = tag_state(Some(b"9007199254740991:9007199254740991:9007199254740991"));
        assert_eq!(top.map(|s| s.generation), Some(9_007_199_254_740_991));
        assert!(tag_state(Some(b"0:0:0")).is_some());
        for foreign in [
            &b""[..],
            b":",
            b"::",
            b"1:",
            b"1:1",
            b"1:1:",
            b":1:1",
            b"1::1",
            b"1:1:1:1:1",
            b"1:1:1:",
            b"2:3:1:1",
            b"2:3:1",
            b"3:2:-1",
            b"3:+2:1",
            b"3: 2:1",
            b"3:2:1 ",
            b"3:2:1.5",
            b"9007199254740992:2:1",
            b"3:9007199254740992:1",
            b"3:2:9007199254740992",
            b"3:2:12345678901234567",
            b"00000000000000003:2:1",
            b"not a number",
        ] {
            assert_eq!(tag_state(Some(foreign)), None, "{foreign:?}");
        }
        assert_eq!(tag_state(None), None);
    }

    /// The four-part form reads and encodes back; a write of tags chosen
    /// after a load records a generation only if the counter's last hard
    /// change came before the load began (less the skew), one below it if
    /// a soft bump came since.
    #[test]
    fn a_counters_last_hard_change_decides_what_a_write_after_the_load_records() {
        let dated = tag_state(Some(b"12:10:7000:5000")).unwrap();
        assert_eq!(dated.hard_at, 5_000);
        assert_eq!(dated.encode(), b"12:10:7000:5000");
        assert_eq!(TagState::started(9, 4_000).encode(), b"9:9:0:4000");
        assert_eq!(TagState::plain(9).dated(4_000), TagState::started(9, 4_000));
        assert_eq!(dated.dated(8_000), dated, "a known time is kept");
        assert_eq!(dated.expired(8_000).encode(), b"13:10:8000:5000");
        assert_eq!(dated.bumped().encode(), b"13", "a hard bump drops it");
        // Unknown: nothing recorded.
        assert_eq!(TagState::plain(9).stamp_after(10_000, 100), None);
        // Changed hard during the load (or within the skew before it).
        let started = TagState::started(9, 4_000);
        assert_eq!(started.stamp_after(4_000, 100), None);
        assert_eq!(started.stamp_after(4_100, 100), None);
        assert_eq!(started.stamp_after(4_101, 100), Some(9));
        // A soft bump during the load: the generation before it (stale).
        assert_eq!(dated.stamp_after(6_000, 100), Some(11));
        assert_eq!(dated.judge(11), TagJudgment::StaleFrom(7_000));
        assert_eq!(dated.stamp_after(7_101, 100), Some(12));
    }

    /// Hard and soft bumps move the state on as the store's scripts do,
    /// and an entry's recorded generation is judged by it.
    #[test]
    fn bumps_and_judgments_follow_the_read_rule() {
        let start = TagState::plain(100);
        assert_eq!(start.judge(100), TagJudgment::Valid);
        assert_eq!(start.judge(99), TagJudgment::Miss);
        assert_eq!(start.judge(101), TagJudgment::Miss);

        let soft = start.expired(5_000);
        assert_eq!(soft.encode(), b"101:100:5000");
        assert_eq!(soft.judge(101), TagJudgment::Valid);
        assert_eq!(soft.judge(100), TagJudgment::StaleFrom(5_000));
        assert_eq!(soft.judge(99), TagJudgment::Miss);
        assert_eq!(soft.judge(102), TagJudgment::Miss);
        // A second soft bump keeps the floor; the time is the later one.
        let twice = soft.expired(7_000);
        assert_eq!(twice.encode(), b"102:100:7000");
        assert_eq!(twice.judge(100), TagJudgment::StaleFrom(7_000));
        assert_eq!(twice.judge(101), TagJudgment::StaleFrom(7_000));
        // A hard bump after it: plain digits, everything before a miss.
        let hard = twice.bumped();
        assert_eq!(hard.encode(), b"103");
        assert_eq!(hard.judge(102), TagJudgment::Miss);
        assert_eq!(hard.judge(100), TagJudgment::Miss);
        assert_eq!(hard.judge(103), TagJudgment::Valid);
    }

    fn tagged_entry(stamps: &[(&[u8], u64)], fresh_until: u64) -> Entry {
        Entry {
            codec: crate::codec::Codec::json(),
            negative: false,
            fresh_until,
            stale_until: fresh_until + 60_000,
            load_ms: 0,
            payload: b"1".to_vec(),
            tags: stamps
                .iter()
                .map(|(tag, generation)| TagStamp {
                    tag: tag.to_vec(),
                    generation: *generation,
                })
                .collect::<Vec<_>>()
                .into(),
            extra: crate::entry::Extra::default(),
        }
    }

    /// With several tags: a miss if any says so; else stale from the
    /// earliest soft bump among those that say stale (less the skew),
    /// never later than the entry's own fresh window.
    #[test]
    fn an_entry_is_judged_by_all_its_tags() {
        let states = [
            TagState::plain(5),
            TagState::plain(8).expired(20_000),
            TagState::plain(3).expired(10_000),
        ];
        let judge = |stamps: &[(&[u8], u64)], fresh_until: u64| {
            let mut entry = tagged_entry(stamps, fresh_until);
            judge_tagged(&mut entry, |i, _| Some(states[i])).then_some(entry.fresh_until)
        };
        // All current: untouched.
        assert_eq!(
            judge(&[(b"a", 5), (b"b", 9), (b"c", 4)], 50_000),
            Some(50_000)
        );
        // Two stale: the earliest bump wins.
        assert_eq!(
            judge(&[(b"a", 5), (b"b", 8), (b"c", 3)], 50_000),
            Some(9_900)
        );
        // Already stale before: kept.
        assert_eq!(
            judge(&[(b"a", 5), (b"b", 8), (b"c", 4)], 1_000),
            Some(1_000)
        );
        // One miss: a miss, whatever the others say.
        assert_eq!(judge(&[(b"a", 4), (b"b", 8), (b"c", 3)], 50_000), None);
        // A missing counter is a miss.
        let mut entry = tagged_entry(&[(b"a", 5)], 50_000);
        assert!(!judge_tagged(&mut entry, |_, _| None));
    }

    /// A counter outlives every entry a write with those settings can
    /// make: ttl at its jitter's top, plus max_stale, plus the load.
    #[test]
    fn counters_outlive_the_entries_they_guard() {
        let mut options = Options::test_defaults();
        assert_eq!(counter_ttl(&options), COUNTER_TTL_FLOOR, "{options:?}");
        options.ttl = Duration::from_secs(6 * 3600);
        options.jitter = crate::Jitter::ratio(0.5);
        options.max_stale = Some(Duration::from_secs(3600));
        options.load_timeout = Duration::from_secs(30);
        let (_, top) = options.jitter.bounds(options.ttl);
        assert_eq!(top, Duration::from_secs(9 * 3600));
        assert_eq!(
            counter_ttl(&options),
            Duration::from_secs(10 * 3600 + 30 + 60)
        );
        // A negative entry is never kept stale, but may be the longer.
        options.negative_ttl = Duration::from_secs(20 * 3600);
        assert_eq!(
            counter_ttl(&options),
            Duration::from_secs(30 * 3600 + 30 + 60)
        );
        // The longest settings stay far below the store's 10 years.
        options.ttl = crate::error::MAX_WINDOW;
        options.max_stale = Some(crate::error::MAX_WINDOW);
        assert!(counter_ttl(&options) < Duration::from_secs(4 * 365 * 24 * 3600));
    }
}
