//! Redis ACL users: a store that connects as a user named in its URL, and
//! a cache whose `key_prefix` is the one the user is limited to.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, RedisStore, Store, Warm};
use support::{RedisServer, patient, slow_loader};

/// `ACL SETUSER user rules...` on `server`.
fn set_user(server: &RedisServer, user: &str, rules: &[&str]) {
    let mut command = vec!["ACL", "SETUSER", user];
    command.extend_from_slice(rules);
    assert_eq!(server.command(&command).unwrap(), "OK", "{command:?}");
}

/// A refused password is what a caller is told (not a bare
/// "unreachable"), and no password shows, neither the wrong one nor the
/// user's.
#[tokio::test]
async fn a_wrong_password_is_named_as_the_reason_without_the_password() {
    let server = RedisServer::start();
    set_user(
        &server,
        "app",
        &["on", ">right-secret", "~*", "&*", "+@all"],
    );
    let url = format!("redis://app:hunter2-wrong@127.0.0.1:{}/", server.port());
    let config = patient().connect_timeout(Duration::from_secs(1));
    let store = RedisStore::connect_with(&url, config).unwrap();
    let warm = store.warm_up().await.unwrap_err();
    let read = store.get(b"k").await.unwrap_err();
    for err in [warm, read] {
        assert!(err.is_store(), "{err}");
        let shown = format!("{err} | {err:?}");
        assert!(shown.contains("authentication failed"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("right-secret"), "{shown}");
    }
}

/// The narrowest user the store works with, as `key_prefix`'s docs give it:
/// its own keys and channels, and only the commands the store sends.
const APP_USER: &[&str] = &[
    "on",
    ">s3cret-app",
    "resetkeys",
    "~myapp:*",
    "resetchannels",
    "&myapp:*",
    "-@all",
    "+get",
    "+mget",
    "+set",
    "+del",
    "+pttl",
    "+exists",
    "+publish",
    "+subscribe",
    "+evalsha",
    "+eval",
    "+getrange",
    "+setrange",
    "+pexpire",
    "+sadd",
    "+srem",
    "+sismember",
    "+srandmember",
    "+multi",
    "+exec",
    "+ping",
    "+time",
    "+role",
];

/// A private Redis with the `app` user, and a store connected as it.
async fn app_server() -> (RedisServer, RedisStore) {
    let server = RedisServer::start();
    set_user(&server, "app", APP_USER);
    let store = app_store(&server).await;
    (server, store)
}

async fn app_store(server: &RedisServer) -> RedisStore {
    let url = format!("redis://app:s3cret-app@127.0.0.1:{}/", server.port());
    let store = RedisStore::connect_with(&url, patient()).unwrap();
    store.warm_up().await.expect("the app user may connect");
    store
}

fn cache_on<S: Store>(store: S, prefix: Option<&str>) -> Cache<String> {
    let builder = Cache::builder()
        .namespace("catalog")
        .ttl(Duration::from_secs(60))
        .lock_poll(Duration::from_secs(10)) // waiters are woken, not polling
        // The startup check's CONFIG GET is refused for this user by design
        // (and lands in ACL LOG, which these tests read); its own test
        // below runs it.
        .startup_check(false);
    let builder = match prefix {
        Some(prefix) => builder.key_prefix(prefix),
        None => builder,
    };
    builder.store(store).build().unwrap()
}

/// What the server refused, from `ACL LOG` (empty: nothing).
fn acl_log(server: &RedisServer) -> String {
    server.command(&["ACL", "LOG"]).unwrap()
}

/// Every operation of the cache, as the `app` user limited to `myapp:`
/// keys and channels and to the commands the store needs: a load under the
/// key's lease (extended while it runs) while a second "process" waits and
/// is woken by the fill's message, hits, `set`, `invalidate`, `inspect`,
/// `warm` and tags. Redis refused nothing (`ACL LOG` stays empty).
#[tokio::test]
async fn a_user_limited_to_its_prefix_runs_every_operation() {
    let (server, a_store) = app_server().await;
    let b_store = CountingStore::new(app_store(&server).await);
    let a = cache_on(a_store, Some("myapp:"));
    let b = cache_on(b_store.clone(), Some("myapp:"));

    let (got, gets_after_wake) =
        support::wait_for_a_fill(a.clone(), b.clone(), || b_store.gets(), "k", "filled").await;
    assert_eq!(got.as_deref(), Some("filled"));
    assert_eq!(gets_after_wake, 0, "woken by the message, not by polling");
    assert_ne!(
        server.command(&["GET", "myapp:catalog:v:{k}"]).unwrap(),
        "(nil)"
    );

    a.set("p:1", &"one".to_owned()).await.unwrap();
    assert_eq!(b.get("p:1").await.unwrap().as_deref(), Some("one"));
    let inspection = a.inspect("p:1").await.unwrap();
    assert!(!inspection.lease_held);
    assert!(inspection.store_ttl.is_some());
    a.invalidate("p:1").await.unwrap();
    assert_eq!(b.get("p:1").await.unwrap(), None);

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let report = a
        .warm(
            (0..50).map(|i| format!("w:{i}")),
            move |key: String| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok::<_, std::io::Error>(Some(format!("row {key}"))) }
            },
            Warm::new().rate(10_000),
        )
        .await
        .unwrap();
    assert_eq!((report.loaded, report.failed), (50, 0), "{report:?}");
    let v = b
        .get_or_load("w:7", slow_loader(&calls, Duration::ZERO, "again"))
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("row w:7"), "warmed");
    assert_eq!(calls.load(Ordering::SeqCst), 50);
    assert_eq!(
        server.command(&["DBSIZE"]).unwrap(),
        "52",
        "k, the 50 warmed keys and the clear record the first write pinned; leases released"
    );

    // Tags: a tagged load creates its tag's counter (a script: `GET`,
    // `SET`, `PTTL`, `PEXPIRE`), `invalidate_tag` bumps it.
    let tagged = a
        .entry("t:1")
        .tags(["group"])
        .get_or_load(|| async { Ok::<_, std::io::Error>(Some("tagged".to_owned())) })
        .await
        .unwrap();
    assert_eq!(tagged.as_deref(), Some("tagged"));
    assert_eq!(b.get("t:1").await.unwrap().as_deref(), Some("tagged"));
    a.invalidate_tag("group").await.unwrap();
    assert_eq!(b.get("t:1").await.unwrap(), None);

    assert_eq!(acl_log(&server), "", "Redis refused something");
}

