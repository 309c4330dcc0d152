//! The cache on a private three-node Redis Cluster: one load per key across
//! "processes" (separate stores, own connections), waiters woken by a fill
//! on another node, fenced writes, and a node outage. The `Store` contract
//! runs on the cluster too (`store_contract.rs`).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{BreakerConfig, BreakerState, Cache, RedisStore, RedisStoreConfig, Store};
use support::{RedisCluster, cluster_store, connect_cluster, slow_loader};

fn cache_on<S: Store + Clone>(store: &S) -> Cache<String> {
    Cache::builder()
        .namespace("cluster")
        .store(store.clone())
        .ttl(Duration::from_secs(60))
        .lock_poll(Duration::from_secs(10)) // polling alone would take ≥ 5 s
        .build()
        .unwrap()
}

/// The cluster node that stores `key` for `cache`.
fn node_of(cluster: &RedisCluster, cache: &Cache<String>, key: &str) -> usize {
    let storage = cache.storage_key(key.as_bytes()).unwrap();
    cluster.node_of(std::str::from_utf8(&storage).unwrap())
}

/// A user key whose entry lives on `node`.
fn key_on(cluster: &RedisCluster, cache: &Cache<String>, node: usize) -> String {
    (0..)
        .map(|i| format!("key-{i}"))
        .find(|k| node_of(cluster, cache, k) == node)
        .unwrap()
}

/// A store on `cluster` with short deadlines, connected.
async fn impatient(cluster: &RedisCluster) -> RedisStore {
    let config = RedisStoreConfig::default()
        .connect_timeout(Duration::from_millis(900))
        .response_timeout(Duration::from_millis(300));
    let store = RedisStore::connect_cluster_with(cluster.urls(), config).unwrap();
    store.warm_up().await.unwrap();
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_every_node_and_each_loads_once_across_processes() {
    let (cluster, store) = cluster_store().await;
    let other = connect_cluster(&cluster).await;
    let caches = [cache_on(&store), cache_on(&other)];
    let keys: Vec<String> = (0..30).map(|i| format!("product:{i}")).collect();
    let calls: Vec<Arc<AtomicUsize>> = keys.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (key, calls) in keys.iter().zip(&calls) {
        for cache in &caches {
            for _ in 0..10 {
                let cache = cache.clone();
                let key = key.clone();
                let load = slow_loader(calls, Duration::from_millis(50), &format!("v:{key}"));
                tasks.push(tokio::spawn(async move {
                    let got = cache.get_or_load(&key, load).await;
                    (key, got)
                }));
            }
        }
    }
    for task in tasks {
        let (key, got) = task.await.unwrap();
        assert_eq!(got.unwrap(), Some(format!("v:{key}")));
    }
    for (key, calls) in keys.iter().zip(&calls) {
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "{key} loaded more than once"
        );
    }
    // The entries and the namespace's clear record (pinned by the first
    // write; nothing else: leases are gone) are spread over the nodes.
    let per_node: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|node| node.command(&["DBSIZE"]).unwrap().parse().unwrap())
        .collect();
    assert_eq!(per_node.iter().sum::<u64>(), 31, "{per_node:?}");
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
}

/// Process A loads `key` slowly while process B (its own cluster
/// connection) waits; see [`support::wait_for_a_fill`].
async fn wait_for_a_fill(
    cluster: &RedisCluster,
    key: &str,
    value: &str,
) -> (Option<String>, usize) {
    let a_store = connect_cluster(cluster).await;
    let b_store = CountingStore::new(connect_cluster(cluster).await);
    let (a, b) = (cache_on(&a_store), cache_on(&b_store));
    support::wait_for_a_fill(a, b, || b_store.gets(), key, value).await
}

#[tokio::test]
async fn a_fill_on_one_node_wakes_a_waiter_subscribed_to_another() {
    let (cluster, store) = cluster_store().await;
    // Subscriptions use the first node; the key lives on the last.
    let key = key_on(&cluster, &cache_on(&store), 2);
    let (got, gets_after_wake) = wait_for_a_fill(&cluster, &key, "filled").await;
    assert_eq!(got.as_deref(), Some("filled"));
    assert_eq!(
        gets_after_wake, 0,
        "woken by the fill's message, which carried the value"
    );
}

