//! Tag invalidation: entries written with tags are unreachable once one of
//! their tags is invalidated, in this process and in others (two `Cache`s
//! are two processes), on the memory store with paused time, on a private
//! Redis and on a private Redis Cluster; and the acceptance run, two OS
//! processes reading tagged keys while a third invalidates the tag.

mod support;

use std::io::Read as _;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{
    Cache, ErrorKind, FencedWrite, Jitter, L1Config, LeaseAttempt, LoadContext, Loaded,
    MemoryStore, Notice, RedisStore, Served, Store, StoreFuture, Subscription,
};
use breakwater_cache_testkit::{RedisServer, TiedChild, tied_command};
use support::VersionFuture;
use tokio::time::sleep;

/// The database: a version every write bumps, and how many loads ran.
#[derive(Debug, Default)]
struct Db {
    version: AtomicU64,
    loads: AtomicUsize,
}

impl Db {
    fn update(&self) -> u64 {
        self.version.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A loader that reads the version when it starts and answers `delay`
    /// later.
    fn loader(
        self: &Arc<Self>,
        delay: Duration,
    ) -> impl Fn() -> VersionFuture + Clone + Send + Sync + 'static {
        let db = Arc::clone(self);
        move || {
            let db = Arc::clone(&db);
            Box::pin(async move {
                db.loads.fetch_add(1, Ordering::SeqCst);
                let version = db.version.load(Ordering::SeqCst);
                sleep(delay).await;
                Ok(Some(version))
            })
        }
    }
}

fn build(store: impl Store, l1: bool) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("tags")
        .store(store)
        .ttl(Duration::from_secs(60))
        .grace(Duration::from_secs(60))
        .jitter(Jitter::none());
    if l1 {
        builder.l1(L1Config::new()).build().unwrap()
    } else {
        builder.build().unwrap()
    }
}

/// `key` tagged `tags`, loaded from `db` at once if missing.
async fn tagged(
    cache: &Cache<u64>,
    db: &Arc<Db>,
    key: &str,
    tags: &[&str],
) -> (Option<u64>, Served) {
    let fetched = cache
        .entry(key)
        .tags(tags.iter().copied())
        .get_or_load_with_meta(db.loader(Duration::ZERO))
        .await
        .unwrap();
    (fetched.value, fetched.served)
}

/// A tagged value is gone for this process and another after
/// `invalidate_tag`, even inside its grace window (never served stale);
/// untagged keys and keys with other tags are untouched.
async fn invalidate_tag_reaches_every_process(a: Cache<u64>, b: Cache<u64>) {
    let db = Arc::new(Db::default());
    let v1 = db.update();
    assert_eq!(
        tagged(&a, &db, "user:7:name", &["user:7", "users"]).await,
        (Some(v1), Served::Loaded)
    );
    assert_eq!(
        tagged(&a, &db, "user:8:name", &["user:8", "users"]).await,
        (Some(v1), Served::Loaded)
    );
    assert_eq!(
        tagged(&a, &db, "user:8:mail", &["user:8"]).await,
        (Some(v1), Served::Loaded)
    );
    a.set("motd", &v1).await.unwrap();
    assert_eq!(
        b.get("user:7:name").await.unwrap(),
        Some(v1),
        "B reads A's tagged entry"
    );
    assert_eq!(
        tagged(&b, &db, "user:7:name", &["user:7"]).await,
        (Some(v1), Served::Hit)
    );

    let v2 = db.update();
    a.invalidate_tag("user:7").await.unwrap();
    for cache in [&a, &b] {
        assert_eq!(cache.get("user:7:name").await.unwrap(), None);
        assert_eq!(
            cache.get("user:8:name").await.unwrap(),
            Some(v1),
            "another tag"
        );
        assert_eq!(cache.get("motd").await.unwrap(), Some(v1), "untagged");
    }
    assert_eq!(
        tagged(&b, &db, "user:7:name", &["user:7", "users"]).await,
        (Some(v2), Served::Loaded)
    );
    assert_eq!(
        tagged(&a, &db, "user:7:name", &["user:7", "users"]).await,
        (Some(v2), Served::Hit)
    );

    // A tag shared by several entries: all go, the others stay.
    let v3 = db.update();
    b.invalidate_tag("users").await.unwrap();
    for cache in [&a, &b] {
        assert_eq!(cache.get("user:7:name").await.unwrap(), None);
        assert_eq!(cache.get("user:8:name").await.unwrap(), None);
        assert_eq!(cache.get("user:8:mail").await.unwrap(), Some(v1));
        assert_eq!(cache.get("motd").await.unwrap(), Some(v1));
    }
    assert_eq!(
        tagged(&a, &db, "user:8:name", &["user:8", "users"]).await,
        (Some(v3), Served::Loaded)
    );
    // A tag nobody used: nothing changes.
    a.invalidate_tag("nobody").await.unwrap();
    assert_eq!(b.get("user:8:name").await.unwrap(), Some(v3));
}

#[tokio::test(start_paused = true)]
async fn invalidate_tag_reaches_every_process_on_the_memory_store() {
    let store = MemoryStore::new();
    invalidate_tag_reaches_every_process(build(store.clone(), false), build(store, false)).await;
}

#[tokio::test]
async fn invalidate_tag_reaches_every_process_on_redis() {
    let server = RedisServer::start();
    let (a, b) = (
        support::connect(&server).await,
        support::connect(&server).await,
    );
    invalidate_tag_reaches_every_process(build(a, false), build(b, false)).await;
    // One counter per tag, with an expiry (an hour at least); no scan.
    let store = support::connect(&server).await;
    assert!(store.get(b"bw:tags:t:{user:7}").await.unwrap().is_some());
    let left = store.ttl(b"bw:tags:t:{user:7}").await.unwrap().unwrap();
    assert!(left > Duration::from_secs(3500), "{left:?}");
    assert!(
        !support::command_calls(&server)
            .iter()
            .any(|(cmd, _)| cmd.contains("scan") || cmd == "keys"),
        "{:?}",
        support::command_calls(&server)
    );
}

