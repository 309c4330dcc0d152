//! The embedded, in-process store.
//!
//! Hand-written rather than built on `moka`: the store must expire entries on
//! *tokio's* clock so that paused-time tests (and the CLI's simulations) can
//! drive TTLs, and must report exact remaining TTLs; moka keeps its own clock.
//! `moka` is the right tool for the L1 near cache, which has neither need.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::namespace::{Applied, NamespaceState};
use super::{
    ClearedNamespace, Delivery, FencedRenewal, FencedWrite, Invalidate, LeaseAttempt,
    MAX_STORE_TTL_MS, NamespaceClear, Notice, Renewal, Replace, SUBSCRIPTION_BUFFER, Store,
    StoreFuture, Subscription, TagState, expire_in_place, fnv1a, parse_tag_state, ttl_millis,
};
use crate::clock::{SystemClock, WallClock, millis};

/// Number of shards; a power of two so a key's shard is a mask away.
const SHARDS: usize = 16;

/// An in-process [`Store`]: a sharded hash map whose entries expire on tokio's
/// clock.
///
/// It is the embedded default (no server needed) and a product backend with
/// the same contract as [`RedisStore`](crate::RedisStore), not a test double.
/// Clones share the same data. Expired entries are dropped when read and swept
/// as writes accumulate, so memory stays proportional to live keys.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater_cache::{MemoryStore, Store};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
/// let store = MemoryStore::new();
/// store.set(b"k", b"v", Duration::from_secs(10)).await?;
/// assert_eq!(store.get(b"k").await?, Some(b"v".to_vec()));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<MemoryCore>,
}

struct MemoryCore {
    shards: Vec<Mutex<MemoryShard>>,
    /// Lease key → holder. Locked before a shard when both are needed.
    leases: Mutex<Leases>,
    channels: Mutex<HashMap<Vec<u8>, broadcast::Sender<Delivery>>>,
    /// Always `true`: an in-process subscription is ready at once.
    ready: watch::Sender<bool>,
    /// Unix milliseconds at `start`, read once from the system clock.
    epoch_ms: u64,
    start: Instant,
}

#[derive(Default)]
struct MemoryShard {
    map: HashMap<Vec<u8>, MemoryEntry>,
    writes_since_sweep: usize,
}

struct MemoryEntry {
    value: Vec<u8>,
    expires_at: Instant,
}

#[derive(Default)]
struct Leases {
    map: HashMap<Vec<u8>, HeldLease>,
    takes_since_sweep: usize,
}

struct HeldLease {
    token: Vec<u8>,
    expires_at: Instant,
    /// Someone tried to take it while it was held.
    waited: bool,
}

impl MemoryStore {
    /// Creates an empty store.
    pub fn new() -> Self {
        let epoch_ms = SystemClock.unix_ms();
        MemoryStore {
            inner: Arc::new(MemoryCore {
                shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
                leases: Mutex::default(),
                channels: Mutex::default(),
                ready: watch::Sender::new(true),
                epoch_ms,
                start: Instant::now(),
            }),
        }
    }

