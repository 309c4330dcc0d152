//! Warming: missing keys loaded at a bounded rate and width, fresh keys
//! skipped, failures counted, TTLs spread. Paused tokio time throughout.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, Jitter, MemoryStore, Store, Stored, Warm};
use support::DbDown;
use tokio::time::Instant;

fn cache(store: &MemoryStore) -> Cache<String> {
    Cache::builder()
        .namespace("warm")
        .store(store.clone())
        .ttl(Duration::from_secs(600))
        .build()
        .unwrap()
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("product:{i}")).collect()
}

#[tokio::test(start_paused = true)]
async fn loads_the_missing_keys_and_skips_the_fresh_ones() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    for key in &keys(3) {
        cache.set(key, &"already".to_owned()).await.unwrap();
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let report = cache
        .warm(
            keys(10),
            move |key: String| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok::<_, DbDown>(Some(format!("row {key}"))) }
            },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.cached, report.failed), (7, 3, 0));
    assert_eq!(calls.load(Ordering::SeqCst), 7);
    assert_eq!(
        cache.get("product:0").await.unwrap().as_deref(),
        Some("already")
    );
    assert_eq!(
        cache.get("product:9").await.unwrap().as_deref(),
        Some("row product:9")
    );
}

#[tokio::test(start_paused = true)]
async fn loads_start_no_faster_than_the_rate() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let starts = Arc::new(Mutex::new(Vec::new()));
    let recorded = Arc::clone(&starts);
    let began = Instant::now();
    let report = cache
        .warm(
            keys(21),
            move |_key: String| {
                recorded.lock().unwrap().push(Instant::now());
                async { Ok::<_, DbDown>(Some("v".to_owned())) }
            },
            Warm::new().rate(10).concurrency(8),
        )
        .await
        .unwrap();
    assert_eq!(report.loaded, 21);
    let starts = starts.lock().unwrap();
    // Evenly spaced, 100 ms apart: 21 loads take 2 s, the first at once.
    assert_eq!(starts[0], began);
    for pair in starts.windows(2) {
        assert!(pair[1] - pair[0] >= Duration::from_millis(100), "{pair:?}");
    }
    assert!(
        report.elapsed >= Duration::from_secs(2),
        "{:?}",
        report.elapsed
    );
}

#[tokio::test(start_paused = true)]
async fn at_most_concurrency_keys_load_at_once() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (n, p) = (Arc::clone(&now), Arc::clone(&peak));
    let report = cache
        .warm(
            keys(12),
            move |_key: String| {
                let (now, peak) = (Arc::clone(&n), Arc::clone(&p));
                async move {
                    let running = now.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(running, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, DbDown>(Some("v".to_owned()))
                }
            },
            Warm::new().rate(1_000).concurrency(3),
        )
        .await
        .unwrap();
    assert_eq!(report.loaded, 12);
    assert_eq!(peak.load(Ordering::SeqCst), 3);
    // Four rounds of three half-second loads.
    assert!(
        report.elapsed >= Duration::from_secs(2),
        "{:?}",
        report.elapsed
    );
}

#[tokio::test(start_paused = true)]
async fn failures_are_counted_and_the_warm_up_goes_on() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let mut all = keys(6);
    all.push(String::new()); // an invalid key
    let report = cache
        .warm(
            all,
            |key: String| async move {
                if key.ends_with('3') {
                    Err(DbDown)
                } else {
                    Ok(Some("v".to_owned()))
                }
            },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.cached, report.failed), (5, 0, 2));
    let (key, err) = report.first_error.expect("a failure is reported");
    assert!(
        (key == "product:3" && err.is_loader()) || (key.is_empty() && err.is_invalid_key()),
        "{key:?}: {err}"
    );
    assert_eq!(cache.get("product:3").await.unwrap(), None);
    assert_eq!(cache.get("product:5").await.unwrap().as_deref(), Some("v"));
}

#[tokio::test(start_paused = true)]
async fn warmed_keys_do_not_expire_together() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let report = cache
        .warm(
            keys(200),
            |_key: String| async { Ok::<_, DbDown>(Some("v".to_owned())) },
            Warm::new().rate(10_000).jitter(Jitter::ratio(0.2)),
        )
        .await
        .unwrap();
    assert_eq!(report.loaded, 200);
    let mut ttls = Vec::new();
    for key in keys(200) {
        let storage = cache.storage_key(key.as_bytes()).unwrap();
        ttls.push(store.ttl(&storage).await.unwrap().unwrap());
    }
    ttls.sort();
    let (first, last) = (ttls[0], ttls[ttls.len() - 1]);
    // ±20 % of 600 s: expiries spread over minutes, not one second.
    assert!(
        last - first > Duration::from_secs(120),
        "{first:?}..{last:?}"
    );
    // The earliest keys' TTLs have run for the warm-up's own (virtual)
    // time when they are read: with 200 draws, the lowest lands within that
    // much of 480 s now and then.
    let ran = report.elapsed + Duration::from_millis(1);
    assert!(
        first + ran >= Duration::from_secs(480) && last <= Duration::from_secs(720),
        "{first:?}..{last:?}, {ran:?} after the first write"
    );
}

