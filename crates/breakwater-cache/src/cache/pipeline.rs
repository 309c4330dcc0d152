//! The pipeline of one `get_or_load` (and of `get`): the steps in the order
//! the module docs number them, each in its own file.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::{Instrument, Span};

use super::coherence::{Landed, SharedRead};
use super::fill::Mode;
use super::handle::Cache;
use super::options::Options;
use super::read::{Near, ReadEnd};
use super::trace::{Op, record_failure};
use super::value::{Load, Value};
use super::verdict::{Judged, Refresh};
use crate::entry::Entry;
use crate::error::{Error, ErrorKind};
use crate::flight::Role;
use crate::l1::NearCopy;
use crate::limit::Priority;
use crate::log_limit::{Warning, show_key, warn_limited};
use crate::served::{Fetched, Served, StaleReason};
use crate::store::Store;

impl<V: Value> Cache<V> {
    /// [`get`](Self::get), in its span, after L1 answered `near`.
    pub(super) async fn get_bytes(
        &self,
        key: &[u8],
        near: Result<Near<V>, Error>,
    ) -> Result<Option<V>, Error> {
        if let Near::Fresh(fetched, _) = near? {
            cooperate().await;
            return Ok(fetched.value);
        }
        let key = self.key_in_store(key)?;
        let ticket = self.local.ticket();
        let Some(entry) = self.read(&key, None).await? else {
            return Ok(None);
        };
        if entry.negative || !self.is_fresh(&entry) {
            return Ok(None);
        }
        let Some(value) = self.decode_value(&key, &entry) else {
            return Ok(None);
        };
        let value = Some(value);
        self.keep_read(
            &key,
            &value,
            &entry,
            self.inner.store.now_ms(),
            ticket,
            &self.inner.defaults,
        );
        Ok(value)
    }

    /// [`refresh`](Self::refresh) with any loader, in its span.
    pub(super) async fn refresh_in_span<L: Load<V>>(
        &self,
        key: &[u8],
        loader: L,
    ) -> Result<Fetched<V>, Error> {
        let span = self.span(Op::Refresh, key);
        let done = self
            .refresh_bytes(key, loader, &self.inner.defaults)
            .instrument(span.clone())
            .await;
        if let Err(err) = &done
            && !span.is_disabled()
        {
            record_failure(&span, err);
        }
        done
    }

    /// [`refresh`](Self::refresh): the stored entry read (so
    /// the fill does not take it for done), then the key's fill joined or
    /// started, in the foreground: under the lease, coalesced with a load
    /// of the key in the air here, or with another process's fill.
    async fn refresh_bytes<L: Load<V>>(
        &self,
        key: &[u8],
        loader: L,
        options: &Options,
    ) -> Result<Fetched<V>, Error> {
        let key = self.key_in_store(key)?;
        let (replacing, mode) = match self.read(&key, loader.tags()).await {
            Ok(entry) => (entry.map(|e| e.fresh_until), Mode::Fleet),
            Err(err) => {
                tracing::debug!(key = %show_key(&key), error = %err, "store read failed before a refresh");
                (None, Mode::after(&err))
            }
        };
        let (load, role) = self.join_fill(
            &key,
            loader,
            *options,
            replacing,
            Priority::Foreground,
            mode,
        );
        let (value, served, _) = self.await_fill(&key, load, options).await?;
        // A caller that joined a load already in the air shares its value.
        let served = match (role, served) {
            (Role::Follower, _) => Served::Coalesced,
            (_, served) => served,
        };
        Ok(Fetched { value, served })
    }

