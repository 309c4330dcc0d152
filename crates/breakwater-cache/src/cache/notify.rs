//! The namespace bus: waking local waiters when another process fills a key,
//! and keeping the L1 near cache in step with other processes' writes.
//!
//! One subscription per cache listens on the namespace channel
//! (`<key_prefix><namespace>:events`, `bw:<namespace>:events` by default). A
//! message is one byte of kind, the sending cache's 8-byte id, and the
//! storage key; a `v` message (a fill that somebody waited for) has the
//! key's length (4 bytes, big-endian) before the key and the stored entry
//! after it, so a woken waiter need not read the
//! value back. An `x` message (a load that failed) carries one byte
//! naming the error's kind, and a `p` message (a value the loader said
//! not to cache) the value sealed as an entry, laid out as a `v` message:
//! the waiters that joined that load take it as their outcome
//! (hit-for-pass) instead of taking the lease one process after another.
//! The dispatcher wakes the local waiter for that key (handing it
//! the entry, if the message has one) and drops the key from L1 (unless this
//! cache sent the message itself, or the message only says a load gave its
//! lease back: nothing changed then, and the L1 copy may be the fail-safe
//! stand-in for that failed load); when messages may have been lost (the
//! subscription dropped and came back) it wakes every waiter and flushes L1.
//!
//! The listener is a supervised task (see `crate::background`): started
//! on the runtime of the first call that needs it, it is started again by
//! the next call when that runtime went away. Until it is subscribed, and
//! from the moment it is gone, L1 counts the bus as down: its copies are
//! unverified (re-read before they are served as fresh), so a process
//! whose listener died with a runtime never serves an L1 copy that an
//! invalidation elsewhere has made old.

use std::collections::HashMap;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::background::{Duty, Supervised};
use crate::metrics::Metrics;
use crate::store::{Delivery, Store};

/// What the bus listener tells the cache about every message (the
/// cache's in-process state, `coherence::Local`, implements it).
pub(crate) trait BusHook: Send + Sync + 'static {
    /// Another process changed storage key `key`: refilled it
    /// (`invalidated` false) or invalidated or replaced it (`true`).
    fn changed(
        &self,
        key: Vec<u8>,
        invalidated: bool,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// This process's own invalidation of `key` came back on the bus (it
    /// dealt with the change when it made it): no allocation, no future,
    /// as a batch's message names up to 1,024 keys.
    fn own_invalidation_heard(&self, key: &[u8]);
    /// Whether a value carried by a fill message about `key`, arriving
    /// now, may be handed to waiters.
    fn trusts_carried(&self, key: &[u8]) -> bool;
    /// Messages may have been missed: the bus dropped (`up` false) or came
    /// back (`true`).
    fn missed(&self, up: bool);
    /// Messages on the previous version's channel (a version transition)
    /// may have been missed: it dropped (`up` false), came back, or fell
    /// behind (`true`).
    fn previous_missed(&self, up: bool);
    /// Another process invalidated a tag: any key may carry it.
    fn tags_invalidated(&self);
    /// A process (this one included) cleared the namespace; `record` is
    /// the new clear record. Taken, then acknowledged.
    fn cleared(&self, record: &[u8]) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// A process acknowledged the clear of `generation` (decimal digits).
    fn clear_acked(&self, generation: &[u8]);
    /// Inside a version transition, a process of the previous version
    /// cleared its namespace (`record`, its new clear record): this
    /// version's namespace is cleared the same way, then the clear is
    /// acknowledged on the previous version's `channel` (its `PUBLISH`
    /// counted this listener).
    fn previous_cleared<'a>(
        &'a self,
        record: &'a [u8],
        channel: &'a [u8],
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
    /// The listener is subscribed (again): what it may have missed is read
    /// now, off the callers' paths (the namespace's clear record).
    fn subscribed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// The listener's beat ([`LISTENER_BEAT`]): bookkeeping kept warm in
    /// the store, off the listener's path (it must not wait on it).
    fn beat(&self);
}

/// Message kinds on the namespace channel.
pub(crate) const FILLED: u8 = b'f';
/// A fill whose message carries the stored entry.
pub(crate) const FILLED_WITH_VALUE: u8 = b'v';
/// The lease was released without a value (the load failed).
pub(crate) const RELEASED: u8 = b'r';
/// The lease was released after the load failed with an error that is
/// the key's outcome (hit-for-pass): laid out as [`FILLED_WITH_VALUE`],
/// the key's length and the key, then one byte naming the error's kind
/// ([`failure_code`]). Waiters that joined before it take that error
/// instead of taking the lease one process after another.
pub(crate) const FAILED: u8 = b'x';
/// The lease was released with a value the loader said not to cache:
/// laid out as [`FILLED_WITH_VALUE`], with the value sealed as an entry
/// that is not stored. Waiters that joined before it are served it.
pub(crate) const PASSED: u8 = b'p';
/// The key was invalidated.
pub(crate) const INVALIDATED: u8 = b'i';
/// Keys were invalidated or replaced together (a batch): the message's
/// key is the list of storage keys, each its length (4 bytes, big-endian)
/// and its bytes ([`Notice::for_keys`](crate::store::Notice::for_keys)).
pub(crate) const INVALIDATED_MANY: u8 = b'I';
/// A tag was invalidated; the message's key is the tag's counter.
pub(crate) const TAG_INVALIDATED: u8 = b't';
/// The namespace was cleared; the message's key is the new clear record.
pub(crate) const CLEARED: u8 = b'c';
/// A process took a clear; the message's key is the clear's generation.
pub(crate) const CLEAR_ACKED: u8 = b'a';

