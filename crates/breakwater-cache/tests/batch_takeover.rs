//! A `get_many` whose keys another process holds, and that process dies
//! (or its leases go): the waiting keys are taken over as a batch (one
//! lease step, one loader call per 500 keys), not one by one. On the
//! memory store on paused time, and with real OS processes against a
//! private `redis-server`, one of them `SIGKILL`ed mid-load.
//!
//! Also: a background refresh whose lease attempt fails (a lost reply,
//! the attempt having run) gives its tokens back.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use breakwater_cache::testing::CountingStore;
use breakwater_cache::{Cache, MemoryStore, RedisStore, Served, Store};
use breakwater_cache_testkit::{RedisServer, TiedChild, tied_command};
use support::ten_second_cache;
use tokio::time::{Instant, sleep};

/// What the test loader's future returns.
type Found =
    std::pin::Pin<Box<dyn Future<Output = Result<Vec<(u64, String)>, std::io::Error>> + Send>>;

/// One batch loader call: when it started, and its keys.
type Call = (Instant, Vec<u64>);

/// A batch loader's record: every call.
#[derive(Default, Clone)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    /// The calls that started at or after `since`, as their sizes.
    fn sizes_since(&self, since: Instant) -> Vec<usize> {
        let calls = self.0.lock().unwrap();
        calls
            .iter()
            .filter(|(at, _)| *at >= since)
            .map(|(_, ids)| ids.len())
            .collect()
    }

    /// A loader that records its keys, waits `delay`, and finds every key
    /// except multiples of 7 (value: `"v<id>"`).
    fn loader(&self, delay: Duration) -> impl Fn(Vec<u64>) -> Found + Send + Sync + 'static {
        let calls = self.clone();
        move |ids: Vec<u64>| {
            calls.0.lock().unwrap().push((Instant::now(), ids.clone()));
            Box::pin(async move {
                sleep(delay).await;
                Ok(ids
                    .into_iter()
                    .filter(|id| !id.is_multiple_of(7))
                    .map(|id| (id, format!("v{id}")))
                    .collect())
            })
        }
    }
}

fn expected(id: u64) -> Option<String> {
    (!id.is_multiple_of(7)).then(|| format!("v{id}"))
}

/// The lease key of `key` in `cache` (its storage key with `:v:` made
/// `:l:`).
fn lease_of(cache: &Cache<String>, key: u64) -> Vec<u8> {
    let mut lease = cache.storage_key(key).unwrap();
    let at = lease.windows(3).position(|w| w == b":v:").unwrap();
    lease[at + 1] = b'l';
    lease
}

/// A cache on a memory store where a dead process holds the leases of
/// ids 1..=600 (3 s, taken together, as a batch holder takes them).
async fn cache_with_dead_leases() -> Cache<String> {
    let store = MemoryStore::new();
    let cache = ten_second_cache("many")
        .store(store.clone())
        .build()
        .unwrap();
    for id in 1..=600u64 {
        let lease = lease_of(&cache, id);
        let attempt = store.acquire_lease(&lease, b"dead", Duration::from_secs(3));
        assert!(attempt.await.unwrap().is_acquired());
    }
    cache
}

/// A dead process's leases on ids 1..=600 (taken together, as a batch
/// holder takes them); this process asks for 1..=1000 with a 500 ms loader
/// and the library's defaults (3 s leases, the default bulkhead). Ids
/// 601..=1000 are one loader call; the 600 dead ones are taken over when
/// the leases run out, as one batch (two loader calls: 500 + 100), with no
/// error, done within the lease TTL plus two loads.
#[tokio::test(start_paused = true)]
async fn a_dead_holders_keys_are_taken_over_as_one_batch() {
    let cache = cache_with_dead_leases().await;
    let dead = Instant::now();
    let calls = Calls::default();
    let got = cache
        .get_many_with_meta(1..=1000u64, calls.loader(Duration::from_millis(500)))
        .await;
    let took = dead.elapsed();
    let errors: Vec<String> = got
        .iter()
        .filter_map(|g| g.as_ref().err().map(ToString::to_string))
        .collect();
    let wrong = got
        .iter()
        .zip(1u64..)
        .filter(|(g, id)| g.as_ref().is_ok_and(|f| f.value != expected(*id)))
        .count();
    let after = calls.sizes_since(dead + Duration::from_secs(3));
    eprintln!(
        "dead holder of 600 ids: {} errors (first: {:?}), {wrong} wrong values, \
         loader calls after its leases ran out: {} (sizes {:?}), done {took:?} after",
        errors.len(),
        errors.first(),
        after.len(),
        &after[..after.len().min(10)],
    );
    assert!(errors.is_empty(), "{} errors", errors.len());
    assert_eq!(wrong, 0);
    assert_eq!(calls.sizes_since(dead), [400, 500, 100]);
    assert!(took <= Duration::from_secs(3) + 2 * Duration::from_millis(500));
}