    /// The pipeline, counted in `breakwater_requests_total`.
    ///
    /// A fresh L1 copy is served here; everything else goes through
    /// [`pipeline`](Self::pipeline), whose load step is boxed: that part
    /// of the future is large, and inline it would be built, moved and
    /// stored (by every task that awaits a `get_or_load`) on the hit path
    /// too.
    ///
    /// The call's span is made here (nothing is, without a subscriber), and
    /// entered only around the pipeline (see `pipeline_in`): an L1 hit
    /// neither builds nor wraps anything.
    pub(super) async fn fetch<L>(
        &self,
        key: &[u8],
        loader: L,
        options: &Options,
    ) -> Result<Fetched<V>, Error>
    where
        L: Load<V>,
    {
        let near = match loader.tags() {
            Some(tags) => self.near_tagged(key, options, tags),
            None => self.near(key, Some(options)),
        };
        let near_hit = matches!(near, Ok(Near::Fresh(..)));
        if near_hit {
            // A fresh L1 copy waited on nothing: it takes the cooperative
            // budget (see `near`), before it is counted (a call dropped
            // while it yields was not served).
            cooperate().await;
            // Nothing to refresh and no subscriber: served here, counted,
            // and nothing else (no span to make or record).
            if !tracing::dispatcher::has_been_set()
                && let Ok(Near::Fresh(fetched, None)) = near
            {
                let result = Ok(fetched);
                self.count_served(&result);
                return result;
            }
        }
        // A plain L1 hit's span is at `debug`: with an exporter at `info`,
        // hits do not each become an exported span.
        let op = match near {
            Ok(Near::Fresh(_, None)) => Op::GetOrLoadNear,
            _ => Op::GetOrLoad,
        };
        let span = self.span(op, key);
        let result = match near {
            Ok(Near::Fresh(fetched, None)) => Ok(fetched),
            // Early refresh, judged on the L1 copy as on a store read.
            Ok(Near::Fresh(fetched, Some(replacing))) => self.key_in_store(key).map(|storage| {
                if !self.inner.is_throttled(&storage, self.inner.store.now_ms()) {
                    let _in = span.enter();
                    self.refresh_in_background(storage, loader, *options, replacing, true);
                }
                fetched
            }),
            Ok(Near::Stale(slot)) => {
                self.pipeline_in(&span, key, loader, options, Some(slot))
                    .await
            }
            Ok(Near::Miss) => self.pipeline_in(&span, key, loader, options, None).await,
            Err(err) => Err(err),
        };
        self.count_served(&result);
        if !span.is_disabled() {
            match &result {
                Ok(fetched) => {
                    span.record("served", fetched.served.as_str());
                }
                Err(err) => record_failure(&span, err),
            }
        }
        result
    }

    /// [`pipeline`](Self::pipeline) in the call's `span` (the parent of
    /// its child spans) when a subscriber listens; unwrapped otherwise, in
    /// place in the caller's future.
    async fn pipeline_in<L>(
        &self,
        span: &Span,
        user_key: &[u8],
        loader: L,
        options: &Options,
        local_stale: Option<Arc<NearCopy<V>>>,
    ) -> Result<Fetched<V>, Error>
    where
        L: Load<V>,
    {
        if span.is_disabled() {
            self.pipeline(user_key, loader, options, local_stale).await
        } else {
            Box::pin(self.pipeline(user_key, loader, options, local_stale))
                .instrument(span.clone())
                .await
        }
    }

    /// Counts how a request was served (the `served` metric) and the kind
    /// of its error.
    pub(super) fn count_served(&self, result: &Result<Fetched<V>, Error>) {
        let index = match result {
            Ok(fetched) => fetched.served.metric_index(),
            Err(err) => {
                self.inner.metrics.error(err.kind());
                crate::served::SERVED_ERROR
            }
        };
        self.inner.metrics.served(index);
    }

    /// The pipeline past L1; see the module docs for the order.
    /// `local_stale`: an L1 copy past its fresh time that may stand in
    /// while the store is unreachable, or for a failed load (fail-safe).
    ///
    /// A load whose fenced write was refused (see [`Landed`]) answers only the callers that started before its lease
    /// was asked for; a later caller goes through the pipeline again
    /// (reading what the store has now, or joining a newer load). A load it
    /// joins then began after it started (the one it joined first was in
    /// the air when it joined, and a later one starts only once that one has
    /// landed or was detached), except that a shared read still in the air
    /// may hand it the same revoked outcome once more; a third pass then
    /// joins only reads and loads that began after it started. So three
    /// passes are the most a call takes ([`MAX_PASSES`]; were the last one
    /// ever to find a revoked load, the call would fail rather than get the
    /// value).
    pub(super) async fn pipeline<L>(
        &self,
        user_key: &[u8],
        loader: L,
        options: &Options,
        local_stale: Option<Arc<NearCopy<V>>>,
    ) -> Result<Fetched<V>, Error>
    where
        L: Load<V>,
    {
        let key = self.key_in_store(user_key)?;
        let started = Instant::now();
        let mut passes = 1;
        loop {
            let last = passes == MAX_PASSES;
            let pass = self.pass(
                user_key,
                &key,
                &loader,
                options,
                local_stale.as_ref(),
                started,
                last,
            );
            match pass.await {
                Some(result) => return result,
                None => {
                    tracing::debug!(key = %show_key(&key), "the load this call joined was revoked (or its value read) before it started; reading again");
                    passes += 1;
                }
            }
        }
    }

