//! The writer task of [`writes`](super::writes): queues a cluster's
//! concurrent lone writes and sends them, one plain pipeline per node.

use std::sync::Arc;
use std::time::Duration;

use redis::{Pipeline, Value};
use tokio::sync::oneshot;

use super::command::wrong_count;
use super::conn::store_error;
use super::connection::RedisCore;
use super::latency::DeadlineKind;
use super::plain::{self, refused, set_px};
use super::slots::Nodes;
use super::writes::Queued;
use crate::error::{Error, ErrorKind};
use crate::store::{Notice, Replace};

/// Clears the writer's place if its task is dropped with its runtime
/// before it ended; the writes still queued are dropped then (their
/// callers get an error: not sent).
struct Writer {
    core: Arc<RedisCore>,
    ended: bool,
}

impl Writer {
    /// The task ended on its own (its place is cleared already).
    fn end(mut self) {
        self.ended = true;
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.ended {
            let mut queue = self.core.writes.lock();
            queue.writer = None;
            queue.queued.clear();
        }
    }
}

impl RedisCore {
    /// A lone replace on a cluster while others are in flight: `write`
    /// (its TTL `ttl_ms`, its notice on `notice.channel` as part of a
    /// message headed `head`) queued for this runtime's writer task
    /// (started if none runs), and its outcome: `Ok(false)` if Redis
    /// refused or redirected it (the caller runs the script). `None` if it
    /// was not queued (no runtime, or the writer runs on another one): the
    /// caller sends it itself.
    pub(super) async fn replace_queued(
        self: &Arc<Self>,
        write: &Replace<'_>,
        ttl_ms: u64,
        notice: Notice<'_>,
        head: &[u8],
    ) -> Option<Result<bool, Error>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (reply, outcome) = oneshot::channel();
        let queued = Queued {
            key: write.key.to_vec(),
            value: write.value.to_vec(),
            ttl_ms,
            lease_key: write.lease_key.to_vec(),
            channel: notice.channel.to_vec(),
            head: head.to_vec(),
            reply,
        };
        let start = {
            let mut queue = self.writes.lock();
            let start = match queue.writer {
                Some(id) if id != runtime.id() => return None,
                Some(_) => false,
                None => true,
            };
            queue.queued.push(queued);
            if start {
                queue.writer = Some(runtime.id());
            }
            start
        };
        if start {
            // Spawned with the lock released: a runtime shutting down drops
            // the task at once, and its guard takes the lock.
            let writer = Writer {
                core: Arc::clone(self),
                ended: false,
            };
            runtime.spawn(async move {
                writer.core.write_queued().await;
                writer.end();
            });
        }
        // The step in flight, asking for the slot map, and this write's own.
        let domain = self.domain(write.key);
        let wait = self.latency.deadline(domain, DeadlineKind::Write) * 2
            + self.latency.deadline(0, DeadlineKind::Read);
        Some(match tokio::time::timeout(wait, outcome).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err(Error::new(
                ErrorKind::Store,
                "a queued write was not sent: its runtime shut down",
            )),
            // Not sent from now on, if it was not yet.
            Err(_) => Err(Error::new(
                ErrorKind::Store,
                "redis did not answer a queued write in time (it may have landed)",
            )),
        })
    }

    /// The writer: sends what is queued, a step per node side by side,
    /// until nothing is.
    async fn write_queued(self: &Arc<Self>) {
        loop {
            let queued = {
                let mut queue = self.writes.lock();
                if queue.queued.is_empty() {
                    // Under the lock: a write queued from now on starts the
                    // next writer.
                    queue.writer = None;
                    return;
                }
                std::mem::take(&mut queue.queued)
            };
            // A write whose caller went away is not sent: it must not land
            // after its caller gave up on it.
            let queued: Vec<Queued> = queued
                .into_iter()
                .filter(|q| !q.reply.is_closed())
                .collect();
            if queued.is_empty() {
                continue;
            }
            let steps = by_node(queued, self.slot_map().await.as_ref());
            futures_util::future::join_all(steps.into_iter().map(|step| self.write_step(step)))
                .await;
        }
    }

    /// One node's writes (as the slot map has it; up to
    /// [`WRITE_STEP_KEYS`](super::command::WRITE_STEP_KEYS)): per write the `DEL` of
    /// its lease and its `SET`, then one `PUBLISH` per channel and head
    /// naming their keys, as one pipeline to the primary of the first
    /// key's slot. Each writer gets its outcome: `Ok(false)` if its write
    /// was refused or the step redirected.
    async fn write_step(self: &Arc<Self>, step: Vec<Queued>) {
        let mut pipe = Pipeline::with_capacity(step.len() * 2 + 1);
        for q in &step {
            pipe.cmd("DEL").arg(&q.lease_key);
            let write = Replace {
                key: &q.key,
                value: &q.value,
                ttl: Duration::from_millis(q.ttl_ms),
                lease_key: &q.lease_key,
            };
            pipe.add_command(set_px(&write, q.ttl_ms));
        }
        // Each message: the position of its first write, and of all.
        let mut messages: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, q) in step.iter().enumerate() {
            let open = messages.iter().position(|(first, _)| {
                let first = &step[*first];
                first.channel == q.channel && first.head == q.head
            });
            match open {
                Some(at) => messages[at].1.push(i),
                None => messages.push((i, vec![i])),
            }
        }
        for (first, keys) in &messages {
            let first = &step[*first];
            let notice = Notice {
                channel: &first.channel,
                message: &first.head,
                batch_head: None,
            };
            let message = notice.for_keys(keys.iter().map(|&i| step[i].key.as_slice()));
            pipe.cmd("PUBLISH").arg(&first.channel).arg(message);
        }
        let each: Vec<Result<bool, Error>> = match self.unredirected(&pipe, &step[0].key).await {
            Err(err) => vec![Err(err); step.len()],
            Ok(None) => {
                self.slots.suspect();
                vec![Ok(false); step.len()]
            }
            Ok(Some(replies)) if replies.len() != pipe.len() => {
                vec![Err(wrong_count("a cluster's queued writes")); step.len()]
            }
            Ok(Some(replies)) => {
                let (writes, published) = replies.split_at(step.len() * 2);
                let mut each: Vec<Result<bool, Error>> = writes
                    .chunks(2)
                    .map(|replies| Ok(!replies.iter().any(refused)))
                    .collect();
                if each.iter().any(|e| matches!(e, Ok(false))) {
                    self.slots.suspect();
                }
                // A write that landed but whose notice was refused fails.
                for ((_, keys), reply) in messages.iter().zip(published) {
                    if let Value::ServerError(err) = reply {
                        for &i in keys {
                            if matches!(each[i], Ok(true)) {
                                each[i] = Err(store_error(err.clone().into()));
                            }
                        }
                    }
                }
                each
            }
        };
        for (q, outcome) in step.into_iter().zip(each) {
            // A writer that went away takes no outcome.
            let _ = q.reply.send(outcome);
        }
    }
}

/// `queued` grouped by the primary serving their slot (see
/// [`plain::by_node`]); a write whose slot no primary is known for (or
/// with no slot map) is a step of its own.
fn by_node(queued: Vec<Queued>, nodes: Option<&Nodes>) -> Vec<Vec<Queued>> {
    let Some(nodes) = nodes else {
        return queued.into_iter().map(|q| vec![q]).collect();
    };
    let keys: Vec<&[u8]> = queued.iter().map(|q| q.key.as_slice()).collect();
    let (steps, unknown) = plain::by_node(&keys, nodes);
    let mut queued: Vec<Option<Queued>> = queued.into_iter().map(Some).collect();
    let mut take = |i: usize| queued[i].take().expect("by_node names each position once");
    let mut steps: Vec<Vec<Queued>> = steps
        .into_iter()
        .map(|step| step.into_iter().map(&mut take).collect())
        .collect();
    steps.extend(unknown.into_iter().map(|i| vec![take(i)]));
    steps
}
