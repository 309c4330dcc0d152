//! Batched store calls, so that under load many callers do not each pay a
//! round trip and a parse: reads of distinct keys that meet while the store
//! is busy go out as one batch ([`Store::get_many`]: one `MGET`), and so do
//! writes (`set`: [`Store::replace_many`], one transaction).
//!
//! A call goes straight to the store, in the caller's task, while fewer
//! than [`IN_FLIGHT`] of this cache's calls of its kind are in the air: an
//! uncontended hit pays an atomic compare-and-swap and a subtraction for
//! this and nothing else (no lock, no task, no allocation, no timer). A
//! call that finds the store busy is queued instead: the first one queued
//! schedules a task that lets the calls already woken on the runtime have
//! their turn (one yield, [`behind_the_woken`]) and then sends everything
//! queued as one batch; each queued caller gets its reply from there.
//!
//! # Reads
//!
//! Under load this trades one `GET` per key (a request, a reply and a parse
//! in the client and in Redis each) for one per batch: with 50 callers on
//! 50 keys, breakwater reads 1.05 to 1.15 times as fast as raw `GET`s on the
//! same connection (on a current-thread runtime or two workers), although
//! every hit also decodes and judges an envelope. A queued read is as fresh
//! as a `GET` (it is sent after the read was asked for), so the coherence
//! contract is unaffected, and it waits for no other read: only for one
//! yield and its own batch, within the store's deadline.
//!
//! The batch task runs on the runtime of the read that was queued first.
//! A queued read from another runtime cannot count on that one running
//! (a current-thread runtime whose `block_on` returned runs nothing), so
//! it waits no longer than one store read deadline
//! ([`Store::read_deadline`]); then it sends
//! what is queued itself, or, if the stranded batch had already taken its
//! key, reads alone. A read on the batch task's own runtime needs no timer:
//! while it is polled, so is that task.
//!
//! Concurrent readers of *one* key never get here twice: they already
//! share one read ([`Reads`](crate::flight::Reads)).
//!
//! # Writes
//!
//! Concurrent `set`s that find the store busy go out as one
//! [`Store::replace_many`] (on Redis one transaction: one `SREM` taking
//! their leases off the lease index, a `SET … PX` each, one `PUBLISH` naming every key), where each
//! alone is a script run. Each keeps what a `set` promises: its lease is
//! revoked in the same atomic step as its write, it has its own TTL and
//! jitter (sealed before it was queued), other processes hear of its key,
//! and it returns once its batch is acknowledged, with the batch's error if
//! that failed. Two writes of one key in a batch land in the order they
//! were queued. A batch of 16 or more goes out as two such transactions
//! side by side, split by key ([`halves`]), so that one half's callers go
//! on to their next writes while Redis still runs the other. A write is queued only onto a batch whose task runs on its
//! own runtime (from another one it goes straight to the store: it never
//! waits on a runtime that may not run again), and a write whose caller
//! went away before its batch was sent is not sent: a cancelled `set` never
//! lands later.
//!
//! Only stores that ask for it ([`Store::batches_reads`])
//! are read and written this way; a Redis Cluster is not (a batch would
//! split per failure domain there, and a lone `set` is already one
//! pipeline of plain commands). Hand-rolled: what it needs is an admission count
//! and a queue, and a batching crate (a `DataLoader`) would add a timer or
//! a spawn to every call, the hit path included.

use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;

use super::guard::GuardedStore;
use crate::error::{Error, ErrorKind};
use crate::store::{Notice, Replace, Store};

/// Calls of one kind in the air (single, or batches) before further ones
/// are queued.
pub(crate) const IN_FLIGHT: usize = 4;

/// The most keys one batch read carries; a longer queue goes out as
/// several batches side by side.
const MAX_BATCH: usize = 256;

/// One kind of batched store call: what is queued, and how a batch of
/// them is sent.
pub(crate) trait Kind: Send + Sync + Sized + 'static {
    /// One queued call's arguments.
    type Item: Send + 'static;
    /// One call's reply.
    type Reply: Send + 'static;

    /// Sends `queued` as batch calls and hands each caller its reply.
    fn send(
        &self,
        store: &GuardedStore,
        queued: Vec<Queued<Self>>,
    ) -> impl Future<Output = ()> + Send;

    /// The reply of a call whose batch was dropped before it was sent.
    fn dropped() -> Self::Reply;
}

/// A queued call: its arguments and where its reply goes.
pub(crate) struct Queued<K: Kind> {
    item: K::Item,
    reply: oneshot::Sender<K::Reply>,
}

/// The admission count and the queue of one cache's calls of one kind;
/// see the module docs.
pub(crate) struct Queue<K: Kind> {
    /// Calls and batches in the air.
    in_flight: AtomicUsize,
    queue: Mutex<Pending<K>>,
}