    /// One pass of [`pipeline`](Self::pipeline) for a call that started at
    /// `started`: `None` if it found only a revoked load that began before
    /// it (unless `last`: then that load's outcome is an error).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn pass<L>(
        &self,
        user_key: &[u8],
        key: &[u8],
        loader: &L,
        options: &Options,
        local_stale: Option<&Arc<NearCopy<V>>>,
        started: Instant,
        last: bool,
    ) -> Option<Result<Fetched<V>, Error>>
    where
        L: Load<V>,
    {
        // Read the store (shared with concurrent reads of the key). A
        // miss goes on to the load in the read itself, unless an L1 copy
        // would stand in for a load the fail-safe throttle holds back.
        let load_on_miss =
            local_stale.is_none() || !self.inner.is_throttled(key, self.inner.store.now_ms());
        // A caller with an L1 copy to serve waits for the store no longer
        // than its soft deadline: a stalled store costs it that, not the
        // hard deadline that follows its timeouts.
        let soft = local_stale.map(|_| Instant::now() + self.inner.store.soft_deadline(key));
        let read = self.read_shared(user_key, key, loader, options, load_on_miss, soft);
        let read = match read.await {
            ReadEnd::Overdue => {
                let slot = local_stale?;
                self.inner.store.overdue(key);
                self.inner.metrics.store_overdue();
                warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(key), "the store did not answer by the soft deadline; serving the stale L1 copy");
                return Some(Ok(Fetched {
                    value: slot.value.clone(),
                    served: Served::Stale {
                        reason: StaleReason::StoreUnavailable,
                    },
                }));
            }
            // The read found nothing and waited for the key's load: only
            // the L1 copy can stand in.
            ReadEnd::Loaded(result, role) => {
                let result = revoked_before(result, started, last)?;
                let settled = self.settle(user_key, key, result, role, None, local_stale, options);
                return Some(settled);
            }
            ReadEnd::SharedRead(read) => read,
        };
        let (entry, mode, ticket) = match read {
            Ok(SharedRead {
                entry: Some(old),
                previous: true,
                ..
            }) => {
                // The previous version's value stands in while one
                // background load fills this version; undecodable, it is a
                // miss.
                if let Some(value) = self.previous_value(key, &old) {
                    if !self.inner.is_throttled(key, self.inner.store.now_ms()) {
                        let key = key.to_vec();
                        self.refresh_in_background(key, loader.clone(), *options, 0, false);
                    }
                    return Some(Ok(Fetched {
                        value,
                        served: Served::Stale {
                            reason: StaleReason::PreviousVersion,
                        },
                    }));
                }
                (None, Mode::Fleet, None)
            }
            Ok(read) => (read.entry, Mode::Fleet, read.ticket),
            Err(err) => {
                self.inner.metrics.store_failed("get", &err);
                // A local stale copy stands in: no load at all.
                if let Some(slot) = local_stale {
                    warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(key), error = %err, "store read failed; serving the stale L1 copy");
                    return Some(Ok(Fetched {
                        value: slot.value.clone(),
                        served: Served::Stale {
                            reason: StaleReason::StoreUnavailable,
                        },
                    }));
                }
                // Only a store that cannot be used is passed by: a slow
                // one still holds the fleet's lease (see `Mode::after`).
                let mode = Mode::after(&err);
                match mode {
                    Mode::Local => {
                        warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(key), error = %err, "store read failed and the store cannot be used (breaker open or no connection); loading directly, without writing");
                    }
                    Mode::Fleet => {
                        warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(key), error = %err, "store read failed; loading through the lease (the store answers, slowly)");
                    }
                }
                (None, mode, None)
            }
        };

        // The verdict, on the store's clock.
        let mut fallback: Option<Arc<Entry>> = None;
        // An entry without the call's tags (written by an untagged call)
        // would escape their invalidation: loaded again, under the lease.
        let entry = entry.filter(|entry| loader.tags().is_none_or(|tags| tags.carried_by(entry)));
        if let Some(entry) = entry {
            let now = self.inner.store.now_ms();
            match self.judge_entry(key, &entry, now, options) {
                Judged::Served(fetched, refresh) => {
                    self.keep_read(key, &fetched.value, &entry, now, ticket, options);
                    if let Some(Refresh { replacing, early }) = refresh {
                        let (key, loader) = (key.to_vec(), loader.clone());
                        self.refresh_in_background(key, loader, *options, replacing, early);
                    }
                    return Some(Ok(fetched));
                }
                Judged::Load { stale } => fallback = stale.then_some(entry),
            }
        }

        // Fail-safe on L1 alone: the store has no stand-in (it lost the
        // entry: an eviction, an empty restart, a failover), but L1 does,
        // and the key's loads failed within the throttle: served as a store
        // stale value would be, without calling the loader.
        if fallback.is_none()
            && let Some(slot) = local_stale
            && self.inner.is_throttled(key, self.inner.store.now_ms())
            && let Some(value) = self.local_stand_in(slot, options)
        {
            return Some(Ok(Fetched {
                value,
                served: Served::Stale {
                    reason: StaleReason::LoaderFailed,
                },
            }));
        }

        // The fill, boxed: the load's part of the future is the large one, and
        // a hit (which returned above) would otherwise build and carry it.
        let load = self.wait_for_fill(key.to_vec(), loader.clone(), options, fallback, mode);
        let (result, role, stale) = match Box::pin(load).await {
            Ok(done) => done,
            Err(served) => return Some(served),
        };
        let result = revoked_before(result, started, last)?;
        Some(self.settle(user_key, key, result, role, stale, local_stale, options))
    }
}

