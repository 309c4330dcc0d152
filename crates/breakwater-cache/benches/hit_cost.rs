//! What one cache hit costs in heap allocations, counted (not timed), so
//! the figures do not depend on a noisy machine: an L1 hit next to a bare
//! `moka` get, and a Redis hit through `get_or_load` next to a raw `GET` on
//! a private `redis-server`.
//!
//! ```sh
//! cargo bench -p breakwater-cache --bench hit_cost
//! ```
//!
//! For instructions per hit, run the same binary under callgrind with two
//! hit counts and divide the difference (the set-up cancels out):
//!
//! ```sh
//! B=$(ls -t target/release/deps/hit_cost-* | grep -v '\.d$' | head -1)
//! for n in 1000 6000; do
//!   BREAKWATER_COST=redis BREAKWATER_HITS=$n valgrind --tool=callgrind \
//!     --callgrind-out-file=/tmp/cg.$n $B --bench
//! done
//! ```
//!
//! (`BREAKWATER_COST` is one of `l1`, `moka` (a bare `moka::future` get),
//! `mokasync` (a bare `moka::sync` get), `redis`, `raw`, `tagged`
//! (a Redis hit on an entry with two tags), `rawmget` (a raw `MGET` of
//! three keys), `redis50`, `raw50`, `floor50`,
//! `hot50` (50 callers on one key), `set100` (100 `set`s in flight),
//! `rawset100` (raw pipelines of 100 `SET PX`); the counting
//! allocator's own instructions are in every figure alike.)

use std::time::Duration;

use breakwater_cache::{Cache, L1Config, RedisStore};
use breakwater_cache_testkit::RedisServer;

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// Callers at once in the concurrent scenarios (`redis50`, `raw50`).
const CALLERS: usize = 50;