/// The same user with the default prefix (`bw:`): every key and the
/// channel are out of bounds. Reads and writes fail with a store error
/// that names the missing permission, never the password; also once the
/// store breaker has opened on them (an invalidation is retried 10 times,
/// and the breaker opens after 5 failures).
#[tokio::test]
async fn a_prefix_limited_user_cannot_use_the_default_prefix() {
    let (server, store) = app_server().await;
    // A cool-down longer than the test, so the breaker is still open at
    // the last call however slow the machine (with the default 1 s it could
    // be half-open again after the invalidation's second of retries).
    let cache = Cache::builder()
        .namespace("catalog")
        .ttl(Duration::from_secs(60))
        .store_breaker(breakwater_cache::BreakerConfig::new().cool_down(Duration::from_secs(60)))
        .store(store)
        .build()
        .unwrap();
    let errors = [
        cache.get("k").await.unwrap_err(),
        cache.set("k", &"v".to_owned()).await.unwrap_err(),
        cache.inspect("k").await.unwrap_err(),
        cache.invalidate("k").await.unwrap_err(),
        cache.get("k").await.unwrap_err(),
    ];
    assert!(
        errors[4].to_string().contains("failed repeatedly"),
        "the breaker is open: {}",
        errors[4]
    );
    for err in errors {
        assert!(err.is_store(), "{err}");
        let shown = format!("{err} | {err:?}");
        assert!(
            shown.contains("NOPERM") || shown.contains("NoPerm"),
            "{shown}"
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }
    // The load itself still serves its caller (a store failure degrades to
    // a direct load), and nothing was written.
    let v = cache
        .get_or_load("k", || async {
            Ok::<_, std::io::Error>(Some("loaded".to_owned()))
        })
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("loaded"));
    assert_eq!(server.command(&["DBSIZE"]).unwrap(), "0");
    assert!(
        acl_log(&server).contains("bw:catalog:"),
        "{}",
        acl_log(&server)
    );
}