/// `invalidate_tags`: every entry of each named tag is gone, for this
/// process and another (whose L1 drops its copies when the one message
/// arrives); entries of other tags only, and untagged ones, stay; a tag
/// nobody used, or named twice, changes nothing else.
async fn invalidate_tags_reaches_every_process(a: Cache<u64>, b: Cache<u64>) {
    let db = Arc::new(Db::default());
    let v1 = db.update();
    let entries: [(&str, &[&str]); 4] = [
        ("shoe:1", &["shoes", "sale"]),
        ("hat:1", &["hats"]),
        ("bag:1", &["bags"]),
        ("bag:2", &["bags", "sale"]),
    ];
    for (key, tags) in entries {
        assert_eq!(tagged(&a, &db, key, tags).await, (Some(v1), Served::Loaded));
    }
    a.set("motd", &v1).await.unwrap();
    for (key, tags) in entries {
        assert_eq!(tagged(&b, &db, key, tags).await, (Some(v1), Served::Hit));
    }

    let v2 = db.update();
    a.invalidate_tags(["shoes", "hats", "nobody", "shoes"])
        .await
        .unwrap();
    let expected = [None, None, Some(v1), Some(v1)];
    for cache in [&a, &b] {
        until_gone(cache, "hat:1").await;
        for ((key, _), expected) in entries.iter().zip(expected) {
            assert_eq!(cache.get(*key).await.unwrap(), expected, "{key}");
        }
        assert_eq!(cache.get("motd").await.unwrap(), Some(v1), "untagged");
    }
    for ((key, tags), expected) in entries.iter().zip(expected) {
        let (value, served) = tagged(&b, &db, key, tags).await;
        match expected {
            None => assert_eq!((value, served), (Some(v2), Served::Loaded), "{key}"),
            Some(v) => {
                assert_eq!(value, Some(v), "{key}");
                assert!(matches!(served, Served::Hit | Served::L1Hit), "{key}");
            }
        }
    }
    // A tag shared with another: its entries go too, nothing else.
    b.invalidate_tags(["sale"]).await.unwrap();
    until_gone(&a, "bag:2").await;
    assert_eq!(a.get("bag:1").await.unwrap(), Some(v1));
    assert_eq!(a.get("hat:1").await.unwrap(), Some(v2));
    // Nothing named: nothing sent.
    a.invalidate_tags(Vec::<String>::new()).await.unwrap();
    let bad = a.invalidate_tags(["bags", ""]).await.unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidKey);
    assert_eq!(
        a.get("bag:1").await.unwrap(),
        Some(v1),
        "a bad tag refuses the whole call before the store"
    );
}

/// Waits (2 s at most) for `key` to read as a miss in `cache`: another
/// process's L1 copy goes when the bus brings the message.
async fn until_gone(cache: &Cache<u64>, key: &str) {
    for _ in 0..200 {
        if cache.get(key).await.unwrap().is_none() {
            return;
        }
        sleep(Duration::from_millis(10)).await;
    }
    panic!("{key} is still there 2 s after its tag's invalidation");
}

#[tokio::test(start_paused = true)]
async fn invalidate_tags_reaches_every_process_on_the_memory_store() {
    let store = MemoryStore::new();
    invalidate_tags_reaches_every_process(build(store.clone(), true), build(store, true)).await;
}

/// On Redis the batch is one script and one message, however many tags.
#[tokio::test]
async fn invalidate_tags_reaches_every_process_on_redis() {
    let server = RedisServer::start();
    let (a, b) = (
        support::connect(&server).await,
        support::connect(&server).await,
    );
    let (a, b) = (build(a, true), build(b, true));
    invalidate_tags_reaches_every_process(a.clone(), b).await;
    server.command(&["CONFIG", "RESETSTAT"]).unwrap();
    let tags: Vec<String> = (0..100).map(|i| format!("tag:{i}")).collect();
    a.invalidate_tags(&tags).await.unwrap();
    let calls = support::command_calls(&server);
    let of = |name: &str| calls.iter().find(|(c, _)| c == name).map_or(0, |(_, n)| *n);
    assert_eq!(
        (of("evalsha") + of("eval"), of("publish")),
        (1, 1),
        "{calls:?}"
    );
    // Each counter exists, with an expiry.
    let store = support::connect(&server).await;
    for tag in ["tag:0", "tag:99"] {
        let key = format!("bw:tags:t:{{{tag}}}");
        assert!(store.get(key.as_bytes()).await.unwrap().is_some(), "{key}");
        let left = store.ttl(key.as_bytes()).await.unwrap().unwrap();
        assert!(left > Duration::from_secs(3500), "{left:?}");
    }
}

#[tokio::test]
async fn tags_spread_over_a_cluster() {
    let (cluster, store) = support::cluster_store().await;
    let other = support::connect_cluster(&cluster).await;
    let (a, b) = (build(store, false), build(other, false));
    let db = Arc::new(Db::default());
    let v1 = db.update();
    // Tags on different slots than their keys and than each other.
    let tags = ["alpha", "beta", "gamma", "delta", "epsilon"];
    for i in 0..10 {
        let key = format!("k{i}");
        assert_eq!(
            tagged(&a, &db, &key, &tags[i % 5..]).await,
            (Some(v1), Served::Loaded)
        );
    }
    // Tagged hits read the entry and its counters side by side.
    for i in 0..10 {
        let key = format!("k{i}");
        assert_eq!(
            tagged(&b, &db, &key, &tags[i % 5..]).await,
            (Some(v1), Served::Hit),
            "{key}"
        );
    }
    a.invalidate_tag("gamma").await.unwrap();
    for i in 0..10 {
        let key = format!("k{i}");
        let expected = if i % 5 <= 2 { None } else { Some(v1) };
        assert_eq!(b.get(&key).await.unwrap(), expected, "{key}");
    }
    // A tagged read of an invalidated key misses, and loads it again.
    let v2 = db.update();
    for i in 0..10 {
        let key = format!("k{i}");
        let expected = if i % 5 <= 2 {
            (Some(v2), Served::Loaded)
        } else {
            (Some(v1), Served::Hit)
        };
        assert_eq!(
            tagged(&b, &db, &key, &tags[i % 5..]).await,
            expected,
            "{key}"
        );
    }
    // Tags on several nodes in one call: each slot's counters bumped.
    let v3 = db.update();
    a.invalidate_tags(["alpha", "delta"]).await.unwrap();
    for i in 0..10 {
        let key = format!("k{i}");
        let expected = if i % 5 <= 3 {
            (Some(v3), Served::Loaded)
        } else {
            (Some(v1), Served::Hit)
        };
        assert_eq!(
            tagged(&b, &db, &key, &tags[i % 5..]).await,
            expected,
            "{key}"
        );
    }
    a.invalidate_tag("epsilon").await.unwrap();
    for i in 0..10 {
        assert_eq!(b.get(format!("k{i}")).await.unwrap(), None);
    }
    let _ = v2;
}

/// A load that started before `invalidate_tag` and finishes after it is
/// visible nowhere: not to a caller of this process that starts after, not
/// in L1, not in the store.
async fn a_load_from_before_is_not_visible(l1: bool) {
    let store = MemoryStore::new();
    let cache = build(store.clone(), l1);
    let db = Arc::new(Db::default());
    let v1 = db.update();
    let first = {
        let (cache, loader) = (cache.clone(), db.loader(Duration::from_millis(500)));
        tokio::spawn(async move { cache.entry("k").tags(["t"]).get_or_load(loader).await })
    };
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        db.loads.load(Ordering::SeqCst),
        1,
        "the slow load is running"
    );
    let v2 = db.update();
    cache.invalidate_tag("t").await.unwrap();
    let after = tagged(&cache, &db, "k", &["t"]).await;
    assert_eq!(
        after,
        (Some(v2), Served::Loaded),
        "a call after invalidate_tag"
    );
    assert_eq!(
        first.await.unwrap().unwrap(),
        Some(v1),
        "the first caller started before"
    );
    sleep(Duration::from_secs(1)).await;
    let hit = if l1 { Served::L1Hit } else { Served::Hit };
    assert_eq!(tagged(&cache, &db, "k", &["t"]).await, (Some(v2), hit));
    assert_eq!(build(store, false).get("k").await.unwrap(), Some(v2));
}

