//! Writes and invalidations, so that no load that began before a `set`,
//! `invalidate` or `invalidate_tag` becomes visible after it returned (nor
//! fresh after an `expire` or `expire_tag`):
//! each revokes the key's lease (or bumps the tag's generation) with its
//! notice in one store operation, retried for a second (each attempt
//! bounded by the store's write deadlines, see `attempt_bound`), or
//! reported as undelivered.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::coherence::LocalStep;
use super::handle::Cache;
use super::keys::lease_key;
use super::notify::{self, TAG_INVALIDATED};
use super::options::Options;
use super::queue;
use super::seal::Sealed;
use super::tags::{self, EXPIRE_SKEW, check_tag, counter_ttl, tag_key};
use super::trace::{Op, record_error};
use super::value::Value;
use crate::clock::millis;
use crate::entry::Extra;
use crate::error::{Error, ErrorKind};
use crate::log_limit::show_key;
use crate::store::{Invalidate, Notice, Replace, Store};

/// How many keys `invalidate_many` revokes as one store batch (and one
/// delivery, retried as a whole).
const INVALIDATE_MANY_BATCH: usize = 4_096;

impl<V: Value> Cache<V> {
    /// [`set`](Self::set) with a call's settings and tags (their current
    /// generations read first and recorded with the value), in its span.
    pub(super) async fn set_with(
        &self,
        key: &[u8],
        value: &V,
        tags: Option<&tags::TagSet>,
        options: &Options,
    ) -> Result<(), Error> {
        let span = self.span(Op::Set, key);
        let done = async {
            let key = self.key_in_store(key)?;
            // Inside a version transition the previous version's entry is
            // revoked first: from then on (also if the caller goes away)
            // nothing that began before may answer here.
            let _local = self.local.invalidation([&key]);
            // The value's windows start now, not after the generations'
            // read (which may take a store deadline).
            let now = self.inner.store.now_ms();
            let mut stamps = match tags {
                Some(tags) => self.tag_generations(tags).await?,
                None => Vec::new(),
            };
            // The namespace's clear generation, as a load records it.
            let namespace = Some(self.clear_generation().await?);
            // Inside a version transition the previous version's entry is
            // revoked and this one written beside a fresh pin of it.
            if let Some(pinned) = self
                .revoke_previous(&key, tags::counter_ttl(options))
                .await?
            {
                stamps.insert(0, pinned.stamp());
            }
            let sealed = self.seal_tagged(
                &key,
                Some(value),
                Duration::ZERO,
                options,
                stamps,
                now,
                Extra::default().in_namespace(namespace),
            )?;
            // Its local step is `_local`'s, taken above.
            self.write_one(&key, sealed).await
        }
        .instrument(span.clone())
        .await;
        record_error(&span, &done);
        done
    }

    /// Writes sealed entries with [`Store::replace`] (one: see
    /// [`replace_one`](Self::replace_one)) or [`Store::replace_many`] (one
    /// notice per store step): each revokes any load in flight for its key
    /// first, so an older result cannot land on top of it, then wakes
    /// waiters. Nothing that began before answers in this process
    /// afterwards; the values are not kept in L1 (another `set` may land
    /// after this one while its reply is on the way: the next read takes
    /// the store's value).
    pub(super) async fn replace_batch(
        &self,
        mut batch: Vec<(Vec<u8>, Sealed)>,
    ) -> Result<(), Error> {
        if batch.len() == 1
            && let Some((key, sealed)) = batch.pop()
        {
            return self.replace_one(key, sealed).await;
        }
        let inner = &self.inner;
        let listening = inner.waiters.is_listening();
        for (key, _) in &batch {
            self.local.expect_own_notice(key, listening);
        }
        // Even if the reply is lost (the write may have happened), or the
        // caller goes away before it comes, nothing that began before may
        // answer from now on.
        let keys = batch.iter().map(|(key, _)| key);
        let _local = self.local.invalidation(keys);
        let head = inner.waiters.batch_head();
        let lease_keys: Vec<Vec<u8>> = batch.iter().map(|(key, _)| inner.lease_key(key)).collect();
        let writes: Vec<Replace<'_>> = batch
            .iter()
            .zip(&lease_keys)
            .map(|((key, sealed), lease_key)| Replace {
                key,
                value: &sealed.bytes,
                ttl: sealed.ttl,
                lease_key,
            })
            .collect();
        let written = inner.store.replace_many(&writes, inner.notice(head)).await;
        if written.is_err() {
            for (key, _) in &batch {
                self.local.own_notice_heard(key);
            }
        }
        written
    }

