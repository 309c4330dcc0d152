//! Version bumps: a cache of version `n` stores apart from version `n - 1`,
//! and inside its version transition serves the previous version's entry
//! (as stale) while background loads, under the origin's bulkhead, fill
//! its own. Paused time, the memory store.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, Jitter, LimitConfig, MemoryStore, Served, StaleReason, Store};

const KEYS: usize = 1_000;

fn builder(store: &MemoryStore, version: u32) -> breakwater_cache::CacheBuilder<String> {
    Cache::<String>::builder()
        .namespace("products")
        .store(store.clone())
        .version(version)
        .ttl(Duration::from_secs(3_600))
        .jitter(Jitter::none())
}

/// Loads running now and the most that ever ran at once.
#[derive(Default)]
struct Gauge {
    now: AtomicUsize,
    most: AtomicUsize,
    calls: AtomicUsize,
}

#[tokio::test(start_paused = true)]
async fn a_bump_under_traffic_serves_the_previous_version_and_loads_within_the_bulkhead() {
    let store = MemoryStore::new();
    let v1 = builder(&store, 1).build().unwrap();
    v1.set_many((0..KEYS).map(|k| (format!("p{k}"), format!("v1:{k}"))))
        .await
        .unwrap();

    let v2 = builder(&store, 2)
        .version_transition(Duration::from_secs(600))
        .limit(
            LimitConfig::new()
                .max_concurrent(8)
                .queue_wait(Duration::from_millis(100)),
        )
        .build()
        .unwrap();
    let gauge = Arc::new(Gauge::default());
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..20 {
        let (v2, gauge) = (v2.clone(), Arc::clone(&gauge));
        callers.spawn(async move {
            let mut served = Vec::new();
            for i in 0..200 {
                let k = (caller * 37 + i * 13) % KEYS;
                let gauge = Arc::clone(&gauge);
                let fetched = v2
                    .get_or_load_with_meta(format!("p{k}"), move || async move {
                        gauge.calls.fetch_add(1, Ordering::SeqCst);
                        let now = gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
                        gauge.most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        gauge.now.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, std::io::Error>(Some(format!("v2:{k}")))
                    })
                    .await;
                let fetched = fetched.expect("no call fails during a version bump");
                let value = fetched.value.expect("every key has a value");
                assert!(
                    value == format!("v1:{k}") || value == format!("v2:{k}"),
                    "{value} for key {k}"
                );
                served.push(fetched.served);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            served
        });
    }
    let served: Vec<Served> = callers.join_all().await.into_iter().flatten().collect();
    let previous = served
        .iter()
        .filter(|s| {
            **s == Served::Stale {
                reason: StaleReason::PreviousVersion,
            }
        })
        .count();
    assert!(previous > 0, "{served:?}");
    assert!(
        gauge.most.load(Ordering::SeqCst) <= 8,
        "loads stayed within the bulkhead"
    );
    let stats = v2.stats();
    assert_eq!(stats.errors_total(), 0, "{stats}");
    assert_eq!(stats.loaded, 0, "nobody waited for a load: {stats}");
    // Once the background loads have landed, version 2 serves its own.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for k in [0, 13, 999] {
        let got = v2
            .get_or_load_with_meta(format!("p{k}"), || async {
                Ok::<_, std::io::Error>(Some("unused".to_owned()))
            })
            .await
            .unwrap();
        if matches!(got.served, Served::Hit | Served::L1Hit) {
            assert_eq!(got.value.as_deref(), Some(format!("v2:{k}").as_str()));
        }
    }
    // Version 1's entries are untouched: its processes still read them.
    assert_eq!(v1.get("p0").await.unwrap().as_deref(), Some("v1:0"));
    // Each key was loaded at most once.
    assert!(gauge.calls.load(Ordering::SeqCst) <= KEYS, "{stats}");
}

#[tokio::test(start_paused = true)]
async fn an_invalidation_in_the_transition_removes_the_previous_version_too() {
    let store = MemoryStore::new();
    let v1 = builder(&store, 1).build().unwrap();
    v1.set("p1", &"v1:old".to_owned()).await.unwrap();
    let v2 = builder(&store, 2)
        .version_transition(Duration::from_secs(600))
        .build()
        .unwrap();
    v2.invalidate("p1").await.unwrap();
    let got = v2
        .get_or_load_with_meta("p1", || async {
            Ok::<_, std::io::Error>(Some("fresh".to_owned()))
        })
        .await
        .unwrap();
    assert_eq!(
        (got.value.as_deref(), got.served),
        (Some("fresh"), Served::Loaded)
    );
    assert_eq!(v1.get("p1").await.unwrap(), None, "gone in version 1 too");
}

