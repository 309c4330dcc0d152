//! A cluster's concurrent lone writes, combined per node.
//!
//! On one server, concurrent `set`s meet in the cache's write queue and go
//! out as transactions. On a cluster a transaction keeps to one hash slot,
//! so each `set` was its own pipeline (`DEL` of the lease, `SET`,
//! `PUBLISH`; see `plain`), and a cluster forwards every `PUBLISH` to every
//! node: with 100 `set`s in flight on a local 3-node cluster, the same
//! writes without their `PUBLISH` ran 1.5 times as fast. Here a `replace`
//! that finds another of this store's lone cluster replaces in flight
//! ([`Writes::enter`]) is queued instead; one writer task per store
//! (`writer`) sends what is queued as one plain pipeline per node (as the
//! slot map has it): per write the `DEL` of its lease and its `SET`, then
//! one `PUBLISH` per channel and batch head
//! ([`Notice::batch_head`](crate::store::Notice::batch_head)) naming its
//! keys ([`Notice::for_keys`](crate::store::Notice::for_keys)), and hands
//! each writer its outcome. A `replace` alone goes straight out as its own
//! pipeline: a lone `set` still costs one round trip, and nothing waits
//! for a task.
//!
//! Each write keeps what the lone pipeline promises: its lease is revoked
//! before its write lands and its notice follows it (a node runs one
//! connection's commands in order); a write refused or redirected (or
//! whose notice was refused) is written again by the `REPLACE` script,
//! with its own notice. A write whose caller went away before its step was
//! sent is not sent (a cancelled `set` never lands later); one sent
//! carries its notice with it. One step per node is in flight at a time:
//! what comes for a node meanwhile goes out together once it is answered,
//! while other nodes' steps go on (a slow node holds up only its own
//! keys; the slot map, when due, is asked for beside the steps in
//! flight). A write waits without a timer of its own, as a queued read
//! does in the cache: the writer task runs on the waiting write's own
//! runtime, which runs it while the write is polled there (as it drives
//! the store's connection), and each of its steps has its store
//! deadline. A write from another runtime goes straight out (it must not
//! wait on a runtime that may not run again). If the writer's runtime
//! goes away, the writes it held fail (those on the wire may have
//! landed), and the next write starts a writer on its own runtime.
//!
//! Hand-rolled for the same reason as the cache's write queue: what it
//! needs is a count, a queue and one task, and a batching crate would add
//! a timer or a task to every call.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, oneshot};

use crate::error::Error;

/// The lone cluster replaces in flight, and those queued.
#[derive(Default)]
pub(super) struct Writes {
    writing: AtomicUsize,
    queue: Mutex<Queue>,
    /// Wakes the writer: something was queued.
    pub(super) queued: Notify,
}

/// What is queued, and the runtime whose task sends it.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) queued: Vec<Queued>,
    pub(super) writer: Option<tokio::runtime::Id>,
}

/// A queued write, its notice's channel and batch head, and where its
/// outcome goes.
pub(super) struct Queued {
    pub(super) key: Vec<u8>,
    pub(super) value: Vec<u8>,
    pub(super) ttl_ms: u64,
    pub(super) lease_key: Vec<u8>,
    pub(super) channel: Vec<u8>,
    pub(super) head: Vec<u8>,
    /// `Ok(false)`: refused or redirected (the script writes it again).
    pub(super) reply: oneshot::Sender<Result<bool, Error>>,
}

/// One lone replace in flight (counted until dropped).
pub(super) struct Writing<'a>(&'a AtomicUsize);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Writes {
    /// Counts a lone replace in flight while the guard lives; `true` if it
    /// is the only one (it then goes straight out).
    pub(super) fn enter(&self) -> (Writing<'_>, bool) {
        let before = self.writing.fetch_add(1, Ordering::Relaxed);
        (Writing(&self.writing), before == 0)
    }

    /// The queue, locked.
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}