#[tokio::test]
async fn invalidate_during_a_slow_load_refuses_its_write_on_a_cluster() {
    let (cluster, store) = cluster_store().await;
    let other = connect_cluster(&cluster).await;
    let (a, b) = (cache_on(&store), cache_on(&other));
    let key = key_on(&cluster, &a, 1);
    let calls = Arc::new(AtomicUsize::new(0));
    let slow = {
        let load = slow_loader(&calls, Duration::from_millis(500), "stale");
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move { a.get_or_load(&key, load).await })
    };
    support::until("the load to start", || calls.load(Ordering::SeqCst) > 0).await;
    b.invalidate(&key).await.unwrap();
    // The slow load still answers its own callers...
    assert_eq!(slow.await.unwrap().unwrap().as_deref(), Some("stale"));
    // ...but its write was refused: the next read loads fresh data.
    assert_eq!(a.get(&key).await.unwrap(), None);
    let fresh = b
        .get_or_load(&key, slow_loader(&calls, Duration::ZERO, "fresh"))
        .await
        .unwrap();
    assert_eq!(fresh.as_deref(), Some("fresh"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_dead_node_degrades_its_keys_to_direct_loads_and_spares_the_others() {
    let mut cluster = RedisCluster::start();
    let store = impatient(&cluster).await;
    let cache = cache_on(&store);
    let (dead, alive) = (key_on(&cluster, &cache, 1), key_on(&cluster, &cache, 0));
    let calls = Arc::new(AtomicUsize::new(0));
    for key in [&dead, &alive] {
        let got = cache
            .get_or_load(
                key,
                slow_loader(&calls, Duration::ZERO, &format!("v:{key}")),
            )
            .await
            .unwrap();
        assert_eq!(got, Some(format!("v:{key}")));
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    cluster.node_mut(1).kill();
    // The dead node's key is loaded directly: no error reaches the caller.
    let got = cache
        .get_or_load(&dead, slow_loader(&calls, Duration::ZERO, "direct"))
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("direct"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    // A key on a live node is still served from the cluster, unloaded.
    let got = cache
        .get_or_load(&alive, slow_loader(&calls, Duration::ZERO, "reloaded"))
        .await
        .unwrap();
    assert_eq!(got, Some(format!("v:{alive}")));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn failure_domains_follow_hash_slots() {
    let (cluster, store) = cluster_store().await;
    assert_eq!(store.failure_domains(), 64);
    for key in [
        "foo",
        "bar",
        "bw:cluster:v:{product:1}",
        "{user1000}.following",
    ] {
        let slot: usize = cluster.nodes()[0]
            .command(&["CLUSTER", "KEYSLOT", key])
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(store.failure_domain(key.as_bytes()), slot / 256, "{key}");
    }
}

#[tokio::test]
async fn a_dead_node_opens_only_its_own_store_breakers() {
    let mut cluster = RedisCluster::start();
    let store = impatient(&cluster).await;
    let cache: Cache<String> = Cache::builder()
        .namespace("cluster")
        .store(store)
        .ttl(Duration::from_secs(60))
        .store_breaker(
            BreakerConfig::new()
                .consecutive_failures(3)
                .cool_down(Duration::from_secs(60)),
        )
        .build()
        .unwrap();
    let alive = key_on(&cluster, &cache, 0);
    cache.set(&alive, &"cached".to_owned()).await.unwrap();
    // Keys of one failure domain (256 slots) on node 1: a failed read
    // loads directly without touching the store again, so each call is one
    // failure against its domain's breaker.
    let domain = |k: &str| {
        let storage = cache.storage_key(k.as_bytes()).unwrap();
        cache.store().failure_domain(&storage)
    };
    let first = key_on(&cluster, &cache, 1);
    let dead: Vec<String> = (0..)
        .map(|i| format!("key-{i}"))
        .filter(|k| domain(k) == domain(&first))
        .take(4)
        .collect();
    assert_ne!(domain(&alive), domain(&first));

    cluster.node_mut(1).kill();
    let calls = Arc::new(AtomicUsize::new(0));
    for key in &dead {
        let got = cache
            .get_or_load(key, slow_loader(&calls, Duration::ZERO, "direct"))
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some("direct"));
    }
    assert_eq!(calls.load(Ordering::SeqCst), dead.len());
    // The dead node's failures opened its breakers...
    assert_eq!(cache.store_breaker_state(), BreakerState::Open);
    // ...and only its: a key on a live node is still read from the store.
    let got = cache
        .get_or_load(&alive, slow_loader(&calls, Duration::ZERO, "reloaded"))
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("cached"));
    assert_eq!(calls.load(Ordering::SeqCst), dead.len());
}

#[tokio::test]
async fn every_process_reads_the_clock_of_the_node_serving_slot_0() {
    let (cluster, _store) = cluster_store().await;
    let _other = connect_cluster(&cluster).await;
    let time_calls = |node: usize| {
        support::command_calls(&cluster.nodes()[node])
            .into_iter()
            .find(|(name, _)| name == "time")
            .map_or(0, |(_, calls)| calls)
    };
    // Two stores connected: three samples each, all from node 0.
    assert_eq!(time_calls(0), 6);
    assert_eq!((time_calls(1), time_calls(2)), (0, 0));
}

#[tokio::test]
async fn losing_slot_0s_primary_spares_the_other_nodes_and_new_processes() {
    let mut cluster = RedisCluster::start();
    let store = impatient(&cluster).await;
    let cache = cache_on(&store);
    let alive = key_on(&cluster, &cache, 2);
    cache.set(&alive, &"cached".to_owned()).await.unwrap();

    // Node 0 serves slot 0: its clock is the store's, and it is a seed.
    cluster.node_mut(0).kill();
    let calls = Arc::new(AtomicUsize::new(0));
    let dead = key_on(&cluster, &cache, 0);
    let got = cache
        .get_or_load(&dead, slow_loader(&calls, Duration::ZERO, "direct"))
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("direct"));
    for _ in 0..3 {
        let got = cache
            .get_or_load(&alive, slow_loader(&calls, Duration::ZERO, "reloaded"))
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some("cached"), "read from node 2");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A process that starts now connects and reads node 2 too.
    let newcomer = cache_on(&impatient(&cluster).await);
    let got = newcomer
        .get_or_load(&alive, slow_loader(&calls, Duration::ZERO, "reloaded"))
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("cached"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_silent_node_costs_only_its_own_keys() {
    let cluster = RedisCluster::start();
    let store = impatient(&cluster).await;
    let cache = cache_on(&store);
    let alive = key_on(&cluster, &cache, 0);
    let silent = key_on(&cluster, &cache, 1);
    cache.set(&alive, &"cached".to_owned()).await.unwrap();

    cluster.nodes()[1].pause(); // SIGSTOP: connections stay open, nothing answers
    let calls = Arc::new(AtomicUsize::new(0));
    let got = cache
        .get_or_load(&silent, slow_loader(&calls, Duration::ZERO, "direct"))
        .await
        .unwrap();
    assert_eq!(
        got.as_deref(),
        Some("direct"),
        "one deadline, then a direct load"
    );
    for _ in 0..3 {
        let got = cache
            .get_or_load(&alive, slow_loader(&calls, Duration::ZERO, "reloaded"))
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some("cached"), "read from node 0");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    cluster.nodes()[1].resume();
}

#[tokio::test]
async fn lease_scripts_run_on_a_node_that_lost_them_while_another_hangs() {
    let cluster = RedisCluster::start();
    let store = impatient(&cluster).await;
    let lease = (0..)
        .map(|i| format!("bw:t:l:{{k{i}}}"))
        .find(|k| cluster.node_of(k) == 0)
        .unwrap();
    assert!(
        store
            .acquire_lease(lease.as_bytes(), b"a", Duration::from_secs(5))
            .await
            .unwrap()
            .is_acquired()
    );
    // Node 0 forgets its scripts (as after a restart) while node 2 hangs:
    // loading a script on every node is impossible now.
    cluster.nodes()[2].pause();
    assert_eq!(
        cluster.nodes()[0].command(&["SCRIPT", "FLUSH"]).unwrap(),
        "OK"
    );
    let notice = breakwater_cache::Notice {
        channel: b"bw:t:events",
        message: b"released",
        batch_head: None,
    };
    assert!(
        store
            .release_lease(lease.as_bytes(), b"a", notice)
            .await
            .unwrap()
    );
    assert!(
        store
            .acquire_lease(lease.as_bytes(), b"b", Duration::from_secs(5))
            .await
            .unwrap()
            .is_acquired()
    );
}

#[tokio::test]
async fn a_new_process_connects_while_slot_0s_primary_is_silent() {
    let cluster = RedisCluster::start();
    let cache = cache_on(&impatient(&cluster).await);
    let alive = key_on(&cluster, &cache, 2);
    cache.set(&alive, &"cached".to_owned()).await.unwrap();

    cluster.nodes()[0].pause(); // SIGSTOP: the clock node stops answering
    let newcomer = cache_on(&impatient(&cluster).await);
    let calls = Arc::new(AtomicUsize::new(0));
    let got = newcomer
        .get_or_load(&alive, slow_loader(&calls, Duration::ZERO, "reloaded"))
        .await
        .unwrap();
    assert_eq!(got.as_deref(), Some("cached"), "read from node 2");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    cluster.nodes()[0].resume();
}

/// `set_many` on a cluster: a batch whose keys live on every node is
/// written (side by side, each to its key's node) and read back by another
/// process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_many_writes_keys_on_every_node() {
    let (cluster, store) = cluster_store().await;
    let other = connect_cluster(&cluster).await;
    let (writer, reader) = (cache_on(&store), cache_on(&other));
    let keys: Vec<String> = (0..1_000).map(|i| format!("bulk:{i}")).collect();
    let nodes: std::collections::HashSet<usize> =
        keys.iter().map(|k| node_of(&cluster, &writer, k)).collect();
    assert_eq!(nodes.len(), 3, "the batch spans every node");
    writer
        .set_many(keys.iter().map(|k| (k.clone(), format!("v-{k}"))))
        .await
        .unwrap();
    for k in &keys {
        assert_eq!(reader.get(k).await.unwrap(), Some(format!("v-{k}")), "{k}");
    }
}

/// The `EXEC`s `node` has run (`INFO commandstats`).
fn exec_calls(node: &support::RedisServer) -> u64 {
    let stats = node.command(&["INFO", "commandstats"]).unwrap();
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_exec:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// A key on node 0 whose slot holds nothing yet, that slot handed to node
/// 1 (a resharding `cache`'s store has not seen yet).
fn move_an_empty_slot(cluster: &RedisCluster, cache: &Cache<String>) -> String {
    let (moved, slot) = (0..)
        .map(|i| format!("moved:{i}"))
        .find_map(|k| {
            let storage = cache.storage_key(k.as_bytes()).unwrap();
            let storage = std::str::from_utf8(&storage).unwrap().to_owned();
            if node_of(cluster, cache, &k) != 0 {
                return None;
            }
            let node = &cluster.nodes()[0];
            let slot = node.command(&["CLUSTER", "KEYSLOT", &storage]).unwrap();
            let held = node
                .command(&["CLUSTER", "COUNTKEYSINSLOT", &slot])
                .unwrap();
            (held == "0").then(|| (k, slot.parse::<u16>().unwrap()))
        })
        .unwrap();
    cluster.hand_slot(slot, 1);
    moved
}

/// A bulk write after a slot moved to another node (a resharding the
/// store has not seen yet: its slot map groups the slot with its old
/// node's keys): the redirected step is written again per slot, and every
/// key lands, on every node, with its new value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_write_after_a_slot_moved_lands_every_key() {
    let (cluster, store) = cluster_store().await;
    let other = connect_cluster(&cluster).await;
    let (writer, reader) = (cache_on(&store), cache_on(&other));
    let keys: Vec<String> = (0..300).map(|i| format!("bulk:{i}")).collect();
    writer
        .set_many(keys.iter().map(|k| (k.clone(), "first".to_owned())))
        .await
        .unwrap();
    let moved = move_an_empty_slot(&cluster, &writer);
    let mut again = keys.clone();
    again.push(moved.clone());
    let transactions = || exec_calls(&cluster.nodes()[1]);
    let before = transactions();
    writer
        .set_many(again.iter().map(|k| (k.clone(), format!("v-{k}"))))
        .await
        .unwrap();
    for k in &again {
        assert_eq!(reader.get(k).await.unwrap(), Some(format!("v-{k}")), "{k}");
    }
    // The moved key was written again by its slot's own transaction on its
    // new node, not left to the cluster connection's retries of the step.
    assert!(transactions() > before, "no per-slot transaction on node 1");
    // The store asks for the slot map again once a step was refused: a
    // later bulk write lands too.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    writer
        .invalidate_many(again.iter().map(String::as_str))
        .await
        .unwrap();
    for k in &again {
        assert_eq!(reader.get(k).await.unwrap(), None, "{k}");
    }
}

/// `PUBLISH`es run by every node of `cluster` (`INFO commandstats`).
fn cluster_publishes(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes()
        .iter()
        .flat_map(support::command_calls)
        .filter(|(name, _)| name == "publish")
        .map(|(_, calls)| calls)
        .sum()
}

/// A cache in `cluster_on`'s namespace with an L1, as another process.
fn l1_cache_on(store: &RedisStore) -> Cache<String> {
    Cache::builder()
        .namespace("cluster")
        .store(store.clone())
        .ttl(Duration::from_secs(60))
        .l1(breakwater_cache::L1Config::new())
        .build()
        .unwrap()
}

/// Reads of `keys` by `cache`, each until it is `expected(key)` (up to
/// 5 s in all: its L1 copy dropped once it heard the notice).
async fn reads_come_to(cache: &Cache<String>, keys: &[String], expected: impl Fn(&str) -> String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for k in keys {
        loop {
            let got = cache.get(k).await.unwrap();
            if got.as_deref() == Some(expected(k).as_str()) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{k} still {got:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Another process's L1 copies of `keys`, "old".
async fn hold_old_copies(cache: &Cache<String>, keys: &[String]) {
    for k in keys {
        let old = cache
            .get_or_load(k, || async {
                Ok::<_, std::io::Error>(Some("old".to_owned()))
            })
            .await
            .unwrap();
        assert_eq!(old.as_deref(), Some("old"));
    }
}

/// `set`s of `keys` ("new <key>") by `a` side by side, each answered; they
/// met: far fewer `PUBLISH`es than sets.
async fn sets_meet(cluster: &RedisCluster, a: &Cache<String>, keys: &[String]) {
    let before = cluster_publishes(cluster);
    let sets = keys.iter().map(|k| {
        let a = a.clone();
        async move { a.set(k, &format!("new {k}")).await }
    });
    for set in futures_util::future::join_all(sets).await {
        set.unwrap();
    }
    let published = cluster_publishes(cluster) - before;
    assert!(
        (1..=keys.len() as u64 / 2).contains(&published),
        "{} sets side by side: {published} PUBLISHes",
        keys.len()
    );
}

/// A hundred `set`s side by side on a cluster: past the first, they meet
/// in one pipeline per node with one `PUBLISH` each (a cluster forwards
/// every `PUBLISH` to every node), far fewer `PUBLISH`es than sets; and
/// each keeps what a `set` promises: its value lands, another process's
/// L1 copy goes, and a load in flight of one of the keys cannot write its
/// older result back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sets_meet_per_node_and_each_keeps_its_guarantees() {
    let (cluster, store) = cluster_store().await;
    let other = connect_cluster(&cluster).await;
    let (a, b) = (cache_on(&store), l1_cache_on(&other));
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    hold_old_copies(&b, &keys).await;
    b.invalidate("k7").await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let slow = slow_loader(&calls, Duration::from_millis(500), "older");
    let load = tokio::spawn({
        let b = b.clone();
        async move { b.get_or_load("k7", slow).await }
    });
    support::until("the load holds the lease", || {
        calls.load(Ordering::SeqCst) == 1
    })
    .await;
    sets_meet(&cluster, &a, &keys).await;
    assert_eq!(load.await.unwrap().unwrap().as_deref(), Some("older"));
    let c = cache_on(&connect_cluster(&cluster).await);
    for k in &keys {
        assert_eq!(c.get(k).await.unwrap(), Some(format!("new {k}")), "{k}");
    }
    reads_come_to(&b, &keys, |k| format!("new {k}")).await;
}

/// A `set` whose caller gave up while its write was on the wire (the node
/// paused) still has its notice sent, also one that went out with others:
/// another process's L1 copy goes once the write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_dropped_in_flight_still_tells_other_processes() {
    let (cluster, store) = cluster_store().await;
    let other = connect_cluster(&cluster).await;
    let (a, b) = (cache_on(&store), l1_cache_on(&other));
    // Keys on node 0, which pauses.
    let keys: Vec<String> = (0..)
        .map(|j| format!("p{j}"))
        .filter(|k| node_of(&cluster, &a, k) == 0)
        .take(4)
        .collect();
    hold_old_copies(&b, &keys).await;
    // a's namespace record is read (and trusted while its bus is up) and
    // its slot map known: the sets below send their writes at once, not
    // behind a read of either on the paused node.
    a.set_many([("warm:1", "up".to_owned()), ("warm:2", "up".to_owned())])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.nodes()[0]
        .command(&["CLIENT", "PAUSE", "400", "WRITE"])
        .unwrap();
    let sets = keys.iter().map(|k| {
        let a = a.clone();
        async move {
            let value = format!("new {k}");
            tokio::time::timeout(Duration::from_millis(250), a.set(k, &value)).await
        }
    });
    for set in futures_util::future::join_all(sets).await {
        assert!(set.is_err(), "the set returned while its node was paused");
    }
    // Once the node runs again, the writes that were sent land; b hears of
    // each of them (a set dropped before its write went out may not land).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let c = cache_on(&connect_cluster(&cluster).await);
    let mut landed = Vec::new();
    for k in &keys {
        if c.get(k).await.unwrap() == Some(format!("new {k}")) {
            landed.push(k.clone());
        }
    }
    // The first went out alone, the others together (or were dropped
    // before they were sent).
    assert!(landed.len() >= 2, "only {landed:?} of {keys:?} landed");
    reads_come_to(&b, &landed, |k| format!("new {k}")).await;
}

/// Sets side by side on a runtime that is dropped while they are queued
/// (its writer task with it): the sets of another runtime then meet as
/// before, each lands and is heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_go_on_meeting_after_their_writers_runtime_is_dropped() {
    let (cluster, store) = cluster_store().await;
    let other = connect_cluster(&cluster).await;
    let (a, b) = (cache_on(&store), l1_cache_on(&other));
    // A few runtimes, each dropped a little later into its sets.
    for (round, after) in [1, 2, 3, 5, 8, 12, 20].into_iter().enumerate() {
        let doomed = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        for i in 0..100 {
            let a = a.clone();
            doomed
                .spawn(async move { a.set(&format!("d{round}:{i}"), &"doomed".to_owned()).await });
        }
        tokio::time::sleep(Duration::from_millis(after)).await;
        doomed.shutdown_background();
    }
    // Its worker drops the tasks (the writer's with them) on its way out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    hold_old_copies(&b, &keys).await;
    sets_meet(&cluster, &a, &keys).await;
    reads_come_to(&b, &keys, |k| format!("new {k}")).await;
}

/// A `set` queued behind others (its node paused) whose caller gives up
/// before it was sent is never sent: it does not land later, after its
/// caller was told it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_dropped_while_queued_never_lands() {
    let (cluster, store) = cluster_store().await;
    let a = cache_on(&store);
    let keys: Vec<String> = (0..)
        .map(|j| format!("q{j}"))
        .filter(|k| node_of(&cluster, &a, k) == 0)
        .take(3)
        .collect();
    // Its slot map known and its namespace record trusted (as above).
    a.set_many(keys.iter().map(|k| (k.clone(), "old".to_owned())))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.nodes()[0]
        .command(&["CLIENT", "PAUSE", "1000", "WRITE"])
        .unwrap();
    // The first goes out alone, the second is queued and sent (and waits
    // on the paused node), the third is queued behind it.
    let sets = keys.iter().enumerate().map(|(i, k)| {
        let a = a.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(100 * i as u64)).await;
            let value = format!("new {k}");
            tokio::time::timeout(Duration::from_millis(300), a.set(k, &value)).await
        }
    });
    for set in futures_util::future::join_all(sets).await {
        assert!(set.is_err(), "the set returned while its node was paused");
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let c = cache_on(&connect_cluster(&cluster).await);
    let got: Vec<Option<String>> = futures_util::future::join_all(keys.iter().map(|k| c.get(k)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        got,
        [
            Some(format!("new {}", keys[0])),
            Some(format!("new {}", keys[1])),
            Some("old".to_owned())
        ]
    );
}

/// Sets queued behind a paused node's step hold up only that node's keys:
/// sets of another node's keys, queued meanwhile, are written and return
/// while the paused node's are still waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_holds_up_only_its_own_queued_sets() {
    let (cluster, store) = cluster_store().await;
    let a = cache_on(&store);
    let on = |node: usize, prefix: &str| -> Vec<String> {
        (0..)
            .map(|j| format!("{prefix}{j}"))
            .filter(|k| node_of(&cluster, &a, k) == node)
            .take(3)
            .collect()
    };
    let (paused, other) = (on(0, "s"), on(1, "t"));
    // Its slot map known and its namespace record trusted.
    a.set_many(
        paused
            .iter()
            .chain(&other)
            .map(|k| (k.clone(), "old".to_owned())),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.nodes()[0]
        .command(&["CLIENT", "PAUSE", "1000", "WRITE"])
        .unwrap();
    // The first goes out alone; the others are queued, a step to node 0
    // in flight.
    let stuck: Vec<_> = paused
        .iter()
        .map(|k| {
            let (a, k) = (a.clone(), k.clone());
            tokio::spawn(async move { a.set(&k, &"new".to_owned()).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let new = "new".to_owned();
    let sets = other.iter().map(|k| a.set(k, &new));
    for set in futures_util::future::join_all(sets).await {
        set.unwrap();
    }
    assert!(
        stuck.iter().all(|set| !set.is_finished()),
        "node 1's sets waited for node 0's (or node 0's returned while it was paused)"
    );
    for set in stuck {
        // Answered once node 0 runs again (a write held for good would
        // hang here).
        let set = tokio::time::timeout(Duration::from_secs(10), set).await;
        set.expect("node 0's set answered").unwrap().unwrap();
    }
    let c = cache_on(&connect_cluster(&cluster).await);
    for k in paused.iter().chain(&other) {
        assert_eq!(c.get(k).await.unwrap().as_deref(), Some("new"), "{k}");
    }
}

/// Sets side by side right after a slot moved to another node (the
/// store's slot map still has it on its old one): the queued step that
/// carries its key is redirected and its writes go again by the script;
/// every value lands, then and a second later (the map asked for again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_sets_after_a_slot_moved_land_every_key() {
    let (cluster, store) = cluster_store().await;
    let other = connect_cluster(&cluster).await;
    let (writer, reader) = (cache_on(&store), cache_on(&other));
    let mut keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    // The store learns the slot map.
    writer
        .set_many(keys.iter().map(|k| (k.clone(), "first".to_owned())))
        .await
        .unwrap();
    keys.push(move_an_empty_slot(&cluster, &writer));
    let scripts = || {
        support::command_calls(&cluster.nodes()[1])
            .into_iter()
            .find(|(name, _)| name == "evalsha")
            .map_or(0, |(_, calls)| calls)
    };
    let before = scripts();
    for round in 0..2 {
        let sets = keys.iter().map(|k| {
            let writer = writer.clone();
            async move { writer.set(k, &format!("v{round} {k}")).await }
        });
        for set in futures_util::future::join_all(sets).await {
            set.unwrap();
        }
        for k in &keys {
            let got = reader.get(k).await.unwrap();
            assert_eq!(got, Some(format!("v{round} {k}")), "{k}");
        }
        // The moved key was written again by the script on its new node,
        // not left to the cluster connection's retries of the step.
        if round == 0 {
            assert!(scripts() > before, "no script on node 1");
        }
        // The map may be asked for again once a second.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
}