#[tokio::test(start_paused = true)]
async fn a_load_from_before_is_not_visible_without_l1() {
    a_load_from_before_is_not_visible(false).await;
}

#[tokio::test(start_paused = true)]
async fn a_load_from_before_is_not_visible_with_l1() {
    a_load_from_before_is_not_visible(true).await;
}

/// Another process's load that started before `invalidate_tag` writes its
/// entry after it (no lease is revoked: the tag's generation is the fence):
/// the entry is in the store, and read as a miss everywhere.
#[tokio::test(start_paused = true)]
async fn another_process_load_from_before_lands_invalid() {
    let store = MemoryStore::new();
    let (a, b) = (build(store.clone(), false), build(store.clone(), false));
    let db = Arc::new(Db::default());
    let v1 = db.update();
    let slow = {
        let (b, loader) = (b.clone(), db.loader(Duration::from_millis(500)));
        tokio::spawn(async move { b.entry("k").tags(["t"]).get_or_load(loader).await })
    };
    sleep(Duration::from_millis(100)).await;
    let v2 = db.update();
    a.invalidate_tag("t").await.unwrap();
    assert_eq!(slow.await.unwrap().unwrap(), Some(v1));
    let storage_key = a.storage_key("k").unwrap();
    assert!(
        store.get(&storage_key).await.unwrap().is_some(),
        "B wrote its entry"
    );
    assert_eq!(a.get("k").await.unwrap(), None);
    assert_eq!(b.get("k").await.unwrap(), None);
    assert_eq!(
        tagged(&a, &db, "k", &["t"]).await,
        (Some(v2), Served::Loaded)
    );
}

/// A waiter that starts after `invalidate_tag` does not take the value an
/// older load's fill message carries to it: it reads the store (which
/// refuses it) and loads.
#[tokio::test(start_paused = true)]
async fn a_carried_tagged_value_from_before_is_not_taken() {
    let store = MemoryStore::new();
    let (a, b, c) = (
        build(store.clone(), false),
        build(store.clone(), false),
        build(store, false),
    );
    let db = Arc::new(Db::default());
    let v1 = db.update();
    let slow = {
        let (a, loader) = (a.clone(), db.loader(Duration::from_millis(500)));
        tokio::spawn(async move { a.entry("k").tags(["t"]).get_or_load(loader).await })
    };
    sleep(Duration::from_millis(100)).await;
    let v2 = db.update();
    c.invalidate_tag("t").await.unwrap();
    // B starts now: A holds the lease, so B waits to be woken by A's fill.
    let waiter = {
        let (b, loader) = (b.clone(), db.loader(Duration::ZERO));
        tokio::spawn(async move { b.entry("k").tags(["t"]).get_or_load_with_meta(loader).await })
    };
    assert_eq!(slow.await.unwrap().unwrap(), Some(v1));
    let got = waiter.await.unwrap().unwrap();
    assert_eq!(got.value, Some(v2), "{got:?}");
}

/// With L1, another process drops its copies when the tag's message
/// arrives: before it, its L1 answers (the documented bound); after it, a
/// value loaded after the invalidation.
#[tokio::test(start_paused = true)]
async fn another_process_l1_drops_tagged_values_when_the_message_arrives() {
    let store = MemoryStore::new();
    let (a, b) = (build(store.clone(), true), build(store, true));
    let db = Arc::new(Db::default());
    let v1 = db.update();
    assert_eq!(
        tagged(&b, &db, "k", &["t"]).await,
        (Some(v1), Served::Loaded)
    );
    assert_eq!(
        tagged(&b, &db, "k", &["t"]).await,
        (Some(v1), Served::L1Hit)
    );
    // A's first read: from the store.
    assert_eq!(tagged(&a, &db, "k", &["t"]).await, (Some(v1), Served::Hit));
    let loads = db.loads.load(Ordering::SeqCst);
    let v2 = db.update();
    a.invalidate_tag("t").await.unwrap();
    // B's bus delivers the message (the memory store's, in its own task);
    // nothing else is published (a refill by A would drop the key too).
    sleep(Duration::from_millis(1)).await;
    assert_eq!(
        tagged(&b, &db, "k", &["t"]).await,
        (Some(v2), Served::Loaded)
    );
    // In A, dropped when it returned.
    sleep(Duration::from_millis(1)).await;
    assert_eq!(tagged(&a, &db, "k", &["t"]).await, (Some(v2), Served::Hit));
    assert_eq!(db.loads.load(Ordering::SeqCst), loads + 1, "one load, by B");
}

/// In the invalidating process L1 is emptied before `invalidate_tag`
/// returns, with no message needed.
#[tokio::test(start_paused = true)]
async fn this_process_l1_drops_tagged_values_at_once() {
    let a = build(MemoryStore::new(), true);
    let db = Arc::new(Db::default());
    let v1 = db.update();
    assert_eq!(
        tagged(&a, &db, "k", &["t"]).await,
        (Some(v1), Served::Loaded)
    );
    assert_eq!(
        tagged(&a, &db, "k", &["t"]).await,
        (Some(v1), Served::L1Hit)
    );
    let v2 = db.update();
    a.invalidate_tag("t").await.unwrap();
    assert_eq!(
        tagged(&a, &db, "k", &["t"]).await,
        (Some(v2), Served::Loaded)
    );
}

/// An L1 that holds no tagged entry keeps its entries through a tag
/// invalidation (untagged hits stay L1 hits); one that does is emptied.
#[tokio::test(start_paused = true)]
async fn untagged_l1_entries_survive_a_tag_invalidation_when_none_is_tagged() {
    let store = CountingStore::new(MemoryStore::new());
    let a = build(store.clone(), true);
    let db = Arc::new(Db::default());
    let v1 = db.update();
    let plain = |cache: &Cache<u64>| {
        let (cache, loader) = (cache.clone(), db.loader(Duration::ZERO));
        async move { cache.get_or_load_with_meta("plain", loader).await.unwrap() }
    };
    assert_eq!(plain(&a).await.served, Served::Loaded);
    let gets = store.gets();
    a.invalidate_tag("t").await.unwrap();
    let hit = plain(&a).await;
    assert_eq!((hit.value, hit.served), (Some(v1), Served::L1Hit));
    assert_eq!(store.gets(), gets, "an L1 hit");
    // Once a tagged entry is in L1, a tag invalidation empties it.
    assert_eq!(
        tagged(&a, &db, "k", &["u"]).await,
        (Some(v1), Served::Loaded)
    );
    a.invalidate_tag("t").await.unwrap();
    let gets = store.gets();
    assert_eq!(plain(&a).await.value, Some(v1));
    assert_eq!(store.gets(), gets + 1, "read from the store again");
}

