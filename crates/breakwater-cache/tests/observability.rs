//! What each outcome reports: exactly its documented counter moves (a
//! recording recorder per scenario), `Cache::stats` agrees, and the gauges
//! and histograms appear. (Spans: `tests/spans.rs`, a binary of its own:
//! tracing caches each callsite's interest process-wide, and a test
//! without a subscriber running beside one with a subscriber could leave a
//! callsite disabled for it.)

mod support;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{
    BreakerConfig, BreakerState, ErrorKind, L1Config, LimitConfig, MemoryStore, StaleReason,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{failing, ten_second_cache as cache, value};

/// A metric by name and labels (`namespace` left out), as `name{k=v,...}`.
type Moved = BTreeMap<String, f64>;

fn describe(key: &metrics_util::CompositeKey) -> String {
    let key = key.key();
    let mut labels: Vec<String> = key
        .labels()
        .filter(|l| l.key() != "namespace")
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

/// Runs `scenario` on a paused current-thread runtime with its own
/// recorder; returns every counter that moved (and by how much), every
/// gauge's last value and every histogram's sample count.
fn recorded<F, Fut>(scenario: F) -> Moved
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = support::paused_runtime();
    metrics::with_local_recorder(&recorder, || runtime.block_on(scenario()));
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let value = match value {
                DebugValue::Counter(0) => return None,
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            };
            Some((describe(&key), value))
        })
        .collect()
}

/// The counters among `moved` whose name starts with `prefix`.
fn only(moved: &Moved, prefix: &str) -> Vec<(String, f64)> {
    moved
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

fn requests(moved: &Moved) -> Vec<(String, f64)> {
    only(moved, "breakwater_requests_total")
}

fn row(k: &str, v: f64) -> Vec<(String, f64)> {
    vec![(k.to_owned(), v)]
}

#[test]
fn a_load_counts_loaded_and_its_loader_call() {
    let moved = recorded(|| async {
        let cache = cache("loaded").build().unwrap();
        value(&cache, "a").await.unwrap();
        let stats = cache.stats();
        assert_eq!((stats.requests, stats.loaded, stats.loads.value), (1, 1, 1));
    });
    assert_eq!(
        requests(&moved),
        row("breakwater_requests_total{served=loaded}", 1.0)
    );
    assert_eq!(
        only(&moved, "breakwater_loads_total"),
        row("breakwater_loads_total{origin=loaded,outcome=value}", 1.0)
    );
    assert_eq!(
        only(&moved, "breakwater_load_seconds"),
        row("breakwater_load_seconds{origin=loaded}", 1.0)
    );
    assert_eq!(only(&moved, "breakwater_errors_total"), vec![]);
}

#[test]
fn a_store_hit_counts_hit_and_an_l1_hit_counts_l1_hit() {
    let moved = recorded(|| async {
        let cache = cache("hits").build().unwrap();
        value(&cache, "a").await.unwrap();
        value(&cache, "a").await.unwrap();
        let stats = cache.stats();
        assert_eq!((stats.store_hits, stats.l1_hits), (1, 0));
    });
    assert_eq!(
        requests(&moved),
        vec![
            ("breakwater_requests_total{served=hit}".to_owned(), 1.0),
            ("breakwater_requests_total{served=loaded}".to_owned(), 1.0),
        ]
    );

    let moved = recorded(|| async {
        let cache = cache("near")
            .l1(L1Config::new().ttl(Duration::from_secs(5)))
            .build()
            .unwrap();
        value(&cache, "a").await.unwrap();
        value(&cache, "a").await.unwrap();
        let stats = cache.stats();
        assert_eq!((stats.store_hits, stats.l1_hits), (0, 1));
        assert_eq!(stats.hit_ratio(), 0.5);
    });
    assert_eq!(
        requests(&moved),
        vec![
            ("breakwater_requests_total{served=l1_hit}".to_owned(), 1.0),
            ("breakwater_requests_total{served=loaded}".to_owned(), 1.0),
        ]
    );
    // Set after the insert, to moka's count (approximate: updated by its
    // housekeeping, so possibly 0 yet).
    assert_eq!(only(&moved, "breakwater_l1_entries").len(), 1);
}

#[test]
fn a_negative_hit_counts_negative() {
    let moved = recorded(|| async {
        let cache = cache("negative").build().unwrap();
        let none = || async { Ok::<Option<String>, std::io::Error>(None) };
        cache.get_or_load("gone", none).await.unwrap();
        cache.get_or_load("gone", none).await.unwrap();
        assert_eq!(cache.stats().negative_hits, 1);
        assert_eq!(cache.stats().loads.negative, 1);
    });
    assert_eq!(
        requests(&moved),
        vec![
            ("breakwater_requests_total{served=loaded}".to_owned(), 1.0),
            ("breakwater_requests_total{served=negative}".to_owned(), 1.0),
        ]
    );
}

#[test]
fn a_failed_load_counts_error_by_kind() {
    let moved = recorded(|| async {
        let cache = cache("failed").build().unwrap();
        let err = failing(&cache, "a").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Loader);
        let stats = cache.stats();
        assert_eq!(stats.errors, vec![(ErrorKind::Loader, 1)]);
        assert_eq!(stats.loads.error, 1);
    });
    assert_eq!(
        requests(&moved),
        row("breakwater_requests_total{served=error}", 1.0)
    );
    assert_eq!(
        only(&moved, "breakwater_errors_total"),
        row("breakwater_errors_total{kind=loader}", 1.0)
    );
    assert_eq!(
        only(&moved, "breakwater_loads_total"),
        row("breakwater_loads_total{origin=failed,outcome=error}", 1.0)
    );
}

