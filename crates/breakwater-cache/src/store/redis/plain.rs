//! A cluster's revoking writes as plain pipelines, one per node, where
//! one server runs them as transactions.
//!
//! On one server a bulk write is one transaction per 1,024 keys. On a
//! cluster a transaction must keep to one hash slot, and a batch of keys
//! spreads over every slot: `set_many` and `invalidate_many` paid a
//! transaction (and a `PUBLISH`, which a cluster sends to every node) per
//! key or two, and a lone `set` a script run (3.5 times a `SET`'s server
//! time). Here a bulk write's keys are grouped by the primary serving
//! their slot (as the store's slot map has it, see `slots`), and each
//! group goes out as one plain pipeline to that node: per key the
//! command that revokes its lease (`SREM` off the lease index, see
//! `index`), then its write, and one `PUBLISH` naming them all at the
//! end. A lone `set` is the `REPLACE` script's commands (`DEL` of the
//! lease, `SET`, `PUBLISH`) as one pipeline; concurrent ones are combined
//! into such pipelines per node (see `writes`).
//!
//! Not atomic, but ordered: a node runs one connection's commands in
//! order, so a key's lease is revoked before its write lands (a fill that
//! comes between is refused, as after a transaction) and its notice goes
//! out after it (as after a transaction). A command about a slot the node
//! does not serve (the map is stale: a slot moved, or is migrating)
//! answers `MOVED` or `ASK` without running; so does any other refusal
//! (`OOM`). The cluster connection follows such a refusal by sending the
//! whole pipeline to the node it names (where the other keys are refused
//! in turn) until its retries end, so a step may run more than once
//! while a slot moves; then it gives up. Every key of such a step, and
//! every key refused, is written again, its revocation and its write
//! together, as the per-slot transaction (or the script) of the
//! single-server path, before the call returns: so while a slot migrates
//! (its lease index may move before its value), a write that landed
//! without its revocation is written again after it, and what stands
//! when the call returns is as after a transaction. A redirected key is
//! also named in its first notice: an extra notice makes other processes
//! drop a near-cache entry, no more.
//!
//! Hand-rolled because redis-rs's cluster connection refuses a pipeline
//! whose commands cross slots (even on one node), and splitting it per
//! slot is what cost the transactions.

use std::sync::Arc;

use futures_util::StreamExt;
use redis::{Cmd, Pipeline, Value};

use super::command::{WRITE_STEP_KEYS, WRITE_STEPS_IN_FLIGHT, add_to_run, wrong_count};
use super::conn::store_error;
use super::connection::{RedisCore, hash_slot};
use super::index;
use super::latency::DeadlineKind;
use super::slots::{Nodes, UNKNOWN};
use crate::error::Error;
use crate::store::{Invalidate, Notice, Replace};

/// What a plain step adds for one key: its commands, in order (the
/// revocation first).
pub(super) trait PlainWrite {
    /// The key written.
    fn key(&self) -> &[u8];
    /// The bytes it sends (its key and value), for [`WRITE_STEP_BYTES`](super::command::WRITE_STEP_BYTES).
    fn bytes(&self) -> usize;
    /// How many commands [`add`](PlainWrite::add) adds.
    const COMMANDS: usize;
    /// Adds this key's commands to `pipe`; `index` is a buffer for its
    /// lease index's key.
    fn add(&self, pipe: &mut Pipeline, ttl_ms: u64, index: &mut Vec<u8>);
}

/// `SET key value PX ttl_ms` of `write`, sized up front (grown argument
/// by argument, a command took a reallocation or two per key).
pub(super) fn set_px(write: &Replace<'_>, ttl_ms: u64) -> Cmd {
    // "SET", "PX" and the TTL's digits: 25 bytes at most.
    let mut set = Cmd::with_capacity(5, write.key.len() + write.value.len() + 25);
    set.arg("SET")
        .arg(write.key)
        .arg(write.value)
        .arg("PX")
        .arg(ttl_ms);
    set
}

/// A lone write's commands in the `REPLACE` script's order: `DEL` of its
/// lease (which revokes a load of any build, an earlier one's too), then
/// its `SET … PX`.
pub(super) fn revoke_then_set(pipe: &mut Pipeline, write: &Replace<'_>, ttl_ms: u64) {
    pipe.cmd("DEL").arg(write.lease_key);
    pipe.add_command(set_px(write, ttl_ms));
}

