//! The writer task of [`writes`](super::writes): queues a cluster's
//! concurrent lone writes and sends them, one plain pipeline per node.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use redis::Pipeline;
use tokio::sync::oneshot;

use super::command::wrong_count;
use super::connection::{RedisCore, hash_slot};
use super::plain::{self, refused};
use super::slots::Nodes;
use super::writes::Queued;
use crate::error::{Error, ErrorKind};
use crate::store::{Notice, Replace};

/// The slot map being asked for ([`RedisCore::slot_map`]).
type SlotAsk<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Nodes>> + Send + 'a>>;

/// Clears the writer's place if its task is dropped (with its runtime,
/// or unwinding) before it ended; the writes still queued are dropped
/// then, and its held and in-flight ones with the task (their callers get
/// an error; those on the wire may have landed).
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
        if !start {
            self.writes.queued.notify_one();
        }
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
        // No timer: the writer runs on this runtime, so it runs while this
        // waits, and each of its steps has its store deadline.
        Some(outcome.await.unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Store,
                "a queued write's writer stopped (its runtime shut down) before it was answered (it may have landed)",
            ))
        }))
    }

    /// The writer: sends what is queued, one step per node at a time
    /// (what comes for a node while its step is in flight waits for it,
    /// and goes out together next; other nodes' steps go on meanwhile),
    /// until nothing is queued, held or in flight.
    async fn write_queued(self: &Arc<Self>) {
        let mut in_flight = futures_util::stream::FuturesUnordered::new();
        let mut busy: HashSet<u16> = HashSet::new();
        let mut held: HashMap<u16, Vec<Queued>> = HashMap::new();
        // A node's held writes once its step is answered: grouped again by
        // the map known then (it may have changed).
        let mut released: Vec<Queued> = Vec::new();
        // The slot map, asked for while steps are in flight.
        let mut asking: Option<SlotAsk<'_>> = None;
        loop {
            let mut batch = std::mem::take(&mut released);
            {
                let mut queue = self.writes.lock();
                if queue.queued.is_empty() && in_flight.is_empty() && batch.is_empty() {
                    // Under the lock: a write queued from now on starts the
                    // next writer. (Nothing is held without a step of its
                    // node in flight.)
                    queue.writer = None;
                    return;
                }
                batch.append(&mut queue.queued);
            }
            if !batch.is_empty() {
                // With nothing in flight, the map is waited for if due (a
                // read deadline at most); with steps in flight (which are
                // polled only below), the map known is used, and a due one
                // asked for beside them.
                let nodes = if in_flight.is_empty() {
                    match asking.take() {
                        Some(ask) => ask.await,
                        None => self.slot_map().await,
                    }
                } else {
                    let (known, due) = self.slots.current();
                    if due && asking.is_none() {
                        asking = Some(Box::pin(self.slot_map()));
                    }
                    known
                };
                for (node, step) in by_node(batch, nodes.as_ref()) {
                    match node {
                        Some(node) if !busy.insert(node) => {
                            held.entry(node).or_default().extend(step);
                        }
                        node => in_flight.push(self.write_step(node, step)),
                    }
                }
            }
            if in_flight.is_empty() {
                continue;
            }
            // A step answered (its node's held writes go next), the map
            // asked for, or something queued; the steps are polled (sent)
            // here.
            tokio::select! {
                biased;
                Some(node) = in_flight.next() => {
                    if let Some(node) = node {
                        busy.remove(&node);
                        released = held.remove(&node).unwrap_or_default();
                    }
                }
                _ = async { asking.as_mut().expect("only while asking").await }, if asking.is_some() => {
                    asking = None;
                }
                () = self.writes.queued.notified() => {}
            }
        }
    }

    /// One node's writes (as the slot map has it; up to
    /// [`WRITE_STEP_KEYS`](super::command::WRITE_STEP_KEYS)): per write the `DEL` of
    /// its lease and its `SET`, then one `PUBLISH` per channel and head
    /// naming their keys, as one pipeline to the primary of the first
    /// key's slot. Each writer gets its outcome: `Ok(false)` if its write
    /// or its notice was refused, or the step redirected (the script
    /// writes it again). A write whose caller went away is left out.
    async fn write_step(self: &Arc<Self>, node: Option<u16>, step: Vec<Queued>) -> Option<u16> {
        // A write whose caller went away is not sent: it must not land
        // after its caller gave up on it.
        let step: Vec<Queued> = step.into_iter().filter(|q| !q.reply.is_closed()).collect();
        if step.is_empty() {
            return node;
        }
        let mut pipe = Pipeline::with_capacity(step.len() * 2 + 1);
        for q in &step {
            let write = Replace {
                key: &q.key,
                value: &q.value,
                ttl: Duration::from_millis(q.ttl_ms),
                lease_key: &q.lease_key,
            };
            plain::revoke_then_set(&mut pipe, &write, q.ttl_ms);
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
                // A write whose notice was refused is written again by the
                // script, with its notice (as a lone one is).
                for ((_, keys), reply) in messages.iter().zip(published) {
                    if refused(reply) {
                        for &i in keys {
                            each[i] = Ok(false);
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
        node
    }
}

/// `queued` grouped by the primary serving their slot (see
/// [`plain::by_node`]), each step with its node; a write whose slot no
/// primary is known for (or with no slot map) is a step of its own.
fn by_node(queued: Vec<Queued>, nodes: Option<&Nodes>) -> Vec<(Option<u16>, Vec<Queued>)> {
    let Some(nodes) = nodes else {
        return queued.into_iter().map(|q| (None, vec![q])).collect();
    };
    let keys: Vec<&[u8]> = queued.iter().map(|q| q.key.as_slice()).collect();
    let bytes = |i: usize| queued[i].key.len() + queued[i].lease_key.len() + queued[i].value.len();
    let (steps, unknown) = plain::by_node(&keys, bytes, nodes);
    let node_of = |i: usize| nodes[usize::from(hash_slot(keys[i]))];
    let steps: Vec<(Option<u16>, Vec<usize>)> = steps
        .into_iter()
        .map(|step| (Some(node_of(step[0])), step))
        .chain(unknown.into_iter().map(|i| (None, vec![i])))
        .collect();
    let mut queued: Vec<Option<Queued>> = queued.into_iter().map(Some).collect();
    steps
        .into_iter()
        .map(|(node, step)| {
            let step = step
                .into_iter()
                .map(|i| queued[i].take().expect("by_node names each position once"))
                .collect();
            (node, step)
        })
        .collect()
}
