//! The fill, so that a key is loaded once across the fleet however many
//! callers miss it, and a value loaded before an invalidation is never
//! written after it: the body of one flight, which takes the lease and
//! loads, or waits to be woken.
//!
//! - **Lease**: try the key's lease (`SET NX PX` with a fresh 128-bit token).
//! - **Lead**: got it: read once more (another process may have filled the key just
//!   before), else lead: read the call's tags' generations, if it named
//!   tags (they are recorded in the entry; unreadable, the value is loaded,
//!   served and not written), inside a version transition pin the previous
//!   version's entry (see `transition`; likewise), run the loader in its
//!   own task, extending the lease
//!   every third of its TTL, bounded by `load_timeout`; write through the
//!   fence.
//! - **Wait**: not got it (the attempt marked the lease as waited on and said how
//!   long the lease has left): watch the key, read once more (the fill may
//!   have happened between the attempt and the watch), then sleep until woken, a
//!   jittered poll, the lease's expiry, or the wait's deadline; on waking
//!   take the entry the fill's message carried (unless it has tags: those
//!   are read from the store, which checks them), or read again, then go back
//!   to the lease. A holder that died stops extending its lease: it runs out, and
//!   the first waiter to try again takes over (one, fleet-wide).
//! - **Deadline**: passed (`lock_wait`; by default `queue_wait + load_timeout + 2 × lease_ttl`,
//!   long enough for a live holder's load and one takeover): the
//!   [`OnLockTimeout`](super::OnLockTimeout) policy, for foreground calls
//!   only. A background refresh never loads without the lease.
//! - **No store**: the lease attempt fails: unless it cannot be used at all
//!   ([`Error::is_unreachable`]), the attempt is made once more with the
//!   same token (a slow store: the first may have taken the lease, and the
//!   script answers "acquired" to its holder; the retry's deadline grew
//!   with the timeout). Failing still, load directly (in-process
//!   single-flight still holds, and the origin's bulkhead caps it), so a
//!   sick Redis degrades to direct loads, never to errors. The
//!   result is served and kept in L1, not written (no fence can tell a
//!   load from before an invalidation then), and the token just tried is
//!   released in case the attempt ran after all. A background refresh does
//!   not load at all then (it gives the token back too).

use std::convert::Infallible;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::{Instant, sleep, sleep_until};
use tracing::{Instrument, Span};

use super::coherence::Landed;
use super::handle::Cache;
use super::lease::{LEASE_RETRY_MARGIN, Lease, LockTimeoutKind, deadline_after, lock_timeout};
use super::loaded::{LoadContext, Loaded, Resolved, StaleValue};
use super::notify::{self, FILLED, Handed, RELEASED, VALUE_IN_MESSAGE_MAX};
use super::options::Options;
use super::seal::stamp;
use super::tags::{AfterLoad, TagSet, counter_ttl};
use super::transition::Pinned;
use super::value::{Load, Value};

use crate::entry::{Entry, Extra, TagStamp};
use crate::error::{Error, ErrorKind};
use crate::flight::{Joined, Role};
use crate::jitter::poll_delay;
use crate::l1::NearCopy;
use crate::l1::Ticket;
use crate::limit::Priority;
use crate::log_limit::show_key;
use crate::log_limit::{Warning, warn_limited};
use crate::served::Fetched;
use crate::served::{Served, StaleReason};
use crate::store::{FencedRenewal, FencedWrite, LeaseAttempt, Renewal, Store};
use tracing::field::Empty;

/// Whether a flight may use the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Lease, wait, write: one load across the fleet.
    Fleet,
    /// The store cannot be used: load in this process only, and do not
    /// write.
    Local,
}

impl Mode {
    /// How to load after the store failed a read with `err`: directly
    /// only if the store cannot be used now (no connection can be had, or
    /// its breaker is open: [`Error::is_unreachable`]). A store that timed
    /// out, or answered with an error, is slow or sick but still the
    /// store: the lease is asked for (with a deadline that grew with the
    /// timeout), so a slow Redis costs no second load in the fleet; if the
    /// lease cannot be had either, the flight loads directly then.
    pub(super) fn after(err: &Error) -> Mode {
        if err.is_unreachable() {
            Mode::Local
        } else {
            Mode::Fleet
        }
    }
}

/// How long a waiter gives the cache's subscription to come up before it
/// relies on polling alone.
pub(super) const SUBSCRIBE_WITHIN: Duration = Duration::from_millis(250);

