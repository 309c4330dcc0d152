//! The in-process near cache (L1), so a hot key costs no round trip and no
//! decoding, and a store that is slow or gone is shielded: decoded values
//! in front of the store, never fresher than the store says.
//!
//! An L1 hit costs no round trip and no decoding. Each entry lives no longer
//! in L1 than the value's remaining fresh time in the store (and at most
//! [`L1Config::ttl`]), so L1 never makes a value fresher than the store says.
//! It is kept a while longer, up to the value's stale window (`max_stale`),
//! only so that it can still be served when the store cannot be reached.
//!
//! Other processes' writes and invalidations reach L1 through the cache's
//! namespace channel (the same subscription that wakes lease waiters): the
//! key is dropped from L1 and read again from the store.
//!
//! # Through an outage: unverified, not erased
//!
//! When the subscription drops, invalidations may be missed from then on,
//! so every entry becomes **unverified**: it is no longer served as fresh,
//! but it is kept. The next call for it reads the store (one `GET`), which
//! answers and re-verifies it; if the store cannot be reached, the entry
//! stands in, served as `Stale { StoreUnavailable }` within its stale
//! window (`max_stale`, and [`L1Config::keep`]). While the bus is down,
//! values read from the store are kept unverified too; when it is back,
//! entries are re-verified one read at a time.
//!
//! So an entry is served as fresh at most until the drop is noticed: at
//! once when the connection breaks, within the subscription's `PING`
//! interval plus its response deadline when Redis hangs (1 s + 50 ms with
//! [`RedisStoreConfig`](crate::RedisStoreConfig)'s defaults); and never
//! longer than [`L1Config::ttl`] after it was read.
//!
//! # Epochs: no insert from before an invalidation
//!
//! A read or load that began before an invalidation of its key was seen
//! here (this process's `invalidate`/`set`, or another's through the bus)
//! must not put its older value into L1 when its reply lands late. Every
//! read and load takes a ticket when it starts; an invalidation records
//! a new epoch for its key; an insert whose ticket predates its key's last
//! invalidation is undone. The insert is checked *after* it is made (and an
//! invalidation records its epoch *before* it removes the key), so the two
//! cannot interleave into a stale entry. The per-key record is bounded: past
//! 4,096 keys it is replaced by one floor epoch (every older ticket is
//! refused, which costs only a few L1 inserts).
//!
//! Entries are keyed by the user's key (the storage key without its
//! namespace prefix and hash tag), so a hit builds no key at all.
//!
//! Backed by `moka`'s synchronous cache, bounded by entry count: a lookup
//! is a plain call (a bare synchronous `get` runs 1.2–1.3 times as fast on
//! one thread as an awaited `moka::future::Cache::get`, whose future, some
//! 750 bytes, would also sit in every caller's future). Its reads never
//! block. Its writes block only
//! when moka's write log is full while another thread runs moka's
//! housekeeping, 50 µs at a time until that round ends; an L1 insert
//! follows a store read or a load, so only a burst of fills outrunning the
//! housekeeping gets there.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ConfigError, KeyedResult, MAX_WINDOW};

/// The most L1 entries accepted.
const MAX_L1_ENTRIES: u64 = 100_000_000;

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
/// use breakwater_cache::{Cache, L1Config};
/// let cache = Cache::<String>::builder()
///     .l1(L1Config::new().entries(50_000).ttl(Duration::from_secs(5)))
///     .build()?;
/// # Ok::<(), breakwater_cache::ConfigError>(())
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
    /// `l1 keep (1s) must be at least the l1 ttl (30s)`; at most
    /// 100,000,000 entries, and `ttl` and `keep` at most 365 days.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.entries == 0 {
            return Err(ConfigError::new("l1 entries must be at least 1").for_key("entries"));
        }
        if self.entries > MAX_L1_ENTRIES {
            return Err(ConfigError::new(format!(
                "l1 entries must be at most {MAX_L1_ENTRIES}, got {}; an in-process cache that \
                 large belongs in the store, use fewer entries",
                self.entries
            ))
            .for_key("entries"));
        }
        ConfigError::at_most(
            "l1 ttl",
            self.ttl,
            MAX_WINDOW,
            "use an l1 ttl of seconds to minutes (the default is 30s)",
        )
        .for_key("ttl")?;
        ConfigError::at_most(
            "l1 keep",
            self.keep,
            MAX_WINDOW,
            "use an l1 keep of at most 365 days (the default is 10 min)",
        )
        .for_key("keep")?;
        if self.ttl < Duration::from_millis(1) {
            return Err(ConfigError::new(format!(
                "l1 ttl must be at least 1ms, got {:?}",
                self.ttl
            ))
            .for_key("ttl"));
        }
        if self.keep < self.ttl {
            return Err(ConfigError::new(format!(
                "l1 keep ({:?}) must be at least the l1 ttl ({:?})",
                self.keep, self.ttl
            ))
            .for_key("keep"));
        }
        Ok(())
    }
}

