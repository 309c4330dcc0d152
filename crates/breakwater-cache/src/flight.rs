//! In-process single-flight: at most one load per key per process.
//!
//! The first caller for a key starts a *flight*: a spawned task that produces
//! the result. Every caller for the same key while it is in the air awaits
//! that one result. Because the work runs in its own task, a caller that gives
//! up (its future dropped, or a `timeout` around it) cancels nothing for the
//! others and causes no second load. Leadership lives in a drop guard: if the
//! flight's task dies without landing (a panic, a runtime shutdown), every
//! waiter gets an error and the key is free again.

use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use std::sync::OnceLock;

use tokio::sync::Notify;

use crate::error::{Error, ErrorKind};

/// The flights in the air by key; a key is shared with the flight's
/// landing: one allocation per flight.
/// Hashed with foldhash, not SipHash: a read registers and unregisters
/// its key on every uncontended hit, and SipHash cost two hundred
/// instructions each way; flight keys are the application's own keys,
/// bounded in length, and the map is per process (a flood of colliding
/// keys costs that process a slower map, nothing else).
type FlightMap<T> = HashMap<Arc<[u8]>, Flight<T>, foldhash::fast::RandomState>;
type Flights<T> = Arc<Mutex<FlightRegistry<T>>>;

/// The flights in the air, and the detached ones that have followers.
struct FlightRegistry<T> {
    by_key: FlightMap<T>,
    /// Flights detached ([`SingleFlight::detach`]), by id: their landing
    /// still reaches their callers.
    detached: HashMap<u64, Arc<Cell<T>>, foldhash::fast::RandomState>,
    /// The next flight's id.
    next_id: u64,
}

/// One flight in the map.
struct Flight<T> {
    id: u64,
    cell: Arc<Cell<T>>,
}

/// Where one flight's result lands: set once, then every waiter is woken.
/// (Lighter than a `watch` channel: no versions, no lock to read it.)
/// `None`: an inline leader ([`Lead`]) went away without a result; its
/// followers try again.
struct Cell<T> {
    result: OnceLock<Option<Result<T, Error>>>,
    landed: Notify,
    /// Its followers' deadline passed (see [`Reads::bound`]).
    late: std::sync::atomic::AtomicBool,
    /// The task that keeps its followers' deadline, once the first
    /// follower gave them one: the runtime it ran on then, and its epoch
    /// (`None`: no task).
    watchdog: OnceLock<Option<(tokio::runtime::Id, u64)>>,
}

impl<T> Cell<T> {
    fn new() -> Arc<Self> {
        Arc::new(Cell {
            result: OnceLock::new(),
            landed: Notify::new(),
            late: std::sync::atomic::AtomicBool::new(false),
            watchdog: OnceLock::new(),
        })
    }
}

/// A flight's followers waited past their deadline ([`Reads::bound`]).
#[derive(Debug)]
pub(crate) struct Late;

/// A flight registered for its leader: the landing, and the cell.
type Entered<T> = (Landing<T>, Arc<Cell<T>>);

/// Whether a caller started the flight or joined one already in the air.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// This call started the flight.
    Leader,
    /// This call shared another call's flight.
    Follower,
}

impl Role {
    /// `leader` or `follower`, for spans.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
        }
    }
}

/// The flights in the air, by key.
pub(crate) struct SingleFlight<T> {
    flights: Flights<T>,
}

