//! Multi-process stampede tests: real `breakwater stampede-worker` OS
//! processes against a private `redis-server`, checking that the whole fleet
//! runs exactly one load per key (and exactly one takeover when the leader
//! is killed).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use breakwater_cache_testkit::RedisServer;

/// How long a worker may take to print `ready` or to exit.
const WORKER_TIMEOUT: Duration = Duration::from_secs(60);

/// One spawned worker process.
struct Worker {
    /// The process.
    child: Child,
    /// Its stdin, for the go line.
    stdin: Option<ChildStdin>,
    /// Its stdout, line by line, read by a helper thread so every wait is
    /// bounded.
    lines: Receiver<String>,
    /// A label for failure messages.
    name: String,
}

impl Worker {
    /// Spawns `breakwater stampede-worker --redis <url>` with `args` appended.
    fn spawn(name: &str, redis: &RedisServer, args: &[&str]) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_breakwater"))
            .arg("stampede-worker")
            .args(["--redis", &redis.url()])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the breakwater binary");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            child,
            stdin,
            lines,
            name: name.to_owned(),
        }
    }

    /// The next line of stdout, waiting at most [`WORKER_TIMEOUT`].
    fn read_line(&mut self) -> String {
        match self.lines.recv_timeout(WORKER_TIMEOUT) {
            Ok(line) => line.trim_end().to_owned(),
            Err(e) => panic!(
                "{}: no stdout line within {WORKER_TIMEOUT:?}: {e}",
                self.name
            ),
        }
    }

    /// Waits for the `ready` line.
    fn wait_ready(&mut self) {
        let line = self.read_line();
        assert_eq!(line, "ready", "{}: expected ready", self.name);
    }

    /// Releases the worker.
    fn go(&mut self) {
        let mut stdin = self.stdin.take().expect("go sent once");
        stdin
            .write_all(b"go\n")
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("{}: write go: {e}", self.name));
    }

    /// Reads the `done` line and waits (bounded) for a successful exit.
    /// Returns the `done` line.
    fn finish(mut self) -> String {
        let done = self.read_line();
        let deadline = Instant::now() + WORKER_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{}: did not exit within {WORKER_TIMEOUT:?}", self.name);
            }
            thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "{}: exited with {status}, last line {done:?}",
            self.name
        );
        done
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // A failed test must not leave processes behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The `GET` of `key`, as text (`"(nil)"` if missing).
fn get(redis: &RedisServer, key: &str) -> String {
    redis.command(&["GET", key]).expect("GET from redis")
}

/// Runs `workers` processes of `concurrency` calls each with a loader of
/// `loader_ms`, released together, and checks every call succeeded and the
/// fleet loaded once.
fn one_load_across_processes(workers: usize, concurrency: usize, loader_ms: u64) {
    let redis = RedisServer::start();
    let concurrency_arg = concurrency.to_string();
    let loader_arg = format!("{loader_ms}ms");
    let mut spawned: Vec<Worker> = (0..workers)
        .map(|i| {
            Worker::spawn(
                &format!("worker {i}"),
                &redis,
                &[
                    "--concurrency",
                    &concurrency_arg,
                    "--loader-latency",
                    &loader_arg,
                ],
            )
        })
        .collect();
    for worker in &mut spawned {
        worker.wait_ready();
    }
    for worker in &mut spawned {
        worker.go();
    }
    let expected = format!("done ok={concurrency} err=0 first_error=none");
    for worker in spawned {
        let done = worker.finish();
        assert_eq!(done, expected);
    }
    assert_eq!(
        get(&redis, "loads"),
        "1",
        "loads across {workers} processes"
    );
}

#[test]
fn four_processes_one_load_at_50ms() {
    one_load_across_processes(4, 250, 50);
}

#[test]
fn four_processes_one_load_at_500ms() {
    one_load_across_processes(4, 250, 500);
}

#[test]
fn killed_leader_is_taken_over_after_the_lease_ttl() {
    let redis = RedisServer::start();
    let mut leader = Worker::spawn(
        "leader A",
        &redis,
        &[
            "--concurrency",
            "1",
            "--loader-latency",
            "1m",
            "--lease-ttl",
            "1s",
        ],
    );
    leader.wait_ready();
    leader.go();
    let deadline = Instant::now() + WORKER_TIMEOUT;
    while get(&redis, "loads") != "1" {
        assert!(Instant::now() < deadline, "leader A never started loading");
        thread::sleep(Duration::from_millis(10));
    }

    let followers = ["B", "C"].map(|name| {
        Worker::spawn(
            &format!("follower {name}"),
            &redis,
            &[
                "--concurrency",
                "50",
                "--loader-latency",
                "50ms",
                "--lease-ttl",
                "1s",
                "--lock-wait",
                "10s",
            ],
        )
    });
    let mut followers = followers;
    for worker in &mut followers {
        worker.wait_ready();
    }
    for worker in &mut followers {
        worker.go();
    }
    leader.child.kill().expect("SIGKILL leader A");
    leader.child.wait().expect("reap leader A");

    for worker in followers {
        let done = worker.finish();
        assert_eq!(done, "done ok=50 err=0 first_error=none");
    }
    assert_eq!(
        get(&redis, "loads"),
        "2",
        "A's load plus exactly one takeover"
    );
}