impl<V: Value> Cache<V> {
    /// One flight: the value for storage key `key`, loaded by this process or
    /// by whichever holds the lease. `replacing` is the `fresh_until` of the
    /// entry an early refresh replaces: that entry does not count as done.
    pub(super) async fn fill<L>(
        self,
        key: Vec<u8>,
        loader: Arc<L>,
        options: Options,
        replacing: Option<u64>,
        priority: Priority,
        mode: Mode,
    ) -> Result<Landed<V>, Error>
    where
        L: Load<V>,
    {
        let inner = &self.inner;
        // A known-down origin is refused before any lease is taken or waited on.
        inner.origin.check()?;
        let ticket = self.local.ticket();
        let background = priority == Priority::Background;
        if mode == Mode::Local {
            // The store just failed this request: one deadline is enough.
            // Load directly, write nothing; single-flight still makes it one
            // load here.
            let (value, load_time, keep, chose_tags) = self
                .load_unwritten(&loader, &key, None, &options, priority)
                .await?;
            let tagged = loader.tags().is_some() || chose_tags;
            self.keep_loaded(&key, &value, load_time, keep, ticket, tagged);
            return Ok((value, Served::Loaded, None));
        }
        let lease_key = inner.lease_key(&key);
        let deadline = deadline_after(inner.lock_wait_for(&options));
        let mut stale: Option<Entry> = None;

        'lease: loop {
            // Lease.
            let token = inner.new_token();
            let lease = Lease {
                key: &lease_key,
                token: &token,
            };
            // The lease's TTL runs from when the store took it, which may
            // be well before the reply: extensions are timed from here.
            let asked = Instant::now();
            let mut attempt = inner
                .store
                .acquire_lease(lease.key, lease.token, inner.lease.lease_ttl)
                .await;
            // No store? A slow one: once more, with the same token.
            if let Err(err) = &attempt
                && !err.is_unreachable()
            {
                inner.metrics.store_failed("acquire_lease", err);
                warn_limited!(inner.logs, Warning::LeaseUnavailable, key = %show_key(&key), error = %err, "lease attempt failed; trying again with the same token");
                attempt = inner
                    .store
                    .acquire_lease(lease.key, lease.token, inner.lease.lease_ttl)
                    .await;
            }
            let lease_left = match attempt {
                Ok(LeaseAttempt::Acquired) => {
                    inner.metrics.lease("acquired");
                    Span::current().record("lease", "acquired");
                    // Lead: double-check first. What the load replaces
                    // (shown to a context loader, kept by "not modified")
                    // is only what this read, under the lease, found: an
                    // entry seen while waiting may have been invalidated
                    // since.
                    let mut seen = None;
                    if let Some(landed) = self
                        .coalesced(&key, &mut seen, &options, replacing, ticket, loader.tags())
                        .await
                    {
                        let message = notify::message(FILLED, inner.waiters.sender(), &key);
                        let _ = inner
                            .store
                            .release_lease(lease.key, lease.token, inner.notice(&message))
                            .await;
                        return Ok(landed);
                    }
                    let (value, revoked) = self
                        .lead(
                            &key,
                            lease,
                            asked,
                            &loader,
                            seen.as_ref(),
                            &options,
                            priority,
                            ticket,
                        )
                        .await?;
                    return Ok((value, Served::Loaded, revoked.then_some(asked)));
                }
                Ok(LeaseAttempt::Held { ttl }) => {
                    inner.metrics.lease("busy");
                    Span::current().record("lease", "busy");
                    ttl
                }
                Err(err) => {
                    inner.metrics.store_failed("acquire_lease", &err);
                    Span::current().record("lease", "unavailable");
                    if background {
                        // Never a load outside the lease in the background;
                        // the token just tried is given back, in case the
                        // attempt ran (a lost reply), so waiters elsewhere
                        // need not sit out the lease TTL.
                        self.release(&key, lease).await;
                        return Err(err);
                    }
                    // No store: load directly, write nothing.
                    warn_limited!(inner.logs, Warning::LeaseUnavailable, key = %show_key(&key), error = %err, "lease unavailable; loading directly");
                    let value = self
                        .load_direct(&key, lease, &loader, &options, priority, ticket)
                        .await?;
                    return Ok((value, Served::Loaded, None));
                }
            };
            // Try again just after the lease runs out: a dead holder's lease
            // is not extended, and its expiry is the takeover.
            let retry_at = deadline_after(lease_left.saturating_add(LEASE_RETRY_MARGIN));

            // Wait to be woken.
            let watch = inner
                .waiters
                .watch(&*inner.store, &key, SUBSCRIBE_WITHIN)
                .await;
            // Polls read the store (a fill whose message was lost) but do
            // not take the lease: before the expiry seen, a free lease was
            // lost (evicted, deleted), not given back (that says so on the
            // bus, which wakes this waiter), and its holder may be loading
            // still. Taking it at every poll let each waiting process start
            // a load beside it (4 at once, 4 processes); so a lost lease
            // costs one takeover, when its holder's write is refused (which
            // says so on the bus) or at its expiry. Without the bus, polls
            // take the lease as before.
            loop {
                let mut woken = pin!(watch.notify().notified());
                woken.as_mut().enable();
                if let Some(landed) = self
                    .coalesced(&key, &mut stale, &options, replacing, ticket, loader.tags())
                    .await
                {
                    return Ok(landed);
                }
                if Instant::now() >= deadline {
                    break 'lease;
                }
                let poll = {
                    let mut rng = inner.rng.lock().unwrap_or_else(|p| p.into_inner());
                    let every = inner
                        .lease
                        .lock_poll
                        .saturating_mul(options.poll_scale)
                        .min(inner.lease.lease_ttl.max(inner.lease.lock_poll));
                    poll_delay(every, &mut *rng)
                };
                tokio::select! {
                    biased;
                    () = woken => {
                        // Hit-for-pass: the load this waiter joined (the lease
                        // was held when it asked, at `asked`) failed, or its
                        // value was not to be cached: that is the outcome,
                        // not a free lease to load again.
                        match watch.handed() {
                            Some(Handed::Failed(kind)) => return Err(handed_failure(kind)),
                            Some(Handed::Passed(bytes)) => {
                                if let Some(value) = self.decode(&key, bytes).and_then(|e| self.entry_value(&key, &e)) {
                                    return Ok((value, Served::Coalesced, Some(asked)));
                                }
                            }
                            None => {}
                        }
                        // The fill's message may carry the entry: no read then.
                        // A tagged one is read from the store instead, which
                        // checks its tags' generations.
                        let carried = watch.filled().and_then(|bytes| self.carried(&key, bytes));
                        // A carried entry is judged at once: it answers every
                        // caller of the flight.
                        let landed = match carried {
                            Some(entry) => self.fresh_entry(&key, entry, &mut stale, &options, replacing, ticket, loader.tags()).map(|value| (value, Served::Coalesced, None)),
                            None => self.coalesced(&key, &mut stale, &options, replacing, ticket, loader.tags()).await,
                        };
                        if let Some(landed) = landed {
                            return Ok(landed);
                        }
                        continue 'lease;
                    }
                    () = sleep_until(deadline) => continue 'lease,
                    () = sleep_until(retry_at) => continue 'lease,
                    // Without a bus nothing would say the lease was given
                    // back: a poll tries it, as before.
                    () = sleep(poll) => if !watch.hears() {
                        continue 'lease;
                    },
                }
            }
        }

