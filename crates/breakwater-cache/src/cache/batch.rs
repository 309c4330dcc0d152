//! `get_many`: many keys, one store read, one batch load for what is
//! missing, one load per key across the fleet.
//!
//! # Order
//!
//! 1. **Keys**: each validated and namespaced; a key asked twice is fetched
//!    once. L1 answers what it holds fresh.
//! 2. **Read**: one [`Store::get_many`] for the rest
//!    (one `MGET`; on a Cluster one per hash slot, side by side). Each entry
//!    is judged as `get_or_load` judges it: fresh is served; stale within
//!    grace is served while a background refresh runs; past grace it is
//!    kept as the fail-safe stand-in.
//! 3. **One flight per key in this process**: a key another caller (a
//!    `get_or_load` or another `get_many`) is already loading is joined;
//!    the others are registered as this call's flights, so callers that
//!    come later join them.
//! 4. **Leases in one step**: one [`Store::acquire_leases`]
//!    for all of them (one script; per hash slot on a Cluster). The keys
//!    taken are read once more (another process may have filled them just
//!    before), then loaded by **one batch loader call** per
//!    [`MAX_BATCH`] keys, under one bulkhead slot and one `load_timeout`
//!    per call, the leases extended while it runs, and written each
//!    through its own fence. The loader may return fewer keys than asked:
//!    a key it leaves out is cached as "not found" (a negative entry).
//! 5. **Keys another process holds** are awaited together, as a single
//!    key's are (woken by the holder's fill, a takeover when its lease
//!    expires, `lock_wait` and [`OnLockTimeout`](super::OnLockTimeout)),
//!    and **taken over as a batch**: every waiting key of the call whose
//!    lease is gone (a holder that died stops extending its leases, which
//!    were taken together and so run out together) is tried in one lease
//!    step, gathering the ones that run out within 50 ms, and loaded as in
//!    4 (one loader call and one bulkhead slot per [`MAX_BATCH`]), so a
//!    dead holder costs each waiting call the lease TTL plus one load,
//!    not one load per key.
//! 6. **The store fails** (the read or the lease step): those keys are
//!    loaded directly in one batch, served and kept in L1, not written, as
//!    for `get_or_load`.
//!
//! Each key's outcome is settled as `get_or_load` settles it (fail-safe
//! stale value, fallback, error), and the whole call ends by a deadline:
//! `lock_wait` plus one load (`queue_wait + load_timeout`) plus one second
//! for store calls; a key not done by then is a
//! [`Timeout`](crate::ErrorKind::Timeout) (its load goes on for the others).
//! A key whose load turns out revoked before the call started (its fenced
//! write refused: see `Loaded`) goes through a second pass with the other
//! such keys, as one batch, under a deadline of its own.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::{FutureExt, join_all};
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until};
use tracing::field::Empty;
use tracing::{Instrument, Span};

use super::coherence::Loaded;
use super::fill::{Mode, SUBSCRIBE_WITHIN};
use super::handle::Cache;
use super::lease::LockTimeoutKind;
use super::lease::{LEASE_RETRY_MARGIN, Lease, deadline_after, lock_timeout};
use super::notify::{self, FILLED};
use super::options::Options;
use super::pipeline::{MAX_PASSES, cooperate, revoked_before};
use super::read::Near;
use super::tags::counter_ttl;
use super::transition::{self, Pinned};
use super::value::{Load, Value};
use super::verdict::{Judged, Refresh};
use crate::entry::Entry;
use crate::error::{Error, ErrorKind};
use crate::flight::{Joined, Lander, Role};
use crate::jitter::poll_delay;
use crate::key::CacheKey;
use crate::l1::{Slot, Ticket};
use crate::limit::Priority;
use crate::log_limit::show_key;
use crate::log_limit::{Warning, warn_limited};
use crate::served::{Fetched, Served, StaleReason};
use crate::store::{LeaseAttempt, LeaseRequest, Store};

/// The most keys one batch loader call is asked for; larger batches are
/// split into calls of this size.
pub(crate) const MAX_BATCH: usize = 500;

/// How many of a batch's waiting keys poll the store per `lock_poll`.
const WAITER_POLLS: usize = 100;

/// How long a takeover waits for the other leases of the same dead holder
/// to run out (they were taken, and extended, together, so they expire
/// within a few milliseconds of each other), so they are loaded in one
/// batch; at most a tenth of the lease TTL.
const TAKEOVER_GATHER: Duration = Duration::from_millis(50);

/// Time allowed for the store calls of a `get_many` beyond its waits and
/// its load.
const STORE_SLACK: Duration = Duration::from_secs(1);

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a batch load returns: each found value by its user key's bytes.
type Found<V> = Vec<(Vec<u8>, V)>;

/// The future of one batch loader call.
type BatchFuture<V> = Pin<Box<dyn Future<Output = Result<Option<Found<V>>, BoxError>> + Send>>;

/// A batch loader as the internals take it: called with the keys to load.
trait BatchLoad<K, V>: Send + Sync + 'static {
    fn call(&self, keys: Vec<K>) -> BatchFuture<V>;
}

/// The user's batch loader.
struct UserBatch<F, K>(F, PhantomData<fn(K)>);

impl<K, V, F, Fut, R, E> BatchLoad<K, V> for UserBatch<F, K>
where
    K: CacheKey + Send + 'static,
    V: Send + 'static,
    F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
    R: IntoIterator<Item = (K, V)>,
    E: Into<BoxError> + 'static,
{
    fn call(&self, keys: Vec<K>) -> BatchFuture<V> {
        let load = (self.0)(keys);
        Box::pin(async move {
            let found = load.await.map_err(Into::into)?;
            Ok(Some(
                found
                    .into_iter()
                    .map(|(key, value)| (key.key_bytes().to_vec(), value))
                    .collect(),
            ))
        })
    }
}

/// One call of the batch loader with its keys, as the origin runs a load
/// (retries call it again with the same keys).
struct Chunk<K, B> {
    keys: Vec<K>,
    batch: Arc<B>,
}

impl<K: Clone, B> Clone for Chunk<K, B> {
    fn clone(&self) -> Self {
        Chunk {
            keys: self.keys.clone(),
            batch: Arc::clone(&self.batch),
        }
    }
}

impl<K, V, B> Load<Found<V>> for Chunk<K, B>
where
    K: Clone + Send + Sync + 'static,
    V: Send + 'static,
    B: BatchLoad<K, V>,
{
    type Fut = BatchFuture<V>;
    type Err = BoxError;

    fn call(&self) -> Self::Fut {
        self.batch.call(self.keys.clone())
    }
}

/// A key whose lease this process took, to load: its place in the call,
/// its flight, its lease, and (inside a version transition) the previous
/// version's entry it is loaded beside.
type Taken<'a, K, V> = (usize, Led<K, V>, LeaseRequest<'a>, Option<Pinned>);

/// A key's flight, awaited: the key, its flight, this call's part in
/// it, and the stale entry that may stand in if it fails.
type Wait<V> = (usize, Joined<Loaded<V>>, Role, Option<Arc<Entry>>);

/// A key of a batch waiting for another process's load.
struct Waiting<K, V> {
    led: Led<K, V>,
    /// When its holder's lease runs out, as last seen (plus a margin): the
    /// moment to try to take it over.
    retry_at: Instant,
    /// A readable entry no longer fresh, for the lock-wait policy.
    stale: Option<Entry>,
}

