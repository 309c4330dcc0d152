//! The namespace's clear record (`<prefix><ns>:c`) lost from a real Redis
//! — deleted, evicted under `maxmemory` + `allkeys-lru`, or gone with an
//! empty restart — degrades softly: the entries still in Redis are served
//! (at most 1% of keys loaded again), L1 copies keep standing in for
//! failed loads, and a namespace that was soft-cleared once is no
//! exception. Two or three `Cache`s, each on its own `RedisStore`, are
//! processes of one fleet.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{
    Cache, ClearMode, EarlyRefresh, Jitter, L1Config, RedisStore, RedisStoreConfig, Served,
};
use breakwater_cache_testkit::RedisServer;
use tokio::time::{Instant, sleep};

const RECORD: &str = "bw:loss:c";

/// The database: how many loads ran, and whether it is down; with a
/// `probe`, how many loads ran while the key's entry was still in Redis
/// (loads a lost key of bookkeeping caused, not an evicted entry).
#[derive(Default)]
struct Db {
    loads: AtomicUsize,
    down: AtomicBool,
    probe: Option<RedisStore>,
    needless: AtomicUsize,
}

type Load = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<u64>, std::io::Error>> + Send>,
>;

impl Db {
    fn loader(self: &Arc<Self>, k: u64) -> impl FnOnce() -> Load + Clone + Send + Sync + 'static {
        let db = Arc::clone(self);
        move || {
            Box::pin(async move {
                db.loads.fetch_add(1, Ordering::SeqCst);
                if let Some(probe) = &db.probe {
                    use breakwater_cache::Store;
                    let entry = format!("bw:loss:v:{{{k}}}");
                    if matches!(probe.get(entry.as_bytes()).await, Ok(Some(_))) {
                        db.needless.fetch_add(1, Ordering::SeqCst);
                    }
                }
                if db.down.load(Ordering::SeqCst) {
                    return Err(std::io::Error::other("database down"));
                }
                Ok(Some(k))
            })
        }
    }

    fn loads(&self) -> usize {
        self.loads.load(Ordering::SeqCst)
    }
}

/// A store as a process has it: short deadlines, a quick subscription
/// ping (a killed pub/sub connection is noticed within 200 ms).
async fn store(server: &RedisServer) -> RedisStore {
    let config = RedisStoreConfig::default()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .subscription_ping(Duration::from_millis(200));
    let store = RedisStore::connect_with(&server.url(), config).unwrap();
    store.warm_up().await.unwrap();
    store
}

fn cache(store: RedisStore, l1: bool) -> Cache<u64> {
    let builder = Cache::builder()
        .namespace("loss")
        .store(store)
        .ttl(Duration::from_secs(3600))
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .max_stale(Duration::from_secs(3600));
    let builder = if l1 {
        builder.l1(L1Config::new().entries(10_000))
    } else {
        builder
    };
    builder.build().unwrap()
}

/// Reads keys `0..n` in `cache`, each with its loader; how many calls
/// failed.
async fn read_all(cache: &Cache<u64>, db: &Arc<Db>, n: u64) -> usize {
    let mut errors = 0;
    for k in 0..n {
        match cache.get_or_load_with_meta(k, db.loader(k)).await {
            Ok(got) => assert_eq!(got.value, Some(k), "key {k}: {got:?}"),
            Err(_) => errors += 1,
        }
    }
    errors
}

/// Kills every pub/sub connection of `server` (the processes' buses drop
/// and resubscribe, so each reads the record again).
fn kill_pubsub(server: &RedisServer) {
    server
        .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .expect("CLIENT KILL");
}

