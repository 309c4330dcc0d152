//! The store behind its own circuit breaker, so a hung or failing Redis
//! costs each request at most one deadline instead of one per call.
//!
//! Every store call a cache makes goes through [`GuardedStore`]. After
//! consecutive store failures (errors or timeouts) the breaker opens: for a
//! jittered cool-down every call fails at once, without touching the store,
//! so a hung Redis costs each request at most one deadline before the cache
//! stops waiting on it. While open, reads miss (the L1 near cache and direct
//! loads serve), writes are dropped (never queued), and leases fail, so each
//! process loads a key at most once at a time through its single-flight,
//! under the origin's bulkhead. Half-open probes find out when the store is
//! back; the breaker then closes on its own.
//!
//! There is one breaker per failure domain of the store
//! ([`Store::failure_domains`]): one for a single Redis, one per 256 hash
//! slots on a Redis Cluster, so a dead node opens the breakers of its own
//! keys and the other nodes' keys keep their store.
//!
//! A caller that holds a stand-in (an L1 copy) waits for a read only up to
//! the store's soft deadline ([`Store::soft_deadline`]) and then gives up
//! on it ([`GuardedStore::overdue`]); its dropped call counted as nothing,
//! so the give-up counts as the failure instead, once per soft deadline per
//! failure domain (callers that give up together are one event). A stalled
//! store so opens its breaker within a few soft deadlines, while a slow but
//! answering one, whose soft deadline follows its answers, is not given up
//! on.
//!
//! Errors that belong to one key ([`Error::is_key_fault`]: a value of
//! another Redis type under it, a script or argument error about it, a
//! value too large for the server) are not store failures: the store
//! answered. They never count toward a breaker (nor close one); each is
//! reported for its key, in `breakwater_key_errors_total` and a
//! rate-limited warning naming the key, and the key's next fenced write
//! replaces what is there.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::breaker::{BreakerConfig, BreakerLabel, BreakerState, CircuitBreaker};
use crate::error::{Error, ErrorKind};
use crate::log_limit::{LogLimiter, Warning, warn_limited};
use crate::metrics::Metrics;
use crate::store::{
    ClearedNamespace, FencedRenewal, FencedWrite, Finding, Invalidate, LeaseAttempt, LeaseRequest,
    NamespaceClear, Notice, RedisStore, Renewal, Replace, Store, StoreFuture, Subscription,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// Items of one failure domain, with their positions in the whole batch.
type Group<I> = (Vec<usize>, Vec<I>);

/// The most breakers one store gets, however many failure domains it
/// reports.
const MAX_BREAKERS: usize = 1024;

/// A store behind circuit breakers, one per failure domain of the store (a
/// Redis Cluster's nodes fail separately); see the module docs.
pub(crate) struct GuardedStore {
    store: Arc<dyn Store>,
    /// `store`, when it is a [`RedisStore`]: its reads are called without
    /// a box on the hit path. Found by a downcast, not a [`Store`] method:
    /// through `dyn Store` a read can only come back as a boxed future,
    /// the allocation this saves.
    redis: Option<RedisStore>,
    breakers: Vec<CircuitBreaker>,
    /// Each breaker's last store failure: a refusal carries it as its
    /// source, so a caller refused by an open breaker still learns why the
    /// store failed (a refused password or `NOPERM`, not just "failed
    /// repeatedly").
    causes: Vec<Mutex<Option<Error>>>,
    /// When each breaker last counted a call given up on at its soft
    /// deadline ([`overdue`](Self::overdue)), in microseconds since
    /// `origin` (0: never).
    overdue_at: Vec<AtomicU64>,
    origin: Instant,
    /// Where a key fault is reported.
    metrics: Metrics,
    logs: Arc<LogLimiter>,
}

impl fmt::Debug for GuardedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedStore")
            .field("store", &self.store)
            .field("breakers", &self.breakers.len())
            .field("state", &self.state())
            .finish()
    }
}

