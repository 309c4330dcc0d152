//! [`ChaosStore`]: a [`Store`] in front of another whose calls are delayed,
//! reordered, timed out after they ran, refused, or hung by a stopped store,
//! and whose bus loses messages and connections, all drawn from one seed.

use std::future::Future;
use std::ops::RangeInclusive;
use std::pin::pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, sleep, sleep_until};

use crate::error::Error;
use crate::store::{
    ClearedNamespace, Delivery, FencedRenewal, FencedWrite, Invalidate, LeaseAttempt, MemoryStore,
    NamespaceClear, Notice, Renewal, Replace, Store, StoreFuture, Subscription,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------- faults

/// What can go wrong with a [`ChaosStore`]'s calls and bus, as
/// probabilities (each in `0..=1`), drawn for every call (and every bus
/// message) from the store's seeded generator.
///
/// [`Faults::HEALTHY`] (also the default) has every probability at 0; each
/// method returns a copy with one of them set.
///
/// # Examples
///
/// ```
/// use breakwater_cache::testing::Faults;
///
/// // A third of the calls wait up to `Faults::MAX_DELAY` before they run,
/// // and half the bus messages are lost.
/// let faults = Faults::HEALTHY.delay_before(0.3).message_loss(0.5);
/// assert_ne!(faults, Faults::HEALTHY);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    delay_before: f64,
    delay_after: f64,
    timeout_after: f64,
    fail_before: f64,
    message_loss: f64,
    disconnect: f64,
}

impl Faults {
    /// Nothing goes wrong.
    pub const HEALTHY: Faults = Faults {
        delay_before: 0.0,
        delay_after: 0.0,
        timeout_after: 0.0,
        fail_before: 0.0,
        message_loss: 0.0,
        disconnect: 0.0,
    };

    /// The longest delay before or after one call: 300 ms (each delay is a
    /// whole number of milliseconds from 1 to this).
    pub const MAX_DELAY: Duration = Duration::from_millis(300);

    /// How long a call to a stopped store ([`ChaosStore::set_up`]) hangs
    /// before it fails, and how long a call that times out after it ran
    /// takes to say so: 500 ms. With [`MAX_DELAY`](Self::MAX_DELAY) before
    /// it, the longest one reply can take (outside
    /// [`ChaosStore::set_slow`]).
    pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

    /// How long a caller that holds a stand-in waits for a read before it
    /// is served the stand-in ([`Store::soft_deadline`]), outside
    /// [`ChaosStore::set_slow`]: 150 ms, so a stopped store and half the
    /// delayed calls are given up on.
    pub const SOFT_DEADLINE: Duration = Duration::from_millis(150);

    /// The chance that a call waits up to [`MAX_DELAY`](Self::MAX_DELAY)
    /// before it is sent to the wrapped store.
    ///
    /// # Panics
    ///
    /// If `p` is not in `0..=1`.
    pub fn delay_before(self, p: f64) -> Faults {
        Faults {
            delay_before: probability("delay_before", p),
            ..self
        }
    }

    /// The chance that a call's reply waits up to
    /// [`MAX_DELAY`](Self::MAX_DELAY) after the wrapped store answered, so
    /// replies arrive in another order than the calls ran.
    ///
    /// # Panics
    ///
    /// If `p` is not in `0..=1`.
    pub fn delay_after(self, p: f64) -> Faults {
        Faults {
            delay_after: probability("delay_after", p),
            ..self
        }
    }

    /// The chance that a call runs in the wrapped store and then fails
    /// after [`RESPONSE_TIMEOUT`](Self::RESPONSE_TIMEOUT) as if its reply
    /// were lost: the caller sees an error for a write that happened.
    ///
    /// # Panics
    ///
    /// If `p` is not in `0..=1`.
    pub fn timeout_after(self, p: f64) -> Faults {
        Faults {
            timeout_after: probability("timeout_after", p),
            ..self
        }
    }

    /// The chance that a call fails at once without running ("connection
    /// dropped").
    ///
    /// # Panics
    ///
    /// If `p` is not in `0..=1`.
    pub fn fail_before(self, p: f64) -> Faults {
        Faults {
            fail_before: probability("fail_before", p),
            ..self
        }
    }