/// `SREM` of the lease from its index (see `index`), the lease's key taken
/// from the write.
fn unlist(pipe: &mut Pipeline, lease: &[u8], index: &mut Vec<u8>) {
    index::index_key_into(index, lease, true);
    pipe.add_command(index::srem(index, std::iter::once(lease)));
}

impl PlainWrite for Replace<'_> {
    fn key(&self) -> &[u8] {
        self.key
    }
    fn bytes(&self) -> usize {
        self.key.len() + self.lease_key.len() + self.value.len()
    }
    const COMMANDS: usize = 2;
    fn add(&self, pipe: &mut Pipeline, ttl_ms: u64, index: &mut Vec<u8>) {
        unlist(pipe, self.lease_key, index);
        pipe.add_command(set_px(self, ttl_ms));
    }
}

impl PlainWrite for Invalidate<'_> {
    fn key(&self) -> &[u8] {
        self.key
    }
    fn bytes(&self) -> usize {
        self.key.len() + self.lease_key.len()
    }
    const COMMANDS: usize = 2;
    fn add(&self, pipe: &mut Pipeline, _ttl_ms: u64, index: &mut Vec<u8>) {
        unlist(pipe, self.lease_key, index);
        pipe.cmd("DEL").arg(self.key);
    }
}

/// The positions of `keys` grouped by the primary serving their slot (in
/// runs of [`WRITE_STEP_KEYS`] and, with the positions weighing `bytes`,
/// [`WRITE_STEP_BYTES`](super::command::WRITE_STEP_BYTES)), and those whose slot no primary is known for.
pub(super) fn by_node(
    keys: &[&[u8]],
    bytes: impl Fn(usize) -> usize,
    nodes: &Nodes,
) -> (Vec<Vec<usize>>, Vec<usize>) {
    let (mut groups, mut sizes) = (Vec::new(), Vec::new());
    let mut open: Vec<Option<usize>> = Vec::new();
    let mut unknown = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let node = nodes[usize::from(hash_slot(key))];
        if node == UNKNOWN {
            unknown.push(i);
            continue;
        }
        let node = usize::from(node);
        if open.len() <= node {
            open.resize(node + 1, None);
        }
        open[node] = Some(add_to_run(
            &mut groups,
            &mut sizes,
            open[node],
            (i, bytes(i)),
            WRITE_STEP_KEYS,
        ));
    }
    (groups, unknown)
}

/// Whether a reply is Redis refusing its command.
pub(super) fn refused(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(_))
}

impl RedisCore {
    /// A bulk write on a cluster (`writes`, their keys `keys`): one plain
    /// pipeline per primary (as the
    /// slot map has it; [`WRITE_STEP_KEYS`] at most),
    /// [`WRITE_STEPS_IN_FLIGHT`] at a time. The positions to write again
    /// per slot (refused there, or of a slot no primary is known for; all
    /// of them with no slot map), and the first step's error, if any (the
    /// others ran to their end).
    pub(super) async fn plain_steps<W: PlainWrite + Sync>(
        self: &Arc<Self>,
        keys: &[&[u8]],
        writes: &[W],
        ttls: &[u64],
        notice: Notice<'_>,
    ) -> (Vec<usize>, Option<Error>) {
        let (groups, mut refused) = match self.slot_map().await {
            Some(nodes) => by_node(keys, |i| writes[i].bytes(), &nodes),
            None => (Vec::new(), (0..keys.len()).collect()),
        };
        let done: Vec<Result<Vec<usize>, Error>> = futures_util::stream::iter(
            groups
                .into_iter()
                .map(|group| self.plain_step(writes, ttls, group, notice)),
        )
        .buffer_unordered(WRITE_STEPS_IN_FLIGHT)
        .collect()
        .await;
        let mut failed = None;
        for step in done {
            match step {
                Ok(positions) => refused.extend(positions),
                Err(err) => failed = failed.or(Some(err)),
            }
        }
        refused.sort_unstable();
        (refused, failed)
    }

