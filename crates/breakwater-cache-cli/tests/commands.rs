//! `breakwater inspect`, `warm` and `bench` against a private
//! `redis-server` and a private three-node cluster, and how every
//! subcommand behaves on bad input: exit code 2 for a usage or
//! configuration error, 1 for a failure at run time, one line on stderr
//! that says what to fix.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use breakwater_cache::{Cache, Jitter, RedisStore, Store};
use breakwater_cache_testkit::{RedisCluster, RedisServer};

/// Runs `breakwater` with `args`; (exit code, stdout, stderr). The process
/// gets 60 s.
fn breakwater(args: &[&str]) -> (i32, String, String) {
    breakwater_within(args, Duration::from_secs(60))
}

/// Runs `breakwater` with `args`, killing it and failing the test if it has
/// not exited within `deadline`; (exit code, stdout, stderr). The output is
/// read while the process runs, so a full pipe cannot stall it.
fn breakwater_within(args: &[&str], deadline: Duration) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_breakwater"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn breakwater");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let until = Instant::now() + deadline;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("breakwater {args:?} did not exit within {deadline:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    (status.code().unwrap_or(-1), out, err)
}

/// `breakwater inspect` with `args`.
fn inspect(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["inspect"];
    all.extend_from_slice(args);
    breakwater(&all)
}

#[tokio::test]
async fn reports_fresh_negative_unreadable_and_missing_keys() {
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).unwrap();
    let cache: Cache<String> = Cache::builder()
        .namespace("shop")
        .store(store.clone())
        .ttl(Duration::from_secs(600))
        .jitter(Jitter::none())
        .build()
        .unwrap();
    cache
        .set("product:1", &"espresso".to_owned())
        .await
        .unwrap();
    cache
        .get_or_load("product:404", || async { Ok::<_, std::io::Error>(None) })
        .await
        .unwrap();
    let garbage = cache.storage_key(b"product:2").unwrap();
    store
        .set(&garbage, b"hello", Duration::from_secs(60))
        .await
        .unwrap();

    let url = server.url();
    let (code, out, err) = inspect(&[
        "--redis",
        &url,
        "--namespace",
        "shop",
        "product:1",
        "product:404",
        "product:2",
        "product:3",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let sections: Vec<&str> = out.split("\nproduct:").collect();
    assert_eq!(sections.len(), 4, "{out}");
    assert!(sections[0].starts_with("product:1\n"), "{out}");
    assert!(
        sections[0].contains("stored as  bw:shop:v:{product:1}"),
        "{out}"
    );
    assert!(
        sections[0].contains("entry      value, fresh for 10m 00s, no stale window")
            || sections[0].contains("entry      value, fresh for 9m 59s, no stale window"),
        "{out}"
    );
    assert!(sections[0].contains("(served now)"), "{out}");
    assert!(sections[0].contains("lease      free"), "{out}");
    assert!(
        sections[1].contains("entry      negative (the value does not exist)"),
        "{out}"
    );
    assert!(
        sections[2].contains("entry      unreadable (5 bytes)"),
        "{out}"
    );
    assert!(sections[3].contains("entry      none"), "{out}");

    let (code, _, err) = inspect(&["--redis", &url, "--namespace", "shop", ""]);
    assert_eq!(code, 2, "an empty key is a usage error: {err}");
    assert!(err.contains("key must not be empty"), "{err}");
}

#[tokio::test]
async fn inspects_keys_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect_cluster(cluster.urls()).unwrap();
    let cache: Cache<String> = Cache::builder()
        .namespace("shop")
        .store(store)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..6).map(|i| format!("product:{i}")).collect();
    for key in &keys {
        cache.set(key, &"v".to_owned()).await.unwrap();
    }
    // The keys live on more than one node.
    let nodes: std::collections::HashSet<usize> = keys
        .iter()
        .map(|k| {
            cluster.node_of(&String::from_utf8(cache.storage_key(k.as_bytes()).unwrap()).unwrap())
        })
        .collect();
    assert!(nodes.len() > 1, "{nodes:?}");

    let urls = cluster.urls().join(",");
    let mut args = vec!["--redis", &urls, "--namespace", "shop"];
    args.extend(keys.iter().map(String::as_str));
    let (code, out, err) = inspect(&args);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        out.matches("entry      value, fresh for").count(),
        6,
        "{out}"
    );
}

