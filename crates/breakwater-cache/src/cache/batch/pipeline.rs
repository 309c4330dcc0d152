//! The pipeline of one `get_many`: the steps of the module docs, in order,
//! for many keys at once.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::join_all;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use super::loader::{BatchLoad, Led, STORE_SLACK, Wait, Want, batch_timeout};
use crate::cache::fill::Mode;
use crate::cache::handle::Cache;
use crate::cache::lease::deadline_after;
use crate::cache::options::Options;
use crate::cache::pipeline::{MAX_PASSES, cooperate, revoked_before};
use crate::cache::read::Near;
use crate::cache::value::Value;
use crate::cache::verdict::{Judged, Refresh};
use crate::entry::Entry;
use crate::error::{Error, ErrorKind};
use crate::flight::Role;
use crate::key::CacheKey;
use crate::limit::Priority;
use crate::log_limit::show_key;
use crate::log_limit::{Warning, warn_limited};
use crate::served::{Fetched, Served, StaleReason};
use crate::store::Store;

impl<V: Value> Cache<V> {
    /// The body of [`get_many_with_meta`](Self::get_many_with_meta), for a
    /// call that started at `started`, pass `pass`: a key whose load turns
    /// out revoked before the call started goes through another pass, as
    /// in `Cache::pipeline` (with the same bound).
    pub(super) async fn fetch_many<K, B>(
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
            let near = match batch.tags() {
                Some(tags) => self.near_tagged(&want.user, options, tags),
                None => self.near(&want.user, Some(options)),
            };
            match near {
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
            // Every key left holds an L1 copy to serve: the read waits no
            // longer than the store's soft deadline (as a single key's
            // does, see `pipeline`), and a stalled store costs the batch
            // that, not the hard deadline its timeouts have grown.
            let stand_ins =
                !unread.is_empty() && unread.iter().all(|&i| wants[i].local_stale.is_some());
            if stand_ins {
                let store = &self.inner.store;
                let soft = keys.iter().map(|key| store.soft_deadline(key)).max();
                let soft = soft.unwrap_or_else(|| store.read_deadline());
                match tokio::time::timeout(soft, self.read_many(&keys, true)).await {
                    Ok(read) => read,
                    Err(_) => {
                        for key in &keys {
                            store.overdue(key);
                        }
                        let overdue = Error::new(
                            ErrorKind::Store,
                            "the store did not answer by the soft deadline",
                        );
                        keys.iter().map(|_| Err(overdue.clone())).collect()
                    }
                }
            } else {
                self.read_many(&keys, true).await
            }
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
            // An entry without the call's tags would escape their
            // invalidation: loaded again, under the lease.
            let entry =
                entry.filter(|entry| batch.tags().is_none_or(|tags| tags.carried_by(entry)));
            let Some(entry) = entry else {
                load.push((i, Mode::Fleet, None));
                continue;
            };
            match self.judge_entry(&want.storage, &entry, now, options) {
                Judged::Served(fetched, refresh) => {
                    self.keep_read(&want.storage, &fetched.value, &entry, now, ticket, options);
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
}