/// How many times one call goes through the pipeline when the load it
/// joined turns out revoked (see [`Cache::pipeline`]): what a call joins on
/// its third pass began after it started, so its value is served whatever
/// became of it.
pub(super) const MAX_PASSES: usize = 3;

/// A flight's outcome for a caller that started at `started`: `None` if
/// it is a revoked load whose lease was asked for before then (the caller
/// goes through the pipeline again), unless this is the `last` pass: then
/// an error, never the revoked value. `None` too for a flight abandoned
/// by its task (its runtime shut down) before the last pass.
pub(super) fn revoked_before<V>(
    result: Result<Landed<V>, Error>,
    started: Instant,
    last: bool,
) -> Option<Result<Landed<V>, Error>> {
    match &result {
        // The flight's task went away with its runtime (another runtime's
        // caller led it): load again, on this caller's runtime.
        Err(err) if !last && crate::flight::is_abandoned(err) => None,
        Ok((_, _, Some(asked))) if started > *asked => last.then(|| {
            Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "the key was invalidated during each of the {MAX_PASSES} loads this call waited for; try again"
                ),
            ))
        }),
        _ => Some(result),
    }
}

/// How many L1 hits on a thread take one unit of tokio's cooperative
/// budget. A unit costs about 50 instructions, a twenty-fifth of a whole
/// hit (about 1,250); one per 8 hits still yields a task that only hits L1
/// after 8 × 128 hits, well under a millisecond.
const HITS_PER_BUDGET_UNIT: u8 = 8;

thread_local! {
    static HITS_SINCE_BUDGET: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Takes a unit of tokio's cooperative budget every
/// [`HITS_PER_BUDGET_UNIT`] hits on this thread (yielding if the budget is
/// spent).
pub(super) async fn cooperate() {
    let due = HITS_SINCE_BUDGET.with(|hits| {
        let n = hits.get().wrapping_add(1);
        let due = n >= HITS_PER_BUDGET_UNIT;
        hits.set(if due { 0 } else { n });
        due
    });
    if due {
        tokio::task::coop::consume_budget().await;
    }
}