#[tokio::test]
async fn warm_fills_a_cluster_named_by_its_node_urls() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls().join(",");
    let (code, out, err) = breakwater(&[
        "warm",
        "--redis",
        &urls,
        "--namespace",
        "warm-cluster",
        "--keys",
        "60",
        "--rate",
        "10000",
        "--loader-latency",
        "1ms",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("cold cache: loaded 60, already cached 0, failed 0"),
        "{out}"
    );
    assert!(
        out.contains("warm cache: loaded 0, already cached 60, failed 0"),
        "{out}"
    );
    // The entries are on more than one node.
    let holding = cluster
        .nodes()
        .iter()
        .filter(|node| node.command(&["DBSIZE"]).unwrap() != "0")
        .count();
    assert!(holding > 1, "{holding}");
}

/// A Redis URL nothing listens on: a private server's, after it was killed.
fn unreachable_url() -> String {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    url
}

/// Every key of a (private) server, by SCAN.
fn all_keys(server: &RedisServer) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    loop {
        let reply = server.command(&["SCAN", &cursor, "COUNT", "1000"]).unwrap();
        let mut lines = reply.lines();
        cursor = lines.next().unwrap_or("0").to_owned();
        keys.extend(lines.map(str::to_owned));
        if cursor == "0" {
            return keys;
        }
    }
}

/// The error is one line that names no Rust type (`Err(..)`, `Disconnected`).
fn assert_one_line_error(err: &str) {
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!err.contains("Err("), "{err}");
    assert!(!err.contains("Disconnected"), "{err}");
    assert!(!err.contains("Some("), "{err}");
}

#[test]
fn zero_or_absurd_bench_arguments_are_usage_errors_not_hangs() {
    let server = RedisServer::start();
    let url = server.url();
    for (args, bad) in [
        (
            &[
                "stampede",
                "--concurrency",
                "0",
                "--processes",
                "1",
                "--runs",
                "1",
            ][..],
            "--concurrency",
        ),
        (
            &[
                "stampede",
                "--concurrency",
                "5",
                "--processes",
                "0",
                "--runs",
                "1",
            ],
            "--processes",
        ),
        (
            &[
                "stampede",
                "--concurrency",
                "5",
                "--processes",
                "1",
                "--runs",
                "0",
            ],
            "--runs",
        ),
        (
            &["stampede", "--concurrency", "100000000", "--processes", "1"],
            "--concurrency",
        ),
        (
            &["grace", "--concurrency", "0", "--runs", "1"],
            "--concurrency",
        ),
        (
            &["grace", "--concurrency", "5", "--loader-latency", "2m"],
            "--loader-latency",
        ),
        (&["hit", "--trials", "0"], "--trials"),
        (&["hit", "--workers", "65"], "--workers"),
    ] {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        all.extend(["--redis", &url]);
        let (code, out, err) = breakwater_within(&all, Duration::from_secs(20));
        assert_eq!(code, 2, "{all:?}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(out.is_empty(), "{all:?}: {out}");
        assert!(err.contains(bad), "{all:?}: {err}");
    }
    let (code, _, err) = breakwater_within(
        &["warm", "--keys", "10", "--concurrency", "0"],
        Duration::from_secs(20),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--concurrency"), "{err}");
}

#[test]
fn benches_report_an_unreachable_redis_in_one_line_before_any_table() {
    let url = unreachable_url();
    for bench in ["stampede", "grace", "hit"] {
        let (code, out, err) = breakwater_within(
            &[
                "bench",
                bench,
                "--redis",
                &url,
                "--runs",
                "1",
                "--concurrency",
                "5",
            ][..if bench == "hit" { 4 } else { 8 }],
            Duration::from_secs(30),
        );
        assert_eq!(code, 1, "bench {bench}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(
            out.is_empty(),
            "bench {bench} printed before it failed: {out}"
        );
        assert_one_line_error(&err);
        assert!(err.contains("check --redis"), "bench {bench}: {err}");
    }
}

/// A server on a private port that answers every connection the way an
/// HTTP server answers a Redis client: `HTTP/1.1 400 Bad Request`. Its
/// address; it serves until the test process ends.
fn http_server() -> std::net::SocketAddr {
    use std::io::Write;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            thread::spawn(move || {
                let mut request = [0u8; 256];
                let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
                let _ = conn.read(&mut request);
                let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            });
        }
    });
    addr
}