#[tokio::test(start_paused = true)]
async fn a_zero_rate_or_width_is_a_config_error_and_loads_nothing() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let calls = Arc::new(AtomicUsize::new(0));
    for (warm, message) in [
        (
            Warm::new().rate(0),
            "warm rate must be at least 1 load per second",
        ),
        (
            Warm::new().rate(u32::MAX),
            "warm rate must be at most 1000000 loads per second, got 4294967295",
        ),
        (
            Warm::new().concurrency(0),
            "warm concurrency must be at least 1",
        ),
        (
            Warm::new().jitter(Jitter::ratio(2.0)),
            "jitter ratio must be in 0..=1, got 2",
        ),
    ] {
        let counted = Arc::clone(&calls);
        let err = cache
            .warm(
                keys(3),
                move |_key: String| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    async { Ok::<_, DbDown>(Some("v".to_owned())) }
                },
                warm,
            )
            .await
            .unwrap_err();
        assert_eq!(err.message(), message);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn the_store_is_warmed_even_when_l1_still_holds_the_key() {
    let store = MemoryStore::new();
    let cache: Cache<String> = Cache::builder()
        .namespace("warm")
        .store(store.clone())
        .l1(breakwater_cache::L1Config::new())
        .build()
        .unwrap();
    cache.set("k", &"old".to_owned()).await.unwrap(); // in L1 and the store
    let storage = cache.storage_key(b"k").unwrap();
    store.delete(&storage).await.unwrap(); // Redis flushed: L1 is not told
    let report = cache
        .warm(
            ["k"],
            |_key: &str| async { Ok::<_, DbDown>(Some("new".to_owned())) },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.cached), (1, 0));
    assert!(
        store.get(&storage).await.unwrap().is_some(),
        "written to the store"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stale_value_standing_in_for_a_failed_load_is_a_failure() {
    let store = MemoryStore::new();
    let cache: Cache<String> = Cache::builder()
        .namespace("warm")
        .store(store.clone())
        .ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .grace(Duration::from_secs(60))
        .max_stale(Duration::from_secs(3600))
        .build()
        .unwrap();
    cache.set("k", &"old".to_owned()).await.unwrap();
    tokio::time::advance(Duration::from_secs(20)).await; // stale, in grace
    let report = cache
        .warm(
            ["k"],
            |_key: &str| async { Err::<Option<String>, _>(DbDown) },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.cached, report.failed), (0, 0, 1));
    let (_, err) = report.first_error.unwrap();
    assert!(err.is_loader(), "{err}");
    assert!(
        err.to_string()
            .ends_with("the cache served stale_loader_failed instead"),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn warmed_entries_keep_the_stale_window_of_the_grace() {
    let store = MemoryStore::new();
    let cache: Cache<String> = Cache::builder()
        .namespace("warm")
        .store(store.clone())
        .ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .grace(Duration::from_secs(60)) // no max_stale: it defaults to grace
        .build()
        .unwrap();
    let report = cache
        .warm(
            ["k"],
            |_key: &str| async { Ok::<_, DbDown>(Some("v".to_owned())) },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.loaded, 1);
    let Stored::Entry(entry) = cache.inspect("k").await.unwrap().stored else {
        panic!("warmed");
    };
    assert_eq!(entry.fresh_for, Some(Duration::from_secs(10)));
    assert_eq!(
        entry.stale_for,
        Some(Duration::from_secs(70)),
        "fresh + grace"
    );
}

#[tokio::test(start_paused = true)]
async fn an_entry_of_another_shape_is_reloaded() {
    let store = MemoryStore::new();
    let old: Cache<u64> = Cache::builder()
        .namespace("warm")
        .store(store.clone())
        .build()
        .unwrap();
    old.set("k", &7).await.unwrap(); // the value type before a deploy
    let report = cache(&store)
        .warm(
            ["k"],
            |_key: &str| async { Ok::<_, DbDown>(Some("seven".to_owned())) },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.cached), (1, 0));
}

#[tokio::test]
async fn without_the_store_keys_fail_and_nothing_loads() {
    // Port 1 on loopback: nothing listens, every read is refused.
    let store = breakwater_cache::RedisStore::connect("redis://127.0.0.1:1/").unwrap();
    let cache: Cache<String> = Cache::builder()
        .namespace("warm")
        .store(store)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let report = cache
        .warm(
            keys(3),
            move |_key: String| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, DbDown>(Some("v".to_owned())) }
            },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.failed), (0, 3));
    assert!(report.first_error.unwrap().1.is_store());
    assert_eq!(calls.load(Ordering::SeqCst), 0, "the database was spared");
}

