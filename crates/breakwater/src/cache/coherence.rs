//! What one process holds about a key besides the store — the flights in
//! the air and the L1 copy — and what an invalidation does to it.
//!
//! # The rule
//!
//! An invalidation (this process's `invalidate` or `set`, or another
//! process's, heard on the bus) must not be answered by anything that
//! began before it. Three things here could do that, and each is handled
//! in one place:
//!
//! - **Load and read flights**: a caller that starts after the invalidation
//!   must not join a load or a shared read that began before it. The
//!   flights are *detached* ([`SingleFlight::detach`]): their own callers
//!   still get their result, new callers start new flights.
//! - **L1**: an entry is dropped, and a read or load that began before is
//!   refused when it tries to put its value back (L1's per-key epochs).
//! - **The store**: not here. Every write of a load goes through the lease
//!   fence (`Store::fenced_set`), which the invalidation revoked.
//!
//! In the invalidating process this happens before `invalidate`/`set`
//! returns, after the store has answered; elsewhere, when the bus message
//! arrives (or, if it is lost, when L1's TTL runs out: the documented bound).

use std::future::Future;
use std::pin::Pin;

use super::{Loaded, Read, Value, user_key};
use crate::flight::SingleFlight;
use crate::l1::{BusHook, NearCache, Ticket};

/// The in-process state of one cache: flights and L1.
pub(super) struct Local<V> {
    /// Loads in the air, by storage key.
    pub(super) flights: SingleFlight<Loaded<V>>,
    /// Store reads in the air, by user key: concurrent local reads of one
    /// key share one `GET` (and build no storage key unless they lead).
    pub(super) reads: SingleFlight<Read<V>>,
    /// The in-process near cache, if enabled.
    pub(super) l1: Option<NearCache<V>>,
    /// The length of the storage keys' namespace prefix.
    prefix_len: usize,
}

impl<V: Value> Local<V> {
    pub(super) fn new(l1: Option<NearCache<V>>, prefix_len: usize) -> Self {
        Local {
            flights: SingleFlight::new(),
            reads: SingleFlight::new(),
            l1,
            prefix_len,
        }
    }

    /// When a read or load begins: the L1 ticket its value must show to be
    /// kept in L1.
    pub(super) fn ticket(&self) -> Option<Ticket> {
        self.l1.as_ref().map(NearCache::ticket)
    }

    /// Storage key `key` was invalidated or replaced: nothing that began
    /// before may answer a caller that starts from now on.
    pub(super) async fn invalidated(&self, key: &[u8]) {
        let user = user_key(key, self.prefix_len);
        if let Some(l1) = &self.l1 {
            l1.invalidated(user).await;
        }
        self.reads.detach(user);
        self.flights.detach(key);
    }
}

impl<V: Value> BusHook for Local<V> {
    fn changed(
        &self,
        key: Vec<u8>,
        invalidated: bool,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if invalidated {
                self.invalidated(&key).await;
            } else if let Some(l1) = &self.l1 {
                // A refill elsewhere: newer data, read it from the store.
                l1.remove(user_key(&key, self.prefix_len)).await;
            }
        })
    }

    fn missed(&self) {
        if let Some(l1) = &self.l1 {
            l1.clear();
        }
    }
}
