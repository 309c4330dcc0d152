//! Coherence in one process, so that after an invalidation no caller of
//! this process gets a value read or loaded before it: what the process
//! holds about a key besides the store (the flights in the air and the L1
//! copy) and what an invalidation does to it.
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
//!
//! A tag invalidation (`invalidate_tag`) may concern any key (an entry's
//! tags are known only once it is read): it detaches every flight and
//! shared read and empties L1, moving its epoch floor
//! (`Local::tags_invalidated`, in `tags`). Its store fence is the tag's
//! generation, recorded in each entry, not the lease.
//!
//! One more thing could answer from before: a fill message that another
//! process published *before* the invalidation, still on its way through
//! this process's bus, carrying the old value to a waiter that starts
//! after. Until this process hears its own invalidation back (the bus
//! delivers in order), values carried for that key are not taken; the
//! waiter reads the store instead.

use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::Mutex;

use super::keys::user_key;
use super::notify::BusHook;
use super::record::Clears;
use super::value::Value;
use crate::entry::Entry;
use crate::flight::Joined;
use crate::flight::{Reads, SingleFlight};
use crate::l1::{NearCache, Ticket};
use crate::served::Served;
use crate::store::namespace::NamespaceState;
use std::sync::Arc;
use tokio::time::Instant;

/// The in-process state of one cache: flights and L1.
pub(super) struct Local<V> {
    /// Loads in the air, by storage key.
    pub(super) flights: SingleFlight<Landed<V>>,
    /// Background refreshes in the air, by storage key.
    pub(super) background: SingleFlight<Landed<V>>,
    /// Store reads in the air, by user key: concurrent local reads of one
    /// key share one `GET` (and build no storage key unless they lead).
    pub(super) reads: Reads<SharedRead<V>>,
    /// The in-process near cache, if enabled.
    pub(super) l1: Option<NearCache<V>>,
    /// Own invalidations published but not yet heard back on the bus.
    unheard: Mutex<Unheard>,
    /// The namespace's clear record as known here (see `clear`).
    pub(super) clears: Arc<Clears>,
    /// The length of the storage keys' namespace prefix.
    prefix_len: usize,
}

