//! One flight per key for many keys at once, so a batch costs the fleet one
//! load per key: the leases taken in one step, one batch loader call per
//! chunk, keys another process holds awaited together and taken over as a
//! batch, and direct loads when the store cannot be used.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::{FutureExt, join_all};
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until};

use super::loader::{
    BatchLoad, Chunk, Job, Led, OwnedLease, TAKEOVER_GATHER, Taken, WAITER_POLLS, WaitingKeys,
    in_batches,
};
use crate::cache::fill::{Mode, SUBSCRIBE_WITHIN};
use crate::cache::handle::Cache;
use crate::cache::lease::LockTimeoutKind;
use crate::cache::lease::{LEASE_RETRY_MARGIN, Lease, deadline_after, lock_timeout};
use crate::cache::loaded::{LoadContext, Loaded};
use crate::cache::notify::{self, FILLED};
use crate::cache::options::Options;
use crate::cache::tags::{TagSet, counter_ttl};
use crate::cache::value::Value;
use crate::entry::TagStamp;
use crate::error::Error;
use crate::jitter::poll_delay;
use crate::key::CacheKey;
use crate::l1::Ticket;
use crate::limit::Priority;
use crate::log_limit::{Warning, warn_limited};
use crate::served::{Served, StaleReason};
use crate::store::{LeaseAttempt, LeaseRequest, Store};