/// One L1 entry. Times are tokio instants of this process, except the
/// store-clock reading kept for early refresh.
#[derive(Debug)]
pub(crate) struct NearCopy<V> {
    /// `None`: a negative entry.
    pub(crate) value: Option<V>,
    fresh_until: Instant,
    stale_until: Instant,
    /// The entry's own deadlines and load time, on the store's clock, so an
    /// L1 hit can judge early refresh as a store read would.
    pub(crate) stored: Stamp,
    /// The entry's fresh end as a local instant (the store's clock as it
    /// read when the entry was kept, plus the time since): a hit tells how
    /// close it is without reading the store's clock.
    pub(crate) refresh_by: Instant,
    /// Under the cache's default freshness policy, no early refresh can be
    /// due before this instant (`None`: none ever is); set when the entry
    /// is kept, so a hit far from its end costs one comparison.
    pub(crate) quiet_until: Option<Instant>,
    /// The bus generation it was verified in (0: never, kept while the bus
    /// was down); fresh only in the current one.
    generation: u64,
}

/// What an L1 entry keeps of the stored entry it came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// The end of the fresh window, store-clock ms.
    pub(crate) fresh_until: u64,
    /// The end of the stale window, store-clock ms.
    pub(crate) stale_until: u64,
    /// How long the load that produced it took.
    pub(crate) load_ms: u32,
    /// The entry has tags (a tag invalidation drops it).
    pub(crate) tagged: bool,
    /// Which tags (a hash of their names, 0 for none): a call naming tags
    /// is served the copy only if it names exactly these.
    pub(crate) tag_set: u64,
}

/// When a read or load began, in invalidation epochs; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket(u64);

/// The per-key invalidation epochs of one near cache.
#[derive(Debug, Default)]
struct Epochs {
    /// The latest epoch handed out.
    counter: AtomicU64,
    /// Tickets below this are refused for every key.
    floor: AtomicU64,
    /// Key → the epoch of its latest invalidation.
    recent: Mutex<HashMap<Vec<u8>, u64>>,
}

/// The most keys whose invalidation epochs are remembered one by one.
const EPOCH_KEYS: usize = 4096;

impl Epochs {
    fn ticket(&self) -> Ticket {
        Ticket(self.counter.load(Ordering::SeqCst))
    }

    /// Records an invalidation of `key`, seen now.
    fn invalidate(&self, key: &[u8]) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = self.counter.fetch_add(1, Ordering::SeqCst) + 1;
        if recent.len() >= EPOCH_KEYS && !recent.contains_key(key) {
            recent.clear();
            self.floor.fetch_max(epoch, Ordering::SeqCst);
            return;
        }
        recent.insert(key.to_vec(), epoch);
    }

    /// Records that anything may have been invalidated.
    fn invalidate_all(&self) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = self.counter.fetch_add(1, Ordering::SeqCst) + 1;
        recent.clear();
        self.floor.fetch_max(epoch, Ordering::SeqCst);
    }

    /// `true` if nothing invalidated `key` after `ticket` was taken.
    fn still_valid(&self, key: &[u8], ticket: Ticket) -> bool {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        ticket.0 >= self.floor.load(Ordering::SeqCst)
            && recent.get(key).is_none_or(|&epoch| epoch <= ticket.0)
    }
}

