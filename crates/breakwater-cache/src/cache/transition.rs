//! A version transition that hears the previous version: an entry this
//! version writes during [`version_transition`](super::CacheBuilder::version_transition)
//! is valid only while the previous version's entry it was loaded beside is
//! unchanged, so an invalidation or `set` made by the previous version's
//! processes (which run the code deployed before, and know nothing of this
//! version) revokes this version's entry too, in the store, at once.
//!
//! # Pinned, recorded, checked
//!
//! - **Pin**: before a load's loader runs (after the lease is taken, as the
//!   tags' generations are read) and before a `set`, the previous version's
//!   entry for the key is *pinned* ([`Store::pin`]): its bytes are read, or,
//!   where it has none, a placeholder is written there: an expired negative
//!   entry (its windows ended in 1970, its `load_ms` and windows random), which
//!   the previous version reads as expired, exactly as a miss (it loads, and
//!   serves nothing from it), and which no writer but this pin produces. So a
//!   deletion of that key by the previous version (`invalidate`) is a change
//!   too, even where it had no entry.
//! - **Record**: the entry records the pinned bytes' FNV-1a hash as a
//!   *transition stamp*, a tag of zero bytes in the tags block (format
//!   version 2; application tags are 1 to 256 bytes, so it is never one of
//!   theirs).
//! - **Fence**: the fenced write is made only if the previous version's key
//!   still holds exactly the pinned bytes ([`FencedWrite::unchanged`](crate::FencedWrite::unchanged)),
//!   in the same script as the lease check; otherwise it is refused like a
//!   revoked lease (its value reaches only the callers that started before).
//! - **Check**: inside the transition every read of this version's entry
//!   reads the previous version's key beside it (one `MGET` of the two: they
//!   share a hash slot), and an entry whose stamp does not match is a miss.
//!   Outside it the stamp is ignored: the previous version's processes are
//!   gone.
//! - **Hear**: this version also listens on the previous version's channel;
//!   a message that its entry of a key changed (a fill, an invalidation, a
//!   `set`; not a release, which changes nothing) drops this version's L1
//!   copy of the key and detaches its flights, and a tag invalidation there
//!   is one here. While that channel is down or has fallen behind, L1
//!   copies are unverified (re-read before they are served as fresh), as
//!   while the cache's own bus is down.
//!
//! A fill by the previous version changes its entry too, so this version's
//! entry of that key is loaded once more afterwards (at most once per fill
//! of the previous version); that is the price of hearing it.
//!
//! This version's own `invalidate` deletes both versions' entries and leases
//! and tells both channels (see `invalidate`); its `set` revokes the previous
//! version's entry and lease (replacing it with a fresh placeholder, its
//! processes told) before it writes its own, pinned beside it.

use std::time::Duration;

use rand::RngExt;

use super::handle::Cache;
use super::keys::lease_key;
use super::notify::{self};
use super::value::Value;
use crate::entry::{Entry, Extra, TagStamp};
use crate::error::Error;
use crate::store::{Notice, Store, Unchanged, fnv1a};

/// The previous version's entry a load or `set` was made beside: its
/// storage key and the bytes it held (or the placeholder written there).
#[derive(Debug, Clone)]
pub(super) struct Pinned {
    pub(super) key: Vec<u8>,
    pub(super) bytes: Vec<u8>,
}

impl Pinned {
    /// The transition stamp the entry records.
    pub(super) fn stamp(&self) -> TagStamp {
        TagStamp {
            tag: Vec::new(),
            generation: fnv1a(&self.bytes),
        }
    }

    /// The fenced write's second condition.
    pub(super) fn unchanged(&self) -> Unchanged<'_> {
        Unchanged {
            key: &self.key,
            bytes: &self.bytes,
        }
    }
}

/// Whether `entry`, read beside `previous` (what the previous version's key
/// holds now, inside a transition; `None` outside one), may be served; its
/// transition stamp is removed either way (it is not a tag).
pub(super) fn beside(entry: &mut Entry, previous: Option<Option<&[u8]>>) -> bool {
    let Some(at) = entry.tags.iter().position(|t| t.tag.is_empty()) else {
        return true;
    };
    let recorded = entry.tags[at].generation;
    let rest: Vec<TagStamp> = entry
        .tags
        .iter()
        .filter(|t| !t.tag.is_empty())
        .cloned()
        .collect();
    entry.tags = rest.into();
    match previous {
        None => true,
        Some(held) => held.is_some_and(|bytes| fnv1a(bytes) == recorded),
    }
}

impl<V: Value> Cache<V> {
    /// Inside a version transition, pins the previous version's entry for
    /// storage key `key` (see the module docs); `None` outside one. The
    /// placeholder lives as long as an entry of this version can
    /// (`longest`), so it outlives the entry that records it.
    pub(super) async fn pin_previous(
        &self,
        key: &[u8],
        longest: Duration,
    ) -> Result<Option<Pinned>, Error> {
        let Some(previous) = self.inner.previous_key(key) else {
            return Ok(None);
        };
        let placeholder = self.placeholder();
        let bytes = self
            .inner
            .store
            .pin(&previous, &placeholder, longest)
            .await?;
        Ok(Some(Pinned {
            key: previous,
            bytes,
        }))
    }

    /// For a `set` inside a version transition: revokes the previous
    /// version's entry and lease of storage key `key` (its processes told
    /// on their channel), then pins a fresh placeholder beside it.
    pub(super) async fn revoke_previous(
        &self,
        key: &[u8],
        longest: Duration,
    ) -> Result<Option<Pinned>, Error> {
        let (Some(old), Some(previous)) = (self.inner.previous_key(key), &self.inner.previous)
        else {
            return Ok(None);
        };
        let old_lease = lease_key(&old, previous.prefix.len());
        let message = notify::message(notify::INVALIDATED, self.inner.waiters.sender(), &old);
        let notice = Notice {
            channel: &previous.channel,
            message: &message,
            batch_head: None,
        };
        self.inner
            .store
            .invalidate(&old, &old_lease, notice)
            .await?;
        self.pin_previous(key, longest).await
    }

    /// A placeholder for the previous version's key: a negative entry in
    /// this cache's codec whose windows ended long ago (random times before
    /// 2004, random `load_ms`: no two pins write the same bytes).
    fn placeholder(&self) -> Vec<u8> {
        let (at, load_ms) = {
            let mut rng = self
                .inner
                .token_rng
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            (rng.random_range(1..1u64 << 40), rng.random::<u32>())
        };
        Entry {
            codec: self.inner.settings.codec,
            negative: true,
            fresh_until: at,
            stale_until: at,
            load_ms,
            payload: Vec::new(),
            tags: Vec::new().into(),
            extra: Extra::default(),
        }
        .encode(&self.inner.settings.compression)
    }
}

/// The previous version's storage keys of `keys` (this version's), for one
/// batch read beside them: `None` outside a transition.
pub(super) fn beside_keys<V>(cache: &Cache<V>, keys: &[&[u8]]) -> Option<Vec<Vec<u8>>> {
    keys.iter()
        .map(|key| cache.inner.previous_key(key))
        .collect()
}