/// 2,000 warm keys in 2 processes; the record deleted; the buses dropped
/// and back; both processes read every key, and so does a fresh one: the
/// loader runs for at most 1% of the keys (the entries are all still in
/// Redis). With L1 off and on; with and without a soft clear of the
/// namespace before (then the database is down after the loss, and the
/// reads of the two warm processes all succeed: L1 copies or stored
/// entries stand in).
#[tokio::test]
async fn a_deleted_record_costs_at_most_one_percent_of_the_keys() {
    const KEYS: u64 = 2_000;
    for (l1, soft_cleared) in [(false, false), (true, false), (false, true), (true, true)] {
        let server = RedisServer::start();
        let db = Arc::new(Db::default());
        let a = cache(store(&server).await, l1);
        let b = cache(store(&server).await, l1);
        if soft_cleared {
            a.clear(ClearMode::Soft {
                window: Duration::from_secs(3600),
            })
            .await
            .unwrap();
        }
        // Warm: every key loaded once, read in both (L1 filled, with the
        // buses up).
        sleep(Duration::from_millis(300)).await;
        assert_eq!(read_all(&a, &db, KEYS).await, 0);
        assert_eq!(read_all(&b, &db, KEYS).await, 0);
        assert_eq!(db.loads() as u64, KEYS);
        let warm = db.loads();

        assert_eq!(server.command(&["DEL", RECORD]).unwrap().trim(), "1");
        kill_pubsub(&server);
        sleep(Duration::from_millis(600)).await;
        db.down.store(soft_cleared, Ordering::SeqCst);
        let errors = read_all(&a, &db, KEYS).await + read_all(&b, &db, KEYS).await;
        let c = cache(store(&server).await, l1);
        let fresh_errors = read_all(&c, &db, KEYS).await;
        sleep(Duration::from_secs(1)).await;
        let again = read_all(&a, &db, KEYS).await + read_all(&c, &db, KEYS).await;
        let loaded = db.loads() - warm;
        eprintln!(
            "l1={l1} soft_cleared={soft_cleared}: {loaded} loads of {KEYS} keys, \
             {errors} errors in the warm processes, {fresh_errors} in a fresh one, \
             {again} after; record now {:?}",
            server.command(&["GET", RECORD]).unwrap().trim()
        );
        assert_eq!(errors + again, 0, "l1={l1} soft_cleared={soft_cleared}");
        assert_eq!(fresh_errors, 0, "l1={l1} soft_cleared={soft_cleared}");
        assert!(
            loaded as u64 <= KEYS / 100,
            "l1={l1} soft_cleared={soft_cleared}: {loaded} loads"
        );
    }
}

/// The namespace soft-cleared once, 50 warm keys in 2 processes with L1
/// and `max_stale` of an hour; the database fails and Redis restarts
/// empty: no call on a warm key errs in either process over 5 s (L1
/// copies stand in; before, the first load pinned a hard record, which
/// emptied L1 here and, from its message, everywhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_restart_after_a_soft_clear_keeps_l1_standing_in() {
    let mut server = RedisServer::start();
    let db = Arc::new(Db::default());
    let a = cache(store(&server).await, true);
    let b = cache(store(&server).await, true);
    a.clear(ClearMode::Soft {
        window: Duration::from_secs(60),
    })
    .await
    .unwrap();
    sleep(Duration::from_millis(300)).await;
    for _ in 0..2 {
        assert_eq!(read_all(&a, &db, 50).await, 0);
        assert_eq!(read_all(&b, &db, 50).await, 0);
        sleep(Duration::from_millis(300)).await;
    }
    db.down.store(true, Ordering::SeqCst);
    server.restart();
    let (mut calls, mut errors, mut stand_ins) = (0, Vec::new(), 0);
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        for cache in [&a, &b] {
            for k in 0..50u64 {
                calls += 1;
                match cache.get_or_load_with_meta(k, db.loader(k)).await {
                    Ok(got) => {
                        assert_eq!(got.value, Some(k));
                        stand_ins += usize::from(matches!(got.served, Served::Stale { .. }));
                    }
                    Err(err) => errors.push(format!("{k}: {err}")),
                }
            }
        }
        sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "{calls} calls, {} errors, {stand_ins} stale stand-ins",
        errors.len()
    );
    assert!(
        errors.is_empty(),
        "{} errors, first {:?}",
        errors.len(),
        errors.first()
    );
    assert!(stand_ins > 0, "no load failed: the test proved nothing");
}

