//! Background tasks that no one runtime owns.
//!
//! A store and a cache keep work running in the background: the store's
//! (re)connection, its probe of a suspect connection, its clock refresh,
//! its Sentinel watcher and its pub/sub feeds; the cache's bus listener.
//! Each is spawned on the runtime of the call that first needs it, and
//! that runtime may go away: a short-lived runtime that set things up is
//! dropped, a test ends, a thread of a language binding exits. A runtime
//! that shuts down drops its tasks' futures; a current-thread runtime
//! whose `block_on` has returned just stops polling them. Either way the
//! work stops, and without a supervisor the flag that says "a task runs"
//! stays set for good: a store that never reconnects, a bus that is
//! trusted although nobody listens.
//!
//! A [`Supervised`] slot is that flag made honest. The task holds a
//! [`Duty`]; dropping it (the task ended, or its runtime dropped it)
//! frees the slot, so the next call that needs the task starts it again,
//! on its own runtime. A task may also promise to be back by an instant
//! ([`Duty::due_by`]): a task that misses its promise by more than the
//! slot's grace is taken for stranded on an idle runtime, and the next
//! call starts a new one; the stranded one, should it ever run again,
//! finds its duty taken ([`Duty::is_current`]) and ends.
//!
//! Hand-rolled: this is a flag, an epoch and a deadline under one lock;
//! supervision crates restart a task on its own runtime, which is the one
//! that may be gone.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;

/// The state of one supervised task; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct Supervised {
    state: Arc<Mutex<State>>,
    /// The latest epoch, read without the lock ([`epoch`](Self::epoch)).
    latest: std::sync::atomic::AtomicU64,
    /// Raised when a task of this slot is lost: dropped before it was
    /// [`done`](Duty::done) (its runtime went away).
    lost: Option<Arc<AtomicBool>>,
}

#[derive(Debug, Default)]
struct State {
    /// Bumped by every start: a duty of an older epoch is no longer the
    /// slot's.
    epoch: u64,
    /// A task holds the current duty.
    running: bool,
    /// When that task promised to be back; `None`: no promise (it waits
    /// on something that wakes it, and is trusted while its runtime
    /// lives).
    due: Option<Instant>,
    /// The runtime the current epoch's task was started on.
    home: Option<tokio::runtime::Id>,
}

impl Supervised {
    /// A slot that raises `lost` when its task is dropped before it was
    /// done, so its owner knows to start it again.
    pub(crate) fn reporting_to(lost: &Arc<AtomicBool>) -> Self {
        Supervised {
            state: Arc::default(),
            latest: std::sync::atomic::AtomicU64::new(0),
            lost: Some(Arc::clone(lost)),
        }
    }

    /// Whether a task holds the slot (and has not missed its promise by
    /// more than `grace`).
    pub(crate) fn is_running(&self, grace: Duration) -> bool {
        let state = lock(&self.state);
        state.running && !overdue(&state, grace)
    }

    /// Frees the slot whoever holds it (its task was found stranded by
    /// other means): the next [`ensure`](Self::ensure) starts a new task,
    /// and the current one, should it run again, finds its duty taken.
    pub(crate) fn reset(&self) {
        let mut state = lock(&self.state);
        state.epoch = state.epoch.wrapping_add(1);
        self.latest.store(state.epoch, Ordering::Release);
        state.running = false;
        state.due = None;
        state.home = None;
    }

    /// The task that holds the slot: the runtime it was started on, and
    /// its epoch (see [`epoch`](Self::epoch)); `None` if none does.
    pub(crate) fn holder(&self) -> Option<(tokio::runtime::Id, u64)> {
        let state = lock(&self.state);
        if !state.running {
            return None;
        }
        Some((state.home?, state.epoch))
    }

    /// The epoch of the slot's latest task, without taking its lock: it
    /// changes whenever another task takes the slot (or it is
    /// [`reset`](Self::reset)), so a caller that saw a task's epoch
    /// can tell, with one load, that it is still that task's.
    pub(crate) fn epoch(&self) -> u64 {
        self.latest.load(Ordering::Acquire)
    }

    /// Starts the task unless one holds the slot and keeps its promises
    /// (within `grace`): `task` gets the duty and makes the future, which
    /// is spawned on the caller's runtime. `None` if a task was already
    /// running or there is no runtime to spawn on; else the new task.
    pub(crate) fn ensure<F, Fut>(&self, grace: Duration, task: F) -> Option<AbortHandle>
    where
        F: FnOnce(Duty) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let duty = {
            let mut state = lock(&self.state);
            if state.running && !overdue(&state, grace) {
                return None;
            }
            if state.running {
                tracing::debug!(
                    "a background task missed its deadline (its runtime is idle); starting it again"
                );
            }
            state.epoch = state.epoch.wrapping_add(1);
            self.latest.store(state.epoch, Ordering::Release);
            state.running = true;
            state.home = Some(runtime.id());
            // Until the task makes a promise of its own: a task spawned on
            // a runtime that never polls it is overdue after `grace`.
            state.due = Some(Instant::now());
            Duty {
                state: Arc::clone(&self.state),
                epoch: state.epoch,
                lost: self.lost.clone(),
                done: false,
            }
        };
        Some(runtime.spawn(task(duty)).abort_handle())
    }
}

/// Whether the task's promise ran out more than `grace` ago (never, for a
/// grace past the end of time).
fn overdue(state: &State, grace: Duration) -> bool {
    state
        .due
        .and_then(|due| due.checked_add(grace))
        .is_some_and(|limit| Instant::now() > limit)
}