/// A lease this process took (or tried): its key and the token.
type OwnedLease = (Vec<u8>, [u8; 16]);

/// A load [`Cache::wait_many`] hands to [`Cache::run_jobs`].
enum Job<K, V> {
    /// Keys taken over (their leases with the tokens taken, asked for at
    /// `asked`): loaded as one batch.
    Lead {
        taken: Vec<(Led<K, V>, OwnedLease)>,
        asked: Instant,
    },
    /// Keys whose lease attempt failed (the store): loaded directly, or
    /// failed in the background; the tokens given back.
    Unleased {
        failed: Vec<(Led<K, V>, OwnedLease, Error)>,
        failure: Error,
    },
    /// Keys still held past `lock_wait`, for
    /// [`OnLockTimeout::load_anyway`](super::OnLockTimeout): loaded, not written.
    Unwritten(Vec<Led<K, V>>),
}

/// One key of a `get_many`, deduplicated.
struct Want<K, V> {
    key: K,
    user: Vec<u8>,
    storage: Vec<u8>,
    /// An L1 copy past its fresh time, for a store that fails.
    local_stale: Option<Arc<Slot<V>>>,
    outcome: Option<Result<Fetched<V>, Error>>,
}

impl<K: Clone, V> Want<K, V> {
    /// This key, led by this call: `lander` lands its flight; `replacing`
    /// for a refresh of an entry still stored.
    fn led(&self, lander: Lander<Loaded<V>>, replacing: Option<u64>) -> Led<K, V> {
        Led {
            key: self.key.clone(),
            user: self.user.clone(),
            storage: self.storage.clone(),
            replacing,
            lander,
        }
    }
}

/// A key this call loads (it leads the key's flight).
struct Led<K, V> {
    key: K,
    user: Vec<u8>,
    storage: Vec<u8>,
    /// The `fresh_until` of the entry a refresh replaces (still fresh, so
    /// not a sign that someone else filled the key).
    replacing: Option<u64>,
    lander: Lander<Loaded<V>>,
}