/// The length of a sender id.
pub(crate) const SENDER_LEN: usize = 8;

/// The largest stored entry a fill hands to waiters in its message; a larger
/// one is read back with a `GET`, so a big value is not pushed to every
/// subscriber of the namespace.
pub(crate) const VALUE_IN_MESSAGE_MAX: usize = 16 * 1024;

/// `kind`, the sender's id, then the storage key.
pub(crate) fn message(kind: u8, sender: &[u8; SENDER_LEN], key: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(1 + SENDER_LEN + key.len());
    m.push(kind);
    m.extend_from_slice(sender);
    m.extend_from_slice(key);
    m
}

/// The head of a [`FILLED_WITH_VALUE`] message, to which the store appends
/// the entry; `None` if the key is too long to describe (over 4 GiB).
pub(crate) fn value_message(sender: &[u8; SENDER_LEN], key: &[u8]) -> Option<Vec<u8>> {
    carrying(FILLED_WITH_VALUE, sender, key)
}

/// The head of a message of `kind` that carries something after its key
/// ([`FILLED_WITH_VALUE`], [`FAILED`], [`PASSED`]); `None` if the key is
/// too long to describe (over 4 GiB).
pub(crate) fn carrying(kind: u8, sender: &[u8; SENDER_LEN], key: &[u8]) -> Option<Vec<u8>> {
    let len = u32::try_from(key.len()).ok()?;
    let mut m = Vec::with_capacity(1 + SENDER_LEN + 4 + key.len() + 1);
    m.push(kind);
    m.extend_from_slice(sender);
    m.extend_from_slice(&len.to_be_bytes());
    m.extend_from_slice(key);
    Some(m)
}

/// One message, taken apart.
#[derive(Debug, PartialEq, Eq)]
struct Parsed<'m> {
    kind: u8,
    sender: &'m [u8],
    key: &'m [u8],
    /// Where the entry starts, for a [`FILLED_WITH_VALUE`] message.
    value_at: Option<usize>,
}

/// Takes a message apart; `None` for anything malformed.
fn parse(message: &[u8]) -> Option<Parsed<'_>> {
    let (&kind, body) = message.split_first()?;
    if body.len() <= SENDER_LEN {
        return None;
    }
    let (sender, rest) = body.split_at(SENDER_LEN);
    if !matches!(kind, FILLED_WITH_VALUE | FAILED | PASSED) {
        return Some(Parsed {
            kind,
            sender,
            key: rest,
            value_at: None,
        });
    }
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
    let key = rest.get(..len).filter(|k| !k.is_empty())?;
    Some(Parsed {
        kind,
        sender,
        key,
        value_at: Some(1 + SENDER_LEN + 4 + len),
    })
}

/// A message's parts, each handled as a message of its own: the message
/// itself, or for an [`INVALIDATED_MANY`] one an [`INVALIDATED`] part per
/// key it lists (none if the list is malformed); nothing for a malformed
/// message.
fn parts(message: &[u8]) -> impl Iterator<Item = Parsed<'_>> {
    let parsed = parse(message);
    let batch = parsed
        .as_ref()
        .filter(|p| p.kind == INVALIDATED_MANY)
        .map(|p| (p.sender, batch_keys(p.key).unwrap_or_default()));
    let one = parsed.filter(|p| p.kind != INVALIDATED_MANY);
    let many = batch.into_iter().flat_map(|(sender, keys)| {
        keys.into_iter().map(move |key| Parsed {
            kind: INVALIDATED,
            sender,
            key,
            value_at: None,
        })
    });
    one.into_iter().chain(many)
}

/// The storage keys of an [`INVALIDATED_MANY`] message's list; `None`
/// if it is malformed (a length past its end, an empty key).
fn batch_keys(mut list: &[u8]) -> Option<Vec<&[u8]>> {
    let mut keys = Vec::new();
    while !list.is_empty() {
        let (len, rest) = list.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_be_bytes(*len)).ok()?;
        let key = rest.get(..len).filter(|k| !k.is_empty())?;
        keys.push(key);
        list = &rest[len..];
    }
    Some(keys)
}

/// What the waiters for one key share: their wake-up, and the entry the
/// latest message about the key carried (if it carried one).
#[derive(Default)]
struct KeyWaiters {
    notify: Notify,
    filled: Mutex<Option<Carried>>,
}

/// What a message carried after its key (a stored entry, a failure, a
/// value not to cache), inside the message.
struct Carried {
    message: Arc<[u8]>,
    at: usize,
}