    /// [`replace_batch`](Self::replace_batch) of one entry: straight to the
    /// store unless the store is busy and batches writes; then in one
    /// [`Store::replace_many`] with the other `set`s that meet it (see
    /// `queue`), each with the guarantees of its own.
    async fn replace_one(&self, key: Vec<u8>, sealed: Sealed) -> Result<(), Error> {
        // As in `replace_batch`.
        let _local = self.local.invalidation([&key]);
        self.write_one(&key, sealed).await
    }

    /// [`replace_one`](Self::replace_one) for a caller that holds the
    /// key's local step (see `Local::invalidation`) until this returns.
    async fn write_one(&self, key: &[u8], sealed: Sealed) -> Result<(), Error> {
        let inner = &self.inner;
        self.local
            .expect_own_notice(key, inner.waiters.is_listening());
        let lease_key = inner.lease_key(key);
        let waiting = inner.write_queue.as_ref();
        let admitted = waiting.and_then(|waiting| queue::admit(waiting));
        let written = match waiting {
            Some(waiting) if admitted.is_none() => {
                let write = queue::Write {
                    key: key.to_vec(),
                    value: sealed.bytes,
                    ttl: sealed.ttl,
                    lease_key,
                };
                let writes = || {
                    let head = inner.waiters.batch_head().to_vec();
                    queue::Writes::new(inner.waiters.channel(), head, inner.write_split)
                };
                // Boxed: its state would grow every write's future.
                match Box::pin(queue::queued_write(&inner.store, waiting, write, writes)).await {
                    Ok(written) => written,
                    // A batch of another runtime is forming: alone.
                    Err(write) => {
                        self.replace_alone(key, &write.value, write.ttl, &write.lease_key)
                            .await
                    }
                }
            }
            _ => {
                self.replace_alone(key, &sealed.bytes, sealed.ttl, &lease_key)
                    .await
            }
        };
        drop(admitted);
        if written.is_err() {
            self.local.own_notice_heard(key);
        }
        written
    }

    /// One [`Store::replace`] of `key`, with its own notice.
    async fn replace_alone(
        &self,
        key: &[u8],
        value: &[u8],
        ttl: Duration,
        lease_key: &[u8],
    ) -> Result<(), Error> {
        let inner = &self.inner;
        let message = notify::message(notify::INVALIDATED, inner.waiters.sender(), key);
        // Its part of a batch message, should the store send it so.
        let notice = Notice {
            batch_head: Some(inner.waiters.batch_head()),
            ..inner.notice(&message)
        };
        inner
            .store
            .replace(key, value, ttl, lease_key, notice)
            .await
    }

    /// [`invalidate`](Self::invalidate), in its span.
    pub(super) async fn invalidate_bytes(&self, key: &[u8]) -> Result<(), Error> {
        self.revoke_key(key, Revoke::Delete).await
    }

    /// [`invalidate_many`](Self::invalidate_many), in its span: the keys
    /// (each once) in batches of [`INVALIDATE_MANY_BATCH`], one after
    /// another.
    pub(super) async fn invalidate_many_bytes(&self, keys: Vec<Vec<u8>>) -> Result<(), Error> {
        let mut seen = std::collections::HashSet::with_capacity(keys.len());
        let mut stored = Vec::with_capacity(keys.len());
        for key in &keys {
            let key = self.key_in_store(key)?;
            if seen.insert(key.clone()) {
                stored.push(key);
            }
        }
        for batch in stored.chunks(INVALIDATE_MANY_BATCH) {
            self.invalidate_batch(batch).await?;
        }
        Ok(())
    }