    /// The number of live (unexpired) keys.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        (0..SHARDS)
            .map(|i| {
                let shard = self.inner.shard_at(i);
                shard.map.values().filter(|s| s.expires_at > now).count()
            })
            .sum()
    }

    /// `true` if no live key is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl MemoryStore {
    /// A tag counter moved on to `next` of its state (a hard or a soft
    /// bump), its TTL at least `ttl`, then `notice` published.
    fn move_on(
        &self,
        key: &[u8],
        ttl: Duration,
        notice: Notice<'_>,
        next: impl FnOnce(Option<TagState>) -> TagState,
    ) -> Result<u64, crate::error::Error> {
        let ms = ttl_millis(ttl)?;
        let new = self
            .inner
            .shard_for(key)
            .generation(key, Instant::now(), ms, next);
        self.inner.publish(notice.channel, notice.message);
        Ok(new)
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl MemoryCore {
    /// The live value under `key` at `now`.
    fn read(&self, key: &[u8], now: Instant) -> Option<Vec<u8>> {
        self.shard_for(key).live(key, now).map(|s| s.value.clone())
    }

    fn shard_for(&self, key: &[u8]) -> MutexGuard<'_, MemoryShard> {
        // Cheap, and good enough to spread keys over 16 shards.
        self.shard_at((fnv1a(key) as usize) & (SHARDS - 1))
    }

    fn shard_at(&self, i: usize) -> MutexGuard<'_, MemoryShard> {
        // A panic while holding a shard lock cannot leave a slot half-written
        // (every mutation is a single map operation), so poisoning is ignored.
        self.shards[i]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl MemoryCore {
    fn leases(&self) -> MutexGuard<'_, Leases> {
        self.leases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the lease if `token` holds it (unexpired).
    fn with_held_lease<T>(
        &self,
        lease_key: &[u8],
        token: &[u8],
        f: impl FnOnce(&mut HashMap<Vec<u8>, HeldLease>, Instant) -> T,
    ) -> Option<T> {
        let now = Instant::now();
        let mut leases = self.leases();
        let held = leases
            .map
            .get(lease_key)
            .is_some_and(|l| l.token == token && l.expires_at > now);
        held.then(|| f(&mut leases.map, now))
    }

    /// Publishes `message` on `channel`; how many subscribers it reached.
    fn publish(&self, channel: &[u8], message: &[u8]) -> u64 {
        let channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        // No receivers is not an error: nobody is waiting.
        channels
            .get(channel)
            .and_then(|tx| tx.send(Delivery::Message(Arc::from(message))).ok())
            .map_or(0, |n| n as u64)
    }
}

impl MemoryShard {
    fn live(&mut self, key: &[u8], now: Instant) -> Option<&MemoryEntry> {
        if self.map.get(key).is_some_and(|s| s.expires_at <= now) {
            self.map.remove(key);
        }
        self.map.get(key)
    }

    /// Stores `value` under `key` for `ttl_ms` from `now`.
    fn put(&mut self, key: &[u8], value: &[u8], now: Instant, ttl_ms: u64) {
        self.maybe_sweep(now);
        self.map.insert(
            key.to_vec(),
            MemoryEntry {
                value: value.to_vec(),
                expires_at: now + Duration::from_millis(ttl_ms),
            },
        );
    }

    /// Sets the tag counter under `key` to `next` of the state it holds
    /// (`None`: missing or foreign, see [`parse_tag_state`]), its TTL at
    /// least `ttl_ms` from `now` (never shortened); returns the new
    /// generation. One shard lock: atomic for the key.
    fn generation(
        &mut self,
        key: &[u8],
        now: Instant,
        ttl_ms: u64,
        next: impl FnOnce(Option<TagState>) -> TagState,
    ) -> u64 {
        self.state(key, now, ttl_ms, next).generation
    }

    /// The tag counter under `key` moved on by `next` (as
    /// [`generation`](Self::generation)); its new state.
    fn state(
        &mut self,
        key: &[u8],
        now: Instant,
        ttl_ms: u64,
        next: impl FnOnce(Option<TagState>) -> TagState,
    ) -> TagState {
        let at_least = now + Duration::from_millis(ttl_ms);
        let held = self
            .live(key, now)
            .and_then(|slot| parse_tag_state(&slot.value));
        let new = next(held);
        match self.map.get_mut(key) {
            Some(slot) => {
                if held != Some(new) {
                    slot.value = new.encode();
                }
                slot.expires_at = slot.expires_at.max(at_least);
            }
            None => {
                self.maybe_sweep(now);
                let value = new.encode();
                let expires_at = at_least;
                self.map
                    .insert(key.to_vec(), MemoryEntry { value, expires_at });
            }
        }
        new
    }

    /// Drops expired entries once writes since the last sweep exceed half the
    /// shard: amortised O(1) per write.
    fn maybe_sweep(&mut self, now: Instant) {
        sweep_amortised(&mut self.map, &mut self.writes_since_sweep, |s| {
            s.expires_at > now
        });
    }
}

/// Counts one write to `map` and, once the writes since the last sweep
/// exceed half the map (plus 64), drops the entries that are no longer
/// `live`: amortised O(1) per write, and memory bounded by about twice the
/// live entries.
fn sweep_amortised<V>(
    map: &mut HashMap<Vec<u8>, V>,
    writes_since_sweep: &mut usize,
    live: impl Fn(&V) -> bool,
) {
    *writes_since_sweep += 1;
    if *writes_since_sweep > map.len() / 2 + 64 {
        map.retain(|_, v| live(v));
        *writes_since_sweep = 0;
    }
}

impl Store for MemoryStore {
    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        let value = self.inner.read(key, Instant::now());
        Box::pin(async move { Ok(value) })
    }

    fn set<'a>(&'a self, key: &'a [u8], value: &'a [u8], ttl: Duration) -> StoreFuture<'a, ()> {
        let result = ttl_millis(ttl).map(|ms| {
            self.inner
                .shard_for(key)
                .put(key, value, Instant::now(), ms);
        });
        Box::pin(async move { result })
    }

    /// Deletes the value, or the lease, under `key` (as Redis's `DEL`
    /// would: a lease is a key too).
    fn delete<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, bool> {
        let now = Instant::now();
        let value = self
            .inner
            .shard_for(key)
            .map
            .remove(key)
            .is_some_and(|s| s.expires_at > now);
        let lease = self
            .inner
            .leases()
            .map
            .remove(key)
            .is_some_and(|l| l.expires_at > now);
        Box::pin(async move { Ok(value || lease) })
    }

    fn ttl<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        let now = Instant::now();
        let ttl = self
            .inner
            .shard_for(key)
            .live(key, now)
            .map(|s| s.expires_at - now);
        Box::pin(async move { Ok(ttl) })
    }

    fn now_ms(&self) -> u64 {
        let elapsed = millis(self.inner.start.elapsed());
        self.inner.epoch_ms.saturating_add(elapsed)
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    /// 50 ms: a read answers at once; a caller waits this long only for
    /// another caller's read that is not being polled.
    fn read_deadline(&self) -> Duration {
        Duration::from_millis(50)
    }

    fn bump_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        let bumped = self.move_on(key, ttl, notice, |held| {
            held.map_or(TagState::plain(fresh), TagState::bumped)
        });
        Box::pin(async move { bumped })
    }

    fn bump_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        let bumped = ttl_millis(ttl).map(|ms| {
            let now = Instant::now();
            for key in keys {
                self.inner.shard_for(key).generation(key, now, ms, |held| {
                    held.map_or(TagState::plain(fresh), TagState::bumped)
                });
            }
            if !keys.is_empty() {
                self.inner.publish(notice.channel, notice.message);
            }
        });
        Box::pin(async move { bumped })
    }

    fn expire_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        let bumped = self.move_on(key, ttl, notice, |held| {
            held.map_or(TagState::plain(fresh), |state| state.expired(at_ms))
        });
        Box::pin(async move { bumped })
    }

    fn tag_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u64>> {
        let generations = ttl_millis(ttl).map(|ms| {
            let now = Instant::now();
            keys.iter()
                .map(|key| {
                    self.inner
                        .shard_for(key)
                        .generation(key, now, ms, |held| held.unwrap_or(TagState::plain(fresh)))
                })
                .collect()
        });
        Box::pin(async move { generations })
    }

    fn tag_states<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        now_ms: u64,
    ) -> StoreFuture<'a, Vec<Vec<u8>>> {
        // Dated when it runs, never earlier (the caller's view may be old).
        let now_ms = now_ms.max(self.now_ms());
        let states = ttl_millis(ttl).map(|ms| {
            let now = Instant::now();
            keys.iter()
                .map(|key| {
                    self.inner
                        .shard_for(key)
                        .state(key, now, ms, |held| {
                            held.map_or(TagState::started(fresh, now_ms), |held| held.dated(now_ms))
                        })
                        .encode()
                })
                .collect()
        });
        Box::pin(async move { states })
    }

    fn clear_namespace<'a>(
        &'a self,
        clear: NamespaceClear<'a>,
    ) -> StoreFuture<'a, ClearedNamespace> {
        let now_ms = self.now_ms();
        let cleared = {
            let now = Instant::now();
            let mut shard = self.inner.shard_for(clear.key);
            let held = shard
                .live(clear.key, now)
                .and_then(|slot| NamespaceState::parse(&slot.value));
            let (state, applied) = NamespaceState::applied(held, clear.rule(), now_ms);
            let record = state.encode();
            if applied != Applied::Kept {
                shard.put(clear.key, &record, now, MAX_STORE_TTL_MS);
            }
            let receivers = if applied == Applied::Published {
                // Published under the shard's lock: no other clear of this
                // namespace can publish in between.
                let message = [clear.notice.message, &record].concat();
                self.inner.publish(clear.notice.channel, &message)
            } else {
                0
            };
            ClearedNamespace { record, receivers }
        };
        Box::pin(async move { Ok(cleared) })
    }

    fn get_many<'a>(&'a self, keys: &'a [&'a [u8]]) -> StoreFuture<'a, Vec<Option<Vec<u8>>>> {
        let now = Instant::now();
        let values = keys.iter().map(|key| self.inner.read(key, now)).collect();
        Box::pin(async move { Ok(values) })
    }

    fn acquire_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, LeaseAttempt> {
        let result = ttl_millis(ttl).map(|ms| {
            let now = Instant::now();
            let mut leases = self.inner.leases();
            let Leases {
                map,
                takes_since_sweep,
            } = &mut *leases;
            if let Some(held) = map.get_mut(lease_key).filter(|l| l.expires_at > now) {
                if held.token == token {
                    return LeaseAttempt::Acquired;
                }
                held.waited = true;
                return LeaseAttempt::Held {
                    ttl: held.expires_at - now,
                };
            }
            sweep_amortised(map, takes_since_sweep, |l| l.expires_at > now);
            map.insert(
                lease_key.to_vec(),
                HeldLease {
                    token: token.to_vec(),
                    expires_at: now + Duration::from_millis(ms),
                    waited: false,
                },
            );
            LeaseAttempt::Acquired
        });
        Box::pin(async move { result })
    }

    fn lease_held<'a>(&'a self, lease_key: &'a [u8]) -> StoreFuture<'a, bool> {
        let now = Instant::now();
        let held = self
            .inner
            .leases()
            .map
            .get(lease_key)
            .is_some_and(|l| l.expires_at > now);
        Box::pin(async move { Ok(held) })
    }

    fn extend_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        let result = ttl_millis(ttl).map(|ms| {
            self.inner
                .with_held_lease(lease_key, token, |leases, now| {
                    if let Some(lease) = leases.get_mut(lease_key) {
                        lease.expires_at = now + Duration::from_millis(ms);
                    }
                })
                .is_some()
        });
        Box::pin(async move { result })
    }

    fn release_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        let released = self
            .inner
            .with_held_lease(lease_key, token, |leases, _| leases.remove(lease_key))
            .is_some();
        if released {
            self.inner.publish(notice.channel, notice.message);
        }
        Box::pin(async move { Ok(released) })
    }

    fn fenced_set<'a>(&'a self, write: FencedWrite<'a>) -> StoreFuture<'a, bool> {
        let result = ttl_millis(write.ttl).map(|ms| {
            let written =
                self.inner
                    .with_held_lease(write.lease_key, write.token, |leases, now| {
                        if let Some(unchanged) = write.unchanged
                            && self.inner.read(unchanged.key, now).as_deref()
                                != Some(unchanged.bytes)
                        {
                            leases.remove(write.lease_key);
                            return None;
                        }
                        self.inner
                            .shard_for(write.key)
                            .put(write.key, write.value, now, ms);
                        Some(leases.remove(write.lease_key).is_some_and(|l| l.waited))
                    });
            let written = match written {
                Some(None) => {
                    // The condition failed: the lease is gone, waiters told.
                    self.inner
                        .publish(write.notice.channel, write.notice.message);
                    return false;
                }
                Some(Some(waited)) => Some(waited),
                None => None,
            };
            match (written, write.value_notice) {
                (None, _) => return false,
                (Some(true), Some(prefix)) => {
                    let message = [prefix, write.value].concat();
                    self.inner.publish(write.notice.channel, &message);
                }
                (Some(_), _) => {
                    self.inner
                        .publish(write.notice.channel, write.notice.message);
                }
            }
            true
        });
        Box::pin(async move { result })
    }

    fn fenced_renew<'a>(&'a self, renewal: FencedRenewal<'a>) -> StoreFuture<'a, Renewal> {
        let result = ttl_millis(renewal.ttl).map(|ms| {
            let FencedRenewal {
                key,
                offset,
                expected,
                patch,
                ..
            } = renewal;
            let renewed =
                self.inner
                    .with_held_lease(renewal.lease_key, renewal.token, |leases, now| {
                        let mut shard = self.inner.shard_for(key);
                        let Some(held) = shard.live(key, now) else {
                            return false;
                        };
                        let mut value = held.value.clone();
                        let end = offset.saturating_add(expected.len());
                        if value.get(offset..end) != Some(expected) || patch.len() > expected.len()
                        {
                            return false;
                        }
                        value[offset..offset + patch.len()].copy_from_slice(patch);
                        shard.put(key, &value, now, ms);
                        leases.remove(renewal.lease_key);
                        true
                    });
            match renewed {
                None => Renewal::Refused,
                Some(false) => Renewal::Declined,
                Some(true) => {
                    self.inner
                        .publish(renewal.notice.channel, renewal.notice.message);
                    Renewal::Renewed
                }
            }
        });
        Box::pin(async move { result })
    }

    fn pin<'a>(
        &'a self,
        key: &'a [u8],
        placeholder: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u8>> {
        let result = ttl_millis(ttl).map(|ms| {
            let now = Instant::now();
            let mut shard = self.inner.shard_for(key);
            if let Some(held) = shard.live(key, now) {
                return held.value.clone();
            }
            shard.put(key, placeholder, now, ms);
            placeholder.to_vec()
        });
        Box::pin(async move { result })
    }

    fn replace<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
        ttl: Duration,
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        let result = ttl_millis(ttl).map(|ms| {
            {
                let mut leases = self.inner.leases();
                leases.map.remove(lease_key);
                self.inner
                    .shard_for(key)
                    .put(key, value, Instant::now(), ms);
            }
            self.inner.publish(notice.channel, notice.message);
        });
        Box::pin(async move { result })
    }

    /// One atomic step: every lease revoked and every value written under
    /// the leases' lock (no holder's fenced write lands in between), then
    /// one message for all the keys.
    fn replace_many<'a>(
        &'a self,
        writes: &'a [Replace<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        let result = writes
            .iter()
            .map(|w| ttl_millis(w.ttl))
            .collect::<Result<Vec<u64>, crate::error::Error>>()
            .map(|ttls| {
                if writes.is_empty() {
                    return;
                }
                {
                    let mut leases = self.inner.leases();
                    let now = Instant::now();
                    for (w, ms) in writes.iter().zip(ttls) {
                        leases.map.remove(w.lease_key);
                        self.inner.shard_for(w.key).put(w.key, w.value, now, ms);
                    }
                }
                let message = notice.for_keys(writes.iter().map(|w| w.key));
                self.inner.publish(notice.channel, &message);
            });
        Box::pin(async move { result })
    }

    /// One atomic step: every value and lease deleted under the leases'
    /// lock, then one message for all the keys.
    fn invalidate_many<'a>(
        &'a self,
        keys: &'a [Invalidate<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        if !keys.is_empty() {
            {
                let mut leases = self.inner.leases();
                for k in keys {
                    leases.map.remove(k.lease_key);
                    self.inner.shard_for(k.key).map.remove(k.key);
                }
            }
            let message = notice.for_keys(keys.iter().map(|k| k.key));
            self.inner.publish(notice.channel, &message);
        }
        Box::pin(async move { Ok(()) })
    }

    fn invalidate<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        {
            let mut leases = self.inner.leases();
            leases.map.remove(lease_key);
            self.inner.shard_for(key).map.remove(key);
        }
        self.inner.publish(notice.channel, notice.message);
        Box::pin(async move { Ok(()) })
    }

    fn expire_entry<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        let found = {
            // The lease first, under its lock: no holder's write lands
            // between the revocation and the change.
            let mut leases = self.inner.leases();
            leases.map.remove(lease_key);
            let now = Instant::now();
            let mut shard = self.inner.shard_for(key);
            shard.live(key, now).is_some()
                && shard
                    .map
                    .get_mut(key)
                    .is_some_and(|slot| expire_in_place(&mut slot.value, at_ms))
        };
        self.inner.publish(notice.channel, notice.message);
        Box::pin(async move { Ok(found) })
    }

    fn publish<'a>(&'a self, channel: &'a [u8], message: &'a [u8]) -> StoreFuture<'a, ()> {
        self.inner.publish(channel, message);
        Box::pin(async move { Ok(()) })
    }

    fn subscribe(&self, channel: &[u8]) -> Subscription {
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let tx = channels
            .entry(channel.to_vec())
            .or_insert_with(|| broadcast::channel(SUBSCRIPTION_BUFFER).0);
        Subscription::new(tx.subscribe(), self.inner.ready.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TTL past what an instant can hold is cut to ten years, not a panic.
    #[tokio::test(start_paused = true)]
    async fn an_endless_ttl_saturates() {
        let store = MemoryStore::new();
        store.set(b"k", b"v", Duration::MAX).await.unwrap();
        assert_eq!(store.get(b"k").await.unwrap(), Some(b"v".to_vec()));
        let ttl = store.ttl(b"k").await.unwrap().unwrap();
        assert!(ttl > Duration::from_secs(9 * 365 * 24 * 3600), "{ttl:?}");
        let attempt = store.acquire_lease(b"l", b"t", Duration::MAX).await;
        assert!(matches!(attempt, Ok(LeaseAttempt::Acquired)));
        assert!(store.extend_lease(b"l", b"t", Duration::MAX).await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_on_tokios_clock() {
        let store = MemoryStore::new();
        store
            .set(b"k", b"v", Duration::from_secs(10))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(store.get(b"k").await.unwrap(), Some(b"v".to_vec()));
        assert_eq!(
            store.ttl(b"k").await.unwrap(),
            Some(Duration::from_millis(1))
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(store.get(b"k").await.unwrap(), None);
        assert!(store.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn now_follows_paused_time() {
        let store = MemoryStore::new();
        let t0 = store.now_ms();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(store.now_ms() - t0, 60_000);
    }

    #[tokio::test(start_paused = true)]
    async fn sweep_bounds_memory_to_live_keys() {
        let store = MemoryStore::new();
        for i in 0..10_000u32 {
            store
                .set(&i.to_be_bytes(), b"v", Duration::from_millis(5))
                .await
                .unwrap();
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        for i in 10_000..20_000u32 {
            store
                .set(&i.to_be_bytes(), b"v", Duration::from_secs(5))
                .await
                .unwrap();
        }
        let stored: usize = (0..SHARDS).map(|i| store.inner.shard_at(i).map.len()).sum();
        assert!(stored < 15_000, "expired entries were not swept: {stored}");
        assert_eq!(store.len(), 10_000);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_leases_are_swept_too() {
        let store = MemoryStore::new();
        let short = Duration::from_millis(5);
        for i in 0..10_000u32 {
            assert!(
                store
                    .acquire_lease(&i.to_be_bytes(), b"t", short)
                    .await
                    .unwrap()
                    .is_acquired()
            );
        }
        tokio::time::advance(Duration::from_millis(10)).await;
        for i in 10_000..20_000u32 {
            let long = Duration::from_secs(5);
            assert!(
                store
                    .acquire_lease(&i.to_be_bytes(), b"t", long)
                    .await
                    .unwrap()
                    .is_acquired()
            );
        }
        let kept = store.inner.leases().map.len();
        assert!(kept < 15_000, "expired leases were not swept: {kept}");
        assert!(kept >= 10_000, "live leases were swept: {kept}");
        assert!(store.lease_held(&15_000u32.to_be_bytes()).await.unwrap());
        assert!(!store.lease_held(&5u32.to_be_bytes()).await.unwrap());
    }
}
