//! The body of one flight: take the lease and load, or wait to be woken.
//!
//! # Order
//!
//! 1. Try the key's lease (`SET NX PX` with a fresh 128-bit token).
//! 2. Got it: read once more (another process may have filled the key just
//!    before), else lead: run the loader in its own task, extending the lease
//!    every half TTL, bounded by `load_timeout`; write through the fence.
//! 3. Not got it (the attempt marked the lease as waited on): watch the key,
//!    read once more (the fill may have happened between 1 and the watch),
//!    then sleep until woken, a jittered poll, or the `lock_wait` deadline; on
//!    waking take the entry the fill's message carried, or read again, then
//!    go back to 1 (the holder may have died or failed, freeing the lease).
//! 4. Deadline passed: the [`OnLockTimeout`](super::OnLockTimeout) policy.
//! 5. The store fails at 1: load directly (in-process single-flight still
//!    holds), so a sick Redis degrades to direct loads, never to errors.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::builder::LockTimeoutKind;
use super::notify::{self, FILLED, RELEASED, VALUE_IN_MESSAGE_MAX};
use super::options::{Options, Served, StaleReason};
use super::{Cache, Load, Loaded, Value, reading, show_key};
use crate::entry::Entry;
use crate::error::{Error, ErrorKind};
use crate::jitter::poll_delay;
use crate::limit::Priority;
use crate::store::{FencedWrite, LeaseAttempt, Store};

/// Whether a flight may use the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Lease, wait, write: one load across the fleet.
    Fleet,
    /// The store is failing: load in this process only, and do not write.
    Local,
}

