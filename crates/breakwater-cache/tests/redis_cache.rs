//! The cache on a real, private `redis-server`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, Jitter, RedisStore, RedisStoreConfig, Store};
use support::{RedisServer, command_calls, redis_store};

fn catalog(store: &RedisStore) -> Cache<String> {
    Cache::builder()
        .namespace("catalog")
        .store(store.clone())
        .ttl(Duration::from_secs(300))
        .jitter(Jitter::ratio(0.2))
        .build()
        .unwrap()
}

#[tokio::test]
async fn thousand_writes_leave_pttls_inside_the_jitter_bounds_and_not_all_equal() {
    let (server, store) = redis_store().await;
    let cache = catalog(&store);
    for i in 0..1_000 {
        cache
            .set(format!("p:{i}"), &format!("product {i}"))
            .await
            .unwrap();
    }
    let (lo, hi) = Jitter::ratio(0.2).bounds(Duration::from_secs(300));
    let mut pttls = Vec::with_capacity(1_000);
    for i in 0..1_000 {
        let reply = server
            .command(&["PTTL", &format!("bw:catalog:v:{{p:{i}}}")])
            .unwrap();
        let ms: u64 = reply
            .parse()
            .unwrap_or_else(|_| panic!("PTTL reply {reply:?}"));
        pttls.push(ms);
    }
    // Redis counts down from the written TTL; allow the time this test has
    // taken so far below the lower bound, nothing above the upper one.
    let slack = 10_000;
    assert!(
        pttls
            .iter()
            .all(|&ms| ms + slack >= lo.as_millis() as u64 && ms <= hi.as_millis() as u64),
        "a PTTL left [{lo:?}, {hi:?}]: min {:?} max {:?}",
        pttls.iter().min(),
        pttls.iter().max()
    );
    let distinct: std::collections::BTreeSet<_> = pttls.iter().map(|ms| ms / 1000).collect();
    assert!(
        distinct.len() > 60,
        "PTTLs cluster in {} seconds",
        distinct.len()
    );
}

/// Lets a new process settle: once its bus listener is subscribed it
/// reads the namespace's clear record (one `GET`, in the background, once
/// per process and bus drop), which a count of a call's commands must not
/// include.
async fn settled() {
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
}

/// The commands the cache sent since the test's `CONFIG RESETSTAT`, by
/// name (the test's own `RESETSTAT` and `INFO` left out).
fn cache_calls(server: &RedisServer) -> Vec<(String, u64)> {
    command_calls(server)
        .into_iter()
        .filter(|(name, _)| name != "config|resetstat" && name != "info")
        .collect()
}

