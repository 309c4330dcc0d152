//! Tag invalidation: entries written with tags, and
//! [`Cache::invalidate_tag`], which makes every entry carrying a tag
//! unreachable, fleet-wide, in one store operation.
//!
//! # Generations, checked on read
//!
//! Each tag has a generation counter in the store, under
//! `<key_prefix><namespace>:t:{<tag>}` (no version in it: both versions of
//! a version transition share their tags; its own hash tag, so the tags of
//! a namespace spread over a Redis Cluster). A missing counter reads as 0.
//!
//! - **Write**: a load with tags reads its tags' generations (one `MGET`;
//!   on a Cluster one per slot) *after* it has taken the key's lease and
//!   *before* its loader runs, and records them in the entry (format
//!   version 2, see `entry`). The write goes through the lease fence as
//!   every load's does. If the generations cannot be read, the value is
//!   served and kept in L1, not written (as a direct load is). A `set` with
//!   tags reads them, then replaces.
//! - **Invalidate**: [`Cache::invalidate_tag`] bumps the counter, atomically
//!   with its notice ([`Store::bump_generation`]): O(1) store work whatever
//!   the number of entries carrying the tag.
//! - **Read**: an entry with tags is valid only while every recorded
//!   generation *equals* its tag's current one (`!=`, not `<`: a counter
//!   lost with its key invalidates too). One more round trip (the `MGET`
//!   of its tags) on every store read of a tagged entry; an untagged entry
//!   is format version 1, read exactly as before, at no extra cost. A
//!   tag-invalidated entry is a miss, never served stale. A value carried
//!   in a fill's bus message is taken only if it has no tags (a tagged one
//!   is read from the store, which checks it).
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

use tokio::time::Instant;

use super::coherence::Local;
use super::notify::{self, TAG_INVALIDATED};
use super::{Cache, Load, Op, Value, hash_tagged, record_error, show_key};
use crate::entry::{Entry, MAX_TAG_LEN, MAX_TAGS, TagStamp};
use crate::error::{Error, ErrorKind};
use crate::key::CacheKey;
use crate::store::Store;
use tracing::Instrument;

/// The tags one call named: distinct and sorted. (Their counters' keys are
/// built only when a load reads them: a hit needs none.)
#[derive(Debug)]
pub(crate) struct TagSet {
    tags: Vec<Vec<u8>>,
}

impl TagSet {
    /// The tags, each checked; duplicates are dropped.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty tag, a tag over
    /// [`MAX_TAG_LEN`] bytes, or more than [`MAX_TAGS`] distinct tags.
    pub(super) fn new(mut tags: Vec<Vec<u8>>) -> Result<Self, Error> {
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
        Ok(TagSet { tags })
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

/// A generation as stored (decimal digits); missing, or not a number, is 0.
fn generation(stored: Option<&[u8]>) -> u64 {
    stored
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0)
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
    /// use breakwater::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater::Error> {
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
        let done = self
            .deliver(key, || async move {
                let notice = inner.notice(message);
                inner.store.bump_generation(key, notice).await.map(drop)
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
        // After the store has answered (a read that starts later sees the
        // new generation); also if it failed: the reply may be all that was
        // lost.
        self.local.tags_invalidated();
        done
    }

    /// The current generations of `tags`, in one `MGET` (one per slot on a
    /// Cluster).
    pub(super) async fn tag_generations(&self, tags: &TagSet) -> Result<Vec<TagStamp>, Error> {
        let stored = self.read_generations(&tags.tags).await?;
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

    /// The current generations of `tags`, in their order: one `GET` for
    /// one tag (the store's cheapest read), else one `MGET` (one per slot
    /// on a Cluster).
    async fn read_generations(&self, tags: &[impl AsRef<[u8]>]) -> Result<Vec<u64>, Error> {
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
    /// generation is still the one it recorded; `None` (a miss) if any
    /// moved on. One `MGET` of its tags' counters.
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
            .all(|(stamp, now)| stamp.generation == now);
        if !current {
            tracing::debug!(key = %show_key(key), "cached entry's tag was invalidated; treating it as a miss");
            return Ok(None);
        }
        Ok(Some(entry))
    }

    /// [`still_tagged`](Self::still_tagged) for many entries at once: each
    /// tagged entry of `entries` whose tags moved on becomes a miss, all
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
                        .is_ok_and(|at| current[at] == stamp.generation)
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
        let set = TagSet::new(vec![b"b".to_vec(), b"a".to_vec(), b"b".to_vec()]).unwrap();
        assert_eq!(set.tags, vec![b"a".to_vec(), b"b".to_vec()]);

        let empty = TagSet::new(vec![Vec::new()]).unwrap_err();
        assert_eq!(empty.kind(), ErrorKind::InvalidKey);
        assert!(
            empty.to_string().contains("a tag must not be empty"),
            "{empty}"
        );
        let long = TagSet::new(vec![vec![b'x'; MAX_TAG_LEN + 1]]).unwrap_err();
        assert!(long.to_string().contains("the limit is 256"), "{long}");
        assert!(TagSet::new(vec![vec![b'x'; MAX_TAG_LEN]]).is_ok());
        let many: Vec<Vec<u8>> = (0..=MAX_TAGS).map(|i| i.to_string().into_bytes()).collect();
        let err = TagSet::new(many.clone()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey);
        assert!(
            err.to_string()
                .contains("17 tags on one entry, the limit is 16"),
            "{err}"
        );
        assert!(TagSet::new(many[..MAX_TAGS].to_vec()).is_ok());
    }

    #[test]
    fn generations_read_missing_and_foreign_as_zero() {
        assert_eq!(generation(None), 0);
        assert_eq!(generation(Some(b"1700000000000")), 1_700_000_000_000);
        assert_eq!(generation(Some(b"not a number")), 0);
    }
}