impl Carried {
    fn kind(&self) -> u8 {
        self.message[0]
    }
}

/// A fill's outcome handed to the waiters that joined it, when it was not
/// a stored value (hit-for-pass): see [`FAILED`] and [`PASSED`].
pub(crate) enum Handed {
    /// The load failed with an error of this kind.
    Failed(crate::ErrorKind),
    /// The load's value, not to be cached, sealed as an entry.
    Passed(Vec<u8>),
}

/// The byte a [`FAILED`] message names an error kind by; `None` for a kind
/// that is not the key's outcome (the store's, the holder's own bulkhead
/// or breaker: another process may do better), which is released as
/// [`RELEASED`].
pub(crate) fn failure_code(kind: crate::ErrorKind) -> Option<u8> {
    FAILURE_CODES
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|&(_, code)| code)
}

/// The kind a [`FAILED`] message's byte names (`None`: unknown).
fn failure_kind(code: u8) -> Option<crate::ErrorKind> {
    FAILURE_CODES
        .iter()
        .find(|(_, c)| *c == code)
        .map(|&(kind, _)| kind)
}

/// The error kinds a [`FAILED`] message hands over, each with its byte
/// (one table, so the two directions cannot drift apart).
const FAILURE_CODES: [(crate::ErrorKind, u8); 2] = [
    (crate::ErrorKind::Loader, b'l'),
    (crate::ErrorKind::Timeout, b't'),
];

impl KeyWaiters {
    fn deliver(&self, filled: Option<Carried>) {
        *self.filled.lock().unwrap_or_else(|p| p.into_inner()) = filled;
        self.notify.notify_waiters();
    }
}

/// Hashed with foldhash (seeded per process), as the flights are: every
/// key a message names is looked up.
type WaiterMap = HashMap<Vec<u8>, Arc<KeyWaiters>, foldhash::fast::RandomState>;
type WaiterRegistry = Mutex<WaiterMap>;

/// The keys this process is waiting on, and the listener that wakes them.
pub(crate) struct Waiters {
    channel: Vec<u8>,
    /// This cache's id on the bus.
    sender: [u8; SENDER_LEN],
    /// The head of its batch messages ([`INVALIDATED_MANY`]).
    batch_head: Vec<u8>,
    registry: Arc<WaiterRegistry>,
    /// The near cache to keep in step, if any.
    hook: Option<Arc<dyn BusHook>>,
    /// Where notices heard (and possibly missed) are counted.
    metrics: Option<Metrics>,
    /// The listener task (supervised: see the module docs).
    listener: Supervised,
    /// Whether it is subscribed.
    ready: Arc<Ready>,
    /// No listener runs (none was started yet, or one was lost with its
    /// runtime): the next call starts one. The fast path's one load.
    lost: Arc<AtomicBool>,
    /// Inside a version transition: the previous version's channel, heard
    /// too (see `transition`).
    previous: Option<PreviousChannel>,
    previous_listener: Supervised,
    /// The listeners' tasks, stopped when the cache goes.
    tasks: Mutex<Vec<AbortHandle>>,
    /// When these waiters were made: the listener's promises count from it.
    born: tokio::time::Instant,
    /// Unique in the process: names these waiters in the threads' memory
    /// of a promise kept ([`is_stranded`](Self::is_stranded)).
    id: u64,
    /// The next listener has the store renew its feed (the one before was
    /// found stranded).
    renew_feed: AtomicBool,
}

thread_local! {
    /// The last listener promise this thread saw kept: the waiters' id,
    /// and the instant the promise runs to (see [`Waiters::is_stranded`]).
    static KEPT_UNTIL: std::cell::Cell<Option<(u64, tokio::time::Instant)>> =
        const { std::cell::Cell::new(None) };
}

/// How often the listener beats (renews its promise, and has the store
/// check its feed of the channel).
const LISTENER_BEAT: Duration = Duration::from_millis(250);

/// How far ahead each beat promises the next: a listener not heard from
/// for this long runs on a runtime that has gone idle (see
/// [`Waiters::is_stranded`]).
const LISTENER_PROMISE: Duration = Duration::from_secs(1);

/// The previous version's channel and how its keys map to this version's.
pub(crate) struct PreviousChannel {
    /// Its channel.
    pub(crate) channel: Vec<u8>,
    /// Its `value_prefix`, and this version's: a key of one is a key of the
    /// other with the prefix swapped.
    pub(crate) prefixes: (Vec<u8>, Vec<u8>),
    /// When the transition ends (the listener stops).
    pub(crate) until: tokio::time::Instant,
}

/// Whether the listener is subscribed, and a wake-up for when it comes up.
///
/// Not a `watch` channel: tokio wakes a watch's receivers in a randomly
/// chosen order, and which waiter goes first must not differ between two
/// runs of one seeded simulation; `Notify` wakes its waiters in order.
#[derive(Default)]
struct Ready {
    up: AtomicBool,
    came_up: Notify,
    /// When the listener promised to be heard from again, in ms since the
    /// waiters were made (0: no promise).
    due_ms: AtomicU64,
}