impl GuardedStore {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        namespace: &str,
        config: BreakerConfig,
        seed: Option<u64>,
        metrics: Metrics,
        logs: Arc<LogLimiter>,
    ) -> Self {
        let domains = store.failure_domains().clamp(1, MAX_BREAKERS);
        let breakers = (0..domains)
            .map(|i| {
                CircuitBreaker::new(config, seed.map(|s| s.wrapping_add(i as u64)))
                    .labelled(BreakerLabel::store(namespace, i))
            })
            .collect();
        let redis = (&*store as &dyn Any).downcast_ref::<RedisStore>().cloned();
        GuardedStore {
            redis,
            breakers,
            causes: (0..domains).map(|_| Mutex::new(None)).collect(),
            overdue_at: (0..domains).map(|_| AtomicU64::new(0)).collect(),
            origin: Instant::now(),
            metrics,
            logs,
            store,
        }
    }

    /// A caller that holds a stand-in gave up on a store call about `key`
    /// at its soft deadline ([`Store::soft_deadline`]): the store did not
    /// answer within 3 × its recent round trips. Counts as a failure of
    /// the key's breaker (its permit was dropped, which counts as
    /// nothing), at most once per soft deadline in each failure domain:
    /// callers that give up together are one event, and a stall opens the
    /// breaker after the threshold's worth of soft deadlines (5 × 50 ms
    /// with the defaults).
    pub(crate) fn overdue(&self, key: &[u8]) {
        let domain = self.store.failure_domain(key) % self.breakers.len();
        let window = micros(self.store.soft_deadline(key));
        let now = micros(Instant::now().saturating_duration_since(self.origin)).max(1);
        let last = &self.overdue_at[domain];
        let before = last.load(Ordering::Relaxed);
        if before != 0 && now.saturating_sub(before) < window {
            return;
        }
        if last
            .compare_exchange(before, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.breakers[domain]
                .failure_seen("store calls went unanswered past their soft deadline");
        }
    }

    /// The worst state of the breakers: open if any is open, else half-open
    /// if any is, else closed.
    pub(crate) fn state(&self) -> BreakerState {
        let states = || self.breakers.iter().map(CircuitBreaker::state);
        if states().any(|s| s == BreakerState::Open) {
            BreakerState::Open
        } else if states().any(|s| s == BreakerState::HalfOpen) {
            BreakerState::HalfOpen
        } else {
            BreakerState::Closed
        }
    }

    /// Runs one store call (`op`) about `key` through the breaker of the
    /// key's failure domain: refused at once while open; store failures
    /// count against it, successes close it; a key fault is reported for
    /// the key and leaves the breaker as it was.
    fn guard<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        key: &'a [u8],
        call: impl FnOnce() -> StoreFuture<'a, T> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        Box::pin(self.guarded(op, key, call))
    }

    /// A read of `key` through its breaker, as [`Store::get`] is, without
    /// boxing this layer's future: the hit path's one store call.
    /// A `RedisStore`'s read is not boxed either.
    pub(crate) async fn get_inline(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        match &self.redis {
            Some(redis) => self.guarded("get", key, || redis.get_unboxed(key)).await,
            None => self.guarded("get", key, || self.store.get(key)).await,
        }
    }

    /// `keys` read at once, each with its own result: on a store of one
    /// failure domain one guarded [`Store::get_many`] (one `MGET`, unboxed
    /// on a `RedisStore`), else one per domain, side by side
    /// ([`get_many_split`](Self::get_many_split)): one round trip either
    /// way. A tagged read fetches its entry and its tags' counters so.
    pub(crate) async fn get_beside(&self, keys: &[&[u8]]) -> Vec<Result<Option<Vec<u8>>, Error>> {
        match &self.redis {
            Some(redis) if redis.batches_reads() => {
                let read = self
                    .guarded("get_many", keys[0], || redis.get_many_unboxed(keys))
                    .await;
                each_reply(read, keys.len())
            }
            _ => self.get_many_split(keys).await,
        }
    }

    /// `items` grouped by the failure domain of their key, in order of first
    /// appearance, each with its positions in `items`.
    fn by_domain<I: Copy>(&self, items: &[I], key: impl Fn(&I) -> &[u8]) -> Vec<Group<I>> {
        let mut groups: Vec<(usize, Group<I>)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let domain = self.store.failure_domain(key(item)) % self.breakers.len();
            let group = match groups.iter().position(|(d, _)| *d == domain) {
                Some(at) => &mut groups[at].1,
                None => {
                    groups.push((domain, (Vec::new(), Vec::new())));
                    &mut groups.last_mut().expect("just pushed").1
                }
            };
            group.0.push(i);
            group.1.push(*item);
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// One batch call (`op`, `call`) per failure domain of `items`, each
    /// through its domain's breaker, side by side: each item gets its own
    /// result, or its domain's error (refused or failed).
    async fn per_domain<I, T, C>(
        &self,
        op: &'static str,
        items: &[I],
        key: impl Fn(&I) -> &[u8],
        call: C,
    ) -> Vec<Result<T, Error>>
    where
        I: Copy + Send + Sync,
        T: Send,
        C: for<'b> Fn(&'b [I]) -> StoreFuture<'b, Vec<T>> + Sync,
    {
        let groups = self.by_domain(items, &key);
        let (key, call) = (&key, &call);
        let done = futures_util::future::join_all(groups.iter().map(|(_, batch)| async move {
            self.guarded(op, key(&batch[0]), move || call(batch)).await
        }))
        .await;
        let mut results: Vec<Option<Result<T, Error>>> = (0..items.len()).map(|_| None).collect();
        for ((positions, _), done) in groups.iter().zip(done) {
            for (&i, result) in positions.iter().zip(each_reply(done, positions.len())) {
                results[i] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("by_domain puts every item in one group"))
            .collect()
    }

    /// A batch write (`op`, `call`) split per failure domain of `items`,
    /// each part through its domain's breaker, side by side (each breaker
    /// sees its own keys, and a cluster's batch is not written one key at
    /// a time); `Err` if any part failed. Its notices are counted, one per
    /// item, once every part went through.
    async fn write_per_domain<I, C>(
        &self,
        op: &'static str,
        items: &[I],
        key: impl Fn(&I) -> &[u8],
        call: C,
    ) -> Result<(), Error>
    where
        I: Copy + Send + Sync,
        C: for<'b> Fn(&'b [I]) -> StoreFuture<'b, ()> + Sync,
    {
        let groups = self.by_domain(items, &key);
        let (key, call) = (&key, &call);
        let done = futures_util::future::join_all(
            groups
                .iter()
                .map(|(_, batch)| self.guarded(op, key(&batch[0]), move || call(batch))),
        )
        .await;
        let done: Result<(), Error> = done.into_iter().collect();
        if done.is_ok() {
            self.metrics.notices("sent", items.len() as u64);
        }
        done
    }

    /// [`Store::get_many`], one guarded batch per failure domain, side by
    /// side: a key whose domain is refused or fails gets that error, the
    /// others their values.
    pub(crate) async fn get_many_split(
        &self,
        keys: &[&[u8]],
    ) -> Vec<Result<Option<Vec<u8>>, Error>> {
        self.per_domain(
            "get_many",
            keys,
            |key| key,
            |batch| self.store.get_many(batch),
        )
        .await
    }

    /// [`Store::acquire_leases`], as [`get_many_split`](Self::get_many_split).
    pub(crate) async fn acquire_leases_split(
        &self,
        leases: &[LeaseRequest<'_>],
        ttl: Duration,
    ) -> Vec<Result<LeaseAttempt, Error>> {
        self.per_domain(
            "acquire_leases",
            leases,
            |lease| lease.key,
            |batch| self.store.acquire_leases(batch, ttl),
        )
        .await
    }

    /// [`guard`](Self::guard) for a write that publishes change notices:
    /// `sent` says how many its result stands for (in the same box).
    fn guard_notifying<'a, T: Send + 'a, F: Future<Output = Result<T, Error>> + Send + 'a>(
        &'a self,
        op: &'static str,
        key: &'a [u8],
        call: impl FnOnce() -> F + Send + 'a,
        sent: fn(&T) -> u64,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let written = self.guarded(op, key, call).await;
            if let Ok(done) = &written {
                self.metrics.notices("sent", sent(done));
            }
            written
        })
    }

    /// [`guard`](Self::guard)'s work, unboxed.
    async fn guarded<'a, T: Send + 'a, F: Future<Output = Result<T, Error>> + Send + 'a>(
        &'a self,
        op: &'static str,
        key: &'a [u8],
        call: impl FnOnce() -> F + Send + 'a,
    ) -> Result<T, Error> {
        let domain = self.store.failure_domain(key) % self.breakers.len();
        let (breaker, cause) = (&self.breakers[domain], &self.causes[domain]);
        let permit = breaker.try_acquire().map_err(|rejected| {
            let refused = Error::new(
                ErrorKind::Store,
                rejected.describe("the store", "store calls", "store call"),
            )
            .with_retry_after(rejected.retry_in)
            .unreachable();
            match cause.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                Some(cause) => refused.with_source(cause),
                None => refused,
            }
        })?;
        let started = std::time::Instant::now();
        let result = call().await;
        self.metrics.store_call(op, started.elapsed());
        match result {
            Ok(value) => {
                permit.success();
                Ok(value)
            }
            Err(err) if err.is_key_fault() => {
                // The store answered: neither a failure nor a success
                // of the store (a half-open probe's permit is given
                // back unused).
                drop(permit);
                self.metrics.key_error(op);
                warn_limited!(
                    self.logs,
                    Warning::KeyFault,
                    key = %crate::log_limit::show_key(key),
                    op,
                    error = %err,
                    "the store refused this key (not a store failure); its next write replaces it"
                );
                Err(err)
            }
            Err(err) if err.is_store() => {
                permit.failure();
                *cause.lock().unwrap_or_else(|p| p.into_inner()) = Some(err.clone());
                Err(err)
            }
            Err(err) => Err(err),
        }
    }
}