    /// The chance that one bus message is lost without a word (no
    /// [`Delivery::Missed`]): the subscriber cannot tell.
    ///
    /// # Panics
    ///
    /// If `p` is not in `0..=1`.
    pub fn message_loss(self, p: f64) -> Faults {
        Faults {
            message_loss: probability("message_loss", p),
            ..self
        }
    }

    /// The chance, per bus message, that the subscription's connection
    /// drops: that message and every one for the next 50 ms to 2 s are
    /// lost, the subscription is not [ready](Subscription::is_ready)
    /// meanwhile, and it delivers [`Delivery::Missed`] when it goes down and
    /// again when it is back.
    ///
    /// # Panics
    ///
    /// If `p` is not in `0..=1`.
    pub fn disconnect(self, p: f64) -> Faults {
        Faults {
            disconnect: probability("disconnect", p),
            ..self
        }
    }
}

fn probability(name: &str, p: f64) -> f64 {
    assert!(
        (0.0..=1.0).contains(&p),
        "Faults::{name} is a probability in 0..=1, got {p}"
    );
    p
}

// ---------------------------------------------------------------- events

/// What a [`ChaosStore`] tells its observer ([`ChaosStore::observe`]), as
/// it happens.
///
/// Results come as a short summary of the value, never its bytes (`found`
/// or `none` for a read, `ok` for a write, `true`/`false`, a lease attempt
/// as `Acquired` or `Held { .. }`; generations and pinned placeholders,
/// which the cache draws from the OS, only as `bumped`, `N generation(s)`
/// and `pinned`), so a trace of these events replays exactly for one seed.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum ChaosEvent<'a> {
    /// A call ran in the wrapped store. Its caller may hear of it later,
    /// hear an error instead ([`Faults::timeout_after`], a slow store's
    /// deadline), or never (its future was dropped meanwhile): this is the
    /// moment a write took effect.
    #[non_exhaustive]
    Ran {
        /// The [`Store`] method, e.g. `"get"`, `"fenced_set"`,
        /// `"invalidate"`.
        method: &'static str,
        /// The key it was called with: a read batch's first key (a write
        /// batch is one event per key), a `publish`'s channel.
        key: &'a [u8],
        /// What the wrapped store answered.
        result: Result<&'a str, &'a Error>,
    },
    /// A call answered its caller (a call whose future is dropped first
    /// never does).
    #[non_exhaustive]
    Replied {
        /// The [`Store`] method, as in [`Ran`](ChaosEvent::Ran).
        method: &'static str,
        /// The key, as in [`Ran`](ChaosEvent::Ran).
        key: &'a [u8],
        /// When the call was made.
        start: Instant,
        /// When it ran in the wrapped store and what that answered; `None`
        /// if it never ran (refused, the store stopped, or timed out before
        /// its turn).
        ran: Option<(Instant, Result<&'a str, &'a Error>)>,
        /// What the caller got.
        reply: Result<&'a str, &'a Error>,
    },
    /// One subscription's connection went down or came back.
    Bus(BusChange),
}

/// How a [`ChaosStore`] subscription's connection changed; see
/// [`ChaosEvent::Bus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BusChange {
    /// Down: the store was stopped ([`ChaosStore::set_up`]`(false)`).
    StoreStopped,
    /// Down: the connection dropped ([`Faults::disconnect`]).
    ConnectionDropped,
    /// Back up.
    Up,
}