#[test]
fn an_invalid_key_counts_its_kind_and_no_load() {
    let moved = recorded(|| async {
        let cache = cache("badkey").build().unwrap();
        let err = value(&cache, "").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey);
    });
    assert_eq!(
        only(&moved, "breakwater_errors_total"),
        row("breakwater_errors_total{kind=invalid_key}", 1.0)
    );
    assert_eq!(only(&moved, "breakwater_loads_total"), vec![]);
}

#[test]
fn grace_counts_stale_refreshing_and_a_failed_refresh_stale_loader_failed() {
    let moved = recorded(|| async {
        let cache = cache("grace")
            .grace(Duration::from_secs(60))
            .build()
            .unwrap();
        value(&cache, "a").await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        value(&cache, "a").await.unwrap(); // stale, refreshing
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            cache.stats().stale,
            vec![(StaleReason::Refreshing, 1)],
            "{}",
            cache.stats()
        );
    });
    assert_eq!(
        requests(&moved),
        vec![
            ("breakwater_requests_total{served=loaded}".to_owned(), 1.0),
            (
                "breakwater_requests_total{served=stale_refreshing}".to_owned(),
                1.0
            ),
        ]
    );
    assert_eq!(
        only(&moved, "breakwater_loads_total"),
        row("breakwater_loads_total{origin=grace,outcome=value}", 2.0),
        "the refresh loaded once"
    );
}

#[test]
fn an_open_breaker_counts_stale_breaker_open_its_state_and_its_transition() {
    let moved = recorded(|| async {
        let cache = cache("tripped")
            .max_stale(Duration::from_secs(600))
            .breaker(BreakerConfig::new().consecutive_failures(1))
            .build()
            .unwrap();
        value(&cache, "a").await.unwrap();
        value(&cache, "b").await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        // Past its fresh window, no grace: the load fails, the stale value
        // stands in, and the breaker opens; the next key's load is refused.
        failing(&cache, "a").await.unwrap();
        assert_eq!(cache.stats().origin_breaker, BreakerState::Open);
        assert_eq!(cache.stats().origin_breaker_openings, 1);
        failing(&cache, "b").await.unwrap();
        let stats = cache.stats();
        assert_eq!(
            stats.stale,
            vec![
                (StaleReason::LoaderFailed, 1),
                (StaleReason::BreakerOpen, 1)
            ],
            "{stats}"
        );
    });
    assert_eq!(
        only(&moved, "breakwater_requests_total{served=stale"),
        vec![
            (
                "breakwater_requests_total{served=stale_breaker_open}".to_owned(),
                1.0
            ),
            (
                "breakwater_requests_total{served=stale_loader_failed}".to_owned(),
                1.0
            ),
        ]
    );
    // Both breakers have their gauge from the start; the origin's is open.
    assert_eq!(
        only(&moved, "breakwater_breaker_state"),
        vec![
            (
                "breakwater_breaker_state{breaker=origin,name=tripped}".to_owned(),
                2.0
            ),
            (
                "breakwater_breaker_state{breaker=store,domain=0,name=tripped}".to_owned(),
                0.0
            ),
        ]
    );
    assert_eq!(
        only(&moved, "breakwater_breaker_transitions_total"),
        row(
            "breakwater_breaker_transitions_total{breaker=origin,name=tripped,to=open}",
            1.0
        )
    );
}

#[test]
fn concurrent_callers_count_one_load_and_the_rest_coalesced() {
    let moved = recorded(|| async {
        let cache = cache("crowd").build().unwrap();
        let slow = || async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok::<_, std::io::Error>(Some("v".to_owned()))
        };
        let calls: Vec<_> = (0..5).map(|_| cache.get_or_load("hot", slow)).collect();
        for got in futures_join(calls).await {
            got.unwrap();
        }
        let stats = cache.stats();
        assert_eq!((stats.loaded, stats.coalesced, stats.waiters), (1, 4, 0));
    });
    assert_eq!(
        requests(&moved),
        vec![
            (
                "breakwater_requests_total{served=coalesced}".to_owned(),
                4.0
            ),
            ("breakwater_requests_total{served=loaded}".to_owned(), 1.0),
        ]
    );
    assert_eq!(
        only(&moved, "breakwater_waiters"),
        row("breakwater_waiters{}", 0.0),
        "the waiters gauge went back to 0"
    );
}