/// On a Redis Cluster the same user needs `CLUSTER SLOTS` too (the client
/// asks it for the slot map); nothing else.
#[tokio::test]
async fn a_prefix_limited_user_works_on_a_cluster_with_cluster_slots() {
    let cluster = support::RedisCluster::start();
    let mut rules = APP_USER.to_vec();
    rules.push("+cluster|slots");
    for node in cluster.nodes() {
        set_user(node, "app", &rules);
    }
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("redis://app:s3cret-app@127.0.0.1:{}/", n.port()))
        .collect();
    let connect = || async {
        let store = RedisStore::connect_cluster_with(&urls, patient()).unwrap();
        store.warm_up().await.expect("the app user may connect");
        store
    };
    let a = cache_on(connect().await, Some("myapp:"));
    let b_store = CountingStore::new(connect().await);
    let b = cache_on(b_store.clone(), Some("myapp:"));
    let (got, gets_after_wake) =
        support::wait_for_a_fill(a.clone(), b.clone(), || b_store.gets(), "k", "filled").await;
    assert_eq!(got.as_deref(), Some("filled"));
    assert_eq!(gets_after_wake, 0, "woken by the message, not by polling");
    for i in 0..20 {
        let key = format!("p:{i}");
        a.set(&key, &key).await.unwrap();
        assert_eq!(b.get(&key).await.unwrap().as_deref(), Some(key.as_str()));
        a.invalidate(&key).await.unwrap();
        assert_eq!(b.get(&key).await.unwrap(), None);
    }
    for node in cluster.nodes() {
        assert_eq!(acl_log(node), "", "node {} refused something", node.port());
    }
}

/// A user narrower than the docs give, without `+multi` (and `+exec`):
/// the bulk calls, whose steps are transactions, fail with a clear error
/// naming the refused command, and nothing panics (redis-rs 1.8.1's
/// multiplexed connection panicked on a refused `MULTI` in debug builds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_multi_gets_a_clear_error_from_bulk_calls() {
    let server = RedisServer::start();
    let rules: Vec<&str> = APP_USER
        .iter()
        .copied()
        .filter(|rule| !matches!(*rule, "+multi" | "+exec"))
        .collect();
    set_user(&server, "app", &rules);
    let store = app_store(&server).await;
    let cache = cache_on(store, Some("myapp:"));
    let items = (0..10).map(|i| (format!("k{i}"), format!("v{i}")));
    let err = cache.set_many(items).await.unwrap_err();
    let shown = err.to_string();
    eprintln!("set_many: {shown}");
    assert!(err.is_store(), "{shown}");
    assert!(
        shown.to_lowercase().contains("noperm") || shown.contains("permission"),
        "{shown}"
    );
    let err = cache.invalidate_many(["k1", "k2"]).await.unwrap_err();
    assert!(err.is_store(), "{err}");
    // The connection still works for what the user may do (once the
    // store's breaker, which counts a refusal as a store failure, lets
    // calls through again).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cache.set("one", &"v".to_owned()).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no set went through"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(cache.get("one").await.unwrap().as_deref(), Some("v"));
}

/// `Cache::check` names what the user may not do: the full app user is
/// refused nothing; one without `+multi`/`+exec` and `+sadd` gets a
/// `permissions` finding naming them (and `CONFIG GET` refused is said,
/// not guessed).
#[tokio::test]
async fn the_startup_check_names_the_commands_a_user_lacks() {
    let (server, store) = app_server().await;
    let cache = cache_on(store, Some("myapp:"));
    let findings = cache.check().await;
    let permissions = findings
        .iter()
        .find(|f| f.topic == "permissions")
        .expect("a permissions finding");
    assert!(permissions.ok, "{findings:#?}");
    let policy = findings
        .iter()
        .find(|f| f.topic == "maxmemory-policy")
        .unwrap();
    assert!(
        !policy.ok && policy.detail.contains("could not be read"),
        "{policy}"
    );
    let rules: Vec<&str> = APP_USER
        .iter()
        .copied()
        .filter(|rule| !matches!(*rule, "+multi" | "+exec" | "+sadd"))
        .collect();
    set_user(&server, "narrow", &rules);
    let url = format!("redis://narrow:s3cret-app@127.0.0.1:{}/", server.port());
    let store = RedisStore::connect_with(&url, patient()).unwrap();
    let cache = cache_on(store, Some("myapp:"));
    let findings = cache.check().await;
    let permissions = findings.iter().find(|f| f.topic == "permissions").unwrap();
    eprintln!("{permissions}");
    assert!(!permissions.ok, "{permissions}");
    for named in ["SADD", "MULTI"] {
        assert!(permissions.detail.contains(named), "{permissions}");
    }
    // The probe keys are gone.
    assert_eq!(server.command(&["DBSIZE"]).unwrap().trim(), "0");
}