    /// The slot map, asked for if it is due (see `slots`); `None` if none
    /// is known (and asking failed).
    pub(super) async fn slot_map(self: &Arc<Self>) -> Option<Nodes> {
        let (known, due) = self.slots.current();
        if known.is_some() && !due {
            return known;
        }
        // With a map known (if stale), no wait: another caller may be
        // asking already. Without one, wait for the caller asking, within a
        // read deadline (then write per slot).
        let _asking = if known.is_some() {
            match self.slots.asking.try_lock() {
                Ok(asking) => asking,
                Err(_) => return known,
            }
        } else {
            let wait = self.latency.deadline(0, DeadlineKind::Read);
            match tokio::time::timeout(wait, self.slots.asking.lock()).await {
                Ok(asking) => asking,
                Err(_) => return self.slots.current().0,
            }
        };
        let Some(ask) = self.slots.begin_ask() else {
            return self.slots.current().0;
        };
        let known = self.slots.current().0;
        let asked = self
            .call(DeadlineKind::Read, 0, |mut conn| async move {
                conn.cluster_slots().await
            })
            .await;
        ask.done();
        match asked {
            Ok(reply) => self.slots.learn(&reply),
            Err(err) => {
                tracing::debug!(error = %err, "CLUSTER SLOTS failed; bulk writes go per slot");
                known
            }
        }
    }

    /// One plain step: the writes at the positions `group` (one primary's
    /// slots, as the slot map has it), their TTLs in ms `ttls` (by
    /// position; unused by invalidations), and one `PUBLISH` of the notice
    /// naming their keys, as one pipeline to the primary of the first
    /// key's slot. The positions whose commands were refused (to be written
    /// again; all of them if the cluster redirected the step), or the
    /// step's error (no reply, or the notice refused).
    async fn plain_step<W: PlainWrite>(
        self: &Arc<Self>,
        writes: &[W],
        ttls: &[u64],
        group: Vec<usize>,
        notice: Notice<'_>,
    ) -> Result<Vec<usize>, Error> {
        let Some(&first) = group.first() else {
            return Ok(Vec::new());
        };
        let mut pipe = Pipeline::with_capacity(group.len() * W::COMMANDS + 1);
        let mut index = Vec::new();
        for &i in &group {
            writes[i].add(&mut pipe, ttls.get(i).copied().unwrap_or(0), &mut index);
        }
        let message = notice.for_keys(group.iter().map(|&i| writes[i].key()));
        pipe.cmd("PUBLISH").arg(notice.channel).arg(&message);
        let first = writes[first].key();
        // Redirected: every key is written again per slot.
        let Some(replies) = self.unredirected(&pipe, first).await? else {
            self.slots.suspect();
            return Ok(group);
        };
        if replies.len() != pipe.len() {
            return Err(wrong_count("a cluster's bulk write"));
        }
        let (each, published) = replies.split_at(replies.len() - 1);
        if let [Value::ServerError(err)] = published {
            return Err(store_error(err.clone().into()));
        }
        let refused: Vec<usize> = group
            .iter()
            .zip(each.chunks(W::COMMANDS))
            .filter(|(_, replies)| replies.iter().any(refused))
            .map(|(&i, _)| i)
            .collect();
        if !refused.is_empty() {
            self.slots.suspect();
        }
        Ok(refused)
    }

    /// Runs `pipe` on the primary of `key`'s slot under the write
    /// deadline, with each command's reply; `None` if the cluster
    /// connection gave up on a refusal that names another node (`MOVED`,
    /// `ASK`: it sends the whole pipeline there, where the other keys are
    /// refused in turn, until its retries end).
    pub(super) async fn unredirected(
        self: &Arc<Self>,
        pipe: &Pipeline,
        key: &[u8],
    ) -> Result<Option<Vec<Value>>, Error> {
        self.call(
            DeadlineKind::Write,
            self.domain(key),
            |mut conn| async move {
                match conn.replies(pipe, hash_slot(key)).await {
                    Err(err) if err.redirect_node().is_some() => Ok(None),
                    replies => replies.map(Some),
                }
            },
        )
        .await
    }

    /// A lone [`replace`](crate::store::Store::replace) on a cluster:
    /// [`revoke_then_set`], then the `PUBLISH`, as one plain pipeline in
    /// the script's order (see above). `Ok(false)` if a command was refused or
    /// the cluster redirected it (a slot migrating): the caller runs the
    /// script instead, which the cluster connection redirects itself.
    pub(super) async fn replace_plain(
        self: &Arc<Self>,
        write: Replace<'_>,
        ttl_ms: u64,
        notice: Notice<'_>,
    ) -> Result<bool, Error> {
        let mut pipe = Pipeline::with_capacity(3);
        revoke_then_set(&mut pipe, &write, ttl_ms);
        pipe.cmd("PUBLISH").arg(notice.channel).arg(notice.message);
        let replies = self.unredirected(&pipe, write.key).await?;
        Ok(replies
            .is_some_and(|replies| replies.len() == pipe.len() && !replies.iter().any(refused)))
    }
}
