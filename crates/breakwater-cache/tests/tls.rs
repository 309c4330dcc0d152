//! `rediss://` (the `tls` feature): the cache on private `redis-server`s that
//! listen for TLS only (`--port 0 --tls-port PORT`) and require a client
//! certificate, with a CA and certificates made by each test.
#![cfg(feature = "tls")]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, RedisStore, RedisStoreConfig, Store};
use breakwater_cache_testkit::TestCerts;
use support::{RedisCluster, RedisServer, patient, slow_loader};

/// Patient timeouts, trusting `certs`' CA and presenting its client
/// certificate.
fn tls_config(certs: &TestCerts) -> RedisStoreConfig {
    patient()
        .tls_ca_pem(certs.ca_pem())
        .tls_client_cert_pem(certs.client_cert_pem(), certs.client_key_pem())
}

async fn tls_store(server: &RedisServer, certs: &TestCerts) -> RedisStore {
    let store = RedisStore::connect_with(&server.url(), tls_config(certs)).expect("valid url");
    store
        .warm_up()
        .await
        .expect("private TLS redis is reachable");
    store
}

fn catalog<S: breakwater_cache::Store>(store: S) -> Cache<String> {
    Cache::builder()
        .namespace("catalog")
        .store(store)
        .ttl(Duration::from_secs(60))
        .lock_poll(Duration::from_secs(10)) // waiters are woken, not polling
        .build()
        .unwrap()
}

/// Loads, hits, writes and invalidations of one cache, checked against
/// what the server holds (through the kit's own TLS client).
async fn exercise(
    cache: &Cache<String>,
    key_of: impl Fn(&str) -> String,
    get: impl Fn(&str) -> String,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    for i in 0..20 {
        let key = format!("p:{i}");
        let v = cache
            .get_or_load(&key, slow_loader(&calls, Duration::ZERO, "loaded"))
            .await
            .unwrap();
        assert_eq!(v.as_deref(), Some("loaded"));
        assert_ne!(get(&key_of(&key)), "(nil)", "{key} was written");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 20);
    let v = cache
        .get_or_load("p:3", slow_loader(&calls, Duration::ZERO, "again"))
        .await
        .unwrap();
    assert_eq!(v.as_deref(), Some("loaded"), "a hit");
    assert_eq!(calls.load(Ordering::SeqCst), 20);

    cache.set("p:3", &"written".to_owned()).await.unwrap();
    assert_eq!(cache.get("p:3").await.unwrap().as_deref(), Some("written"));
    cache.invalidate("p:3").await.unwrap();
    assert_eq!(get(&key_of("p:3")), "(nil)");
    assert_eq!(cache.get("p:3").await.unwrap(), None);
}

#[tokio::test]
async fn a_cache_works_over_tls_with_a_private_ca_and_a_client_certificate() {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs);
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    let store = tls_store(&server, &certs).await;
    let cache = catalog(store);
    exercise(
        &cache,
        |key| String::from_utf8(cache.storage_key(key.as_bytes()).unwrap()).unwrap(),
        |key| server.command(&["GET", key]).unwrap(),
    )
    .await;
}

/// B waits for A's load and is woken by the fill's message, which reaches
/// it on its own pub/sub connection: over TLS too.
#[tokio::test]
async fn a_waiter_is_woken_through_its_tls_subscription() {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs);
    let a = catalog(tls_store(&server, &certs).await);
    let b_store = CountingStore::new(tls_store(&server, &certs).await);
    let b = catalog(b_store.clone());
    let (got, gets_after_wake) =
        support::wait_for_a_fill(a, b, || b_store.gets(), "k", "filled").await;
    assert_eq!(got.as_deref(), Some("filled"));
    assert_eq!(gets_after_wake, 0, "woken by the message, not by polling");
}