impl Store for GuardedStore {
    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.guard("get", key, move || self.store.get(key))
    }

    fn set<'a>(&'a self, key: &'a [u8], value: &'a [u8], ttl: Duration) -> StoreFuture<'a, ()> {
        self.guard("set", key, move || self.store.set(key, value, ttl))
    }

    fn delete<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, bool> {
        self.guard("delete", key, move || self.store.delete(key))
    }

    fn pin<'a>(
        &'a self,
        key: &'a [u8],
        placeholder: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u8>> {
        self.guard("pin", key, move || self.store.pin(key, placeholder, ttl))
    }

    fn ttl<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        self.guard("ttl", key, move || self.store.ttl(key))
    }

    fn now_ms(&self) -> u64 {
        self.store.now_ms()
    }

    fn name(&self) -> &'static str {
        self.store.name()
    }

    fn read_deadline(&self) -> Duration {
        self.store.read_deadline()
    }

    fn soft_deadline(&self, key: &[u8]) -> Duration {
        self.store.soft_deadline(key)
    }

    fn write_deadline(&self) -> Duration {
        self.store.write_deadline()
    }

    fn acquire_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, LeaseAttempt> {
        self.guard("acquire_lease", lease_key, move || {
            self.store.acquire_lease(lease_key, token, ttl)
        })
    }

    fn lease_held<'a>(&'a self, lease_key: &'a [u8]) -> StoreFuture<'a, bool> {
        self.guard("lease_held", lease_key, move || {
            self.store.lease_held(lease_key)
        })
    }

    fn extend_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        self.guard("extend_lease", lease_key, move || {
            self.store.extend_lease(lease_key, token, ttl)
        })
    }

    fn release_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.guard("release_lease", lease_key, move || {
            self.store.release_lease(lease_key, token, notice)
        })
    }

    fn fenced_set<'a>(&'a self, write: FencedWrite<'a>) -> StoreFuture<'a, bool> {
        self.guard_notifying(
            "fenced_set",
            write.key,
            move || self.store.fenced_set(write),
            |written| u64::from(*written),
        )
    }

    fn expire_entry<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.guard_notifying(
            "expire_entry",
            key,
            move || self.store.expire_entry(key, lease_key, at_ms, notice),
            |_| 1,
        )
    }

    fn fenced_renew<'a>(&'a self, renewal: FencedRenewal<'a>) -> StoreFuture<'a, Renewal> {
        self.guard_notifying(
            "fenced_renew",
            renewal.key,
            move || self.store.fenced_renew(renewal),
            |renewed| u64::from(*renewed == Renewal::Renewed),
        )
    }

    fn replace<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
        ttl: Duration,
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.guard_notifying(
            "replace",
            key,
            move || self.store.replace(key, value, ttl, lease_key, notice),
            |()| 1,
        )
    }

    /// One guarded batch per failure domain (one, on a single server).
    fn replace_many<'a>(
        &'a self,
        writes: &'a [Replace<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.write_per_domain(
            "replace_many",
            writes,
            |w| w.key,
            move |group| self.store.replace_many(group, notice),
        ))
    }

    /// One guarded batch per failure domain (one, on a single server).
    fn invalidate_many<'a>(
        &'a self,
        keys: &'a [Invalidate<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.write_per_domain(
            "invalidate_many",
            keys,
            |k| k.key,
            move |group| self.store.invalidate_many(group, notice),
        ))
    }

    fn invalidate<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.guard_notifying(
            "invalidate",
            key,
            move || self.store.invalidate(key, lease_key, notice),
            |()| 1,
        )
    }

    fn bump_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        self.guard_notifying(
            "bump_generation",
            key,
            move || self.store.bump_generation(key, fresh, ttl, notice),
            |_| 1,
        )
    }

    /// One guarded batch per failure domain (one, on a single server).
    fn bump_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(self.write_per_domain(
            "bump_generations",
            keys,
            |k| k,
            move |group| self.store.bump_generations(group, fresh, ttl, notice),
        ))
    }

    fn clear_namespace<'a>(
        &'a self,
        clear: NamespaceClear<'a>,
    ) -> StoreFuture<'a, ClearedNamespace> {
        self.guard_notifying(
            "clear_namespace",
            clear.key,
            move || self.store.clear_namespace(clear),
            |_| 1,
        )
    }

    fn expire_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        self.guard_notifying(
            "expire_generation",
            key,
            move || self.store.expire_generation(key, fresh, ttl, at_ms, notice),
            |_| 1,
        )
    }

    /// One guarded call per failure domain, as [`get_many`](Store::get_many).
    fn tag_states<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        now_ms: u64,
    ) -> StoreFuture<'a, Vec<Vec<u8>>> {
        Box::pin(async move {
            self.per_domain(
                "tag_states",
                keys,
                |key| key,
                |batch| self.store.tag_states(batch, fresh, ttl, now_ms),
            )
            .await
            .into_iter()
            .collect()
        })
    }

    /// One guarded call per failure domain, as [`get_many`](Store::get_many).
    fn tag_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u64>> {
        Box::pin(async move {
            self.per_domain(
                "tag_generations",
                keys,
                |key| key,
                |batch| self.store.tag_generations(batch, fresh, ttl),
            )
            .await
            .into_iter()
            .collect()
        })
    }

    /// Straight to the store: bookkeeping, not traffic (no breaker, no
    /// metrics).
    fn keep_warm<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.store.keep_warm(key)
    }

    /// Straight to the store: a check is not traffic (no breaker, no
    /// metrics).
    fn check<'a>(&'a self, probe: &'a [u8], channel: &'a [u8]) -> StoreFuture<'a, Vec<Finding>> {
        self.store.check(probe, channel)
    }

    fn publish<'a>(&'a self, channel: &'a [u8], message: &'a [u8]) -> StoreFuture<'a, ()> {
        self.guard_notifying(
            "publish",
            channel,
            move || self.store.publish(channel, message),
            |()| 1,
        )
    }

    fn get_many<'a>(&'a self, keys: &'a [&'a [u8]]) -> StoreFuture<'a, Vec<Option<Vec<u8>>>> {
        Box::pin(async move { self.get_many_split(keys).await.into_iter().collect() })
    }

    fn acquire_leases<'a>(
        &'a self,
        leases: &'a [LeaseRequest<'a>],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<LeaseAttempt>> {
        Box::pin(async move {
            self.acquire_leases_split(leases, ttl)
                .await
                .into_iter()
                .collect()
        })
    }

    fn failure_domains(&self) -> usize {
        self.store.failure_domains()
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.store.failure_domain(key)
    }

    fn subscribe(&self, channel: &[u8]) -> Subscription {
        // The subscription reconnects on its own; it is not guarded.
        self.store.subscribe(channel)
    }
}

/// A batch call's result for each of its `n` items, in order: its value,
/// or the call's error. A reply of the wrong length cannot be matched to
/// the items: none of them gets a value from it.
fn each_reply<T>(done: Result<Vec<T>, Error>, n: usize) -> Vec<Result<T, Error>> {
    let err = match done {
        Ok(values) if values.len() == n => return values.into_iter().map(Ok).collect(),
        Ok(_) => Error::new(
            ErrorKind::Store,
            "the store answered a batch with the wrong number of replies",
        ),
        Err(err) => err,
    };
    (0..n).map(|_| Err(err.clone())).collect()
}

/// `d` in whole microseconds (saturating).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