#[tokio::test]
async fn a_hit_costs_exactly_one_redis_command() {
    let (server, store) = redis_store().await;
    let cache = catalog(&store);
    cache.set("p:1", &"one".to_string()).await.unwrap();

    settled().await;
    server.command(&["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(cache.get("p:1").await.unwrap().as_deref(), Some("one"));
    let v = cache
        .get_or_load("p:1", || async {
            Ok::<_, std::io::Error>(Some("loaded".to_string()))
        })
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("one"));

    let calls = cache_calls(&server);
    assert_eq!(
        calls,
        vec![("get".to_string(), 2)],
        "two hits, two GETs, nothing else"
    );
}

/// A tagged hit whose call names the entry's tags is one command: the
/// entry and its tags' counters in one `MGET`. A tag the loader chose
/// (not named by the call) costs its counter's read after it, and is
/// checked: invalidating it makes the entry a miss.
#[tokio::test]
async fn a_tagged_hit_is_one_command_and_a_chosen_tag_is_still_checked() {
    let (server, store) = redis_store().await;
    let cache = catalog(&store);
    let tags = ["product:1", "catalog"];
    cache
        .entry("p:1")
        .tags(tags)
        .set(&"one".to_string())
        .await
        .unwrap();
    // The loader chooses a third tag of its own; p:2 is read by calls
    // naming `tags` with such a loader, p:1 by plain ones.
    let chosen = |value: &'static str| {
        move |_: breakwater_cache::LoadContext<String>| async move {
            Ok::<_, std::io::Error>(
                breakwater_cache::Loaded::value(value.to_string()).tags(["supplier:9"]),
            )
        }
    };
    let read_two = |value: &'static str| {
        let cache = &cache;
        async move {
            let got = cache
                .entry("p:2")
                .tags(tags)
                .get_or_load_with_context_meta(chosen(value))
                .await
                .unwrap();
            (got.value, got.served)
        }
    };
    let read_one = || async {
        let got = cache
            .entry("p:1")
            .tags(tags)
            .get_or_load_with_meta(|| async { Ok::<_, std::io::Error>(Some("loaded".to_string())) })
            .await
            .unwrap();
        (got.value, got.served)
    };
    let (hit, loaded) = (
        breakwater_cache::Served::Hit,
        breakwater_cache::Served::Loaded,
    );
    let some = |v: &str| Some(v.to_string());
    // A chosen tag's counter made during the load (or within 100 ms
    // before it) leaves that load unwritten: the counter may have been
    // lost and made again while it ran. A load that begins later is
    // written.
    for pause in [200, 0] {
        assert_eq!(read_two("two").await, (some("two"), loaded));
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }

    settled().await;
    server.command(&["CONFIG", "RESETSTAT"]).unwrap();
    for _ in 0..3 {
        assert_eq!(read_one().await, (some("one"), hit));
    }
    assert_eq!(
        cache_calls(&server),
        vec![("mget".to_string(), 3)],
        "three tagged hits, three MGETs, nothing else"
    );

    server.command(&["CONFIG", "RESETSTAT"]).unwrap();
    assert_eq!(read_two("reloaded").await, (some("two"), hit));
    let mut calls = cache_calls(&server);
    calls.sort();
    assert_eq!(
        calls,
        vec![("get".to_string(), 1), ("mget".to_string(), 1)],
        "the chosen tag's counter is read after the entry"
    );
    cache.invalidate_tag("supplier:9").await.unwrap();
    assert_eq!(read_two("reloaded").await, (some("reloaded"), loaded));
    // A named tag invalidated: the next tagged read misses too.
    cache.invalidate_tag("catalog").await.unwrap();
    assert_eq!(read_one().await, (some("loaded"), loaded));
}

#[tokio::test]
async fn store_clock_agrees_with_redis_time() {
    let (server, store) = redis_store().await;
    assert_clock_is_redis_time(&server, &store);
}

/// `store.now_ms()` brackets the server's `TIME` (within 5 ms), five times
/// over, and the store knows its clock to within 5 ms.
fn assert_clock_is_redis_time(server: &RedisServer, store: &RedisStore) {
    for _ in 0..5 {
        let before = store.now_ms();
        let reply = server.command(&["TIME"]).unwrap();
        let after = store.now_ms();
        let mut parts = reply.lines().map(|p| p.parse::<u64>().unwrap());
        let redis_ms = parts.next().unwrap() * 1000 + parts.next().unwrap() / 1000;
        let margin = 5;
        assert!(
            before <= redis_ms + margin && redis_ms <= after + margin,
            "store clock [{before}, {after}] vs redis TIME {redis_ms}"
        );
    }
    let uncertainty = store.clock_uncertainty().expect("clock sampled");
    assert!(uncertainty < Duration::from_millis(5), "{uncertainty:?}");
}

