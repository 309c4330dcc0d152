//! Tag invalidation: entries written with tags, and
//! [`Cache::invalidate_tag`], which makes every entry carrying a tag
//! unreachable, fleet-wide, in one store operation.
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
//!   is missing ([`Store::tag_generations`]: one script, one per slot on a
//!   Cluster, atomic per counter): a missing counter, or one that holds no
//!   generation, is set to a fresh value drawn at random from `[2^40,
//!   2^52)` (from the OS, never from a seed: two processes seeded alike
//!   must not draw alike), which no entry can have recorded. The write
//!   goes through the lease fence as every load's does. If the
//!   generations cannot be read, the value is served and kept in L1, not
//!   written (as a direct load is). A `set` with tags reads them (and
//!   creates), then replaces.
//! - **Invalidate**: [`Cache::invalidate_tag`] bumps the counter, atomically
//!   with its notice ([`Store::bump_generation`]): one more if it holds a
//!   generation, else a fresh value. O(1) store work whatever the number
//!   of entries carrying the tag.
//! - **Read**: an entry with tags is valid only while every tag's counter
//!   exists and *equals* what it recorded (`!=`, not `<`; a missing
//!   counter, or one holding anything but a generation, equals nothing).
//!   The read only looks, one `GET` (one tag) or `MGET` of its tags, and
//!   creates nothing; one more round trip on every store read of a tagged
//!   entry; an untagged entry is format version 1, read exactly as before,
//!   at no extra cost. A tag-invalidated entry is a miss, never served
//!   stale. A value carried in a fill's bus message is taken only if it
//!   has no tags (a tagged one is read from the store, which checks it).
//!
//! So an entry written while its tag had no counter recorded the counter
//! its own write created, and when that counter is lost later, the entry
//! is a miss; the next write starts the counter again at another fresh
//! value. (Entries of builds before this rule recorded 0 for a missing
//! counter; they read as misses now unless their counter exists, and are
//! loaded again once.)
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
//!
//! # In this process, and elsewhere
//!
//! An entry's tags are known only once it is read, so a tag invalidation
//! treats every key as possibly affected (`Local::tags_invalidated`): L1
//! refuses every read or load that began before (its epoch floor moves)
//! and is emptied, unless it has kept no tagged entry since the last tag
//! invalidation; every load, background refresh and shared read in the
//! air is detached (its own callers still get its result; callers from
//! now on start anew). In the invalidating process this happens before
//! `invalidate_tag` returns; other processes do the same when its message
//! (kind `t`) reaches them on the namespace bus. Without L1, another
//! process reads the store, whose generations have already moved on.

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use tokio::time::Instant;

use super::coherence::{Local, LocalStep};
use super::notify::{self, TAG_INVALIDATED};
use super::options::Options;
use super::{Cache, Load, Op, Value, hash_tagged, record_error, show_key};
use crate::entry::{Entry, MAX_TAG_LEN, MAX_TAGS, TagStamp};
use crate::error::{Error, ErrorKind};
use crate::key::CacheKey;
use crate::store::{FRESH_GENERATIONS, Store, parse_generation};
use tracing::Instrument;

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
/// (Their counters' keys are built only when a load reads them: a hit
/// needs none.)
#[derive(Debug)]
pub(crate) struct TagSet {
    tags: Vec<Vec<u8>>,
    counter_ttl: Duration,
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
            tags,
            counter_ttl: counter_ttl(options),
        })
    }
}

