//! Reads of distinct keys that meet while the store is busy go out as one
//! batch ([`Store::get_many`](crate::Store::get_many): one `MGET`).
//!
//! A read goes straight to the store, in the caller's task, while fewer
//! than [`IN_FLIGHT`] of this cache's reads are in the air: an uncontended
//! hit pays two atomic adds for this and nothing else (no lock, no task,
//! no allocation). A read that finds them all busy is queued instead; when
//! one of them ends, everything queued goes out in one batch read, in a
//! task of its own, and each queued caller gets its key's reply. Under
//! load this trades one `GET` per key (a request, a reply and a parse in
//! the client and in Redis each) for one per batch: with 50 callers on 50
//! keys, breakwater reads faster than raw `GET`s on the same connection.
//! The batch is as fresh as a `GET` would be (it is sent after the read
//! was asked for), so the coherence contract is unaffected; a queued read
//! waits for at most one read in the air plus its own batch, each within
//! the store's deadline.
//!
//! Concurrent readers of *one* key never get here twice: they already
//! share one read ([`Reads`](crate::flight::Reads)).
//!
//! Only stores that ask for it ([`Store::batches_reads`]) are read this
//! way; a Redis Cluster is not (its batches split per hash slot anyway).
//! Hand-rolled: what it needs is an admission count and a queue, and a
//! batching crate (a `DataLoader`) would add a timer or a spawn to every
//! read, the hit path included.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::guard::GuardedStore;
use crate::error::{Error, ErrorKind};

/// Reads in the air (single, or batches) before further reads are queued.
pub(crate) const IN_FLIGHT: usize = 1;

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
    /// `queue.len()`, readable without the lock.
    queued: AtomicUsize,
    queue: Mutex<Vec<Queued>>,
}

impl std::fmt::Debug for ReadQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadQueue")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .field("queued", &self.queued.load(Ordering::Relaxed))
            .finish()
    }
}

/// A read admitted straight to the store; its end sends what was queued
/// meanwhile (also when the read is cancelled).
pub(crate) struct Admitted<'a> {
    store: &'a Arc<GuardedStore>,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        leave(self.store);
    }
}

/// Admits a read straight to the store if fewer than [`IN_FLIGHT`] are in
/// the air; `None`: queue it ([`queued`]).
pub(crate) fn admit<'a>(store: &'a Arc<GuardedStore>, queue: &ReadQueue) -> Option<Admitted<'a>> {
    // Counted only when admitted (never over the limit, even for a
    // moment); the hand-over between a read that ends and one that queues
    // is ordered by these SeqCst operations (see `queued` and `leave`).
    let mut in_flight = queue.in_flight.load(Ordering::SeqCst);
    while in_flight < IN_FLIGHT {
        match queue.in_flight.compare_exchange_weak(
            in_flight,
            in_flight + 1,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => return Some(Admitted { store }),
            Err(now) => in_flight = now,
        }
    }
    None
}

/// Queues a read of `key` and waits for its batch's reply.
///
/// The wait has no timer of its own (one per queued read would cost more
/// than the batching saves): it ends when the batch task answers or drops
/// the reply, and that task's one store call is bounded by the store's own
/// deadline; the batch is sent when a read in the air ends (within its
/// deadline too), or from here if none is left.
pub(crate) async fn queued(store: &Arc<GuardedStore>, queue: &ReadQueue, key: &[u8]) -> Reply {
    let (reply, answer) = oneshot::channel();
    {
        let mut waiting = lock(queue);
        waiting.push(Queued {
            key: key.to_vec(),
            reply,
        });
        queue.queued.store(waiting.len(), Ordering::SeqCst);
    }
    // Every read in the air may have ended before this one was queued (and
    // found nothing to send): then it is sent from here.
    if queue.in_flight.load(Ordering::SeqCst) < IN_FLIGHT {
        send(store);
    }
    answer.await.unwrap_or_else(|_| {
        Err(Error::new(
            ErrorKind::Store,
            "a queued read was dropped unanswered (the runtime is shutting down)",
        ))
    })
}

/// A read or batch ended: send what was queued meanwhile.
fn leave(store: &Arc<GuardedStore>) {
    let Some(queue) = store.read_queue() else {
        return;
    };
    queue.in_flight.fetch_sub(1, Ordering::SeqCst);
    if queue.queued.load(Ordering::SeqCst) > 0 {
        send(store);
    }
}

/// Sends everything queued as batch reads, each in a task of its own
/// (counted in the air until it ends); the queued callers get their
/// replies from there.
fn send(store: &Arc<GuardedStore>) {
    let Some(queue) = store.read_queue() else {
        return;
    };
    let taken = {
        let mut waiting = lock(queue);
        queue.queued.store(0, Ordering::SeqCst);
        std::mem::take(&mut *waiting)
    };
    if taken.is_empty() {
        return;
    }
    // Outside a runtime (one being dropped), the replies are dropped with
    // the batch: each queued caller hears so at once.
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut taken = taken.into_iter().peekable();
    while taken.peek().is_some() {
        let batch: Vec<Queued> = taken.by_ref().take(MAX_BATCH).collect();
        queue.in_flight.fetch_add(1, Ordering::SeqCst);
        let store = Arc::clone(store);
        runtime.spawn(async move {
            let _admitted = Admitted { store: &store };
            let keys: Vec<&[u8]> = batch.iter().map(|q| q.key.as_slice()).collect();
            let replies = store.get_many_split(&keys).await;
            for (queued, reply) in batch.into_iter().zip(replies) {
                // A caller that went away does not take its reply.
                let _ = queued.reply.send(reply);
            }
        });
    }
}

fn lock(queue: &ReadQueue) -> std::sync::MutexGuard<'_, Vec<Queued>> {
    queue.queue.lock().unwrap_or_else(|p| p.into_inner())
}