#[test]
fn a_fallback_counts_fallback() {
    let moved = recorded(|| async {
        let cache = cache("fallback")
            .fallback("default".to_owned())
            .build()
            .unwrap();
        assert_eq!(
            failing(&cache, "a").await.unwrap().as_deref(),
            Some("default")
        );
        assert_eq!(cache.stats().fallback, 1);
    });
    assert_eq!(
        requests(&moved),
        row("breakwater_requests_total{served=fallback}", 1.0)
    );
}

#[test]
fn a_shed_load_counts_overloaded_and_loads_shed() {
    let moved = recorded(|| async {
        let cache = cache("shed")
            .limit(
                LimitConfig::new()
                    .max_concurrent(1)
                    .queue_wait(Duration::from_millis(10)),
            )
            .build()
            .unwrap();
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, std::io::Error>(Some("v".to_owned()))
        };
        let (first, second) = tokio::join!(cache.get_or_load("a", slow), async {
            tokio::task::yield_now().await;
            cache.get_or_load("b", slow).await
        });
        first.unwrap();
        assert_eq!(second.unwrap_err().kind(), ErrorKind::Overloaded);
        let stats = cache.stats();
        assert_eq!((stats.shed_loads, stats.loads_in_flight), (1, 0));
    });
    assert_eq!(
        only(&moved, "breakwater_loads_shed_total"),
        row(
            "breakwater_loads_shed_total{origin=shed,priority=foreground}",
            1.0
        )
    );
    assert_eq!(
        only(&moved, "breakwater_errors_total"),
        row("breakwater_errors_total{kind=overloaded}", 1.0)
    );
    assert_eq!(
        only(&moved, "breakwater_loads_in_flight"),
        row("breakwater_loads_in_flight{origin=shed}", 0.0)
    );
}

#[test]
fn an_early_refresh_is_counted() {
    let moved = recorded(|| async {
        let cache = cache("early")
            .early_refresh(breakwater_cache::EarlyRefresh::after_fraction(0.5))
            .build()
            .unwrap();
        value(&cache, "a").await.unwrap();
        tokio::time::advance(Duration::from_secs(9)).await;
        value(&cache, "a").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(cache.stats().early_refreshes, 1);
    });
    assert_eq!(
        only(&moved, "breakwater_early_refreshes_total"),
        row("breakwater_early_refreshes_total{}", 1.0)
    );
}

#[test]
fn writes_send_notices_and_store_calls_are_timed() {
    let moved = recorded(|| async {
        // With L1, the cache listens to its namespace's channel.
        let cache = cache("notices")
            .store(MemoryStore::new())
            .l1(L1Config::new())
            .build()
            .unwrap();
        value(&cache, "warm").await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        cache.set("a", &"v".to_owned()).await.unwrap();
        cache.invalidate("a").await.unwrap();
        let stats = cache.stats();
        // The fill's, the `set`'s and the invalidation's, and the pin of
        // the namespace's clear record that its first write made.
        assert_eq!(stats.notices.sent, 4, "{stats}");
        // Its own notices come back on the bus; subscribing missed nothing.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let stats = cache.stats();
        assert!(stats.notices.received >= 1, "{stats}");
        assert_eq!(stats.notices.missed, 0, "{stats}");
    });
    assert_eq!(
        only(&moved, "breakwater_notices_total"),
        vec![
            ("breakwater_notices_total{event=received}".to_owned(), 4.0),
            ("breakwater_notices_total{event=sent}".to_owned(), 4.0),
        ]
    );
    let timed = only(&moved, "breakwater_store_seconds");
    assert!(
        timed
            .iter()
            .any(|(k, n)| k == "breakwater_store_seconds{op=invalidate}" && *n == 1.0),
        "{timed:?}"
    );
}

#[test]
fn a_soft_timeout_counts_stale_soft_timeout() {
    let moved = recorded(|| async {
        let cache = cache("soft")
            .max_stale(Duration::from_secs(600))
            .soft_timeout(Duration::from_millis(100))
            .build()
            .unwrap();
        value(&cache, "a").await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, std::io::Error>(Some("new".to_owned()))
        };
        assert_eq!(
            cache.get_or_load("a", slow).await.unwrap().as_deref(),
            Some("v")
        );
        assert_eq!(cache.stats().stale, vec![(StaleReason::SoftTimeout, 1)]);
    });
    assert_eq!(
        only(&moved, "breakwater_requests_total{served=stale"),
        row("breakwater_requests_total{served=stale_soft_timeout}", 1.0)
    );
}