    /// [`revoke_key`](Self::revoke_key)'s invalidation for many storage
    /// keys at once: deleted with their leases in one store batch
    /// ([`Store::invalidate_many`]) with one notice head, this process's
    /// local step for each, inside a version transition the previous
    /// version's entries first; delivered with retries.
    async fn invalidate_batch(&self, keys: &[Vec<u8>]) -> Result<(), Error> {
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let inner = &self.inner;
        let head = inner.waiters.batch_head();
        let leases: Vec<Vec<u8>> = keys.iter().map(|key| inner.lease_key(key)).collect();
        let batch = invalidations(keys, &leases);
        // Inside a version transition the previous version's entries go
        // too (first), with their leases; its processes are told on
        // their channel.
        let previous = inner.previous.as_ref().map(|p| {
            let old: Vec<Vec<u8>> = keys.iter().filter_map(|k| inner.previous_key(k)).collect();
            let leases: Vec<Vec<u8>> = old.iter().map(|k| lease_key(k, p.prefix.len())).collect();
            (old, leases, &p.channel)
        });
        let previous_batch = previous
            .as_ref()
            .map(|(old, leases, channel)| (invalidations(old, leases), *channel));
        let listening = inner.waiters.is_listening();
        let (batch, previous_batch) = (&batch, &previous_batch);
        // After the store has answered, also if it failed or the caller
        // goes away first (as for one key).
        let _local = self.local.invalidation(keys);
        let round_trips = 1 + u32::from(previous_batch.is_some());
        self.deliver(first, keys.len() - 1, round_trips, || async move {
            if let Some((old, channel)) = previous_batch {
                let notice = Notice {
                    channel,
                    message: head,
                    batch_head: None,
                };
                inner.store.invalidate_many(old, notice).await?;
            }
            for key in keys {
                self.local.expect_own_notice(key, listening);
            }
            let done = inner.store.invalidate_many(batch, inner.notice(head)).await;
            if done.is_err() {
                for key in keys {
                    self.local.own_notice_heard(key);
                }
            }
            done
        })
        .await
    }

    /// [`expire`](Self::expire), in its span: as an invalidation, but the
    /// store keeps the entry, stale from [`EXPIRE_SKEW`] before now.
    pub(super) async fn expire_bytes(&self, key: &[u8]) -> Result<(), Error> {
        self.revoke_key(key, Revoke::Expire).await
    }

    /// An invalidation or an expiry of `key`: the entry deleted or made
    /// stale in the store, its lease revoked and the fleet told, with this
    /// process's local step and the store's delivered with retries.
    async fn revoke_key(&self, key: &[u8], how: Revoke) -> Result<(), Error> {
        let key = self.key_in_store(key)?;
        let lease = self.inner.lease_key(&key);
        let sender = self.inner.waiters.sender();
        let message = notify::message(notify::INVALIDATED, sender, &key);
        let listening = self.inner.waiters.is_listening();
        let (key, lease, message) = (&key, &lease, &message);
        // Inside a version transition the previous version's entry goes
        // too (first): it must not stand in for the revoked value. Its
        // lease is revoked and its processes are told on their channel.
        let previous = self.inner.previous_key(key).and_then(|old| {
            let p = self.inner.previous.as_ref()?;
            let old_lease = lease_key(&old, p.prefix.len());
            let message = notify::message(notify::INVALIDATED, sender, &old);
            Some((old, old_lease, message, &p.channel))
        });
        let previous = &previous;
        // After the store has answered (a read that starts later sees the
        // change); also if it failed (the reply may be all that was lost),
        // or if the caller goes away first.
        let _local = self.local.invalidation([key]);
        let round_trips = 1 + u32::from(previous.is_some());
        self.deliver(key, 0, round_trips, || async move {
            if let Some((old, old_lease, message, channel)) = previous {
                let notice = Notice {
                    channel,
                    message,
                    batch_head: None,
                };
                self.revoke_in_store(how, old, old_lease, notice).await?;
            }
            self.local.expect_own_notice(key, listening);
            let notice = self.inner.notice(message);
            let done = self.revoke_in_store(how, key, lease, notice).await;
            if done.is_err() {
                self.local.own_notice_heard(key);
            }
            done
        })
        .await
    }

