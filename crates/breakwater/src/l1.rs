//! The in-process near cache (L1): decoded values in front of the store.
//!
//! An L1 hit costs no round trip and no decoding. Each entry lives no longer
//! in L1 than the value's remaining fresh time in the store (and at most
//! [`L1Config::ttl`]), so L1 never makes a value fresher than the store says.
//! It is kept a while longer, up to the value's stale window (`max_stale`),
//! only so that it can still be served when the store cannot be reached.
//!
//! Other processes' writes and invalidations reach L1 through the cache's
//! namespace channel (the same subscription that wakes lease waiters): the
//! key is dropped from L1 and read again from the store. When the
//! subscription drops, invalidations may have been missed, so **L1 is
//! flushed**; until it is back, entries live at most their L1 TTL.
//!
//! Entries are keyed by the user's key (the storage key without its
//! namespace prefix and hash tag), so a hit builds no key at all.
//!
//! Backed by `moka`'s future cache, bounded by entry count.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;

/// Near-cache settings.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `entries` | 10,000 |
/// | `ttl` | 30 s (never beyond the value's remaining fresh time) |
/// | `keep` | 10 min: the longest an entry stays at all, as a stand-in while the store is unreachable (never beyond the value's `max_stale`) |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater::{Cache, L1Config};
/// let cache = Cache::<String>::builder()
///     .l1(L1Config::new().entries(50_000).ttl(Duration::from_secs(5)))
///     .build()?;
/// # Ok::<(), breakwater::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L1Config {
    entries: u64,
    ttl: Duration,
    keep: Duration,
}

impl Default for L1Config {
    fn default() -> Self {
        Self::new()
    }
}

impl L1Config {
    /// The defaults.
    pub fn new() -> Self {
        L1Config {
            entries: 10_000,
            ttl: Duration::from_secs(30),
            keep: Duration::from_secs(600),
        }
    }

    /// The most entries kept (least recently/frequently used go first).
    pub fn entries(mut self, n: u64) -> Self {
        self.entries = n;
        self
    }

    /// The longest an entry is served from L1 before the store is asked
    /// again; also the bound on staleness while invalidations cannot arrive.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The longest an entry stays in L1 at all. Past its fresh time it is
    /// only served while the store is unreachable, and never beyond the
    /// value's `max_stale`. One bound for all entries keeps reads cheap.
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// `l1 entries must be at least 1`, `l1 ttl must be at least 1ms, got 0ns`,
    /// `l1 keep (1s) must be at least the l1 ttl (30s)`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.entries == 0 {
            return Err(ConfigError::new("l1 entries must be at least 1"));
        }
        if self.ttl < Duration::from_millis(1) {
            return Err(ConfigError::new(format!(
                "l1 ttl must be at least 1ms, got {:?}",
                self.ttl
            )));
        }
        if self.keep < self.ttl {
            return Err(ConfigError::new(format!(
                "l1 keep ({:?}) must be at least the l1 ttl ({:?})",
                self.keep, self.ttl
            )));
        }
        Ok(())
    }
}

/// One L1 entry. Times are tokio instants of this process.
#[derive(Debug)]
pub(crate) struct Slot<V> {
    /// `None`: a negative entry.
    pub(crate) value: Option<V>,
    fresh_until: Instant,
    stale_until: Instant,
}

impl<V> Slot<V> {
    pub(crate) fn is_fresh(&self, now: Instant) -> bool {
        now < self.fresh_until
    }

    pub(crate) fn is_servable(&self, now: Instant) -> bool {
        now < self.stale_until
    }
}

/// The near cache of one `Cache`, keyed by the user's key.
pub(crate) struct NearCache<V> {
    cache: moka::future::Cache<Vec<u8>, Arc<Slot<V>>>,
    ttl: Duration,
    keep: Duration,
    /// The length of the namespace prefix of a storage key (the bus speaks
    /// storage keys).
    prefix_len: usize,
}