/// `CacheEntry::set` with tags: invalidated with its tag; without tags it is
/// a plain `set` with the call's settings.
#[tokio::test(start_paused = true)]
async fn set_with_tags() {
    let store = MemoryStore::new();
    let (a, b) = (build(store.clone(), true), build(store, false));
    a.entry("tagged").tags(["t", "u"]).set(&1).await.unwrap();
    a.entry("plain")
        .ttl(Duration::from_secs(5))
        .set(&2)
        .await
        .unwrap();
    assert_eq!(b.get("tagged").await.unwrap(), Some(1));
    assert_eq!(a.get("tagged").await.unwrap(), Some(1));
    b.invalidate_tag("u").await.unwrap();
    sleep(Duration::from_millis(1)).await;
    assert_eq!(a.get("tagged").await.unwrap(), None);
    assert_eq!(b.get("tagged").await.unwrap(), None);
    assert_eq!(a.get("plain").await.unwrap(), Some(2));
    sleep(Duration::from_secs(6)).await;
    assert_eq!(b.get("plain").await.unwrap(), None, "the call's ttl");
    // Set again after the invalidation: valid under the new generation.
    a.entry("tagged").tags(["u"]).set(&3).await.unwrap();
    assert_eq!(b.get("tagged").await.unwrap(), Some(3));
}

#[tokio::test(start_paused = true)]
async fn bad_tags_are_refused_before_the_store() {
    let cache = build(MemoryStore::new(), false);
    let load = || async { Ok::<_, std::io::Error>(Some(1)) };
    let empty = cache
        .entry("k")
        .tags([""])
        .get_or_load(load)
        .await
        .unwrap_err();
    assert_eq!(empty.kind(), ErrorKind::InvalidKey, "{empty}");
    let long = "x".repeat(257);
    let err = cache
        .entry("k")
        .tags([long.as_str()])
        .set(&1)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
    let err = cache
        .entry("k")
        .tags(&many)
        .get_or_load(load)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    assert!(
        cache
            .entry("k")
            .tags(&many[..16])
            .get_or_load(load)
            .await
            .is_ok()
    );
    assert_eq!(
        cache.invalidate_tag("").await.unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
    assert_eq!(
        cache.invalidate_tag(long).await.unwrap_err().kind(),
        ErrorKind::InvalidKey
    );
}

/// A memory store whose reads of tag counters fail while `down` is set.
#[derive(Clone, Debug)]
struct TagsDown {
    inner: MemoryStore,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl TagsDown {
    fn failing(&self, key: &[u8]) -> bool {
        self.down.load(Ordering::SeqCst) && key.windows(3).any(|w| w == b":t:")
    }
}

impl Store for TagsDown {
    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        if self.failing(key) {
            return Box::pin(async { Err(breakwater_cache::Error::store_msg("connection reset")) });
        }
        self.inner.get(key)
    }
    fn get_many<'a>(&'a self, keys: &'a [&'a [u8]]) -> StoreFuture<'a, Vec<Option<Vec<u8>>>> {
        if keys.iter().any(|k| self.failing(k)) {
            return Box::pin(async { Err(breakwater_cache::Error::store_msg("connection reset")) });
        }
        self.inner.get_many(keys)
    }
    fn set<'a>(&'a self, k: &'a [u8], v: &'a [u8], t: Duration) -> StoreFuture<'a, ()> {
        self.inner.set(k, v, t)
    }
    fn delete<'a>(&'a self, k: &'a [u8]) -> StoreFuture<'a, bool> {
        self.inner.delete(k)
    }
    fn ttl<'a>(&'a self, k: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        self.inner.ttl(k)
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
    fn name(&self) -> &'static str {
        "tags-down"
    }
    fn acquire_lease<'a>(
        &'a self,
        l: &'a [u8],
        t: &'a [u8],
        d: Duration,
    ) -> StoreFuture<'a, LeaseAttempt> {
        self.inner.acquire_lease(l, t, d)
    }
    fn lease_held<'a>(&'a self, l: &'a [u8]) -> StoreFuture<'a, bool> {
        self.inner.lease_held(l)
    }
    fn extend_lease<'a>(&'a self, l: &'a [u8], t: &'a [u8], d: Duration) -> StoreFuture<'a, bool> {
        self.inner.extend_lease(l, t, d)
    }
    fn release_lease<'a>(
        &'a self,
        l: &'a [u8],
        t: &'a [u8],
        n: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.inner.release_lease(l, t, n)
    }
    fn fenced_set<'a>(&'a self, w: FencedWrite<'a>) -> StoreFuture<'a, bool> {
        self.inner.fenced_set(w)
    }
    fn replace<'a>(
        &'a self,
        k: &'a [u8],
        v: &'a [u8],
        t: Duration,
        l: &'a [u8],
        n: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.inner.replace(k, v, t, l, n)
    }
    fn invalidate<'a>(&'a self, k: &'a [u8], l: &'a [u8], n: Notice<'a>) -> StoreFuture<'a, ()> {
        self.inner.invalidate(k, l, n)
    }
    fn bump_generation<'a>(
        &'a self,
        k: &'a [u8],
        fresh: u64,
        ttl: Duration,
        n: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        self.inner.bump_generation(k, fresh, ttl, n)
    }
    fn tag_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u64>> {
        if keys.iter().any(|k| self.failing(k)) {
            return Box::pin(async { Err(breakwater_cache::Error::store_msg("connection reset")) });
        }
        self.inner.tag_generations(keys, fresh, ttl)
    }
    fn publish<'a>(&'a self, c: &'a [u8], m: &'a [u8]) -> StoreFuture<'a, ()> {
        self.inner.publish(c, m)
    }
    fn subscribe(&self, c: &[u8]) -> Subscription {
        self.inner.subscribe(c)
    }
}

/// When the tags' generations cannot be read, a tagged load is served but
/// not written (nothing could tell it from a load before an invalidation),
/// and a tagged entry already stored is not served from the store (the
/// read counts as failed: the value is loaded directly); untagged keys are
/// untouched. `set` with tags fails and writes nothing.
#[tokio::test(start_paused = true)]
async fn unreadable_generations_mean_served_not_written() {
    let store = TagsDown {
        inner: MemoryStore::new(),
        down: Arc::default(),
    };
    let cache = build(store.clone(), false);
    let db = Arc::new(Db::default());
    let v1 = db.update();
    assert_eq!(
        tagged(&cache, &db, "old", &["t"]).await,
        (Some(v1), Served::Loaded)
    );
    cache.set("plain", &v1).await.unwrap();
    store.down.store(true, Ordering::SeqCst);
    let v2 = db.update();
    assert_eq!(
        tagged(&cache, &db, "new", &["t"]).await,
        (Some(v2), Served::Loaded)
    );
    let storage_key = cache.storage_key("new").unwrap();
    assert_eq!(
        store.inner.get(&storage_key).await.unwrap(),
        None,
        "not written"
    );
    assert_eq!(
        tagged(&cache, &db, "old", &["t"]).await,
        (Some(v2), Served::Loaded)
    );
    assert_eq!(cache.get("plain").await.unwrap(), Some(v1));
    let err = cache.entry("new").tags(["t"]).set(&9).await.unwrap_err();
    assert!(err.is_store(), "{err}");
    assert_eq!(store.inner.get(&storage_key).await.unwrap(), None);
    // Back: the stored tagged entry is valid again (nothing invalidated it).
    store.down.store(false, Ordering::SeqCst);
    assert_eq!(
        tagged(&cache, &db, "old", &["t"]).await,
        (Some(v1), Served::Hit)
    );
}