/// How long a waiter gives the cache's subscription to come up before it
/// relies on polling alone.
const SUBSCRIBE_WITHIN: Duration = Duration::from_millis(250);

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
    ) -> Result<Loaded<V>, Error>
    where
        L: Load<V>,
    {
        let inner = &self.inner;
        // A known-down origin is refused before any lease is taken or waited on.
        inner.origin.check()?;
        if mode == Mode::Local {
            // The store just failed this request: one deadline is enough.
            // Load directly; single-flight still makes it one load here.
            let value = self
                .load_direct(&key, &loader, &options, priority, Mode::Local)
                .await?;
            return Ok((value, Served::Loaded));
        }
        let lease_key = inner.lease_key(&key);
        let deadline = Instant::now() + inner.lock_wait;
        let mut stale: Option<Entry> = None;

        loop {
            // 1. The lease.
            let token = inner.new_token();
            match inner
                .store
                .acquire_lease(&lease_key, &token, inner.lease_ttl)
                .await
            {
                Ok(LeaseAttempt::Acquired) => {
                    inner.metrics.lease("acquired");
                    // 2. Double-check, then lead.
                    if let Some(value) = self
                        .fresh_value(&key, &mut stale, &options, replacing)
                        .await
                    {
                        let message = notify::message(FILLED, inner.waiters.sender(), &key);
                        let _ = inner
                            .store
                            .release_lease(&lease_key, &token, inner.notice(&message))
                            .await;
                        return Ok((value, Served::Coalesced));
                    }
                    let value = self
                        .lead(&key, &lease_key, &token, &loader, &options, priority)
                        .await?;
                    return Ok((value, Served::Loaded));
                }
                Ok(LeaseAttempt::Held { .. }) => inner.metrics.lease("busy"),
                Err(err) => {
                    // 5. No store: load directly.
                    inner.metrics.store_error("acquire_lease");
                    tracing::warn!(key = %show_key(&key), error = %err, "lease unavailable; loading directly");
                    let value = self
                        .load_direct(&key, &loader, &options, priority, Mode::Fleet)
                        .await?;
                    return Ok((value, Served::Loaded));
                }
            }

            // 3. Wait to be woken.
            let watch = inner
                .waiters
                .watch(&*inner.store, &key, SUBSCRIBE_WITHIN)
                .await;
            let mut woken = pin!(watch.notify().notified());
            woken.as_mut().enable();
            if let Some(value) = self
                .fresh_value(&key, &mut stale, &options, replacing)
                .await
            {
                return Ok((value, Served::Coalesced));
            }
            if Instant::now() >= deadline {
                break;
            }
            let poll = {
                let mut rng = inner.rng.lock().unwrap_or_else(|p| p.into_inner());
                poll_delay(inner.lock_poll, &mut *rng)
            };
            tokio::select! {
                () = woken => {
                    // The fill's message may carry the entry: no read then.
                    let carried = watch.filled().and_then(|bytes| self.decode(&key, bytes));
                    let value = match carried {
                        Some(entry) => self.fresh_entry(&key, entry, &mut stale, &options, replacing).await,
                        None => self.fresh_value(&key, &mut stale, &options, replacing).await,
                    };
                    if let Some(value) = value {
                        return Ok((value, Served::Coalesced));
                    }
                }
                () = sleep(poll) => {}
                () = sleep_until(deadline) => {}
            }
        }

        // 4. The lock-wait policy.
        let waited = inner.lock_wait;
        match inner.on_lock_timeout.0 {
            LockTimeoutKind::LoadAnyway => {
                tracing::debug!(key = %show_key(&key), ?waited, "lock wait over; loading anyway");
                inner
                    .origin
                    .load(&loader, options.load_timeout, priority, &inner.metrics)
                    .await
                    .map(|(value, _)| (value, Served::Loaded))
            }
            LockTimeoutKind::ServeStale => match stale.and_then(|e| self.entry_value(&key, &e)) {
                Some(value) => Ok((
                    value,
                    Served::Stale {
                        reason: StaleReason::LockTimeout,
                    },
                )),
                None => Err(lock_timeout(waited)),
            },
            LockTimeoutKind::Error => Err(lock_timeout(waited)),
        }
    }

    /// Holding the lease: load, keep the lease alive, write through the
    /// fence (or release the lease on failure).
    async fn lead<L>(
        &self,
        key: &[u8],
        lease_key: &[u8],
        token: &[u8],
        loader: &Arc<L>,
        options: &Options,
        priority: Priority,
    ) -> Result<Option<V>, Error>
    where
        L: Load<V>,
    {
        let inner = &self.inner;
        let store = &inner.store;
        let mut load = pin!(inner.origin.load(
            loader,
            options.load_timeout,
            priority,
            &inner.metrics
        ));
        let mut extend =
            tokio::time::interval_at(Instant::now() + inner.lease_ttl / 2, inner.lease_ttl / 2);
        let mut held = true;
        let result = loop {
            tokio::select! {
                result = &mut load => break result,
                _ = extend.tick(), if held => {
                    match store.extend_lease(lease_key, token, inner.lease_ttl).await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::debug!(key = %show_key(key), "lease lost while loading; the result will not be written");
                            inner.metrics.lease("lost");
                            held = false;
                        }
                        Err(err) => tracing::warn!(key = %show_key(key), error = %err, "lease extension failed"),
                    }
                }
            }
        };

        match result {
            Ok((value, load_time)) => {
                let sealed = self.seal(value.as_ref(), load_time, options)?;
                inner.clear_throttle(key);
                let message = notify::message(FILLED, inner.waiters.sender(), key);
                let value_message = (sealed.bytes.len() <= VALUE_IN_MESSAGE_MAX)
                    .then(|| notify::value_message(inner.waiters.sender(), key))
                    .flatten();
                let write = FencedWrite {
                    key,
                    value: &sealed.bytes,
                    ttl: sealed.ttl,
                    lease_key,
                    token,
                    notice: inner.notice(&message),
                    value_notice: value_message.as_deref(),
                };
                match store.fenced_set(write).await {
                    Ok(true) => self.remember_sealed(key, value.clone(), &sealed).await,
                    Ok(false) => {
                        tracing::debug!(
                            key = %show_key(key),
                            "lease revoked (invalidated or expired) during the load; not written"
                        );
                        inner.metrics.lease("revoked");
                    }
                    Err(err) => {
                        tracing::warn!(key = %show_key(key), error = %err, "store write failed; returning the loaded value");
                        inner.metrics.store_error("fenced_set");
                        self.remember_sealed(key, value.clone(), &sealed).await;
                    }
                }
                Ok(value)
            }
            Err(err) => {
                let message = notify::message(RELEASED, inner.waiters.sender(), key);
                if let Err(release) = store
                    .release_lease(lease_key, token, inner.notice(&message))
                    .await
                {
                    tracing::warn!(key = %show_key(key), error = %release, "lease release failed; it expires on its own");
                }
                Err(err)
            }
        }
    }

    /// Without a usable store: load and try a plain write.
    async fn load_direct<L>(
        &self,
        key: &[u8],
        loader: &Arc<L>,
        options: &Options,
        priority: Priority,
        mode: Mode,
    ) -> Result<Option<V>, Error>
    where
        L: Load<V>,
    {
        let inner = &self.inner;
        let (value, load_time) = inner
            .origin
            .load(loader, options.load_timeout, priority, &inner.metrics)
            .await?;
        let sealed = self.seal(value.as_ref(), load_time, options)?;
        self.inner.clear_throttle(key);
        if mode == Mode::Fleet
            && let Err(err) = self.inner.store.set(key, &sealed.bytes, sealed.ttl).await
        {
            tracing::debug!(key = %show_key(key), error = %err, "store write failed; returning the loaded value");
        }
        self.remember_sealed(key, value.clone(), &sealed).await;
        Ok(value)
    }

    /// Reads `key`; the value if fresh and not the entry being replaced (an
    /// early refresh replaces an entry that is still fresh). A readable entry
    /// that is no longer fresh but may still be served is kept in `stale` for
    /// the lock-wait policy.
    async fn fresh_value(
        &self,
        key: &[u8],
        stale: &mut Option<Entry>,
        options: &Options,
        replacing: Option<u64>,
    ) -> Option<Option<V>> {
        let entry = match self.read(key).await {
            Ok(Some(entry)) => entry,
            Ok(None) => return None,
            Err(err) => {
                tracing::debug!(key = %show_key(key), error = %err, "store read failed while waiting");
                return None;
            }
        };
        self.fresh_entry(key, entry, stale, options, replacing)
            .await
    }

    /// [`fresh_value`](Self::fresh_value) for an entry already in hand.
    async fn fresh_entry(
        &self,
        key: &[u8],
        entry: Entry,
        stale: &mut Option<Entry>,
        options: &Options,
        replacing: Option<u64>,
    ) -> Option<Option<V>> {
        let now = self.inner.store.now_ms();
        if entry.fresh_until > now {
            if replacing == Some(entry.fresh_until) {
                return None;
            }
            let value = self.entry_value(key, &entry)?;
            self.remember(key, &value, &entry, now).await;
            return Some(value);
        }
        if self
            .inner
            .freshness(options)
            .servable_stale(reading(&entry, now))
        {
            *stale = Some(entry);
        }
        None
    }
}

fn lock_timeout(waited: Duration) -> Error {
    Error::new(
        ErrorKind::LockTimeout,
        format!("another process held this key's lease for longer than lock_wait ({waited:?})"),
    )
}
