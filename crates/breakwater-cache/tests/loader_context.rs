//! A loader that decides per value (`get_or_load_with_context`): a token
//! lives as long as its own `expires_in` whatever the namespace TTL, a
//! result the loader says not to cache is loaded again by the next call
//! (its concurrent callers still share one load), a choice out of bounds is
//! a typed error, and a refresh sees the value it replaces. On the memory
//! store with paused time, and on a private Redis.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{
    Cache, ErrorKind, Jitter, L1Config, LoadContext, Loaded, MemoryStore, Served, Store, Stored,
};
use breakwater_cache_testkit::RedisServer;
use futures_util::future::join_all;
use tokio::time::{advance, sleep};

const NAMESPACE_TTL: Duration = Duration::from_secs(300);
const TOKEN_TTL: Duration = Duration::from_secs(2);

fn cache(store: impl Store, l1: bool) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("ctx")
        .store(store)
        .ttl(NAMESPACE_TTL)
        .jitter(Jitter::ratio(0.1))
        .grace(Duration::from_secs(30));
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().expect("valid settings")
}

/// A token service: every call issues the next token, valid for
/// [`TOKEN_TTL`]; the loader caches it for exactly that long (no grace: an
/// expired token must not be served).
fn token_loader(
    issued: &Arc<AtomicUsize>,
) -> impl FnOnce(LoadContext<u64>) -> std::future::Ready<Result<Loaded<u64>, std::io::Error>>
+ Clone
+ Send
+ Sync
+ 'static {
    let issued = Arc::clone(issued);
    move |_ctx| {
        let token = issued.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        std::future::ready(Ok(Loaded::value(token)
            .ttl(TOKEN_TTL)
            .jitter(Jitter::ratio(0.1))
            .grace(Duration::ZERO)))
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_lives_as_long_as_its_own_expiry_not_the_namespace_ttl() {
    for l1 in [false, true] {
        let issued = Arc::new(AtomicUsize::new(0));
        let cache = cache(MemoryStore::new(), l1);
        let (low, high) = Jitter::ratio(0.1).bounds(TOKEN_TTL);
        let token = || cache.get_or_load_with_context("oauth", token_loader(&issued));
        assert_eq!(token().await.unwrap(), Some(1));
        // Fresh until its jittered expiry: 1.8 s at the earliest.
        advance(low - Duration::from_millis(10)).await;
        assert_eq!(token().await.unwrap(), Some(1));
        assert_eq!(issued.load(Ordering::SeqCst), 1);
        // Past 2.2 s at the latest: a new token, five minutes before the
        // namespace TTL would have ended.
        advance(high - low + Duration::from_millis(20)).await;
        assert_eq!(token().await.unwrap(), Some(2), "l1: {l1}");
        assert_eq!(issued.load(Ordering::SeqCst), 2);
        // The new token's entry is fresh for about 2 s too, not 5 min.
        let Stored::Entry(view) = cache.inspect("oauth").await.unwrap().stored else {
            panic!("the token is stored");
        };
        let fresh = view.fresh_for.expect("fresh");
        assert!(fresh >= low && fresh <= high, "{fresh:?}");
    }
}

#[tokio::test]
async fn a_token_lives_as_long_as_its_own_expiry_on_redis() {
    let server = RedisServer::start();
    let store = support::connect(&server).await;
    let issued = Arc::new(AtomicUsize::new(0));
    let cache = cache(store, false);
    let (low, high) = Jitter::ratio(0.1).bounds(TOKEN_TTL);
    assert_eq!(
        cache
            .get_or_load_with_context("oauth", token_loader(&issued))
            .await
            .unwrap(),
        Some(1)
    );
    let inspection = cache.inspect("oauth").await.unwrap();
    let Stored::Entry(view) = inspection.stored else {
        panic!("the token is stored: {inspection:?}");
    };
    let fresh = view.fresh_for.expect("fresh");
    // Within the token's jittered window (less the round trips since).
    assert!(
        fresh <= high && fresh + Duration::from_millis(500) >= low,
        "{fresh:?}"
    );
    // No grace chosen, so the store keeps it the cache's max_stale past
    // that (30 s here), nowhere near the 300 s namespace TTL.
    let kept = inspection.store_ttl.expect("an expiry");
    assert!(kept < Duration::from_secs(40), "{kept:?}");
}

#[tokio::test]
async fn do_not_cache_is_loaded_by_every_call_yet_shared_by_concurrent_callers() {
    for l1 in [false, true] {
        let cache = cache(MemoryStore::new(), l1);
        let loads = Arc::new(AtomicUsize::new(0));
        let loader = {
            let loads = Arc::clone(&loads);
            move |_ctx: LoadContext<u64>| {
                let loads = Arc::clone(&loads);
                async move {
                    let n = loads.fetch_add(1, Ordering::SeqCst) as u64 + 1;
                    sleep(Duration::from_millis(50)).await;
                    Ok::<_, std::io::Error>(Loaded::value(n).do_not_cache())
                }
            }
        };
        let callers =
            (0..100).map(|_| cache.get_or_load_with_context_meta("search", loader.clone()));
        let results = join_all(callers).await;
        assert_eq!(loads.load(Ordering::SeqCst), 1, "l1: {l1}");
        for result in results {
            assert_eq!(result.unwrap().value, Some(1));
        }
        // Not written, not kept in L1: the next call loads again.
        assert_eq!(cache.get("search").await.unwrap(), None);
        let next = cache
            .get_or_load_with_context_meta("search", loader.clone())
            .await
            .unwrap();
        assert_eq!((next.value, next.served), (Some(2), Served::Loaded));
        assert_eq!(loads.load(Ordering::SeqCst), 2);
    }
}

#[tokio::test]
async fn a_setting_out_of_bounds_is_a_config_error_and_nothing_is_written() {
    let cache = cache(MemoryStore::new(), true);
    let callers = (0..10).map(|_| {
        cache.get_or_load_with_context("bad", |_ctx: LoadContext<u64>| async {
            Ok::<_, std::io::Error>(Loaded::value(7).ttl(Duration::ZERO))
        })
    });
    for result in join_all(callers).await {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(
            err.to_string().contains("ttl must be at least 1ms"),
            "{err}"
        );
    }
    assert_eq!(cache.get("bad").await.unwrap(), None);
    // A grace above the call's max_stale, chosen together: refused too.
    let err = cache
        .get_or_load_with_context("bad", |_ctx: LoadContext<u64>| async {
            Ok::<_, std::io::Error>(
                Loaded::value(7)
                    .grace(Duration::from_secs(60))
                    .max_stale(Duration::from_secs(1)),
            )
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // The lease was given back: a good loader is not kept waiting.
    let good = cache
        .get_or_load_with_context("bad", |_ctx: LoadContext<u64>| async {
            Ok::<_, std::io::Error>(Loaded::value(8))
        })
        .await
        .unwrap();
    assert_eq!(good, Some(8));
}

#[tokio::test(start_paused = true)]
async fn a_refresh_sees_the_value_it_replaces() {
    let cache = cache(MemoryStore::new(), false);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let loader = {
        let seen = Arc::clone(&seen);
        move |ctx: LoadContext<u64>| {
            let seen = Arc::clone(&seen);
            async move {
                let before = ctx.stale().map(|s| (s.value().copied(), s.expired_for()));
                seen.lock().unwrap().push(before);
                let next = before.and_then(|(v, _)| v).unwrap_or(0) + 1;
                Ok::<_, std::io::Error>(Loaded::value(next).ttl(Duration::from_secs(10)))
            }
        }
    };
    assert_eq!(
        cache
            .get_or_load_with_context("counter", loader.clone())
            .await
            .unwrap(),
        Some(1)
    );
    // 15 s later: stale within grace; served, refreshed in the background
    // by a load that sees the old value and how long ago it expired.
    advance(Duration::from_secs(15)).await;
    let stale = cache
        .get_or_load_with_context_meta("counter", loader.clone())
        .await
        .unwrap();
    assert_eq!(stale.value, Some(1));
    assert!(matches!(stale.served, Served::Stale { .. }), "{stale:?}");
    for _ in 0..100 {
        if seen.lock().unwrap().len() == 2 {
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[0], None, "a first load replaces nothing");
    let (value, expired_for) = seen[1].expect("the refresh saw the stale value");
    assert_eq!(value, Some(1));
    let expired_for = expired_for.expect("it had expired");
    // 15 s after a write fresh for 10 s ± 10 %.
    assert!(
        expired_for >= Duration::from_secs(4) && expired_for <= Duration::from_secs(6),
        "{expired_for:?}"
    );
    assert_eq!(cache.get("counter").await.unwrap(), Some(2));
}

/// The future of [`Rows::loader`].
type RowFuture = std::future::Ready<Result<Loaded<Vec<u8>>, std::io::Error>>;

/// A loader of a big row whose version is `version`: answers "not
/// modified" when the stale value's validator is that version, else the
/// row with the version as its validator; counts its calls and full reads.
#[derive(Clone)]
struct Rows {
    version: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    reads: Arc<AtomicUsize>,
    size: usize,
}

impl Rows {
    fn new(size: usize) -> Rows {
        Rows {
            version: Arc::new(AtomicUsize::new(1)),
            calls: Arc::new(AtomicUsize::new(0)),
            reads: Arc::new(AtomicUsize::new(0)),
            size,
        }
    }

    /// The row at a version: bytes that do not compress.
    fn row(&self, version: usize) -> Vec<u8> {
        let mut x = version as u64 ^ 0x9e37_79b9_7f4a_7c15;
        (0..self.size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn loader(
        &self,
    ) -> impl FnOnce(LoadContext<Vec<u8>>) -> RowFuture + Clone + Send + Sync + 'static {
        let rows = self.clone();
        move |ctx| {
            rows.calls.fetch_add(1, Ordering::SeqCst);
            let version = rows.version.load(Ordering::SeqCst);
            let etag = format!("v{version}").into_bytes();
            if ctx.stale().and_then(|s| s.validator()) == Some(&etag[..]) {
                return std::future::ready(Ok(Loaded::not_modified()));
            }
            rows.reads.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(Loaded::value(rows.row(version)).validator(etag)))
        }
    }
}

/// Rows are fresh this long: enough for a debug build to read a megabyte
/// row back while it is still fresh, on a busy machine.
const ROW_TTL: Duration = Duration::from_secs(1);

fn rows_cache(store: impl Store, l1: bool) -> Cache<Vec<u8>> {
    let builder = Cache::builder()
        .namespace("rows")
        .store(store)
        .ttl(ROW_TTL)
        .jitter(Jitter::none().with_floor(Duration::from_millis(1)))
        .grace(Duration::from_secs(30))
        .max_value_size(4 << 20);
    let builder = if l1 {
        builder.l1(L1Config::new())
    } else {
        builder
    };
    builder.build().expect("valid settings")
}

/// `total_net_input_bytes` of a private Redis.
fn input_bytes(server: &RedisServer) -> u64 {
    let info = server.command(&["INFO", "stats"]).expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("total_net_input_bytes:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("total_net_input_bytes")
}

/// Waits until the entry under `key` is fresh again (a refresh landed).
async fn fresh_again(cache: &Cache<Vec<u8>>, key: &str) {
    for _ in 0..3_000 {
        if let Stored::Entry(view) = cache.inspect(key).await.unwrap().stored
            && view.fresh_for.is_some()
        {
            return;
        }
        sleep(Duration::from_millis(1)).await;
    }
    panic!(
        "{key} was not refreshed: {:?}",
        cache.inspect(key).await.unwrap().stored
    );
}

/// Waits until the entry under `key` is no longer fresh.
async fn stale_now(cache: &Cache<Vec<u8>>, key: &str) {
    for _ in 0..3_000 {
        if let Stored::Entry(view) = cache.inspect(key).await.unwrap().stored
            && view.fresh_for.is_none()
        {
            return;
        }
        sleep(Duration::from_millis(1)).await;
    }
    panic!("{key} did not go stale");
}

#[tokio::test]
async fn not_modified_renews_a_megabyte_row_without_sending_it_again() {
    const MB: usize = 1 << 20;
    let server = RedisServer::start();
    let (a, b) = (
        rows_cache(support::connect(&server).await, false),
        rows_cache(support::connect(&server).await, false),
    );
    let rows = Rows::new(MB);
    let first = a
        .get_or_load_with_context("row:1", rows.loader())
        .await
        .unwrap();
    assert_eq!(first.as_deref(), Some(&rows.row(1)[..]));
    assert_eq!(b.get("row:1").await.unwrap(), first);

    // Stale, unchanged at the source: a refresh answers "not modified".
    stale_now(&a, "row:1").await;
    let before = input_bytes(&server);
    let served = a
        .get_or_load_with_context_meta("row:1", rows.loader())
        .await
        .unwrap();
    assert!(matches!(served.served, Served::Stale { .. }), "{served:?}");
    // Measured once the refresh is done, before anything else reads.
    support::until("the refresh", || rows.calls.load(Ordering::SeqCst) == 2).await;
    sleep(Duration::from_millis(100)).await;
    let renewed = input_bytes(&server) - before;
    fresh_again(&a, "row:1").await;
    assert_eq!(rows.calls.load(Ordering::SeqCst), 2);
    assert_eq!(rows.reads.load(Ordering::SeqCst), 1, "one full read");
    // Every process's next read is a hit on the renewed entry.
    for cache in [&a, &b] {
        let next = cache
            .get_or_load_with_context_meta("row:1", rows.loader())
            .await
            .unwrap();
        assert_eq!((next.served, next.value), (Served::Hit, first.clone()));
    }
    // Once more: the first renewal on a node also sent the script's text
    // (`EVAL`, once per script and node); from then on `EVALSHA`.
    stale_now(&a, "row:1").await;
    let before = input_bytes(&server);
    b.get_or_load_with_context("row:1", rows.loader())
        .await
        .unwrap();
    support::until("the refresh", || rows.calls.load(Ordering::SeqCst) == 3).await;
    sleep(Duration::from_millis(100)).await;
    let renewed_again = input_bytes(&server) - before;
    fresh_again(&a, "row:1").await;
    assert_eq!(rows.reads.load(Ordering::SeqCst), 1, "still one full read");

    // The same refresh with a changed row writes it whole: the baseline.
    stale_now(&a, "row:1").await;
    rows.version.store(2, Ordering::SeqCst);
    let before = input_bytes(&server);
    a.get_or_load_with_context("row:1", rows.loader())
        .await
        .unwrap();
    support::until("the refresh", || rows.calls.load(Ordering::SeqCst) == 4).await;
    sleep(Duration::from_millis(100)).await;
    let rewritten = input_bytes(&server) - before;
    fresh_again(&a, "row:1").await;
    assert_eq!(
        b.get("row:1").await.unwrap().as_deref(),
        Some(&rows.row(2)[..])
    );
    eprintln!(
        "bytes sent to Redis by a refresh of a 1 MiB row: not modified {renewed} (the script's \
         first run on the node) and {renewed_again}, changed {rewritten}"
    );
    assert!(renewed_again < 1024, "a renewal sent {renewed_again} bytes");
    // The first run sends the script's code (about 2.4 KB), never the row.
    assert!(renewed < 4096, "the first renewal sent {renewed} bytes");
    assert!(rewritten > MB as u64, "a rewrite sent {rewritten} bytes");
}

#[tokio::test(start_paused = true)]
async fn not_modified_keeps_the_value_through_the_fence() {
    for l1 in [false, true] {
        let store = MemoryStore::new();
        let cache = rows_cache(store.clone(), l1);
        let rows = Rows::new(64);
        cache
            .get_or_load_with_context("row:1", rows.loader())
            .await
            .unwrap();
        // Renewed: fresh again for the TTL, the value kept, one full read.
        advance(ROW_TTL + Duration::from_millis(100)).await;
        let stale = cache
            .get_or_load_with_context_meta("row:1", rows.loader())
            .await
            .unwrap();
        assert!(
            matches!(stale.served, Served::Stale { .. }),
            "l1: {l1} {stale:?}"
        );
        support::until("the renewal", || rows.calls.load(Ordering::SeqCst) == 2).await;
        fresh_again(&cache, "row:1").await;
        let Stored::Entry(view) = cache.inspect("row:1").await.unwrap().stored else {
            panic!("stored");
        };
        assert!(view.fresh_for.unwrap() <= ROW_TTL);
        assert_eq!(rows.reads.load(Ordering::SeqCst), 1);
        let hit = cache
            .get_or_load_with_context_meta("row:1", rows.loader())
            .await
            .unwrap();
        assert_eq!(hit.value.as_deref(), Some(&rows.row(1)[..]));
        assert!(matches!(hit.served, Served::Hit | Served::L1Hit), "{hit:?}");

        // The stored entry vanishes during the load (evicted, not
        // invalidated: the lease is still ours): the value the loader saw
        // is written whole.
        advance(ROW_TTL + Duration::from_millis(100)).await;
        let evicting = {
            let (store, key) = (store.clone(), cache.storage_key("row:1").unwrap());
            let loader = rows.loader();
            move |ctx: LoadContext<Vec<u8>>| {
                let store = store.clone();
                let key = key.clone();
                async move {
                    store.delete(&key).await.unwrap();
                    loader(ctx).await
                }
            }
        };
        cache
            .get_or_load_with_context("row:1", evicting)
            .await
            .unwrap();
        support::until("the write", || rows.calls.load(Ordering::SeqCst) == 3).await;
        fresh_again(&cache, "row:1").await;
        assert_eq!(
            cache.get("row:1").await.unwrap().as_deref(),
            Some(&rows.row(1)[..])
        );
        assert_eq!(rows.reads.load(Ordering::SeqCst), 1, "no second full read");

        // Invalidated during the load: the renewal is refused, nothing
        // comes back.
        advance(ROW_TTL + Duration::from_millis(100)).await;
        let invalidating = {
            let cache = cache.clone();
            let loader = rows.loader();
            move |ctx: LoadContext<Vec<u8>>| {
                let cache = cache.clone();
                async move {
                    cache.invalidate("row:1").await.unwrap();
                    loader(ctx).await
                }
            }
        };
        let during = cache
            .get_or_load_with_context_meta("row:1", invalidating)
            .await
            .unwrap();
        assert!(matches!(during.served, Served::Stale { .. }), "{during:?}");
        support::until("the refused renewal", || {
            rows.calls.load(Ordering::SeqCst) == 4
        })
        .await;
        sleep(Duration::from_millis(10)).await;
        assert_eq!(cache.get("row:1").await.unwrap(), None, "l1: {l1}");
    }
}

#[tokio::test]
async fn not_modified_without_a_stored_value_is_a_loader_error() {
    let cache = cache(MemoryStore::new(), false);
    let err = cache
        .get_or_load_with_context("first", |_ctx: LoadContext<u64>| async {
            Ok::<_, std::io::Error>(Loaded::not_modified())
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Loader, "{err}");
    assert!(err.to_string().contains("not_modified"), "{err}");
    // A validator out of bounds is a Config error.
    let err = cache
        .get_or_load_with_context("first", |_ctx: LoadContext<u64>| async {
            Ok::<_, std::io::Error>(Loaded::value(1).validator(vec![0; 256]))
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// A batch loader for `get_many_with_context`: each key `k` is worth `k`;
/// key 0 is not cached, key 13 asks for a TTL out of bounds, odd keys
/// live 2 s (then kept a minute for fail-safe, not served), even keys the
/// namespace TTL. Records what each call saw.
type Seen = Arc<std::sync::Mutex<Vec<Vec<(u64, Option<u64>)>>>>;

/// The answer of [`batch_loader`].
type BatchAnswer = std::future::Ready<Result<Vec<(u64, Loaded<u64>)>, std::io::Error>>;

fn batch_loader(
    seen: &Seen,
) -> impl Fn(Vec<(u64, LoadContext<u64>)>) -> BatchAnswer + Send + Sync + 'static {
    let seen = Arc::clone(seen);
    move |keys| {
        seen.lock().unwrap().push(
            keys.iter()
                .map(|(k, ctx)| (*k, ctx.stale().and_then(|s| s.value().copied())))
                .collect(),
        );
        let answers = keys.into_iter().map(|(k, _)| {
            let loaded = Loaded::value(k);
            let loaded = match k {
                0 => loaded.do_not_cache(),
                13 => loaded.ttl(Duration::ZERO),
                k if k % 2 == 1 => loaded
                    .ttl(TOKEN_TTL)
                    .jitter(Jitter::ratio(0.1))
                    .grace(Duration::ZERO)
                    .max_stale(Duration::from_secs(60)),
                _ => loaded,
            };
            (k, loaded)
        });
        std::future::ready(Ok(answers.collect()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_loader_decides_per_key() {
    for l1 in [false, true] {
        let cache = cache(MemoryStore::new(), l1);
        let seen: Seen = Arc::default();
        let got = cache
            .get_many_with_context_meta([0u64, 1, 2, 13], batch_loader(&seen))
            .await;
        assert_eq!(got[0].as_ref().unwrap().value, Some(0));
        assert_eq!(got[1].as_ref().unwrap().value, Some(1));
        assert_eq!(got[2].as_ref().unwrap().value, Some(2));
        // A choice out of bounds fails its own key, not the others.
        let err = got[3].as_ref().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains("the loader chose"), "{err}");
        assert!(matches!(
            cache.inspect(13u64).await.unwrap().stored,
            Stored::Missing
        ));
        // "Do not cache": nothing stored, loaded again by the next call.
        assert!(matches!(
            cache.inspect(0u64).await.unwrap().stored,
            Stored::Missing
        ));
        // Key 1 lives 2 s (± 10 %), key 2 the namespace's 5 minutes.
        advance(Duration::from_millis(1_700)).await;
        let again = cache
            .get_many_with_context([0u64, 1, 2], batch_loader(&seen))
            .await
            .unwrap();
        assert_eq!(again, [Some(0), Some(1), Some(2)]);
        assert_eq!(seen.lock().unwrap()[1], [(0, None)], "l1: {l1}");
        advance(Duration::from_millis(600)).await;
        cache
            .get_many_with_context([0u64, 1, 2], batch_loader(&seen))
            .await
            .unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3, "{seen:?}");
        // Key 1 expired and, its own grace being 0 (the cache's is 30 s),
        // is not served stale but loaded again, beside key 0, with the
        // value it replaces in its context; key 2 is still fresh.
        let mut third = seen[2].clone();
        third.sort();
        assert_eq!(third, [(0, None), (1, Some(1))], "l1: {l1}");
    }
}

#[tokio::test]
async fn a_batch_refresh_answers_not_modified_per_key_on_redis() {
    let server = RedisServer::start();
    let cache = rows_cache(support::connect(&server).await, false);
    let rows = Rows::new(64 << 10);
    let loader = {
        let rows = rows.clone();
        move |keys: Vec<(&'static str, LoadContext<Vec<u8>>)>| {
            let rows = rows.clone();
            async move {
                let answers = keys.into_iter().map(|(key, ctx)| {
                    let loaded = (rows.loader())(ctx).into_inner().expect("loads");
                    (key, loaded)
                });
                Ok::<_, std::io::Error>(answers.collect::<Vec<_>>())
            }
        }
    };
    let keys = ["row:1", "row:2"];
    cache
        .get_many_with_context(keys, loader.clone())
        .await
        .unwrap();
    assert_eq!(rows.reads.load(Ordering::SeqCst), 2);
    for key in keys {
        stale_now(&cache, key).await;
    }
    // Stale within grace: served, refreshed in the background by one
    // batch whose loader answers "not modified" for both: the entries are
    // renewed, not sent again.
    let before = input_bytes(&server);
    let stale = cache.get_many_with_context_meta(keys, loader.clone()).await;
    for got in &stale {
        let got = got.as_ref().unwrap();
        assert!(matches!(got.served, Served::Stale { .. }), "{got:?}");
    }
    for key in keys {
        fresh_again(&cache, key).await;
    }
    let sent = input_bytes(&server) - before;
    assert_eq!(rows.calls.load(Ordering::SeqCst), 4);
    assert_eq!(rows.reads.load(Ordering::SeqCst), 2, "no row read again");
    assert!(
        sent < 8 << 10,
        "{sent} bytes sent for two renewals of 64 KiB rows"
    );
    let got = cache.get_many_with_context_meta(keys, loader).await;
    for got in got {
        let got = got.unwrap();
        assert_eq!(got.served, Served::Hit);
        assert_eq!(got.value.map(|v| v.len()), Some(64 << 10));
    }
}