impl<K: Kind> Default for Queue<K> {
    fn default() -> Self {
        Queue {
            in_flight: AtomicUsize::new(0),
            queue: Mutex::new(Pending {
                items: Vec::new(),
                runtime: None,
                batch: 0,
            }),
        }
    }
}

/// Reads, queued.
pub(crate) type ReadQueue = Queue<Reads>;

/// Writes (`set`), queued.
pub(crate) type WriteQueue = Queue<Writes>;

/// What is queued, and the runtime whose task will send it.
struct Pending<K: Kind> {
    items: Vec<Queued<K>>,
    runtime: Option<tokio::runtime::Id>,
    /// Counts batches: the task of an older one (whose calls another
    /// caller sent) neither sends nor drops a newer one's.
    batch: u64,
}

impl<K: Kind> std::fmt::Debug for Queue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish()
    }
}

/// A call (or a batch) admitted straight to the store; counted in the air
/// until it ends (also when it is cancelled).
pub(crate) struct Admitted<'a, K: Kind> {
    queue: &'a Queue<K>,
}

impl<K: Kind> Drop for Admitted<'_, K> {
    fn drop(&mut self) {
        self.queue.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// Admits a call straight to the store if fewer than [`IN_FLIGHT`] are in
/// the air; `None`: queue it.
pub(crate) fn admit<K: Kind>(queue: &Queue<K>) -> Option<Admitted<'_, K>> {
    // Counted only when admitted: never over the limit, even for a moment.
    let mut in_flight = queue.in_flight.load(Ordering::Acquire);
    while in_flight < IN_FLIGHT {
        match queue.in_flight.compare_exchange_weak(
            in_flight,
            in_flight + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(Admitted { queue }),
            Err(now) => in_flight = now,
        }
    }
    None
}

/// Where a queued call stands: its reply's receiver, and whether its
/// batch's task runs on another runtime.
struct Enqueued<K: Kind> {
    answer: oneshot::Receiver<K::Reply>,
    elsewhere: bool,
}

/// Queues `item`; if it is the first of its batch, schedules the task that
/// sends the batch (with `kind`, built only then). `join_elsewhere`: whether
/// a call from another runtime than the batch task's (or from outside any)
/// may join it; else it gets its item back.
fn enqueue<K: Kind>(
    store: &Arc<GuardedStore>,
    queue: &Arc<Queue<K>>,
    item: K::Item,
    kind: impl FnOnce() -> K,
    join_elsewhere: bool,
) -> Result<Enqueued<K>, K::Item> {
    let here = crate::background::current_runtime();
    let (reply, answer) = oneshot::channel();
    let (first, elsewhere, batch) = {
        let mut waiting = lock(queue);
        let first = waiting.items.is_empty();
        let elsewhere = !first && waiting.runtime != here;
        if !join_elsewhere && (elsewhere || here.is_none()) {
            return Err(item);
        }
        waiting.items.push(Queued { item, reply });
        if first {
            waiting.runtime = here;
            waiting.batch = waiting.batch.wrapping_add(1);
        }
        (first, elsewhere, waiting.batch)
    };
    if first {
        let flush = Flush {
            store: Arc::clone(store),
            queue: Arc::clone(queue),
            kind: kind(),
            batch: Some(batch),
            taken: false,
        };
        // Outside a runtime nothing can send it: `flush` is dropped here,
        // and so is the queue (this call's reply with it).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                behind_the_woken().await;
                flush.send().await;
            });
        }
    }
    Ok(Enqueued { answer, elsewhere })
}

/// Reads: one `MGET` per batch of up to [`MAX_BATCH`] keys, side by side.
pub(crate) struct Reads;

/// One store read's reply.
type ReadReply = Result<Option<Vec<u8>>, Error>;

impl Kind for Reads {
    type Item = Vec<u8>;
    type Reply = ReadReply;

    async fn send(&self, store: &GuardedStore, queued: Vec<Queued<Self>>) {
        let batches = queued.chunks(MAX_BATCH).map(|batch| async move {
            let keys: Vec<&[u8]> = batch.iter().map(|q| q.item.as_slice()).collect();
            store.get_many_split(&keys).await
        });
        let replies = futures_util::future::join_all(batches).await;
        for (queued, reply) in queued.into_iter().zip(replies.into_iter().flatten()) {
            // A caller that went away does not take its reply.
            let _ = queued.reply.send(reply);
        }
    }

    fn dropped() -> ReadReply {
        Err(Error::new(
            ErrorKind::Store,
            "a queued read got no reply (its batch was dropped: the runtime is shutting down)",
        ))
    }
}

