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
async fn an_inline_leader_lands_for_its_followers() {
    let flight = Reads::<u64>::new();
    let Turn::Lead(lead) = flight.lead_or_join(b"k") else {
        panic!("the first call leads")
    };
    let followers: Vec<_> = (0..3)
        .map(|_| match flight.lead_or_join(b"k") {
            Turn::Follow(joined) => joined,
            Turn::Lead(_) => panic!("a read is in the air"),
        })
        .collect();
    assert_eq!(flight.in_flight(), 1);
    lead.land_with(|| Ok(7));
    assert_eq!(flight.in_flight(), 0);
    for joined in followers {
        assert_eq!(joined.outcome().await.unwrap().unwrap(), 7);
    }
    assert!(matches!(flight.lead_or_join(b"k"), Turn::Lead(_)));
}

#[tokio::test(start_paused = true)]
async fn a_published_result_reaches_followers_before_and_after_while_the_key_stays_led() {
    let flight = Reads::<u64>::new();
    let Turn::Lead(mut lead) = flight.lead_or_join(b"k") else {
        panic!("the first call leads")
    };
    let Turn::Follow(before) = flight.lead_or_join(b"k") else {
        panic!("a read is in the air")
    };
    lead.publish(Ok(3));
    assert_eq!(before.outcome().await.unwrap().unwrap(), 3);
    // Still in the air: a later caller joins and hears it at once.
    let Turn::Follow(after) = flight.lead_or_join(b"k") else {
        panic!("a published read stays in the air until it lands")
    };
    assert_eq!(after.outcome().await.unwrap().unwrap(), 3);
    // Landing frees the key and hands down nothing else.
    lead.land_with(|| Ok(4));
    assert_eq!(flight.in_flight(), 0);
    assert!(matches!(flight.lead_or_join(b"k"), Turn::Lead(_)));
    // Published after a detach: only those who joined before hear it.
    let Turn::Lead(mut lead) = flight.lead_or_join(b"j") else {
        panic!("the first call leads")
    };
    let Turn::Follow(early) = flight.lead_or_join(b"j") else {
        panic!("a read is in the air")
    };
    flight.detach(b"j");
    lead.publish(Ok(5));
    assert_eq!(early.outcome().await.unwrap().unwrap(), 5);
    drop(lead);
    assert!(
        flight
            .slots
            .iter()
            .all(|s| lock_slot(s).detached.is_empty())
    );
}

#[tokio::test(start_paused = true)]
async fn a_detached_inline_flight_still_lands_for_its_followers() {
    let flight = Reads::<u64>::new();
    let Turn::Lead(old) = flight.lead_or_join(b"k") else {
        panic!("the first call leads")
    };
    let Turn::Follow(old_follower) = flight.lead_or_join(b"k") else {
        panic!("a read is in the air")
    };
    flight.detach(b"k");
    // A new flight takes the key; the old one lands on its own.
    let Turn::Lead(new) = flight.lead_or_join(b"k") else {
        panic!("a detached flight is not joined")
    };
    let Turn::Follow(new_follower) = flight.lead_or_join(b"k") else {
        panic!("the new flight is in the air")
    };
    old.land_with(|| Ok(1));
    assert_eq!(old_follower.outcome().await.unwrap().unwrap(), 1);
    assert_eq!(flight.in_flight(), 1, "the old landing left the new flight");
    new.land_with(|| Ok(2));
    assert_eq!(new_follower.outcome().await.unwrap().unwrap(), 2);
    assert_eq!(flight.in_flight(), 0);
    assert!(
        flight
            .slots
            .iter()
            .all(|s| lock_slot(s).detached.is_empty())
    );
}