#[test]
fn a_shed_load_with_a_stale_value_counts_stale_overloaded() {
    let moved = recorded(|| async {
        let cache = cache("crowded")
            .max_stale(Duration::from_secs(600))
            .limit(
                LimitConfig::new()
                    .max_concurrent(1)
                    .queue_wait(Duration::from_millis(10)),
            )
            .build()
            .unwrap();
        value(&cache, "a").await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, std::io::Error>(Some("v".to_owned()))
        };
        let (busy, stale) = tokio::join!(cache.get_or_load("b", slow), async {
            tokio::task::yield_now().await;
            value(&cache, "a").await
        });
        busy.unwrap();
        assert_eq!(stale.unwrap().as_deref(), Some("v"));
        assert_eq!(cache.stats().stale, vec![(StaleReason::Overloaded, 1)]);
    });
    assert_eq!(
        only(&moved, "breakwater_requests_total{served=stale"),
        row("breakwater_requests_total{served=stale_overloaded}", 1.0)
    );
    assert_eq!(
        only(&moved, "breakwater_loads_shed_total"),
        row(
            "breakwater_loads_shed_total{origin=crowded,priority=foreground}",
            1.0
        )
    );
}

#[test]
fn a_lease_held_past_lock_wait_counts_stale_lock_timeout_and_busy() {
    let busy = std::cell::Cell::new(0);
    let moved = recorded(|| async {
        // Two caches on one store, as two processes would be.
        let store = MemoryStore::new();
        let build = || {
            cache("leased")
                .store(store.clone())
                .max_stale(Duration::from_secs(600))
                .lock_wait(Duration::from_millis(200))
                .on_lock_timeout(breakwater_cache::OnLockTimeout::serve_stale())
                .build()
                .unwrap()
        };
        let (holder, waiter) = (build(), build());
        value(&holder, "a").await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        let slow = || async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok::<_, std::io::Error>(Some("new".to_owned()))
        };
        let (held, waited) = tokio::join!(holder.get_or_load("a", slow), async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            value(&waiter, "a").await
        });
        held.unwrap();
        assert_eq!(waited.unwrap().as_deref(), Some("v"));
        let stats = waiter.stats();
        assert_eq!(stats.stale, vec![(StaleReason::LockTimeout, 1)], "{stats}");
        // Found held each time it asked (its polls are jittered).
        assert!(stats.leases.busy >= 1, "{stats}");
        busy.set(stats.leases.busy);
    });
    assert_eq!(
        only(&moved, "breakwater_requests_total{served=stale"),
        row("breakwater_requests_total{served=stale_lock_timeout}", 1.0)
    );
    assert_eq!(
        only(&moved, "breakwater_lease_total"),
        vec![
            ("breakwater_lease_total{event=acquired}".to_owned(), 2.0),
            (
                "breakwater_lease_total{event=busy}".to_owned(),
                busy.get() as f64
            ),
        ]
    );
}

#[test]
fn a_store_down_with_an_l1_copy_counts_stale_store_unavailable_and_a_store_error() {
    let moved = recorded(|| async {
        let store = CountingStore::new(MemoryStore::new());
        let cache = cache("storedown")
            .store(store.clone())
            .l1(L1Config::new()
                .ttl(Duration::from_secs(1))
                .keep(Duration::from_secs(60)))
            .build()
            .unwrap();
        value(&cache, "a").await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        store.fail_gets(true);
        assert_eq!(value(&cache, "a").await.unwrap().as_deref(), Some("v"));
        let stats = cache.stats();
        assert_eq!(stats.stale, vec![(StaleReason::StoreUnavailable, 1)]);
        assert_eq!(stats.store_errors, 1, "{stats}");
    });
    assert_eq!(
        only(&moved, "breakwater_requests_total{served=stale"),
        row(
            "breakwater_requests_total{served=stale_store_unavailable}",
            1.0
        )
    );
    assert_eq!(
        only(&moved, "breakwater_store_errors_total"),
        row("breakwater_store_errors_total{op=get}", 1.0)
    );
}

/// Joins futures on this task (no spawn), in order.
async fn futures_join<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

/// On Redis, the store announces every (re)subscription; only a drop is a
/// possible miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribing_to_redis_misses_no_notice() {
    let (_server, store) = support::redis_store().await;
    let cache = cache("subscribed")
        .store(store)
        .l1(L1Config::new())
        .build()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Its own notices come back once it listens (a read through L1 starts
    // the listener).
    while cache.stats().notices.received == 0 {
        assert!(tokio::time::Instant::now() < deadline, "{}", cache.stats());
        value(&cache, "k").await.unwrap();
        cache.invalidate("k").await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(cache.stats().notices.missed, 0, "{}", cache.stats());
}