/// Queues a read of `key` and waits for its batch's reply.
///
/// The first read queued schedules a task that, once the reads already
/// woken on this runtime have had their turn (one yield), sends everything
/// queued by then as one batch read. The wait has no timer of its own (one
/// per queued read would cost more than the batching saves): it ends when
/// that task answers or drops the reply, after its one store call, which
/// the store's own deadline bounds.
///
/// A read from another runtime than the batch task's waits at most one
/// store read deadline (see the module docs).
pub(crate) async fn queued(
    store: &Arc<GuardedStore>,
    queue: &Arc<ReadQueue>,
    key: &[u8],
) -> ReadReply {
    let Ok(Enqueued { answer, elsewhere }) = enqueue(store, queue, key.to_vec(), || Reads, true)
    else {
        // Never: a read joins any batch.
        return store.get_inline(key).await;
    };
    if !elsewhere {
        return answer.await.unwrap_or_else(|_| Reads::dropped());
    }
    // Boxed: its timers and the batch it may send would grow every queued
    // read's future (and its allocation).
    Box::pin(from_elsewhere(store, queue, key, answer)).await
}

/// The wait of a read queued from another runtime than its batch task's:
/// at most one store read deadline (see the module docs).
async fn from_elsewhere(
    store: &Arc<GuardedStore>,
    queue: &Arc<ReadQueue>,
    key: &[u8],
    mut answer: oneshot::Receiver<ReadReply>,
) -> ReadReply {
    let within = store.read_deadline();
    if let Ok(reply) = tokio::time::timeout(within, &mut answer).await {
        return reply.unwrap_or_else(|_| Reads::dropped());
    }
    // The batch task's runtime is not running it: send what is queued
    // from here (this read among it, and the others with it), or, if
    // the stranded task already took this read, read alone.
    tracing::debug!(
        ?within,
        "a queued read's batch is late (its runtime is idle); sending it from here"
    );
    Flush {
        store: Arc::clone(store),
        queue: Arc::clone(queue),
        kind: Reads,
        batch: None,
        taken: false,
    }
    .send()
    .await;
    // Sent from here, or by another caller that got there first: its
    // reply comes within one more deadline; else the stranded task had
    // taken it, and this caller reads alone.
    match tokio::time::timeout(within, &mut answer).await {
        Ok(Ok(reply)) => reply,
        _ => store.get_inline(key).await,
    }
}

/// Writes: each batch one [`Store::replace_many`] with one notice.
pub(crate) struct Writes {
    /// The bus channel of the cache's notices.
    channel: Vec<u8>,
    /// The batch message's head (its kind and this cache's sender).
    head: Vec<u8>,
    /// Batches of at least this many go out as [`halves`]
    /// ([`SPLIT_FROM`] but in the simulation).
    split_from: usize,
}

impl Writes {
    /// Batches noticed on `channel`, their message headed `head`, split
    /// from `split_from` writes.
    pub(crate) fn new(channel: &[u8], head: Vec<u8>, split_from: usize) -> Self {
        Writes {
            channel: channel.to_vec(),
            head,
            split_from,
        }
    }
}

/// One queued write: [`Replace`]'s arguments, owned.
pub(crate) struct Write {
    /// Where the value goes.
    pub(crate) key: Vec<u8>,
    /// The sealed entry.
    pub(crate) value: Vec<u8>,
    /// Its store TTL.
    pub(crate) ttl: Duration,
    /// The key's lease, revoked with the write.
    pub(crate) lease_key: Vec<u8>,
}

impl Kind for Writes {
    type Item = Write;
    type Reply = Result<(), Error>;

    async fn send(&self, store: &GuardedStore, queued: Vec<Queued<Self>>) {
        // A write whose caller went away is not sent: it must not land
        // after its caller gave up on it.
        let queued: Vec<Queued<Self>> = queued
            .into_iter()
            .filter(|q| !q.reply.is_closed())
            .collect();
        if queued.is_empty() {
            return;
        }
        let notice = Notice {
            channel: &self.channel,
            message: &self.head,
            batch_head: None,
        };
        let sent = halves(queued, self.split_from).map(|half| async move {
            if half.is_empty() {
                return;
            }
            let writes: Vec<Replace<'_>> = half
                .iter()
                .map(|q| Replace {
                    key: &q.item.key,
                    value: &q.item.value,
                    ttl: q.item.ttl,
                    lease_key: &q.item.lease_key,
                })
                .collect();
            let done = store.replace_many(&writes, notice).await;
            drop(writes);
            for q in half {
                let _ = q.reply.send(done.clone());
            }
        });
        futures_util::future::join_all(sent).await;
    }

    fn dropped() -> Result<(), Error> {
        Err(Error::new(
            ErrorKind::Store,
            "a queued write was not sent (its batch was dropped: the runtime is shutting down)",
        ))
    }
}

/// The writes of a batch of at least this many go out as two
/// transactions side by side (see [`halves`]).
pub(crate) const SPLIT_FROM: usize = 16;