impl Ready {
    /// The listener promises a beat within `within` from now.
    fn promise(&self, born: tokio::time::Instant, within: Duration) {
        let due = crate::clock::millis(born.elapsed().saturating_add(within)).max(1);
        self.due_ms.store(due, Ordering::Relaxed);
    }

    fn set(&self, up: bool) {
        if !self.up.swap(up, Ordering::SeqCst) && up {
            self.came_up.notify_waiters();
        }
    }

    /// Returns once the listener is subscribed.
    async fn wait(&self) {
        loop {
            let mut came_up = pin!(self.came_up.notified());
            came_up.as_mut().enable();
            if self.up.load(Ordering::SeqCst) {
                return;
            }
            came_up.await;
        }
    }
}

impl Waiters {
    pub(crate) fn new(
        channel: Vec<u8>,
        sender: [u8; SENDER_LEN],
        hook: Option<Arc<dyn BusHook>>,
        metrics: Option<Metrics>,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(true));
        Waiters {
            channel,
            sender,
            batch_head: message(INVALIDATED_MANY, &sender, &[]),
            registry: Arc::default(),
            hook,
            metrics,
            listener: Supervised::reporting_to(&lost),
            ready: Arc::default(),
            previous: None,
            previous_listener: Supervised::reporting_to(&lost),
            lost,
            tasks: Mutex::default(),
            born: tokio::time::Instant::now(),
            id: {
                static WAITERS: AtomicU64 = AtomicU64::new(0);
                WAITERS.fetch_add(1, Ordering::Relaxed)
            },
            renew_feed: AtomicBool::new(false),
        }
    }

    /// Inside a version transition, also hears the previous version's
    /// channel (from when the listener starts until the transition ends).
    pub(crate) fn with_previous(mut self, previous: PreviousChannel) -> Self {
        self.previous = Some(previous);
        self
    }

    pub(crate) fn sender(&self) -> &[u8; SENDER_LEN] {
        &self.sender
    }

    pub(crate) fn channel(&self) -> &[u8] {
        &self.channel
    }

    /// The head of this cache's batch messages: [`INVALIDATED_MANY`] and
    /// its sender, then the keys ([`Notice::for_keys`](crate::store::Notice::for_keys)).
    pub(crate) fn batch_head(&self) -> &[u8] {
        &self.batch_head
    }

    /// Registers interest in `key`; the returned guard's [`Notify`] is woken
    /// when a message about it arrives, and [`Watch::filled`] then holds the
    /// entry the message carried, if any. Starts the listener on first use and
    /// waits (at most `ready_within`) until it is subscribed.
    pub(crate) async fn watch(
        &self,
        store: &dyn Store,
        key: &[u8],
        ready_within: Duration,
    ) -> Watch<'_> {
        let ready = self.listen(store);
        if !ready.up.load(Ordering::SeqCst) {
            let _ = tokio::time::timeout(ready_within, ready.wait()).await;
        }
        let slot = Arc::clone(lock(&self.registry).entry(key.to_vec()).or_default());
        Watch {
            waiters: self,
            key: key.to_vec(),
            slot,
        }
    }

    /// Starts the listener if it does not run and waits (at most
    /// `within`) until it is subscribed.
    pub(crate) async fn subscribed_within(&self, store: &dyn Store, within: Duration) {
        let ready = self.listen(store);
        if !ready.up.load(Ordering::SeqCst) {
            let _ = tokio::time::timeout(within, ready.wait()).await;
        }
    }

    /// Whether the listener runs and is subscribed now.
    pub(crate) fn is_up(&self) -> bool {
        self.is_listening() && self.ready.up.load(Ordering::SeqCst)
    }

    /// Whether the listener runs.
    pub(crate) fn is_listening(&self) -> bool {
        !self.lost.load(Ordering::Acquire)
    }

    /// Makes sure the listener runs (it keeps L1 in step), starting it on
    /// the caller's runtime if it never ran or its runtime went away;
    /// cheap (one atomic load) while it runs.
    #[inline]
    pub(crate) fn ensure_listening(&self, store: &dyn Store) {
        if self.lost.load(Ordering::Acquire) {
            self.start_listening(store);
        }
    }

    /// Starts the listener if it does not run (needs a tokio runtime);
    /// the returned flag says whether it is subscribed.
    fn listen(&self, store: &dyn Store) -> Arc<Ready> {
        self.ensure_listening(store);
        Arc::clone(&self.ready)
    }

    #[cold]
    fn start_listening(&self, store: &dyn Store) {
        // Lowered first: a listener lost from now on raises it again.
        self.lost.store(false, Ordering::SeqCst);
        let started = self
            .listener
            .ensure(Duration::MAX, |duty| self.listener_task(store, duty));
        match started {
            Some(task) => self.track(task),
            // Outside a runtime, or another call started it just now.
            None if !self.listener.is_running(Duration::MAX) => {
                self.lost.store(true, Ordering::SeqCst);
            }
            None => {}
        }
        self.listen_previous(store);
    }

    fn track(&self, task: AbortHandle) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// The listener's task: subscribes now (on the caller's runtime), then
    /// dispatches every delivery. Until it is subscribed, L1 counts the bus
    /// as down; so it does once the task is gone (see [`ListenerDuty`]).
    fn listener_task(
        &self,
        store: &dyn Store,
        duty: Duty,
    ) -> impl Future<Output = ()> + Send + 'static {
        let mut subscription = store.subscribe(&self.channel);
        if self.renew_feed.swap(false, Ordering::SeqCst) {
            // The listener before was stranded: so may the store's feed
            // be, on the same idle runtime.
            subscription.renew();
        }
        let up = subscription.is_ready();
        self.ready.set(up);
        self.ready.promise(self.born, LISTENER_PROMISE);
        if let Some(hook) = &self.hook {
            // Not subscribed yet: nothing is heard until it is, as after a
            // drop. Subscribed (a feed that outlived a lost listener):
            // whatever the lost one left unverified is heard from now on.
            hook.missed(up);
        }
        let born = self.born;
        let duty = ListenerDuty {
            duty: Some(duty),
            ready: Arc::clone(&self.ready),
            hook: self.hook.clone(),
        };
        let ready_tx = Arc::clone(&self.ready);
        let registry = Arc::clone(&self.registry);
        let hook = self.hook.clone();
        let own = self.sender;
        let metrics = self.metrics.clone();
        // Stores announce every (re)subscription with `Missed`, so the
        // ready flag is refreshed after each delivery.
        async move {
            let mut beat = tokio::time::interval(LISTENER_BEAT);
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            if let (Some(hook), true) = (&hook, subscription.is_ready()) {
                subscribed(hook);
            }
            loop {
                // In order (no random pick): a seeded simulation replays.
                let delivery = tokio::select! {
                    biased;
                    delivery = subscription.recv() => delivery,
                    _ = beat.tick() => {
                        if !duty.is_current() {
                            // Taken for stranded and replaced (its runtime
                            // was idle): the new listener hears for it.
                            return duty.done();
                        }
                        ready_tx.promise(born, LISTENER_PROMISE);
                        // The store's feed may be the one stranded.
                        subscription.keep_alive();
                        if let Some(hook) = &hook {
                            hook.beat();
                        }
                        continue;
                    }
                };
                let Some(delivery) = delivery else { break };
                match delivery {
                    Delivery::Message(m) => {
                        if let Some(metrics) = &metrics {
                            metrics.notices("received", 1);
                        }
                        for parsed in parts(&m) {
                            // Decided now, in bus order: a value published
                            // before an own invalidation not yet heard back
                            // is not handed over (the waiter reads instead).
                            let filled = parsed
                                .value_at
                                .filter(|_| {
                                    hook.as_ref().is_none_or(|h| h.trusts_carried(parsed.key))
                                })
                                .map(|at| Carried {
                                    message: Arc::clone(&m),
                                    at,
                                });
                            wake(&registry, Some((parsed.key, filled)));
                            if let Some(hook) = &hook {
                                let invalidated = parsed.kind == INVALIDATED;
                                let own = parsed.sender == own;
                                if parsed.kind == CLEARED {
                                    hook.cleared(parsed.key).await;
                                } else if parsed.kind == CLEAR_ACKED {
                                    hook.clear_acked(parsed.key);
                                } else if parsed.kind == TAG_INVALIDATED {
                                    // This process dealt with its own
                                    // before publishing it.
                                    if !own {
                                        hook.tags_invalidated();
                                    }
                                } else if matches!(parsed.kind, RELEASED | FAILED | PASSED) {
                                    // A load gave up (or was not to be
                                    // cached): nothing changed in the
                                    // store, and an L1 copy may be all
                                    // that stands in for it.
                                } else if own {
                                    // This process dealt with its own
                                    // change when it made it.
                                    if invalidated {
                                        hook.own_invalidation_heard(parsed.key);
                                    }
                                } else {
                                    hook.changed(parsed.key.to_vec(), invalidated).await;
                                }
                            }
                        }
                    }
                    Delivery::Missed => {
                        // Stores announce every (re)subscription too;
                        // only a drop (the bus is down now) can have
                        // lost notices.
                        if let (Some(metrics), false) = (&metrics, subscription.is_ready()) {
                            metrics.notices("missed", 1);
                        }
                        wake(&registry, None);
                        if let Some(hook) = &hook {
                            let up = subscription.is_ready();
                            hook.missed(up);
                            if up {
                                subscribed(hook);
                            }
                        }
                    }
                }
                let now = subscription.is_ready();
                ready_tx.set(now);
            }
            // The subscription ended (its feed went away with a runtime,
            // say): nothing is heard from here on, so the bus counts as
            // down (the duty's drop) and the next call subscribes again.
            drop(duty);
        }
    }

    /// Whether the listener missed its promise by `now` (it runs on a
    /// runtime that has gone idle). On the L1 hit path: each thread
    /// remembers the last promise it saw kept and until when, and while
    /// `now` is before that, answers with two comparisons (turning the
    /// promise's milliseconds into an instant costs a tenth of an L1 hit).
    /// A promise only ever moves later, or is withdrawn (then nothing is
    /// stranded): one remembered still holds until its instant.
    #[inline]
    pub(crate) fn is_stranded(&self, now: tokio::time::Instant) -> bool {
        if let Some((id, until)) = KEPT_UNTIL.get()
            && id == self.id
            && now <= until
        {
            return false;
        }
        self.is_stranded_slow(now)
    }

    #[cold]
    fn is_stranded_slow(&self, now: tokio::time::Instant) -> bool {
        let due = self.ready.due_ms.load(Ordering::Relaxed);
        if due == 0 {
            return false;
        }
        let until = self.born + Duration::from_millis(due);
        if now > until {
            return true;
        }
        KEPT_UNTIL.set(Some((self.id, until)));
        false
    }

    /// The listener was found stranded: the bus counts as down at once (L1
    /// unverified), and a new listener starts on the caller's runtime (the
    /// stranded one ends, should its runtime run it again).
    #[cold]
    pub(crate) fn stranded(&self, store: &dyn Store) {
        tracing::debug!(
            "the bus listener missed its heartbeat (its runtime is idle); listening from here"
        );
        self.ready.due_ms.store(0, Ordering::Relaxed);
        self.ready.set(false);
        if let Some(hook) = &self.hook {
            hook.missed(false);
        }
        self.listener.reset();
        self.renew_feed.store(true, Ordering::SeqCst);
        self.lost.store(true, Ordering::SeqCst);
        self.ensure_listening(store);
    }

    /// Starts the previous version's listener, once: any message about a
    /// key of the previous version (a fill, an invalidation, a release: its
    /// entry changed, so this version's entry of the key is no longer valid,
    /// see `transition`; a release changes nothing and is ignored) counts
    /// as an invalidation of this version's key,
    /// a tag invalidation there as one here, and a clear there clears this
    /// version's namespace the same way. Messages this cache sent
    /// there itself (its own `invalidate`) were dealt with when it sent them.
    fn listen_previous(&self, store: &dyn Store) {
        let (Some(previous), Some(hook)) = (&self.previous, &self.hook) else {
            return;
        };
        if tokio::time::Instant::now() >= previous.until {
            // Over: a listener lost before the end no longer holds L1 back.
            if !self.previous_listener.is_running(Duration::MAX) {
                hook.previous_missed(true);
            }
            return;
        }
        let started = self.previous_listener.ensure(Duration::MAX, |duty| {
            let mut subscription = store.subscribe(&previous.channel);
            let hook = Arc::clone(hook);
            // Until it is subscribed, nothing from there is heard.
            hook.previous_missed(subscription.is_ready());
            let own = self.sender;
            let (old, new) = previous.prefixes.clone();
            let until = previous.until;
            let channel = previous.channel.clone();
            let guard = PreviousDuty {
                duty: Some(duty),
                hook: Arc::clone(&hook),
            };
            async move {
                loop {
                    let delivery = tokio::select! {
                        delivery = subscription.recv() => delivery,
                        // The transition is over: nothing more to hear, and
                        // that channel being down no longer holds L1 back.
                        () = tokio::time::sleep_until(until) => {
                            guard.hook.previous_missed(true);
                            return guard.done();
                        }
                    };
                    // The subscription ended: that channel counts as down
                    // (the guard's drop) until the next call subscribes
                    // again.
                    let Some(delivery) = delivery else { return };
                    match delivery {
                        Delivery::Message(m) => {
                            for parsed in parts(&m) {
                                if parsed.sender == own {
                                    continue;
                                }
                                if parsed.kind == TAG_INVALIDATED {
                                    hook.tags_invalidated();
                                } else if parsed.kind == CLEARED {
                                    // Its entries' bytes did not change:
                                    // this version's entries pinned beside
                                    // them would stand. Cleared here too.
                                    hook.previous_cleared(parsed.key, &channel).await;
                                } else if matches!(
                                    parsed.kind,
                                    RELEASED | FAILED | PASSED | CLEAR_ACKED
                                ) {
                                    // Its entry did not change.
                                } else if let Some(rest) = parsed.key.strip_prefix(old.as_slice()) {
                                    let key = [new.as_slice(), rest].concat();
                                    hook.changed(key, true).await;
                                }
                            }
                        }
                        // A drop, a (re)subscription, or a lag: whatever
                        // was missed, L1 re-reads before it trusts a copy.
                        Delivery::Missed => hook.previous_missed(subscription.is_ready()),
                    }
                }
            }
        });
        if let Some(task) = started {
            self.track(task);
        }
    }
}