impl<T: Clone + Send + Sync + 'static> SingleFlight<T> {
    pub(crate) fn new() -> Self {
        SingleFlight {
            flights: Arc::new(Mutex::new(FlightRegistry {
                by_key: HashMap::default(),
                detached: HashMap::default(),
                next_id: 0,
            })),
        }
    }

    /// Joins the flight for `key`, starting one with `start` if none is in
    /// the air; [`Joined::result`] waits for its result. `start` is called
    /// at most once, and only by the leader; its work runs in its own task.
    ///
    /// Joining (and starting) happens here, at the call: a waiter then holds
    /// only the flight's handle, not `start` and everything it captured.
    pub(crate) fn join<F, Fut>(&self, key: &[u8], start: F) -> (Joined<T>, Role)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let (landing, cell) = match self.enter(key) {
            Ok(landing) => landing,
            Err(joined) => return (joined, Role::Follower),
        };
        // The leader waits on its cell as a follower would.
        let joined = Joined { cell };
        let work = start();
        tokio::spawn(async move {
            let result = work.await;
            landing.land_with(|| result);
        });
        (joined, Role::Leader)
    }

    /// Like [`join`](Self::join), for a caller that lands the flight
    /// itself, alongside others (a batch): the flight in the air for `key`
    /// (`Err`), or a new one registered for this caller (`Ok`) with the
    /// [`Lander`] that hands its result to every caller, and the caller's
    /// own handle on it. A `Lander` dropped without landing fails the
    /// flight's callers and frees the key, as a panicking flight does.
    pub(crate) fn lead_or_join(&self, key: &[u8]) -> Result<(Lander<T>, Joined<T>), Joined<T>> {
        let (landing, cell) = self.enter(key)?;
        Ok((Lander(landing), Joined { cell }))
    }

    /// The flight in the air for `key` (`Err`), or a new one registered for
    /// this caller to land (`Ok`, with its cell).
    fn enter(&self, key: &[u8]) -> Result<Entered<T>, Joined<T>> {
        let mut flights = lock(&self.flights);
        if let Some(flight) = flights.by_key.get(key) {
            return Err(Joined {
                cell: Arc::clone(&flight.cell),
            });
        }
        let id = flights.next_id;
        flights.next_id = id.wrapping_add(1);
        let cell = Cell::new();
        let key: Arc<[u8]> = Arc::from(key);
        let flight = Flight {
            id,
            cell: Arc::clone(&cell),
        };
        flights.by_key.insert(Arc::clone(&key), flight);
        drop(flights);
        let landing = Landing {
            key,
            id,
            flights: Arc::clone(&self.flights),
            landed: false,
        };
        Ok((landing, cell))
    }

    /// Detaches the flight for `key`, if one is in the air: its callers
    /// still get its result, but callers from now on start a new flight.
    /// (An invalidation must not be answered by a load that began before
    /// it.)
    pub(crate) fn detach(&self, key: &[u8]) {
        let mut flights = lock(&self.flights);
        if let Some(Flight { id, cell }) = flights.by_key.remove(key) {
            flights.detached.insert(id, cell);
        }
    }

    /// Detaches the flight in the air for `key` if it is the one `joined`
    /// (not a newer one that took the key since).
    pub(crate) fn detach_joined(&self, key: &[u8], joined: &Joined<T>) {
        let mut flights = lock(&self.flights);
        let flights = &mut *flights;
        let same = flights
            .by_key
            .get(key)
            .is_some_and(|f| Arc::ptr_eq(&f.cell, &joined.cell));
        if same && let Some(Flight { id, cell }) = flights.by_key.remove(key) {
            flights.detached.insert(id, cell);
        }
    }

    /// Detaches every flight in the air, as [`detach`](Self::detach) does
    /// one (a tag invalidation: any key may carry the tag).
    pub(crate) fn detach_all(&self) {
        let mut flights = lock(&self.flights);
        let flights = &mut *flights;
        for (_, Flight { id, cell }) in flights.by_key.drain() {
            flights.detached.insert(id, cell);
        }
    }

    /// How many flights are in the air (detached ones not counted).
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.flights).by_key.len()
    }
}

fn lock<T>(flights: &Flights<T>) -> MutexGuard<'_, FlightRegistry<T>> {
    // Every critical section is a few map operations that cannot panic
    // half-way (no user code runs under the lock): poisoning cannot leave
    // it half-done.
    flights.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a flight ended without a result: its task is gone (the runtime
/// that ran it shut down, or it panicked), not its loader (a loader's panic
/// or error is a result, landed as any other).
#[derive(Debug)]
struct Abandoned;

impl std::fmt::Display for Abandoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the flight's task is gone")
    }
}

impl std::error::Error for Abandoned {}