/// Both versions of a version transition share their tags: invalidating a
/// tag in the new version also stops the previous version's entry from
/// standing in.
#[tokio::test(start_paused = true)]
async fn a_version_transition_shares_tags() {
    let store = MemoryStore::new();
    let db = Arc::new(Db::default());
    let v1 = db.update();
    let old = Cache::<u64>::builder()
        .namespace("tags")
        .store(store.clone())
        .version(1)
        .build()
        .unwrap();
    assert_eq!(
        tagged(&old, &db, "k", &["t"]).await,
        (Some(v1), Served::Loaded)
    );
    let new = Cache::<u64>::builder()
        .namespace("tags")
        .store(store)
        .version(2)
        .version_transition(Duration::from_secs(600))
        .build()
        .unwrap();
    let v2 = db.update();
    new.invalidate_tag("t").await.unwrap();
    // Without the tag the previous version's entry would stand in (stale).
    assert_eq!(
        tagged(&new, &db, "k", &["t"]).await,
        (Some(v2), Served::Loaded)
    );
    assert_eq!(old.get("k").await.unwrap(), None, "in the old version too");
}

// --- acceptance: two OS processes reading while a third invalidates ---

/// Keys each reader process reads; task `t` of a process reads keys
/// `t, t + TASKS, ...`, so no two tasks of one process share a key (no
/// in-process joins), while both processes read every key.
const KEYS: u64 = 16;
const TASKS: u64 = 4;
const DATA: &[u8] = b"acceptance:data";
const RETURNED: &[u8] = b"acceptance:returned";

async fn read_u64(store: &RedisStore, key: &[u8]) -> u64 {
    let bytes = store.get(key).await.unwrap().unwrap_or_default();
    String::from_utf8(bytes).unwrap().parse().unwrap_or(0)
}

async fn write_u64(store: &RedisStore, key: &[u8], n: u64) {
    store
        .set(key, n.to_string().as_bytes(), Duration::from_secs(600))
        .await
        .unwrap();
}

/// One reader process (run by `invalidate_tag_under_traffic_from_two_processes`
/// as a child, with `BW_TAGS_READER` set; a no-op otherwise): reads tagged
/// keys in a loop; before each read it notes the last invalidation known to
/// have returned; the value read must have been loaded after it (a loader
/// returns the data version, which is bumped before each invalidation).
/// Prints `reads=<n> checked=<m> violations=<v>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_process() {
    let Ok(url) = std::env::var("BW_TAGS_READER") else {
        return;
    };
    let run_for = Duration::from_millis(std::env::var("BW_TAGS_READ_MS").unwrap().parse().unwrap());
    let store = RedisStore::connect_with(&url, support::patient()).unwrap();
    store.warm_up().await.unwrap();
    let data = RedisStore::connect_with(&url, support::patient()).unwrap();
    let cache = build(store, false);
    let deadline = tokio::time::Instant::now() + run_for;
    // With `BW_TAGS_SHARED` the tasks of one process share keys (and so
    // join each other's loads and reads): a call that joins a flight in the
    // air before the tag's message reached this process gets its result,
    // the bound the contract documents for `invalidate` too. Not asserted;
    // for measuring.
    let stride = if std::env::var_os("BW_TAGS_SHARED").is_some_and(|v| !v.is_empty()) {
        1
    } else {
        TASKS
    };
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (cache, data) = (cache.clone(), data.clone());
            tokio::spawn(async move {
                let (mut reads, mut checked, mut violations) = (0u64, 0u64, 0u64);
                let mut key = task;
                while tokio::time::Instant::now() < deadline {
                    let returned = read_u64(&data, RETURNED).await;
                    let loader_data = data.clone();
                    let got = cache
                        .entry(format!("k{key}"))
                        .tags(["all", "readers"])
                        .get_or_load(move || async move {
                            Ok::<_, std::io::Error>(Some(read_u64(&loader_data, DATA).await))
                        })
                        .await
                        .unwrap()
                        .unwrap();
                    reads += 1;
                    if returned > 0 {
                        checked += 1;
                    }
                    if got < returned {
                        violations += 1;
                        eprintln!("k{key}: read {got} after invalidation {returned} returned");
                    }
                    key = (key + stride) % KEYS;
                }
                (reads, checked, violations)
            })
        })
        .collect();
    let (mut reads, mut checked, mut violations) = (0, 0, 0);
    for task in tasks {
        let (r, c, v) = task.await.unwrap();
        (reads, checked, violations) = (reads + r, checked + c, violations + v);
    }
    println!("reads={reads} checked={checked} violations={violations}");
}