    /// The store's part of [`revoke_key`](Self::revoke_key) for one key.
    async fn revoke_in_store(
        &self,
        how: Revoke,
        key: &[u8],
        lease: &[u8],
        notice: Notice<'_>,
    ) -> Result<(), Error> {
        let store = &self.inner.store;
        match how {
            Revoke::Delete => store.invalidate(key, lease, notice).await,
            Revoke::Expire => {
                let at = store.now_ms().saturating_sub(millis(EXPIRE_SKEW));
                store.expire_entry(key, lease, at, notice).await.map(drop)
            }
        }
    }

    /// Runs `attempt`, an invalidation (idempotent: a delete or a bump, with
    /// its notice) of `round_trips` store steps one after another, with the
    /// store retries: attempts start within [`start_within`], and each
    /// has [`attempt_bound`] to finish (so one the store delivered, however
    /// late its reply within the store's own deadlines, is not cut short
    /// by the budget). If none gets through, the error says the
    /// invalidation of `key` (and of `more` other keys) was not delivered
    /// (with the attempts made and the last failure).
    pub(super) async fn deliver<F, Fut>(
        &self,
        key: &[u8],
        more: usize,
        round_trips: u32,
        attempt: F,
    ) -> Result<(), Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let started = Instant::now();
        let store = &self.inner.store;
        let start_by = started + start_within(store.write_deadline(), round_trips);
        let last = Mutex::new(Attempts {
            made: 0,
            failed: None,
            at: started,
            in_air: false,
        });
        let (last, attempt) = (&last, &attempt);
        let out_of_time = || Error::new(ErrorKind::Timeout, "out of time");
        let attempts = self.inner.store_retries.run(|made| async move {
            // Past the budget no attempt starts, and a failed one is not
            // tried again (not a store failure: the retries stop).
            if made > 1 && Instant::now() >= start_by {
                return Err(out_of_time());
            }
            last.lock().unwrap_or_else(|p| p.into_inner()).in_air = true;
            let bound = attempt_bound(store.write_deadline(), round_trips);
            let done = match tokio::time::timeout(bound, attempt()).await {
                Ok(done) => done,
                Err(_) => Err(Error::new(
                    ErrorKind::Store,
                    format!("the store did not answer within {bound:?}"),
                )),
            };
            let now = Instant::now();
            let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
            (last.made, last.in_air) = (made, false);
            match done {
                Ok(()) => Ok(()),
                Err(err) => {
                    (last.failed, last.at) = (Some(err.clone()), now);
                    if now >= start_by {
                        Err(out_of_time())
                    } else {
                        Err(err)
                    }
                }
            }
        });
        let mut attempts = std::pin::pin!(attempts);
        // At the budget's end, a pause between attempts ends at once; an
        // attempt in the air runs to its end (its own bound).
        let done = tokio::select! {
            (done, _) = &mut attempts => done,
            () = tokio::time::sleep_until(start_by) => {
                if last.lock().unwrap_or_else(|p| p.into_inner()).in_air {
                    attempts.await.0
                } else {
                    Err(out_of_time())
                }
            }
        };
        match done {
            Ok(()) => Ok(()),
            Err(err) => {
                let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                Err(undelivered(
                    key,
                    more,
                    last.made,
                    last.failed.take().unwrap_or(err),
                    last.at,
                    started.elapsed(),
                ))
            }
        }
    }

    /// [`invalidate_tag`](Self::invalidate_tag), in its span.
    pub(super) async fn invalidate_tag_bytes(&self, tag: &[u8]) -> Result<(), Error> {
        self.revoke_tags(&[tag], Revoke::Delete).await
    }

    /// [`invalidate_tags`](Self::invalidate_tags), in its span: the tags
    /// (each once) in batches of [`INVALIDATE_MANY_BATCH`], one after
    /// another.
    pub(super) async fn invalidate_tags_bytes(&self, tags: &[Vec<u8>]) -> Result<(), Error> {
        for tag in tags {
            check_tag(tag)?;
        }
        let mut seen = std::collections::HashSet::with_capacity(tags.len());
        let distinct: Vec<&[u8]> = tags
            .iter()
            .map(Vec::as_slice)
            .filter(|tag| seen.insert(*tag))
            .collect();
        for batch in distinct.chunks(INVALIDATE_MANY_BATCH) {
            self.revoke_tags(batch, Revoke::Delete).await?;
        }
        Ok(())
    }

    /// [`expire_tag`](Self::expire_tag), in its span: as a tag
    /// invalidation, but the counter's soft bump leaves the tag's entries
    /// stale, not missing (see `tags`).
    pub(super) async fn expire_tag_bytes(&self, tag: &[u8]) -> Result<(), Error> {
        self.revoke_tags(&[tag], Revoke::Expire).await
    }

    /// An invalidation or an expiry of every entry carrying one of `tags`
    /// (at least one): their counters bumped (hard or soft) with one
    /// notice, delivered with retries, this process's local step (every L1
    /// copy and flight, as the entries' tags are known only once read),
    /// and inside a version transition the previous version's processes
    /// told too.
    async fn revoke_tags(&self, tags: &[&[u8]], how: Revoke) -> Result<(), Error> {
        for tag in tags {
            check_tag(tag)?;
        }
        let inner = &self.inner;
        let keys: Vec<Vec<u8>> = tags
            .iter()
            .map(|tag| tag_key(&inner.tag_prefix, tag))
            .collect();
        let Some(first) = keys.first() else {
            return Ok(());
        };
        // Every process empties its L1 on any tag's message: the first
        // counter names the batch.
        let message = notify::message(TAG_INVALIDATED, inner.waiters.sender(), first);
        let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let (refs, message) = (&refs, &message);
        // Should a counter be missing, it starts again at a value no
        // entry can have recorded; retries send the same one.
        let fresh = self.inner.fresh_generation();
        let ttl = counter_ttl(&inner.defaults);
        // After the store has answered (a read that starts later sees the
        // new generations); also if it failed (the reply may be all that
        // was lost), or if the caller goes away first.
        let _local = LocalStep::new(|| self.local.tags_invalidated());
        // An expiry bumps each counter in a step of its own.
        let round_trips = match how {
            Revoke::Delete => 1,
            Revoke::Expire => u32::try_from(keys.len()).unwrap_or(u32::MAX),
        };
        let done = self
            .deliver(first, keys.len() - 1, round_trips, || async move {
                let notice = inner.notice(message);
                let store = &inner.store;
                match (how, refs.as_slice()) {
                    (Revoke::Delete, [key]) => store
                        .bump_generation(key, fresh, ttl, notice)
                        .await
                        .map(drop),
                    (Revoke::Delete, keys) => {
                        store.bump_generations(keys, fresh, ttl, notice).await
                    }
                    (Revoke::Expire, keys) => {
                        // Their entries' fresh windows end at this, less
                        // `EXPIRE_SKEW`, when they are read.
                        let at = store.now_ms();
                        for key in keys {
                            store.expire_generation(key, fresh, ttl, at, notice).await?;
                        }
                        Ok(())
                    }
                }
            })
            .await;
        // Inside a version transition the previous version's processes
        // share the tags (a counter has no version): they are told on
        // their own channel, to empty their L1s.
        if done.is_ok()
            && let Some(previous) = &inner.previous
            && Instant::now() < previous.until
            && let Err(err) = inner.store.publish(&previous.channel, message).await
        {
            tracing::debug!(tag = %show_key(tags[0]), error = %err, "tag invalidation not published to the previous version");
        }
        done
    }
}