/// Whether `err` says a flight was abandoned (its task gone, typically
/// with the runtime that ran it): a caller on another runtime may start
/// the work again rather than fail.
pub(crate) fn is_abandoned(err: &Error) -> bool {
    std::error::Error::source(err).is_some_and(|s| s.is::<Abandoned>())
}

/// A flight that did not land within its bound, taken for stranded on a
/// runtime that no longer runs it; a caller on another runtime starts the
/// work again, as for an [`abandoned`] one.
pub(crate) fn stranded() -> Error {
    Error::new(
        ErrorKind::Timeout,
        "the load did not land within its bound (the runtime that runs it is not running it)",
    )
    .with_source(Abandoned)
}

fn abandoned() -> Error {
    Error::new(
        ErrorKind::Loader,
        "the load was abandoned before it finished (its task panicked or the runtime shut down)",
    )
    .with_source(Abandoned)
}

/// One flight, joined.
pub(crate) struct Joined<T> {
    cell: Arc<Cell<T>>,
}

impl<T> Clone for Joined<T> {
    fn clone(&self) -> Self {
        Joined {
            cell: Arc::clone(&self.cell),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> Joined<T> {
    /// [`outcome`](Self::outcome), or [`Late`] once the deadline that
    /// [`Reads::bound`] set has passed.
    pub(crate) async fn outcome_or_late(&self) -> Result<Option<Result<T, Error>>, Late> {
        loop {
            let landed = self.cell.landed.notified();
            let mut landed = std::pin::pin!(landed);
            landed.as_mut().enable();
            if let Some(result) = self.cell.result.get() {
                return Ok(result.clone());
            }
            if self.cell.late.load(std::sync::atomic::Ordering::Acquire) {
                return Err(Late);
            }
            landed.await;
            // Woken by the landing (which sets the result first) or the
            // deadline: no new registration needed to tell which.
            if let Some(result) = self.cell.result.get() {
                return Ok(result.clone());
            }
        }
    }
}

impl<T: Clone> Joined<T> {
    /// Whether the flight has landed (its result is there to take).
    pub(crate) fn has_landed(&self) -> bool {
        self.cell.result.get().is_some()
    }

    /// The flight's result, once it has landed.
    pub(crate) async fn result(self) -> Result<T, Error> {
        self.outcome().await.unwrap_or_else(|| Err(abandoned()))
    }

    /// The flight's result once it has landed, or `None` if its inline
    /// leader went away without one.
    pub(crate) async fn outcome(self) -> Option<Result<T, Error>> {
        loop {
            // Registered before the result is checked, so a landing in
            // between still wakes this waiter.
            let landed = self.cell.landed.notified();
            let mut landed = std::pin::pin!(landed);
            landed.as_mut().enable();
            if let Some(result) = self.cell.result.get() {
                return result.clone();
            }
            landed.await;
            // Woken by the landing, which sets the result first.
            if let Some(result) = self.cell.result.get() {
                return result.clone();
            }
        }
    }
}

/// The leader's duty: free the key and hand the result to every waiter,
/// exactly once, however the flight's task ends.
struct Landing<T> {
    key: Arc<[u8]>,
    /// This flight among the flights that had `key` (it may have been
    /// detached and followed by another).
    id: u64,
    flights: Flights<T>,
    /// The result was handed down (or the flight abandoned): once only.
    landed: bool,
}

impl<T> Landing<T> {
    fn land_with(mut self, result: impl FnOnce() -> Result<T, Error>) {
        self.finish(|| Some(result()));
    }

    /// Frees the key; then, if anyone waits, hands them `result()`.
    fn finish(&mut self, result: impl FnOnce() -> Option<Result<T, Error>>) {
        if std::mem::replace(&mut self.landed, true) {
            return;
        }
        let cell = {
            let mut flights = lock(&self.flights);
            let flights = &mut *flights;
            match flights.by_key.get(&self.key) {
                // One lookup more only when a newer flight took the key
                // after this one was detached (rare).
                Some(flight) if flight.id == self.id => {
                    flights.by_key.remove(&self.key).map(|f| f.cell)
                }
                _ => flights.detached.remove(&self.id),
            }
        };
        // Out of the map, nobody can join any more: without followers
        // there is nobody to hand the result to.
        let Some(cell) = cell else { return };
        if Arc::strong_count(&cell) == 1 {
            return;
        }
        // Only this landing sets the cell, once: `set` cannot find it full.
        let _ = cell.result.set(result());
        cell.landed.notify_waiters();
    }
}

impl<T> Drop for Landing<T> {
    fn drop(&mut self) {
        self.finish(|| Some(Err(abandoned())));
    }
}

/// The duty to land one flight registered by
/// [`SingleFlight::lead_or_join`].
pub(crate) struct Lander<T>(Landing<T>);

impl<T> Lander<T> {
    /// Hands `result` to the flight's callers and frees the key.
    pub(crate) fn land(self, result: Result<T, Error>) {
        self.0.land_with(|| result);
    }
}

/// How many slots [`Reads`] has. Keys that share a slot are still told
/// apart (the slot keeps each key in the air); more slots only make that
/// rarer.
const READ_SLOTS: usize = 256;

/// Reads in the air, for work done inline by the caller that leads it
/// (a store read): concurrent reads of one key share it.
///
/// Unlike [`SingleFlight`] this registers a read without allocating and
/// without a map: a key hashes to one of a fixed set of slots, and the
/// slot keeps the key in a buffer it reuses. An uncontended read takes
/// the slot's lock twice (to register, to land) and copies its key once;
/// the cell that hands a result down is made only when someone joins.
/// Keys that hash to a slot already busy with another key are kept beside
/// it in the same slot (allocating, as rarely as slots collide).
pub(crate) struct Reads<T> {
    slots: Box<[Mutex<ReadSlot<T>>]>,
    hasher: foldhash::fast::FixedState,
    /// The followers' deadlines ([`bound`](Self::bound)).
    alarms: Arc<Alarms<T>>,
}

/// The deadlines of the shared reads that have followers, kept by one
/// task for all of them ([`Reads::bound`]): a timer per follower would
/// cost every follower of a hot key a timer-wheel entry, and a task per
/// shared read a spawn per read that anyone joins (a tenth of a hot key's
/// throughput). The task runs while deadlines are pending and a little
/// longer, sleeping until the earliest; it is [`Supervised`]: when its
/// runtime goes away (or goes idle past its promise), the next follower
/// starts it again on its own runtime, and the deadlines, kept here and
/// not in the task, carry over.
///
/// [`Supervised`]: crate::background::Supervised
struct Alarms<T> {
    pending: Mutex<Pending<T>>,
    /// Wakes the task for a deadline earlier than the one it sleeps until.
    sooner: Notify,
    task: crate::background::Supervised,
}

/// [`Alarms`]' state.
struct Pending<T> {
    /// Each shared read's deadline, by its cell (weak: a read nobody
    /// waits for any more is not kept alive for its deadline).
    due: Vec<(tokio::time::Instant, std::sync::Weak<Cell<T>>)>,
    /// The instant the task sleeps until; `None` while it is idle or not
    /// running.
    wakes_at: Option<tokio::time::Instant>,
}

/// How long the deadline task stays once nothing is pending (a hot key's
/// shared reads come back within it, and find it running).
const ALARMS_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How long past its promise the deadline task may be before it is taken
/// for stranded on an idle runtime and started again.
const ALARMS_GRACE: std::time::Duration = std::time::Duration::from_millis(100);

impl<T: Send + Sync + 'static> Alarms<T> {
    /// The task: marks late (and wakes) the reads whose deadline passed,
    /// forgets those that landed or lost their followers, and sleeps until
    /// the next deadline; ends once nothing was pending for
    /// [`ALARMS_IDLE`].
    async fn keep(alarms: std::sync::Weak<Self>, duty: crate::background::Duty) {
        use std::sync::atomic::Ordering;
        let mut idle_since = None;
        loop {
            let Some(this) = alarms.upgrade() else {
                duty.done();
                return;
            };
            let now = tokio::time::Instant::now();
            let sooner = this.sooner.notified();
            let mut sooner = std::pin::pin!(sooner);
            sooner.as_mut().enable();
            let next = {
                let mut pending = lock_pending(&this.pending);
                if !duty.is_current() {
                    // Replaced as stranded: the new task keeps the deadlines.
                    return;
                }
                pending.due.retain(|(at, cell)| {
                    let Some(cell) = cell.upgrade() else {
                        return false;
                    };
                    if cell.result.get().is_some() {
                        return false;
                    }
                    if *at > now {
                        return true;
                    }
                    cell.late.store(true, Ordering::Release);
                    cell.landed.notify_waiters();
                    false
                });
                let next = pending.due.iter().map(|(at, _)| *at).min();
                if next.is_some() {
                    idle_since = None;
                } else if idle_since.is_some_and(|t| now >= t + ALARMS_IDLE) {
                    // Freed under the lock: a read that registers from
                    // now on finds the slot free and starts a new task.
                    pending.wakes_at = None;
                    duty.done();
                    return;
                } else {
                    idle_since.get_or_insert(now);
                }
                let wakes_at = next.unwrap_or_else(|| idle_since.unwrap_or(now) + ALARMS_IDLE);
                pending.wakes_at = Some(wakes_at);
                duty.due_by(Some(wakes_at));
                wakes_at
            };
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = sooner => {}
            }
        }
    }
}

impl<T: Send + Sync + 'static> Alarms<T> {
    /// Registers `cell`'s deadline, `within` from now, and makes sure the
    /// task runs: the task that holds the slot now, as its runtime and
    /// epoch (`None`: no task could be started).
    fn watch(
        self: &Arc<Self>,
        cell: &Arc<Cell<T>>,
        within: std::time::Duration,
    ) -> Option<(tokio::runtime::Id, u64)> {
        let at = tokio::time::Instant::now() + within;
        {
            let mut pending = lock_pending(&self.pending);
            pending.due.push((at, Arc::downgrade(cell)));
            if pending.wakes_at.is_some_and(|wakes| at < wakes) {
                // Every waiter: a task replaced as stranded may still wait
                // here too (its runtime idle), and must not take the only
                // wake-up. The current task enabled its wait before it
                // read `wakes_at`.
                self.sooner.notify_waiters();
            }
        }
        let alarms = Arc::downgrade(self);
        self.task
            .ensure(ALARMS_GRACE, |duty| Self::keep(alarms, duty));
        // Read after `ensure`: the task it started, or the one it found.
        self.task.holder()
    }
}

