//! [`CountingStore`]: a [`Store`] in front of another that counts its reads
//! and can be told to make them slow, late or failing, to lose lease
//! replies, to fail invalidations and to hang write replies.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;
use crate::store::{
    ClearedNamespace, FencedRenewal, FencedWrite, Invalidate, LeaseAttempt, NamespaceClear, Notice,
    Renewal, Replace, Store, StoreFuture, Subscription,
};

/// A [`Store`] that counts the [`get`](Store::get)s it is asked for and
/// hands every operation to `inner`, with a few faults to switch on and
/// off: reads that each take a delay first ([`slow`](Self::slow)), read
/// replies that arrive late ([`reply_late`](Self::reply_late)), reads
/// that fail ([`fail_gets`](Self::fail_gets)), lease attempts whose reply
/// is lost after they ran ([`lose_lease_replies`](Self::lose_lease_replies)),
/// invalidations that fail ([`fail_invalidations`](Self::fail_invalidations))
/// and writes whose reply never comes
/// ([`hang_write_replies`](Self::hang_write_replies)).
///
/// A [`get_many`](Store::get_many) is the trait's default here, one `get`
/// after another, each counted. Clones share the count and the switches.
///
/// # Examples
///
/// Concurrent calls for one key read the store as one: a hundred callers,
/// two reads of the key (the miss, and the look once more that the
/// lease's holder takes before it loads), and one of the namespace's clear
/// record (once per process; see [`Cache::clear`](crate::Cache::clear)).
///
/// ```
/// use std::sync::Arc;
/// use breakwater_cache::{Cache, MemoryStore};
/// use breakwater_cache::testing::CountingStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = CountingStore::new(MemoryStore::new());
/// let cache = Cache::<u64>::builder()
///     .namespace("stock")
///     .shared_store(Arc::new(store.clone()))
///     .build()?;
/// let callers: Vec<_> = (0..100)
///     .map(|_| {
///         let cache = cache.clone();
///         tokio::spawn(async move {
///             cache.get_or_load("sku:1", || async { Ok::<_, std::io::Error>(Some(12)) }).await
///         })
///     })
///     .collect();
/// for caller in callers {
///     assert_eq!(caller.await??, Some(12));
/// }
/// assert_eq!(store.gets(), 3);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CountingStore<S> {
    inner: S,
    gets: Arc<AtomicUsize>,
    tag_state_reads: Arc<AtomicUsize>,
    get_delay: Duration,
    late_replies: Arc<Mutex<Duration>>,
    lose_lease_replies: Arc<AtomicBool>,
    failing_invalidations: Arc<AtomicUsize>,
    failing_gets: Arc<AtomicBool>,
    hang_write_replies: Arc<AtomicBool>,
    batches_reads: bool,
}

impl<S: Store> CountingStore<S> {
    /// Counts `inner`'s `get`s.
    pub fn new(inner: S) -> Self {
        Self::slow(inner, Duration::ZERO)
    }

    /// Counts `inner`'s `get`s, and makes each take `get_delay` before it
    /// reads (the [`read_deadline`](Store::read_deadline) grows by as
    /// much).
    pub fn slow(inner: S, get_delay: Duration) -> Self {
        CountingStore {
            inner,
            gets: Arc::default(),
            tag_state_reads: Arc::default(),
            get_delay,
            late_replies: Arc::default(),
            lose_lease_replies: Arc::default(),
            failing_invalidations: Arc::default(),
            failing_gets: Arc::default(),
            hang_write_replies: Arc::default(),
            batches_reads: false,
        }
    }

    /// The same, asking caches to queue reads that meet into one
    /// `get_many` ([`Store::batches_reads`]); set before a cache is built.
    pub fn batching_reads(mut self) -> Self {
        self.batches_reads = true;
        self
    }

    /// While `failing`, each `get` fails at once (the store is down); it is
    /// still counted.
    pub fn fail_gets(&self, failing: bool) {
        self.failing_gets.store(failing, Ordering::SeqCst);
    }