#[test]
fn a_server_that_is_not_redis_is_named_as_such() {
    let addr = http_server();
    let url = format!("redis://:hunter2@{addr}");
    for args in [
        &["inspect", "--namespace", "ns", "key"][..],
        &["warm", "--keys", "10"],
        &["bench", "hit", "--trials", "1"],
        &["bench", "grace", "--concurrency", "5", "--runs", "1"],
        &["spread", "--match", "k:*", "--jitter", "0.2"],
    ] {
        let mut all = args.to_vec();
        all.extend(["--redis", &url]);
        let (code, out, err) = breakwater_within(&all, Duration::from_secs(30));
        assert_ne!(code, 0, "{all:?}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(!err.contains("panicked"), "{all:?}: {err}");
        assert!(out.is_empty(), "{all:?}: {out}");
        assert_one_line_error(&err);
        assert!(
            err.contains(&format!(
                "{addr} answered, but not as a Redis server (it does not speak RESP"
            )),
            "{all:?}: {err}"
        );
        assert!(
            err.contains("is --redis pointing at the right port?"),
            "{all:?}: {err}"
        );
        assert!(!err.contains("server is running"), "{all:?}: {err}");
        assert!(!err.contains("hunter2"), "{all:?}: {err}");
    }
}

#[test]
fn a_bad_url_is_a_usage_error_for_every_command() {
    for args in [
        &["inspect", "--namespace", "ns", "key"][..],
        &["warm", "--keys", "10"],
        &[
            "bench",
            "stampede",
            "--concurrency",
            "5",
            "--processes",
            "1",
            "--runs",
            "1",
        ],
        &["bench", "grace", "--concurrency", "5", "--runs", "1"],
        &["bench", "hit", "--trials", "1"],
        &["bench", "mixed", "--duration", "1s"],
        &["spread", "--match", "k:*", "--jitter", "0.2"],
    ] {
        let mut all = args.to_vec();
        all.extend(["--redis", "not-a-url"]);
        let (code, out, err) = breakwater_within(&all, Duration::from_secs(30));
        assert_eq!(code, 2, "{all:?}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(out.is_empty(), "{all:?}: {out}");
        assert_one_line_error(&err);
        assert!(err.contains("--redis"), "{all:?}: {err}");
    }
}

#[test]
fn benches_delete_the_keys_they_wrote() {
    let server = RedisServer::start();
    let url = server.url();
    let (code, out, err) = breakwater(&[
        "bench",
        "stampede",
        "--redis",
        &url,
        "--concurrency",
        "5",
        "--processes",
        "1",
        "--runs",
        "1",
        "--loader-latency",
        "1ms",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        all_keys(&server),
        Vec::<String>::new(),
        "bench stampede left keys"
    );
    let (code, out, err) = breakwater(&[
        "bench",
        "grace",
        "--redis",
        &url,
        "--concurrency",
        "5",
        "--runs",
        "1",
        "--loader-latency",
        "1ms",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert_eq!(
        all_keys(&server),
        Vec::<String>::new(),
        "bench grace left keys"
    );
    // On the CLI's current-thread runtime, then on one of 2 workers.
    for (workers, runtime) in [("0", "current-thread runtime"), ("2", "2 worker threads")] {
        let (code, out, err) = breakwater(&[
            "bench",
            "hit",
            "--redis",
            &url,
            "--trials",
            "1",
            "--trial",
            "20ms",
            "--workers",
            workers,
        ]);
        assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
        assert!(out.contains(runtime), "{out}");
        assert_eq!(out.matches("ratio").count(), 4, "{out}");
        // A tagged hit is one command (the entry and its tags' counters
        // in one MGET), give or take the bus's own few.
        assert!(out.contains("2 tags (1.0"), "{out}");
        assert_eq!(
            all_keys(&server),
            Vec::<String>::new(),
            "bench hit --workers {workers} left keys"
        );
    }
    // Someone else's keys are not the bench's to delete.
    server.command(&["SET", "naive:hot:theirs", "1"]).unwrap();
    server
        .command(&["SET", "bw:bench:v:{theirs}", "1"])
        .unwrap();
    let (code, _, err) = breakwater(&[
        "bench",
        "stampede",
        "--redis",
        &url,
        "--concurrency",
        "2",
        "--processes",
        "1",
        "--runs",
        "1",
        "--loader-latency",
        "1ms",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut left = all_keys(&server);
    left.sort();
    assert_eq!(left, ["bw:bench:v:{theirs}", "naive:hot:theirs"]);
}

#[test]
fn bench_mixed_compares_the_database_load_with_a_naive_cache_and_deletes_its_keys() {
    let server = RedisServer::start();
    let url = server.url();
    let (code, out, err) = breakwater_within(
        &[
            "bench",
            "mixed",
            "--redis",
            &url,
            "--processes",
            "2",
            "--concurrency",
            "10",
            "--keys",
            "2000",
            "--ttl",
            "2s",
            "--grace",
            "1s",
            "--l1",
            "100",
            "--writes",
            "50",
            "--duration",
            "5s",
            "--json",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("bench mixed --json");
    let sides = json["sides"].as_array().expect("sides");
    assert_eq!(sides.len(), 2, "{out}");
    let (bw, naive) = (&sides[0], &sides[1]);
    assert_eq!(bw["side"], "breakwater");
    assert_eq!(naive["side"], "naive");
    for side in sides {
        assert_eq!(side["errors"], 0, "{out}");
        assert!(side["requests"].as_u64().unwrap() > 1_000, "{out}");
        assert!(side["writes"].as_u64().unwrap() > 100, "{out}");
        let (queries, needed) = (
            side["queries"].as_u64().unwrap(),
            side["needed"].as_u64().unwrap(),
        );
        assert!(needed > 0 && queries >= needed, "{out}");
    }
    // Across processes, expiries and updates of hot keys, breakwater loads
    // a key once per expiry or update; the naive cache's callers that miss
    // together each query.
    assert!(bw["loads_per_expiry"].as_f64().unwrap() <= 1.05, "{out}");
    assert!(
        naive["loads_per_expiry"].as_f64().unwrap() > bw["loads_per_expiry"].as_f64().unwrap(),
        "{out}"
    );
    assert_eq!(
        all_keys(&server),
        Vec::<String>::new(),
        "bench mixed left keys"
    );
}

#[test]
fn bench_grace_says_what_waited_means_next_to_its_figure() {
    let server = RedisServer::start();
    let url = server.url();
    let (code, out, err) = breakwater(&[
        "bench",
        "grace",
        "--redis",
        &url,
        "--concurrency",
        "5",
        "--runs",
        "1",
        "--loader-latency",
        "1ms",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("waited: callers that waited on a load instead of being served at once"),
        "{out}"
    );
    // The figure is "of" the callers, so 0 reads as a result, not a goal.
    assert!(out.contains(" of 5"), "{out}");
}

#[test]
fn warm_shows_how_the_expiries_spread() {
    let (code, out, err) = breakwater(&[
        "warm",
        "--keys",
        "300",
        "--rate",
        "100000",
        "--loader-latency",
        "1ms",
        "--ttl",
        "100s",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    // ±20 % of 100 s: a histogram of rows over 80..120 s, bars and counts.
    let rows = out.lines().filter(|l| l.contains('█')).count();
    assert!(rows >= 5, "{out}");
    assert!(out.contains("busiest second"), "{out}");
    assert!(out.contains("uniform ideal"), "{out}");
}

/// The previous release's spellings still work for one release, each with
/// one warning that names the new spelling.
#[test]
fn old_option_spellings_work_with_a_deprecation_warning() {
    let (code, out, err) = breakwater(&[
        "warm",
        "--keys",
        "300",
        "--rate",
        "100000",
        "--loader-ms",
        "1",
        "--ttl-secs=100",
        "--ratio",
        "0.1",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for warning in [
        "warning: --loader-ms is deprecated; use --loader-latency 1ms",
        "warning: --ttl-secs is deprecated; use --ttl 1m 40s",
        "warning: --ratio is deprecated; use --jitter 0.1",
    ] {
        assert_eq!(err.matches(warning).count(), 1, "{warning}: {err}");
    }
    assert!(out.contains("TTL 1m 40s, jitter ±10%"), "{out}");
    // A value in the old unit that is not a number: a usage error that
    // names the new spelling.
    let (code, _, err) = breakwater(&["warm", "--loader-ms", "5ms"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("use --loader-latency"), "{err}");
    // The new spellings refuse what is out of bounds, naming the option.
    for (args, says) in [
        (&["warm", "--ttl", "500ms"][..], "--ttl"),
        (&["warm", "--loader-latency", "5"], "--loader-latency"),
        (&["warm", "--jitter", "sideways:3"], "--jitter"),
        (&["simulate", "--jitter", "1.5"], "--jitter"),
    ] {
        let (code, out, err) = breakwater(args);
        assert_eq!(code, 2, "{args:?}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn every_subcommand_has_an_example_in_its_help() {
    for args in [
        &["demo"][..],
        &["simulate"],
        &["warm"],
        &["inspect"],
        &["bench", "stampede"],
        &["bench", "grace"],
        &["bench", "hit"],
        &["bench", "many"],
        &["bench", "write"],
        &["bench", "mixed"],
        &["spread"],
    ] {
        let mut all = args.to_vec();
        all.push("--help");
        let (code, out, err) = breakwater_within(&all, Duration::from_secs(20));
        assert_eq!(code, 0, "{all:?}: {err}");
        assert!(out.contains("Example"), "{all:?}:\n{out}");
        assert!(
            out.contains(&format!("breakwater {}", args.join(" "))),
            "{all:?}:\n{out}"
        );
    }
}

/// A fresh directory under the system's temporary one.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("breakwater-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `breakwater demo | head -1`: the reader goes away after one line, and
/// the command ends quietly with status 0, as `cat` does (before: a panic,
/// "failed printing to stdout: Broken pipe", status 101).
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let out = temp_dir("demo-head");
    let mut child = Command::new(env!("CARGO_BIN_EXE_breakwater"))
        .args(["demo", "--seed", "3", "--out", out.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("breakwater runs");
    // Read beside: a full stderr pipe must not stall the command.
    let mut stderr = child.stderr.take().unwrap();
    let err = thread::spawn(move || {
        let mut err = String::new();
        stderr.read_to_string(&mut err).unwrap();
        err
    });
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).expect("a first byte");
    // `head -1` has what it wanted: it closes the pipe.
    drop(stdout);
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running after 300 s");
        thread::sleep(Duration::from_millis(50));
    };
    let err = err.join().unwrap();
    assert_eq!(status.code(), Some(0), "stderr:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn demo_tells_four_stories_and_writes_their_charts() {
    let out = temp_dir("demo");
    let out_arg = out.to_str().unwrap();
    // A deadline, not a speed check: a debug build on a busy machine.
    let (code, stdout, err) = breakwater_within(
        &["demo", "--seed", "3", "--out", out_arg],
        Duration::from_secs(900),
    );
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{err}");
    assert!(stdout.contains("seed 3 (replay with --seed 3)"), "{stdout}");
    for story in ["1. avalanche", "2. stampede", "3. outage", "4. clear"] {
        assert!(stdout.contains(story), "{story}: {stdout}");
    }
    assert_eq!(stdout.matches("db peak/s  queries").count(), 4, "{stdout}");
    for chart in ["avalanche", "stampede", "outage", "clear"] {
        for ext in ["png", "svg"] {
            let path = out.join(format!("{chart}.{ext}"));
            assert!(path.is_file(), "{} missing: {stdout}", path.display());
            assert!(stdout.contains(&path.display().to_string()), "{stdout}");
        }
    }
    // Every series on a log scale; the outage also shows what the requests
    // met, per second.
    let outage = std::fs::read_to_string(out.join("outage.svg")).unwrap();
    for text in [
        "database queries per second (log scale)",
        "requests per second: errors, stale values (log scale)",
        "naive: errors (peak",
        "breakwater: errors (peak 0/s)",
        "breakwater: stale values (peak",
    ] {
        assert!(outage.contains(text), "{text} not in outage.svg");
    }
    // The seed's figures, measured on the virtual clock.
    assert!(
        stdout.contains(
            "naive (no jitter): 100,000 keys expire all at 300.0 s; busiest second 100,000"
        ),
        "{stdout}"
    );
    let count = |s: &str| s.replace(',', "").parse::<usize>().unwrap();
    let row = |story: &str, name: &str| -> Vec<String> {
        let section = stdout.split(story).nth(1).unwrap();
        let line = section
            .lines()
            .find(|l| l.starts_with(&format!("{name:<18} ")))
            .unwrap_or_else(|| panic!("no {name} row in {story}: {stdout}"));
        line[18..].split_whitespace().map(str::to_owned).collect()
    };
    // db peak/s, queries, p50, p99, errors, stale, waited
    assert_eq!(row("1. avalanche", "naive")[0], "100,000");
    // breakwater's busiest second: within 1.2 × 100,000 / 120 s.
    let peak = count(&row("1. avalanche", "breakwater")[0]);
    assert!(peak <= 1_000, "{stdout}");
    assert_eq!(row("2. stampede", "breakwater")[0], "1");
    // A refresh: naive queries once per request arriving while the 200 ms
    // query runs (2,000/s × 0.2 s), breakwater once.
    let per_refresh = |name: &str| -> f64 {
        let note = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name}: ")) && l.contains("queries each"))
            .unwrap_or_else(|| panic!("no {name} refresh note: {stdout}"));
        let figure = note.split(" refreshes, ").nth(1).unwrap();
        figure.split(' ').next().unwrap().parse().unwrap()
    };
    assert!(per_refresh("naive") >= 300.0, "{stdout}");
    assert_eq!(per_refresh("breakwater"), 1.0, "{stdout}");
    assert_eq!(row("2. stampede", "breakwater + grace")[6], "0");
    assert_eq!(row("3. outage", "breakwater")[4], "0");
    assert_ne!(row("3. outage", "naive")[4], "0");
    assert!(stdout.contains("breaker: opened at"), "{stdout}");
    // The clear: no error either way; the hard clear serves nothing from
    // before once it returned, and the soft one over the TTL keeps the
    // database's busiest second within 1.5 × its steady rate.
    assert_eq!(row("4. clear", "hard")[4], "0");
    assert_eq!(row("4. clear", "soft, window TTL")[4], "0");
    let note = |name: &str| -> &str {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name}: steady ")))
            .unwrap_or_else(|| panic!("no {name} clear note: {stdout}"))
    };
    assert!(
        note("hard").contains(" 0 answers from before the clear once it had returned"),
        "{stdout}"
    );
    let ratio = |name: &str| -> f64 {
        let after = note(name).split(" s, ").nth(1).unwrap();
        after.split(' ').next().unwrap().parse().unwrap()
    };
    assert!(ratio("hard") > 2.0, "{stdout}");
    assert!(ratio("soft, window TTL") <= 1.5, "{stdout}");
    // Every entry from before the soft clear was refreshed within its
    // window (ending at 180 s) and grace (10 s).
    let last = note("soft, window TTL")
        .rsplit("the last at ")
        .next()
        .unwrap();
    let last: u64 = last.trim_end_matches(" s").parse().unwrap();
    assert!(last < 190, "{stdout}");
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn simulate_warns_when_the_window_is_shorter_than_the_ttl() {
    let out = temp_dir("simulate-short");
    let out_arg = out.to_str().unwrap();
    let args = [
        "simulate", "--keys", "50", "--rps", "20", "--ttl", "10m", "--out", out_arg,
    ];
    let (code, stdout, err) = breakwater(&[&args[..], &["--duration", "2m"]].concat());
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{err}");
    assert!(
        err.contains("warning: --duration 2m does not reach past the bulk write's expiries"),
        "{err}"
    );
    // Past the TTL but inside the jitter's reach (±20 %: up to 12 min).
    let (code, _, err) = breakwater(&[&args[..], &["--duration", "11m"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("up to 12m"), "{err}");
    let (code, _, err) = breakwater(&[&args[..], &["--duration", "13m"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn simulate_draws_every_sparkline_on_one_scale() {
    let out = temp_dir("simulate-scale");
    let (code, stdout, err) = breakwater(&[
        "simulate",
        "--keys",
        "2000",
        "--rps",
        "400",
        "--ttl",
        "1m",
        "--duration",
        "3m",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{err}");
    let spark = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name) && l.contains('▁'))
            .unwrap_or_else(|| panic!("no {name} sparkline: {stdout}"))
            .to_owned()
    };
    // naive's avalanche peak is the top of the one scale; breakwater's
    // smaller peak stays below it instead of being stretched to it.
    assert!(spark("naive ").contains('█'), "{stdout}");
    assert!(!spark("breakwater ").contains('█'), "{stdout}");
    assert!(out.join("simulate.png").is_file());
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn simulate_json_has_every_strategy_and_the_seed() {
    let out = temp_dir("simulate-json");
    let (code, stdout, err) = breakwater(&[
        "simulate",
        "--keys",
        "100",
        "--rps",
        "50",
        "--ttl",
        "30s",
        "--duration",
        "1m",
        "--jitter",
        "down:0.2",
        "--strategies",
        "breakwater",
        "--json",
        "--seed",
        "9",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{err}");
    assert!(stdout.trim_start().starts_with('{'), "{stdout}");
    assert!(stdout.contains("\"seed\": 9"), "{stdout}");
    assert!(stdout.contains("\"strategy\": \"breakwater\""), "{stdout}");
    assert!(!stdout.contains("\"strategy\": \"naive\""), "{stdout}");
    let (code, _, err) = breakwater(&["simulate", "--jitter", "ratio:1.5"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("jitter ratio must be in 0..=1, got 1.5"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(out);
}

/// `bench many` on `urls`: 4 processes, overlapping sets of 1,000 ids.
fn bench_many(urls: &str) -> String {
    let (code, out, err) = breakwater_within(
        &[
            "bench",
            "many",
            "--redis",
            urls,
            "--processes",
            "4",
            "--ids",
            "1000",
            "--runs",
            "2",
        ],
        Duration::from_secs(120),
    );
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("every id loaded exactly once across the fleet: yes"),
        "{out}"
    );
    // Each run: 1,750 ids, each loaded once, none twice, none missed.
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with(['1', '2']))
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for row in rows {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cells[1..5], ["1750", "1750", "0", "0"], "{out}");
        assert_eq!(cells[6], "0", "errors: {out}");
    }
    out
}

#[test]
fn bench_many_loads_every_id_once_across_four_processes() {
    let server = RedisServer::start();
    bench_many(&server.url());
    assert!(all_keys(&server).is_empty(), "{:?}", all_keys(&server));
}

#[test]
fn bench_many_loads_every_id_once_across_four_processes_on_a_cluster() {
    let cluster = RedisCluster::start();
    bench_many(&cluster.urls().join(","));
    for node in cluster.nodes() {
        assert_eq!(node.command(&["DBSIZE"]).unwrap(), "0");
    }
}