fn lock_pending<T>(pending: &Mutex<Pending<T>>) -> MutexGuard<'_, Pending<T>> {
    // A few vector operations under the lock; none can panic half-way.
    pending.lock().unwrap_or_else(|p| p.into_inner())
}

/// One slot of [`Reads`].
struct ReadSlot<T> {
    /// The slot's own flight, whose key buffer is kept between reads.
    main: InlineFlight<T>,
    /// Flights of other keys that hashed here while `main` was busy.
    more: Vec<InlineFlight<T>>,
    /// Flights detached ([`Reads::detach`]) that have followers, by id.
    detached: Vec<(u64, Arc<Cell<T>>)>,
    /// The next flight's id in this slot.
    next_id: u64,
}

/// One read in the air (or, for a slot's `main`, none: `id` is `None`).
struct InlineFlight<T> {
    key: Vec<u8>,
    id: Option<u64>,
    /// Made by the first follower.
    cell: Option<Arc<Cell<T>>>,
}

impl<T> InlineFlight<T> {
    fn is(&self, key: &[u8]) -> bool {
        self.id.is_some() && self.key == key
    }
}

impl<T: Clone> Reads<T> {
    pub(crate) fn new() -> Self {
        let slots = (0..READ_SLOTS)
            .map(|_| {
                Mutex::new(ReadSlot {
                    main: InlineFlight {
                        key: Vec::new(),
                        id: None,
                        cell: None,
                    },
                    more: Vec::new(),
                    detached: Vec::new(),
                    next_id: 0,
                })
            })
            .collect();
        Reads {
            slots,
            // Seeded per process, so which keys share a slot cannot be
            // chosen from outside (and sharing costs only an allocation).
            hasher: foldhash::fast::FixedState::with_seed(rand::random()),
            alarms: Arc::new(Alarms {
                pending: Mutex::new(Pending {
                    due: Vec::new(),
                    wakes_at: None,
                }),
                sooner: Notify::new(),
                task: crate::background::Supervised::default(),
            }),
        }
    }

