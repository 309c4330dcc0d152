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
use std::sync::{Arc, Mutex, MutexGuard};

use std::sync::OnceLock;

use tokio::sync::Notify;

use crate::error::{Error, ErrorKind};

type Flights<T> = Arc<Mutex<HashMap<Vec<u8>, Arc<Cell<T>>>>>;

/// Where one flight's result lands: set once, then every waiter is woken.
/// (Lighter than a `watch` channel: no versions, no lock to read it.)
struct Cell<T> {
    result: OnceLock<Result<T, Error>>,
    landed: Notify,
}

/// Whether a caller started the flight or joined one already in the air.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// This call started the flight.
    Leader,
    /// This call shared another call's flight.
    Follower,
}

/// The flights in the air, by key.
pub(crate) struct SingleFlight<T> {
    flights: Flights<T>,
}

impl<T: Clone + Send + Sync + 'static> SingleFlight<T> {
    pub(crate) fn new() -> Self {
        SingleFlight {
            flights: Arc::default(),
        }
    }

    /// Joins the flight for `key`, starting one with `start` if none is in
    /// the air; [`Joined::result`] waits for its result. `start` is called
    /// at most once, and only by the leader.
    ///
    /// Joining (and starting) happens here, at the call: a waiter then holds
    /// only the flight's handle, not `start` and everything it captured.
    pub(crate) fn join<F, Fut>(&self, key: &[u8], start: F) -> (Joined<T>, Role)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let (joined, joining) = self.join_with(key, (), |()| (start(), ()));
        let role = match joining {
            Joining::Led(()) => Role::Leader,
            Joining::Followed(()) => Role::Follower,
        };
        (joined, role)
    }

    /// [`join`](Self::join), handing `seed` to the flight if this call
    /// starts it, or back to the caller if a flight is already in the air:
    /// `start` turns the seed into the work and something the leader keeps.
    pub(crate) fn join_with<S, X, F, Fut>(
        &self,
        key: &[u8],
        seed: S,
        start: F,
    ) -> (Joined<T>, Joining<X, S>)
    where
        F: FnOnce(S) -> (Fut, X),
        Fut: Future<Output = Result<T, Error>> + Send + 'static,
    {
        let mut flights = lock(&self.flights);
        if let Some(cell) = flights.get(key) {
            let cell = Arc::clone(cell);
            return (Joined { cell }, Joining::Followed(seed));
        }
        let cell = Arc::new(Cell {
            result: OnceLock::new(),
            landed: Notify::new(),
        });
        flights.insert(key.to_vec(), Arc::clone(&cell));
        drop(flights);
        let landing = Landing {
            key: key.to_vec(),
            flights: Arc::clone(&self.flights),
            cell: Some(Arc::clone(&cell)),
        };
        let (work, kept) = start(seed);
        tokio::spawn(async move {
            let result = work.await;
            landing.land(result);
        });
        (Joined { cell }, Joining::Led(kept))
    }

    /// Detaches the flight for `key`, if one is in the air: its callers
    /// still get its result, but callers from now on start a new flight.
    /// (An invalidation must not be answered by a load that began before
    /// it.)
    pub(crate) fn detach(&self, key: &[u8]) {
        lock(&self.flights).remove(key);
    }

    /// How many flights are in the air.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        lock(&self.flights).len()
    }
}

fn lock<T>(flights: &Flights<T>) -> MutexGuard<'_, HashMap<Vec<u8>, Arc<Cell<T>>>> {
    // Every critical section is a single map operation: poisoning cannot
    // leave it half-done.
    flights.lock().unwrap_or_else(|p| p.into_inner())
}

fn abandoned() -> Error {
    Error::new(
        ErrorKind::Loader,
        "the load was abandoned before it finished (its task panicked or the runtime shut down)",
    )
}

/// How [`SingleFlight::join_with`] went for the caller.
pub(crate) enum Joining<X, S> {
    /// This call started the flight; what `start` left for it.
    Led(X),
    /// A flight was in the air; the seed, unused.
    Followed(S),
}

/// One flight, joined.
pub(crate) struct Joined<T> {
    cell: Arc<Cell<T>>,
}

impl<T: Clone> Joined<T> {
    /// The flight's result, once it has landed.
    pub(crate) async fn result(self) -> Result<T, Error> {
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
    key: Vec<u8>,
    flights: Flights<T>,
    cell: Option<Arc<Cell<T>>>,
}

impl<T> Landing<T> {
    fn land(mut self, result: Result<T, Error>) {
        self.finish(result);
    }