impl Drop for Waiters {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        for task in tasks.drain(..) {
            task.abort();
        }
    }
}

/// The listener's hold on its slot: dropped before the listener was done
/// (its runtime went away, or its subscription ended), the bus counts as
/// down (L1 unverified) until the next call has started a new listener and
/// it is subscribed.
struct ListenerDuty {
    duty: Option<Duty>,
    ready: Arc<Ready>,
    hook: Option<Arc<dyn BusHook>>,
}

impl ListenerDuty {
    /// Whether this is still the waiters' listener.
    fn is_current(&self) -> bool {
        self.duty.as_ref().is_some_and(Duty::is_current)
    }

    /// Ends without a word (replaced: the new listener speaks).
    fn done(mut self) {
        if let Some(duty) = self.duty.take() {
            duty.done();
        }
    }
}

impl Drop for ListenerDuty {
    fn drop(&mut self) {
        let Some(duty) = self.duty.take() else { return };
        if duty.is_current() {
            self.ready.set(false);
            if let Some(hook) = &self.hook {
                hook.missed(false);
            }
        }
        // Raises the waiters' `lost` flag.
        drop(duty);
    }
}

/// The previous version's listener's hold on its slot: dropped before it
/// was done, that channel counts as down until a new listener is
/// subscribed.
struct PreviousDuty {
    duty: Option<Duty>,
    hook: Arc<dyn BusHook>,
}