    fn slot(&self, key: &[u8]) -> &Mutex<ReadSlot<T>> {
        let hash = self.hasher.hash_one(key);
        // The hash's high bits: foldhash mixes them best.
        &self.slots[(hash >> 56) as usize % READ_SLOTS]
    }

    /// Leads the read of `key` in the caller's own task, or joins the one
    /// in the air. No task is spawned: the leader does the work inline and
    /// [`Lead::land_with`]s its result. A leader that goes away first (its
    /// future dropped) hands nothing down: its followers'
    /// [`Joined::outcome`] is `None`, and they try again (one of them
    /// leads). For work whose repetition is harmless (a read), where a
    /// spawn would cost more than the work.
    pub(crate) fn lead_or_join<'a>(&'a self, key: &[u8]) -> Turn<'a, T> {
        let slot = self.slot(key);
        let mut guard = lock_slot(slot);
        let state = &mut *guard;
        let flight = if state.main.is(key) {
            Some(&mut state.main)
        } else {
            state.more.iter_mut().find(|f| f.is(key))
        };
        if let Some(flight) = flight {
            let cell = flight.cell.get_or_insert_with(Cell::new);
            return Turn::Follow(Joined {
                cell: Arc::clone(cell),
            });
        }
        let id = state.next_id;
        state.next_id = id.wrapping_add(1);
        if state.main.id.is_none() {
            state.main.key.clear();
            state.main.key.extend_from_slice(key);
            state.main.id = Some(id);
        } else {
            state.more.push(InlineFlight {
                key: key.to_vec(),
                id: Some(id),
                cell: None,
            });
        }
        Turn::Lead(Lead {
            slot,
            id,
            landed: false,
        })
    }

    /// Detaches the read of `key`, if one is in the air: its callers still
    /// get its result, but callers from now on start a new read.
    pub(crate) fn detach(&self, key: &[u8]) {
        let mut guard = lock_slot(self.slot(key));
        let state = &mut *guard;
        let detached = if state.main.is(key) {
            state.main.id.take().map(|id| (id, state.main.cell.take()))
        } else {
            let at = state.more.iter().position(|f| f.is(key));
            at.map(|at| state.more.swap_remove(at))
                .and_then(|f| f.id.map(|id| (id, f.cell)))
        };
        if let Some((id, Some(cell))) = detached {
            state.detached.push((id, cell));
        }
    }

    /// Detaches every read in the air, as [`detach`](Self::detach) does
    /// one.
    pub(crate) fn detach_all(&self) {
        for slot in &self.slots {
            let mut guard = lock_slot(slot);
            let state = &mut *guard;
            if let Some(id) = state.main.id.take()
                && let Some(cell) = state.main.cell.take()
            {
                state.detached.push((id, cell));
            }
            for flight in std::mem::take(&mut state.more) {
                if let (Some(id), Some(cell)) = (flight.id, flight.cell) {
                    state.detached.push((id, cell));
                }
            }
        }
    }

    /// Gives the followers of `joined` (a read of these `Reads`) a
    /// deadline, `within` from the first follower's call: once it passes,
    /// the read is marked late and they are woken
    /// ([`Joined::outcome_or_late`] says [`Late`]). One task keeps every
    /// read's deadline ([`Alarms`]). `true` if the task that took the
    /// deadline still holds its slot and runs on the caller's runtime
    /// (which runs it while the caller waits there), so that
    /// `outcome_or_late` is bounded for it; a caller on another runtime,
    /// or after that task was replaced, needs a deadline of its own (the
    /// task's runtime may be idle).
    /// (`within` is asked for only by the first follower.)
    pub(crate) fn bound(
        &self,
        joined: &Joined<T>,
        within: impl FnOnce() -> std::time::Duration,
    ) -> bool
    where
        T: Send + Sync + 'static,
    {
        let kept = joined
            .cell
            .watchdog
            .get_or_init(|| self.alarms.watch(&joined.cell, within()));
        kept.is_some_and(|(home, epoch)| {
            self.alarms.task.epoch() == epoch && Some(home) == crate::background::current_runtime()
        })
    }

    /// How many reads are in the air (detached ones not counted).
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.slots
            .iter()
            .map(|slot| {
                let state = lock_slot(slot);
                usize::from(state.main.id.is_some()) + state.more.len()
            })
            .sum()
    }
}

