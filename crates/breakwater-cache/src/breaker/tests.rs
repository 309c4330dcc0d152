use super::*;
use tokio::time::advance;

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Defaults, but an exact cool-down so tests can step right onto it.
fn exact(config: BreakerConfig) -> BreakerConfig {
    config.cool_down_jitter(Jitter::none().with_floor(ms(1)))
}

fn fail(breaker: &CircuitBreaker, n: u32) {
    for _ in 0..n {
        breaker.try_acquire().expect("closed").failure();
    }
}

fn succeed(breaker: &CircuitBreaker, n: u32) {
    for _ in 0..n {
        breaker.try_acquire().expect("closed").success();
    }
}

/// Hammers the breaker every 10 ms for `span`; returns permits granted.
async fn hammer(breaker: &CircuitBreaker, span: Duration) -> usize {
    let start = Instant::now();
    let mut granted = 0;
    while start.elapsed() < span {
        if let Ok(permit) = breaker.try_acquire() {
            granted += 1;
            permit.failure();
        }
        advance(ms(10)).await;
    }
    granted
}

#[test]
fn breaker_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CircuitBreaker>();
    assert_send_sync::<BreakerPermit<'static>>();
}

#[tokio::test(start_paused = true)]
async fn failing_origin_gets_no_permit_during_the_cool_down() {
    let breaker = CircuitBreaker::new(exact(BreakerConfig::new()), Some(1));
    fail(&breaker, 4);
    assert_eq!(breaker.state(), BreakerState::Closed);
    fail(&breaker, 1);
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(
        breaker.try_acquire().unwrap_err(),
        Rejected { retry_in: secs(5) }
    );

    assert_eq!(hammer(&breaker, secs(5) - ms(1)).await, 0);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
}