    /// The next `n` invalidations fail (without running).
    pub fn fail_invalidations(&self, n: usize) {
        self.failing_invalidations.store(n, Ordering::SeqCst);
    }

    /// From now on each `get` reads at once and replies `delay` later (the
    /// [`read_deadline`](Store::read_deadline) grows by as much);
    /// [`Duration::ZERO`] for replies on time again.
    pub fn reply_late(&self, delay: Duration) {
        *self.late_replies.lock().unwrap_or_else(|p| p.into_inner()) = delay;
    }

    /// From now on (while `lost`) each lease attempt runs, then fails as if
    /// its reply timed out.
    pub fn lose_lease_replies(&self, lost: bool) {
        self.lose_lease_replies.store(lost, Ordering::SeqCst);
    }

    /// While `hang`, each `invalidate` and `replace` (one or a batch) runs,
    /// and its reply never comes (the caller's future waits until it is
    /// dropped).
    pub fn hang_write_replies(&self, hang: bool) {
        self.hang_write_replies.store(hang, Ordering::SeqCst);
    }

    /// Runs `write`, then, while write replies hang, never answers.
    fn maybe_hang<'a, T: Send + 'a>(&'a self, write: StoreFuture<'a, T>) -> StoreFuture<'a, T> {
        let hang = self.hang_write_replies.load(Ordering::SeqCst);
        Box::pin(async move {
            let done = write.await;
            if hang {
                std::future::pending::<()>().await;
            }
            done
        })
    }

    /// The wrapped store.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The `get`s so far (by this store and its clones; a
    /// [`keep_warm`](Store::keep_warm) is not one).
    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    /// The [`tag_states`](Store::tag_states) calls so far (by this store
    /// and its clones).
    pub fn tag_state_reads(&self) -> usize {
        self.tag_state_reads.load(Ordering::SeqCst)
    }

    fn late(&self) -> Duration {
        *self.late_replies.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<S: Store> Store for CountingStore<S> {
    fn keep_warm<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.inner.keep_warm(key)
    }

    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let late = self.late();
        let failing = self.failing_gets.load(Ordering::SeqCst);
        Box::pin(async move {
            if failing {
                return Err(Error::store_msg("connection refused"));
            }
            if !self.get_delay.is_zero() {
                tokio::time::sleep(self.get_delay).await;
            }
            let value = self.inner.get(key).await;
            if !late.is_zero() {
                tokio::time::sleep(late).await;
            }
            value
        })
    }
    fn set<'a>(&'a self, k: &'a [u8], v: &'a [u8], t: Duration) -> StoreFuture<'a, ()> {
        self.inner.set(k, v, t)
    }
    fn delete<'a>(&'a self, k: &'a [u8]) -> StoreFuture<'a, bool> {
        self.inner.delete(k)
    }
    fn ttl<'a>(&'a self, k: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        self.inner.ttl(k)
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn name(&self) -> &'static str {
        "counting"
    }
    /// As [`batching_reads`](CountingStore::batching_reads) says (`false`
    /// unless it was called).
    fn batches_reads(&self) -> bool {
        self.batches_reads
    }
    /// A read takes `get_delay` (and a late reply's delay) more than the
    /// wrapped store's: so does its deadline.
    fn read_deadline(&self) -> Duration {
        self.inner.read_deadline() + self.get_delay + self.late()
    }
    /// The wrapped store's, and a late reply's delay.
    fn write_deadline(&self) -> Duration {
        self.inner.write_deadline() + self.late()
    }
    fn acquire_lease<'a>(
        &'a self,
        l: &'a [u8],
        t: &'a [u8],
        d: Duration,
    ) -> StoreFuture<'a, LeaseAttempt> {
        let lost = self.lose_lease_replies.load(Ordering::SeqCst);
        Box::pin(async move {
            let attempt = self.inner.acquire_lease(l, t, d).await;
            if lost {
                return Err(Error::store_msg("redis did not answer in time"));
            }
            attempt
        })
    }
    fn lease_held<'a>(&'a self, l: &'a [u8]) -> StoreFuture<'a, bool> {
        self.inner.lease_held(l)
    }
    fn extend_lease<'a>(&'a self, l: &'a [u8], t: &'a [u8], d: Duration) -> StoreFuture<'a, bool> {
        self.inner.extend_lease(l, t, d)
    }
    fn release_lease<'a>(
        &'a self,
        l: &'a [u8],
        t: &'a [u8],
        n: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.inner.release_lease(l, t, n)
    }
    fn fenced_set<'a>(&'a self, w: FencedWrite<'a>) -> StoreFuture<'a, bool> {
        self.inner.fenced_set(w)
    }
    /// The wrapped store's.
    fn expire_entry<'a>(
        &'a self,
        k: &'a [u8],
        l: &'a [u8],
        at: u64,
        n: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.inner.expire_entry(k, l, at, n)
    }
    /// The wrapped store's.
    fn fenced_renew<'a>(&'a self, r: FencedRenewal<'a>) -> StoreFuture<'a, Renewal> {
        self.inner.fenced_renew(r)
    }
    /// The wrapped store's.
    fn pin<'a>(&'a self, k: &'a [u8], p: &'a [u8], ttl: Duration) -> StoreFuture<'a, Vec<u8>> {
        self.inner.pin(k, p, ttl)
    }
    fn replace<'a>(
        &'a self,
        k: &'a [u8],
        v: &'a [u8],
        t: Duration,
        l: &'a [u8],
        n: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.maybe_hang(self.inner.replace(k, v, t, l, n))
    }
    fn replace_many<'a>(&'a self, w: &'a [Replace<'a>], n: Notice<'a>) -> StoreFuture<'a, ()> {
        self.maybe_hang(self.inner.replace_many(w, n))
    }
    fn invalidate_many<'a>(
        &'a self,
        k: &'a [Invalidate<'a>],
        n: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.maybe_hang(self.inner.invalidate_many(k, n))
    }
    fn invalidate<'a>(&'a self, k: &'a [u8], l: &'a [u8], n: Notice<'a>) -> StoreFuture<'a, ()> {
        let failing = self
            .failing_invalidations
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Box::pin(async { Err(Error::store_msg("connection reset")) });
        }
        self.maybe_hang(self.inner.invalidate(k, l, n))
    }
    fn bump_generation<'a>(
        &'a self,
        k: &'a [u8],
        fresh: u64,
        ttl: Duration,
        n: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        self.inner.bump_generation(k, fresh, ttl, n)
    }
    fn bump_generations<'a>(
        &'a self,
        k: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        n: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.inner.bump_generations(k, fresh, ttl, n)
    }
    fn expire_generation<'a>(
        &'a self,
        k: &'a [u8],
        fresh: u64,
        ttl: Duration,
        at_ms: u64,
        n: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        self.inner.expire_generation(k, fresh, ttl, at_ms, n)
    }
    fn tag_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u64>> {
        self.inner.tag_generations(keys, fresh, ttl)
    }
    fn tag_states<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        now_ms: u64,
    ) -> StoreFuture<'a, Vec<Vec<u8>>> {
        self.tag_state_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.tag_states(keys, fresh, ttl, now_ms)
    }
    fn clear_namespace<'a>(&'a self, c: NamespaceClear<'a>) -> StoreFuture<'a, ClearedNamespace> {
        self.inner.clear_namespace(c)
    }
    fn publish<'a>(&'a self, c: &'a [u8], m: &'a [u8]) -> StoreFuture<'a, ()> {
        self.inner.publish(c, m)
    }
    /// The wrapped store's.
    fn failure_domains(&self) -> usize {
        self.inner.failure_domains()
    }
    /// The wrapped store's.
    fn failure_domain(&self, k: &[u8]) -> usize {
        self.inner.failure_domain(k)
    }
    fn subscribe(&self, c: &[u8]) -> Subscription {
        self.inner.subscribe(c)
    }
}
