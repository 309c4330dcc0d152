//! `Cache::inspect`: what the store holds for a key, judged on the store's
//! clock. Memory store on paused tokio time.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{Cache, Codec, Jitter, MemoryStore, Store, Stored};
use support::slow_loader;

fn cache(store: &MemoryStore) -> Cache<String> {
    Cache::builder()
        .namespace("inspect")
        .store(store.clone())
        .ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .grace(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn entry(stored: Stored) -> breakwater_cache::EntryView {
    match stored {
        Stored::Entry(entry) => entry,
        other => panic!("expected an entry, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_missing_key_is_missing() {
    let store = MemoryStore::new();
    let inspection = cache(&store).inspect("nothing").await.unwrap();
    assert_eq!(inspection.stored, Stored::Missing);
    assert_eq!(inspection.store_ttl, None);
    assert!(!inspection.lease_held);
    assert_eq!(inspection.storage_key, b"bw:inspect:v:{nothing}");
}

#[tokio::test(start_paused = true)]
async fn an_entry_is_fresh_then_stale_then_gone() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    cache.set("k", &"value".to_owned()).await.unwrap();

    let now = cache.inspect("k").await.unwrap();
    let fresh = entry(now.stored);
    assert_eq!(fresh.fresh_for, Some(Duration::from_secs(10)));
    assert_eq!(fresh.stale_for, Some(Duration::from_secs(70)));
    assert!(fresh.servable && !fresh.negative);
    assert_eq!(fresh.codec, Codec::msgpack());
    assert!(fresh.value_bytes > 0 && fresh.stored_bytes > fresh.value_bytes);
    assert_eq!(now.store_ttl, Some(Duration::from_secs(70)));

    tokio::time::advance(Duration::from_secs(15)).await;
    let stale = entry(cache.inspect("k").await.unwrap().stored);
    assert_eq!(stale.fresh_for, None);
    assert_eq!(stale.stale_for, Some(Duration::from_secs(55)));
    assert!(stale.servable, "within grace");

    tokio::time::advance(Duration::from_secs(60)).await;
    assert_eq!(cache.inspect("k").await.unwrap().stored, Stored::Missing);
}

#[tokio::test(start_paused = true)]
async fn a_negative_entry_says_so() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let got = cache
        .get_or_load("ghost", || async { Ok::<_, std::io::Error>(None) })
        .await
        .unwrap();
    assert_eq!(got, None);
    let negative = entry(cache.inspect("ghost").await.unwrap().stored);
    assert!(negative.negative);
    assert_eq!(negative.value_bytes, 0);
}

#[tokio::test(start_paused = true)]
async fn foreign_bytes_and_another_codec_are_unreadable() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let key = cache.storage_key(b"k").unwrap();
    store
        .set(&key, b"not an entry", Duration::from_secs(5))
        .await
        .unwrap();
    let Stored::Unreadable { bytes, reason } = cache.inspect("k").await.unwrap().stored else {
        panic!("expected unreadable bytes");
    };
    assert_eq!(bytes, 12);
    assert!(!reason.is_empty());

    let json: Cache<String> = Cache::builder()
        .namespace("inspect")
        .store(store.clone())
        .codec(Codec::json())
        .build()
        .unwrap();
    json.set("k", &"v".to_owned()).await.unwrap();
    let Stored::Unreadable { reason, .. } = cache.inspect("k").await.unwrap().stored else {
        panic!("expected another codec to be unreadable");
    };
    assert_eq!(reason, "written with codec json, this cache reads msgpack");
}

#[tokio::test(start_paused = true)]
async fn the_lease_shows_while_a_load_runs() {
    let store = MemoryStore::new();
    let cache = cache(&store);
    let calls = Arc::new(AtomicUsize::new(0));
    let load = {
        let cache = cache.clone();
        let loader = slow_loader(&calls, Duration::from_secs(1), "loaded");
        tokio::spawn(async move { cache.get_or_load("k", loader).await })
    };
    support::until("the load to start", || calls.load(Ordering::SeqCst) > 0).await;
    let during = cache.inspect("k").await.unwrap();
    assert!(during.lease_held);
    assert_eq!(during.stored, Stored::Missing);

    load.await.unwrap().unwrap();
    let after = cache.inspect("k").await.unwrap();
    assert!(!after.lease_held);
    assert!(entry(after.stored).fresh_for.is_some());
}

#[tokio::test(start_paused = true)]
async fn an_invalid_key_is_an_error() {
    let store = MemoryStore::new();
    let err = cache(&store).inspect("").await.unwrap_err();
    assert!(err.is_invalid_key(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn past_grace_an_entry_is_kept_but_not_served() {
    let store = MemoryStore::new();
    let cache: Cache<String> = Cache::builder()
        .namespace("inspect")
        .store(store.clone())
        .ttl(Duration::from_secs(10))
        .jitter(Jitter::none())
        .grace(Duration::from_secs(5))
        .max_stale(Duration::from_secs(3600))
        .build()
        .unwrap();
    cache.set("k", &"value".to_owned()).await.unwrap();
    tokio::time::advance(Duration::from_secs(12)).await;
    let in_grace = entry(cache.inspect("k").await.unwrap().stored);
    assert!(in_grace.fresh_for.is_none() && in_grace.servable);
    tokio::time::advance(Duration::from_secs(8)).await;
    let past_grace = entry(cache.inspect("k").await.unwrap().stored);
    assert!(past_grace.stale_for.is_some(), "kept for the fail-safe");
    assert!(!past_grace.servable, "a read loads");
}
