//! `Cache::check` against real `redis-server` processes: the eviction
//! policy is read and said for what it means (a warning for `noeviction`
//! and `allkeys-random`), and L1 without a bus is named.

use std::time::Duration;

use breakwater_cache::{Cache, L1Config, MemoryStore, RedisStore};
use breakwater_cache_testkit::RedisServer;

async fn findings(server: &RedisServer, l1: bool) -> Vec<breakwater_cache::Finding> {
    let store = RedisStore::connect(&server.url()).unwrap();
    store.warm_up().await.unwrap();
    let builder = Cache::<String>::builder().namespace("check").store(store);
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().unwrap().check().await
}

fn topic<'a>(
    findings: &'a [breakwater_cache::Finding],
    topic: &str,
) -> &'a breakwater_cache::Finding {
    findings
        .iter()
        .find(|f| f.topic == topic)
        .unwrap_or_else(|| panic!("no {topic} finding in {findings:#?}"))
}

#[tokio::test]
async fn every_eviction_policy_is_said_for_what_it_means() {
    for (policy, ok) in [
        ("allkeys-lru", true),
        ("allkeys-lfu", true),
        ("volatile-lru", true),
        ("allkeys-random", false),
        ("noeviction", false),
    ] {
        let server =
            RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", policy]);
        let found = findings(&server, true).await;
        for f in &found {
            eprintln!("{policy}: {f}");
        }
        let eviction = topic(&found, "maxmemory-policy");
        assert_eq!(eviction.ok, ok, "{eviction}");
        assert!(eviction.detail.starts_with(policy), "{eviction}");
        assert!(topic(&found, "permissions").ok);
        assert!(topic(&found, "pub/sub").ok);
        assert!(topic(&found, "l1").ok);
        assert_eq!(
            server.command(&["DBSIZE"]).unwrap().trim(),
            "0",
            "probe keys left"
        );
    }
    // No maxmemory: nothing is evicted.
    let server = RedisServer::start();
    let found = findings(&server, false).await;
    assert!(topic(&found, "maxmemory-policy").ok);
}

/// The memory store has nothing to report of its own; its bus is always
/// up.
#[tokio::test]
async fn the_memory_store_reports_only_its_bus() {
    let cache = Cache::<String>::builder()
        .store(MemoryStore::new())
        .l1(L1Config::new())
        .build()
        .unwrap();
    let found = tokio::time::timeout(Duration::from_secs(5), cache.check())
        .await
        .unwrap();
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(topic(&found, "pub/sub").ok, "{found:#?}");
    assert!(topic(&found, "l1").ok, "{found:#?}");
}