/// Under `maxmemory` + `allkeys-lru`, 1 KB filler writes push keys out
/// (over 1,000 evicted) while two processes read the namespace's keys:
/// the record, read by each process's listener every second, is evicted
/// now and then all the same (the LRU is approximate and everything here
/// churns), and its eviction costs at most 1% of the keys in loads of keys
/// whose entries were still in Redis (before, the next pub/sub reconnect
/// reloaded the namespace). Loads of entries evicted themselves are
/// reported, not bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_allkeys_lru_an_evicted_record_costs_nothing() {
    const KEYS: u64 = 500;
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]);
    let db = Arc::new(Db {
        probe: Some(store(&server).await),
        ..Db::default()
    });
    let a = cache(store(&server).await, false);
    let b = cache(store(&server).await, false);
    a.clear(ClearMode::Soft {
        window: Duration::from_secs(60),
    })
    .await
    .unwrap();
    assert_eq!(read_all(&a, &db, KEYS).await, 0);
    assert_eq!(read_all(&a, &db, KEYS).await, 0);
    let warm = db.loads();
    assert_eq!(
        server.command(&["EXISTS", "bw:loss:v:{7}"]).unwrap().trim(),
        "1",
        "the probe's key schema"
    );
    // Every eviction, by key (keyspace notifications).
    server
        .command(&["CONFIG", "SET", "notify-keyspace-events", "Ee"])
        .unwrap();
    let watcher = RedisStore::connect(&server.url()).unwrap();
    let mut evictions = {
        use breakwater_cache::Store;
        watcher.subscribe(b"__keyevent@0__:evicted")
    };
    let record_evicted = Arc::new(AtomicUsize::new(0));
    let watch = {
        let record_evicted = Arc::clone(&record_evicted);
        tokio::spawn(async move {
            while let Some(delivery) = evictions.recv().await {
                if let breakwater_cache::Delivery::Message(key) = delivery
                    && &key[..] == RECORD.as_bytes()
                {
                    record_evicted.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    sleep(Duration::from_millis(200)).await;
    let filler = RedisStore::connect(&server.url()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let fill = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            use breakwater_cache::Store;
            let kb = vec![b'x'; 1024];
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("filler:{i}");
                let _ = filler
                    .set(key.as_bytes(), &kb, Duration::from_secs(3600))
                    .await;
                i += 1;
                if i.is_multiple_of(100) {
                    sleep(Duration::from_millis(5)).await;
                }
            }
            i
        })
    };
    let until = Instant::now() + Duration::from_secs(6);
    let (mut record_gone, mut rounds) = (0u32, 0u32);
    while Instant::now() < until {
        let errors = read_all(&a, &db, KEYS).await + read_all(&b, &db, KEYS).await;
        assert_eq!(errors, 0);
        rounds += 1;
        if rounds.is_multiple_of(3) {
            // The buses drop: each process reads the record again.
            kill_pubsub(&server);
        }
        if server.command(&["EXISTS", RECORD]).unwrap().trim() == "0" {
            record_gone += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    let filled = fill.await.unwrap();
    sleep(Duration::from_millis(200)).await;
    watch.abort();
    let record_evicted = record_evicted.load(Ordering::SeqCst);
    let evicted: u64 = server
        .command(&["INFO", "stats"])
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("evicted_keys:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    let loads = db.loads() - warm;
    let needless = db.needless.load(Ordering::SeqCst);
    eprintln!(
        "{filled} filler writes, {evicted} keys evicted, {rounds} rounds of {KEYS} keys in 2 \
         processes, record evicted {record_evicted} times, seen gone in {record_gone} rounds, \
         {loads} loads, {needless} of them while the key's entry was in Redis"
    );
    assert!(evicted > 1_000, "the filler evicted too little: {evicted}");
    assert!(
        (needless as u64) <= KEYS / 100,
        "{needless} loads of keys whose entry was in Redis (the record evicted {record_evicted} \
         times)"
    );
}