#[tokio::test(start_paused = true)]
async fn nobody_following_an_inline_flight_means_no_result_is_made() {
    let flight = Reads::<u64>::new();
    let Turn::Lead(lead) = flight.lead_or_join(b"k") else {
        panic!("the first call leads")
    };
    lead.land_with(|| panic!("made a result nobody waits for"));
    assert_eq!(flight.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn followers_of_a_cancelled_inline_leader_try_again() {
    let flight = Arc::new(Reads::<u64>::new());
    let Turn::Lead(lead) = flight.lead_or_join(b"k") else {
        panic!("the first call leads")
    };
    let Turn::Follow(joined) = flight.lead_or_join(b"k") else {
        panic!("a read is in the air")
    };
    let waiting = tokio::spawn(joined.outcome());
    tokio::task::yield_now().await;
    drop(lead);
    assert!(waiting.await.unwrap().is_none(), "nothing handed down");
    assert_eq!(flight.in_flight(), 0);
    let Turn::Lead(again) = flight.lead_or_join(b"k") else {
        panic!("the key is free again")
    };
    again.land_with(|| Ok(1));
}

#[tokio::test(start_paused = true)]
async fn keys_that_share_a_slot_are_told_apart() {
    // More keys than slots: many share one.
    let reads = Reads::<usize>::new();
    let keys: Vec<Vec<u8>> = (0..4 * READ_SLOTS)
        .map(|i| format!("key:{i}").into_bytes())
        .collect();
    let leads: Vec<_> = keys
        .iter()
        .map(|key| match reads.lead_or_join(key) {
            Turn::Lead(lead) => lead,
            Turn::Follow(_) => panic!("each key's first read leads"),
        })
        .collect();
    assert_eq!(reads.in_flight(), keys.len());
    let followers: Vec<_> = keys
        .iter()
        .map(|key| match reads.lead_or_join(key) {
            Turn::Follow(joined) => joined,
            Turn::Lead(_) => panic!("the key's read is in the air"),
        })
        .collect();
    // Half detached first: their followers still get their result.
    for key in keys.iter().step_by(2) {
        reads.detach(key);
    }
    for (i, lead) in leads.into_iter().enumerate().rev() {
        lead.land_with(|| Ok(i));
    }
    for (i, joined) in followers.into_iter().enumerate() {
        assert_eq!(joined.outcome().await.unwrap().unwrap(), i);
    }
    assert_eq!(reads.in_flight(), 0);
    assert!(reads.slots.iter().all(|s| lock_slot(s).detached.is_empty()));
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
async fn detach_all_detaches_every_key() {
    let flight = Arc::new(SingleFlight::<u64>::new());
    let slow = |v: u64| {
        move || async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(v)
        }
    };
    let (a, _) = flight.join(b"a", slow(1));
    let (a_follower, _) = flight.join(b"a", slow(9));
    let (b, _) = flight.join(b"b", slow(2));
    flight.detach_all();
    assert_eq!(flight.in_flight(), 0);
    let (a_new, role) = flight.join(b"a", slow(3));
    assert_eq!(role, Role::Leader, "a detached flight is not joined");
    assert_eq!(flight.join(b"b", slow(4)).1, Role::Leader);
    assert_eq!(a.result().await.unwrap(), 1);
    assert_eq!(a_follower.result().await.unwrap(), 1);
    assert_eq!(b.result().await.unwrap(), 2);
    assert_eq!(a_new.result().await.unwrap(), 3);
    assert_eq!(flight.in_flight(), 0);
    assert!(lock(&flight.flights).detached.is_empty());
}

#[tokio::test(start_paused = true)]
async fn detach_all_detaches_every_inline_read() {
    let flight = Reads::<u64>::new();
    let mut leads = Vec::new();
    let mut followers = Vec::new();
    // Enough keys that some share a slot (`more`).
    for i in 0..600u32 {
        let key = i.to_be_bytes();
        let Turn::Lead(lead) = flight.lead_or_join(&key) else {
            panic!("the first call leads")
        };
        if i % 2 == 0 {
            let Turn::Follow(follower) = flight.lead_or_join(&key) else {
                panic!("a read is in the air")
            };
            followers.push((i, follower));
        }
        leads.push((i, lead));
    }
    flight.detach_all();
    assert_eq!(flight.in_flight(), 0);
    for i in 0..600u32 {
        let Turn::Lead(new) = flight.lead_or_join(&i.to_be_bytes()) else {
            panic!("a detached read is not joined")
        };
        new.land_with(|| Ok(0));
    }
    for (i, lead) in leads {
        lead.land_with(|| Ok(u64::from(i)));
    }
    for (i, follower) in followers {
        assert_eq!(follower.outcome().await.unwrap().unwrap(), u64::from(i));
    }
    assert!(
        flight
            .slots
            .iter()
            .all(|s| lock_slot(s).detached.is_empty() && s.lock().unwrap().more.is_empty())
    );
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

/// A runtime of its own, as a binding's thread would make one.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn follow(flight: &Reads<u64>, key: &[u8]) -> Joined<u64> {
    match flight.lead_or_join(key) {
        Turn::Follow(joined) => joined,
        Turn::Lead(_) => panic!("a read is in the air"),
    }
}

#[tokio::test(start_paused = true)]
async fn followers_of_a_late_read_are_woken_at_its_deadline_by_one_task() {
    let flight = Reads::<u64>::new();
    let Turn::Lead(slow) = flight.lead_or_join(b"slow") else {
        panic!("the first call leads")
    };
    let Turn::Lead(quick) = flight.lead_or_join(b"quick") else {
        panic!("the first call leads")
    };
    let start = tokio::time::Instant::now();
    let a = follow(&flight, b"slow");
    assert!(
        flight.bound(&a, || Duration::from_millis(300)),
        "the task runs here"
    );
    let b = follow(&flight, b"slow");
    assert!(
        flight.bound(&b, || Duration::from_secs(60)),
        "the read's deadline is kept"
    );
    // A later read with a sooner deadline wakes the task early.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let c = follow(&flight, b"quick");
    assert!(flight.bound(&c, || Duration::from_millis(50)));
    assert!(c.outcome_or_late().await.is_err(), "late");
    assert_eq!(start.elapsed(), Duration::from_millis(60));
    // A read that lands before its deadline is not late.
    let d = follow(&flight, b"quick");
    quick.land_with(|| Ok(2));
    assert_eq!(d.outcome_or_late().await.unwrap().unwrap().unwrap(), 2);
    assert!(a.outcome_or_late().await.is_err());
    assert!(b.outcome_or_late().await.is_err());
    assert_eq!(start.elapsed(), Duration::from_millis(300));
    drop(slow);
    // With nothing pending the task ends after a while, and a new
    // read starts it again.
    tokio::time::sleep(ALARMS_IDLE * 2).await;
    assert!(!flight.alarms.task.is_running(ALARMS_GRACE));
    let Turn::Lead(_again) = flight.lead_or_join(b"slow") else {
        panic!("the first call leads")
    };
    let e = follow(&flight, b"slow");
    assert!(flight.bound(&e, || Duration::from_millis(20)));
    assert!(flight.alarms.task.is_running(ALARMS_GRACE));
    assert!(e.outcome_or_late().await.is_err());
}

#[test]
fn deadlines_outlive_the_runtime_that_kept_them() {
    let flight = Reads::<u64>::new();
    let Turn::Lead(_lead) = flight.lead_or_join(b"k") else {
        panic!("the first call leads")
    };
    let first = runtime();
    let a = first.block_on(async {
        let a = follow(&flight, b"k");
        assert!(flight.bound(&a, || Duration::from_millis(100)));
        a
    });
    drop(first);
    // Another runtime: the task is started there, and the deadline
    // registered on the dropped one still fires.
    runtime().block_on(async {
        let b = follow(&flight, b"k");
        assert!(
            !flight.bound(&b, || Duration::from_millis(100)),
            "another runtime's task"
        );
        let Turn::Lead(_other) = flight.lead_or_join(b"j") else {
            panic!("the first call leads")
        };
        let c = follow(&flight, b"j");
        assert!(
            flight.bound(&c, || Duration::from_millis(100)),
            "started again here"
        );
        let started = std::time::Instant::now();
        assert!(a.outcome_or_late().await.is_err());
        assert!(c.outcome_or_late().await.is_err());
        assert!(started.elapsed() < Duration::from_secs(5));
    });
}

#[test]
fn a_follower_is_not_bounded_by_a_task_replaced_since() {
    let flight = Reads::<u64>::new();
    let Turn::Lead(_lead) = flight.lead_or_join(b"k") else {
        panic!("the first call leads")
    };
    // The task starts on A, whose `block_on` then returns: A is idle.
    let a = runtime();
    a.block_on(async {
        let first = follow(&flight, b"k");
        assert!(flight.bound(&first, || Duration::from_millis(20)));
    });
    // Past its promise and the grace, B's first follower replaces it.
    std::thread::sleep(Duration::from_millis(200));
    runtime().block_on(async {
        let Turn::Lead(_other) = flight.lead_or_join(b"j") else {
            panic!("the first call leads")
        };
        let other = follow(&flight, b"j");
        assert!(
            flight.bound(&other, || Duration::from_secs(60)),
            "started on B"
        );
    });
    // B is gone; back on A, a follower of the read registered with A's
    // task is not bounded by it (it was replaced): its own timer.
    a.block_on(async {
        let late = follow(&flight, b"k");
        assert!(!flight.bound(&late, || Duration::from_millis(20)));
    });
}