/// Four processes × 250 callers with the library's default lease settings
/// and a 500 ms loader; the process running the load is SIGKILLed mid-load.
/// Every survivor gets the value, the fleet makes exactly one more load, and
/// the survivors finish within the lease's expiry plus the loader's time.
#[test]
fn a_killed_holder_costs_exactly_one_more_load_with_defaults() {
    let redis = RedisServer::start();
    let mut workers: Vec<Worker> = (0..4)
        .map(|i| {
            Worker::spawn(
                &format!("worker {i}"),
                &redis,
                &["--concurrency", "250", "--loader-latency", "500ms"],
            )
        })
        .collect();
    for worker in &mut workers {
        worker.wait_ready();
    }
    for worker in &mut workers {
        worker.go();
    }
    let deadline = Instant::now() + WORKER_TIMEOUT;
    while get(&redis, "loads") != "1" {
        assert!(Instant::now() < deadline, "nobody started loading");
        thread::sleep(Duration::from_millis(5));
    }
    let pid: u32 = get(&redis, "loads:pid").parse().expect("the loader's pid");
    let holder = workers
        .iter()
        .position(|w| w.child.id() == pid)
        .expect("the loading process is one of ours");
    let mut holder = workers.swap_remove(holder);
    holder.child.kill().expect("SIGKILL the holder");
    let killed = Instant::now();
    // The dead holder's lease runs out this much later (it was extended
    // every second until the kill).
    let left: u64 = redis
        .command(&["PTTL", "bw:stampede:l:{hot}"])
        .expect("PTTL")
        .parse()
        .expect("the lease is held");
    let expiry = Duration::from_millis(left);
    holder.child.wait().expect("reap the holder");

    let (tx, done) = mpsc::channel();
    for worker in workers {
        let tx = tx.clone();
        thread::spawn(move || {
            let line = worker.finish();
            let _ = tx.send((line, killed.elapsed()));
        });
    }
    drop(tx);
    let finished: Vec<(String, Duration)> = done.iter().collect();
    assert_eq!(finished.len(), 3, "every survivor finished");
    for (line, _) in &finished {
        assert_eq!(line, "done ok=250 err=0 first_error=none");
    }
    assert_eq!(
        get(&redis, "loads"),
        "2",
        "the holder's load plus exactly one takeover"
    );
    let slowest = finished.iter().map(|(_, d)| *d).max().unwrap();
    eprintln!("lease expired {expiry:?} and survivors were done {slowest:?} after the kill");
    assert!(
        slowest <= expiry + Duration::from_millis(500 + 100),
        "survivors done {slowest:?} after the kill; the lease expired after {expiry:?}"
    );
}

/// With default settings a loader slower than the old 5 s lock wait (8 s)
/// is awaited by every other process: one load, no errors.
#[test]
fn four_processes_one_load_with_an_8s_loader_and_defaults() {
    one_load_across_processes(4, 250, 8_000);
}

/// Another OS process (a worker) is 100 ms into a 500 ms load when this
/// process invalidates the key: calls here that start after `invalidate`
/// returned get values loaded after it, and the worker's older result is
/// never written (its fence was revoked), with L1 on and off.
#[test]
fn invalidate_during_a_load_in_another_os_process() {
    for l1 in [false, true] {
        let redis = RedisServer::start();
        let mut worker = Worker::spawn(
            "worker A",
            &redis,
            &["--concurrency", "1", "--loader-latency", "500ms"],
        );
        worker.wait_ready();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = breakwater_cache::RedisStore::connect(&redis.url()).unwrap();
            let mut builder = breakwater_cache::Cache::<String>::builder()
                .namespace("stampede")
                .store(store);
            if l1 {
                builder = builder.l1(breakwater_cache::L1Config::new());
            }
            let cache = builder.build().unwrap();
            let fresh = || async { Ok::<_, std::io::Error>(Some("fresh".to_owned())) };
            worker.go();
            let deadline = Instant::now() + WORKER_TIMEOUT;
            while get(&redis, "loads") != "1" {
                assert!(Instant::now() < deadline, "worker A never started loading");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            cache.invalidate("hot").await.unwrap();
            let after = cache.get_or_load("hot", fresh).await.unwrap();
            assert_eq!(after.as_deref(), Some("fresh"), "l1={l1}");
            // Worker A finishes its load after the invalidation...
            let done = tokio::task::spawn_blocking(move || worker.finish())
                .await
                .unwrap();
            assert_eq!(done, "done ok=1 err=0 first_error=none");
            // ...and its result was refused by the fence.
            for _ in 0..3 {
                let v = cache.get_or_load("hot", fresh).await.unwrap();
                assert_eq!(v.as_deref(), Some("fresh"), "l1={l1}");
            }
            let other = breakwater_cache::Cache::<String>::builder()
                .namespace("stampede")
                .store(breakwater_cache::RedisStore::connect(&redis.url()).unwrap())
                .build()
                .unwrap();
            assert_eq!(other.get("hot").await.unwrap().as_deref(), Some("fresh"));
        });
    }
}