#[tokio::test(start_paused = true)]
async fn a_missing_key_costs_two_reads() {
    let store = CountingStore::new(MemoryStore::new());
    let cache: Cache<String> = Cache::builder()
        .namespace("warm")
        .store(store.clone())
        .build()
        .unwrap();
    let report = cache
        .warm(
            keys(10),
            |_key: String| async { Ok::<_, DbDown>(Some("v".to_owned())) },
            Warm::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.loaded, 10);
    // The warm-up's check, and the double-check once the lease is held
    // (and the namespace's clear record, read once by the process).
    assert_eq!(store.gets(), 21);
}

/// `warm_with_context`: each key's loader decides its own TTL or not to be
/// cached, and a stale entry's reload sees it and may answer "not
/// modified", which renews it without a new value.
#[tokio::test(start_paused = true)]
async fn a_context_loader_decides_per_key() {
    use breakwater_cache::{ErrorKind, Loaded};
    let store = MemoryStore::new();
    // Stale entries stay a minute, for the reloads to see.
    let cache: Cache<String> = Cache::builder()
        .namespace("warm")
        .store(store.clone())
        .ttl(Duration::from_secs(600))
        .jitter(Jitter::none())
        .max_stale(Duration::from_secs(60))
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;
    let warm = |cache: Cache<String>, seen: Seen| async move {
        let keys = ["short", "skip", "tagged", "bad"];
        cache
            .warm_with_context(
                keys,
                move |key: &str, context| {
                    let seen = Arc::clone(&seen);
                    async move {
                        let stale = context.stale().and_then(|s| s.value().cloned());
                        seen.lock().unwrap().push((key.to_owned(), stale.clone()));
                        Ok::<_, std::io::Error>(match key {
                            "short" => Loaded::value("s".to_owned()).ttl(Duration::from_secs(2)),
                            "skip" => Loaded::value("x".to_owned()).do_not_cache(),
                            "bad" => Loaded::value("b".to_owned()).ttl(Duration::ZERO),
                            // Unchanged once loaded: "not modified".
                            _ if stale.is_some() => Loaded::not_modified(),
                            _ => Loaded::value("t".to_owned())
                                .validator("v1")
                                .ttl(Duration::from_secs(5)),
                        })
                    }
                },
                Warm::new().rate(1_000),
            )
            .await
            .unwrap()
    };
    let report = warm(cache.clone(), Arc::clone(&seen)).await;
    assert_eq!((report.loaded, report.failed), (3, 1), "{report:?}");
    let (key, err) = report.first_error.unwrap();
    assert_eq!((key.as_str(), err.kind()), ("bad", ErrorKind::Config));
    for (key, expected) in [("short", Some("s")), ("skip", None), ("tagged", Some("t"))] {
        let stored = store.get(&cache.storage_key(key).unwrap()).await.unwrap();
        assert_eq!(stored.is_some(), expected.is_some(), "{key}");
    }
    // At 3 s "short" (TTL 2 s) is stale, "tagged" (5 s) fresh.
    tokio::time::advance(Duration::from_secs(3)).await;
    seen.lock().unwrap().clear();
    let report = warm(cache.clone(), Arc::clone(&seen)).await;
    assert_eq!((report.loaded, report.cached), (2, 1), "{report:?}");
    // Past 5 s, "tagged" is reloaded with its stale value in the context,
    // and "not modified" renews it.
    tokio::time::advance(Duration::from_secs(3)).await;
    seen.lock().unwrap().clear();
    let report = warm(cache.clone(), Arc::clone(&seen)).await;
    assert_eq!(report.failed, 1, "{report:?}");
    let tagged: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(key, _)| key == "tagged")
        .cloned()
        .collect();
    assert_eq!(tagged, vec![("tagged".to_owned(), Some("t".to_owned()))]);
    let got = cache.get("tagged").await.unwrap();
    assert_eq!(got.as_deref(), Some("t"));
    let view = cache.inspect("tagged").await.unwrap();
    match view.stored {
        Stored::Entry(entry) => assert!(entry.fresh_for.is_some(), "{entry:?}"),
        other => panic!("{other:?}"),
    }
}