/// Four concurrent `get_many` calls in one process, each asking for ids
/// 1..=1000 in its own order, a dead process's leases on 1..=600: the
/// calls share one flight per key, so the process takes the dead keys
/// over once, as one batch (500 + 100), not once per call.
#[tokio::test(start_paused = true)]
async fn concurrent_calls_in_one_process_take_over_as_one_batch() {
    let cache = cache_with_dead_leases().await;
    let dead = Instant::now();
    let calls = Calls::default();
    let callers: Vec<_> = (0..4u64)
        .map(|c| {
            let (cache, loader) = (cache.clone(), calls.loader(Duration::from_millis(500)));
            let mut ids: Vec<u64> = (1..=1000).collect();
            ids.rotate_left((c * 250) as usize);
            tokio::spawn(async move {
                let got = cache.get_many(ids.clone(), loader).await.unwrap();
                for (id, value) in ids.iter().zip(got) {
                    assert_eq!(value, expected(*id));
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
    let after = calls.sizes_since(dead + Duration::from_secs(3));
    eprintln!("4 calls in one process: loader calls after the dead leases ran out {after:?}");
    assert_eq!(after, [500, 100]);
    assert_eq!(calls.sizes_since(dead), [400, 500, 100]);
}

/// A live holder whose loader hangs, and whose leases are then lost (the
/// store evicted them): the other cache, waiting on 300 of them, finds
/// them free at a poll and takes them over together, in one loader call.
#[tokio::test(start_paused = true)]
async fn leases_lost_under_a_hung_loader_are_taken_over_as_one_batch() {
    let store = MemoryStore::new();
    let hung = ten_second_cache("many")
        .store(store.clone())
        .load_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let waiting = ten_second_cache("many")
        .store(store.clone())
        .build()
        .unwrap();
    let holder = tokio::spawn({
        let hung = hung.clone();
        async move {
            hung.get_many(1..=300u64, |_ids: Vec<u64>| async {
                std::future::pending::<()>().await;
                Ok::<Vec<(u64, String)>, std::io::Error>(Vec::new())
            })
            .await
        }
    });
    sleep(Duration::from_millis(100)).await;
    assert!(store.lease_held(&lease_of(&hung, 300)).await.unwrap());
    let calls = Calls::default();
    let asked = Instant::now();
    let call = tokio::spawn({
        let (waiting, loader) = (waiting.clone(), calls.loader(Duration::from_millis(500)));
        async move { waiting.get_many_with_meta(1..=300u64, loader).await }
    });
    sleep(Duration::from_millis(200)).await;
    for id in 1..=300u64 {
        store.delete(&lease_of(&hung, id)).await.unwrap();
    }
    let got = call.await.unwrap();
    let took = asked.elapsed();
    holder.abort();
    for (g, id) in got.iter().zip(1u64..) {
        let fetched = g.as_ref().unwrap();
        assert_eq!(fetched.value, expected(id));
        assert_eq!(fetched.served, Served::Loaded);
    }
    let sizes = calls.sizes_since(asked);
    eprintln!("leases lost under a hung loader: loader calls {sizes:?}, done {took:?} after");
    assert_eq!(sizes, [300], "one batch for the 300 keys");
    // Found at a poll (at most a lease TTL), then one load.
    assert!(took <= Duration::from_secs(3) + Duration::from_millis(500 + 200));
}

/// A background refresh (stale within grace) whose lease attempt ran and
/// then failed (its reply lost) gives the lease back at once, through
/// `get_many` and `get_or_load` alike: another process need not sit out
/// the lease TTL.
#[tokio::test(start_paused = true)]
async fn a_failed_background_lease_attempt_gives_its_lease_back() {
    let memory = MemoryStore::new();
    let store = CountingStore::new(memory.clone());
    let cache = ten_second_cache("many")
        .store(store.clone())
        .grace(Duration::from_secs(60))
        .build()
        .unwrap();
    let calls = Calls::default();
    let loader = || calls.loader(Duration::from_millis(10));
    cache.get_many([1u64, 2], loader()).await.unwrap();
    let single = || async { Ok::<_, std::io::Error>(Some("v3".to_owned())) };
    cache.get_or_load(3u64, single).await.unwrap();
    sleep(Duration::from_secs(11)).await;
    store.lose_lease_replies(true);
    let got = cache.get_many_with_meta([1u64, 2], loader()).await;
    for g in &got {
        assert!(matches!(g.as_ref().unwrap().served, Served::Stale { .. }));
    }
    let got = cache.get_or_load_with_meta(3u64, single).await.unwrap();
    assert!(matches!(got.served, Served::Stale { .. }));
    // The refreshes run (and fail) in the background.
    sleep(Duration::from_millis(50)).await;
    let mut held = Vec::new();
    for id in [1u64, 3] {
        if memory.lease_held(&lease_of(&cache, id)).await.unwrap() {
            held.push(id);
        }
    }
    assert_eq!(
        held,
        Vec::<u64>::new(),
        "leases left held by failed refreshes"
    );
}

// ------------------------------------------------------------ OS processes

/// Ids each process asks for, and the distance between two processes'
/// first ids.
const IDS: u64 = 1_000;
const STEP: u64 = 250;
/// The batch loader's time.
const LOADER: Duration = Duration::from_millis(500);
/// The library's default lease TTL.
const LEASE_TTL: Duration = Duration::from_secs(3);

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn row(id: u64) -> Option<String> {
    (!id.is_multiple_of(7)).then(|| format!("row {id}"))
}

/// One worker process (this test binary again, when `BW_TAKEOVER_REDIS` is
/// set): a cache with the library's defaults asks for `IDS` ids from
/// `BW_TAKEOVER_FROM` with one `get_many` once the key `go:<from>` exists, its
/// loader taking `LOADER`. Prints `BWCALL <epoch ms> <ids>` as each loader
/// call starts, then `BWDONE ok=<n> err=<n> wrong=<n> first_error=<..>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_worker() {
    let Ok(url) = std::env::var("BW_TAKEOVER_REDIS") else {
        return;
    };
    let from: u64 = std::env::var("BW_TAKEOVER_FROM").unwrap().parse().unwrap();
    let store = RedisStore::connect_with(&url, support::patient()).unwrap();
    store.warm_up().await.unwrap();
    let cache = Cache::<String>::builder()
        .namespace("takeover")
        .store(store.clone())
        .build()
        .unwrap();
    println!("BWREADY");
    let go = format!("go:{from}");
    while store.get(go.as_bytes()).await.unwrap().is_none() {
        sleep(Duration::from_millis(1)).await;
    }
    let ids: Vec<u64> = (from..from + IDS).collect();
    let loader = |ids: Vec<u64>| {
        println!("BWCALL {} {}", epoch_ms(), ids.len());
        async move {
            sleep(LOADER).await;
            Ok::<_, std::io::Error>(
                ids.into_iter()
                    .filter_map(|id| row(id).map(|r| (id, r)))
                    .collect::<Vec<_>>(),
            )
        }
    };
    let got = cache.get_many_with_meta(ids.clone(), loader).await;
    let (mut ok, mut err, mut wrong, mut first_error) = (0, 0, 0, None);
    for (id, g) in ids.iter().zip(got) {
        match g {
            Ok(f) if f.value == row(*id) => ok += 1,
            Ok(_) => wrong += 1,
            Err(e) => {
                err += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
    let first_error = first_error.unwrap_or_else(|| "none".into());
    println!("BWDONE ok={ok} err={err} wrong={wrong} first_error={first_error}");
}

/// A line from a worker, as the test saw it.
struct Line {
    worker: usize,
    text: String,
    at: std::time::Instant,
}

/// The acceptance run: 4 processes `get_many` 1,000 overlapping ids each
/// (process p from p × 250), 500 ms batch loader, library defaults; the
/// first batch holder (P0, released first; the others as its loader
/// starts) is `SIGKILL`ed 20 ms into its load, holding the leases of all
/// its 1,000 ids: 750 of P1's, 500 of P2's, 250 of P3's.
/// Every survivor gets every value right, with no error, within the lease
/// TTL plus two loads of the kill, with at most 2 loader calls taking the
/// dead holder's keys over (a survivor's own first batch may start just
/// after the kill, and is not one).
#[test]
fn a_killed_batch_holder_is_taken_over_as_one_batch_per_process() {
    let redis = RedisServer::start();
    let (tx, lines) = mpsc::channel::<Line>();
    let mut workers: Vec<Option<TiedChild>> = (0..4)
        .map(|p| {
            let mut cmd = tied_command(std::env::current_exe().unwrap());
            cmd.args([
                "--exact",
                "takeover_worker",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("BW_TAKEOVER_REDIS", redis.url())
            .env("BW_TAKEOVER_FROM", (1 + p as u64 * STEP).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
            let mut child = TiedChild::spawn(cmd).unwrap();
            let stdout = child.take_stdout().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for text in BufReader::new(stdout).lines() {
                    let Ok(text) = text else { break };
                    let line = Line {
                        worker: p,
                        text,
                        at: std::time::Instant::now(),
                    };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
            Some(child)
        })
        .collect();
    drop(tx);
    let next = || {
        lines
            .recv_timeout(Duration::from_secs(60))
            .expect("a worker went quiet for 60 s")
    };
    let mut ready = 0;
    while ready < 4 {
        if next().text.contains("BWREADY") {
            ready += 1;
        }
    }
    // P0 goes first, so its batch is the first and holds all its ids (the
    // others' leases taken before its own would leave it few to hold); the
    // others go as its loader starts, and find most of their ids held.
    let go = |p: u64| {
        let key = format!("go:{}", 1 + p * STEP);
        redis.command(&["SET", &key, "1"]).unwrap();
    };
    go(0);
    // (worker, epoch ms, ids) of every loader call.
    let mut calls: Vec<(usize, u64, usize)> = Vec::new();
    let parse_call = |line: &Line| {
        let at = line.text.find("BWCALL ")?;
        let mut parts = line.text[at + 7..].split(' ');
        let ms: u64 = parts.next()?.parse().ok()?;
        let ids: usize = parts.next()?.trim().parse().ok()?;
        Some((line.worker, ms, ids))
    };
    let (holder, started) = loop {
        let line = next();
        if let Some(call) = parse_call(&line) {
            calls.push(call);
            break (line.worker, line.at);
        }
    };
    for p in 1..4 {
        go(p);
    }
    std::thread::sleep(Duration::from_millis(20).saturating_sub(started.elapsed()));
    workers[holder].take().unwrap().kill();
    let killed = std::time::Instant::now();
    let killed_ms = epoch_ms();
    let mut done: BTreeMap<usize, (String, Duration)> = BTreeMap::new();
    while done.len() < 3 {
        let line = next();
        if line.worker == holder {
            continue;
        }
        if let Some(call) = parse_call(&line) {
            calls.push(call);
        } else if let Some(at) = line.text.find("BWDONE ") {
            let text = line.text[at + 7..].trim().to_owned();
            done.insert(line.worker, (text, line.at.duration_since(killed)));
        }
    }
    // A survivor's own first batch may start just after the kill (its
    // lease step came later than the holder's); the dead holder's leases
    // run out a lease TTL after it took them, so every takeover starts
    // more than a second after the kill.
    let mut after: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut takeovers: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &(worker, ms, ids) in &calls {
        if worker != holder && ms >= killed_ms {
            after.entry(worker).or_default().push(ids);
            if ms >= killed_ms + 1_000 {
                takeovers.entry(worker).or_default().push(ids);
            }
        }
    }
    let slowest = done.values().map(|(_, d)| *d).max().unwrap();
    let shown = |calls: &BTreeMap<usize, Vec<usize>>| -> String {
        let mut out = String::new();
        for (worker, sizes) in calls {
            let ones = sizes.iter().filter(|n| **n == 1).count();
            out.push_str(&format!(
                "P{worker}: {} calls ({ones} of size 1), sizes {:?}; ",
                sizes.len(),
                &sizes[..sizes.len().min(8)]
            ));
        }
        out
    };
    eprintln!(
        "holder P{holder} killed 20 ms into its load; survivors: {done:?}; loader calls \
         after the kill: {}; of which takeovers (1 s or more after it): {}; last survivor \
         done {slowest:?} after the kill",
        shown(&after),
        shown(&takeovers),
    );
    for (worker, (text, _)) in &done {
        assert_eq!(
            text, "ok=1000 err=0 wrong=0 first_error=none",
            "survivor P{worker}"
        );
    }
    for (worker, sizes) in &takeovers {
        assert!(
            sizes.len() <= 2,
            "P{worker} made {} loader calls taking over: {sizes:?}",
            sizes.len()
        );
    }
    assert!(
        slowest <= LEASE_TTL + 2 * LOADER,
        "the last survivor was done {slowest:?} after the kill"
    );
    for worker in workers.iter_mut().flatten() {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while worker.try_wait().unwrap().is_none() {
            assert!(std::time::Instant::now() < deadline, "a worker hung");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