/// A tag is 1 to [`MAX_TAG_LEN`] bytes.
fn check_tag(tag: &[u8]) -> Result<(), Error> {
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
fn tag_key(tag_prefix: &[u8], tag: &[u8]) -> Vec<u8> {
    hash_tagged(tag_prefix, tag)
}

/// A generation as stored (decimal digits); `None` for a missing counter
/// or one that holds anything else, which equals no recorded generation.
fn generation(stored: Option<&[u8]>) -> Option<u64> {
    stored.and_then(parse_generation)
}

/// A loader whose call named tags: the fill records their generations in
/// the entry it writes.
#[derive(Clone)]
pub(super) struct Tagged<L> {
    pub(super) loader: L,
    pub(super) tags: Arc<TagSet>,
}

impl<V, L: Load<V>> Load<V> for Tagged<L> {
    type Fut = L::Fut;
    type Err = L::Err;

    fn call(&self) -> Self::Fut {
        self.loader.call()
    }

    fn tags(&self) -> Option<&TagSet> {
        Some(&self.tags)
    }
}

impl<V: Value> Cache<V> {
    /// Makes every entry written with `tag` (through
    /// [`CacheEntry::tags`](super::CacheEntry::tags)) unreachable, in every
    /// process, at once: one store operation (a generation counter moved
    /// on, with its notice), however many entries carry the tag. Entries
    /// without tags, or with other tags only, are not touched in the store.
    ///
    /// A transient store failure is tried again, as for
    /// [`invalidate`](Self::invalidate) (up to 10 attempts within 1 s; an
    /// extra bump only invalidates again). If none gets through, the error
    /// says the invalidation was not delivered.
    ///
    /// The counter may be missing (never written, expired, or lost to the
    /// store: evicted under `maxmemory`, deleted): then it starts again at
    /// a random value no entry can have recorded. A lost counter never
    /// makes an entry valid again; every entry that recorded it reads as a
    /// miss from then on, whether or not `invalidate_tag` is called. The
    /// counter expires once no entry can still have recorded it (see the
    /// module docs for its TTL; this call gives it at least the TTL the
    /// cache's default settings ask for).
    ///
    /// Once it has returned `Ok`:
    ///
    /// - **No resurrection**: a load that started before it recorded the
    ///   tag's old generation, so its entry is invalid when it lands; no
    ///   entry of the tag from before is served again, fresh or stale.
    /// - **Read your invalidation**: every call in this process that starts
    ///   later gets a value loaded after it. Entries' tags are known only
    ///   when they are read, so this process's L1 is emptied (if it holds a
    ///   tagged entry at all) and its loads and shared reads in the air are
    ///   detached (their own callers still get their results), for every
    ///   key.
    /// - **Elsewhere**: another process reads the store, which checks every
    ///   tagged entry's generations on each read (one more round trip for a
    ///   tagged entry; none for an untagged one). Its L1 is emptied, and its
    ///   flights detached, when the message reaches it: the L1 bound of the
    ///   coherence contract on [`Cache`] holds for tags as for keys. As with
    ///   `invalidate`, a call there that joins a load or shared read
    ///   already in the air before the message arrives gets that flight's
    ///   result.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty tag or one over
    /// 256 bytes, or [`Store`](ErrorKind::Store) if it was not delivered.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().build()?;
    /// let name = cache
    ///     .entry("user:7:name")
    ///     .tags(["user:7"])
    ///     .get_or_load(|| async { Ok::<_, std::io::Error>(Some("Ada".to_string())) })
    ///     .await?;
    /// assert_eq!(name.as_deref(), Some("Ada"));
    /// cache.set("motd", &"hello".to_string()).await?; // no tags
    ///
    /// cache.invalidate_tag("user:7").await?;
    /// assert_eq!(cache.get("user:7:name").await?, None);
    /// assert_eq!(cache.get("motd").await?.as_deref(), Some("hello"));
    /// # Ok(()) }
    /// ```
    pub async fn invalidate_tag(&self, tag: impl CacheKey) -> Result<(), Error> {
        let tag = tag.key_bytes();
        let span = self.span(Op::InvalidateTag, &tag);
        let done = self
            .invalidate_tag_bytes(&tag)
            .instrument(span.clone())
            .await;
        record_error(&span, &done);
        done
    }

    /// [`invalidate_tag`](Self::invalidate_tag), in its span.
    async fn invalidate_tag_bytes(&self, tag: &[u8]) -> Result<(), Error> {
        check_tag(tag)?;
        let inner = &self.inner;
        let key = tag_key(&inner.tag_prefix, tag);
        let message = notify::message(TAG_INVALIDATED, inner.waiters.sender(), &key);
        let (key, message) = (&key, &message);
        // Should the counter be missing, it starts again at a value no
        // entry can have recorded; retries send the same one.
        let fresh = self.fresh_generation();
        let ttl = counter_ttl(&inner.defaults);
        // After the store has answered (a read that starts later sees the
        // new generation); also if it failed (the reply may be all that was
        // lost), or if the caller goes away first.
        let _local = LocalStep::new(|| self.local.tags_invalidated());
        let done = self
            .deliver(key, || async move {
                let notice = inner.notice(message);
                inner
                    .store
                    .bump_generation(key, fresh, ttl, notice)
                    .await
                    .map(drop)
            })
            .await;
        // Inside a version transition the previous version's processes
        // share the tag (its counter has no version): they are told on
        // their own channel, to empty their L1s.
        if done.is_ok()
            && let Some(previous) = &inner.previous
            && Instant::now() < previous.until
            && let Err(err) = inner.store.publish(&previous.channel, message).await
        {
            tracing::debug!(tag = %show_key(tag), error = %err, "tag invalidation not published to the previous version");
        }
        done
    }

    /// The current generations of `tags`, for a write to record: each
    /// counter read, or created (a missing or foreign one) with a fresh
    /// value, and its TTL made at least the tag set's `counter_ttl`, in one
    /// [`Store::tag_generations`] (a script; one per slot on a Cluster).
    /// An entry so only ever records a counter that exists.
    pub(super) async fn tag_generations(&self, tags: &TagSet) -> Result<Vec<TagStamp>, Error> {
        let tag_prefix = &self.inner.tag_prefix;
        let keys: Vec<Vec<u8>> = tags
            .tags
            .iter()
            .map(|tag| tag_key(tag_prefix, tag))
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let fresh = self.fresh_generation();
        let stored = self
            .inner
            .store
            .tag_generations(&keys, fresh, tags.counter_ttl)
            .await?;
        if stored.len() != tags.tags.len() {
            return Err(Error::new(
                ErrorKind::Store,
                "the store answered a read of tag generations with the wrong number of replies",
            ));
        }
        Ok(tags
            .tags
            .iter()
            .zip(stored)
            .map(|(tag, generation)| TagStamp {
                tag: tag.clone(),
                generation,
            })
            .collect())
    }

    /// A value a tag counter starts again at: drawn from the OS-seeded
    /// generator (a seeded one would repeat across processes with the same
    /// seed), uniform over [`FRESH_GENERATIONS`], so no entry can have
    /// recorded it.
    fn fresh_generation(&self) -> u64 {
        let mut rng = self
            .inner
            .token_rng
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        rng.random_range(FRESH_GENERATIONS)
    }

    /// The current generations of `tags`, in their order, `None` for a
    /// missing counter (or one that holds no generation): one `GET` for
    /// one tag (the store's cheapest read), else one `MGET` (one per slot
    /// on a Cluster). Nothing is created: a read only checks.
    async fn read_generations(&self, tags: &[impl AsRef<[u8]>]) -> Result<Vec<Option<u64>>, Error> {
        let tag_prefix = &self.inner.tag_prefix;
        if let [tag] = tags {
            let key = tag_key(tag_prefix, tag.as_ref());
            let stored = self.inner.store.get_inline(&key).await?;
            return Ok(vec![generation(stored.as_deref())]);
        }
        let keys: Vec<Vec<u8>> = tags
            .iter()
            .map(|tag| tag_key(tag_prefix, tag.as_ref()))
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let stored = self.inner.store.get_many(&keys).await?;
        Ok(stored.iter().map(|s| generation(s.as_deref())).collect())
    }

    /// A tagged entry read from storage key `key`, if every tag's
    /// counter exists and still holds the generation it recorded; `None`
    /// (a miss) if any moved on or is missing. One `MGET` of its tags'
    /// counters.
    pub(super) async fn still_tagged(
        &self,
        key: &[u8],
        entry: Entry,
    ) -> Result<Option<Entry>, Error> {
        let tags: Vec<&[u8]> = entry.tags.iter().map(|t| t.tag.as_slice()).collect();
        let current = self.read_generations(&tags).await?;
        let current = entry
            .tags
            .iter()
            .zip(current)
            .all(|(stamp, now)| now == Some(stamp.generation));
        if !current {
            tracing::debug!(key = %show_key(key), "cached entry's tag was invalidated; treating it as a miss");
            return Ok(None);
        }
        Ok(Some(entry))
    }

    /// [`still_tagged`](Self::still_tagged) for many entries at once: each
    /// tagged entry of `entries` whose tags moved on (or whose counters are
    /// missing) becomes a miss, all
    /// checked with one read of their tags' generations. Entries that
    /// cannot be checked (the read failed) are misses too, never served.
    pub(super) async fn keep_current(&self, entries: &mut [Result<Option<Entry>, Error>]) {
        fn stamps(entry: &Result<Option<Entry>, Error>) -> &[TagStamp] {
            match entry {
                Ok(Some(entry)) => &entry.tags,
                _ => &[],
            }
        }
        let mut tags: Vec<Vec<u8>> = entries
            .iter()
            .flat_map(|entry| stamps(entry).iter().map(|stamp| stamp.tag.clone()))
            .collect();
        if tags.is_empty() {
            return;
        }
        tags.sort_unstable();
        tags.dedup();
        let current = self.read_generations(&tags).await.ok();
        for entry in entries.iter_mut() {
            let stamps = stamps(entry);
            if stamps.is_empty() {
                continue;
            }
            let valid = current.as_ref().is_some_and(|current| {
                stamps.iter().all(|stamp| {
                    tags.binary_search(&stamp.tag)
                        .is_ok_and(|at| current[at] == Some(stamp.generation))
                })
            });
            if !valid {
                *entry = Ok(None);
            }
        }
    }
}

impl<V: Value> Local<V> {
    /// A tag was invalidated (here or, heard on the bus, elsewhere): any
    /// key may carry it, so nothing that began before may answer a caller
    /// that starts from now on. L1 refuses every read or load that began
    /// before (its epoch floor moves) and is emptied if it may hold a
    /// tagged entry, and every flight and shared read in the air is
    /// detached.
    pub(super) fn tags_invalidated(&self) {
        if let Some(l1) = &self.l1 {
            l1.drop_tagged();
        }
        self.reads.detach_all();
        self.flights.detach_all();
        self.background.detach_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