#[tokio::test]
async fn loads_once_then_serves_other_processes_caches_from_redis() {
    let (server, store) = redis_store().await;
    let a = catalog(&store);
    // A second cache with its own connection, as another process would have.
    let other = support::connect(&server).await;
    let b = catalog(&other);
    let calls = Arc::new(AtomicUsize::new(0));
    for cache in [&a, &b, &a] {
        let calls = Arc::clone(&calls);
        let v = cache
            .get_or_load("p:7", move || {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, std::io::Error>(Some("seven".to_string())) }
            })
            .await
            .unwrap();
        assert_eq!(v.as_deref(), Some("seven"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    b.invalidate("p:7").await.unwrap();
    assert_eq!(a.get("p:7").await.unwrap(), None);
}

#[tokio::test]
async fn corrupt_bytes_in_redis_are_a_miss_and_get_repaired() {
    let (server, store) = redis_store().await;
    let cache = catalog(&store);
    server
        .command(&[
            "SET",
            "bw:catalog:v:{p:1}",
            "\u{1}garbage that is no envelope",
        ])
        .unwrap();
    assert_eq!(cache.get("p:1").await.unwrap(), None);
    let v = cache
        .get_or_load("p:1", || async {
            Ok::<_, std::io::Error>(Some("fresh".to_string()))
        })
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("fresh"));
    assert_eq!(cache.get("p:1").await.unwrap().as_deref(), Some("fresh"));
}

#[tokio::test]
async fn redis_down_at_startup_degrades_to_direct_loads_and_recovers() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let config = RedisStoreConfig::default()
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200));
    let store = RedisStore::connect_with(&url, config).unwrap();
    let cache = catalog(&store); // builds without Redis

    let err = cache.get("p:1").await.unwrap_err();
    assert!(err.is_store(), "{err}");
    let calls = Arc::new(AtomicUsize::new(0));
    let load = |calls: &Arc<AtomicUsize>| {
        let calls = Arc::clone(calls);
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(Some("direct".to_string())) }
        }
    };
    let v = cache.get_or_load("p:1", load(&calls)).await.unwrap();
    assert_eq!(v.as_deref(), Some("direct"));

    server.restart();
    // The next request connects; bounded retries, no timing assertion.
    let mut attempts = 0;
    while cache.set("p:1", &"cached".to_string()).await.is_err() {
        attempts += 1;
        assert!(attempts < 50, "cache never reconnected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let v = cache.get_or_load("p:1", load(&calls)).await.unwrap();
    assert_eq!(v.as_deref(), Some("cached"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The reconnect sampled the restarted server's clock.
    assert_clock_is_redis_time(&server, &store);
}

#[tokio::test]
async fn negative_entries_have_their_own_ttl_in_redis() {
    let (server, store) = redis_store().await;
    let cache: Cache<String> = Cache::builder()
        .namespace("users")
        .store(store.clone())
        .ttl(Duration::from_secs(3600))
        .negative_ttl(Duration::from_secs(20))
        .jitter(Jitter::none())
        .build()
        .unwrap();
    let v = cache
        .get_or_load("u:404", || async {
            Ok::<Option<String>, std::io::Error>(None)
        })
        .await
        .unwrap();
    assert_eq!(v, None);
    let pttl: u64 = server
        .command(&["PTTL", "bw:users:v:{u:404}"])
        .unwrap()
        .parse()
        .unwrap();
    assert!(pttl <= 20_000 && pttl > 15_000, "{pttl}");
    let raw = cache.storage_key(b"u:404").unwrap();
    assert!(store.get(&raw).await.unwrap().is_some());
}

#[tokio::test]
async fn a_lease_written_by_an_earlier_build_is_never_altered() {
    let (_server, store) = redis_store().await;
    let lease = b"bw:catalog:l:{p:1}";
    // Earlier builds stored the bare 16-byte token.
    let old = b"0123456789abcdef";
    store
        .set(lease, old, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        !store
            .acquire_lease(lease, b"fedcba9876543210", Duration::from_secs(10))
            .await
            .unwrap()
            .is_acquired()
    );
    assert_eq!(store.get(lease).await.unwrap().as_deref(), Some(&old[..]));
}

/// Reads of distinct keys that meet while a read is in the air go out
/// together as one `MGET` (the cache's read queue); each caller still gets
/// its own key's value.
#[tokio::test]
async fn reads_of_distinct_keys_that_meet_go_out_as_mgets() {
    let (server, store) = redis_store().await;
    let cache = catalog(&store);
    for i in 0..200 {
        cache
            .set(format!("p:{i}"), &format!("product {i}"))
            .await
            .unwrap();
    }
    settled().await;
    server.command(&["CONFIG", "RESETSTAT"]).unwrap();
    let reads = (0..200).map(|i| {
        let cache = cache.clone();
        async move {
            let got = cache
                .get_or_load(format!("p:{i}"), || async {
                    Ok::<_, std::io::Error>(Some("loaded".to_string()))
                })
                .await
                .unwrap();
            assert_eq!(got, Some(format!("product {i}")), "key p:{i}");
        }
    });
    futures_util::future::join_all(reads).await;
    let calls: std::collections::BTreeMap<_, _> = cache_calls(&server).into_iter().collect();
    let gets = calls.get("get").copied().unwrap_or(0);
    let mgets = calls.get("mget").copied().unwrap_or(0);
    assert!(mgets >= 1, "no MGET: {calls:?}");
    assert!(
        gets + mgets < 20,
        "200 reads at once took {gets} GETs and {mgets} MGETs"
    );
    assert_eq!(
        calls.len(),
        usize::from(gets > 0) + 1,
        "only reads: {calls:?}"
    );
}

/// Queued reads whose callers went away neither break the others nor
/// leave the queue thinking reads are still in the air: a lone read
/// afterwards is one `GET` again.
#[tokio::test]
async fn cancelled_queued_reads_leave_the_queue_working() {
    let (server, store) = redis_store().await;
    let cache = catalog(&store);
    for i in 0..100 {
        cache
            .set(format!("p:{i}"), &format!("product {i}"))
            .await
            .unwrap();
    }
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .get_or_load(format!("p:{i}"), || async {
                        Ok::<_, std::io::Error>(Some("loaded".to_string()))
                    })
                    .await
            })
        })
        .collect();
    // Let every task start its read (and most of them queue), then cancel
    // every other one.
    tokio::task::yield_now().await;
    for task in tasks.iter().step_by(2) {
        task.abort();
    }
    for (i, task) in tasks.into_iter().enumerate() {
        match task.await {
            Ok(got) => assert_eq!(got.unwrap(), Some(format!("product {i}"))),
            Err(err) => assert!(err.is_cancelled() && i % 2 == 0, "task {i}: {err}"),
        }
    }
    settled().await;
    server.command(&["CONFIG", "RESETSTAT"]).unwrap();
    let got = cache
        .get_or_load("p:7", || async {
            Ok::<_, std::io::Error>(Some("loaded".to_string()))
        })
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("product 7"));
    let calls = cache_calls(&server);
    assert_eq!(
        calls,
        vec![("get".to_string(), 1)],
        "a lone read is one GET"
    );
}