#[tokio::test(start_paused = true)]
async fn invalidate_many_in_the_transition_removes_the_previous_versions_entries_too() {
    let store = MemoryStore::new();
    let v1 = builder(&store, 1).build().unwrap();
    v1.set_many((0..10).map(|i| (format!("p{i}"), format!("v1:{i}"))))
        .await
        .unwrap();
    let v2 = builder(&store, 2)
        .version_transition(Duration::from_secs(600))
        .build()
        .unwrap();
    v2.invalidate_many((0..5).map(|i| format!("p{i}")))
        .await
        .unwrap();
    for i in 0..10 {
        let left = v1.get(format!("p{i}")).await.unwrap();
        let expected = (i >= 5).then(|| format!("v1:{i}"));
        assert_eq!(left, expected, "version 1's p{i}");
    }
    for i in 0..5 {
        let got = v2
            .get_or_load_with_meta(format!("p{i}"), || async {
                Ok::<_, std::io::Error>(Some("fresh".to_owned()))
            })
            .await
            .unwrap();
        assert_eq!(
            (got.value.as_deref(), got.served),
            (Some("fresh"), Served::Loaded)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn after_the_window_or_for_an_undecodable_entry_a_miss_loads() {
    let store = MemoryStore::new();
    // Version 1 stored numbers; version 2 stores strings.
    let v1 = Cache::<u64>::builder()
        .namespace("products")
        .store(store.clone())
        .version(1)
        .build()
        .unwrap();
    v1.set("n", &7).await.unwrap();
    builder(&store, 1)
        .build()
        .unwrap()
        .set("s", &"v1:s".to_owned())
        .await
        .unwrap();
    let v2 = builder(&store, 2)
        .version_transition(Duration::from_secs(60))
        .build()
        .unwrap();
    let load = || async { Ok::<_, std::io::Error>(Some("v2".to_owned())) };
    let got = v2.get_or_load_with_meta("n", load).await.unwrap();
    assert_eq!(got.served, Served::Loaded, "7 is not a string: a miss");

    tokio::time::advance(Duration::from_secs(61)).await;
    let got = v2.get_or_load_with_meta("s", load).await.unwrap();
    assert_eq!(
        (got.value.as_deref(), got.served),
        (Some("v2"), Served::Loaded),
        "past the window the previous version is not read"
    );
}

#[tokio::test(start_paused = true)]
async fn versions_store_apart_under_their_own_keys() {
    let store = MemoryStore::new();
    let v0 = builder(&store, 0).build().unwrap();
    let v3 = builder(&store, 3).build().unwrap();
    assert_eq!(v0.storage_key("k").unwrap(), b"bw:products:v:{k}");
    assert_eq!(v3.storage_key("k").unwrap(), b"bw:products@3:v:{k}");
    v0.set("k", &"zero".to_owned()).await.unwrap();
    assert_eq!(v3.get("k").await.unwrap(), None);
    assert!(store.get(b"bw:products:v:{k}").await.unwrap().is_some());
}

#[test]
fn a_transition_needs_a_version_and_a_bounded_window() {
    let err = Cache::<String>::builder()
        .version_transition(Duration::from_secs(60))
        .build()
        .unwrap_err();
    assert_eq!(err.key(), Some("version_transition"), "{err}");
    let err = Cache::<String>::builder()
        .version(2)
        .version_transition(Duration::from_secs(8 * 24 * 3600))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("at most 7 days"), "{err}");
}

/// The previous version's entry is judged on the store's clock: past its
/// stale window it cannot stand in, even if its bytes are still stored
/// (a longer physical TTL, a writer with another clock).
#[tokio::test(start_paused = true)]
async fn a_previous_entry_past_its_stale_window_does_not_stand_in() {
    let store = MemoryStore::new();
    let v1 = builder(&store, 1)
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    v1.set("k", &"v1:k".to_owned()).await.unwrap();
    let key = v1.storage_key("k").unwrap();
    let bytes = store.get(&key).await.unwrap().unwrap();
    tokio::time::advance(Duration::from_secs(20)).await;
    store
        .set(&key, &bytes, Duration::from_secs(3_600))
        .await
        .unwrap();
    let v2 = builder(&store, 2)
        .version_transition(Duration::from_secs(600))
        .build()
        .unwrap();
    let got = v2
        .get_or_load_with_meta("k", || async {
            Ok::<_, std::io::Error>(Some("v2:k".to_owned()))
        })
        .await
        .unwrap();
    assert_eq!(
        (got.value.as_deref(), got.served),
        (Some("v2:k"), Served::Loaded)
    );
}

#[tokio::test(start_paused = true)]
async fn get_many_in_the_transition_serves_the_previous_version_and_refreshes_in_one_batch() {
    let store = MemoryStore::new();
    let v1 = builder(&store, 1).build().unwrap();
    v1.set_many((0..10).map(|k| (format!("p{k}"), format!("v1:{k}"))))
        .await
        .unwrap();
    let v2 = builder(&store, 2)
        .version_transition(Duration::from_secs(600))
        .build()
        .unwrap();
    let calls: Arc<std::sync::Mutex<Vec<Vec<String>>>> = Arc::default();
    let loader = {
        let calls = Arc::clone(&calls);
        move |keys: Vec<String>| {
            calls.lock().unwrap().push(keys.clone());
            async move {
                Ok::<_, std::io::Error>(
                    keys.into_iter()
                        .map(|k| {
                            let v = format!("v2:{}", &k[1..]);
                            (k, v)
                        })
                        .collect::<Vec<_>>(),
                )
            }
        }
    };
    // p0..p9 in version 1, p10 nowhere.
    let keys: Vec<String> = (0..11).map(|k| format!("p{k}")).collect();
    let got = v2.get_many_with_meta(keys.clone(), loader.clone()).await;
    for (k, g) in got.iter().enumerate().take(10) {
        let g = g.as_ref().unwrap();
        assert_eq!(g.value, Some(format!("v1:{k}")));
        assert_eq!(
            g.served,
            Served::Stale {
                reason: StaleReason::PreviousVersion
            }
        );
    }
    let last = got[10].as_ref().unwrap();
    assert_eq!(
        (last.value.as_deref(), last.served),
        (Some("v2:10"), Served::Loaded)
    );
    // One foreground call for p10, one background batch for p0..p9.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut seen = calls.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], keys[..10].to_vec());
    assert_eq!(seen[1], vec!["p10".to_owned()]);
    let again = v2.get_many(keys.clone(), loader).await.unwrap();
    for (k, value) in again.iter().enumerate() {
        assert_eq!(value.as_deref(), Some(format!("v2:{k}").as_str()));
    }
}

/// A rolling bump: processes of version 1 (the code deployed before: no
/// transition) and of version 2 (in its transition) share a store. A
/// version-1 process changes the row and invalidates the key; every
/// version-2 read after that returns the new row, whether version 1 had an
/// entry of its own or not, and whether version 2's entry was written by a
/// load or by a `set`, with L1 off and on.
async fn a_rolling_bump_hears_the_previous_version(l1: bool) {
    let store = MemoryStore::new();
    let old = builder(&store, 1).build().unwrap();
    let mut new = builder(&store, 2).version_transition(Duration::from_secs(600));
    if l1 {
        new = new.l1(breakwater_cache::L1Config::new());
    }
    let new = new.build().unwrap();
    let row = Arc::new(std::sync::Mutex::new(String::from("r1")));
    let loader = || {
        let row = Arc::clone(&row);
        move || {
            let row = row.lock().unwrap().clone();
            async move { Ok::<_, std::io::Error>(Some(row)) }
        }
    };
    let update = |to: &str| *row.lock().unwrap() = to.to_string();
    for (case, key) in ["no-old-entry", "old-entry", "set-by-new"]
        .iter()
        .enumerate()
    {
        update(&format!("{key}:before"));
        if case == 1 {
            // Version 1 has its own entry of the key.
            assert_eq!(
                old.get_or_load(*key, loader()).await.unwrap(),
                Some(format!("{key}:before"))
            );
        }
        if case == 2 {
            new.set(*key, &format!("{key}:before")).await.unwrap();
        }
        // Version 2's entry is in place (loaded, or set), served as a hit.
        let got = new.get_or_load_with_meta(*key, loader()).await.unwrap();
        assert_eq!(got.value, Some(format!("{key}:before")), "{key}");
        // (Where version 1's entry stood in, the background refresh lands.)
        tokio::time::sleep(Duration::from_millis(10)).await;
        let again = new.get_or_load_with_meta(*key, loader()).await.unwrap();
        let hit = if l1 { Served::L1Hit } else { Served::Hit };
        assert_eq!(again.served, hit, "{key}: {again:?}");
        // Version 1 changes the row and invalidates.
        update(&format!("{key}:after"));
        old.invalidate(*key).await.unwrap();
        tokio::task::yield_now().await;
        let after = new.get_or_load_with_meta(*key, loader()).await.unwrap();
        assert_eq!(
            after.value,
            Some(format!("{key}:after")),
            "{key}, l1 {l1}: version 2 after version 1's invalidation: {after:?}"
        );
    }
    // Version 1's own reads see nothing wrong beside version 2's pins: a
    // placeholder reads as a miss, loaded from the row.
    update("fresh:after");
    assert_eq!(old.get("fresh").await.unwrap(), None);
    new.get_or_load("fresh", loader()).await.unwrap();
    assert_eq!(
        old.get("fresh").await.unwrap(),
        None,
        "a placeholder is no value"
    );
    assert_eq!(
        old.get_or_load("fresh", loader()).await.unwrap(),
        Some("fresh:after".to_string())
    );
}

#[tokio::test(start_paused = true)]
async fn a_rolling_bump_hears_the_previous_version_without_l1() {
    a_rolling_bump_hears_the_previous_version(false).await;
}

#[tokio::test(start_paused = true)]
async fn a_rolling_bump_hears_the_previous_version_with_l1() {
    a_rolling_bump_hears_the_previous_version(true).await;
}

/// The rolling bump on a real Redis: 2 processes of version 1 (no
/// transition: the code deployed before) and 2 of version 2 (in their
/// transition), each with its own connection. A version-1 process changes
/// the row, invalidates the key and writes a marker; every version-2 read
/// that starts once the marker is seen (with L1: and the message has had
/// 100 ms to arrive) must return the new row. Returns the stale reads and
/// how many reads were made.
async fn rolling_bump_on_redis(l1: bool) -> (usize, usize) {
    let server = support::RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(support::connect(&server).await);
    }
    let cache = |store: &breakwater_cache::RedisStore, version: u32| {
        let mut builder = Cache::<u64>::builder()
            .namespace("rolling")
            .store(store.clone())
            .version(version)
            .ttl(Duration::from_secs(300))
            .jitter(Jitter::none());
        if version == 2 {
            builder = builder.version_transition(Duration::from_secs(60));
        }
        if l1 {
            builder = builder.l1(breakwater_cache::L1Config::new());
        }
        builder.build().unwrap()
    };
    let old = [cache(&stores[0], 1), cache(&stores[1], 1)];
    let new = [cache(&stores[2], 2), cache(&stores[3], 2)];
    let row = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let loader = || {
        let row = Arc::clone(&row);
        move || {
            let version = row.load(Ordering::SeqCst);
            async move { Ok::<_, std::io::Error>(Some(version)) }
        }
    };
    let (mut stale, mut reads) = (0, 0);
    for round in 0..30 {
        let key = format!("p{round}");
        // Every process has the key: version 1 (in odd rounds only, so
        // version 2 also loads beside nothing) and version 2.
        if round % 2 == 1 {
            for c in &old {
                c.get_or_load(&key, loader()).await.unwrap();
            }
        }
        for _ in 0..3 {
            for c in &new {
                c.get_or_load(&key, loader()).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let changed = row.fetch_add(1, Ordering::SeqCst) + 1;
        old[round % 2].invalidate(&key).await.unwrap();
        let marker = format!("marker:{round}");
        stores[0]
            .set(marker.as_bytes(), b"1", Duration::from_secs(60))
            .await
            .unwrap();
        for (c, store) in new.iter().zip(&stores[2..]) {
            assert!(store.get(marker.as_bytes()).await.unwrap().is_some());
            if l1 {
                // An L1 copy is dropped when the invalidation's message
                // reaches this process (coherence line 3: a millisecond or
                // two), which seeing the marker does not imply: on a busy
                // machine its listener may not have run yet (1 in 4 runs
                // had one process's 10 reads stale). Without the transition's
                // listener every read stays stale (600 of 600).
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for _ in 0..10 {
                reads += 1;
                if c.get_or_load(&key, loader()).await.unwrap() < Some(changed) {
                    stale += 1;
                }
            }
        }
    }
    (stale, reads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_bump_on_redis_serves_nothing_stale_after_the_marker_without_l1() {
    let (stale, reads) = rolling_bump_on_redis(false).await;
    eprintln!("L1 off: {stale} of {reads} version-2 reads after the marker were stale");
    assert_eq!(stale, 0, "{stale} of {reads}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_bump_on_redis_serves_nothing_stale_after_the_marker_with_l1() {
    let (stale, reads) = rolling_bump_on_redis(true).await;
    eprintln!("L1 on: {stale} of {reads} version-2 reads after the marker were stale");
    assert_eq!(stale, 0, "{stale} of {reads}");
}

/// The previous version's `expire` of a key whose entry there is a
/// placeholder (this version's `set` left it) or stale already still
/// changes its bytes, so this version's entry pinned beside them is
/// revoked: the simulation's version round found this version serving
/// the value from before the previous version's write as a fresh `Hit`.
#[tokio::test(start_paused = true)]
async fn an_expire_by_the_previous_version_revokes_this_versions_entry() {
    let store = MemoryStore::new();
    let v1 = builder(&store, 1).build().unwrap();
    let v2 = builder(&store, 2)
        .version_transition(Duration::from_secs(600))
        .build()
        .unwrap();
    let load = |value: &'static str| {
        move || async move { Ok::<_, std::io::Error>(Some(value.to_owned())) }
    };
    // This version's set leaves a placeholder in version 1's key.
    v2.set("p1", &"old".to_owned()).await.unwrap();
    v1.expire("p1").await.unwrap();
    let got = v2.get_or_load_with_meta("p1", load("new")).await.unwrap();
    assert_eq!(
        (got.value.as_deref(), got.served),
        (Some("new"), Served::Loaded)
    );
    // Version 1's entry stale already (past its TTL, in its stale window).
    let v1 = builder(&store, 1)
        .ttl(Duration::from_secs(10))
        .max_stale(Duration::from_secs(600))
        .build()
        .unwrap();
    v1.set("p2", &"v1".to_owned()).await.unwrap();
    tokio::time::advance(Duration::from_secs(20)).await;
    let got = v2.get_or_load_with_meta("p2", load("old")).await.unwrap();
    assert_eq!(got.value.as_deref(), Some("old"));
    v1.expire("p2").await.unwrap();
    let got = v2.get_or_load_with_meta("p2", load("new")).await.unwrap();
    assert_eq!(
        (got.value.as_deref(), got.served),
        (Some("new"), Served::Loaded)
    );
}

/// A clear by the previous version's processes changes none of its
/// entries' bytes, so this version's entries pinned beside them would
/// stand: this version hears it and clears its own namespace the same
/// way, and acknowledges it (the previous version's `clear` counts this
/// version's listener among its receivers).
#[tokio::test(start_paused = true)]
async fn a_clear_by_the_previous_version_clears_this_one_too() {
    use breakwater_cache::ClearMode;
    let store = MemoryStore::new();
    let v1 = builder(&store, 1).build().unwrap();
    let v2 = builder(&store, 2)
        .version_transition(Duration::from_secs(600))
        .build()
        .unwrap();
    let load = |value: &'static str| {
        move || async move { Ok::<_, std::io::Error>(Some(value.to_owned())) }
    };
    for key in ["p1", "p2"] {
        let got = v2.get_or_load(key, load("old")).await.unwrap();
        assert_eq!(got.as_deref(), Some("old"));
    }
    // Returns once every listener, this version's included, took it.
    v1.clear(ClearMode::Hard).await.unwrap();
    for key in ["p1", "p2"] {
        let got = v2.get_or_load_with_meta(key, load("new")).await.unwrap();
        assert_eq!(
            (got.value.as_deref(), got.served),
            (Some("new"), Served::Loaded),
            "{key}"
        );
    }
}