impl<V> fmt::Debug for NearCache<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NearCache")
            .field("entries", &self.cache.entry_count())
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl<V: Clone + Send + Sync + 'static> NearCache<V> {
    /// `prefix_len`: the length of the storage keys' namespace prefix.
    pub(crate) fn new(config: L1Config, prefix_len: usize) -> Self {
        NearCache {
            prefix_len,
            cache: moka::future::Cache::builder()
                .max_capacity(config.entries)
                .time_to_live(config.keep)
                .build(),
            ttl: config.ttl,
            keep: config.keep,
        }
    }

    /// The entry for the user's `key`.
    ///
    /// moka's lookup future is large (about 750 bytes) and nearly always
    /// finishes on its first poll, so it is polled once here, on the stack,
    /// instead of living inside every `get_or_load` future (and every task
    /// that awaits one). Only when moka's housekeeping has to wait (its
    /// futures are cancellation-safe) is a boxed lookup awaited.
    pub(crate) async fn get(&self, key: &[u8]) -> Option<Arc<Slot<V>>> {
        {
            let lookup = std::pin::pin!(self.cache.get(key));
            if let Poll::Ready(found) = lookup.poll(&mut Context::from_waker(Waker::noop())) {
                return found;
            }
        }
        Box::pin(self.cache.get(key)).await
    }

    /// Remembers `value` under the user's `key`, fresh in L1 for at most `fresh_for` (capped by the
    /// L1 TTL) and servable as stale for `stale_for` in all.
    pub(crate) async fn put(
        &self,
        key: &[u8],
        value: Option<V>,
        fresh_for: Duration,
        stale_for: Duration,
    ) {
        let now = Instant::now();
        let fresh_for = fresh_for.min(self.ttl);
        let keep = stale_for.max(fresh_for).min(self.keep);
        if keep.is_zero() {
            return;
        }
        let slot = Slot {
            value,
            fresh_until: now + fresh_for,
            stale_until: now + keep,
        };
        // Boxed: moka's insert future is large, and inline it would grow
        // every `get_or_load` future that may reach this point.
        Box::pin(self.cache.insert(key.to_vec(), Arc::new(slot))).await;
    }

    /// Drops the user's `key`.
    pub(crate) async fn remove(&self, key: &[u8]) {
        Box::pin(self.cache.invalidate(key)).await;
    }

    pub(crate) fn clear(&self) {
        self.cache.invalidate_all();
    }
}

/// What the bus listener tells a near cache.
pub(crate) trait BusHook: Send + Sync + 'static {
    /// Another process changed storage key `key`.
    fn changed(&self, key: Vec<u8>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    /// Messages may have been missed.
    fn missed(&self);
}

impl<V: Clone + Send + Sync + 'static> BusHook for NearCache<V> {
    fn changed(&self, key: Vec<u8>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let cache = self.cache.clone();
        let key = crate::cache::user_key(&key, self.prefix_len).to_vec();
        Box::pin(async move { cache.invalidate(&key).await })
    }

    fn missed(&self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fresh_then_stale_then_gone() {
        let l1 = NearCache::<u32>::new(L1Config::new(), 0);
        l1.put(
            b"k",
            Some(1),
            Duration::from_secs(1),
            Duration::from_secs(5),
        )
        .await;
        let slot = l1.get(b"k").await.unwrap();
        assert!(slot.is_fresh(Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!slot.is_fresh(Instant::now()));
        assert!(slot.is_servable(Instant::now()));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(!slot.is_servable(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn l1_ttl_caps_the_fresh_time() {
        let l1 = NearCache::<u32>::new(L1Config::new().ttl(Duration::from_millis(100)), 0);
        l1.put(b"k", Some(1), Duration::from_secs(60), Duration::ZERO)
            .await;
        let slot = l1.get(b"k").await.unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(!slot.is_fresh(Instant::now()));
    }

    #[tokio::test]
    async fn bus_hook_removes_and_flushes() {
        let l1 = NearCache::<u32>::new(L1Config::new(), 0);
        l1.put(b"a", Some(1), Duration::from_secs(60), Duration::ZERO)
            .await;
        l1.put(b"b", Some(2), Duration::from_secs(60), Duration::ZERO)
            .await;
        l1.changed(b"a".to_vec()).await;
        assert!(l1.get(b"a").await.is_none());
        assert!(l1.get(b"b").await.is_some());
        l1.missed();
        assert!(l1.get(b"b").await.is_none());
    }

    #[test]
    fn validate_messages() {
        assert_eq!(
            L1Config::new().entries(0).validate().unwrap_err().message(),
            "l1 entries must be at least 1"
        );
        assert_eq!(
            L1Config::new()
                .ttl(Duration::ZERO)
                .validate()
                .unwrap_err()
                .message(),
            "l1 ttl must be at least 1ms, got 0ns"
        );
    }
}