/// How long `invalidate` keeps starting attempts to deliver one
/// invalidation (each then has [`attempt_bound`] to finish), at least.
const INVALIDATE_WITHIN: Duration = Duration::from_secs(1);

/// How long attempts to deliver an invalidation of `round_trips` store
/// steps keep starting when the store's write deadline is
/// `write_deadline`: [`INVALIDATE_WITHIN`], or twice the attempt's
/// deadlines if that is longer, so that an attempt that timed out (a
/// cluster connection re-learning its slots, a Redis that was stalled) is
/// tried again however long the store's deadlines are.
fn start_within(write_deadline: Duration, round_trips: u32) -> Duration {
    (write_deadline * 2)
        .saturating_mul(round_trips.max(1))
        .max(INVALIDATE_WITHIN)
}

/// The attempts of one delivery so far (see [`Cache::deliver`]).
struct Attempts {
    /// How many were made.
    made: u32,
    /// The last one's failure, and when it came.
    failed: Option<Error>,
    at: Instant,
    /// Whether one is in the air (not in a pause between two).
    in_air: bool,
}

/// How long one attempt of `round_trips` store steps may take when the
/// store's write deadline is `write_deadline`: 3 of them per step (a
/// step's deadline may grow once while it waits, as a burst of timeouts
/// grows it), at least [`INVALIDATE_WITHIN`]. An invalidation so returns
/// within [`start_within`], or with an attempt in the air then, at that
/// attempt's end (with Redis's defaults and a fast Redis, under 2 s; on a
/// Redis at the 2 s deadline ceiling, about 10 s per round trip).
fn attempt_bound(write_deadline: Duration, round_trips: u32) -> Duration {
    (write_deadline * 3)
        .saturating_mul(round_trips.max(1))
        .max(INVALIDATE_WITHIN)
}

