//! The read step, so that concurrent callers of one key cost one store read
//! and one load: the near cache (L1) first, then one shared store read per
//! key in this process (each follower with its own deadline), which on a
//! miss hands its followers the key's load.

use std::sync::Arc;

use tokio::time::Instant;

use super::coherence::{Landed, SharedRead};
use super::fill::Mode;
use super::handle::Cache;
use super::options::Options;
use super::tags::TagSet;
use super::value::{Load, Value};
use crate::error::Error;
use crate::flight::{Lead, Role, Turn};
use crate::l1::NearCopy;
use crate::limit::Priority;
use crate::log_limit::show_key;
use crate::served::{Fetched, Served};
use crate::store::Store;

impl<V: Value> Cache<V> {
    /// The key and the near cache: the key checked, and L1 asked (keyed by the user's
    /// key, so a hit builds nothing). With `options`, a fresh copy is also
    /// judged for early refresh, on the store's clock, as a store read is.
    ///
    /// A fresh copy completes without waiting on anything: the caller must
    /// then take tokio's cooperative budget ([`cooperate`](super::pipeline::cooperate)), or a loop of
    /// hits would never let the runtime run its timers and other tasks.
    pub(super) fn near(
        &self,
        user_key: &[u8],
        options: Option<&Options>,
    ) -> Result<Near<V>, Error> {
        self.check_key(user_key)?;
        let Some(l1) = &self.local.l1 else {
            return Ok(Near::Miss);
        };
        // Other processes' writes must reach L1: keep the bus listening.
        self.inner.waiters.ensure_listening(&*self.inner.store);
        let Some(slot) = l1.get(user_key) else {
            return Ok(Near::Miss);
        };
        let now = Instant::now();
        // A listener that missed its heartbeat (its runtime idle) hears
        // nothing: L1 is unverified and a listener starts here.
        if self.inner.waiters.is_stranded(now) {
            self.inner.waiters.stranded(&*self.inner.store);
        }
        if l1.is_fresh(&slot, now) {
            let served = match slot.value {
                Some(_) => Served::L1Hit,
                None => Served::Negative,
            };
            let refresh = options.and_then(|options| self.refresh_due(&slot, options, now));
            let fetched = Fetched {
                value: slot.value.clone(),
                served,
            };
            return Ok(Near::Fresh(fetched, refresh));
        }
        Ok(if slot.is_servable(now) {
            Near::Stale(slot)
        } else {
            Near::Miss
        })
    }

    /// [`near`](Self::near) for a call that names `tags`: a copy of an
    /// entry written with other tags (or none) is no hit for it (it might
    /// escape their invalidation; the store read checks which tags the
    /// entry has). Apart, so untagged calls (the hit path) pay nothing.
    pub(super) fn near_tagged(
        &self,
        user_key: &[u8],
        options: &Options,
        tags: &TagSet,
    ) -> Result<Near<V>, Error> {
        if let Some(l1) = &self.local.l1
            && let Some(slot) = l1.get(user_key)
            && slot.stored.tag_set != tags.hash
        {
            self.check_key(user_key)?;
            return Ok(Near::Miss);
        }
        self.near(user_key, Some(options))
    }

    /// The read: reads the store, shared with the reads of the key already in
    /// the air. With none in the air, the read runs inline in the caller's
    /// task (no task, no shared loader: an uncontended hit is one `GET` and
    /// its decoding); later readers of the key join it. Finding nothing,
    /// the read joins (or starts) the key's load, and its followers wait
    /// on that load too (unless `load_on_miss` is false: then the miss is
    /// the outcome, and each caller goes on to the load step itself): the
    /// leader hands them the load's flight as soon as it has joined it,
    /// so they wait on the flight's own task, not on the leader.
    ///
    /// A follower waits for the leader's read no longer than one store
    /// read deadline ([`Store::read_deadline`]): a leader whose caller
    /// stopped polling it (a `select!` busy elsewhere, a slowly consumed
    /// stream) delays nobody else by more than that; the follower then
    /// reads alone. A leader that goes away (its caller cancelled) hands
    /// nothing down: its followers read again, one of them leading, and a
    /// load already started goes on in its own task.
    ///
    /// `soft`: for a caller that holds a stand-in, when it stops waiting
    /// for the store ([`Store::soft_deadline`]): a store step (its own
    /// read, or the shared read it joined) not done by then ends in
    /// [`ReadEnd::Overdue`]. The key's load, once the read found nothing,
    /// is not a store step: its wait is the load's own.
    pub(super) async fn read_shared<L: Load<V>>(
        &self,
        user_key: &[u8],
        key: &[u8],
        loader: &L,
        options: &Options,
        load_on_miss: bool,
        soft: Option<Instant>,
    ) -> ReadEnd<V> {
        loop {
            let joined = match self.local.reads.lead_or_join(user_key) {
                Turn::Lead(lead) => {
                    return self
                        .read_led(Some(lead), key, loader, options, load_on_miss, soft)
                        .await;
                }
                Turn::Follow(joined) => joined,
            };
            let arrived = Instant::now();
            let _waiting = self.inner.metrics.waiting();
            let within = || self.inner.store.read_deadline();
            // One task keeps every shared read's deadline, not a timer
            // per follower; a follower from another runtime than that
            // task's has its own (boxed: it would grow every read's
            // future, hits included).
            let outcome = if self.local.reads.bound(&joined, within) {
                store_step(soft, joined.outcome_or_late())
                    .await
                    .map(|o| o.map_err(drop))
            } else {
                let step = tokio::time::timeout(within(), joined.outcome());
                store_step(soft, Box::pin(step))
                    .await
                    .map(|o| o.map_err(drop))
            };
            let Some(outcome) = outcome else {
                return ReadEnd::Overdue;
            };
            match outcome {
                // A load that landed before this caller came to it may be
                // one it saw revoked on an earlier pass (the read stays in
                // the air until its leader is polled again): read alone.
                Ok(Some(Ok(SharedRead {
                    loading: Some(load),
                    ..
                }))) if !load.has_landed() => {
                    let result = Box::pin(self.await_fill(key, load, options)).await;
                    return ReadEnd::Loaded(result, Role::Follower);
                }
                Ok(Some(Ok(SharedRead {
                    loading: Some(_), ..
                }))) => {
                    drop(_waiting);
                    // Later callers lead a new shared read.
                    self.local.reads.detach(user_key);
                    return Box::pin(self.read_led(None, key, loader, options, load_on_miss, soft))
                        .await;
                }
                // A read sent more than one store reply before this caller
                // came may have found an entry older than a write that
                // returned before this call began (the read's later steps,
                // its tags and the clear record, kept it in the air): this
                // caller reads alone.
                Ok(Some(Ok(read))) if arrived.saturating_duration_since(read.sent) >= within() => {
                    tracing::debug!(key = %show_key(key), "a shared read was sent too long ago; reading alone");
                    drop(_waiting);
                    self.local.reads.detach(user_key);
                    return Box::pin(self.read_led(None, key, loader, options, load_on_miss, soft))
                        .await;
                }
                Ok(Some(read)) => return ReadEnd::SharedRead(read),
                // The leader went away: read again.
                Ok(None) => {}
                // The leader's read is late (its caller may have stopped
                // polling it): this caller reads alone.
                Err(_) => {
                    tracing::debug!(key = %show_key(key), "a shared read is late; reading alone");
                    drop(_waiting);
                    // Later callers lead a new shared read.
                    self.local.reads.detach(user_key);
                    return Box::pin(self.read_led(None, key, loader, options, load_on_miss, soft))
                        .await;
                }
            }
        }
    }

