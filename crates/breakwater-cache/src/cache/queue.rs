//! Batched reads, so that under load many callers do not each pay a round
//! trip and a parse: reads of distinct keys that meet while the store is
//! busy go out as one batch ([`Store::get_many`]: one `MGET`).
//!
//! A read goes straight to the store, in the caller's task, while fewer
//! than [`IN_FLIGHT`] of this cache's reads are in the air: an uncontended
//! hit pays an atomic compare-and-swap and a subtraction for this and
//! nothing else (no lock, no task, no allocation, no timer). A read that
//! finds the store busy is queued instead: the first one queued schedules a
//! task that lets the reads already woken on the runtime have their turn
//! (one yield, [`behind_the_woken`]) and then sends everything queued as
//! one batch read; each queued caller gets its key's reply from there.
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
//! Only stores that ask for it ([`Store::batches_reads`])
//! are read this way; a Redis Cluster is not (its batches split per hash
//! slot anyway). Hand-rolled: what it needs is an admission count and a
//! queue, and a batching crate (a `DataLoader`) would add a timer or a
//! spawn to every read, the hit path included.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use tokio::sync::oneshot;

use super::guard::GuardedStore;
use crate::error::{Error, ErrorKind};
use crate::store::Store;

/// Reads in the air (single, or batches) before further reads are queued.
pub(crate) const IN_FLIGHT: usize = 4;

/// The most keys one batch read carries; a longer queue goes out as
/// several batches side by side.
const MAX_BATCH: usize = 256;

/// One store read's reply.
type Reply = Result<Option<Vec<u8>>, Error>;

/// A queued read: its storage key and where its reply goes.
struct Queued {
    key: Vec<u8>,
    reply: oneshot::Sender<Reply>,
}

/// The admission count and the queue of one cache's reads; see the module
/// docs.
#[derive(Default)]
pub(crate) struct ReadQueue {
    /// Reads and batches in the air.
    in_flight: AtomicUsize,
    queue: Mutex<QueuedReads>,
}

/// What is queued, and the runtime whose task will send it.
#[derive(Default)]
struct QueuedReads {
    reads: Vec<Queued>,
    runtime: Option<tokio::runtime::Id>,
    /// Counts batches: the task of an older one (whose reads another
    /// caller sent) neither sends nor drops a newer one's.
    batch: u64,
}

impl std::fmt::Debug for ReadQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadQueue")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish()
    }
}

/// A read (or a batch) admitted straight to the store; counted in the air
/// until it ends (also when it is cancelled).
pub(crate) struct Admitted<'a> {
    queue: &'a ReadQueue,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.queue.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// Admits a read straight to the store if fewer than [`IN_FLIGHT`] are in
/// the air; `None`: queue it ([`queued`]).
pub(crate) fn admit(queue: &ReadQueue) -> Option<Admitted<'_>> {
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
pub(crate) async fn queued(store: &Arc<GuardedStore>, queue: &Arc<ReadQueue>, key: &[u8]) -> Reply {
    let (reply, answer) = oneshot::channel();
    let here = crate::background::current_runtime();
    let (first, elsewhere, batch) = {
        let mut waiting = lock(queue);
        waiting.reads.push(Queued {
            key: key.to_vec(),
            reply,
        });
        let first = waiting.reads.len() == 1;
        if first {
            waiting.runtime = here;
            waiting.batch = waiting.batch.wrapping_add(1);
        }
        (first, waiting.runtime != here, waiting.batch)
    };
    if first {
        let flush = Flush {
            store: Arc::clone(store),
            queue: Arc::clone(queue),
            batch: Some(batch),
            taken: false,
        };
        // Outside a runtime nothing can send it: `flush` is dropped here,
        // and so is the queue (this read's reply with it).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                behind_the_woken().await;
                flush.send().await;
            });
        }
    }
    let dropped = |_| {
        Err(Error::new(
            ErrorKind::Store,
            "a queued read got no reply (its batch was dropped: the runtime is shutting down)",
        ))
    };
    if !elsewhere {
        return answer.await.unwrap_or_else(dropped);
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
    mut answer: oneshot::Receiver<Reply>,
) -> Reply {
    let dropped = |_| {
        Err(Error::new(
            ErrorKind::Store,
            "a queued read got no reply (its batch was dropped: the runtime is shutting down)",
        ))
    };
    let within = store.read_deadline();
    if let Ok(reply) = tokio::time::timeout(within, &mut answer).await {
        return reply.unwrap_or_else(dropped);
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

/// The task that sends what is queued. Every queued read relies on it
/// from the moment the first one was queued: should it be dropped before
/// it took the queue (a runtime shutting down drops its tasks, a closed
/// one never runs them), it drops the queue instead, so those callers hear
/// at once and the next read queued schedules a new one.
struct Flush {
    store: Arc<GuardedStore>,
    queue: Arc<ReadQueue>,
    /// The batch it was scheduled for (`None`: whatever is queued, for a
    /// caller sending a stranded batch itself).
    batch: Option<u64>,
    taken: bool,
}

impl Flush {
    /// Sends everything queued as batch reads (side by side, [`MAX_BATCH`]
    /// keys each), counted in the air while they run, and hands each
    /// queued caller its reply.
    async fn send(mut self) {
        let queue = &*self.queue;
        let taken = {
            let mut waiting = lock(queue);
            self.taken = true;
            if self.batch.is_some_and(|batch| batch != waiting.batch) {
                // Its reads went out from elsewhere; what is queued now
                // is a newer batch's, which its own task sends.
                return;
            }
            std::mem::take(&mut waiting.reads)
        };
        queue.in_flight.fetch_add(1, Ordering::AcqRel);
        let _admitted = Admitted { queue };
        let store = &self.store;
        let batches = taken.chunks(MAX_BATCH).map(|batch| async move {
            let keys: Vec<&[u8]> = batch.iter().map(|q| q.key.as_slice()).collect();
            store.get_many_split(&keys).await
        });
        let replies = futures_util::future::join_all(batches).await;
        for (queued, reply) in taken.into_iter().zip(replies.into_iter().flatten()) {
            // A caller that went away does not take its reply.
            let _ = queued.reply.send(reply);
        }
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        if !self.taken {
            let mut waiting = lock(&self.queue);
            if self.batch.is_none_or(|batch| batch == waiting.batch) {
                drop(std::mem::take(&mut waiting.reads));
            }
        }
    }
}

fn lock(queue: &ReadQueue) -> std::sync::MutexGuard<'_, QueuedReads> {
    queue.queue.lock().unwrap_or_else(|p| p.into_inner())
}