impl PreviousDuty {
    fn done(mut self) {
        if let Some(duty) = self.duty.take() {
            duty.done();
        }
    }
}

impl Drop for PreviousDuty {
    fn drop(&mut self) {
        let Some(duty) = self.duty.take() else { return };
        if duty.is_current() {
            self.hook.previous_missed(false);
        }
        drop(duty);
    }
}

/// Tells `hook` the listener is subscribed, in a task of its own (what it
/// reads must not hold up the messages).
fn subscribed(hook: &Arc<dyn BusHook>) {
    let hook = Arc::clone(hook);
    tokio::spawn(async move { hook.subscribed().await });
}

/// Wakes the waiters for `key`, handing them what the message carried, or
/// every waiter (with nothing) when `key` is `None`.
fn wake(registry: &WaiterRegistry, key: Option<(&[u8], Option<Carried>)>) {
    let registry = lock(registry);
    match key {
        Some((key, filled)) => {
            if let Some(slot) = registry.get(key) {
                slot.deliver(filled);
            }
        }
        None => {
            // In key order, not the map's (randomly seeded) order: which
            // waiter runs first must not differ between two runs of one
            // seeded simulation. Only a lost-messages event comes here.
            let mut slots: Vec<_> = registry.iter().collect();
            slots.sort_unstable_by(|a, b| a.0.cmp(b.0));
            slots.into_iter().for_each(|(_, slot)| slot.deliver(None));
        }
    }
}