/// A task's hold on its [`Supervised`] slot: dropped (the task ended or
/// its runtime dropped it), the slot is free again.
#[derive(Debug)]
pub(crate) struct Duty {
    state: Arc<Mutex<State>>,
    epoch: u64,
    lost: Option<Arc<AtomicBool>>,
    /// The task ended of its own accord: not lost.
    done: bool,
}

impl Duty {
    /// The task ends of its own accord (its work is done, or its owner is
    /// gone): the slot is freed without reporting a loss.
    pub(crate) fn done(mut self) {
        self.done = true;
    }

    /// Whether this is still the slot's task (not replaced as stranded).
    pub(crate) fn is_current(&self) -> bool {
        lock(&self.state).epoch == self.epoch
    }

    /// Promises to be back by `due` (`None`: withdraws the promise); `false`
    /// if this is no longer the slot's task.
    pub(crate) fn due_by(&self, due: Option<Instant>) -> bool {
        let mut state = lock(&self.state);
        if state.epoch != self.epoch {
            return false;
        }
        state.due = due;
        true
    }
}

impl Drop for Duty {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        if state.epoch == self.epoch {
            state.running = false;
            state.due = None;
            if !self.done
                && let Some(lost) = &self.lost
            {
                lost.store(true, Ordering::Release);
            }
        }
    }
}

/// The id of the runtime the caller runs on, without cloning its handle
/// (an atomic on a line every worker of a multi-thread runtime shares, per
/// call: 12% of a batched Redis hit): remembered per thread, in a small
/// direct-mapped table, for the tasks that asked (a task never changes
/// runtime; task ids are unique in the process).
pub(crate) fn current_runtime() -> Option<tokio::runtime::Id> {
    use std::hash::BuildHasher;
    type Current = std::cell::Cell<Option<(tokio::task::Id, tokio::runtime::Id)>>;
    const SLOTS: usize = 64;
    thread_local! {
        static SEEN: [Current; SLOTS] = const { [const { std::cell::Cell::new(None) }; SLOTS] };
    }
    let Some(task) = tokio::task::try_id() else {
        return tokio::runtime::Handle::try_current().ok().map(|h| h.id());
    };
    let at = (foldhash::fast::FixedState::with_seed(0).hash_one(task) as usize) % SLOTS;
    if let Some((seen, runtime)) = SEEN.with(|seen| seen[at].get())
        && seen == task
    {
        return Some(runtime);
    }
    let runtime = tokio::runtime::Handle::try_current().ok()?.id();
    SEEN.with(|seen| seen[at].set(Some((task, runtime))));
    Some(runtime)
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // No step under the lock can panic half-way.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const GRACE: Duration = Duration::from_millis(100);

    /// A runtime of its own, as a setup step or a binding's thread would
    /// make one.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_task_dropped_with_its_runtime_is_started_again_elsewhere() {
        let lost = Arc::new(AtomicBool::new(false));
        let slot = Supervised::reporting_to(&lost);
        let started = Arc::new(AtomicUsize::new(0));
        let task = |started: Arc<AtomicUsize>| {
            move |duty: Duty| async move {
                started.fetch_add(1, Ordering::SeqCst);
                let _duty = duty;
                std::future::pending::<()>().await;
            }
        };
        let first = runtime();
        first.block_on(async {
            assert!(slot.ensure(GRACE, task(Arc::clone(&started))).is_some());
            tokio::task::yield_now().await;
            assert!(
                slot.ensure(GRACE, task(Arc::clone(&started))).is_none(),
                "runs"
            );
        });
        assert!(slot.is_running(GRACE), "an idle runtime keeps it");
        assert!(!lost.load(Ordering::SeqCst));
        drop(first);
        assert!(!slot.is_running(GRACE), "its runtime dropped it");
        assert!(
            lost.swap(false, Ordering::SeqCst),
            "and it is reported lost"
        );
        runtime().block_on(async {
            assert!(slot.ensure(GRACE, task(Arc::clone(&started))).is_some());
            tokio::task::yield_now().await;
            // A task that ends of its own accord is not lost.
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let other = Supervised::reporting_to(&lost);
            other.ensure(GRACE, |duty| async move {
                let _ = rx.await;
                duty.done();
            });
            tx.send(()).unwrap();
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            assert!(!other.is_running(GRACE));
            assert!(!lost.load(Ordering::SeqCst));
        });
        assert_eq!(started.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_task_stranded_on_an_idle_runtime_is_replaced_once_overdue() {
        let slot = Supervised::default();
        let idle = runtime();
        idle.block_on(async {
            let (tx, rx) = tokio::sync::oneshot::channel();
            slot.ensure(GRACE, |duty| async move {
                duty.due_by(Some(Instant::now() + Duration::from_millis(10)));
                let _ = tx.send(());
                tokio::time::sleep(Duration::from_millis(10)).await;
                // Never reached: the runtime is idle by then.
                drop(duty);
            });
            rx.await.unwrap();
        });
        // `idle` lives on but nobody polls it.
        let other = runtime();
        other.block_on(async {
            assert!(
                slot.ensure(GRACE, |_| async {}).is_none(),
                "not overdue yet"
            );
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert!(!slot.is_running(GRACE));
            let (tx, rx) = tokio::sync::oneshot::channel();
            let started = slot.ensure(GRACE, |duty| async move {
                let _ = tx.send(duty.is_current());
                std::future::pending::<()>().await;
            });
            assert!(started.is_some());
            assert!(rx.await.unwrap());
        });
        // The stranded task, polled again, finds its duty taken.
        idle.block_on(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
        });
        assert!(slot.is_running(GRACE), "the new task keeps the slot");
    }

    #[test]
    fn outside_a_runtime_nothing_starts() {
        let slot = Supervised::default();
        assert!(slot.ensure(GRACE, |_| async {}).is_none());
        assert!(!slot.is_running(GRACE));
    }
}