        // Deadline: the lock-wait policy.
        let waited = inner.lock_wait_for(&options);
        if background {
            return Err(lock_timeout(waited));
        }
        match inner.lease.on_lock_timeout.0 {
            LockTimeoutKind::LoadAnyway => {
                warn_limited!(inner.logs, Warning::LockWaitLoadAnyway, key = %show_key(&key), ?waited, "lease held past lock_wait; loading anyway (not written)");
                // No lease: nothing read under one to show the loader.
                let (value, ..) = self
                    .load_unwritten(&loader, &key, None, &options, priority)
                    .await?;
                Ok((value, Served::Loaded, None))
            }
            LockTimeoutKind::ServeStale => match stale.and_then(|e| self.entry_value(&key, &e)) {
                Some(value) => Ok((
                    value,
                    Served::Stale {
                        reason: StaleReason::LockTimeout,
                    },
                    None,
                )),
                None => Err(lock_timeout(waited)),
            },
            LockTimeoutKind::Error => Err(lock_timeout(waited)),
        }
    }

    /// Which callers a value read from the store at `sent` answers (see
    /// [`Landed`]): those that started within one store read deadline of
    /// the read. The read's later steps (its tags, the clear record) can
    /// keep it in the air long after the store answered; a caller that
    /// joined the flight later could get an entry older than a write that
    /// returned before it began, and reads again instead (seed 1093).
    pub(super) fn read_answers(&self, sent: Instant) -> Option<Instant> {
        Some(sent + self.inner.store.read_deadline())
    }

    /// Holding the lease (requested at `asked`): load, keep the lease
    /// alive, write through the fence (or release the lease on failure).
    /// With the value, whether the fence refused it (the lease was revoked
    /// during the load: see [`Landed`]).
    #[allow(clippy::too_many_arguments)]
    async fn lead<L>(
        &self,
        key: &[u8],
        lease: Lease<'_>,
        asked: Instant,
        loader: &Arc<L>,
        replaces: Option<&Entry>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) -> Result<(Option<V>, bool), Error>
    where
        L: Load<V>,
    {
        let inner = &self.inner;
        // What the entry records, read before the loader runs: its tags'
        // generations (a tag invalidated from now on leaves it invalid) and,
        // inside a version transition, the previous version's entry, pinned
        // (a change to it from now on leaves it invalid: see `transition`).
        // Unreadable: nothing to record: load, serve and keep in L1, write
        // nothing (as a direct load); the lease goes first, so waiters need
        // not wait for this load.
        let recorded = match self.recorded(key, loader, options).await {
            // A slow store: once more (the lease is held).
            Err((op, err)) if !err.is_unreachable() => {
                tracing::debug!(key = %show_key(key), op, error = %err, "what the entry records could not be read; trying again");
                self.recorded(key, loader, options).await
            }
            other => other,
        };
        let (tags, pinned, namespace) = match recorded {
            Ok(recorded) => recorded,
            Err((op, err)) => {
                warn_limited!(inner.logs, Warning::StoreRead, key = %show_key(key), op, error = %err, "what the entry records could not be read; loading without writing");
                inner.metrics.store_failed(op, &err);
                self.release(key, lease).await;
                let (value, load_time, keep, chose_tags) = self
                    .load_unwritten(loader, key, replaces, options, priority)
                    .await?;
                let tagged = loader.tags().is_some() || chose_tags;
                self.keep_loaded(key, &value, load_time, keep, ticket, tagged);
                return Ok((value, false));
            }
        };
        let context = self.context::<L>(key, replaces);
        let after = AfterLoad::starting(inner.store.now_ms());
        let mut load = pin!(inner.origin.load(
            loader,
            context,
            options.load_timeout,
            priority,
            &inner.metrics
        ));
        // Kept alive beside the load, from when it was requested (the
        // re-read and the tags' generations came in between): an extension
        // in the air never holds up the load's end.
        let done = [AtomicBool::new(false)];
        let result = tokio::select! {
            biased;
            result = &mut load => result,
            never = self.keep_alive(std::slice::from_ref(&lease), &done, asked) => match never {},
        };
        match result {
            Ok((loaded, load_time)) => {
                let recorded = (tags, pinned.as_ref(), namespace);
                self.write_loaded(
                    key, lease, loaded, load_time, replaces, options, ticket, recorded, &after,
                )
                .await
            }
            Err(err) => {
                self.release_failed(key, lease, &err).await;
                Err(err)
            }
        }
    }

    /// Holding the lease, settles a loader's answer (`loaded`, after
    /// `load_time`): its choices over the call's settings (checked: one out
    /// of bounds releases the lease and fails the load), "do not cache"
    /// (served, the lease released), "not modified" (the entry it replaces
    /// renewed), or a value written through the fence, recording `tags`
    /// and `pinned` (see [`write_fenced`](Self::write_fenced)), and the
    /// tags the loader chose, read after the load (`after`: when it began;
    /// see [`stamp_chosen`](Self::stamp_chosen)). With the value, whether
    /// the fence refused it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn write_loaded(
        &self,
        key: &[u8],
        lease: Lease<'_>,
        loaded: Loaded<V>,
        load_time: Duration,
        replaces: Option<&Entry>,
        options: &Options,
        ticket: Option<Ticket>,
        (tags, pinned, namespace): (Vec<TagStamp>, Option<&Pinned>, Option<u64>),
        after: &AfterLoad,
    ) -> Result<(Option<V>, bool), Error> {
        // The value's windows count from now, when its load ended, not from
        // when it is written: the steps between (its chosen tags' read, a
        // declined renewal) may take a store reply each.
        let loaded_ms = after.ended_ms.unwrap_or_else(|| self.inner.store.now_ms());
        let call = *options;
        let resolved = match loaded.resolve(options) {
            Ok(resolved) => resolved,
            Err(err) => {
                self.release(key, lease).await;
                return Err(err);
            }
        };
        // The value, its settings, its extensions, the tags its loader
        // chose and, for "not modified", the entry it keeps and the grace.
        let (value, options, extra, chosen, unchanged) = match resolved {
            Resolved::Write {
                value,
                keep,
                extra,
                tags,
            } => (value, keep, extra, tags, None),
            Resolved::Unchanged {
                keep,
                grace_ms,
                tags: chosen,
            } => {
                let Some((entry, value)) = self.unchanged_value(key, replaces) else {
                    self.release(key, lease).await;
                    return Err(unchanged_without_value());
                };
                // The value stands, and so do the tags its loader chose
                // for it before, unless it chose others now.
                let chosen = match chosen.is_empty() {
                    true => entry
                        .tags
                        .iter()
                        .filter(|s| !s.tag.is_empty() && !tags.iter().any(|t| t.tag == s.tag))
                        .map(|s| s.tag.clone())
                        .collect(),
                    false => chosen,
                };
                let grace_ms = grace_ms.or(entry.extra.grace_ms());
                let validator = entry.extra.validator().map(Box::from);
                let extra = Extra::new(validator, grace_ms);
                (value, keep, extra, chosen, Some((entry, grace_ms)))
            }
        };
        let Some(options) = options else {
            // Not to be cached: served, not written; the waiters that
            // joined the load are handed the value (or told the lease is
            // free).
            self.release_passed(key, lease, value.as_ref(), load_time, &call, loaded_ms)
                .await;
            return Ok((value, false));
        };
        let tags = match self
            .stamp_chosen(key, &tags, &chosen, after, &options)
            .await
        {
            Ok(Some(tags)) => tags,
            // A chosen tag changed since the load began: served and kept
            // in L1 (where its invalidation reaches it), not written.
            Ok(None) => {
                self.release(key, lease).await;
                self.keep_unwritten(key, &value, load_time, &options, ticket, true, loaded_ms);
                return Ok((value, false));
            }
            Err(err) => {
                self.release(key, lease).await;
                return Err(err);
            }
        };
        // "Not modified": a renewal changes the windows alone: the entry
        // must already record what this write would (the same tags'
        // generations, the same grace), and, inside a version transition,
        // the write must also find the previous version's entry unchanged;
        // otherwise (or declined: the entry is gone or was rewritten, the
        // lease still ours) the value the loader saw, written whole.
        if let Some((entry, grace_ms)) = unchanged {
            let renewable = pinned.is_none()
                && entry.tags[..] == tags[..]
                && grace_ms == entry.extra.grace_ms()
                && namespace == entry.extra.namespace();
            if renewable
                && let Some(revoked) = self
                    .renew(key, lease, entry, &value, &options, ticket, loaded_ms)
                    .await
            {
                return Ok((value, revoked));
            }
        }
        let revoked = self
            .write_fenced(
                key,
                lease,
                value.as_ref(),
                load_time,
                &options,
                ticket,
                tags,
                pinned,
                extra.in_namespace(namespace),
                loaded_ms,
            )
            .await?;
        Ok((value, revoked))
    }

    /// The value a "not modified" keeps: the entry the load replaced and
    /// what it stands for; `None` if there was none (or it does not
    /// decode).
    fn unchanged_value<'e>(
        &self,
        key: &[u8],
        replaces: Option<&'e Entry>,
    ) -> Option<(&'e Entry, Option<V>)> {
        let entry = replaces?;
        Some((entry, self.entry_value(key, entry)?))
    }

    /// Holding the lease, renews `entry` (what the store held when the
    /// load began) as a "not modified" answer asks: a new fresh window
    /// from `options` written over the stored header's windows
    /// ([`Store::fenced_renew`]), the lease released and "filled"
    /// published, atomically; the value is not encoded or sent again.
    /// `Some(revoked)` when that is settled (renewed, refused because the
    /// lease was revoked, or a store failure: the callers get the value);
    /// `None` when the store declined (the entry is gone or was rewritten,
    /// or the backend cannot renew) and the lease is still held. The new
    /// windows count from `now` (store-clock ms, when the load ended).
    #[allow(clippy::too_many_arguments)]
    async fn renew(
        &self,
        key: &[u8],
        lease: Lease<'_>,
        entry: &Entry,
        value: &Option<V>,
        options: &Options,
        ticket: Option<Ticket>,
        now: u64,
    ) -> Option<bool> {
        let inner = &self.inner;
        let (fresh_until, stale_until) = self.windows(entry.negative, options, now);
        let patch = Entry::windows_patch(fresh_until, stale_until);
        let expected = entry.header_tail();
        let message = notify::message(FILLED, inner.waiters.sender(), key);
        let renewal = FencedRenewal {
            key,
            offset: Entry::WINDOWS_AT,
            expected: &expected,
            patch: &patch,
            ttl: Duration::from_millis(stale_until.saturating_sub(now).max(1)),
            lease_key: lease.key,
            token: lease.token,
            notice: inner.notice(&message),
        };
        let renewed = inner
            .store
            .fenced_renew(renewal)
            .instrument(tracing::debug_span!("breakwater.store.fenced_renew"))
            .await;
        match renewed {
            Ok(Renewal::Renewed) => {
                inner.clear_throttle(key);
                inner.metrics.lease("renewed");
                Span::current().record("written", true);
                let mut renewed = stamp(entry);
                renewed.fresh_until = fresh_until;
                renewed.stale_until = stale_until;
                self.keep_renewed(key, value.clone(), renewed, ticket);
                Some(false)
            }
            Ok(Renewal::Refused) => {
                tracing::debug!(
                    key = %show_key(key),
                    "lease revoked (invalidated or expired) during the load; not renewed"
                );
                inner.metrics.lease("revoked");
                Some(true)
            }
            Ok(_) => None,
            Err(err) => {
                // As a failed write: the callers get the value; the lease
                // runs out on its own if the renewal did not land.
                warn_limited!(inner.logs, Warning::StoreWrite, key = %show_key(key), error = %err, "store renewal failed; returning the value");
                inner.metrics.store_failed("fenced_renew", &err);
                Some(false)
            }
        }
    }

    /// What a load's entry records, read before its loader runs: the call's
    /// tags' generations and, inside a version transition, the previous
    /// version's entry, pinned. On failure, the store operation that failed.
    async fn recorded<L: Load<V>>(
        &self,
        key: &[u8],
        loader: &Arc<L>,
        options: &Options,
    ) -> Result<(Vec<TagStamp>, Option<Pinned>, Option<u64>), (&'static str, Error)> {
        let namespace = self
            .clear_generation()
            .await
            .map_err(|err| ("clear_record", err))?;
        let namespace = Some(namespace);
        let tags = match loader.tags() {
            None => Vec::new(),
            Some(tags) => self
                .tag_generations(tags)
                .await
                .map_err(|err| ("tag_generations", err))?,
        };
        let pinned = self
            .pin_previous(key, counter_ttl(options))
            .await
            .map_err(|err| ("pin", err))?;
        Ok((tags, pinned, namespace))
    }

    /// Keeps `leases` (requested at `asked`) alive while the work they
    /// fence goes on beside it: every third of the lease TTL from `asked`
    /// (two chances before one runs out), each lease not yet `done` is
    /// extended, side by side. A lease found gone (a load slower than the
    /// lease, or a store that did not answer) is counted lost and not
    /// extended again: its result will not be written. Never ends.
    pub(super) async fn keep_alive(
        &self,
        leases: &[Lease<'_>],
        done: &[AtomicBool],
        asked: Instant,
    ) -> Infallible {
        let inner = &self.inner;
        let every = inner.lease.lease_ttl / 3;
        let mut extend = tokio::time::interval_at(asked + every, every);
        extend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            extend.tick().await;
            let alive: Vec<usize> = (0..leases.len())
                .filter(|&i| !done[i].load(Ordering::Acquire))
                .collect();
            let extended = join_all(alive.iter().map(|&i| {
                let lease = leases[i];
                inner
                    .store
                    .extend_lease(lease.key, lease.token, inner.lease.lease_ttl)
            }))
            .await;
            let mut lost = 0;
            for (&i, extended) in alive.iter().zip(extended) {
                match extended {
                    Ok(true) => {}
                    // Gone, and not because its write has just landed.
                    Ok(false) if !done[i].swap(true, Ordering::AcqRel) => {
                        lost += 1;
                        inner.metrics.lease("lost");
                    }
                    Ok(false) => {}
                    Err(err) => {
                        warn_limited!(inner.logs, Warning::LeaseExtension, key = %show_key(leases[i].key), error = %err, "lease extension failed")
                    }
                }
            }
            if lost > 0 {
                warn_limited!(inner.logs, Warning::LeaseLost, keys = lost, origin = %inner.origin.name(), "lease lost while loading (a load slower than the lease, or a store that did not answer); the result will not be written");
            }
        }
    }

    /// The lease could not be tried (the store failed): load and serve,
    /// write nothing. A fence cannot make this write safe: the lease
    /// attempt may still be on its way and run *after* an invalidation that
    /// began after this load, and then its token would pass the fence with
    /// a value loaded before. The attempt's token is released in the
    /// background (a no-op unless the attempt ran: nobody else holds this
    /// token), so a lost reply does not leave the lease held. L1 keeps the
    /// value under the usual epoch rule.
    async fn load_direct<L>(
        &self,
        key: &[u8],
        lease: Lease<'_>,
        loader: &Arc<L>,
        options: &Options,
        priority: Priority,
        ticket: Option<Ticket>,
    ) -> Result<Option<V>, Error>
    where
        L: Load<V>,
    {
        let (value, load_time, keep, chose_tags) = self
            .load_unwritten(loader, key, None, options, priority)
            .await?;
        let cache = self.clone();
        let (key_owned, lease_key, token) =
            (key.to_vec(), lease.key.to_vec(), lease.token.to_vec());
        tokio::spawn(async move {
            let lease = Lease {
                key: &lease_key,
                token: &token,
            };
            cache.release(&key_owned, lease).await;
        });
        let tagged = loader.tags().is_some() || chose_tags;
        self.keep_loaded(key, &value, load_time, keep, ticket, tagged);
        Ok(value)
    }

    /// [`keep_unwritten`](Self::keep_unwritten) for a value loaded just
    /// now (its windows count from now), if it is to be kept (`keep`: its
    /// settings; `None` for "do not cache").
    fn keep_loaded(
        &self,
        key: &[u8],
        value: &Option<V>,
        load_time: Duration,
        keep: Option<Options>,
        ticket: Option<Ticket>,
        tagged: bool,
    ) {
        if let Some(options) = keep {
            let now = self.inner.store.now_ms();
            self.keep_unwritten(key, value, load_time, &options, ticket, tagged, now);
        }
    }

    /// A value loaded while the store is unusable: the load succeeded, so
    /// the fail-safe throttle is lifted (as a written load lifts it); L1
    /// keeps it (a shield while the store is away, under the epoch rule);
    /// the store does not. `tagged`: the call named tags (see `drop_tagged`).
    /// `now`: the store-clock ms its windows count from, when its load
    /// ended (a store reply in between must not make it fresh for longer;
    /// seed 1074).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn keep_unwritten(
        &self,
        key: &[u8],
        value: &Option<V>,
        load_time: Duration,
        options: &Options,
        ticket: Option<Ticket>,
        tagged: bool,
        now: u64,
    ) {
        self.inner.clear_throttle(key);
        if let Ok(mut sealed) = self.seal(key, value.as_ref(), load_time, options, now) {
            // No generations were recorded (nothing is written), but the
            // copy is of a tagged call: a tag invalidation must drop it.
            sealed.stamp.tagged = tagged;
            // Which tags is not recorded: no tagged call takes it from L1.
            if tagged {
                sealed.stamp.tag_set = u64::MAX;
            }
            self.keep_written(key, value.clone(), &sealed, ticket);
        }
    }

    /// Loads without touching the store: the value, how long the load
    /// took, and the settings it is kept with (`None`: the loader said
    /// "do not cache").
    async fn load_unwritten<L>(
        &self,
        loader: &Arc<L>,
        key: &[u8],
        replaces: Option<&Entry>,
        options: &Options,
        priority: Priority,
    ) -> Result<(Option<V>, Duration, Option<Options>, bool), Error>
    where
        L: Load<V>,
    {
        let inner = &self.inner;
        let context = self.context::<L>(key, replaces);
        let (loaded, load_time) = inner
            .origin
            .load(
                loader,
                context,
                options.load_timeout,
                priority,
                &inner.metrics,
            )
            .await?;
        let (value, keep, chose_tags) = self.unwritten_answer(key, loaded, replaces, options)?;
        Ok((value, load_time, keep, chose_tags))
    }

    /// A loader's answer (`loaded`) where nothing is written: the value
    /// (for "not modified", the one `replaces` holds) and the settings it
    /// is kept in L1 with (`None`: "do not cache"), and whether the loader
    /// chose tags (an L1 copy must then be dropped by tag invalidations).
    pub(super) fn unwritten_answer(
        &self,
        key: &[u8],
        loaded: Loaded<V>,
        replaces: Option<&Entry>,
        options: &Options,
    ) -> Result<(Option<V>, Option<Options>, bool), Error> {
        let resolved = loaded.resolve(options)?;
        let chose_tags = !resolved.tags().is_empty();
        match resolved {
            Resolved::Write { value, keep, .. } => Ok((value, keep, chose_tags)),
            Resolved::Unchanged { keep, .. } => match self.unchanged_value(key, replaces) {
                Some((entry, value)) => {
                    let tagged = chose_tags || entry.tags.iter().any(|s| !s.tag.is_empty());
                    Ok((value, keep, tagged))
                }
                None => Err(unchanged_without_value()),
            },
        }
    }

    /// What a loader of type `L` sees: for a context loader, the entry its
    /// load replaces (`replaces`: stale, or fresh for an early refresh),
    /// decoded; nothing for a plain loader (no decode is paid for it).
    fn context<L: Load<V>>(&self, key: &[u8], replaces: Option<&Entry>) -> LoadContext<V> {
        self.context_if(L::READS_CONTEXT, key, replaces)
    }

    /// [`context`](Self::context), for a loader that `reads` it.
    pub(super) fn context_if(
        &self,
        reads: bool,
        key: &[u8],
        replaces: Option<&Entry>,
    ) -> LoadContext<V> {
        if !reads {
            return LoadContext::empty();
        }
        let Some((entry, value)) =
            replaces.and_then(|entry| Some((entry, self.entry_value(key, entry)?)))
        else {
            return LoadContext::empty();
        };
        let now = self.inner.store.now_ms();
        let expired_for =
            (now >= entry.fresh_until).then(|| Duration::from_millis(now - entry.fresh_until));
        let validator = entry.extra.validator().map(Box::from);
        LoadContext::replacing(StaleValue::new(value, expired_for, validator))
    }

    /// Seals a loaded value and writes it only while `lease` is held (the
    /// one fence every load's write goes through), releasing the lease and
    /// publishing "filled" atomically; keeps it in L1 unless the key was
    /// invalidated since `ticket`. A value that cannot be sealed releases the
    /// lease (waiters are told) and fails, except one too large to cache,
    /// which is returned unwritten. `tags`: the tags' generations read
    /// before the load, recorded in the entry; `pinned`: inside a version
    /// transition, the previous version's entry it was loaded beside (its
    /// stamp recorded, and the write made only while it is unchanged).
    /// `now`: the store-clock ms its windows count from (when its load
    /// ended). `Ok(true)` if the fence refused the write: the lease was
    /// revoked (an invalidation or `set`) or had run out while the value
    /// was loaded.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn write_fenced(
        &self,
        key: &[u8],
        lease: Lease<'_>,
        value: Option<&V>,
        load_time: Duration,
        options: &Options,
        ticket: Option<Ticket>,
        mut tags: Vec<TagStamp>,
        pinned: Option<&Pinned>,
        extra: Extra,
        now: u64,
    ) -> Result<bool, Error> {
        let inner = &self.inner;
        if let Some(pinned) = pinned {
            tags.insert(0, pinned.stamp());
        }
        let sealed = match self.seal_tagged(key, value, load_time, options, tags, now, extra) {
            Ok(sealed) => sealed,
            Err(err) => {
                self.release(key, lease).await;
                // Too large to cache: the callers still get the value.
                return if err.is_too_large() {
                    Ok(false)
                } else {
                    Err(err)
                };
            }
        };
        inner.clear_throttle(key);
        let message = notify::message(FILLED, inner.waiters.sender(), key);
        let value_message = (sealed.bytes.len() <= VALUE_IN_MESSAGE_MAX)
            .then(|| notify::value_message(inner.waiters.sender(), key))
            .flatten();
        let write = FencedWrite {
            key,
            value: &sealed.bytes,
            ttl: sealed.ttl,
            lease_key: lease.key,
            token: lease.token,
            notice: inner.notice(&message),
            value_notice: value_message.as_deref(),
            unchanged: pinned.map(Pinned::unchanged),
        };
        let written = inner
            .store
            .fenced_set(write)
            .instrument(tracing::debug_span!("breakwater.store.fenced_set"))
            .await;
        Span::current().record("written", matches!(written, Ok(true)));
        // Only a refusal the store answered counts: a write whose reply was
        // lost may have landed, and with the store unreachable a caller that
        // read again would load again (one more load per cut-off process).
        let revoked = matches!(written, Ok(false));
        match written {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(
                    key = %show_key(key),
                    "lease revoked (invalidated or expired) during the load; not written"
                );
                inner.metrics.lease("revoked");
                // A lease that was lost (evicted, deleted by hand) rather
                // than revoked by a write says nothing on the bus: its
                // waiters, which no longer take a lease at their polls
                // (see `fill`), are told it is free, so one takes over now
                // rather than at the expiry it had.
                let released = notify::message(RELEASED, inner.waiters.sender(), key);
                let notice = inner.notice(&released);
                if let Err(err) = inner.store.publish(notice.channel, notice.message).await {
                    tracing::debug!(key = %show_key(key), error = %err, "a refused write's waiters were not told");
                }
            }
            Err(err) => {
                warn_limited!(inner.logs, Warning::StoreWrite, key = %show_key(key), error = %err, "store write failed; returning the loaded value");
                inner.metrics.store_failed("fenced_set", &err);
            }
        }
        // L1 follows the epoch rule: an invalidation since `ticket` keeps
        // this value out. A refused write keeps it out too: the lease was
        // revoked by an invalidation this process may not have heard of yet.
        // (A lost reply keeps it in: L1 is the shield while the store is
        // unreachable.)
        if !revoked {
            self.keep_written(key, value.cloned(), &sealed, ticket);
        }
        Ok(revoked)
    }

    /// Gives the lease up without a value and tells its waiters.
    pub(super) async fn release(&self, key: &[u8], lease: Lease<'_>) {
        let message = notify::message(RELEASED, self.inner.waiters.sender(), key);
        self.release_with(key, lease, &message).await;
    }

    /// Gives the lease up after the load failed with `err`: if that is
    /// the key's outcome (the loader's error or its timeout), the waiters
    /// that joined the load are handed it ([`notify::FAILED`]), so they do
    /// not take the lease and fail one process after another; otherwise
    /// as [`release`](Self::release).
    async fn release_failed(&self, key: &[u8], lease: Lease<'_>, err: &Error) {
        let sender = self.inner.waiters.sender();
        match notify::failure_code(err.kind())
            .and_then(|code| Some((code, notify::carrying(notify::FAILED, sender, key)?)))
        {
            Some((code, mut message)) => {
                message.push(code);
                self.release_with(key, lease, &message).await;
            }
            None => self.release(key, lease).await,
        }
    }

    /// Gives the lease up after a load whose `value` is not to be cached:
    /// the waiters that joined the load are handed it, sealed as an entry
    /// with the call's `options` ([`notify::PASSED`]; up to
    /// [`VALUE_IN_MESSAGE_MAX`], else as [`release`](Self::release)).
    async fn release_passed(
        &self,
        key: &[u8],
        lease: Lease<'_>,
        value: Option<&V>,
        load_time: Duration,
        options: &Options,
        now: u64,
    ) {
        let sender = self.inner.waiters.sender();
        let message = self
            .seal(key, value, load_time, options, now)
            .ok()
            .filter(|sealed| sealed.bytes.len() <= VALUE_IN_MESSAGE_MAX)
            .and_then(|sealed| {
                let mut message = notify::carrying(notify::PASSED, sender, key)?;
                message.extend_from_slice(&sealed.bytes);
                Some(message)
            });
        match message {
            Some(message) => self.release_with(key, lease, &message).await,
            None => self.release(key, lease).await,
        }
    }

    /// Gives the lease up, publishing `message`.
    async fn release_with(&self, key: &[u8], lease: Lease<'_>, message: &[u8]) {
        let inner = &self.inner;
        if let Err(err) = inner
            .store
            .release_lease(lease.key, lease.token, inner.notice(message))
            .await
        {
            warn_limited!(inner.logs, Warning::LeaseRelease, key = %show_key(key), error = %err, "lease release failed; it expires on its own");
        }
    }

    /// Reads `key`; the value if fresh and not the entry being replaced (an
    /// early refresh replaces an entry that is still fresh), landed as a
    /// value another holder's fill left: it answers only the callers that
    /// started within one store read deadline of the read (see
    /// `read_answers`). A readable entry that is no longer fresh but may
    /// still be served is kept in `stale` for the lock-wait policy.
    async fn coalesced(
        &self,
        key: &[u8],
        stale: &mut Option<Entry>,
        options: &Options,
        replacing: Option<u64>,
        ticket: Option<Ticket>,
        tags: Option<&TagSet>,
    ) -> Option<Landed<V>> {
        let sent = Instant::now();
        let entry = match self.read(key, tags).await {
            Ok(Some(entry)) => entry,
            Ok(None) => return None,
            Err(err) => {
                tracing::debug!(key = %show_key(key), error = %err, "store read failed while waiting");
                return None;
            }
        };
        let value = self.fresh_entry(key, entry, stale, options, replacing, ticket, tags)?;
        Some((value, Served::Coalesced, self.read_answers(sent)))
    }
}