#[tokio::test]
async fn a_cluster_works_over_tls() {
    let certs = TestCerts::generate();
    let cluster = RedisCluster::start_tls(&certs);
    assert!(cluster.urls().iter().all(|u| u.starts_with("rediss://")));
    let store =
        RedisStore::connect_cluster_with(cluster.urls(), tls_config(&certs)).expect("valid urls");
    store
        .warm_up()
        .await
        .expect("private TLS cluster is reachable");
    let cache = catalog(store.clone());
    let node_of = |key: &str| &cluster.nodes()[cluster.node_of(key)];
    exercise(
        &cache,
        |key| String::from_utf8(cache.storage_key(key.as_bytes()).unwrap()).unwrap(),
        |key| node_of(key).command(&["GET", key]).unwrap(),
    )
    .await;
    // The 20 keys landed on every node.
    let nodes: std::collections::BTreeSet<usize> = (0..20)
        .map(|i| {
            let key = cache.storage_key(format!("p:{i}").as_bytes()).unwrap();
            cluster.node_of(std::str::from_utf8(&key).unwrap())
        })
        .collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");

    // A waiter on another connection is woken through the cluster's
    // pub/sub, over TLS.
    let b_store = CountingStore::new({
        let store = RedisStore::connect_cluster_with(cluster.urls(), tls_config(&certs)).unwrap();
        store.warm_up().await.unwrap();
        store
    });
    let b = catalog(b_store.clone());
    let (got, gets_after_wake) =
        support::wait_for_a_fill(cache, b, || b_store.gets(), "k", "filled").await;
    assert_eq!(got.as_deref(), Some("filled"));
    assert_eq!(gets_after_wake, 0, "woken by the message, not by polling");
}

/// What a caller sees when a connection cannot be made: `warm_up`'s error
/// and a read's, as text (Display and Debug).
async fn connect_failure(url: &str, config: RedisStoreConfig) -> String {
    let store = RedisStore::connect_with(url, config).expect("valid url");
    let warm = store.warm_up().await.unwrap_err();
    assert!(warm.is_store(), "{warm}");
    let read = store.get(b"k").await.unwrap_err();
    assert!(read.is_store(), "{read}");
    format!("{warm}\n{warm:?}\n{read}\n{read:?}")
}

#[tokio::test]
async fn a_server_whose_certificate_another_ca_signed_is_refused_with_a_certificate_error() {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs);
    let user = [
        "ACL",
        "SETUSER",
        "app",
        "on",
        ">hunter2-tls",
        "~*",
        "&*",
        "+@all",
    ];
    assert_eq!(server.command(&user).unwrap(), "OK");
    let url = format!("rediss://app:hunter2-tls@127.0.0.1:{}/", server.port());
    let other = TestCerts::generate();
    let config = patient()
        .connect_timeout(Duration::from_secs(1))
        .tls_ca_pem(other.ca_pem())
        .tls_client_cert_pem(other.client_cert_pem(), other.client_key_pem());
    let shown = connect_failure(&url, config).await;
    assert!(shown.contains("certificate"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
    // The right CA on the same URL works: the password was fine.
    let store = RedisStore::connect_with(&url, tls_config(&certs)).unwrap();
    store.warm_up().await.unwrap();
}

#[tokio::test]
async fn the_webpki_roots_do_not_trust_a_private_ca() {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls_with(&certs, &["--tls-auth-clients", "optional"]);
    let config = patient().connect_timeout(Duration::from_secs(1));
    let shown = connect_failure(&server.url(), config).await;
    assert!(shown.contains("certificate"), "{shown}");
    // With the CA, and no client certificate (optional here), it works.
    let store =
        RedisStore::connect_with(&server.url(), patient().tls_ca_pem(certs.ca_pem())).unwrap();
    store.warm_up().await.unwrap();
}

#[tokio::test]
async fn a_server_that_requires_a_client_certificate_refuses_a_client_without_one() {
    let certs = TestCerts::generate();
    let server = RedisServer::start_tls(&certs);
    let config = patient()
        .connect_timeout(Duration::from_secs(1))
        .tls_ca_pem(certs.ca_pem());
    let shown = connect_failure(&server.url(), config).await;
    assert!(shown.to_lowercase().contains("certificate"), "{shown}");
}