impl<V: Value> Cache<V> {
    /// The values of many keys at once, loading the missing ones with one
    /// call of `loader` (per 500 keys), in the order of `keys`.
    ///
    /// `loader` gets the keys that are missing or expired (and not being
    /// loaded by another caller or process) and returns the values it
    /// found, as `(key, value)` pairs in any order (a `Vec`, a `HashMap`):
    /// a key it leaves out does not exist, and is cached as such for
    /// `negative_ttl`. Across the fleet every key is loaded once: keys
    /// another process is loading are awaited and woken by its write, and
    /// keys this process is already loading are joined.
    ///
    /// # Order
    ///
    /// 1. L1 answers the keys it holds fresh.
    /// 2. One store read for the rest (one `MGET`; on a Redis Cluster one
    ///    per hash slot, side by side), each entry judged as `get_or_load`
    ///    judges it: fresh is served, stale within grace is served while
    ///    one background batch refreshes it.
    /// 3. The keys to load join the flights of this process already in the
    ///    air; the others' leases are taken in one step (one script; per
    ///    hash slot on a Cluster) and read once more.
    /// 4. One loader call per 500 of the keys taken; each value is written
    ///    through its key's lease fence, so an invalidation that lands
    ///    during the load keeps it out, as for `get_or_load`.
    /// 5. Keys another process is loading are awaited, woken by its write;
    ///    if it dies, its keys are taken over when their leases expire, as
    ///    one batch per waiting call (one loader call per 500 keys, one
    ///    fleet-wide per key): a dead holder costs the lease TTL plus one
    ///    load.
    ///
    /// Per key, what `get_or_load` guarantees holds: grace, fail-safe,
    /// L1, the breakers, one load per key fleet-wide, no resurrection.
    /// The call ends by `lock_wait + queue_wait + load_timeout + 1 s`; a
    /// key not done by then fails with [`Timeout`](ErrorKind::Timeout).
    ///
    /// The bulkhead counts one slot per loader call (one database query),
    /// and `load_timeout` bounds each call.
    ///
    /// # Errors
    ///
    /// The first key's error, in the order of `keys`, if any key could not
    /// be served (no stale value or fallback stood in): as
    /// [`get_or_load`](Self::get_or_load). Use
    /// [`get_many_with_meta`](Self::get_many_with_meta) for each key's own
    /// outcome.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::HashMap;
    /// # use breakwater_cache::Cache;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<String>::builder().namespace("users").build()?;
    /// cache.set(2u64, &"cached".to_string()).await?;
    ///
    /// let names = cache
    ///     .get_many([1u64, 2, 3], |ids: Vec<u64>| async move {
    ///         // One query for every missing id: here 1 and 3. Id 3 does
    ///         // not exist, so it is left out.
    ///         assert_eq!(ids, [1, 3]);
    ///         let rows: HashMap<u64, String> = ids
    ///             .into_iter()
    ///             .filter(|id| *id != 3)
    ///             .map(|id| (id, format!("user {id}")))
    ///             .collect();
    ///         Ok::<_, std::io::Error>(rows)
    ///     })
    ///     .await?;
    /// assert_eq!(names, [Some("user 1".to_string()), Some("cached".to_string()), None]);
    /// # Ok(()) }
    /// ```
    pub async fn get_many<K, I, F, Fut, R, E>(
        &self,
        keys: I,
        loader: F,
    ) -> Result<Vec<Option<V>>, Error>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, V)>,
        E: Into<BoxError> + 'static,
    {
        self.get_many_with_meta(keys, loader)
            .await
            .into_iter()
            .map(|fetched| fetched.map(|f| f.value))
            .collect()
    }

    /// [`get_many`](Self::get_many), with each key's own outcome: its value
    /// and how it was served ([`Served`]), or its error.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::{Cache, Served};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// let load = |ids: Vec<u64>| async move {
    ///     Ok::<_, std::io::Error>(ids.into_iter().map(|id| (id, id * 10)).collect::<Vec<_>>())
    /// };
    /// cache.get_many([1u64], load).await?;
    /// let got = cache.get_many_with_meta([1u64, 2], load).await;
    /// assert_eq!(got[0].as_ref().unwrap().served, Served::Hit);
    /// assert_eq!(got[1].as_ref().unwrap().served, Served::Loaded);
    /// assert_eq!(got[1].as_ref().unwrap().value, Some(20));
    /// # Ok(()) }
    /// ```
    pub async fn get_many_with_meta<K, I, F, Fut, R, E>(
        &self,
        keys: I,
        loader: F,
    ) -> Vec<Result<Fetched<V>, Error>>
    where
        I: IntoIterator<Item = K>,
        K: CacheKey + Clone + Send + Sync + 'static,
        F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, E>> + Send + 'static,
        R: IntoIterator<Item = (K, V)>,
        E: Into<BoxError> + 'static,
    {
        let keys: Vec<K> = keys.into_iter().collect();
        let span = if tracing::dispatcher::has_been_set() {
            tracing::info_span!(
                "breakwater.get_many",
                namespace = %self.inner.settings.namespace,
                keys = keys.len(),
                loaded = Empty,
            )
        } else {
            Span::none()
        };
        let batch = Arc::new(UserBatch(loader, PhantomData));
        let options = self.inner.defaults;
        self.fetch_many(keys, batch, &options, Instant::now(), 1)
            .instrument(span)
            .await
    }

    /// The body of [`get_many_with_meta`](Self::get_many_with_meta), for a
    /// call that started at `started`, pass `pass`: a key whose load turns
    /// out revoked before the call started goes through another pass, as
    /// in `Cache::pipeline` (with the same bound).
    async fn fetch_many<K, B>(
        &self,
        keys: Vec<K>,
        batch: Arc<B>,
        options: &Options,
        started: Instant,
        pass: usize,
    ) -> Vec<Result<Fetched<V>, Error>>
    where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        let deadline = deadline_after(
            self.inner
                .lock_wait_for(options)
                .saturating_add(self.inner.origin.queue_wait())
                .saturating_add(options.load_timeout)
                .saturating_add(STORE_SLACK),
        );
        // 1. Keys, deduplicated; L1.
        let mut wants: Vec<Want<K, V>> = Vec::new();
        let mut position: Vec<Result<usize, Error>> = Vec::with_capacity(keys.len());
        let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
        for key in keys {
            let user = key.key_bytes().to_vec();
            if let Some(&i) = seen.get(&user) {
                position.push(Ok(i));
                continue;
            }
            let storage = match self.key_in_store(&user) {
                Ok(storage) => storage,
                Err(err) => {
                    position.push(Err(err));
                    continue;
                }
            };
            seen.insert(user.clone(), wants.len());
            position.push(Ok(wants.len()));
            wants.push(Want {
                key,
                user,
                storage,
                local_stale: None,
                outcome: None,
            });
        }
        let mut refreshes: Vec<(usize, Refresh)> = Vec::new();
        for (i, want) in wants.iter_mut().enumerate() {
            match self.near(&want.user, Some(options)) {
                Ok(Near::Fresh(fetched, replacing)) => {
                    cooperate().await;
                    want.outcome = Some(Ok(fetched));
                    if let Some(replacing) = replacing {
                        refreshes.push((
                            i,
                            Refresh {
                                replacing,
                                early: true,
                            },
                        ));
                    }
                }
                Ok(Near::Stale(slot)) => want.local_stale = Some(slot),
                Ok(Near::Miss) => {}
                Err(err) => want.outcome = Some(Err(err)),
            }
        }

        // 2. One read for the rest.
        let ticket = self.local.ticket();
        let unread: Vec<usize> = (0..wants.len())
            .filter(|&i| wants[i].outcome.is_none())
            .collect();
        let read = {
            let keys: Vec<&[u8]> = unread.iter().map(|&i| &wants[i].storage[..]).collect();
            self.read_many(&keys, true).await
        };
        // Keys to load: (want, store usable, stale stand-in).
        let mut load: Vec<(usize, Mode, Option<Arc<Entry>>)> = Vec::new();
        // The first failed read (its key, error and mode), and how many
        // keys an L1 copy answered and how many load because of it: one
        // log line for the batch, saying what was done.
        let mut store_failed: Option<(usize, Error, Mode)> = None;
        let (mut from_l1, mut loading) = (0usize, 0usize);
        let now = self.inner.store.now_ms();
        for (&i, read) in unread.iter().zip(read) {
            let want = &mut wants[i];
            let entry = match read {
                Ok(entry) => entry,
                Err(err) => {
                    // Directly only if the store cannot be used (see `Mode::after`).
                    let mode = Mode::after(&err);
                    if store_failed.is_none() {
                        self.inner.metrics.store_failed("get", &err);
                        store_failed = Some((i, err, mode));
                    }
                    if let Some(slot) = want.local_stale.take() {
                        from_l1 += 1;
                        want.outcome = Some(Ok(Fetched {
                            value: slot.value.clone(),
                            served: Served::Stale {
                                reason: StaleReason::StoreUnavailable,
                            },
                        }));
                    } else {
                        loading += 1;
                        load.push((i, mode, None));
                    }
                    continue;
                }
            };
            let Some(entry) = entry else {
                load.push((i, Mode::Fleet, None));
                continue;
            };
            match self.judge_entry(&want.storage, &entry, now, options) {
                Judged::Served(fetched, refresh) => {
                    self.remember(&want.storage, &fetched.value, &entry, now, ticket, options);
                    want.outcome = Some(Ok(fetched));
                    if let Some(refresh) = refresh {
                        refreshes.push((i, refresh));
                    }
                }
                Judged::Load { stale } => {
                    load.push((i, Mode::Fleet, stale.then(|| Arc::new(entry))));
                }
            }
        }

        if let Some((i, err, mode)) = &store_failed {
            let then = match (loading, mode) {
                (0, _) => "serving the stale L1 copies",
                (_, Mode::Local) if from_l1 > 0 => {
                    "serving the stale L1 copies it has, loading the others directly, without writing (the store cannot be used)"
                }
                (_, Mode::Local) => "loading directly, without writing (the store cannot be used)",
                (_, Mode::Fleet) if from_l1 > 0 => {
                    "serving the stale L1 copies it has, loading the others through the leases (the store answers, slowly)"
                }
                (_, Mode::Fleet) => "loading through the leases (the store answers, slowly)",
            };
            warn_limited!(
                self.inner.logs,
                Warning::StoreReadBatch,
                key = %show_key(&wants[*i].storage),
                error = %err,
                served_from_l1 = from_l1,
                loading,
                "store read failed for a batch; {then}"
            );
        }

        // Inside a version transition, the previous version's entries stand
        // in for the keys this version does not have (one more read for all
        // of them), while one background batch fills this version.
        if self.inner.previous.is_some() {
            self.previous_many(&mut wants, &mut load, &mut refreshes, options)
                .await;
        }

        // Refreshes in the background, one batch for all of them.
        self.refresh_many(&wants, &refreshes, &batch, *options);

        // 3. One flight per key: join the ones in the air, lead the rest.
        let mut waits: Vec<Wait<V>> = Vec::new();
        let mut led: Vec<(Led<K, V>, Mode)> = Vec::new();
        for (i, mode, stale) in load {
            let want = &wants[i];
            match self.local.flights.lead_or_join(&want.storage) {
                Ok((lander, joined)) => {
                    led.push((want.led(lander, None), mode));
                    waits.push((i, joined, Role::Leader, stale));
                }
                Err(joined) => waits.push((i, joined, Role::Follower, stale)),
            }
        }
        if !led.is_empty() {
            Span::current().record("loaded", led.len());
            let cache = self.clone();
            let batch = Arc::clone(&batch);
            let options = *options;
            let span = tracing::info_span!("breakwater.fill_many", keys = led.len());
            tokio::spawn(
                async move {
                    cache
                        .fill_many(led, batch, options, Priority::Foreground)
                        .await;
                }
                .instrument(span),
            );
        }

        // Each key's outcome, by the call's deadline.
        let last = pass == MAX_PASSES;
        let wanted = &wants;
        let settled = join_all(waits.into_iter().map(|(i, joined, role, stale)| {
            let storage = &wanted[i].storage;
            async move {
                let _waiting = (role == Role::Follower).then(|| self.inner.metrics.waiting());
                let soft = match (options.soft_timeout, &stale) {
                    (Some(soft), Some(_)) => deadline.min(deadline_after(soft)),
                    _ => deadline,
                };
                let result = match tokio::time::timeout_at(soft, joined.result()).await {
                    Ok(result) => result,
                    Err(_) if soft < deadline => {
                        if let Some(value) =
                            stale.as_ref().and_then(|e| self.entry_value(storage, e))
                        {
                            let served = Served::Stale {
                                reason: StaleReason::SoftTimeout,
                            };
                            return (i, Some(Ok(Fetched { value, served })));
                        }
                        Err(batch_timeout())
                    }
                    Err(_) => Err(batch_timeout()),
                };
                // A revoked load from before this call (`None`): another pass.
                let Some(result) = revoked_before(result, started, last) else {
                    return (i, None);
                };
                let want = &wanted[i];
                let local = want.local_stale.as_ref();
                let settled = self.settle(&want.user, storage, result, role, stale, local, options);
                (i, Some(settled))
            }
        }))
        .await;
        // Keys that waited for nothing but a revoked load go through the
        // pipeline again, as a batch (they are counted by that pass).
        let mut again = Vec::new();
        for (i, outcome) in settled {
            match outcome {
                Some(outcome) => wants[i].outcome = Some(outcome),
                None => again.push(i),
            }
        }
        let mut counted = vec![false; wants.len()];
        if !again.is_empty() {
            let keys = again.iter().map(|&i| wants[i].key.clone()).collect();
            let next = Box::pin(self.fetch_many(keys, batch, options, started, pass + 1)).await;
            for (&i, outcome) in again.iter().zip(next) {
                counted[i] = true;
                wants[i].outcome = Some(outcome);
            }
        }

        // In the caller's order; each request counted.
        position
            .into_iter()
            .map(|at| {
                let count = !matches!(at, Ok(i) if counted[i]);
                let result = match at {
                    Ok(i) => wants[i]
                        .outcome
                        .clone()
                        .unwrap_or_else(|| Err(batch_timeout())),
                    Err(err) => Err(err),
                };
                if count {
                    self.count_served(&result);
                }
                result
            })
            .collect()
    }

    /// Reads `keys` with one `get_many` and decodes each entry as
    /// `Cache::read` does: unreadable bytes and a key fault are a miss, a
    /// tagged entry counts only while its tags' generations are the ones
    /// it recorded (all checked in one more read; one that cannot be
    /// checked is a miss, never served). `Err` where the store failed.
    ///
    /// `own`: `keys` are this version's (inside a version transition the
    /// previous version's entries are then read beside them, see
    /// `transition`); `false` for the previous version's keys themselves.
    async fn read_many(&self, keys: &[&[u8]], own: bool) -> Vec<Result<Option<Entry>, Error>> {
        if keys.is_empty() {
            return Vec::new();
        }
        // Inside a version transition, the previous version's entries are
        // read beside them, in the same batch (see `transition`).
        let beside = own.then(|| transition::beside_keys(self, keys)).flatten();
        let mut all: Vec<&[u8]> = keys.to_vec();
        if let Some(beside) = &beside {
            all.extend(beside.iter().map(Vec::as_slice));
        }
        let mut read = self
            .inner
            .store
            .get_many_split(&all)
            .instrument(tracing::debug_span!("breakwater.store.get_many"))
            .await;
        let previous: Option<Vec<Result<Option<Vec<u8>>, Error>>> =
            beside.is_some().then(|| read.split_off(keys.len()));
        let mut entries: Vec<Result<Option<Entry>, Error>> = keys
            .iter()
            .zip(read)
            .enumerate()
            .map(|(i, (key, read))| match read {
                Ok(Some(bytes)) => {
                    let beside = match &previous {
                        None => None,
                        Some(previous) => match &previous[i] {
                            Ok(held) => Some(held.as_deref()),
                            // Not known: not served.
                            Err(_) => return Ok(None),
                        },
                    };
                    Ok(self.decode_beside(key, bytes, beside))
                }
                Ok(None) => Ok(None),
                Err(err) if err.is_key_fault() => Ok(None),
                Err(err) => Err(err),
            })
            .collect();
        Box::pin(self.keep_current(&mut entries)).await;
        entries
    }

    /// The keys of `load` with nothing in this version (no stale entry,
    /// store usable) that the previous version has: served from it as
    /// `Stale { PreviousVersion }` and queued for a background refresh
    /// (unless throttled), as `get_or_load` does inside a transition.
    async fn previous_many<K>(
        &self,
        wants: &mut [Want<K, V>],
        load: &mut Vec<(usize, Mode, Option<Arc<Entry>>)>,
        refreshes: &mut Vec<(usize, Refresh)>,
        options: &Options,
    ) {
        let candidates: Vec<(usize, Vec<u8>)> = load
            .iter()
            .filter(|(_, mode, stale)| *mode == Mode::Fleet && stale.is_none())
            .filter_map(|&(i, _, _)| Some((i, self.inner.previous_key(&wants[i].storage)?)))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let keys: Vec<&[u8]> = candidates.iter().map(|(_, old)| &old[..]).collect();
        // The previous version's own keys: read as they are.
        let read = self.read_many(&keys, false).await;
        let now = self.inner.store.now_ms();
        let mut served = vec![false; wants.len()];
        for ((i, old), read) in candidates.iter().zip(read) {
            let Ok(Some(entry)) = read else { continue };
            if !self.stands_in(&entry, now, options) {
                continue;
            }
            let Some(value) = self.previous_value(old, &entry) else {
                continue;
            };
            wants[*i].outcome = Some(Ok(Fetched {
                value,
                served: Served::Stale {
                    reason: StaleReason::PreviousVersion,
                },
            }));
            if !self.inner.is_throttled(&wants[*i].storage, now) {
                let refresh = Refresh {
                    replacing: 0,
                    early: false,
                };
                refreshes.push((*i, refresh));
            }
            served[*i] = true;
        }
        load.retain(|(i, _, _)| !served[*i]);
    }

    /// Background refreshes of the keys `refreshes` names, as one batch,
    /// for the keys no refresh is already in the air for. A refresh that
    /// fails throttles its key (fail-safe), as a single key's does.
    fn refresh_many<K, B>(
        &self,
        wants: &[Want<K, V>],
        refreshes: &[(usize, Refresh)],
        batch: &Arc<B>,
        options: Options,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        let mut led = Vec::new();
        let mut joined = Vec::new();
        for &(i, Refresh { replacing, early }) in refreshes {
            let want = &wants[i];
            if let Ok((lander, result)) = self.local.background.lead_or_join(&want.storage) {
                if early {
                    self.inner.metrics.early_refresh();
                }
                led.push((want.led(lander, Some(replacing)), Mode::Fleet));
                joined.push((want.storage.clone(), result));
            }
        }
        if led.is_empty() {
            return;
        }
        let cache = self.clone();
        let batch = Arc::clone(batch);
        tokio::spawn(async move {
            cache
                .clone()
                .fill_many(led, batch, options, Priority::Background)
                .await;
            for (key, joined) in joined {
                cache.refreshed(&key, &joined.result().await, &options);
            }
        });
    }

    /// Steps 4–6 for the keys this call leads: lands each key's flight.
    async fn fill_many<K, B>(
        self,
        led: Vec<(Led<K, V>, Mode)>,
        batch: Arc<B>,
        options: Options,
        priority: Priority,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        // A known-down origin is refused before any lease is taken.
        if let Err(err) = self.inner.origin.check() {
            for (led, _) in led {
                led.lander.land(Err(err.clone()));
            }
            return;
        }
        let ticket = self.local.ticket();
        let (fleet, local): (Vec<_>, Vec<_>) =
            led.into_iter().partition(|(_, mode)| *mode == Mode::Fleet);
        let local: Vec<Led<K, V>> = local.into_iter().map(|(led, _)| led).collect();
        let fleet: Vec<Led<K, V>> = fleet.into_iter().map(|(led, _)| led).collect();
        tokio::join!(
            self.load_local_many(local, &batch, &options, priority, ticket),
            self.lease_many(fleet, &batch, &options, priority, ticket),
        );
    }

    /// Step 4: the leases, in one step; then the keys taken are loaded,
    /// the ones held elsewhere awaited, and, if the store failed, loaded
    /// directly.
    async fn lease_many<K, B>(
        &self,
        led: Vec<Led<K, V>>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        if led.is_empty() {
            return;
        }
        let mut failure = None;
        let storage = led.iter().map(|l| l.storage.as_slice());
        let (asked, leases, attempts) = self.ask_leases(storage, &mut failure).await;
        let mut taken = Vec::new();
        let mut held = Vec::new();
        let mut failed = Vec::new();
        for ((led, attempt), (key, token)) in led.into_iter().zip(attempts).zip(&leases) {
            let request = LeaseRequest { key, token };
            match attempt {
                Ok(LeaseAttempt::Acquired) => taken.push((led, request)),
                Ok(LeaseAttempt::Held { ttl }) => held.push((led, ttl)),
                Err(err) => failed.push((led, request, err)),
            }
        }
        tokio::join!(
            self.lead_many(taken, asked, batch, options, priority, ticket),
            self.await_many(held, batch, options, priority, ticket),
            self.load_unleased(failed, batch, options, priority, ticket, failure),
        );
    }

    /// Holding the leases of `taken`: reads them once more (another process
    /// may have filled some just before), then loads the rest in batches
    /// of [`MAX_BATCH`], side by side.
    async fn lead_many<K, B>(
        &self,
        taken: Vec<(Led<K, V>, LeaseRequest<'_>)>,
        asked: Instant,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        if taken.is_empty() {
            return;
        }
        // The leases are kept alive from now on until each key's load has
        // ended: the read below and a wait in the bulkhead count against
        // them too, and a busy store can make those slow.
        let leases: Vec<LeaseRequest<'_>> = taken.iter().map(|(_, lease)| *lease).collect();
        let done: Vec<AtomicBool> = leases.iter().map(|_| AtomicBool::new(false)).collect();
        let work = self.lead_taken(taken, &done, asked, batch, options, priority, ticket);
        // Biased: the work first, so a load that ends on a keep-alive tick
        // is seen to end before the tick (a seeded run replays exactly).
        tokio::select! {
            biased;
            () = work => {}
            never = self.keep_alive(&leases, &done, asked) => match never {},
        }
    }

    /// [`lead_many`](Self::lead_many)'s work; `done[i]` is set once the
    /// `i`th key no longer needs its lease kept alive.
    #[allow(clippy::too_many_arguments)]
    async fn lead_taken<K, B>(
        &self,
        taken: Vec<(Led<K, V>, LeaseRequest<'_>)>,
        done: &[AtomicBool],
        asked: Instant,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        let inner = &self.inner;
        let keys: Vec<&[u8]> = taken.iter().map(|(l, _)| &l.storage[..]).collect();
        let again = self.read_many(&keys, true).await;
        let now = inner.store.now_ms();
        let mut to_load = Vec::new();
        let mut released = Vec::new();
        for (i, ((led, lease), read)) in taken.into_iter().zip(again).enumerate() {
            let entry = read.ok().flatten();
            let fresh = entry.and_then(|entry| {
                if entry.fresh_until <= now || led.replacing == Some(entry.fresh_until) {
                    return None;
                }
                let value = self.entry_value(&led.storage, &entry)?;
                Some((entry, value))
            });
            match fresh {
                Some((entry, value)) => released.push((i, led, lease, entry, value)),
                None => to_load.push((i, led, lease)),
            }
        }
        // Filled just before: served, and the lease given back.
        let release = join_all(released.into_iter().map(
            |(i, led, lease, entry, value)| async move {
                self.remember(&led.storage, &value, &entry, now, ticket, options);
                let message = notify::message(FILLED, inner.waiters.sender(), &led.storage);
                let _ = inner
                    .store
                    .release_lease(lease.key, lease.token, inner.notice(&message))
                    .await;
                done[i].store(true, Ordering::Release);
                led.lander.land(Ok((value, Served::Coalesced, None)));
            },
        ));
        // Inside a version transition, each key's previous-version entry is
        // pinned before the load (see `transition`); a key that cannot be
        // pinned gives its lease back and is loaded, served and kept in L1,
        // not written.
        let pins = if self.inner.previous.is_some() {
            let longest = counter_ttl(options);
            let pins = to_load
                .iter()
                .map(|(_, led, _)| self.pin_previous(&led.storage, longest));
            join_all(pins).await
        } else {
            to_load.iter().map(|_| Ok(None)).collect()
        };
        let mut pinned_loads = Vec::with_capacity(to_load.len());
        let mut unpinned = Vec::new();
        for ((i, led, lease), pin) in to_load.into_iter().zip(pins) {
            match pin {
                Ok(pinned) => pinned_loads.push((i, led, lease, pinned)),
                Err(err) => {
                    inner.metrics.store_failed("pin", &err);
                    unpinned.push((i, led, lease));
                }
            }
        }
        let unpinned = async {
            if unpinned.is_empty() {
                return;
            }
            warn_limited!(
                inner.logs,
                Warning::StoreRead,
                keys = unpinned.len(),
                "the previous version's entries could not be pinned; loading without writing"
            );
            let mut direct = Vec::with_capacity(unpinned.len());
            for (i, led, lease) in unpinned {
                self.release(&led.storage, lease).await;
                done[i].store(true, Ordering::Release);
                direct.push(led);
            }
            self.load_local_many(direct, batch, options, priority, ticket)
                .await;
        };
        let loads =
            join_all(in_batches(pinned_loads).into_iter().map(|chunk| {
                self.lead_chunk(chunk, done, asked, batch, options, priority, ticket)
            }));
        tokio::join!(release, loads, unpinned);
    }

    /// One batch loader call for keys whose leases this process holds
    /// (kept alive by [`keep_alive`](Self::keep_alive) until each key's
    /// write or release has answered); each value written through its own fence (a key the loader
    /// left out as "not found"); on failure the leases given back and every
    /// key fails. `asked`: when the leases were asked for (a value whose
    /// fence refused it lands marked so: see `Loaded`).
    #[allow(clippy::too_many_arguments)]
    async fn lead_chunk<K, B>(
        &self,
        chunk: Vec<Taken<'_, K, V>>,
        done: &[AtomicBool],
        asked: Instant,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        let keys = chunk.iter().map(|(_, l, _, _)| l.key.clone()).collect();
        let result = self.load_batch(keys, batch, options, priority).await;
        // Each lease is kept alive until its key's write or release has
        // answered: a thousand writes can queue on a busy store.
        match result {
            Ok((mut found, load_time)) => {
                let writes = chunk.into_iter().map(|(i, led, lease, pinned)| {
                    let value = found.remove(&led.user);
                    async move {
                        let written = self
                            .write_fenced(
                                &led.storage,
                                lease,
                                value.as_ref(),
                                load_time,
                                options,
                                ticket,
                                Vec::new(),
                                pinned.as_ref(),
                            )
                            .await;
                        done[i].store(true, Ordering::Release);
                        led.lander.land(
                            written
                                .map(|revoked| (value, Served::Loaded, revoked.then_some(asked))),
                        );
                    }
                });
                join_all(writes).await;
            }
            Err(err) => {
                join_all(chunk.into_iter().map(|(i, led, lease, _)| {
                    let err = err.clone();
                    async move {
                        self.release(&led.storage, lease).await;
                        done[i].store(true, Ordering::Release);
                        led.lander.land(Err(err));
                    }
                }))
                .await;
            }
        }
    }

    /// Keys whose lease another process holds, each with how long its
    /// lease had left: awaited together, woken by the holders' fills (a
    /// value the message carries is taken as it is, others are read in one
    /// `get_many`); the keys whose leases are gone (a holder that died: its
    /// lease is no longer extended and runs out) are taken over together:
    /// one lease step for every key of this call that is due, the keys
    /// whose leases run out within [`TAKEOVER_GATHER`] of the first added,
    /// and then one batch, loaded as this call's own keys are
    /// ([`lead_many`](Self::lead_many): one loader call and one bulkhead
    /// slot per [`MAX_BATCH`] keys). So a dead holder's keys cost each
    /// waiting call one batch, within its lease TTL plus one load, however
    /// many keys it held. The wait ends by `lock_wait` (then the
    /// [`OnLockTimeout`](super::OnLockTimeout) policy, for the keys left).
    async fn await_many<K, B>(
        &self,
        held: Vec<(Led<K, V>, Duration)>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        if held.is_empty() {
            return;
        }
        // The loads (takeovers, and a lock-wait policy's) run beside the
        // wait, so a wake-up is never held up by a load, nor a load by a read.
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::join!(
            self.wait_many(held, jobs, options, priority),
            self.run_jobs(queue, batch, options, priority, ticket),
        );
    }

    /// [`await_many`](Self::await_many)'s waiting: hands every key it does
    /// not land itself (taken over, or past `lock_wait` and loaded anyway)
    /// to `jobs`.
    async fn wait_many<K>(
        &self,
        held: Vec<(Led<K, V>, Duration)>,
        jobs: mpsc::UnboundedSender<Job<K, V>>,
        options: &Options,
        priority: Priority,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
    {
        let inner = &self.inner;
        let ticket = self.local.ticket();
        let deadline = deadline_after(inner.lock_wait_for(options));
        let mut keys: Vec<Option<Waiting<K, V>>> = held
            .into_iter()
            .map(|(led, left)| {
                Some(Waiting {
                    led,
                    retry_at: deadline_after(left.saturating_add(LEASE_RETRY_MARGIN)),
                    stale: None,
                })
            })
            .collect();
        // One watch per key for the whole wait, and its wake-up armed
        // before any read: a fill between two reads is never missed.
        let mut watches = Vec::with_capacity(keys.len());
        for waiting in keys.iter().flatten() {
            let storage = &waiting.led.storage;
            watches.push(
                inner
                    .waiters
                    .watch(&*inner.store, storage, SUBSCRIBE_WITHIN)
                    .await,
            );
        }
        // Key `i`'s wake-up, armed now; it yields `i` when it fires. Only
        // the keys woken are polled again (not every key on every wake).
        let arm = |i: usize| {
            let mut woken = Box::pin(watches[i].notify().notified());
            woken.as_mut().enable();
            async move {
                woken.await;
                i
            }
        };
        let mut wakes: FuturesUnordered<_> = (0..keys.len()).map(arm).collect();
        // Polls (a fallback to the bus) read and try every waiting key at
        // once (one read, one lease step), each key as often as a single
        // key's wait polls it when ~100 share a `lock_poll` (and at least
        // once per lease TTL): a lost "released" or "filled" message costs
        // at most one poll.
        let every = {
            let scale = u32::try_from(keys.len() / WAITER_POLLS + 1).unwrap_or(u32::MAX);
            inner
                .lease
                .lock_poll
                .saturating_mul(options.poll_scale.saturating_mul(scale))
                .min(inner.lease.lease_ttl.max(inner.lease.lock_poll))
        };
        let mut check: Vec<usize> = (0..keys.len()).collect();
        let mut attempt: Vec<usize> = Vec::new();
        loop {
            // Filled meanwhile (or just before the watches): served.
            self.check_filled(&mut keys, &check, options, ticket).await;
            check.clear();
            // Leases gone: taken over, together.
            let now = Instant::now();
            attempt.extend(
                (0..keys.len()).filter(|&i| keys[i].as_ref().is_some_and(|w| w.retry_at <= now)),
            );
            attempt.sort_unstable();
            attempt.dedup();
            attempt.retain(|&i| keys[i].is_some());
            if !attempt.is_empty() {
                self.take_over(&mut keys, &attempt, &jobs).await;
                attempt.clear();
            }
            if keys.iter().all(Option::is_none) || Instant::now() >= deadline {
                break;
            }
            let retry_at = keys
                .iter()
                .flatten()
                .map(|w| w.retry_at)
                .min()
                .unwrap_or(deadline);
            let poll = {
                let mut rng = inner.rng.lock().unwrap_or_else(|p| p.into_inner());
                poll_delay(every, &mut *rng)
            };
            tokio::select! {
                biased;
                Some(first) = wakes.next() => {
                    let mut woke = vec![first];
                    while let Some(Some(i)) = wakes.next().now_or_never() {
                        woke.push(i);
                    }
                    for i in woke {
                        // A key done meanwhile is not watched again.
                        let Some(waiting) = keys[i].as_mut() else {
                            continue;
                        };
                        wakes.push(arm(i));
                        // The fill's message may carry the entry: no read
                        // then (a tagged one is read: the store checks it).
                        let storage = &waiting.led.storage;
                        let carried = watches[i]
                            .filled()
                            .and_then(|bytes| self.decode(storage, bytes))
                            .filter(|entry| entry.tags.is_empty());
                        let value = carried.and_then(|entry| {
                            let replacing = waiting.led.replacing;
                            self.fresh_entry(storage, entry, &mut waiting.stale, options, replacing, ticket)
                        });
                        match value {
                            Some(value) => {
                                if let Some(waiting) = keys[i].take() {
                                    waiting.led.lander.land(Ok((value, Served::Coalesced, None)));
                                }
                            }
                            // Released without a value, or not carried:
                            // read, and tried again.
                            None => {
                                check.push(i);
                                attempt.push(i);
                            }
                        }
                    }
                }
                () = sleep_until(deadline) => {}
                () = sleep_until(retry_at) => {}
                () = sleep(poll) => {
                    check.extend((0..keys.len()).filter(|&i| keys[i].is_some()));
                    attempt.extend(check.iter().copied());
                }
            }
        }
        drop(wakes);
        // Past `lock_wait`: the policy, for the keys left.
        let left: Vec<Waiting<K, V>> = keys.into_iter().flatten().collect();
        if left.is_empty() {
            return;
        }
        let waited = inner.lock_wait_for(options);
        if priority == Priority::Background {
            for waiting in left {
                waiting.led.lander.land(Err(lock_timeout(waited)));
            }
            return;
        }
        match inner.lease.on_lock_timeout.0 {
            LockTimeoutKind::LoadAnyway => {
                warn_limited!(
                    inner.logs,
                    Warning::LockWaitLoadAnyway,
                    keys = left.len(),
                    ?waited,
                    "leases held past lock_wait; loading anyway (not written)"
                );
                let leds = left.into_iter().map(|waiting| waiting.led).collect();
                let _ = jobs.send(Job::Unwritten(leds));
            }
            LockTimeoutKind::ServeStale => {
                for waiting in left {
                    let storage = &waiting.led.storage;
                    let stale = waiting.stale.as_ref();
                    let result = match stale.and_then(|e| self.entry_value(storage, e)) {
                        Some(value) => {
                            let reason = StaleReason::LockTimeout;
                            Ok((value, Served::Stale { reason }, None))
                        }
                        None => Err(lock_timeout(waited)),
                    };
                    waiting.led.lander.land(result);
                }
            }
            LockTimeoutKind::Error => {
                for waiting in left {
                    waiting.led.lander.land(Err(lock_timeout(waited)));
                }
            }
        }
    }

    /// Reads the keys `check` names among `keys` (one `get_many`) and lands
    /// the ones found fresh; a stale entry seen is kept for the lock-wait
    /// policy.
    async fn check_filled<K>(
        &self,
        keys: &mut [Option<Waiting<K, V>>],
        check: &[usize],
        options: &Options,
        ticket: Option<Ticket>,
    ) {
        let mut check: Vec<usize> = check.to_vec();
        check.sort_unstable();
        check.dedup();
        check.retain(|&i| keys[i].is_some());
        if check.is_empty() {
            return;
        }
        let read = {
            let storage: Vec<&[u8]> = check
                .iter()
                .filter_map(|&i| keys[i].as_ref().map(|w| &w.led.storage[..]))
                .collect();
            self.read_many(&storage, true).await
        };
        for (&i, read) in check.iter().zip(read) {
            let Ok(Some(entry)) = read else { continue };
            let Some(waiting) = keys[i].as_mut() else {
                continue;
            };
            let (storage, replacing) = (&waiting.led.storage, waiting.led.replacing);
            let value = self.fresh_entry(
                storage,
                entry,
                &mut waiting.stale,
                options,
                replacing,
                ticket,
            );
            if let Some(value) = value
                && let Some(waiting) = keys[i].take()
            {
                waiting
                    .led
                    .lander
                    .land(Ok((value, Served::Coalesced, None)));
            }
        }
    }

    /// Tries the leases of the keys `due` names among `keys` in one step
    /// (one script; per hash slot on a Cluster). If any was taken (its
    /// holder's lease is gone), the other waiting keys whose leases run out
    /// within [`TAKEOVER_GATHER`] are tried too once they have (a dead
    /// holder's leases were taken, and extended, together), so they are
    /// loaded in the same batch. The keys taken go to `jobs` as one batch;
    /// those whose attempt failed (the store) as another; the rest wait on,
    /// until their holder's new expiry.
    async fn take_over<K>(
        &self,
        keys: &mut [Option<Waiting<K, V>>],
        due: &[usize],
        jobs: &mpsc::UnboundedSender<Job<K, V>>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
    {
        let mut taken = Vec::new();
        let mut failed = Vec::new();
        let mut failure = None;
        let asked = self
            .try_leases(keys, due, &mut taken, &mut failed, &mut failure)
            .await;
        if !taken.is_empty() {
            let now = Instant::now();
            let gather = TAKEOVER_GATHER.min(self.inner.lease.lease_ttl / 10);
            let soon: Vec<usize> = (0..keys.len())
                .filter(|&i| keys[i].as_ref().is_some_and(|w| w.retry_at <= now + gather))
                .collect();
            if let Some(last) = soon
                .iter()
                .filter_map(|&i| keys[i].as_ref())
                .map(|w| w.retry_at)
                .max()
            {
                sleep_until(last).await;
                self.try_leases(keys, &soon, &mut taken, &mut failed, &mut failure)
                    .await;
            }
        }
        if !taken.is_empty() {
            let _ = jobs.send(Job::Lead { taken, asked });
        }
        if let Some(failure) = failure {
            let _ = jobs.send(Job::Unleased { failed, failure });
        }
    }

    /// One lease step for the keys `try_now` names among `keys`: a key
    /// taken moves to `taken`, one whose attempt failed to `failed` (the
    /// first error in `failure`), one still held gets its holder's new
    /// expiry. When the leases were asked for.
    async fn try_leases<K>(
        &self,
        keys: &mut [Option<Waiting<K, V>>],
        try_now: &[usize],
        taken: &mut Vec<(Led<K, V>, OwnedLease)>,
        failed: &mut Vec<(Led<K, V>, OwnedLease, Error)>,
        failure: &mut Option<Error>,
    ) -> Instant {
        let tried: Vec<usize> = try_now
            .iter()
            .copied()
            .filter(|&i| keys[i].is_some())
            .collect();
        if tried.is_empty() {
            return Instant::now();
        }
        let storage = tried
            .iter()
            .filter_map(|&i| keys[i].as_ref().map(|w| w.led.storage.as_slice()));
        let (asked, leases, attempts) = self.ask_leases(storage, failure).await;
        for ((i, attempt), lease) in tried.into_iter().zip(attempts).zip(leases) {
            match attempt {
                Ok(LeaseAttempt::Acquired) => {
                    if let Some(waiting) = keys[i].take() {
                        taken.push((waiting.led, lease));
                    }
                }
                Ok(LeaseAttempt::Held { ttl }) => {
                    if let Some(waiting) = keys[i].as_mut() {
                        waiting.retry_at = deadline_after(ttl.saturating_add(LEASE_RETRY_MARGIN));
                    }
                }
                Err(err) => {
                    if let Some(waiting) = keys[i].take() {
                        failed.push((waiting.led, lease, err));
                    }
                }
            }
        }
        asked
    }

    /// One lease step for the storage keys `storage`: a fresh token each,
    /// all asked at once ([`Store::acquire_leases`]; per hash slot on a
    /// Cluster), each outcome counted, the first failure counted as a
    /// store failure and kept in `failure`. Returns when they were asked (a
    /// lease's TTL runs from when the store took it, which may be well
    /// before its reply arrives: keep-alive is timed from the request),
    /// and each key's lease and outcome, in order.
    async fn ask_leases<'s>(
        &self,
        storage: impl Iterator<Item = &'s [u8]>,
        failure: &mut Option<Error>,
    ) -> (Instant, Vec<OwnedLease>, Vec<Result<LeaseAttempt, Error>>) {
        let inner = &self.inner;
        let leases: Vec<OwnedLease> = storage
            .map(|key| (inner.lease_key(key), inner.new_token()))
            .collect();
        let requests: Vec<LeaseRequest<'_>> = leases
            .iter()
            .map(|(key, token)| LeaseRequest { key, token })
            .collect();
        let asked = Instant::now();
        let attempts = inner
            .store
            .acquire_leases_split(&requests, inner.lease.lease_ttl)
            .await;
        for attempt in &attempts {
            match attempt {
                Ok(LeaseAttempt::Acquired) => inner.metrics.lease("acquired"),
                Ok(LeaseAttempt::Held { .. }) => inner.metrics.lease("busy"),
                Err(err) if failure.is_none() => {
                    inner.metrics.store_failed("acquire_lease", err);
                    *failure = Some(err.clone());
                }
                Err(_) => {}
            }
        }
        (asked, leases, attempts)
    }

    /// Runs the loads [`wait_many`](Self::wait_many) hands over, side by
    /// side, until it is done and they have all landed.
    async fn run_jobs<K, B>(
        &self,
        mut queue: mpsc::UnboundedReceiver<Job<K, V>>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        let mut running = FuturesUnordered::new();
        loop {
            tokio::select! {
                biased;
                job = queue.recv() => match job {
                    Some(job) => running.push(self.run_job(job, batch, options, priority, ticket)),
                    None => break,
                },
                Some(()) = running.next(), if !running.is_empty() => {}
            }
        }
        while running.next().await.is_some() {}
    }

    /// One of [`run_jobs`](Self::run_jobs)' loads.
    async fn run_job<K, B>(
        &self,
        job: Job<K, V>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        match job {
            Job::Lead { taken, asked } => {
                let (leds, leases): (Vec<Led<K, V>>, Vec<OwnedLease>) = taken.into_iter().unzip();
                let taken = leds
                    .into_iter()
                    .zip(&leases)
                    .map(|(led, (key, token))| (led, LeaseRequest { key, token }))
                    .collect();
                self.lead_many(taken, asked, batch, options, priority, ticket)
                    .await;
            }
            Job::Unleased { failed, failure } => {
                let mut leds = Vec::with_capacity(failed.len());
                let mut leases: Vec<OwnedLease> = Vec::with_capacity(failed.len());
                for (led, lease, err) in failed {
                    leds.push((led, err));
                    leases.push(lease);
                }
                let failed = leds
                    .into_iter()
                    .zip(&leases)
                    .map(|((led, err), (key, token))| (led, LeaseRequest { key, token }, err))
                    .collect();
                self.load_unleased(failed, batch, options, priority, ticket, Some(failure))
                    .await;
            }
            Job::Unwritten(leds) => {
                join_all(in_batches(leds).into_iter().map(|chunk| async move {
                    let keys = chunk.iter().map(|l| l.key.clone()).collect();
                    match self.load_batch(keys, batch, options, priority).await {
                        Ok((mut found, _)) => {
                            for led in chunk {
                                let value = found.remove(&led.user);
                                led.lander.land(Ok((value, Served::Loaded, None)));
                            }
                        }
                        Err(err) => {
                            for led in chunk {
                                led.lander.land(Err(err.clone()));
                            }
                        }
                    }
                }))
                .await;
            }
        }
    }

    /// Keys whose leases could not be tried (the store failed): a
    /// background refresh gives up, giving the tokens just tried back
    /// first (in case the attempt ran); a caller's keys are loaded directly
    /// and not written (see `fill::load_direct`), and the tokens just
    /// tried are given back in the background in case the attempt ran.
    async fn load_unleased<K, B>(
        &self,
        failed: Vec<(Led<K, V>, LeaseRequest<'_>, Error)>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
        failure: Option<Error>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        if failed.is_empty() {
            return;
        }
        if let Some(err) = failure {
            warn_limited!(self.inner.logs, Warning::LeaseUnavailable, keys = failed.len(), error = %err, "leases unavailable; loading directly");
        }
        if priority == Priority::Background {
            // Never a load outside the lease in the background; the tokens
            // just tried are given back first, in case the attempt ran (a
            // lost reply; on a Cluster one failed slot group fails the
            // others' attempts, which did run), so waiters elsewhere need
            // not sit out the lease TTL.
            join_all(
                failed
                    .iter()
                    .map(|(led, lease, _)| self.release(&led.storage, *lease)),
            )
            .await;
            for (led, _, err) in failed {
                led.lander.land(Err(err));
            }
            return;
        }
        let mut direct = Vec::with_capacity(failed.len());
        let mut tokens = Vec::with_capacity(failed.len());
        for (led, lease, _) in failed {
            tokens.push((
                led.storage.clone(),
                lease.key.to_vec(),
                lease.token.to_vec(),
            ));
            direct.push(led);
        }
        if !tokens.is_empty() {
            let cache = self.clone();
            tokio::spawn(async move {
                for (key, lease_key, token) in tokens {
                    let lease = Lease {
                        key: &lease_key,
                        token: &token,
                    };
                    cache.release(&key, lease).await;
                }
            });
        }
        self.load_local_many(direct, batch, options, priority, ticket)
            .await;
    }

    /// Loads `led` in batches without touching the store; each value is
    /// served and kept in L1 (`fill::keep_local`).
    async fn load_local_many<K, B>(
        &self,
        led: Vec<Led<K, V>>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        join_all(in_batches(led).into_iter().map(|chunk| async move {
            let keys = chunk.iter().map(|l| l.key.clone()).collect();
            match self.load_batch(keys, batch, options, priority).await {
                Ok((mut found, load_time)) => {
                    for led in chunk {
                        let value = found.remove(&led.user);
                        self.keep_local(&led.storage, &value, load_time, options, ticket, false);
                        led.lander.land(Ok((value, Served::Loaded, None)));
                    }
                }
                Err(err) => {
                    for led in chunk {
                        led.lander.land(Err(err.clone()));
                    }
                }
            }
        }))
        .await;
    }

    /// One call of the batch loader for `keys` under the origin's
    /// protection (breaker, one bulkhead slot, `load_timeout`, retries):
    /// the values found, by user key, and how long the call took.
    async fn load_batch<K, B>(
        &self,
        keys: Vec<K>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
    ) -> Result<(HashMap<Vec<u8>, V>, Duration), Error>
    where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        let load = Arc::new(Chunk {
            keys,
            batch: Arc::clone(batch),
        });
        let inner = &self.inner;
        let (found, took) = inner
            .origin
            .load(&load, options.load_timeout, priority, &inner.metrics)
            .await?;
        Ok((found.unwrap_or_default().into_iter().collect(), took))
    }
}

/// `items` in runs of at most [`MAX_BATCH`], in order.
fn in_batches<T>(items: Vec<T>) -> Vec<Vec<T>> {
    let mut items = items.into_iter().peekable();
    let mut batches = Vec::new();
    while items.peek().is_some() {
        batches.push(items.by_ref().take(MAX_BATCH).collect());
    }
    batches
}

/// A key of a `get_many` not done by the call's deadline.
fn batch_timeout() -> Error {
    Error::new(
        ErrorKind::Timeout,
        "get_many's deadline passed before this key was loaded (lock_wait + queue_wait + load_timeout + 1 s); its load goes on",
    )
}