impl<V: Value> Cache<V> {
    /// The fill, for one caller, past a read that served nothing: one
    /// flight per key in this process; the flight takes the lease, loads
    /// and writes (see `fill`), or, in [`Mode::Local`] (the store cannot
    /// be used), loads directly. A soft timeout gives up waiting (not
    /// loading) when there is a stale value (`fallback`) to serve: that is
    /// `Err` (served at once); else the flight's outcome, this call's role
    /// in it and the stale stand-in, to settle.
    #[allow(clippy::type_complexity)]
    pub(super) async fn wait_for_fill<L>(
        &self,
        key: Vec<u8>,
        loader: L,
        options: &Options,
        fallback: Option<Arc<Entry>>,
        mode: Mode,
    ) -> Result<(Result<Landed<V>, Error>, Role, Option<Arc<Entry>>), Result<Fetched<V>, Error>>
    where
        L: Load<V>,
    {
        let (result, role) = {
            let (load, role) =
                self.join_fill(&key, loader, *options, None, Priority::Foreground, mode);
            let metrics = &self.inner.metrics;
            let key = &key;
            let flight = async move {
                let _waiting = (role == Role::Follower).then(|| metrics.waiting());
                (self.await_fill(key, load, options).await, role)
            };
            match (options.soft_timeout, &fallback) {
                (Some(soft), Some(stale)) => match tokio::time::timeout(soft, flight).await {
                    Ok(done) => done,
                    Err(_) => {
                        if let Some(value) = self.entry_value(key, stale) {
                            let served = Served::Stale {
                                reason: StaleReason::SoftTimeout,
                            };
                            return Err(Ok(Fetched { value, served }));
                        }
                        return Err(Err(Error::new(
                            ErrorKind::Timeout,
                            "soft timeout with an unreadable stale value",
                        )));
                    }
                },
                _ => flight.await,
            }
        };

        Ok((result, role, fallback))
    }