/// A batch's writes as two transactions' worth, split by key (both writes
/// of one key land in one transaction, in the order they were queued), so
/// that one half's callers get their replies, and go on to their next
/// writes, while Redis still works on the other half. On a runtime whose
/// one thread runs the callers and the connection, a batch otherwise has
/// the client and Redis take turns: all its callers seal their writes,
/// then Redis runs them, then the callers hear, then seal again. With 100
/// `set`s in flight on a current-thread runtime: 0.45× raw pipelined
/// `SET`s as one transaction, 0.75–0.85× as halves (`breakwater bench
/// write`); a third or fixed 32 or 64 measured no better. A batch below
/// `split_from` ([`SPLIT_FROM`]) goes out whole.
fn halves(
    queued: Vec<Queued<Writes>>,
    split_from: usize,
) -> impl Iterator<Item = Vec<Queued<Writes>>> {
    let (mut one, mut other) = (Vec::new(), Vec::new());
    if queued.len() < split_from {
        one = queued;
    } else {
        // A fixed seed: a batch splits alike in every run (a simulation's
        // seed replays exactly).
        let by_key = foldhash::fast::FixedState::with_seed(0x6272_6561_6b77_6174);
        let half = queued.len() / 2 + 1;
        one.reserve(half);
        other.reserve(half);
        for q in queued {
            if by_key.hash_one(q.item.key.as_slice()) & 1 == 0 {
                one.push(q);
            } else {
                other.push(q);
            }
        }
    }
    [one, other].into_iter()
}

/// Queues `write` and waits for its batch's reply; `Err(write)` if a batch
/// of another runtime is forming (the caller writes it alone). `kind`
/// builds the batch's notice target if this write is the first.
pub(crate) async fn queued_write(
    store: &Arc<GuardedStore>,
    queue: &Arc<WriteQueue>,
    write: Write,
    kind: impl FnOnce() -> Writes,
) -> Result<Result<(), Error>, Write> {
    let Enqueued { answer, .. } = enqueue(store, queue, write, kind, false)?;
    Ok(answer.await.unwrap_or_else(|_| Writes::dropped()))
}

/// Lets the tasks already woken on this worker run first: the task wakes
/// itself and returns pending once, which puts it at the back of its
/// worker's run queue, where an idle worker can also take it.
///
/// Not [`tokio::task::yield_now`]: on a multi-thread runtime that parks
/// the task on its worker's deferred list, which no other worker can take
/// and which is woken only when that worker has run out of work and found
/// none to steal, or at its next maintenance tick (every 61 polls by
/// default), so a batch waited for its own worker while the other could
/// have sent it (on two workers with 50 callers on 50 keys, about 460k
/// hits/s against 485k this way, although its batches were fuller: 23 keys
/// against 11). On a current-thread runtime both run it after the tasks
/// already queued (`yield_now` also after the next poll for I/O), and
/// measure alike.
pub(super) async fn behind_the_woken() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// The task that sends what is queued. Every queued call relies on it
/// from the moment the first one was queued: should it be dropped before
/// it took the queue (a runtime shutting down drops its tasks, a closed
/// one never runs them), it drops the queue instead, so those callers hear
/// at once and the next call queued schedules a new one.
struct Flush<K: Kind> {
    store: Arc<GuardedStore>,
    queue: Arc<Queue<K>>,
    kind: K,
    /// The batch it was scheduled for (`None`: whatever is queued, for a
    /// caller sending a stranded batch itself).
    batch: Option<u64>,
    taken: bool,
}

impl<K: Kind> Flush<K> {
    /// Sends everything queued as batch calls, counted in the air while
    /// they run, and hands each queued caller its reply.
    async fn send(mut self) {
        let queue = &*self.queue;
        let taken = {
            let mut waiting = lock(queue);
            self.taken = true;
            if self.batch.is_some_and(|batch| batch != waiting.batch) {
                // Its calls went out from elsewhere; what is queued now
                // is a newer batch's, which its own task sends.
                return;
            }
            std::mem::take(&mut waiting.items)
        };
        queue.in_flight.fetch_add(1, Ordering::AcqRel);
        let _admitted = Admitted { queue };
        self.kind.send(&self.store, taken).await;
    }
}

impl<K: Kind> Drop for Flush<K> {
    fn drop(&mut self) {
        if !self.taken {
            let mut waiting = lock(&self.queue);
            if self.batch.is_none_or(|batch| batch == waiting.batch) {
                drop(std::mem::take(&mut waiting.items));
            }
        }
    }
}

fn lock<K: Kind>(queue: &Queue<K>) -> std::sync::MutexGuard<'_, Pending<K>> {
    queue.queue.lock().unwrap_or_else(|p| p.into_inner())
}