fn lock(registry: &WaiterRegistry) -> MutexGuard<'_, WaiterMap> {
    registry.lock().unwrap_or_else(|p| p.into_inner())
}

/// Interest in one key; unregisters on drop.
pub(crate) struct Watch<'a> {
    waiters: &'a Waiters,
    key: Vec<u8>,
    slot: Arc<KeyWaiters>,
}

impl Watch<'_> {
    pub(crate) fn notify(&self) -> &Notify {
        &self.slot.notify
    }

    /// Whether the bus is subscribed now (messages about the key reach
    /// this watch).
    pub(crate) fn hears(&self) -> bool {
        self.waiters.is_listening() && self.waiters.ready.up.load(Ordering::SeqCst)
    }

    /// The stored entry the latest message about the key carried, if it
    /// carried one (a later message without one clears it).
    pub(crate) fn filled(&self) -> Option<Vec<u8>> {
        let filled = self.slot.filled.lock().unwrap_or_else(|p| p.into_inner());
        filled
            .as_ref()
            .filter(|carried| carried.kind() == FILLED_WITH_VALUE)
            .and_then(|carried| carried.message.get(carried.at..))
            .map(<[u8]>::to_vec)
    }

    /// The outcome the latest message about the key handed over, if it
    /// was a failure or a value not to cache (see [`Handed`]).
    pub(crate) fn handed(&self) -> Option<Handed> {
        let filled = self.slot.filled.lock().unwrap_or_else(|p| p.into_inner());
        let carried = filled.as_ref()?;
        let payload = carried.message.get(carried.at..)?;
        match carried.kind() {
            FAILED => failure_kind(*payload.first()?).map(Handed::Failed),
            PASSED => Some(Handed::Passed(payload.to_vec())),
            _ => None,
        }
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        let mut registry = lock(&self.waiters.registry);
        // Only the last watcher of a key removes it (one per flight, but two
        // caches may share nothing here; be exact anyway).
        if Arc::strong_count(&self.slot) <= 2 {
            registry.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENDER: [u8; SENDER_LEN] = *b"sender01";

    #[test]
    fn plain_messages_carry_sender_and_key() {
        let m = message(FILLED, &SENDER, b"bw:ns:v:k");
        let parsed = parse(&m).unwrap();
        assert_eq!(parsed.sender, &SENDER[..]);
        assert_eq!(parsed.key, b"bw:ns:v:k");
        assert_eq!(parsed.value_at, None);
    }

    #[test]
    fn failures_and_uncacheable_values_are_handed_after_the_key() {
        let registry = WaiterRegistry::default();
        let slot = Arc::clone(lock(&registry).entry(b"k".to_vec()).or_default());
        let handed = |m: Vec<u8>| {
            let m: Arc<[u8]> = m.into();
            let parsed = parse(&m).unwrap();
            assert_eq!(parsed.key, b"k");
            let at = parsed.value_at.unwrap();
            slot.deliver(Some(Carried {
                message: Arc::clone(&m),
                at,
            }));
            let filled = slot.filled.lock().unwrap();
            let carried = filled.as_ref().unwrap();
            (carried.kind(), carried.message[carried.at..].to_vec())
        };
        let mut failed = carrying(FAILED, &SENDER, b"k").unwrap();
        failed.push(failure_code(crate::ErrorKind::Loader).unwrap());
        assert_eq!(handed(failed), (FAILED, b"l".to_vec()));
        assert_eq!(failure_kind(b'l'), Some(crate::ErrorKind::Loader));
        assert_eq!(failure_kind(b'?'), None);
        // The store's own failures and the holder's bulkhead are not the
        // key's outcome: released as before.
        assert_eq!(failure_code(crate::ErrorKind::Store), None);
        assert_eq!(failure_code(crate::ErrorKind::Overloaded), None);
        let mut passed = carrying(PASSED, &SENDER, b"k").unwrap();
        passed.extend_from_slice(b"entry");
        assert_eq!(handed(passed), (PASSED, b"entry".to_vec()));
    }

    #[test]
    fn value_messages_carry_the_entry_after_the_key() {
        let mut m = value_message(&SENDER, b"bw:ns:v:k").unwrap();
        m.extend_from_slice(b"entry bytes");
        let parsed = parse(&m).unwrap();
        assert_eq!(parsed.sender, &SENDER[..]);
        assert_eq!(parsed.key, b"bw:ns:v:k");
        assert_eq!(&m[parsed.value_at.unwrap()..], b"entry bytes");
    }

    #[test]
    fn malformed_messages_are_ignored() {
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"f"), None);
        assert_eq!(parse(b"fsender01"), None, "no key");
        let head = value_message(&SENDER, b"key").unwrap();
        // The key's length says more than the message holds.
        assert_eq!(parse(&head[..head.len() - 1]), None);
        // A value message cut inside its length.
        assert_eq!(parse(&head[..1 + SENDER_LEN + 2]), None);
        // An empty key.
        let mut empty = vec![FILLED_WITH_VALUE];
        empty.extend_from_slice(&SENDER);
        empty.extend_from_slice(&0u32.to_be_bytes());
        assert_eq!(parse(&empty), None);
    }

    #[test]
    fn batch_messages_list_their_keys() {
        let head = message(INVALIDATED_MANY, &SENDER, b"");
        let notice = crate::store::Notice {
            channel: b"chan",
            message: &head,
            batch_head: None,
        };
        let m = notice.for_keys([&b"bw:ns:v:{a}"[..], b"bw:ns:v:{bb}"]);
        let parsed = parse(&m).unwrap();
        assert_eq!(parsed.kind, INVALIDATED_MANY);
        assert_eq!(parsed.sender, &SENDER[..]);
        assert_eq!(
            batch_keys(parsed.key),
            Some(vec![&b"bw:ns:v:{a}"[..], b"bw:ns:v:{bb}"])
        );
        // Handled as one `i` message per key.
        let each: Vec<_> = parts(&m).map(|p| (p.kind, p.key)).collect();
        assert_eq!(
            each,
            [
                (INVALIDATED, &b"bw:ns:v:{a}"[..]),
                (INVALIDATED, b"bw:ns:v:{bb}")
            ]
        );
        assert_eq!(parts(&m[..m.len() - 1]).count(), 0, "a malformed list");
        // Cut inside the second key, inside its length, or an empty key.
        assert_eq!(batch_keys(&parsed.key[..parsed.key.len() - 1]), None);
        assert_eq!(batch_keys(&parsed.key[..4 + 11 + 2]), None);
        assert_eq!(batch_keys(&0u32.to_be_bytes()), None);
    }

    #[tokio::test]
    async fn a_watch_sees_what_the_latest_message_carried() {
        let waiters = Waiters::new(b"chan".to_vec(), SENDER, None, None);
        let store = crate::store::MemoryStore::new();
        let watch = waiters.watch(&store, b"k", Duration::from_secs(1)).await;
        assert_eq!(watch.filled(), None);
        let mut m = value_message(&SENDER, b"k").unwrap();
        m.extend_from_slice(b"entry");
        let m: Arc<[u8]> = Arc::from(m);
        let carrying = || {
            let carried = Carried {
                message: Arc::clone(&m),
                at: m.len() - 5,
            };
            wake(&waiters.registry, Some((b"k", Some(carried))));
        };
        carrying();
        assert_eq!(watch.filled().as_deref(), Some(&b"entry"[..]));
        // A later message without a value clears it, and so does a miss.
        wake(&waiters.registry, Some((b"k", None)));
        assert_eq!(watch.filled(), None);
        carrying();
        wake(&waiters.registry, None);
        assert_eq!(watch.filled(), None);
        drop(watch);
        assert!(lock(&waiters.registry).is_empty());
    }
}