impl<V> NearCopy<V> {
    pub(crate) fn is_fresh(&self, now: Instant) -> bool {
        now < self.fresh_until
    }

    pub(crate) fn is_servable(&self, now: Instant) -> bool {
        now < self.stale_until
    }
}

/// The near cache of one `Cache`, keyed by the user's key.
pub(crate) struct NearCache<V> {
    /// Hashed with foldhash (seeded per process), not moka's default
    /// SipHash: hashing the key is a large share of an L1 hit. The cache is
    /// bounded, so keys chosen to collide cost a slower lookup, nothing
    /// more.
    cache: moka::sync::Cache<Vec<u8>, Arc<NearCopy<V>>, foldhash::fast::RandomState>,
    epochs: Epochs,
    /// Bumped whenever invalidations may have been missed: entries kept in
    /// an older generation are unverified.
    generation: AtomicU64,
    /// The bus is down: entries kept now are unverified from the start.
    bus_down: AtomicBool,
    /// The same for the previous version's channel, inside a version
    /// transition (see `cache::transition`).
    previous_down: AtomicBool,
    /// An entry with tags may have been kept since the last tag
    /// invalidation ([`drop_tagged`](Self::drop_tagged)).
    holds_tagged: AtomicBool,
    ttl: Duration,
    keep: Duration,
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
    pub(crate) fn new(config: L1Config) -> Self {
        NearCache {
            cache: moka::sync::Cache::builder()
                .max_capacity(config.entries)
                .time_to_live(config.keep)
                .build_with_hasher(foldhash::fast::RandomState::default()),
            ttl: config.ttl,
            keep: config.keep,
            epochs: Epochs::default(),
            generation: AtomicU64::new(1),
            bus_down: AtomicBool::new(false),
            previous_down: AtomicBool::new(false),
            holds_tagged: AtomicBool::new(false),
        }
    }

    /// Whether `slot` may be served as fresh: verified in the current bus
    /// generation, and within its fresh time.
    pub(crate) fn is_fresh(&self, slot: &NearCopy<V>, now: Instant) -> bool {
        slot.is_fresh(now) && slot.generation == self.generation.load(Ordering::Relaxed)
    }

    /// Taken when a read or load begins; [`put`](Self::put) refuses its
    /// value if the key was invalidated since.
    pub(crate) fn ticket(&self) -> Ticket {
        self.epochs.ticket()
    }

