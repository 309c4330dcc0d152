//! Commands under their deadlines: one command on the live connection
//! ([`RedisCore::call`]: its deadline follows the latency Redis has, a broken
//! connection is retried once, a timeout has it probed), a script through
//! it ([`RedisCore::eval`]), a revoking write that a Sentinel store remembers
//! for the next master ([`RedisCore::revoke`]), and one command per group of
//! keys that share a hash slot ([`RedisCore::per_slot`]).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use redis::FromRedisValue;
use tokio::time::Instant;

use super::conn::{Conn, MasterAddr, store_error};
use super::connection::{RedisCore, Topology, hash_slot};
use super::latency::DeadlineKind;
use super::scripts::{Invocation, run_script};
use super::sentinel::{self, Revocation};
use crate::error::{Error, ErrorKind};
use crate::jitter::poll_delay;

/// The most keys in one transaction of `replace_many` or
/// `invalidate_many`.
pub(super) const WRITE_STEP_KEYS: usize = 1_024;

/// The most bytes (keys and values) one step of a bulk write carries:
/// 1 MiB. A step is one transaction (or a cluster node's pipeline) on the
/// store's one multiplexed connection, so a small `GET` sent meanwhile
/// queues behind at most [`WRITE_STEPS_IN_FLIGHT`] of them, and a step
/// goes through well within a write deadline (150 MiB in one step of
/// 1,024 keys did not). A value larger than this is a step of its own.
pub(super) const WRITE_STEP_BYTES: usize = 1 << 20;

/// Adds position `i` (of `bytes` bytes) to the run `open` (an index into
/// `runs`, with its bytes in `sizes`) if it has room for it (fewer than
/// `keys` positions and, unless empty, [`WRITE_STEP_BYTES`] with it), else
/// to a new run; the run it went to.
pub(super) fn add_to_run(
    runs: &mut Vec<Vec<usize>>,
    sizes: &mut Vec<usize>,
    open: Option<usize>,
    (i, bytes): (usize, usize),
    keys: usize,
) -> usize {
    match open {
        Some(r) if runs[r].len() < keys && sizes[r].saturating_add(bytes) <= WRITE_STEP_BYTES => {
            runs[r].push(i);
            sizes[r] += bytes;
            r
        }
        _ => {
            runs.push(vec![i]);
            sizes.push(bytes);
            runs.len() - 1
        }
    }
}

/// How many transactions of one `replace_many` or `invalidate_many` run at
/// a time: enough to keep a server busy (4 of 1,024 writes on one server),
/// few enough that none waits a write deadline behind the others. (A
/// cluster's steps are per node, see `plain`: when they were per slot, a
/// key or a few each, 256 in flight made `set_many` on a local 3-node
/// cluster 2.6 times slower, its connection's bookkeeping of many routed
/// pipelines at once.)
pub(super) const WRITE_STEPS_IN_FLIGHT: usize = 4;

/// How many keys one `MGET` or lease script of a batch carries.
const BATCH_COMMAND_KEYS: usize = 256;