/// The acceptance run: two reader processes (this test binary again, as
/// [`reader_process`]) read 16 tagged keys, 4 tasks each, for 4 s, while
/// this process bumps the data and calls `invalidate_tag` 50 times, then
/// records that it returned. No read that started after an
/// `invalidate_tag` returned may see a value loaded before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidate_tag_under_traffic_from_two_processes() {
    let server = RedisServer::start();
    let read_ms = 4000;
    let mut readers: Vec<TiedChild> = (0..2)
        .map(|_| {
            let mut cmd = tied_command(std::env::current_exe().unwrap());
            cmd.args([
                "--exact",
                "reader_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("BW_TAGS_READER", server.url())
            .env("BW_TAGS_READ_MS", read_ms.to_string())
            .env(
                "BW_TAGS_SHARED",
                std::env::var_os("BW_TAGS_SHARED").unwrap_or_default(),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
            TiedChild::spawn(cmd).unwrap()
        })
        .collect();
    let data = support::connect(&server).await;
    let cache = build(support::connect(&server).await, false);
    // Let the readers fill the keys first.
    sleep(Duration::from_millis(800)).await;
    let invalidations = 50;
    for i in 1..=invalidations {
        write_u64(&data, DATA, i).await;
        cache.invalidate_tag("readers").await.unwrap();
        write_u64(&data, RETURNED, i).await;
        sleep(Duration::from_millis(40)).await;
    }
    let (mut reads, mut checked, mut violations) = (0u64, 0u64, 0u64);
    for reader in &mut readers {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = reader.try_wait().unwrap() {
                break status;
            }
            assert!(tokio::time::Instant::now() < deadline, "a reader hung");
            sleep(Duration::from_millis(50)).await;
        };
        assert!(status.success(), "{status:?}");
        let mut out = String::new();
        reader
            .take_stdout()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        // (The test harness may print its own words on the same line.)
        let line = out
            .lines()
            .find_map(|l| l.find("reads=").map(|at| &l[at..]))
            .unwrap_or_else(|| panic!("no counts in {out:?}"));
        let counts: Vec<u64> = line
            .split(' ')
            .map(|kv| kv.split('=').nth(1).unwrap().parse().unwrap())
            .collect();
        reads += counts[0];
        checked += counts[1];
        violations += counts[2];
    }
    println!(
        "acceptance: {invalidations} invalidations, {reads} reads by 2 processes, \
         {checked} started after one returned, {violations} saw a value from before"
    );
    assert!(
        checked > 1000,
        "too little traffic to tell: {checked} reads checked"
    );
    assert_eq!(violations, 0);
}

/// `get_many` reads tagged entries as `get_or_load` does: one whose tag
/// was invalidated is a miss (loaded again), here and in another process.
async fn get_many_sees_a_tag_invalidation(a: Cache<u64>, b: Cache<u64>) {
    let db = Arc::new(Db::default());
    tagged(&a, &db, "k1", &["t"]).await;
    tagged(&a, &db, "k2", &[]).await;
    db.version.fetch_add(1, Ordering::SeqCst);
    let load = |keys: Vec<String>| async move {
        Ok::<_, std::io::Error>(keys.into_iter().map(|k| (k, 100)).collect::<Vec<_>>())
    };
    // Before: both cached.
    assert_eq!(
        b.get_many(["k1", "k2"].map(String::from), load)
            .await
            .unwrap(),
        [Some(0), Some(0)]
    );
    a.invalidate_tag("t").await.unwrap();
    for cache in [&a, &b] {
        let got = cache
            .get_many_with_meta(["k1", "k2"].map(String::from), load)
            .await;
        let got: Vec<_> = got.into_iter().map(|g| g.unwrap()).collect();
        assert_eq!(got[0].value, Some(100), "the tagged entry was invalidated");
        assert_eq!(got[1].value, Some(0), "the untagged one was not");
    }
}

#[tokio::test(start_paused = true)]
async fn get_many_sees_a_tag_invalidation_on_the_memory_store() {
    let store = MemoryStore::new();
    get_many_sees_a_tag_invalidation(build(store.clone(), false), build(store, false)).await;
}

#[tokio::test]
async fn get_many_sees_a_tag_invalidation_on_redis() {
    let server = RedisServer::start();
    let (a, b) = (
        support::connect(&server).await,
        support::connect(&server).await,
    );
    get_many_sees_a_tag_invalidation(build(a, false), build(b, false)).await;
}

// --- a lost tag counter never validates an entry ---

/// Keys of the lost-counter runs; key `i` carries tag `g{i % LOST_TAGS}`.
const LOST_KEYS: usize = 300;
const LOST_TAGS: usize = 30;
/// Tags `g0`..`g4` are invalidated before the entries are written (their
/// counters exist then); the other 25 have no counter when theirs are.
const INVALIDATED_FIRST: usize = 5;

fn lost_key(i: usize) -> String {
    format!("k{i}")
}

fn lost_tag(i: usize) -> String {
    format!("g{}", i % LOST_TAGS)
}

/// The counter of tag `g{t}` in `build`'s namespace.
fn counter_key(t: usize) -> String {
    format!("bw:tags:t:{{g{t}}}")
}

/// A raw connection to `server`, for what a cache never does (filling
/// memory, deleting counters, looking at TTLs).
async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: impl AsRef<[u8]>) -> bool {
    let n: i64 = redis::cmd("EXISTS")
        .arg(key.as_ref())
        .query_async(conn)
        .await
        .unwrap();
    n == 1
}

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

/// Writes the [`LOST_KEYS`] tagged entries at the database's next version
/// (after invalidating the first [`INVALIDATED_FIRST`] tags), then moves
/// the database on and invalidates every tag. Returns the version from
/// before: no read from now on may get it.
async fn tagged_then_invalidated(cache: &Cache<u64>, db: &Arc<Db>) -> u64 {
    for t in 0..INVALIDATED_FIRST {
        cache.invalidate_tag(format!("g{t}")).await.unwrap();
    }
    let old = db.update();
    for i in 0..LOST_KEYS {
        assert_eq!(
            tagged(cache, db, &lost_key(i), &[&lost_tag(i)]).await,
            (Some(old), Served::Loaded)
        );
    }
    db.update();
    for t in 0..LOST_TAGS {
        cache.invalidate_tag(format!("g{t}")).await.unwrap();
    }
    old
}

/// Every key read 4 times (1,200 tagged reads), as `tagged` does; how many
/// got `old`.
async fn old_values_served(cache: &Cache<u64>, db: &Arc<Db>, old: u64) -> usize {
    let mut served = 0;
    for _ in 0..4 {
        for i in 0..LOST_KEYS {
            let (value, _) = tagged(cache, db, &lost_key(i), &[&lost_tag(i)]).await;
            if value == Some(old) {
                served += 1;
            }
        }
    }
    served
}