fn lock_slot<T>(slot: &Mutex<ReadSlot<T>>) -> MutexGuard<'_, ReadSlot<T>> {
    // No user code runs under the lock, and no step in it can leave the
    // slot half-changed by panicking.
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`Reads::lead_or_join`]'s answer.
pub(crate) enum Turn<'a, T> {
    /// This call leads: it does the work and lands the result.
    Lead(Lead<'a, T>),
    /// A read was in the air.
    Follow(Joined<T>),
}

/// An inline read's leadership: [`land_with`](Self::land_with) its
/// result; dropped without one, the followers try again.
pub(crate) struct Lead<'a, T> {
    slot: &'a Mutex<ReadSlot<T>>,
    id: u64,
    landed: bool,
}

impl<T> Lead<'_, T> {
    /// Frees the key and hands the result, made by `result` (called only
    /// if someone follows), to every follower.
    pub(crate) fn land_with(mut self, result: impl FnOnce() -> Result<T, Error>) {
        self.finish(|| Some(result()));
    }

    /// Hands `result` to every follower, now and until this lead ends,
    /// without freeing the key: callers that come later still join this
    /// read, and get `result` at once. For a leader whose own work goes on
    /// (a read that went on to wait for a load) but whose followers need
    /// not wait for it: `result` says what they wait on instead. A later
    /// [`land_with`](Self::land_with) frees the key and hands down nothing
    /// else.
    pub(crate) fn publish(&mut self, result: Result<T, Error>) {
        let cell = {
            let mut guard = lock_slot(self.slot);
            let state = &mut *guard;
            if state.main.id == Some(self.id) {
                Arc::clone(state.main.cell.get_or_insert_with(Cell::new))
            } else if let Some(f) = state.more.iter_mut().find(|f| f.id == Some(self.id)) {
                Arc::clone(f.cell.get_or_insert_with(Cell::new))
            } else if let Some((_, cell)) = state.detached.iter().find(|(id, _)| *id == self.id) {
                Arc::clone(cell)
            } else {
                // Detached with no follower: nobody can hear it.
                return;
            }
        };
        let _ = cell.result.set(Some(result));
        cell.landed.notify_waiters();
    }

    fn finish(&mut self, result: impl FnOnce() -> Option<Result<T, Error>>) {
        if std::mem::replace(&mut self.landed, true) {
            return;
        }
        let cell = {
            let mut guard = lock_slot(self.slot);
            let state = &mut *guard;
            if state.main.id == Some(self.id) {
                state.main.id = None;
                state.main.cell.take()
            } else if let Some(at) = state.more.iter().position(|f| f.id == Some(self.id)) {
                state.more.swap_remove(at).cell
            } else if let Some(at) = state.detached.iter().position(|(id, _)| *id == self.id) {
                Some(state.detached.swap_remove(at).1)
            } else {
                None
            }
        };
        // Out of the slot, nobody can join any more: without followers
        // there is nobody to hand the result to.
        let Some(cell) = cell else { return };
        if Arc::strong_count(&cell) == 1 {
            return;
        }
        let _ = cell.result.set(result());
        cell.landed.notify_waiters();
    }
}

impl<T> Drop for Lead<'_, T> {
    fn drop(&mut self) {
        // Gone without a result: the followers try again.
        self.finish(|| None);
    }
}

#[cfg(test)]
mod tests;