    /// Settle: a flight's outcome for one caller of user key `user_key`
    /// (storage key `key`). On failure: the stale entry if one may stand in
    /// (fail-safe), else this process's L1 copy (`local`) if it may (the
    /// store lost the entry, L1 did not), else the fallback, else the
    /// error.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn settle(
        &self,
        user_key: &[u8],
        key: &[u8],
        result: Result<Landed<V>, Error>,
        role: Role,
        stale: Option<Arc<Entry>>,
        local: Option<&Arc<NearCopy<V>>>,
        options: &Options,
    ) -> Result<Fetched<V>, Error> {
        match result {
            Ok((value, served, _)) => {
                let served = if role == Role::Follower && served == Served::Loaded {
                    Served::Coalesced
                } else {
                    served
                };
                Ok(Fetched { value, served })
            }
            Err(err) => {
                let reason = match err.kind() {
                    ErrorKind::Loader | ErrorKind::Timeout | ErrorKind::Store => {
                        Some(StaleReason::LoaderFailed)
                    }
                    ErrorKind::CircuitOpen => Some(StaleReason::BreakerOpen),
                    ErrorKind::Overloaded => Some(StaleReason::Overloaded),
                    // A lock timeout was already decided by `OnLockTimeout`.
                    _ => None,
                };
                let Some(reason) = reason else {
                    return Err(err);
                };
                // The stored stale value, else the L1 copy.
                let stand_in = stale
                    .and_then(|entry| self.entry_value(key, &entry))
                    .map(|value| (value, "the stale value"))
                    .or_else(|| {
                        let value = self.local_stand_in(local?, options)?;
                        Some((value, "the stale L1 copy (the store has none)"))
                    });
                if let Some((value, what)) = stand_in {
                    warn_limited!(self.inner.logs, Warning::LoadFailed, key = %show_key(key), error = %err, "load failed; serving {what}");
                    if reason == StaleReason::LoaderFailed {
                        self.inner.throttle(key, options.fail_safe_throttle);
                    }
                    let served = Served::Stale { reason };
                    return Ok(Fetched { value, served });
                }
                if let Some(fallback) = &self.fallback {
                    warn_limited!(self.inner.logs, Warning::LoadFailed, key = %show_key(user_key), error = %err, "load failed; serving the fallback");
                    return Ok(Fetched {
                        value: fallback(user_key),
                        served: Served::Fallback,
                    });
                }
                Err(err)
            }
        }
    }

    /// Starts one refresh of `key` in the background, unless one is already
    /// in the air. Background flights are kept apart from foreground ones: a
    /// foreground caller never inherits a background refresh's refusals (it
    /// never loads without the lease); it takes its own turn at the lease,
    /// and is woken by the refresh's fill.
    /// `replacing` is the `fresh_until` of the entry being refreshed;
    /// `early` if it is still fresh (an early refresh, counted).
    pub(super) fn refresh_in_background<L: Load<V>>(
        &self,
        key: Vec<u8>,
        loader: L,
        options: Options,
        replacing: u64,
        early: bool,
    ) {
        let (load, role) = self.join_fill(
            &key,
            loader,
            options,
            Some(replacing),
            Priority::Background,
            Mode::Fleet,
        );
        if role == Role::Follower {
            return;
        }
        if early {
            self.inner.metrics.early_refresh();
        }
        let cache = self.clone();
        tokio::spawn(async move {
            let result = load.result().await;
            cache.refreshed(&key, &result, &options);
        });
    }

    /// A background refresh of `key` ended: shed, it is nothing; failed, the
    /// key is throttled (fail-safe).
    pub(super) fn refreshed(
        &self,
        key: &[u8],
        result: &Result<Landed<V>, Error>,
        options: &Options,
    ) {
        match result {
            Err(err) if err.is_overloaded() || err.is_circuit_open() => {
                tracing::debug!(key = %show_key(key), error = %err, "background refresh shed");
            }
            Err(err) => {
                warn_limited!(self.inner.logs, Warning::RefreshFailed, key = %show_key(key), error = %err, "background refresh failed; throttling the key");
                self.inner.throttle(key, options.fail_safe_throttle);
            }
            Ok(_) => {}
        }
    }

    /// Joins the load flight for storage key `key`, starting one that runs
    /// [`fill`](Self::fill) with these settings if none is in the air. The
    /// loader is put in an `Arc` only if the flight starts, so a caller that
    /// joins one already in the air allocates nothing.
    pub(super) fn join_fill<L: Load<V>>(
        &self,
        key: &[u8],
        loader: L,
        options: Options,
        replacing: Option<u64>,
        priority: Priority,
        mode: Mode,
    ) -> (Joined<Landed<V>>, Role) {
        let flights = match priority {
            Priority::Foreground => &self.local.flights,
            Priority::Background => &self.local.background,
        };
        let (joined, role) = flights.join(key, || {
            // A child of the caller's span, though it runs in its own task.
            let span = tracing::info_span!(
                "breakwater.fill",
                background = priority == Priority::Background,
                lease = Empty,
                written = Empty,
            );
            self.clone()
                .fill(
                    key.to_vec(),
                    Arc::new(loader),
                    options,
                    replacing,
                    priority,
                    mode,
                )
                .instrument(span)
        });
        if priority == Priority::Foreground {
            Span::current().record("role", role.as_str());
        }
        (joined, role)
    }

    /// The outcome of the load of storage key `key` that this call joined,
    /// waited for no longer than a load can take (`lock_wait`, the
    /// bulkhead's `queue_wait`, `load_timeout`, and [`STRANDED_AFTER`] for
    /// its store calls). A load still in the air by then is stranded: its
    /// task runs on a runtime that no longer runs it (idle, its `block_on`
    /// returned). It is detached, and the call goes through the pipeline
    /// again on its own runtime (see [`revoked_before`](super::pipeline::revoked_before)): an
    /// abandoned flight's error.
    pub(super) async fn await_fill(
        &self,
        key: &[u8],
        load: Joined<Landed<V>>,
        options: &Options,
    ) -> Result<Landed<V>, Error> {
        let bound = self
            .inner
            .lock_wait_for(options)
            .saturating_add(self.inner.origin.queue_wait())
            .saturating_add(options.load_timeout)
            .saturating_add(STRANDED_AFTER);
        match tokio::time::timeout(bound, load.clone().result()).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(key = %show_key(key), ?bound, "a load did not land within its bound (its runtime is not running it); loading again");
                self.local.flights.detach_joined(key, &load);
                Err(crate::flight::stranded())
            }
        }
    }
}

/// Beyond its waits and its load, how long a load may take (its store
/// calls) before a caller takes it for stranded (see
/// [`Cache::await_fill`]).
const STRANDED_AFTER: Duration = Duration::from_secs(5);

/// The error handed to the waiters of a load another process made that
/// failed with an error of `kind` (hit-for-pass: see [`notify::FAILED`]).
/// Its text stays in that process (a loader's error may name hosts or
/// users, and is not published on the bus).
fn handed_failure(kind: ErrorKind) -> Error {
    Error::new(
        kind,
        "the load of this key that this call waited for failed in the process that held its \
         lease (its error stays with that process)",
    )
}

/// A "not modified" answer with no stored value to keep.
fn unchanged_without_value() -> Error {
    Error::new(
        ErrorKind::Loader,
        "answered not_modified, but no stored value was found to keep (a first load, or one the store could not give)",
    )
}