fn hits() -> u64 {
    std::env::var("BREAKWATER_HITS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

/// Whether scenario `name` runs: all of them unless `BREAKWATER_COST`
/// names one (`l1`, `moka`, `mokasync`, `redis`, `raw`, `tagged`, `rawmget`, `redis50`, `raw50`,
/// `floor50`, `hot50`, `set100`, `rawset100`), for
/// callgrind.
fn runs(name: &str) -> bool {
    std::env::var("BREAKWATER_COST").map_or(true, |only| only == name)
}

/// Heap blocks allocated while `f` runs (it runs only if `name` does). Not
/// counted for one scenario under callgrind (the profiler's bookkeeping
/// would swamp the instruction count): 0 then.
async fn blocks<F: AsyncFnOnce()>(name: &str, f: F) -> u64 {
    if !runs(name) {
        return 0;
    }
    let counting = std::env::var_os("BREAKWATER_COST").is_none();
    let before = if counting {
        dhat::HeapStats::get().total_blocks
    } else {
        0
    };
    f().await;
    if counting {
        dhat::HeapStats::get().total_blocks - before
    } else {
        0
    }
}

/// One caller per key of `keys`, all at once, each hitting its key `per`
/// times through `get_or_load`.
async fn hits_at_once(cache: &Cache<String>, keys: Vec<String>, per: u64) {
    let mut callers = tokio::task::JoinSet::new();
    for key in keys {
        let cache = cache.clone();
        callers.spawn(async move {
            for _ in 0..per {
                let got = cache
                    .get_or_load(&key, || async {
                        Ok::<_, std::io::Error>(Some(String::new()))
                    })
                    .await
                    .unwrap();
                assert!(got.is_some());
            }
        });
    }
    callers.join_all().await;
}

fn main() {
    // Without a profiler, dhat's allocator only forwards to the system's.
    let _profiler = std::env::var_os("BREAKWATER_COST")
        .is_none()
        .then(|| dhat::Profiler::builder().testing().build());
    let n = hits();
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        // L1 hits, u64 values (a clone allocates nothing).
        let l1 = Cache::<u64>::builder()
            .namespace("cost")
            .ttl(Duration::from_secs(3_600))
            .l1(L1Config::new().ttl(Duration::from_secs(600)))
            .build()
            .expect("cache");
        let load = || async { Ok::<_, std::io::Error>(Some(7u64)) };
        l1.get_or_load("hot", load).await.expect("warm");
        let ours = blocks("l1", async || {
            for _ in 0..n {
                std::hint::black_box(l1.get_or_load("hot", load).await.unwrap());
            }
        })
        .await;
        let moka = moka::future::Cache::<String, u64>::new(10_000);
        moka.insert("hot".to_owned(), 7).await;
        let bare = blocks("moka", async || {
            for _ in 0..n {
                std::hint::black_box(moka.get("hot").await);
            }
        })
        .await;
        // L1's own map: moka's synchronous cache, with a time-to-live as
        // L1 sets one.
        let sync = moka::sync::Cache::<String, u64>::builder()
            .max_capacity(10_000)
            .time_to_live(Duration::from_secs(3_600))
            .build();
        sync.insert("hot".to_owned(), 7);
        let bare_sync = blocks("mokasync", async || {
            for _ in 0..n {
                std::hint::black_box(sync.get("hot"));
            }
        })
        .await;
        println!(
            "L1 hit:        {:>6.2} allocations per hit (bare moka get: future {:.2}, sync {:.2})",
            ours as f64 / n as f64,
            bare as f64 / n as f64,
            bare_sync as f64 / n as f64
        );

        // Redis hits, String values, L1 off.
        let store = RedisStore::connect(&server.url()).expect("store");
        store.warm_up().await.expect("redis");
        let l2 = Cache::<String>::builder()
            .namespace("cost")
            .store(store)
            .ttl(Duration::from_secs(3_600))
            .build()
            .expect("cache");
        let value = "value of product:42, about the size of a small row".to_owned();
        let v = value.clone();
        l2.get_or_load("product:42", move || {
            let v = v.clone();
            async move { Ok::<_, std::io::Error>(Some(v)) }
        })
        .await
        .expect("warm");
        let ours = blocks("redis", async || {
            for _ in 0..n {
                let got = l2
                    .get_or_load("product:42", || async {
                        Ok::<_, std::io::Error>(Some(String::new()))
                    })
                    .await
                    .unwrap();
                assert_eq!(got.as_deref(), Some(value.as_str()));
            }
        })
        .await;
        let client = redis::Client::open(server.url()).expect("client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        redis::cmd("SET")
            .arg("raw")
            .arg(&value)
            .query_async::<()>(&mut conn)
            .await
            .expect("set");
        let raw = blocks("raw", async || {
            for _ in 0..n {
                let got: Option<String> = redis::cmd("GET")
                    .arg("raw")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(got.is_some());
            }
        })
        .await;
        println!(
            "Redis hit:     {:>6.2} allocations per hit (raw GET: {:.2}; {n} hits each)",
            ours as f64 / n as f64,
            raw as f64 / n as f64
        );

        // A hit on an entry written with two tags, named by the call as
        // it was written: their generations are read beside the entry.
        l2.entry("tagged:42")
            .tags(["product:42", "catalog"])
            .set(&value)
            .await
            .expect("warm");
        let tagged = blocks("tagged", async || {
            for _ in 0..n {
                let got = l2
                    .entry("tagged:42")
                    .tags(["product:42", "catalog"])
                    .get_or_load(|| async { Ok::<_, std::io::Error>(Some(String::new())) })
                    .await
                    .unwrap();
                assert_eq!(got.as_deref(), Some(value.as_str()));
            }
        })
        .await;
        // Its floor: one raw MGET of a value and two short strings.
        for counter in ["rawtag:a", "rawtag:b"] {
            redis::cmd("SET")
                .arg(counter)
                .arg("123456789")
                .query_async::<()>(&mut conn)
                .await
                .expect("set");
        }
        let raw_tagged = blocks("rawmget", async || {
            for _ in 0..n {
                let got: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
                    .arg("raw")
                    .arg("rawtag:a")
                    .arg("rawtag:b")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(got[0].is_some());
            }
        })
        .await;
        println!(
            "Tagged hit:    {:>6.2} allocations per hit (two tags; raw MGET of three keys: {:.2})",
            tagged as f64 / n as f64,
            raw_tagged as f64 / n as f64
        );

        // The same, 50 callers at once on 50 distinct keys: what a hit
        // costs when the connection's round trips are shared.
        let keys: Vec<String> = (0..CALLERS).map(|k| format!("product:{k}")).collect();
        for key in &keys {
            let v = value.clone();
            l2.get_or_load(key, move || async move { Ok::<_, std::io::Error>(Some(v)) })
                .await
                .expect("warm");
            redis::cmd("SET")
                .arg(key)
                .arg(&value)
                .query_async::<()>(&mut conn)
                .await
                .expect("set");
        }
        let per = n / CALLERS as u64;
        let ours = blocks("redis50", async || hits_at_once(&l2, keys.clone(), per).await).await;
        let raw = blocks("raw50", async || {
            let mut callers = tokio::task::JoinSet::new();
            for key in keys.clone() {
                let mut conn = conn.clone();
                callers.spawn(async move {
                    for _ in 0..per {
                        let got: Option<String> = redis::cmd("GET")
                            .arg(&key)
                            .query_async(&mut conn)
                            .await
                            .unwrap();
                        assert!(got.is_some());
                    }
                });
            }
            callers.join_all().await;
        })
        .await;
        // The floor of a checked read: a raw GET of msgpack bytes (under
        // the connection's deadline, as above), decoded to the value (no
        // envelope, no coalescing, no breaker, no metrics).
        let packed = rmp_serde::to_vec(&value).expect("msgpack");
        for key in &keys {
            redis::cmd("SET")
                .arg(format!("packed:{key}"))
                .arg(&packed)
                .query_async::<()>(&mut conn)
                .await
                .expect("set");
        }
        let floor = blocks("floor50", async || {
            let mut callers = tokio::task::JoinSet::new();
            for key in keys.clone() {
                let mut conn = conn.clone();
                let key = format!("packed:{key}");
                callers.spawn(async move {
                    for _ in 0..per {
                        let mut get = redis::cmd("GET");
                        get.arg(&key);
                        // The connection's own response timeout (500 ms
                        // by default) is the deadline, as for the raw GETs.
                        let got: Option<Vec<u8>> = get.query_async(&mut conn).await.unwrap();
                        let v: String = rmp_serde::from_slice(&got.unwrap()).unwrap();
                        std::hint::black_box(v);
                    }
                });
            }
            callers.join_all().await;
        })
        .await;
        println!(
            "Redis hit, {CALLERS} callers on {CALLERS} keys: {:>6.2} allocations per hit (raw GET: {:.2}; raw GET + msgpack decode: {:.2})",
            ours as f64 / (per * CALLERS as u64) as f64,
            raw as f64 / (per * CALLERS as u64) as f64,
            floor as f64 / (per * CALLERS as u64) as f64
        );

        // 50 callers at once on one hot key: concurrent reads of it share
        // one `GET` (a leader reads, the others follow it).
        let hot_key = vec!["product:0".to_owned(); CALLERS];
        let hot = blocks("hot50", async || hits_at_once(&l2, hot_key.clone(), per).await).await;
        println!(
            "Redis hit, {CALLERS} callers on one key: {:>6.2} allocations per hit",
            hot as f64 / (per * CALLERS as u64) as f64
        );

        // Writes: 100 `set`s in flight on distinct keys (past a few in the
        // air they meet in the write queue), next to raw pipelines of 100
        // `SET PX` of the same value.
        let writers = 100u64;
        let rounds = (n / writers).max(1);
        let sets = blocks("set100", async || {
            let mut callers = tokio::task::JoinSet::new();
            for w in 0..writers {
                let (l2, value) = (l2.clone(), value.clone());
                callers.spawn(async move {
                    for r in 0..rounds {
                        l2.set(format!("w:{w}:{r}"), &value).await.unwrap();
                    }
                });
            }
            callers.join_all().await;
        })
        .await;
        let raw_sets = blocks("rawset100", async || {
            for r in 0..rounds {
                let mut pipe = redis::pipe();
                for w in 0..writers {
                    pipe.cmd("SET")
                        .arg(format!("rw:{w}:{r}"))
                        .arg(&value)
                        .arg("PX")
                        .arg(3_600_000)
                        .ignore();
                }
                pipe.query_async::<()>(&mut conn).await.unwrap();
            }
        })
        .await;
        println!(
            "set, {writers} in flight: {:>6.2} allocations per set (raw pipelined SET PX: {:.2})",
            sets as f64 / (rounds * writers) as f64,
            raw_sets as f64 / (rounds * writers) as f64
        );
    });
}