impl<V: Value> Local<V> {
    pub(super) fn new(l1: Option<NearCache<V>>, prefix_len: usize) -> Self {
        Local {
            flights: SingleFlight::new(),
            background: SingleFlight::new(),
            reads: Reads::new(),
            unheard: Mutex::default(),
            clears: Arc::default(),
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
    pub(super) fn invalidated(&self, key: &[u8]) {
        let user = user_key(key, self.prefix_len);
        if let Some(l1) = &self.l1 {
            l1.invalidated(user);
        }
        self.reads.detach(user);
        self.flights.detach(key);
        self.background.detach(key);
    }

    /// The local step of an invalidation of the storage keys `keys`
    /// ([`invalidated`](Self::invalidated)), taken when the returned guard
    /// is dropped: after the store has answered, and just as well if the
    /// caller's future is dropped first (the store may have run the
    /// invalidation; nothing from before may answer here afterwards, and
    /// this process ignores its own message on the bus).
    pub(super) fn invalidation<'a, K: AsRef<[u8]> + 'a>(
        &'a self,
        keys: impl IntoIterator<Item = &'a K> + 'a,
    ) -> impl Drop + 'a {
        LocalStep::new(move || {
            for key in keys {
                self.invalidated(key.as_ref());
            }
        })
    }

    /// This process is about to publish an invalidation of `key`: until it
    /// hears it back on the bus, a fill message about `key` may be one
    /// published before (the bus delivers in order), and the value it
    /// carries must not be taken. Tracked only while the bus is listened to
    /// (`listening`): otherwise no message from before can arrive anyway.
    pub(super) fn expect_own_notice(&self, key: &[u8], listening: bool) {
        if !listening {
            return;
        }
        let mut unheard = self.unheard.lock().unwrap_or_else(|p| p.into_inner());
        let key = unheard.hash(key);
        if unheard.keys.len() >= UNHEARD_KEYS && !unheard.keys.contains_key(&key) {
            unheard.overflow += 1;
            return;
        }
        *unheard.keys.entry(key).or_default() += 1;
    }

    /// An own invalidation of `key` was heard back (or will never be
    /// published: its store call failed).
    pub(super) fn own_notice_heard(&self, key: &[u8]) {
        let mut unheard = self.unheard.lock().unwrap_or_else(|p| p.into_inner());
        let key = unheard.hash(key);
        match unheard.keys.get_mut(&key) {
            Some(1) => {
                unheard.keys.remove(&key);
            }
            Some(n) => *n -= 1,
            None => unheard.overflow = unheard.overflow.saturating_sub(1),
        }
    }
}

/// Runs its step when dropped: the local step of an invalidation, which
/// must run once the store may have done its part, whether the caller
/// waits for the reply or not (see [`Local::invalidation`]).
pub(super) struct LocalStep<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> LocalStep<F> {
    pub(super) fn new(step: F) -> Self {
        LocalStep(Some(step))
    }
}

impl<F: FnOnce()> Drop for LocalStep<F> {
    fn drop(&mut self) {
        if let Some(step) = self.0.take() {
            step();
        }
    }
}

/// The most keys whose own invalidations are tracked one by one; past it,
/// every carried value is refused until the surplus has been heard.
const UNHEARD_KEYS: usize = 4096;

/// Own invalidations not yet heard back, by storage key, and how many
/// could not be tracked by key.
#[derive(Debug, Default)]
struct Unheard {
    /// By the key's 64-bit hash (seeded per process), not a copy of it:
    /// every `set` and invalidation counts its key in and out, and a copy
    /// was an allocation each. Two keys of one hash share a count, which
    /// only ever refuses a carried value that could have been taken.
    keys: HashMap<u64, u32, foldhash::fast::RandomState>,
    hasher: foldhash::fast::RandomState,
    overflow: u64,
}

impl Unheard {
    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
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
                self.invalidated(&key);
            } else if let Some(l1) = &self.l1 {
                // A refill elsewhere: newer data, read it from the store.
                l1.remove(user_key(&key, self.prefix_len));
            }
        })
    }

    fn own_invalidation_heard(&self, key: &[u8]) {
        self.own_notice_heard(key);
    }

    fn tags_invalidated(&self) {
        Local::tags_invalidated(self);
    }

    fn trusts_carried(&self, key: &[u8]) -> bool {
        let unheard = self.unheard.lock().unwrap_or_else(|p| p.into_inner());
        unheard.overflow == 0 && !unheard.keys.contains_key(&unheard.hash(key))
    }

    fn previous_missed(&self, up: bool) {
        if let Some(l1) = &self.l1 {
            l1.previous_bus(up);
        }
    }

    fn cleared(&self, record: &[u8]) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let heard = self.clears.heard(record);
        Box::pin(async move {
            let Some(state) = heard else { return };
            // A pin clears nothing, and its maker waits for no one, also
            // one that replaces a record known here (which was lost: its
            // entries, L1's included, are adopted, see `store::namespace`).
            if state.is_pin() {
                return;
            }
            // Whoever cleared (this process too) waits for this.
            Local::cleared(self, state.floor == state.generation);
            self.clears.acknowledge(state.generation).await;
        })
    }

    fn clear_acked(&self, generation: &[u8]) {
        self.clears.acked(generation);
    }

    fn previous_cleared<'a>(
        &'a self,
        record: &'a [u8],
        channel: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        let state = NamespaceState::parse(record);
        Box::pin(async move {
            // A pin there clears nothing here.
            let Some(state) = state.filter(|state| !state.is_pin()) else {
                return;
            };
            let hard = state.floor == state.generation;
            // At once here; the others take this version's record from
            // its message (every process that hears the previous version's
            // clear makes one: hard ones repeat, soft ones merge).
            Local::cleared(self, hard);
            self.clears.mirror(hard, state.window).await;
            self.clears.acknowledge_on(channel, state.generation).await;
        })
    }

    fn subscribed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            // A failed read is read again by the next caller that needs it.
            let _ = self.clears.current().await;
            // (A record the store lost meanwhile, an empty restart say,
            // stays untrusted: the next read puts it back after a pause.)
        })
    }

    fn beat(&self) {
        Clears::keep_warm(&self.clears);
    }

    fn missed(&self, up: bool) {
        self.clears.bus_changed(up);
        // A new subscription: nothing from before it can arrive any more.
        *self.unheard.lock().unwrap_or_else(|p| p.into_inner()) = Unheard::default();
        if let Some(l1) = &self.l1 {
            l1.unverify(up);
        }
    }
}