/// Redis under `maxmemory` with `allkeys-lru` evicts tag counters like
/// any key. Entries written while their tag had no counter, then
/// invalidated; memory filled until counters are evicted (while entries
/// of their tags survive): no read serves a value from before the
/// invalidation. (When a missing counter read as 0, which those entries
/// had recorded, 160 to 348 of the 1,200 reads did, with 10 or 11 of the
/// 30 counters evicted, in 5 runs.)
#[tokio::test]
async fn an_evicted_tag_counter_validates_nothing() {
    let server = RedisServer::start_with(&[
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "allkeys-lru",
        "--maxmemory-samples",
        "10",
    ]);
    let cache = build(support::connect(&server).await, false);
    let db = Arc::new(Db::default());
    let old = tagged_then_invalidated(&cache, &db).await;
    let mut conn = raw(&server).await;
    let entries: Vec<Vec<u8>> = (0..LOST_KEYS)
        .map(|i| cache.storage_key(lost_key(i)).unwrap())
        .collect();
    // Filler keys until a third of the counters are gone, the entries
    // read (kept recently used) after each batch, counters only looked at
    // with EXISTS (which leaves their LRU clock alone).
    let filler = vec![b'x'; 1024];
    let mut evicted = Vec::new();
    for batch in 0..400 {
        let mut pipe = redis::pipe();
        for n in 0..100 {
            pipe.cmd("SET")
                .arg(format!("filler:{batch}:{n}"))
                .arg(&filler)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
        let mut touch = redis::pipe();
        for key in &entries {
            touch.cmd("GET").arg(key).ignore();
        }
        let () = touch.query_async(&mut conn).await.unwrap();
        evicted.clear();
        for t in 0..LOST_TAGS {
            if !exists(&mut conn, counter_key(t)).await {
                evicted.push(t);
            }
        }
        if evicted.len() >= LOST_TAGS / 3 {
            break;
        }
    }
    let mut stranded = 0;
    for (i, key) in entries.iter().enumerate() {
        if evicted.contains(&(i % LOST_TAGS)) && exists(&mut conn, key).await {
            stranded += 1;
        }
    }
    println!(
        "evicted: {} of {LOST_TAGS} counters; {stranded} entries of their tags left",
        evicted.len()
    );
    assert!(
        evicted.len() >= LOST_TAGS / 3,
        "memory pressure evicted only {} counters: the test proves nothing",
        evicted.len()
    );
    assert!(
        stranded > 0,
        "no entry outlived its tag's counter: the test proves nothing"
    );
    let served = old_values_served(&cache, &db, old).await;
    assert_eq!(
        served, 0,
        "of 1,200 reads, {served} served a value from before"
    );
}

/// Tag counters deleted (by an operator, a `FLUSH` of the wrong pattern, a
/// failover that lost them): an entry written while its tag had no counter
/// reads as a miss, not as valid. (When a missing counter read as 0, 1,000
/// of the 1,200 reads served a value from before: every read of the 25
/// tags that had no counter when their entries were written.) Every counter has a TTL,
/// whether a write or an invalidation created it.
#[tokio::test]
async fn a_deleted_tag_counter_validates_nothing() {
    let server = RedisServer::start();
    let cache = build(support::connect(&server).await, false);
    let mut conn = raw(&server).await;
    let db = Arc::new(Db::default());
    let old = tagged_then_invalidated(&cache, &db).await;
    for t in 0..LOST_TAGS {
        let left = pttl(&mut conn, &counter_key(t)).await;
        assert!(left > 3_500_000, "g{t}'s counter has PTTL {left}");
    }
    for i in 0..LOST_KEYS {
        let key = cache.storage_key(lost_key(i)).unwrap();
        assert!(exists(&mut conn, &key).await, "entry {i} is still there");
    }
    let deleted: i64 = redis::cmd("DEL")
        .arg((0..LOST_TAGS).map(counter_key).collect::<Vec<_>>())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(deleted, LOST_TAGS as i64);
    let served = old_values_served(&cache, &db, old).await;
    assert_eq!(
        served, 0,
        "of 1,200 reads, {served} served a value from before"
    );
    // The loads since wrote their counters again, with TTLs.
    for t in 0..LOST_TAGS {
        assert!(pttl(&mut conn, &counter_key(t)).await > 3_500_000);
    }
}

/// A counter an earlier build left without a TTL gets one from the next
/// tagged write, and keeps its generation: its entries stay valid.
#[tokio::test]
async fn a_counter_without_a_ttl_gets_one() {
    let server = RedisServer::start();
    let cache = build(support::connect(&server).await, false);
    let mut conn = raw(&server).await;
    let legacy = "bw:tags:t:{legacy}";
    let () = redis::cmd("SET")
        .arg(legacy)
        .arg("1700000000000")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(pttl(&mut conn, legacy).await, -1);
    let db = Arc::new(Db::default());
    let v1 = db.update();
    assert_eq!(
        tagged(&cache, &db, "legacy", &["legacy"]).await,
        (Some(v1), Served::Loaded)
    );
    assert!(pttl(&mut conn, legacy).await > 3_500_000);
    let stored: String = redis::cmd("GET")
        .arg(legacy)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored, "1700000000000");
    assert_eq!(
        tagged(&cache, &db, "legacy", &["legacy"]).await,
        (Some(v1), Served::Hit)
    );
    // An invalidation of a counter without a TTL gives it one too.
    let () = redis::cmd("PERSIST")
        .arg(legacy)
        .query_async::<i64>(&mut conn)
        .await
        .map(drop)
        .unwrap();
    cache.invalidate_tag("legacy").await.unwrap();
    assert!(pttl(&mut conn, legacy).await > 3_500_000);
    assert_eq!(cache.get("legacy").await.unwrap(), None);
}

// --- tags chosen by the loader ---

/// A context loader that reads `db`'s version when it starts, answers
/// `delay` later, and tags the value with `tags`.
fn tagging_loader(
    db: &Arc<Db>,
    delay: Duration,
    tags: &'static [&'static str],
) -> impl FnOnce(LoadContext<u64>) -> ContextFuture + Clone + Send + Sync + 'static {
    let db = Arc::clone(db);
    move |_ctx| {
        Box::pin(async move {
            db.loads.fetch_add(1, Ordering::SeqCst);
            let version = db.version.load(Ordering::SeqCst);
            sleep(delay).await;
            Ok(Loaded::value(version).tags(tags.iter().copied()))
        })
    }
}

type ContextFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Loaded<u64>, std::io::Error>> + Send>,
>;

async fn load_tagged(
    cache: &Cache<u64>,
    db: &Arc<Db>,
    key: &str,
    tags: &'static [&'static str],
) -> (Option<u64>, Served) {
    let fetched = cache
        .get_or_load_with_context_meta(key, tagging_loader(db, Duration::ZERO, tags))
        .await
        .unwrap();
    (fetched.value, fetched.served)
}

/// Tags a loader chose after the load reach the entry as a call's do:
/// `invalidate_tag` from another process makes it a miss there and here,
/// `expire_tag` stale. A tag's first load (its counter is new: it may have
/// been lost with an invalidation in it) is served, not written; the next
/// one is. `a` has no L1 (each call reads the store), `b` has one.
async fn loader_chosen_tags_are_invalidated_everywhere(a: Cache<u64>, b: Cache<u64>) {
    let db = Arc::new(Db::default());
    let v1 = db.update();
    let key = "product:5";
    assert_eq!(
        load_tagged(&a, &db, key, &["shop:3"]).await,
        (Some(v1), Served::Loaded)
    );
    assert_eq!(
        b.get(key).await.unwrap(),
        None,
        "a new tag's first load is not written"
    );
    // Nor is one that starts right after the counter's start (within the
    // clock skew allowed for): a moment later, the next one is.
    sleep(Duration::from_millis(200)).await;
    assert_eq!(
        load_tagged(&a, &db, key, &["shop:3"]).await,
        (Some(v1), Served::Loaded)
    );
    assert_eq!(b.get(key).await.unwrap(), Some(v1), "the second one is");
    assert_eq!(
        load_tagged(&a, &db, key, &["shop:3"]).await,
        (Some(v1), Served::Hit)
    );
    assert_eq!(
        load_tagged(&b, &db, key, &["shop:3"]).await,
        (Some(v1), Served::L1Hit)
    );
    assert_eq!(db.loads.load(Ordering::SeqCst), 2);

    let v2 = db.update();
    b.invalidate_tag("shop:3").await.unwrap();
    for cache in [&a, &b] {
        assert_eq!(cache.get(key).await.unwrap(), None, "invalidated");
    }
    // The first load after the invalidation dates it (a hard bump leaves
    // no time), so it is not written; the next one is.
    for _ in 0..2 {
        assert_eq!(
            load_tagged(&a, &db, key, &["shop:3"]).await,
            (Some(v2), Served::Loaded)
        );
        sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(b.get(key).await.unwrap(), Some(v2), "written again");

    let v3 = db.update();
    a.expire_tag("shop:3").await.unwrap();
    // (A load that starts within the clock skew allowed for after it
    // lands stale too.)
    sleep(Duration::from_millis(200)).await;
    let stale = load_tagged(&b, &db, key, &["shop:3"]).await;
    assert!(
        matches!(stale, (Some(v), Served::Stale { .. }) if v == v2),
        "{stale:?}"
    );
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        load_tagged(&a, &db, key, &["shop:3"]).await,
        (Some(v3), Served::Hit),
        "refreshed in the background"
    );
}

#[tokio::test(start_paused = true)]
async fn loader_chosen_tags_are_invalidated_everywhere_on_the_memory_store() {
    let store = MemoryStore::new();
    loader_chosen_tags_are_invalidated_everywhere(build(store.clone(), false), build(store, true))
        .await;
}