    /// The entry for the user's `key`.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Arc<NearCopy<V>>> {
        self.cache.get(key)
    }

    /// Remembers `value` under the user's `key`, fresh in L1 for at most
    /// `fresh_for` (capped by the L1 TTL) and servable as stale for
    /// `stale_for` in all, unless `key` was invalidated since `ticket`.
    /// `early_window_ms`: the fresh time left at or below which the default
    /// policy could refresh early (see `NearCopy::quiet_until`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put(
        &self,
        key: &[u8],
        value: Option<V>,
        fresh_for: Duration,
        stale_for: Duration,
        stored: Stamp,
        early_window_ms: Option<u64>,
        ticket: Ticket,
    ) {
        if !self.epochs.still_valid(key, ticket) {
            return;
        }
        let now = Instant::now();
        let refresh_by = now.checked_add(fresh_for).unwrap_or(now);
        // Due once fewer than `window + 1` whole milliseconds are left.
        let quiet_until = early_window_ms.map(|window| {
            refresh_by
                .checked_sub(Duration::from_millis(window.saturating_add(1)))
                .unwrap_or(now)
        });
        let fresh_for = fresh_for.min(self.ttl);
        let keep = stale_for.max(fresh_for).min(self.keep);
        if keep.is_zero() {
            return;
        }
        let generation =
            if self.bus_down.load(Ordering::SeqCst) || self.previous_down.load(Ordering::SeqCst) {
                0
            } else {
                self.generation.load(Ordering::SeqCst)
            };
        // Both are bounded by the validated `ttl`/`keep`; saturate anyway.
        let (Some(fresh_until), Some(stale_until)) =
            (now.checked_add(fresh_for), now.checked_add(keep))
        else {
            return;
        };
        if stored.tagged {
            // Before the insert (see `drop_tagged`).
            self.holds_tagged.store(true, Ordering::SeqCst);
        }
        let slot = NearCopy {
            value,
            fresh_until,
            stale_until,
            stored,
            refresh_by,
            quiet_until,
            generation,
        };
        self.cache.insert(key.to_vec(), Arc::new(slot));
        // An invalidation that slipped in between the check and the insert
        // recorded its epoch before removing the key: look again.
        if !self.epochs.still_valid(key, ticket) {
            self.cache.invalidate(key);
        }
    }

    /// Entries held (moka's count: approximate, updated by its
    /// housekeeping).
    pub(crate) fn entries(&self) -> u64 {
        self.cache.entry_count()
    }

    /// Drops the user's `key` (it was refilled elsewhere: newer data, not an
    /// invalidation).
    pub(crate) fn remove(&self, key: &[u8]) {
        self.cache.invalidate(key);
    }

    /// The user's `key` was invalidated (or replaced by `set`): drop it, and
    /// refuse every read or load of it that began before.
    pub(crate) fn invalidated(&self, key: &[u8]) {
        self.epochs.invalidate(key);
        self.remove(key);
    }

    /// Invalidations may have been missed (the bus dropped, `up` false, or
    /// came back, `true`): every entry becomes unverified (kept as a
    /// stand-in, not served as fresh), and every read or load that began
    /// before is refused.
    pub(crate) fn unverify(&self, up: bool) {
        self.bus_down.store(!up, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.epochs.invalidate_all();
    }

    /// Invalidations may have been missed on a second channel (a version
    /// transition's previous version), which is down (`up` false) or back
    /// (`true`): every entry becomes unverified (re-read before it is served
    /// as fresh again), every read or load that began before is refused,
    /// and while it is down entries are kept unverified, as while the bus
    /// itself is down.
    pub(crate) fn previous_bus(&self, up: bool) {
        self.previous_down.store(!up, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.epochs.invalidate_all();
    }

    /// A tag was invalidated: every read or load that began before is
    /// refused (any key may carry the tag), and every entry is dropped if
    /// one with tags may be among them; an L1 that never kept a tagged
    /// entry since the last time keeps its entries.
    ///
    /// The epoch floor moves before the flag is looked at, and `put` raises
    /// the flag before it inserts: a tagged insert racing with this is
    /// either refused by its re-check after the insert, or flagged in time
    /// to be dropped here.
    pub(crate) fn drop_tagged(&self) {
        self.epochs.invalidate_all();
        if self.holds_tagged.swap(false, Ordering::SeqCst) {
            self.cache.invalidate_all();
        }
    }

    /// Drops everything, and refuses every read or load that began before.
    pub(crate) fn clear(&self) {
        self.epochs.invalidate_all();
        self.cache.invalidate_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fresh_then_stale_then_gone() {
        let l1 = NearCache::<u32>::new(L1Config::new());
        let ticket = l1.ticket();
        l1.put(
            b"k",
            Some(1),
            Duration::from_secs(1),
            Duration::from_secs(5),
            Stamp::default(),
            None,
            ticket,
        );
        let slot = l1.get(b"k").unwrap();
        assert!(slot.is_fresh(Instant::now()));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!slot.is_fresh(Instant::now()));
        assert!(slot.is_servable(Instant::now()));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(!slot.is_servable(Instant::now()));
    }

    #[test]
    fn a_tag_invalidation_drops_entries_only_if_one_is_tagged() {
        let l1 = NearCache::<u32>::new(L1Config::new());
        let put = |key: &'static [u8], tagged: bool, ticket| {
            let stamp = Stamp {
                tagged,
                ..Stamp::default()
            };
            let (fresh, stale) = (Duration::from_secs(5), Duration::from_secs(5));
            l1.put(key, Some(1), fresh, stale, stamp, None, ticket);
        };
        put(b"plain", false, l1.ticket());
        let before = l1.ticket();
        l1.drop_tagged();
        assert!(l1.get(b"plain").is_some(), "no tagged entry: kept");
        // A read that began before is refused, tagged or not.
        put(b"late", true, before);
        assert!(l1.get(b"late").is_none());
        put(b"tagged", true, l1.ticket());
        assert!(l1.get(b"tagged").is_some());
        l1.drop_tagged();
        assert!(l1.get(b"tagged").is_none());
        assert!(l1.get(b"plain").is_none(), "all go with a tagged one");
    }

    #[tokio::test(start_paused = true)]
    async fn l1_ttl_caps_the_fresh_time() {
        let l1 = NearCache::<u32>::new(L1Config::new().ttl(Duration::from_millis(100)));
        put(&l1, b"k", 1, l1.ticket());
        let slot = l1.get(b"k").unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(!slot.is_fresh(Instant::now()));
    }

    fn put(l1: &NearCache<u32>, key: &[u8], value: u32, ticket: Ticket) {
        let fresh = Duration::from_secs(60);
        l1.put(
            key,
            Some(value),
            fresh,
            fresh,
            Stamp::default(),
            None,
            ticket,
        );
    }

    #[test]
    fn invalidation_removes_and_clear_flushes() {
        let l1 = NearCache::<u32>::new(L1Config::new());
        put(&l1, b"a", 1, l1.ticket());
        put(&l1, b"b", 2, l1.ticket());
        l1.invalidated(b"a");
        assert!(l1.get(b"a").is_none());
        assert!(l1.get(b"b").is_some());
        l1.clear();
        assert!(l1.get(b"b").is_none());
    }

    #[test]
    fn a_read_that_began_before_an_invalidation_is_not_kept() {
        let l1 = NearCache::<u32>::new(L1Config::new());
        let before = l1.ticket();
        l1.invalidated(b"a");
        put(&l1, b"a", 1, before);
        assert!(l1.get(b"a").is_none(), "stale insert refused");
        // Other keys and later reads are unaffected.
        put(&l1, b"b", 2, before);
        assert!(l1.get(b"b").is_some());
        put(&l1, b"a", 3, l1.ticket());
        assert_eq!(l1.get(b"a").unwrap().value, Some(3));
        // A flush refuses every read that began before it.
        let before = l1.ticket();
        l1.clear();
        put(&l1, b"b", 4, before);
        assert!(l1.get(b"b").is_none());
    }

    #[test]
    fn the_epoch_record_is_bounded() {
        let l1 = NearCache::<u32>::new(L1Config::new());
        let before = l1.ticket();
        for i in 0..(EPOCH_KEYS as u32 + 10) {
            l1.invalidated(&i.to_be_bytes());
        }
        let kept = l1.epochs.recent.lock().unwrap().len();
        assert!(kept < EPOCH_KEYS, "{kept}");
        // Everything that began before is refused, however it was recorded.
        put(&l1, &0u32.to_be_bytes(), 1, before);
        put(&l1, b"never invalidated", 1, before);
        assert!(l1.get(&0u32.to_be_bytes()).is_none());
        assert!(l1.get(b"never invalidated").is_none());
        put(&l1, b"never invalidated", 1, l1.ticket());
        assert!(l1.get(b"never invalidated").is_some());
    }

    #[test]
    fn a_dropped_bus_unverifies_entries_without_erasing_them() {
        let l1 = NearCache::<u32>::new(L1Config::new());
        put(&l1, b"a", 1, l1.ticket());
        let now = Instant::now();
        let slot = l1.get(b"a").unwrap();
        assert!(l1.is_fresh(&slot, now));
        // The bus drops: kept, servable, not fresh.
        l1.unverify(false);
        let slot = l1.get(b"a").expect("kept through the outage");
        assert!(!l1.is_fresh(&slot, now));
        assert!(slot.is_servable(now));
        // Kept while the bus is down: unverified from the start.
        put(&l1, b"b", 2, l1.ticket());
        let slot = l1.get(b"b").unwrap();
        assert!(!l1.is_fresh(&slot, now));
        // Back: a new read is fresh again.
        l1.unverify(true);
        put(&l1, b"b", 3, l1.ticket());
        let slot = l1.get(b"b").unwrap();
        assert!(l1.is_fresh(&slot, now));
        assert!(
            !l1.is_fresh(&l1.get(b"a").unwrap(), now),
            "a stays unverified"
        );
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