/// Asking is not taking: `admits` answers like `try_acquire` but leaves
/// every probe slot to the loads that will ask for a permit.
#[tokio::test(start_paused = true)]
async fn admits_answers_without_taking_a_probe_slot() {
    let breaker = CircuitBreaker::new(exact(BreakerConfig::new()), Some(4));
    assert_eq!(breaker.admits(), Ok(()));
    fail(&breaker, 5);
    assert_eq!(breaker.admits(), Err(Rejected { retry_in: secs(5) }));
    advance(secs(5)).await;
    for _ in 0..3 {
        assert_eq!(breaker.admits(), Ok(()));
    }
    let probe = breaker.try_acquire().expect("the one probe slot is free");
    assert_eq!(
        breaker.admits(),
        Err(Rejected {
            retry_in: Duration::ZERO
        })
    );
    probe.success();
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn half_open_grants_exactly_the_probe_count() {
    let config = exact(BreakerConfig::new().half_open_probes(3));
    let breaker = CircuitBreaker::new(config, Some(2));
    fail(&breaker, 5);
    advance(secs(5)).await;
    let attempts: Vec<_> = (0..10).map(|_| breaker.try_acquire()).collect();
    let granted = attempts.iter().filter(|a| a.is_ok()).count();
    assert_eq!(granted, 3);
    for rejected in attempts.iter().filter_map(|a| a.as_ref().err()) {
        assert_eq!(rejected.retry_in, Duration::ZERO);
    }
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn probe_success_closes_and_resets_the_count() {
    let breaker = CircuitBreaker::new(exact(BreakerConfig::new()), Some(3));
    fail(&breaker, 5);
    advance(secs(5)).await;
    breaker.try_acquire().expect("probe").success();
    assert_eq!(breaker.state(), BreakerState::Closed);
    // The count starts again from zero.
    fail(&breaker, 4);
    assert_eq!(breaker.state(), BreakerState::Closed);
    fail(&breaker, 1);
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn probe_failure_opens_again_with_a_fresh_cool_down() {
    let breaker = CircuitBreaker::new(exact(BreakerConfig::new()), Some(4));
    fail(&breaker, 5);
    advance(secs(5)).await;
    breaker.try_acquire().expect("probe").failure();
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(
        breaker.try_acquire().unwrap_err(),
        Rejected { retry_in: secs(5) }
    );
    assert_eq!(hammer(&breaker, secs(5) - ms(1)).await, 0);
    assert!(breaker.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_success_resets_the_consecutive_count() {
    let breaker = CircuitBreaker::new(exact(BreakerConfig::new()), Some(5));
    for _ in 0..10 {
        fail(&breaker, 4);
        succeed(&breaker, 1);
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    fail(&breaker, 5);
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn ratio_opens_at_the_right_point() {
    let config = exact(
        BreakerConfig::new()
            .consecutive_failures(u32::MAX)
            .failure_ratio(0.5, secs(10), 20),
    );
    let breaker = CircuitBreaker::new(config, Some(6));
    succeed(&breaker, 10);
    // k failures after 10 successes: k / (10 + k) reaches 0.5 at k = 10,
    // which is also the 20th call.
    fail(&breaker, 9);
    assert_eq!(breaker.state(), BreakerState::Closed);
    fail(&breaker, 1);
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn ratio_waits_for_min_calls() {
    let config = exact(
        BreakerConfig::new()
            .consecutive_failures(u32::MAX)
            .failure_ratio(0.1, secs(10), 20),
    );
    let breaker = CircuitBreaker::new(config, Some(7));
    fail(&breaker, 19);
    assert_eq!(breaker.state(), BreakerState::Closed);
    fail(&breaker, 1);
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn ratio_forgets_calls_older_than_the_window() {
    let config = exact(
        BreakerConfig::new()
            .consecutive_failures(u32::MAX)
            .failure_ratio(0.5, secs(10), 20),
    );
    let breaker = CircuitBreaker::new(config, Some(8));
    fail(&breaker, 15);
    advance(secs(11)).await;
    // The 15 old failures have left the window: 5 new calls are too few.
    fail(&breaker, 5);
    assert_eq!(breaker.state(), BreakerState::Closed);
    succeed(&breaker, 10);
    fail(&breaker, 4);
    assert_eq!(breaker.state(), BreakerState::Closed);
    // 10 failures out of 20 calls.
    fail(&breaker, 1);
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_probe_frees_its_slot() {
    let breaker = CircuitBreaker::new(exact(BreakerConfig::new()), Some(9));
    fail(&breaker, 5);
    advance(secs(5)).await;
    let probe = breaker.try_acquire().expect("probe");
    assert!(breaker.try_acquire().is_err());
    drop(probe);
    // Neither success nor failure: still half-open, and the slot is free.
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    let probe = breaker.try_acquire().expect("the slot was freed");
    assert!(breaker.try_acquire().is_err());
    probe.success();
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn late_verdicts_from_an_earlier_state_are_ignored() {
    let breaker = CircuitBreaker::new(exact(BreakerConfig::new()), Some(10));
    let early: Vec<_> = (0..12)
        .map(|_| breaker.try_acquire().expect("closed"))
        .collect();
    let mut early = early.into_iter();
    for permit in early.by_ref().take(5) {
        permit.failure();
    }
    assert_eq!(breaker.state(), BreakerState::Open);
    advance(secs(1)).await;
    // Loads that started while closed and fail while open do not stretch
    // the cool-down.
    for permit in early.by_ref().take(5) {
        permit.failure();
    }
    assert_eq!(
        breaker.try_acquire().unwrap_err(),
        Rejected { retry_in: secs(4) }
    );
    advance(secs(4)).await;
    let probe = breaker.try_acquire().expect("probe");
    // Nor do they close or re-open it while half-open.
    early.next().expect("11th").success();
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    early.next().expect("12th").failure();
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    assert!(
        breaker.try_acquire().is_err(),
        "the probe slot is still taken"
    );
    probe.success();
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn jittered_cool_downs_stay_in_bounds_and_vary() {
    let config = BreakerConfig::new();
    let (low, high) = Jitter::ratio(0.2)
        .with_floor(ms(1))
        .bounds(config.cool_down);
    assert_eq!((low, high), (secs(4), secs(6)));
    let breaker = CircuitBreaker::new(config, Some(11));
    fail(&breaker, 5);
    let mut cool_downs = Vec::new();
    for _ in 0..20 {
        let retry_in = breaker.try_acquire().unwrap_err().retry_in;
        cool_downs.push(retry_in);
        advance(retry_in).await;
        breaker.try_acquire().expect("probe").failure();
    }
    assert!(
        cool_downs.iter().all(|d| low <= *d && *d <= high),
        "{cool_downs:?}"
    );
    assert!(
        cool_downs.iter().any(|d| *d != cool_downs[0]),
        "{cool_downs:?}"
    );

    // The same seed draws the same cool-downs.
    let again = CircuitBreaker::new(config, Some(11));
    fail(&again, 5);
    assert_eq!(again.try_acquire().unwrap_err().retry_in, cool_downs[0]);
}

/// The source article's breaker: three failures in a row open it for 5 s
/// (here jittered ±20 %), a success resets the count.
#[tokio::test(start_paused = true)]
async fn seed_scenario_three_failures_five_seconds() {
    let config = BreakerConfig::new()
        .consecutive_failures(3)
        .cool_down(secs(5));
    let breaker = CircuitBreaker::new(config, Some(12));
    fail(&breaker, 2);
    succeed(&breaker, 1);
    fail(&breaker, 2);
    assert_eq!(breaker.state(), BreakerState::Closed);
    fail(&breaker, 1);
    assert_eq!(breaker.state(), BreakerState::Open);

    // Nothing reaches the database for at least 4 s ...
    assert_eq!(hammer(&breaker, secs(4)).await, 0);
    // ... and a probe is let through by 6 s.
    let mut waited = secs(4);
    while breaker.state() == BreakerState::Open {
        advance(ms(10)).await;
        waited += ms(10);
    }
    assert!(waited <= secs(6), "{waited:?}");
    breaker.try_acquire().expect("probe").success();
    assert_eq!(breaker.state(), BreakerState::Closed);
    succeed(&breaker, 3);
}

#[test]
fn rejected_becomes_a_circuit_open_error() {
    let err = Error::from(Rejected { retry_in: ms(4200) });
    assert!(err.is_circuit_open());
    assert_eq!(
        err.to_string(),
        "circuit open: the loader failed repeatedly; loads resume in about 4200ms"
    );
    let err = Error::from(Rejected {
        retry_in: Duration::ZERO,
    });
    assert_eq!(err.kind(), ErrorKind::CircuitOpen);
}

#[test]
fn validate_messages() {
    let msg = |c: BreakerConfig| c.validate().map_err(|e| e.message().to_owned());
    let window = secs(10);
    assert_eq!(msg(BreakerConfig::new()), Ok(()));
    assert_eq!(msg(BreakerConfig::default()), Ok(()));
    assert_eq!(
        msg(BreakerConfig::new().consecutive_failures(0)),
        Err("breaker failure threshold must be at least 1".to_owned())
    );
    for (ratio, shown) in [(1.5, "1.5"), (0.0, "0"), (-0.5, "-0.5"), (f64::NAN, "NaN")] {
        assert_eq!(
            msg(BreakerConfig::new().failure_ratio(ratio, window, 20)),
            Err(format!(
                "breaker failure ratio must be in (0, 1], got {shown}"
            ))
        );
    }
    assert_eq!(
        msg(BreakerConfig::new().failure_ratio(1.0, window, 1)),
        Ok(())
    );
    assert_eq!(
        msg(BreakerConfig::new().failure_ratio(0.5, Duration::ZERO, 20)),
        Err("breaker failure window must be greater than zero".to_owned())
    );
    assert_eq!(
        msg(BreakerConfig::new().failure_ratio(0.5, window, 0)),
        Err("breaker min calls must be at least 1".to_owned())
    );
    assert_eq!(
        msg(BreakerConfig::new().cool_down(Duration::ZERO)),
        Err("breaker cool-down must be greater than zero".to_owned())
    );
    assert_eq!(
        msg(BreakerConfig::new().cool_down(Duration::from_micros(500))),
        Err("breaker cool-down must be greater than zero".to_owned())
    );
    assert_eq!(
        msg(BreakerConfig::new().cool_down_jitter(Jitter::ratio(2.0))),
        Err("jitter ratio must be in 0..=1, got 2".to_owned())
    );
    assert_eq!(
        msg(BreakerConfig::new().half_open_probes(0)),
        Err("breaker half-open probes must be at least 1".to_owned())
    );
}

#[tokio::test(start_paused = true)]
async fn unvalidated_configs_do_not_panic() {
    let config = BreakerConfig::new()
        .consecutive_failures(0)
        .failure_ratio(f64::NAN, Duration::ZERO, 0)
        .cool_down(Duration::MAX)
        .cool_down_jitter(Jitter::fixed(Duration::MAX))
        .half_open_probes(0);
    let breaker = CircuitBreaker::new(config, Some(13));
    fail(&breaker, 1);
    assert_eq!(breaker.state(), BreakerState::Open);
    assert!(breaker.try_acquire().unwrap_err().retry_in >= FAR_FUTURE - secs(1));
    advance(secs(3600)).await;
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn failures_seen_without_a_permit_open_and_reopen_it() {
    let breaker = CircuitBreaker::new(exact(BreakerConfig::new().cool_down(secs(1))), Some(1));
    // A success between them resets the count, as for permits.
    for _ in 0..4 {
        breaker.failure_seen("overdue");
    }
    succeed(&breaker, 1);
    for _ in 0..4 {
        breaker.failure_seen("overdue");
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    breaker.failure_seen("overdue");
    assert_eq!(breaker.state(), BreakerState::Open);
    // Seen while open: nothing changes (the cool-down is not pushed out).
    advance(ms(900)).await;
    breaker.failure_seen("overdue");
    advance(ms(100)).await;
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    // A probe whose caller gave up (its permit dropped) and then saw it
    // overdue: open again.
    drop(breaker.try_acquire().expect("a probe"));
    breaker.failure_seen("a probe went unanswered");
    assert_eq!(breaker.state(), BreakerState::Open);
    advance(secs(1)).await;
    breaker.try_acquire().expect("a probe").success();
    assert_eq!(breaker.state(), BreakerState::Closed);
}