    /// The read of [`read_shared`](Self::read_shared), led by this caller
    /// (`lead`: the read its followers share; `None`: read alone, for a
    /// follower whose leader is late).
    async fn read_led<L: Load<V>>(
        &self,
        lead: Option<Lead<'_, SharedRead<V>>>,
        key: &[u8],
        loader: &L,
        options: &Options,
        load_on_miss: bool,
        soft: Option<Instant>,
    ) -> ReadEnd<V> {
        let ticket = self.local.ticket();
        let sent = Instant::now();
        // (Dropped when overdue, `lead` with it: its followers read again.)
        let Some(read) = store_step(soft, self.read(key, loader.tags())).await else {
            return ReadEnd::Overdue;
        };
        let entry = match read {
            Ok(entry) => entry.map(Arc::new),
            Err(err) => {
                if let Some(lead) = lead {
                    lead.land_with(|| Err(err.clone()));
                }
                return ReadEnd::SharedRead(Err(err));
            }
        };
        // Nothing in this version: inside a version transition
        // the previous version's entry stands in (judged by the
        // pipeline, which refreshes this version).
        // (Boxed: inline, a second read's state would grow
        // every `get_or_load` future, hits included.)
        let (entry, previous) = match entry {
            Some(entry) => (Some(entry), false),
            None if self.inner.previous.is_some() => {
                match store_step(soft, Box::pin(self.read_previous(key, options))).await {
                    Some(previous) => (previous, true),
                    None => return ReadEnd::Overdue,
                }
            }
            None => (None, false),
        };
        if entry.is_some() || !load_on_miss {
            let read = SharedRead {
                entry,
                loading: None,
                ticket,
                sent,
                previous,
            };
            if let Some(lead) = lead {
                lead.land_with(|| Ok(read.clone()));
            }
            return ReadEnd::SharedRead(Ok(read));
        }
        let (load, role) = self.join_fill(
            key,
            loader.clone(),
            *options,
            None,
            Priority::Foreground,
            Mode::Fleet,
        );
        // The followers wait on the flight itself from here (and so do
        // callers that join this read while the load runs).
        let lead = lead.map(|mut lead| {
            lead.publish(Ok(SharedRead {
                previous: false,
                entry: None,
                loading: Some(load.clone()),
                ticket,
                sent,
            }));
            lead
        });
        // Boxed: its timer would grow every read's future, hits included.
        let result = Box::pin(self.await_fill(key, load, options)).await;
        drop(lead);
        ReadEnd::Loaded(result, role)
    }
}

/// How a shared store read ended for one caller.
pub(super) enum ReadEnd<V> {
    /// Nothing was stored: the key's load, and this caller's part in it
    /// (the leader only if it led the read and the load).
    Loaded(Result<Landed<V>, Error>, Role),
    /// The read's outcome.
    SharedRead(Result<SharedRead<V>, Error>),
    /// The store did not answer by the caller's soft deadline (it holds a
    /// stand-in).
    Overdue,
}

/// A store step of a read: `step`'s outcome, or `None` if `soft` (a
/// caller's soft deadline) came first. Without one, `step` as it is (the
/// timer boxed: it would grow every read's future, hits included).
async fn store_step<T>(soft: Option<Instant>, step: impl Future<Output = T>) -> Option<T> {
    match soft {
        None => Some(step.await),
        Some(at) => Box::pin(tokio::time::timeout_at(at, step)).await.ok(),
    }
}

/// What L1 says about a key.
pub(super) enum Near<V> {
    /// A fresh copy: served as it is; with the `fresh_until` of the entry
    /// an early refresh should replace, if one is due.
    Fresh(Fetched<V>, Option<u64>),
    /// A copy past its fresh time that may still stand in for the store.
    Stale(Arc<NearCopy<V>>),
    /// Nothing usable (or no L1).
    Miss,
}