/// What a load flight lands with: the value, how it was served, and the
/// latest start of a caller it answers, if it does not answer every one:
/// when its lease was asked for, if the load's fenced write was refused;
/// one store read deadline after the read, for a value another holder's
/// fill left in the store (the read's later steps may have kept it in
/// the air, see `Cache::read_answers`).
///
/// A refused write means the lease was revoked while the value was loaded
/// (an invalidation or `set`, possibly from another process that this one
/// has not heard from yet) or ran out: the value may predate a change that
/// completed before some of the flight's callers started. The revocation
/// came after the lease was asked for, so the value is served only to
/// callers that started by then; later ones read and load again (see
/// `pipeline`).
pub(super) type Landed<V> = (Option<V>, Served, Option<Instant>);

/// What a shared store read gives every caller that shared it.
#[derive(Clone)]
pub(super) struct SharedRead<V> {
    /// The envelope, if one is stored and readable.
    pub(super) entry: Option<Arc<Entry>>,
    /// Nothing was: the key's load (started by the read, or already in
    /// the air), which the read's followers wait on.
    pub(super) loading: Option<Joined<Landed<V>>>,
    /// When the read began, for L1.
    pub(super) ticket: Option<Ticket>,
    /// When the read was sent: a follower that came to it more than one
    /// store reply later does not take its entry (see `read_shared`).
    pub(super) sent: Instant,
    /// `entry` is the previous version's (a version transition).
    pub(super) previous: bool,
}

impl<V: Value> Local<V> {
    /// A tag was invalidated (here or, heard on the bus, elsewhere): any
    /// key may carry it, so nothing that began before may answer a caller
    /// that starts from now on. L1 refuses every read or load that began
    /// before (its epoch floor moves) and is emptied if it may hold a
    /// tagged entry, and every flight and shared read in the air is
    /// detached.
    /// The namespace was cleared: L1 is emptied (every read or load that
    /// began before is refused a place in it); after a hard clear every
    /// load, background refresh and shared read in the air is detached
    /// too (its own callers still get its result).
    pub(super) fn cleared(&self, hard: bool) {
        if let Some(l1) = &self.l1 {
            l1.clear();
        }
        if hard {
            self.reads.detach_all();
            self.flights.detach_all();
            self.background.detach_all();
        }
    }

    pub(super) fn tags_invalidated(&self) {
        if let Some(l1) = &self.l1 {
            l1.drop_tagged();
        }
        self.reads.detach_all();
        self.flights.detach_all();
        self.background.detach_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> Local<u32> {
        Local::new(None, 0)
    }

    #[test]
    fn carried_values_wait_for_the_own_invalidation_to_come_back() {
        let local = local();
        assert!(local.trusts_carried(b"k"));
        // Not listening: no message from before can arrive; nothing tracked.
        local.expect_own_notice(b"k", false);
        assert!(local.trusts_carried(b"k"));
        local.expect_own_notice(b"k", true);
        local.expect_own_notice(b"k", true);
        assert!(!local.trusts_carried(b"k"));
        assert!(local.trusts_carried(b"other"));
        local.own_notice_heard(b"k");
        assert!(!local.trusts_carried(b"k"), "one of two heard");
        local.own_notice_heard(b"k");
        assert!(local.trusts_carried(b"k"));
        // A new subscription forgets everything.
        local.expect_own_notice(b"k", true);
        local.missed(true);
        assert!(local.trusts_carried(b"k"));
    }

    #[test]
    fn past_the_bound_every_carried_value_waits() {
        let local = local();
        for i in 0..UNHEARD_KEYS as u32 {
            local.expect_own_notice(&i.to_be_bytes(), true);
        }
        local.expect_own_notice(b"one too many", true);
        assert!(!local.trusts_carried(b"never invalidated"));
        // Heard back in bus order: the surplus clears last.
        for i in 0..UNHEARD_KEYS as u32 {
            local.own_notice_heard(&i.to_be_bytes());
        }
        assert!(!local.trusts_carried(b"never invalidated"));
        local.own_notice_heard(b"one too many");
        assert!(local.trusts_carried(b"never invalidated"));
    }
}