/// Process B invalidates `k` while process A loads it (500 ms loader), then
/// writes a marker key; A's calls that start once the marker is seen must
/// not get the old value, with L1 off (20 rounds). With L1 on, A's L1 hears
/// of it on the bus: the stale answers after the marker, and how long after
/// it they came, are reported.
async fn revoked_loads_across_processes(l1: bool) -> (usize, Duration) {
    let server = RedisServer::start();
    let (a_store, b_store) = (
        support::connect(&server).await,
        support::connect(&server).await,
    );
    let build = |store: &RedisStore| {
        let builder = Cache::<u64>::builder()
            .namespace("revoked")
            .store(store.clone())
            .ttl(Duration::from_secs(300))
            .jitter(Jitter::none());
        if l1 {
            builder.l1(breakwater_cache::L1Config::new())
        } else {
            builder
        }
        .build()
        .unwrap()
    };
    let (a, b) = (build(&a_store), build(&b_store));
    let row = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let loader = |delay: Duration| {
        let row = Arc::clone(&row);
        move || {
            let row = Arc::clone(&row);
            async move {
                let version = row.load(Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                Ok::<_, std::io::Error>(Some(version))
            }
        }
    };
    let (mut stale, mut latest) = (0, Duration::ZERO);
    for round in 0..20 {
        let key = format!("k{round}");
        let marker = format!("marker{round}");
        let first = {
            let (a, key, load) = (a.clone(), key.clone(), loader(Duration::from_millis(500)));
            tokio::spawn(async move { a.get_or_load(key, load).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let new = row.fetch_add(1, Ordering::SeqCst) + 1;
        b.invalidate(&key).await.unwrap();
        b_store
            .set(marker.as_bytes(), b"1", Duration::from_secs(60))
            .await
            .unwrap();
        // A sees the marker, then reads the key, until the old load is done.
        assert!(a_store.get(marker.as_bytes()).await.unwrap().is_some());
        let seen = tokio::time::Instant::now();
        while !first.is_finished() {
            let got = a
                .get_or_load(&key, loader(Duration::from_millis(10)))
                .await
                .unwrap();
            if got < Some(new) {
                stale += 1;
                latest = latest.max(seen.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            first.await.unwrap().unwrap() < Some(new),
            "the first call started before"
        );
        let after = a.get_or_load(&key, loader(Duration::ZERO)).await.unwrap();
        assert_eq!(after, Some(new), "round {round}: after the old load");
    }
    (stale, latest)
}

#[tokio::test]
async fn a_load_revoked_in_another_process_is_not_served_after_the_marker() {
    let (stale, _) = revoked_loads_across_processes(false).await;
    assert_eq!(stale, 0, "calls after the marker got the old value");
}

#[tokio::test]
async fn a_load_revoked_in_another_process_with_l1_reports_its_stale_answers() {
    let (stale, latest) = revoked_loads_across_processes(true).await;
    eprintln!("L1 on: {stale} stale answers after the marker, the last {latest:?} after it");
    assert_eq!(stale, 0, "the fence refused the write: L1 never kept it");
}
