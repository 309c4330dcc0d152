//! The namespace bus: waking local waiters when another process fills a key,
//! and keeping the L1 near cache in step with other processes' writes.
//!
//! One subscription per cache listens on the namespace channel
//! (`bw:<namespace>:events`); each message is one byte of kind, the sending
//! cache's 8-byte id, and the storage key. The dispatcher wakes the local
//! waiter for that key and drops the key from L1 (unless this cache sent the
//! message itself); when messages may have been lost (the subscription
//! dropped and came back) it wakes every waiter and flushes L1.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::AbortHandle;

use crate::l1::BusHook;
use crate::store::{Delivery, Store};

/// Message kinds on the namespace channel.
pub(crate) const FILLED: u8 = b'f';
/// The lease was released without a value (the load failed).
pub(crate) const RELEASED: u8 = b'r';
/// The key was invalidated.
pub(crate) const INVALIDATED: u8 = b'i';

/// The length of a sender id.
pub(crate) const SENDER_LEN: usize = 8;

/// `kind`, the sender's id, then the storage key.
pub(crate) fn message(kind: u8, sender: &[u8; SENDER_LEN], key: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + SENDER_LEN + key.len());
    m.push(kind);
    m.extend_from_slice(sender);
    m.extend_from_slice(key);
    m
}

/// The sender and key of a message; `None` for anything malformed.
fn parse(message: &[u8]) -> Option<(&[u8], &[u8])> {
    let body = message.get(1..)?;
    if body.len() <= SENDER_LEN {
        return None;
    }
    Some(body.split_at(SENDER_LEN))
}

type Registry = Mutex<HashMap<Vec<u8>, Arc<Notify>>>;

/// The keys this process is waiting on, and the listener that wakes them.
pub(crate) struct Waiters {
    channel: Vec<u8>,
    /// This cache's id on the bus.
    sender: [u8; SENDER_LEN],
    registry: Arc<Registry>,
    /// The near cache to keep in step, if any.
    hook: Option<Arc<dyn BusHook>>,
    listener: OnceLock<(AbortHandle, watch::Receiver<bool>)>,
}

impl Waiters {
    pub(crate) fn new(
        channel: Vec<u8>,
        sender: [u8; SENDER_LEN],
        hook: Option<Arc<dyn BusHook>>,
    ) -> Self {
        Waiters {
            channel,
            sender,
            registry: Arc::default(),
            hook,
            listener: OnceLock::new(),
        }
    }

    pub(crate) fn sender(&self) -> &[u8; SENDER_LEN] {
        &self.sender
    }

    pub(crate) fn channel(&self) -> &[u8] {
        &self.channel
    }

    /// Registers interest in `key`; the returned guard's [`Notify`] is woken
    /// when a message about it arrives. Starts the listener on first use and
    /// waits (at most `ready_within`) until it is subscribed.
    pub(crate) async fn watch(
        &self,
        store: &dyn Store,
        key: &[u8],
        ready_within: Duration,
    ) -> Watch<'_> {
        let mut ready = self.listen(store);
        if !*ready.borrow() {
            let _ = tokio::time::timeout(ready_within, ready.wait_for(|r| *r)).await;
        }
        let notify = Arc::clone(lock(&self.registry).entry(key.to_vec()).or_default());
        Watch {
            waiters: self,
            key: key.to_vec(),
            notify,
        }
    }

    /// Makes sure the listener runs (it keeps L1 in step); cheap once it
    /// does.
    pub(crate) fn ensure_listening(&self, store: &dyn Store) {
        if self.listener.get().is_none() {
            self.listen(store);
        }
    }

    /// Starts the listener if it is not running yet (needs a tokio
    /// runtime); the returned flag says whether it is subscribed.
    fn listen(&self, store: &dyn Store) -> watch::Receiver<bool> {
        let (_, ready) = self.listener.get_or_init(|| {
            let mut subscription = store.subscribe(&self.channel);
            let (ready_tx, ready_rx) = watch::channel(subscription.is_ready());
            let registry = Arc::clone(&self.registry);
            let hook = self.hook.clone();
            let own = self.sender;
            // Stores announce every (re)subscription with `Missed`, so the
            // ready flag is refreshed after each delivery.
            let task = tokio::spawn(async move {
                while let Some(delivery) = subscription.recv().await {
                    match delivery {
                        Delivery::Message(m) => {
                            if let Some((sender, key)) = parse(&m) {
                                wake(&registry, Some(key));
                                if let Some(hook) = &hook
                                    && sender != own
                                {
                                    hook.changed(key.to_vec()).await;
                                }
                            }
                        }
                        Delivery::Missed => {
                            wake(&registry, None);
                            if let Some(hook) = &hook {
                                hook.missed();
                            }
                        }
                    }
                    let now = subscription.is_ready();
                    ready_tx.send_if_modified(|r| std::mem::replace(r, now) != now);
                }
            });
            (task.abort_handle(), ready_rx)
        });
        ready.clone()
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        if let Some((task, _)) = self.listener.get() {
            task.abort();
        }
    }
}

/// Wakes the waiter for `key`, or every waiter when `key` is `None`.
fn wake(registry: &Registry, key: Option<&[u8]>) {
    let registry = lock(registry);
    match key {
        Some(key) => {
            if let Some(notify) = registry.get(key) {
                notify.notify_waiters();
            }
        }
        None => registry.values().for_each(|n| n.notify_waiters()),
    }
}

fn lock(registry: &Registry) -> MutexGuard<'_, HashMap<Vec<u8>, Arc<Notify>>> {
    registry.lock().unwrap_or_else(|p| p.into_inner())
}

/// Interest in one key; unregisters on drop.
pub(crate) struct Watch<'a> {
    waiters: &'a Waiters,
    key: Vec<u8>,
    notify: Arc<Notify>,
}

impl Watch<'_> {
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut registry = lock(&self.waiters.registry);
        // Only the last watcher of a key removes it (one per flight, but two
        // caches may share nothing here; be exact anyway).
        if Arc::strong_count(&self.notify) <= 2 {
            registry.remove(&self.key);
        }
    }
}