impl<V: Value> Cache<V> {
    /// The fill, load, fenced write and settle for the keys this call leads: lands each key's flight.
    pub(super) async fn fill_many<K, B>(
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
            self.load_direct_many(local, &batch, &options, priority, Some(ticket)),
            self.lease_many(fleet, &batch, &options, priority, ticket),
        );
    }

    /// The leases, in one step; then the keys taken are loaded,
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
    /// of [`MAX_BATCH`](super::loader::MAX_BATCH), side by side.
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
        let sent = Instant::now();
        let again = self.read_many(&keys, true).await;
        let now = inner.store.now_ms();
        let mut to_load = Vec::new();
        let mut released = Vec::new();
        for (i, ((mut led, lease), read)) in taken.into_iter().zip(again).enumerate() {
            let entry = read.ok().flatten();
            let fresh = entry.as_ref().and_then(|entry| {
                if entry.fresh_until <= now
                    || led.replacing == Some(entry.fresh_until)
                    || batch.tags().is_some_and(|tags| !tags.carried_by(entry))
                {
                    return None;
                }
                self.entry_value(&led.storage, entry)
            });
            match (fresh, entry) {
                (Some(value), Some(entry)) => {
                    // Kept in L1 now, with what is left of the entry's
                    // windows at this read: the steps below (pins, tags, the
                    // clear record) may each take a store reply before the
                    // release runs (seed 1131).
                    self.keep_read(&led.storage, &value, &entry, now, ticket, options);
                    released.push((i, led, lease, value));
                }
                (_, entry) => {
                    // What the load replaces, read under its lease.
                    led.seen = entry;
                    to_load.push((i, led, lease));
                }
            }
        }
        // Filled just before: served, and the lease given back.
        let release = join_all(
            released
                .into_iter()
                .map(|(i, led, lease, value)| async move {
                    let message = notify::message(FILLED, inner.waiters.sender(), &led.storage);
                    let _ = inner
                        .store
                        .release_lease(lease.key, lease.token, inner.notice(&message))
                        .await;
                    done[i].store(true, Ordering::Release);
                    // Read at `sent`: not for callers that joined much later.
                    led.lander
                        .land(Ok((value, Served::Coalesced, self.read_answers(sent))));
                }),
        );
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
        // The call's tags' generations, read once for the whole batch
        // after its leases were taken and before its loader runs, recorded
        // in every entry it writes (see `tags`). Unreadable: the keys are
        // loaded, served and kept in L1, not written, as unpinned ones.
        // So is the namespace's clear generation (see `clear`).
        let stamps = match batch.tags() {
            None => Ok(Vec::new()),
            Some(_) if to_load.is_empty() => Ok(Vec::new()),
            Some(tags) => self.tag_generations(tags).await,
        };
        let namespace = match to_load.is_empty() {
            true => Ok(None),
            false => self.clear_generation().await.map(Some),
        };
        let stamps = match (stamps, namespace) {
            (Ok(stamps), Ok(namespace)) => Some((stamps, namespace)),
            (Err(err), _) => {
                inner.metrics.store_failed("tag_generations", &err);
                None
            }
            (_, Err(err)) => {
                inner.metrics.store_failed("clear_record", &err);
                None
            }
        };
        let mut pinned_loads = Vec::with_capacity(to_load.len());
        let mut unpinned = Vec::new();
        for ((i, led, lease), pin) in to_load.into_iter().zip(pins) {
            match pin {
                Ok(pinned) if stamps.is_some() => pinned_loads.push((i, led, lease, pinned)),
                Ok(_) => unpinned.push((i, led, lease)),
                Err(err) => {
                    inner.metrics.store_failed("pin", &err);
                    unpinned.push((i, led, lease));
                }
            }
        }
        let (stamps, namespace) = stamps.unwrap_or_default();
        let stamps = &stamps;
        let unpinned = async {
            if unpinned.is_empty() {
                return;
            }
            warn_limited!(
                inner.logs,
                Warning::StoreRead,
                keys = unpinned.len(),
                "the previous version's entries or the call's tags could not be read; loading without writing"
            );
            let mut direct = Vec::with_capacity(unpinned.len());
            for (i, led, lease) in unpinned {
                self.release(&led.storage, lease).await;
                done[i].store(true, Ordering::Release);
                direct.push(led);
            }
            self.load_direct_many(direct, batch, options, priority, Some(ticket))
                .await;
        };
        let loads = join_all(in_batches(pinned_loads).into_iter().map(|chunk| {
            let recorded = (stamps.as_slice(), namespace);
            self.lead_chunk(
                chunk, recorded, done, asked, batch, options, priority, ticket,
            )
        }));
        tokio::join!(release, loads, unpinned);
    }

    /// One batch loader call for keys whose leases this process holds
    /// (kept alive by [`keep_alive`](Self::keep_alive) until each key's
    /// write or release has answered); each value written through its own fence (a key the loader
    /// left out as "not found"); on failure the leases given back and every
    /// key fails. `asked`: when the leases were asked for (a value whose
    /// fence refused it lands marked so: see `Landed`).
    #[allow(clippy::too_many_arguments)]
    async fn lead_chunk<K, B>(
        &self,
        chunk: Vec<Taken<'_, K, V>>,
        (stamps, namespace): (&[TagStamp], Option<u64>),
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
        let keys = self.contexts(chunk.iter().map(|(_, led, _, _)| led), batch);
        let started_ms = self.inner.store.now_ms();
        let result = self.load_batch(keys, batch, options, priority).await;
        // Each lease is kept alive until its key's write or release has
        // answered: a thousand writes can queue on a busy store.
        match result {
            Ok((mut found, load_time)) => {
                // The tags the loader chose, read once for the chunk.
                let after = self
                    .after_batch(started_ms, found.values(), stamps, options)
                    .await;
                let after = &after;
                let writes = chunk.into_iter().map(|(i, led, lease, pinned)| {
                    // A key the loader left out does not exist.
                    let loaded = found.remove(&led.user).unwrap_or_else(Loaded::none);
                    async move {
                        let recorded = (stamps.to_vec(), pinned.as_ref(), namespace);
                        let written = self
                            .write_loaded(
                                &led.storage,
                                lease,
                                loaded,
                                load_time,
                                led.seen.as_ref(),
                                options,
                                ticket,
                                recorded,
                                after,
                            )
                            .await;
                        done[i].store(true, Ordering::Release);
                        led.lander.land(written.map(|(value, revoked)| {
                            (value, Served::Loaded, revoked.then_some(asked))
                        }));
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

    /// The keys of `led` for the batch loader, each with what its load
    /// replaces (for a loader that reads it: see `fill::context`).
    fn contexts<'l, K, B>(
        &self,
        led: impl Iterator<Item = &'l Led<K, V>>,
        _batch: &Arc<B>,
    ) -> Vec<(K, LoadContext<V>)>
    where
        K: Clone + 'l,
        B: BatchLoad<K, V>,
    {
        led.map(|led| {
            let context = self.context_if(B::READS_CONTEXT, &led.storage, led.seen.as_ref());
            (led.key.clone(), context)
        })
        .collect()
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
    /// slot per [`MAX_BATCH`](super::loader::MAX_BATCH) keys). So a dead holder's keys cost each
    /// waiting call one batch, within its lease TTL plus one load, however
    /// many keys it held. The wait ends by `lock_wait` (then the
    /// [`OnLockTimeout`](crate::OnLockTimeout) policy, for the keys left).
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
            self.wait_many(held, jobs, options, priority, batch.tags()),
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
        tags: Option<&TagSet>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
    {
        let inner = &self.inner;
        let ticket = self.local.ticket();
        let deadline = deadline_after(inner.lock_wait_for(options));
        let mut keys: Vec<Option<WaitingKeys<K, V>>> = held
            .into_iter()
            .map(|(led, left)| {
                Some(WaitingKeys {
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
            self.check_filled(&mut keys, &check, options, ticket, tags)
                .await;
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
                        let carried =
                            watches[i].filled().and_then(|bytes| self.carried(storage, bytes));
                        let value = carried.and_then(|entry| {
                            let replacing = waiting.led.replacing;
                            self.fresh_entry(storage, entry, &mut waiting.stale, options, replacing, ticket, tags)
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
        let left: Vec<WaitingKeys<K, V>> = keys.into_iter().flatten().collect();
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
        keys: &mut [Option<WaitingKeys<K, V>>],
        check: &[usize],
        options: &Options,
        ticket: Option<Ticket>,
        tags: Option<&TagSet>,
    ) {
        let mut check: Vec<usize> = check.to_vec();
        check.sort_unstable();
        check.dedup();
        check.retain(|&i| keys[i].is_some());
        if check.is_empty() {
            return;
        }
        // Read at `sent`: what it finds answers the callers that started
        // within one read deadline of it, as a single key's read-back
        // does (`read_answers`); one that joined later reads again.
        let sent = Instant::now();
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
                tags,
            );
            if let Some(value) = value
                && let Some(waiting) = keys[i].take()
            {
                waiting
                    .led
                    .lander
                    .land(Ok((value, Served::Coalesced, self.read_answers(sent))));
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
        keys: &mut [Option<WaitingKeys<K, V>>],
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
        keys: &mut [Option<WaitingKeys<K, V>>],
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
                self.load_direct_many(leds, batch, options, priority, None)
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
        self.load_direct_many(direct, batch, options, priority, Some(ticket))
            .await;
    }

    /// Loads `led` in batches without touching the store; each value is
    /// served and, given the call's `keep` ticket, kept in L1
    /// (`fill::keep_unwritten`); `None` for a load past `lock_wait`
    /// (another process's lease still holds the key: kept nowhere).
    async fn load_direct_many<K, B>(
        &self,
        led: Vec<Led<K, V>>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
        keep: Option<Option<Ticket>>,
    ) where
        K: CacheKey + Clone + Send + Sync + 'static,
        B: BatchLoad<K, V>,
    {
        join_all(in_batches(led).into_iter().map(|chunk| async move {
            let keys = self.contexts(chunk.iter(), batch);
            match self.load_batch(keys, batch, options, priority).await {
                Ok((mut found, load_time)) => {
                    for led in chunk {
                        let loaded = found.remove(&led.user).unwrap_or_else(Loaded::none);
                        let answer =
                            self.unwritten_answer(&led.storage, loaded, led.seen.as_ref(), options);
                        let answer = answer.map(|(value, chosen, chose_tags)| {
                            if let (Some(options), Some(ticket)) = (chosen, keep) {
                                let tagged = batch.tags().is_some() || chose_tags;
                                self.keep_unwritten(
                                    &led.storage,
                                    &value,
                                    load_time,
                                    &options,
                                    ticket,
                                    tagged,
                                    self.inner.store.now_ms(),
                                );
                            }
                            (value, Served::Loaded, None)
                        });
                        led.lander.land(answer);
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
        keys: Vec<(K, LoadContext<V>)>,
        batch: &Arc<B>,
        options: &Options,
        priority: Priority,
    ) -> Result<(HashMap<Vec<u8>, Loaded<V>>, Duration), Error>
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
            .load(
                &load,
                LoadContext::empty(),
                options.load_timeout,
                priority,
                &inner.metrics,
            )
            .await?;
        Ok((found.value.unwrap_or_default().into_iter().collect(), took))
    }
}