    fn finish(&mut self, result: Result<T, Error>) {
        let Some(cell) = self.cell.take() else { return };
        {
            let mut flights = lock(&self.flights);
            if flights
                .get(&self.key)
                .is_some_and(|mine| Arc::ptr_eq(mine, &cell))
            {
                flights.remove(&self.key);
            }
        }
        // Only this landing sets the cell, once: `set` cannot find it full.
        let _ = cell.result.set(result);
        cell.landed.notify_waiters();
    }
}

impl<T> Drop for Landing<T> {
    fn drop(&mut self) {
        self.finish(Err(abandoned()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    impl<T: Clone + Send + Sync + 'static> SingleFlight<T> {
        /// Join and wait, as one call.
        async fn run<F, Fut>(&self, key: &[u8], start: F) -> (Result<T, Error>, Role)
        where
            F: FnOnce() -> Fut,
            Fut: Future<Output = Result<T, Error>> + Send + 'static,
        {
            let (joined, role) = self.join(key, start);
            (joined.result().await, role)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_calls_share_one_flight() {
        let flight = Arc::new(SingleFlight::<u64>::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..1_000 {
            let flight = Arc::clone(&flight);
            let calls = Arc::clone(&calls);
            tasks.push(tokio::spawn(async move {
                flight
                    .run(b"k", || async move {
                        calls.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok(42)
                    })
                    .await
            }));
        }
        let mut leaders = 0;
        for task in tasks {
            let (result, role) = task.await.unwrap();
            assert_eq!(result.unwrap(), 42);
            leaders += usize::from(role == Role::Leader);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(leaders, 1);
        assert_eq!(flight.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_leader_neither_cancels_nor_repeats_the_load() {
        let flight = Arc::new(SingleFlight::<u64>::new());
        let calls = Arc::new(AtomicUsize::new(0));
        let work = |calls: Arc<AtomicUsize>| {
            move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(7)
            }
        };
        // The leader's caller gives up after 10 ms.
        let leader = tokio::time::timeout(
            Duration::from_millis(10),
            flight.run(b"k", work(Arc::clone(&calls))),
        )
        .await;
        assert!(leader.is_err());
        let (result, role) = flight.run(b"k", work(Arc::clone(&calls))).await;
        assert_eq!(role, Role::Follower);
        assert_eq!(result.unwrap(), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_flight_fails_every_waiter_and_frees_the_key() {
        let flight = Arc::new(SingleFlight::<u64>::new());
        let follower = {
            let flight = Arc::clone(&flight);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                flight.run(b"k", || async { Ok(1) }).await
            })
        };
        let (result, _) = flight
            .run(b"k", || async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                panic!("loader bug");
            })
            .await;
        let err = result.unwrap_err();
        assert!(err.is_loader());
        assert!(err.to_string().contains("abandoned"), "{err}");
        let (result, role) = follower.await.unwrap();
        assert_eq!(role, Role::Follower);
        assert!(result.is_err());
        assert_eq!(flight.in_flight(), 0);

        let (result, role) = flight.run(b"k", || async { Ok(2) }).await;
        assert_eq!((result.unwrap(), role), (2, Role::Leader));
    }

    #[tokio::test(start_paused = true)]
    async fn a_detached_flight_lands_for_its_callers_only() {
        let flight = Arc::new(SingleFlight::<u64>::new());
        let slow = |v: u64| {
            move || async move {
                tokio::time::sleep(Duration::from_millis(100 * v)).await;
                Ok(v)
            }
        };
        let (old, _) = flight.join(b"k", slow(1));
        let (joined, role) = flight.join(b"k", slow(9));
        assert_eq!(role, Role::Follower);
        flight.detach(b"k");
        let (new, role) = flight.join(b"k", slow(2));
        assert_eq!(role, Role::Leader, "a detached flight is not joined");
        assert_eq!(old.result().await.unwrap(), 1);
        assert_eq!(joined.result().await.unwrap(), 1);
        // The old flight's landing left the new one in place.
        assert_eq!(flight.in_flight(), 1);
        assert_eq!(new.result().await.unwrap(), 2);
        assert_eq!(flight.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_reach_every_waiter() {
        let flight = Arc::new(SingleFlight::<u64>::new());
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let flight = Arc::clone(&flight);
            tasks.push(tokio::spawn(async move {
                flight
                    .run(b"k", || async {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        Err(Error::new(ErrorKind::Store, "down"))
                    })
                    .await
                    .0
            }));
        }
        for task in tasks {
            assert!(task.await.unwrap().unwrap_err().is_store());
        }
    }
}