type Observer = Arc<dyn Fn(ChaosEvent<'_>) + Send + Sync>;

// ---------------------------------------------------------------- the store

struct ChaosState {
    rng: StdRng,
    faults: Faults,
    /// Every call answered slowly, if set.
    slow: Option<Slow>,
    /// `false` while the store is stopped: calls hang for the response
    /// timeout, then fail, and the subscriptions are down.
    link: watch::Sender<bool>,
    /// The tasks that feed the subscriptions.
    feeds: Vec<tokio::task::AbortHandle>,
}

/// A store that answers every call after a seeded latency, with
/// deadlines that follow it as `RedisStore`'s do: a read starts with
/// `response_timeout`'s 50 ms, a write with `write_timeout`'s 250 ms; a
/// call slower than its deadline times out at the deadline (after it ran:
/// its reply is what was late), and the deadline of its kind becomes 3 ×
/// what it was, up to 2 s (`max_response_timeout`); a call whose deadline
/// another call's timeout grew meanwhile waits on to the new one.
#[derive(Debug, Clone, Copy)]
struct Slow {
    /// Each call's latency is drawn from `latency.0..=latency.1` ms.
    latency: (u64, u64),
    read_deadline: Duration,
    write_deadline: Duration,
}

impl Slow {
    const CEILING: Duration = Duration::from_secs(2);

    fn new(latency: (u64, u64)) -> Slow {
        Slow {
            latency,
            read_deadline: ms(50),
            write_deadline: ms(250),
        }
    }

    fn deadline(&mut self, read: bool) -> &mut Duration {
        if read {
            &mut self.read_deadline
        } else {
            &mut self.write_deadline
        }
    }
}

/// What one call will suffer, drawn when it is made.
enum Plan {
    Down,
    Dropped,
    /// Answered after `latency`, or timed out at `deadline` if that is
    /// sooner (see [`Slow`]).
    Slow {
        latency: Duration,
        deadline: Duration,
        read: bool,
    },
    Run {
        before: Duration,
        timeout: bool,
        after: Duration,
    },
}

/// A [`Store`] in front of another (by default a [`MemoryStore`]) whose
/// calls suffer seeded faults: the ones breakwater's own fault-schedule
/// simulation runs a fleet of caches under.
///
/// Every call draws its fate from one seeded generator when it is made:
///
/// - under [`Faults`]: refused at once ([`fail_before`](Faults::fail_before)),
///   or run after a delay ([`delay_before`](Faults::delay_before)), then
///   answered after another ([`delay_after`](Faults::delay_after): replies
///   reordered) or, having run, failed as timed out
///   ([`timeout_after`](Faults::timeout_after));
/// - while the store is stopped ([`set_up`](Self::set_up)`(false)`): hangs
///   for [`Faults::RESPONSE_TIMEOUT`] and fails without running;
/// - once the store is slow ([`set_slow`](Self::set_slow)): answered after
///   a drawn latency, under deadlines that grow after a timeout as
///   [`RedisStore`](crate::RedisStore)'s do.
///
/// Subscriptions are fed by a task of their own that loses messages and
/// connections ([`message_loss`](Faults::message_loss),
/// [`disconnect`](Faults::disconnect)), goes down while the store is
/// stopped, and can be killed without a word
/// ([`kill_feeds`](Self::kill_feeds)), as when the runtime that ran it is
/// dropped.
///
/// On a current-thread runtime with paused time (tokio's `test-util`), one
/// seed replays exactly: the same faults hit the same calls. Reads that
/// meet go out as one [`get_many`](Store::get_many) (one fault plan, as one
/// `MGET`): [`batches_reads`](Store::batches_reads) is `true`, so a cache's
/// read queue runs under the faults too.
///
/// Clones share the faults, the generator and the feeds: give each
/// simulated process its own `ChaosStore` (each with its own seed) over
/// one shared inner store.
///
/// # Examples
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use std::time::Duration;
/// use breakwater_cache::{Cache, MemoryStore, Store};
/// use breakwater_cache::testing::{ChaosEvent, ChaosStore, Faults};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let runtime = tokio::runtime::Builder::new_current_thread()
///     .enable_all()
///     .start_paused(true) // tokio's `test-util`: delays cost no time
///     .build()?;
/// runtime.block_on(async {
///     let replies = Arc::new(Mutex::new(Vec::new()));
///     let seen = Arc::clone(&replies);
///     let store = ChaosStore::new(MemoryStore::new(), 7).observe(move |event| {
///         if let ChaosEvent::Replied { method, reply, .. } = event {
///             seen.lock().unwrap().push((method, reply.is_ok()));
///         }
///     });
///     store.set_faults(Faults::HEALTHY.delay_before(0.5).delay_after(0.5));
///     let cache = Cache::<u64>::builder()
///         .namespace("stock")
///         .shared_store(Arc::new(store.clone()))
///         .build()?;
///     for _ in 0..20 {
///         // Late and reordered replies: the loader's answer comes through.
///         let units = cache.get_or_load("sku:1", || async { Ok::<_, std::io::Error>(Some(12)) });
///         assert_eq!(units.await?, Some(12));
///     }
///     // The store stopped: calls hang for the response timeout, then fail.
///     store.set_up(false);
///     assert!(store.get(b"anything").await.is_err());
///     assert!(!replies.lock().unwrap().is_empty());
///     Ok(())
/// })
/// # }
/// ```
pub struct ChaosStore<S = MemoryStore> {
    inner: S,
    state: Arc<Mutex<ChaosState>>,
    observer: Option<Observer>,
}

impl<S: Clone> Clone for ChaosStore<S> {
    fn clone(&self) -> Self {
        ChaosStore {
            inner: self.inner.clone(),
            state: Arc::clone(&self.state),
            observer: self.observer.clone(),
        }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for ChaosStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChaosStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S: Store> ChaosStore<S> {
    /// `inner` behind seeded faults: healthy ([`Faults::HEALTHY`]) and up
    /// until told otherwise. Every draw comes from a generator seeded with
    /// `seed` (rand's `StdRng::seed_from_u64`).
    pub fn new(inner: S, seed: u64) -> Self {
        ChaosStore {
            inner,
            observer: None,
            state: Arc::new(Mutex::new(ChaosState {
                rng: StdRng::seed_from_u64(seed),
                faults: Faults::HEALTHY,
                slow: None,
                link: watch::Sender::new(true),
                feeds: Vec::new(),
            })),
        }
    }

    /// The same store, calling `observer` with every [`ChaosEvent`]: each
    /// call that ran in the wrapped store, each reply, each bus connection
    /// change. It runs inside the call (or the bus task), so it should be
    /// quick; the store's clones made from now on share it.
    pub fn observe(mut self, observer: impl Fn(ChaosEvent<'_>) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The wrapped store, for reaching it without faults (say, to take a
    /// key away as memory pressure would).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// What goes wrong from now on, for calls made from now on and bus
    /// messages from now on.
    pub fn set_faults(&self, faults: Faults) {
        lock(&self.state).faults = faults;
    }

    /// From now on (for good), every call is answered after a latency drawn
    /// from `latency` (in whole milliseconds), with deadlines that follow it
    /// as [`RedisStore`](crate::RedisStore)'s do: a read's starts at 50 ms, a
    /// write's at 250 ms; a call slower than its deadline runs, then times
    /// out at the deadline, and the deadline of its kind triples (up to
    /// 2 s), which calls still waiting then wait for. [`Faults`] no longer
    /// apply to calls (they still do to the bus), and
    /// [`read_deadline`](Store::read_deadline) follows the read deadline.
    ///
    /// # Panics
    ///
    /// A later call panics if `latency` is empty.
    pub fn set_slow(&self, latency: RangeInclusive<Duration>) {
        let whole = |d: &Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let latency = (whole(latency.start()), whole(latency.end()));
        lock(&self.state).slow = Some(Slow::new(latency));
    }

    /// Stops (`false`) or starts again (`true`) the store: while it is
    /// stopped every call hangs for [`Faults::RESPONSE_TIMEOUT`] and fails
    /// without running, and every subscription is down (not
    /// [ready](Subscription::is_ready), its messages lost, told
    /// [`Delivery::Missed`] when it goes down and again when it is back).
    pub fn set_up(&self, up: bool) {
        lock(&self.state).link.send_replace(up);
    }

    /// `false` while the store is stopped ([`set_up`](Self::set_up)).
    pub fn is_up(&self) -> bool {
        *lock(&self.state).link.borrow()
    }

    /// Ends every subscription's feed without a word (no
    /// [`Delivery::Missed`], nothing closed), as when the runtime that ran
    /// those tasks goes away: a subscriber must notice by itself. Returns
    /// how many feeds were running.
    pub fn kill_feeds(&self) -> usize {
        let feeds = std::mem::take(&mut lock(&self.state).feeds);
        feeds.iter().for_each(tokio::task::AbortHandle::abort);
        feeds.len()
    }

    fn plan(&self, read: bool) -> Plan {
        let mut s = lock(&self.state);
        if !*s.link.borrow() {
            return Plan::Down;
        }
        if let Some(mut slow) = s.slow {
            let latency = ms(s.rng.random_range(slow.latency.0..=slow.latency.1));
            let deadline = *slow.deadline(read);
            return Plan::Slow {
                latency,
                deadline,
                read,
            };
        }
        let f = s.faults;
        let rng = &mut s.rng;
        if rng.random_bool(f.fail_before) {
            return Plan::Dropped;
        }
        let max_delay = u64::try_from(Faults::MAX_DELAY.as_millis()).unwrap_or(u64::MAX);
        let mut delay = |p: f64| {
            if rng.random_bool(p) {
                ms(rng.random_range(1..=max_delay))
            } else {
                Duration::ZERO
            }
        };
        let before = delay(f.delay_before);
        let after = delay(f.delay_after);
        let timeout = rng.random_bool(f.timeout_after);
        Plan::Run {
            before,
            timeout,
            after,
        }
    }

    /// Tells the observer that `method` ran in the wrapped store.
    fn ran<T: Brief>(&self, method: &'static str, keys: &[&[u8]], result: &Result<T, Error>) {
        if let Some(observer) = &self.observer {
            let brief = result.as_ref().map(Brief::brief);
            for key in keys {
                observer(ChaosEvent::Ran {
                    method,
                    key,
                    result: brief.as_ref().map(String::as_str).map_err(|e| *e),
                });
            }
        }
    }

    /// Runs `op` (a call of `method` on the wrapped store, made only when
    /// it is to run) under this call's faults, and tells the observer.
    fn call<'a, T, F>(&'a self, method: &'static str, key: &'a [u8], op: F) -> StoreFuture<'a, T>
    where
        T: Send + Brief + 'a,
        F: FnOnce() -> StoreFuture<'a, T> + Send + 'a,
    {
        self.call_each(method, vec![key], op)
    }

    /// [`call`](Self::call) of a batch write: one fault plan for the
    /// batch, observed under each of its `keys`.
    fn call_each<'a, T, F>(
        &'a self,
        method: &'static str,
        keys: Vec<&'a [u8]>,
        op: F,
    ) -> StoreFuture<'a, T>
    where
        T: Send + Brief + 'a,
        F: FnOnce() -> StoreFuture<'a, T> + Send + 'a,
    {
        let plan = self.plan(matches!(method, "get" | "get_many"));
        Box::pin(async move {
            let start = Instant::now();
            let (result, ran) = match plan {
                Plan::Slow {
                    latency,
                    mut deadline,
                    read,
                } => {
                    // The command runs half-way, its reply takes the rest.
                    let (run_at, reply_at) = (start + latency / 2, start + latency);
                    let mut op = Some(op);
                    let mut done = None;
                    loop {
                        let give_up = start + deadline;
                        if run_at < give_up.min(reply_at) + ms(1)
                            && let Some(op) = op.take()
                        {
                            sleep_until(run_at).await;
                            let result = op().await;
                            self.ran(method, &keys, &result);
                            done = Some((Instant::now(), result));
                        }
                        if reply_at <= give_up {
                            sleep_until(reply_at).await;
                            let (at, result) = done.expect("it ran");
                            let ran = Some((at, summary(&result)));
                            break (result, ran);
                        }
                        sleep_until(give_up).await;
                        let mut state = lock(&self.state);
                        let current = state.slow.as_mut().expect("slow").deadline(read);
                        // Another call's timeout grew it (they were sent
                        // together): wait on, as `RedisStore` does.
                        if *current > deadline {
                            deadline = *current;
                            continue;
                        }
                        *current = (*current * 3).min(Slow::CEILING).max(*current);
                        let ran = done.map(|(at, result)| (at, summary(&result)));
                        break (Err(Error::store_msg("timed out")), ran);
                    }
                }
                Plan::Down => {
                    sleep(Faults::RESPONSE_TIMEOUT).await;
                    (
                        Err(Error::store_msg("no reply within the response timeout")),
                        None,
                    )
                }
                Plan::Dropped => (Err(Error::store_msg("connection dropped")), None),
                Plan::Run {
                    before,
                    timeout,
                    after,
                } => {
                    if !before.is_zero() {
                        sleep(before).await;
                    }
                    let result = op().await;
                    self.ran(method, &keys, &result);
                    let ran = Some((Instant::now(), summary(&result)));
                    if timeout {
                        sleep(Faults::RESPONSE_TIMEOUT).await;
                        (Err(Error::store_msg("timed out")), ran)
                    } else {
                        if !after.is_zero() {
                            sleep(after).await;
                        }
                        (result, ran)
                    }
                }
            };
            if let Some(observer) = &self.observer {
                let reply = result.as_ref().map(Brief::brief);
                for key in keys {
                    observer(ChaosEvent::Replied {
                        method,
                        key,
                        start,
                        ran: ran
                            .as_ref()
                            .map(|(at, r)| (*at, r.as_ref().map(String::as_str))),
                        reply: reply.as_ref().map(String::as_str).map_err(|e| *e),
                    });
                }
            }
            result
        })
    }
}

/// A result as the observer sees it: the value's summary, or the error.
fn summary<T: Brief>(result: &Result<T, Error>) -> Result<String, Error> {
    match result {
        Ok(v) => Ok(v.brief()),
        Err(e) => Err(e.clone()),
    }
}

/// A store reply as the observer sees it (no stored bytes: they hold
/// wall-clock timestamps).
trait Brief {
    fn brief(&self) -> String;
}

impl Brief for Option<Vec<u8>> {
    fn brief(&self) -> String {
        if self.is_some() { "found" } else { "none" }.to_owned()
    }
}

impl Brief for Vec<Option<Vec<u8>>> {
    fn brief(&self) -> String {
        let each: Vec<String> = self.iter().map(Brief::brief).collect();
        each.join(",")
    }
}

impl Brief for Option<Duration> {
    fn brief(&self) -> String {
        format!("{self:?}")
    }
}

impl Brief for ClearedNamespace {
    fn brief(&self) -> String {
        format!(
            "{} ({} receivers)",
            String::from_utf8_lossy(&self.record),
            self.receivers
        )
    }
}

impl Brief for Renewal {
    fn brief(&self) -> String {
        format!("{self:?}").to_lowercase()
    }
}

impl Brief for bool {
    fn brief(&self) -> String {
        self.to_string()
    }
}

/// A bumped generation: it may start again at a fresh value from the OS
/// (not part of a seed's replay), so only that it moved.
impl Brief for u64 {
    fn brief(&self) -> String {
        "bumped".to_owned()
    }
}

/// Generations read for a write: they may be fresh values from the OS (not
/// part of a seed's replay), so only how many.
impl Brief for Vec<u64> {
    fn brief(&self) -> String {
        format!("{} generation(s)", self.len())
    }
}

/// Tag states read for a write of tags a loader chose: fresh values from
/// the OS and wall-clock times (not part of a seed's replay), so only how
/// many.
impl Brief for Vec<Vec<u8>> {
    fn brief(&self) -> String {
        format!("{} state(s)", self.len())
    }
}

/// What a pin found: a placeholder made of OS randomness, or an entry; the
/// bytes are not part of a seed's replay.
impl Brief for Vec<u8> {
    fn brief(&self) -> String {
        "pinned".to_owned()
    }
}

impl Brief for () {
    fn brief(&self) -> String {
        "ok".to_owned()
    }
}

impl Brief for LeaseAttempt {
    fn brief(&self) -> String {
        format!("{self:?}")
    }
}

// ---------------------------------------------------------------- the bus

/// Forwards `upstream` to `tx` until everyone is gone, losing messages and
/// dropping the "connection" as the faults say.
async fn forward(
    mut upstream: Subscription,
    tx: broadcast::Sender<Delivery>,
    ready: watch::Sender<bool>,
    state: Arc<Mutex<ChaosState>>,
    observer: Option<Observer>,
) {
    let note = |change: BusChange| {
        if let Some(observer) = &observer {
            observer(ChaosEvent::Bus(change));
        }
    };
    let mut link = lock(&state).link.subscribe();
    loop {
        let delivery = tokio::select! {
            biased;
            _ = async { link.wait_for(|up| !*up).await.is_ok() } => None,
            delivery = upstream.recv() => Some(delivery),
        };
        let Some(delivery) = delivery else {
            // The store stopped: the connection is gone until it is back.
            note(BusChange::StoreStopped);
            ready.send_replace(false);
            let _ = tx.send(Delivery::Missed);
            let mut back = link.clone();
            let back = async move {
                let _ = back.wait_for(|up| *up).await.is_ok();
            };
            if !lose_until(&mut upstream, back).await {
                return;
            }
            note(BusChange::Up);
            ready.send_replace(true);
            let _ = tx.send(Delivery::Missed);
            continue;
        };
        let Some(delivery) = delivery else { return };
        let (lose, outage) = {
            let mut s = lock(&state);
            let f = s.faults;
            let lose = s.rng.random_bool(f.message_loss);
            let outage = s
                .rng
                .random_bool(f.disconnect)
                .then(|| ms(s.rng.random_range(50..=2_000)));
            (lose, outage)
        };
        if let Some(outage) = outage {
            // This message and everything until the reconnection is lost.
            note(BusChange::ConnectionDropped);
            ready.send_replace(false);
            let _ = tx.send(Delivery::Missed);
            if !lose_until(&mut upstream, sleep(outage)).await {
                return;
            }
            note(BusChange::Up);
            ready.send_replace(true);
            let _ = tx.send(Delivery::Missed);
        } else if !lose {
            let _ = tx.send(delivery);
        }
    }
}

/// Discards what `upstream` delivers until `until`; `false` if it closed.
async fn lose_until(upstream: &mut Subscription, until: impl Future<Output = ()>) -> bool {
    let mut until = pin!(until);
    loop {
        tokio::select! {
            biased;
            () = &mut until => return true,
            delivery = upstream.recv() => if delivery.is_none() { return false },
        }
    }
}

// ---------------------------------------------------------------- Store

impl<S: Store> Store for ChaosStore<S> {
    /// The read deadline in force, as `RedisStore`'s: the slow store's
    /// growing one ([`set_slow`](ChaosStore::set_slow)), else
    /// [`Faults::RESPONSE_TIMEOUT`].
    fn read_deadline(&self) -> Duration {
        lock(&self.state)
            .slow
            .map_or(Faults::RESPONSE_TIMEOUT, |slow| slow.read_deadline)
    }

    /// The slow store's growing write deadline, else
    /// [`Faults::RESPONSE_TIMEOUT`].
    fn write_deadline(&self) -> Duration {
        lock(&self.state)
            .slow
            .map_or(Faults::RESPONSE_TIMEOUT, |slow| slow.write_deadline)
    }

    /// [`Faults::SOFT_DEADLINE`]; on a slow store
    /// ([`set_slow`](ChaosStore::set_slow)) 3 × its longest latency (what
    /// its answers take, however its timeouts grew the read deadline),
    /// within 50 ms and 2 s, as `RedisStore`'s.
    fn soft_deadline(&self, _key: &[u8]) -> Duration {
        lock(&self.state)
            .slow
            .map_or(Faults::SOFT_DEADLINE, |slow| {
                (ms(slow.latency.1) * 3).clamp(ms(50), Slow::CEILING)
            })
    }

    /// The wrapped store's.
    fn failure_domains(&self) -> usize {
        self.inner.failure_domains()
    }

    /// The wrapped store's.
    fn failure_domain(&self, key: &[u8]) -> usize {
        self.inner.failure_domain(key)
    }

    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.call("get", key, move || self.inner.get(key))
    }

    /// One command for all the keys, as an `MGET` is: one fault plan
    /// (observed under the first key).
    fn get_many<'a>(&'a self, keys: &'a [&'a [u8]]) -> StoreFuture<'a, Vec<Option<Vec<u8>>>> {
        match keys.first() {
            Some(first) => self.call("get_many", first, move || self.inner.get_many(keys)),
            None => Box::pin(async { Ok(Vec::new()) }),
        }
    }

    /// As a single Redis: reads that meet while it is busy go out as one
    /// `get_many`, so a cache's read queue runs under the faults too.
    fn batches_reads(&self) -> bool {
        true
    }

    fn set<'a>(&'a self, key: &'a [u8], value: &'a [u8], ttl: Duration) -> StoreFuture<'a, ()> {
        self.call("set", key, move || self.inner.set(key, value, ttl))
    }

    fn delete<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, bool> {
        self.call("delete", key, move || self.inner.delete(key))
    }

    fn ttl<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        self.call("ttl", key, move || self.inner.ttl(key))
    }

    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }

    fn name(&self) -> &'static str {
        "chaos"
    }

    fn acquire_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, LeaseAttempt> {
        self.call("acquire_lease", lease_key, move || {
            self.inner.acquire_lease(lease_key, token, ttl)
        })
    }

    fn lease_held<'a>(&'a self, lease_key: &'a [u8]) -> StoreFuture<'a, bool> {
        self.call("lease_held", lease_key, move || {
            self.inner.lease_held(lease_key)
        })
    }

    fn extend_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        self.call("extend_lease", lease_key, move || {
            self.inner.extend_lease(lease_key, token, ttl)
        })
    }

    fn release_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.call("release_lease", lease_key, move || {
            self.inner.release_lease(lease_key, token, notice)
        })
    }

    fn fenced_set<'a>(&'a self, write: FencedWrite<'a>) -> StoreFuture<'a, bool> {
        self.call("fenced_set", write.key, move || {
            self.inner.fenced_set(write)
        })
    }

    /// The wrapped store's, as one call (one fault plan).
    fn expire_entry<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.call("expire_entry", key, move || {
            self.inner.expire_entry(key, lease_key, at_ms, notice)
        })
    }

    /// The wrapped store's, as one call (one fault plan).
    fn fenced_renew<'a>(&'a self, renewal: FencedRenewal<'a>) -> StoreFuture<'a, Renewal> {
        self.call("fenced_renew", renewal.key, move || {
            self.inner.fenced_renew(renewal)
        })
    }

    /// The wrapped store's, as one call (one fault plan).
    fn pin<'a>(
        &'a self,
        key: &'a [u8],
        placeholder: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u8>> {
        self.call("pin", key, move || self.inner.pin(key, placeholder, ttl))
    }

    fn replace<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
        ttl: Duration,
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.call("replace", key, move || {
            self.inner.replace(key, value, ttl, lease_key, notice)
        })
    }

    /// One call for the whole batch (one fault plan), observed under each
    /// of its keys.
    fn replace_many<'a>(
        &'a self,
        writes: &'a [Replace<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        let keys = writes.iter().map(|w| w.key).collect();
        self.call_each("replace_many", keys, move || {
            self.inner.replace_many(writes, notice)
        })
    }

    /// One call for the whole batch (one fault plan), observed under each
    /// of its keys.
    fn invalidate_many<'a>(
        &'a self,
        keys: &'a [Invalidate<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        let observed = keys.iter().map(|k| k.key).collect();
        self.call_each("invalidate_many", observed, move || {
            self.inner.invalidate_many(keys, notice)
        })
    }

    fn invalidate<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.call("invalidate", key, move || {
            self.inner.invalidate(key, lease_key, notice)
        })
    }

    fn bump_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        self.call("bump_generation", key, move || {
            self.inner.bump_generation(key, fresh, ttl, notice)
        })
    }

    fn bump_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.call_each("bump_generations", keys.to_vec(), move || {
            self.inner.bump_generations(keys, fresh, ttl, notice)
        })
    }

    fn clear_namespace<'a>(
        &'a self,
        clear: NamespaceClear<'a>,
    ) -> StoreFuture<'a, ClearedNamespace> {
        self.call("clear_namespace", clear.key, move || {
            self.inner.clear_namespace(clear)
        })
    }

    fn expire_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        self.call("expire_generation", key, move || {
            self.inner.expire_generation(key, fresh, ttl, at_ms, notice)
        })
    }

    /// One script for all the counters, as on a single Redis: one fault
    /// plan (observed under the first key).
    fn tag_states<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        now_ms: u64,
    ) -> StoreFuture<'a, Vec<Vec<u8>>> {
        match keys.first() {
            Some(first) => self.call("tag_states", first, move || {
                self.inner.tag_states(keys, fresh, ttl, now_ms)
            }),
            None => Box::pin(async { Ok(Vec::new()) }),
        }
    }

    /// One script for all the counters, as on a single Redis: one fault
    /// plan (observed under the first key).
    fn tag_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u64>> {
        match keys.first() {
            Some(first) => self.call("tag_generations", first, move || {
                self.inner.tag_generations(keys, fresh, ttl)
            }),
            None => Box::pin(async { Ok(Vec::new()) }),
        }
    }

    fn publish<'a>(&'a self, channel: &'a [u8], message: &'a [u8]) -> StoreFuture<'a, ()> {
        self.call("publish", channel, move || {
            self.inner.publish(channel, message)
        })
    }

    /// The wrapped store's subscription, forwarded by a task of its own
    /// (spawned on the caller's runtime) under the bus faults.
    fn subscribe(&self, channel: &[u8]) -> Subscription {
        let upstream = self.inner.subscribe(channel);
        let (tx, rx) = broadcast::channel(4096);
        let ready = watch::Sender::new(self.is_up());
        let ready_rx = ready.subscribe();
        let feed = tokio::spawn(forward(
            upstream,
            tx,
            ready,
            Arc::clone(&self.state),
            self.observer.clone(),
        ));
        let mut state = lock(&self.state);
        state.feeds.retain(|f| !f.is_finished());
        state.feeds.push(feed.abort_handle());
        Subscription::new(rx, ready_rx)
    }
}