impl RedisCore {
    /// Runs one command on the connection, about a key of failure domain
    /// `domain`, within the deadline of `op` there (see `latency`); its
    /// round trip is recorded, a timeout as a round trip of the whole
    /// deadline. A broken connection is dropped
    /// (the next call reconnects); a timeout has the connection probed
    /// ([`suspect`](RedisCore::suspect)). A broken connection
    /// (not a timeout: that would double the deadline) is retried once on a
    /// fresh connection after a short jittered pause, so a Redis restart or a
    /// failover costs a request nothing; broken again, the error says Redis
    /// is [unreachable](Error::is_unreachable).
    pub(super) async fn call<T, F, Fut>(
        self: &Arc<Self>,
        op: DeadlineKind,
        domain: usize,
        command: F,
    ) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.revive();
        let mut retried = false;
        loop {
            let wait = self.latency.deadline(domain, op);
            // One deadline for the call: waiting for a reconnect in
            // progress counts against it (not for the first connection,
            // which the call waits for in full: then the command's deadline
            // starts once it is made, from the latency it measured).
            let mut sent = Instant::now();
            let mut deadline = sent + wait;
            let (live, waited) = match self.current() {
                Some(live) => (live, false),
                // Boxed: no connection is the rare case, and its wait
                // would grow every command's future.
                None => match Box::pin(self.conn(deadline, false)).await? {
                    (live, true) => {
                        sent = Instant::now();
                        deadline = sent + self.latency.deadline(domain, op);
                        (live, false)
                    }
                    (live, false) => (live, true),
                },
            };
            // A cluster connection reconnects each node on its own, and one
            // node's failure says nothing about the others': it is kept, and
            // a failed command is not retried on it.
            let cluster = matches!(live.conn, Conn::Cluster(_));
            let generation = live.generation;
            let sentinel_master = live.conn.master().is_some();
            let mut reply = pin!(command(live.conn));
            let outcome = loop {
                match tokio::time::timeout_at(deadline, reply.as_mut()).await {
                    Ok(outcome) => break outcome,
                    // After waiting for a reconnect: what was left of the
                    // deadline ran out, which says nothing about the new
                    // connection; it is kept.
                    Err(_) if waited => {
                        return Err(Error::new(
                            ErrorKind::Store,
                            "redis did not answer in time (part of the deadline went to a reconnect)",
                        ));
                    }
                    // The command's own deadline (the connection allows the
                    // longest of them): as a timeout reported by the
                    // connection. The reply takes at least that long: the
                    // next deadline grows. Another command's timeout may
                    // have grown it already (they were sent together): then
                    // this one waits on for its reply, to that deadline, so
                    // a burst of commands when Redis slows down costs one
                    // failure, not one each (which would open the store's
                    // breaker).
                    Err(_) => {
                        let now = Instant::now();
                        let news = self.latency.timed_out(domain, deadline - sent, now);
                        let grown = sent + self.latency.deadline(domain, op);
                        if !news && grown > now {
                            deadline = grown;
                            continue;
                        }
                        if !cluster {
                            self.suspect(generation);
                        }
                        tracing::debug!(
                            after = ?deadline - sent,
                            next = ?self.latency.deadline(domain, op),
                            "redis did not answer in time; the next deadline grows"
                        );
                        return Err(Error::new(ErrorKind::Store, "redis did not answer in time"));
                    }
                }
            };
            match outcome {
                Ok(value) => {
                    // Not after a reconnect: part of the time went to it.
                    if !waited {
                        let now = Instant::now();
                        self.latency.record(domain, now - sent, now);
                    }
                    return Ok(value);
                }
                Err(err) => {
                    let broken = err.is_connection_dropped()
                        || err.is_io_error()
                        || err.is_connection_refusal()
                        // The sentinels' master was demoted: the connection
                        // is made again to the master they name now.
                        || (sentinel_master && sentinel::moved(&err));
                    if broken && !cluster {
                        self.forget(generation);
                    } else if err.is_timeout() && !cluster {
                        self.suspect(generation);
                    }
                    if !broken && !err.is_timeout() && !waited {
                        // Redis answered, with an error: a round trip.
                        let now = Instant::now();
                        self.latency.record(domain, now - sent, now);
                    }
                    if !broken || err.is_timeout() || retried || cluster {
                        let err = store_error(err);
                        return Err(if broken && !cluster {
                            err.unreachable()
                        } else {
                            err
                        });
                    }
                    retried = true;
                    let pause = {
                        let mut rng: StdRng = rand::make_rng();
                        poll_delay(Duration::from_millis(10), &mut rng)
                    };
                    tracing::debug!(error = %err, ?pause, "redis connection broken; retrying once");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// One command about `key` through [`call`](Self::call), with the
    /// deadline of `op`.
    pub(super) async fn query<T: FromRedisValue>(
        self: &Arc<Self>,
        op: DeadlineKind,
        key: &[u8],
        cmd: &redis::Cmd,
    ) -> Result<T, Error> {
        self.call(op, self.domain(key), |mut conn| async move {
            cmd.query_async(&mut conn).await
        })
        .await
    }

    /// One script invocation through [`call`](Self::call), with the write
    /// deadline: `EVALSHA`, then `EVAL` if the node does not have the
    /// script.
    pub(super) async fn eval<T: FromRedisValue>(
        self: &Arc<Self>,
        script: Invocation<'_>,
    ) -> Result<T, Error> {
        let (script, domain) = (&script, self.script_domain(&script));
        self.call(DeadlineKind::Write, domain, |mut conn| async move {
            run_script(&mut conn, script).await
        })
        .await
    }

    /// A write that revokes (`INVALIDATE`, `REPLACE`, `EXPIRE_ENTRY`)
    /// through [`eval`](Self::eval), with the script's reply. On a Sentinel
    /// store it counts only if the master that acknowledged it is still the
    /// one the sentinels name, and it is remembered, to be applied again on
    /// the next master should the failover have lost it (see `sentinel`;
    /// an expiry is applied again as an invalidation, which is stronger).
    pub(super) async fn revoke(
        self: &Arc<Self>,
        script: Invocation<'_>,
        revoked: &[Revocation<'_>],
    ) -> Result<i64, Error> {
        let (script, domain) = (&script, self.script_domain(&script));
        let (reply, master) = self
            .call(DeadlineKind::Write, domain, |mut conn| async move {
                let reply: i64 = run_script(&mut conn, script).await?;
                Ok((reply, conn.master().cloned()))
            })
            .await?;
        self.acknowledged(master, revoked)?;
        Ok(reply)
    }

    /// Revocations that the master `master` acknowledged (`None`: not a
    /// Sentinel store), recorded for the next failover; an error if the
    /// sentinels have named another master since.
    pub(super) fn acknowledged(
        &self,
        master: Option<MasterAddr>,
        revoked: &[Revocation<'_>],
    ) -> Result<(), Error> {
        match (self.target.sentinel(), master) {
            (Some(sentinel), Some(master)) => sentinel.acknowledged(&master, revoked),
            _ => Ok(()),
        }
    }

    /// The failure domain of `script`'s keys (they share a hash slot).
    fn script_domain(&self, script: &Invocation<'_>) -> usize {
        script.first_key().map_or(0, |key| self.domain(key))
    }

    /// The positions of `keys` grouped for one multi-key command each: on a
    /// single server in runs of [`BATCH_COMMAND_KEYS`]; on a cluster by
    /// hash slot (a command's keys must share one), then in such runs.
    pub(super) fn by_slot(&self, keys: &[&[u8]]) -> Vec<Vec<usize>> {
        self.by_slot_in_runs(keys, BATCH_COMMAND_KEYS, |_| 0)
    }

    /// Whether the store is a Redis Cluster (keys are grouped by hash slot).
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.target, Topology::Cluster { .. })
    }

    /// [`by_slot`](Self::by_slot) in runs of up to `run` keys and (for
    /// a bulk write, whose positions weigh `bytes`) up to
    /// [`WRITE_STEP_BYTES`] (see [`add_to_run`]).
    pub(super) fn by_slot_in_runs(
        &self,
        keys: &[&[u8]],
        run: usize,
        bytes: impl Fn(usize) -> usize,
    ) -> Vec<Vec<usize>> {
        let (mut groups, mut sizes) = (Vec::new(), Vec::new());
        if self.is_cluster() {
            let mut slots: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
            for (i, key) in keys.iter().enumerate() {
                let slot = hash_slot(key);
                let open = slots.get(&slot).copied();
                let at = add_to_run(&mut groups, &mut sizes, open, (i, bytes(i)), run);
                slots.insert(slot, at);
            }
        } else {
            let mut open = None;
            for i in 0..keys.len() {
                open = Some(add_to_run(
                    &mut groups,
                    &mut sizes,
                    open,
                    (i, bytes(i)),
                    run,
                ));
            }
        }
        groups
    }

    /// Runs `command` once per group of `keys` ([`by_slot`](Self::by_slot)),
    /// side by side; its replies in the order of `keys` (`what` names the
    /// command, should a reply have the wrong length).
    pub(super) async fn per_slot<T, F, Fut>(
        &self,
        keys: &[&[u8]],
        what: &str,
        command: F,
    ) -> Result<Vec<T>, Error>
    where
        F: Fn(&[usize]) -> Fut,
        Fut: Future<Output = Result<Vec<T>, Error>>,
    {
        let groups = self.by_slot(keys);
        // One group (one server, or keys of one slot): its positions are
        // every key's in order, and its reply needs no putting back.
        if let [group] = groups.as_slice() {
            let reply = command(group).await?;
            if reply.len() != keys.len() {
                return Err(wrong_count(what));
            }
            return Ok(reply);
        }
        let replies = futures_util::future::join_all(groups.iter().map(|g| command(g))).await;
        let mut out: Vec<Option<T>> = (0..keys.len()).map(|_| None).collect();
        for (group, reply) in groups.iter().zip(replies) {
            let reply = reply?;
            if reply.len() != group.len() {
                return Err(wrong_count(what));
            }
            for (&i, value) in group.iter().zip(reply) {
                out[i] = Some(value);
            }
        }
        // `by_slot` puts every position in one group.
        out.into_iter()
            .map(|value| value.ok_or_else(|| wrong_count(what)))
            .collect()
    }
}

/// Redis answered `what` with the wrong number of replies.
pub(super) fn wrong_count(what: &str) -> Error {
    Error::new(
        ErrorKind::Store,
        format!("redis answered {what} with the wrong number of replies"),
    )
}