#[tokio::test]
async fn loader_chosen_tags_are_invalidated_everywhere_on_redis() {
    let server = RedisServer::start();
    let (a, b) = (
        support::connect(&server).await,
        support::connect(&server).await,
    );
    loader_chosen_tags_are_invalidated_everywhere(build(a, false), build(b, true)).await;
    // The counter records when it last changed hard.
    let store = support::connect(&server).await;
    let counter = store.get(b"bw:tags:t:{shop:3}").await.unwrap().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&counter).split(':').count(),
        4,
        "{}",
        String::from_utf8_lossy(&counter)
    );
}

/// A load that began before another process's `invalidate_tag` of a tag
/// its loader chooses (the tags are known only after it) does not write
/// its value: the tag's counter is read after the load, and it changed
/// since the load began. Nobody is served it afterwards.
#[tokio::test(start_paused = true)]
async fn a_load_from_before_an_invalidation_of_a_tag_it_chose_is_not_written() {
    let store = MemoryStore::new();
    let (a, b) = (build(store.clone(), true), build(store.clone(), false));
    let db = Arc::new(Db::default());
    db.update();
    // The tag's counter exists (a first load made it).
    load_tagged(&a, &db, "warm-up", &["shop:3"]).await;
    sleep(Duration::from_millis(200)).await;
    let v1 = db.update();
    let slow = {
        let loader = tagging_loader(&db, Duration::from_millis(500), &["shop:3"]);
        let a = a.clone();
        tokio::spawn(async move { a.get_or_load_with_context("product:5", loader).await })
    };
    sleep(Duration::from_millis(100)).await;
    let v2 = db.update();
    b.invalidate_tag("shop:3").await.unwrap();
    assert_eq!(
        slow.await.unwrap().unwrap(),
        Some(v1),
        "its own callers get it"
    );
    assert_eq!(b.get("product:5").await.unwrap(), None, "not in the store");
    assert_eq!(a.get("product:5").await.unwrap(), None, "nor in L1");
    sleep(Duration::from_millis(200)).await;
    assert_eq!(
        load_tagged(&b, &db, "product:5", &["shop:3"]).await,
        (Some(v2), Served::Loaded)
    );
    assert_eq!(a.get("product:5").await.unwrap(), Some(v2));
}

/// `get_many_with_context`: each key's loader-chosen tags (read once for
/// the batch) are recorded in its entry; `invalidate_tag` of one shop
/// makes its products misses and leaves the others'.
#[tokio::test(start_paused = true)]
async fn get_many_records_the_tags_each_key_chose() {
    let store = MemoryStore::new();
    let counting = CountingStore::new(store.clone());
    let (a, b) = (build(counting.clone(), false), build(store, false));
    let db = Arc::new(Db::default());
    let load = {
        let db = Arc::clone(&db);
        move |keys: Vec<(u64, LoadContext<u64>)>| {
            let version = db.version.load(Ordering::SeqCst);
            async move {
                Ok::<_, std::io::Error>(
                    keys.into_iter()
                        .map(|(id, _)| {
                            let shop = format!("shop:{}", id % 2);
                            (
                                id,
                                Loaded::value(version).tags([shop, "products".to_string()]),
                            )
                        })
                        .collect::<Vec<_>>(),
                )
            }
        }
    };
    let v1 = db.update();
    let ids: Vec<u64> = (0..10).collect();
    // The first batch makes the counters; the second is written.
    for _ in 0..2 {
        let got = a
            .get_many_with_context(ids.clone(), load.clone())
            .await
            .unwrap();
        assert!(got.iter().all(|v| *v == Some(v1)), "{got:?}");
        sleep(Duration::from_millis(200)).await;
    }
    let states = counting.tag_state_reads();
    assert_eq!(states, 2, "one read of the chosen tags per batch");
    let got = b
        .get_many(ids.clone(), |_| async {
            Ok::<_, std::io::Error>(Vec::<(u64, u64)>::new())
        })
        .await
        .unwrap();
    assert!(got.iter().all(|v| *v == Some(v1)), "written: {got:?}");

    let v2 = db.update();
    b.invalidate_tag("shop:1").await.unwrap();
    sleep(Duration::from_millis(200)).await;
    let got = a
        .get_many_with_context(ids.clone(), load.clone())
        .await
        .unwrap();
    for (id, value) in ids.iter().zip(&got) {
        let want = if id % 2 == 1 { v2 } else { v1 };
        assert_eq!(*value, Some(want), "product {id}");
    }
}

/// A loader's tags are checked like a call's: empty, too long or too many
/// (its call's included) is a `Config` error for that load.
#[tokio::test(start_paused = true)]
async fn bad_tags_from_a_loader_are_config_errors() {
    let cache = build(MemoryStore::new(), false);
    let too_many: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
    let long = "x".repeat(257);
    for (tags, says) in [
        (vec![String::new()], "a tag must not be empty"),
        (vec![long], "the limit is 256"),
        (too_many, "17 tags on one entry"),
    ] {
        let err = cache
            .get_or_load_with_context("k", move |_ctx: LoadContext<u64>| async move {
                Ok::<_, std::io::Error>(Loaded::value(1).tags(tags))
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }
    // Ten from the call and ten from the loader: 20 in all.
    let call: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    let loader: Vec<String> = (0..10).map(|i| format!("l{i}")).collect();
    let err = cache
        .entry("k2")
        .tags(call)
        .get_or_load_with_context(move |_ctx: LoadContext<u64>| async move {
            Ok::<_, std::io::Error>(Loaded::value(1).tags(loader))
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("20 tags"), "{err}");
}

/// `warm_with_context` on a cold store: every value's loader-chosen tag is
/// new, so the first pass does not write the first keys of each tag; the
/// warm-up warms those once more, and every key is written.
#[tokio::test(start_paused = true)]
async fn a_warm_up_writes_values_whose_chosen_tags_were_new() {
    let store = MemoryStore::new();
    let (a, b) = (build(store.clone(), false), build(store, false));
    let loads = Arc::new(AtomicUsize::new(0));
    let report = {
        let loads = Arc::clone(&loads);
        a.warm_with_context(
            (0..20u64).collect::<Vec<_>>(),
            move |id: u64, _ctx: LoadContext<u64>| {
                loads.fetch_add(1, Ordering::SeqCst);
                async move {
                    Ok::<_, std::io::Error>(Loaded::value(id).tags([format!("shop:{}", id % 4)]))
                }
            },
            breakwater_cache::Warm::new(),
        )
        .await
        .unwrap()
    };
    assert_eq!((report.loaded, report.failed), (20, 0), "{report:?}");
    // Keys whose shop's counter was made more than the skew before their
    // load are written by the first pass; the others are loaded twice.
    let loads = loads.load(Ordering::SeqCst);
    assert!((24..=40).contains(&loads), "{loads} loads");
    for id in 0..20u64 {
        assert_eq!(b.get(id).await.unwrap(), Some(id), "product {id} written");
    }
    b.invalidate_tag("shop:1").await.unwrap();
    assert_eq!(a.get(1u64).await.unwrap(), None);
    assert_eq!(a.get(2u64).await.unwrap(), Some(2));
}