/// What a revocation does to the stored entry (or to every entry of a
/// tag).
#[derive(Clone, Copy)]
enum Revoke {
    /// `invalidate`, `invalidate_tag`: deletes it (a hard bump: a miss).
    Delete,
    /// `expire`, `expire_tag`: keeps it, stale.
    Expire,
}

/// The store's arguments for invalidating `keys` with their `leases` (in
/// the same order).
fn invalidations<'a>(keys: &'a [Vec<u8>], leases: &'a [Vec<u8>]) -> Vec<Invalidate<'a>> {
    keys.iter()
        .zip(leases)
        .map(|(key, lease_key)| Invalidate { key, lease_key })
        .collect()
}

/// The error of an invalidation that did not get through; when the last
/// attempt (failed at `at`) was refused by the store's open breaker, it says
/// when that ends.
fn undelivered(
    key: &[u8],
    more: usize,
    attempts: u32,
    last: Error,
    at: Instant,
    took: Duration,
) -> Error {
    let retry_after = last
        .retry_after()
        .map(|after| after.saturating_sub(at.elapsed()));
    let what = match more {
        0 => show_key(key).to_string(),
        n => format!("{} and {n} other key(s)", show_key(key)),
    };
    let err = Error::new(
        ErrorKind::Store,
        format!(
            "the invalidation of {what} was not delivered ({attempts} attempt(s) in {took:.1?}): \
             other processes may serve the old value until its TTL ends; retry it",
        ),
    )
    .with_source(last);
    match retry_after {
        Some(after) => err.with_retry_after(after),
        None => err,
    }
}
