//! `breakwater spread` against a private `redis-server`: an avalanche of
//! 100,000 keys written with one TTL is spread out in place, keys without a
//! TTL are not touched, no TTL gets longer, and `--dry-run` changes nothing.
//!
//! Expiries are read with `PEXPIRETIME` (Redis 7: the absolute expiry in
//! ms), so "no TTL got longer" is an exact comparison, not one of two
//! clocks.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use breakwater_cache_testkit::RedisServer;

/// Runs `breakwater` with `args`, failing the test if it has not exited
/// within 120 s; (exit code, stdout, stderr).
fn breakwater(args: &[&str]) -> (i32, String, String) {
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
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("breakwater {args:?} did not exit within 120 s");
        }
        thread::sleep(Duration::from_millis(20));
    };
    (
        status.code().unwrap_or(-1),
        out.join().unwrap(),
        err.join().unwrap(),
    )
}

async fn connect(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Writes `keys` with `SET key v [PX ttl_ms]`, 10,000 a pipeline.
async fn write(conn: &mut redis::aio::MultiplexedConnection, keys: &[String], ttl_ms: Option<u64>) {
    for chunk in keys.chunks(10_000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            let cmd = pipe.cmd("SET").arg(key).arg("v");
            if let Some(ttl) = ttl_ms {
                cmd.arg("PX").arg(ttl);
            }
            cmd.ignore();
        }
        pipe.query_async::<()>(conn).await.unwrap();
    }
}

/// `PEXPIRETIME` of every key (ms since the epoch; -1 without a TTL, -2
/// gone), 10,000 a pipeline.
async fn expire_times(conn: &mut redis::aio::MultiplexedConnection, keys: &[String]) -> Vec<i64> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(10_000) {
        let mut pipe = redis::pipe();
        for key in chunk {
            pipe.cmd("PEXPIRETIME").arg(key);
        }
        out.extend(pipe.query_async::<Vec<i64>>(conn).await.unwrap());
    }
    out
}

/// The most expiries in any window `[t, t + 1 s)`.
fn busiest_second(expiries_ms: &[i64]) -> usize {
    let mut sorted = expiries_ms.to_vec();
    sorted.sort_unstable();
    let (mut peak, mut start) = (0, 0);
    for (end, &t) in sorted.iter().enumerate() {
        while t - sorted[start] >= 1000 {
            start += 1;
        }
        peak = peak.max(end - start + 1);
    }
    peak
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test]
async fn spreads_an_avalanche_of_100_000_keys_and_touches_nothing_else() {
    const KEYS: usize = 100_000;
    const TTL_MS: u64 = 600_000;
    const JITTER: f64 = 0.2;
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let avalanche = names("av:", KEYS);
    let persistent = names("av:persist:", 100);
    let others = names("other:", 1_000);
    write(&mut conn, &avalanche, Some(TTL_MS)).await;
    write(&mut conn, &persistent, None).await;
    write(&mut conn, &others, Some(TTL_MS)).await;
    let before = expire_times(&mut conn, &avalanche).await;
    let others_before = expire_times(&mut conn, &others).await;
    // Written with one TTL: they expire within a second or two of each other.
    assert!(
        busiest_second(&before) > KEYS / 3,
        "{}",
        busiest_second(&before)
    );

    let url = server.url();
    let (code, out, err) = breakwater(&[
        "spread", "--redis", &url, "--match", "av:*", "--jitter", "0.2", "--rate", "1000000",
        "--batch", "2000", "--seed", "7",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("scanned 100,100 keys: 100,000 with a TTL, 100 without (left alone)"),
        "{out}"
    );
    assert!(out.contains("changed 1"), "{out}");

    let after = expire_times(&mut conn, &avalanche).await;
    let mut shortened = 0;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(*a > 0, "{} lost its TTL or vanished: {a}", avalanche[i]);
        assert!(a <= b, "{}'s TTL got longer: {b} -> {a}", avalanche[i]);
        // Never shorter than ttl·(1 − jitter) (plus the time the run took).
        assert!(
            (*b - *a) as f64 <= TTL_MS as f64 * JITTER + 1.0,
            "{}: {b} -> {a}",
            avalanche[i]
        );
        shortened += usize::from(a < b);
    }
    assert!(shortened > KEYS * 99 / 100, "{shortened}");
    let ideal = KEYS as f64 / (TTL_MS as f64 / 1000.0 * JITTER);
    let busiest = busiest_second(&after);
    assert!(
        busiest as f64 <= 1.2 * ideal,
        "busiest second {busiest} > 1.2 × {ideal:.0}\n{out}"
    );
    assert!(
        expire_times(&mut conn, &persistent)
            .await
            .iter()
            .all(|&t| t == -1),
        "a key without a TTL got one"
    );
    assert_eq!(
        expire_times(&mut conn, &others).await,
        others_before,
        "a key outside the pattern changed"
    );
}

#[tokio::test]
async fn a_dry_run_changes_nothing() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let keys = names("dry:", 5_000);
    write(&mut conn, &keys, Some(600_000)).await;
    let persistent = names("dry:persist:", 10);
    write(&mut conn, &persistent, None).await;
    let before = expire_times(&mut conn, &keys).await;

    let url = server.url();
    let (code, out, err) = breakwater(&[
        "spread",
        "--redis",
        &url,
        "--match",
        "dry:*",
        "--jitter",
        "0.5",
        "--rate",
        "1000000",
        "--dry-run",
        "--seed",
        "1",
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("dry run: nothing was changed"), "{out}");
    assert!(out.contains("after (drawn)"), "{out}");
    assert_eq!(expire_times(&mut conn, &keys).await, before);
    assert!(
        expire_times(&mut conn, &persistent)
            .await
            .iter()
            .all(|&t| t == -1)
    );
}

#[tokio::test]
async fn bad_options_are_usage_errors_and_an_unreachable_redis_a_failure() {
    let server = RedisServer::start();
    let url = server.url();
    for (args, says) in [
        (&["--jitter", "0"][..], "--jitter"),
        (&["--jitter", "1"], "--jitter"),
        (&["--jitter", "-0.2"], "--jitter"),
        (&["--jitter", "0.2", "--rate", "0"], "--rate"),
        (&["--jitter", "0.2", "--batch", "0"], "--batch"),
    ] {
        let mut all = vec!["spread", "--redis", &url, "--match", "k:*"];
        all.extend_from_slice(args);
        let (code, out, err) = breakwater(&all);
        assert_eq!(code, 2, "{all:?}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(err.contains(says), "{all:?}: {err}");
    }
    let cluster_list = format!("{url},{url}");
    let (code, _, err) = breakwater(&[
        "spread",
        "--redis",
        &cluster_list,
        "--match",
        "k:*",
        "--jitter",
        "0.2",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("once per primary"), "{err}");

    let mut gone = RedisServer::start();
    let gone_url = gone.url();
    gone.kill();
    let (code, out, err) = breakwater(&[
        "spread", "--redis", &gone_url, "--match", "k:*", "--jitter", "0.2",
    ]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("check --redis"), "{err}");
}
