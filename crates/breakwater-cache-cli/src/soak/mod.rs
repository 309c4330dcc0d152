//! `breakwater soak`: a fleet of worker processes on one Redis for a
//! duration, reading, writing and announcing writes (invalidations,
//! expires, tags, clears) while a nemesis kills, stalls, empties, evicts,
//! deletes keys and cuts pub/sub connections, and a checker judges every
//! read against every acknowledged announcement (see [`check`] for what
//! a violation is).
//!
//! # The parts
//!
//! - **The database** ([`db`]): rows served by this process on loopback
//!   TCP; a row's value is the number of its last write, so a read says
//!   which write it comes from. The nemesis takes it down now and then.
//! - **The workers** ([`worker`]): `soak-worker` processes (the hidden
//!   subcommand), half of them with an L1 near cache, each reporting its
//!   reads and acknowledgements as lines on stdout.
//! - **The nemesis**: one action at a time, every 0.5–3 s, chosen by the
//!   seed: `kill` (SIGKILL a worker, start another), `stall` (SIGSTOP the
//!   Redis process for up to 3 s; `CLIENT PAUSE` on a Redis given by URL),
//!   `restart` (SIGKILL Redis and start it again empty; on a Redis given
//!   by URL, `FLUSHALL` and every connection killed, which is what clients
//!   see of an empty restart), `evict` (`maxmemory` just above what is used,
//!   `allkeys-lru`, and 1 KB filler writes), `delete` (`DEL` of keys of
//!   one kind of the namespace: values, leases, the lease index, tag
//!   counters, the clear record), `pubsub` (`CLIENT KILL TYPE pubsub`),
//!   `db-down` (the database fails every request for up to 3 s).
//!
//! # The seed
//!
//! One seed chooses the nemesis's schedule and every worker's calls; a
//! violation prints it. Run again with `--seed`, the soak replays the same
//! schedule of actions and calls; the interleaving of real processes is
//! the operating system's, so a violation may need a few runs to recur.

pub(crate) mod check;
pub(crate) mod db;
pub(crate) mod worker;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::check::{Checker, Mode, Read};
use self::db::Rows;
use self::worker::now_us;
use crate::args;
use crate::failure::{Failure, bad_url, finish, shown};
use crate::{out, outln};

/// Options of `breakwater soak`.
#[derive(Debug, Clone, Args)]
pub(crate) struct SoakOpts {
    /// The Redis to soak, which the nemesis flushes, pauses, reconfigures
    /// and cuts connections of (needs `--disposable`). Without it, the soak
    /// starts a private `redis-server` (from PATH or
    /// `BREAKWATER_REDIS_SERVER`) on a free port and can also SIGSTOP,
    /// SIGKILL and restart it.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: Option<String>,
    /// Say that the Redis given by `--redis` may be flushed, paused and
    /// reconfigured (never use a Redis that holds anything of value).
    #[arg(long)]
    pub(crate) disposable: bool,
    /// How long to run, e.g. `90s`, `30m` (1 s to 24 h).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = duration)]
    pub(crate) duration: Duration,
    /// Worker processes (1 to 64); half of them keep an L1.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = args::processes())]
    pub(crate) processes: usize,
    /// Most calls in flight at once, per process (1 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = args::concurrency())]
    pub(crate) concurrency: usize,
    /// Rows in the database (10 to 100,000).
    #[arg(long, value_name = "N", default_value_t = 400,
          value_parser = clap::builder::RangedU64ValueParser::<u32>::new().range(10..=100_000))]
    pub(crate) rows: u32,
    /// The seed of the nemesis and the workers (default: from the clock,
    /// printed).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Nemesis actions, comma-separated (default: all of them).
    #[arg(long, value_name = "ACTIONS", value_delimiter = ',')]
    pub(crate) nemesis: Option<Vec<Action>>,
}

/// What the nemesis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Action {
    /// SIGKILL a worker; another takes its place.
    Kill,
    /// Redis answers nothing for up to 3 s.
    Stall,
    /// Redis restarts empty.
    Restart,
    /// Redis evicts under `maxmemory` with `allkeys-lru`.
    Evict,
    /// `DEL` of the namespace's keys of one kind.
    Delete,
    /// Every pub/sub connection killed.
    Pubsub,
    /// The database fails every request for up to 3 s.
    DbDown,
}

impl Action {
    /// Its name on the command line and in the summary.
    fn name(self) -> &'static str {
        match self {
            Action::Kill => "kill",
            Action::Stall => "stall",
            Action::Restart => "restart",
            Action::Evict => "evict",
            Action::Delete => "delete",
            Action::Pubsub => "pubsub",
            Action::DbDown => "db-down",
        }
    }
}

const ALL_ACTIONS: [Action; 7] = [
    Action::Kill,
    Action::Stall,
    Action::Restart,
    Action::Evict,
    Action::Delete,
    Action::Pubsub,
    Action::DbDown,
];

/// Groups of rows, one tag each.
const GROUPS: u32 = 16;
/// How long a read waits before it is judged: every acknowledgement that
/// precedes it has been reported by then.
const SETTLE: Duration = Duration::from_secs(3);

fn duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(24 * 3600) {
        return Err("must be between 1s and 24h".to_owned());
    }
    Ok(d)
}

/// Runs `breakwater soak`; exit code 1 on a violation.
pub(crate) async fn main(opts: SoakOpts) -> ExitCode {
    finish("soak", soak(opts).await)
}

async fn soak(opts: SoakOpts) -> Result<(), Failure> {
    let seed = opts.seed.unwrap_or_else(|| now_us() % 1_000_000);
    let actions = opts.nemesis.clone().unwrap_or_else(|| ALL_ACTIONS.to_vec());
    let mut redis = match &opts.redis {
        Some(url) if !opts.disposable => {
            return Err(Failure::usage(format!(
                "the soak flushes, pauses and reconfigures the Redis at {}; pass --disposable if it may, or leave out --redis for a private one",
                shown(url)
            )));
        }
        Some(url) => {
            redis::Client::open(url.as_str()).map_err(|e| bad_url(url, e))?;
            Redis::Given(url.clone())
        }
        None => Redis::Private(Private::start().map_err(Failure::runtime)?),
    };
    let url = redis.url();
    let namespace = format!("soak-{}", std::process::id());
    let exe = std::env::current_exe().map_err(Failure::runtime)?;
    outln!(
        "soak: {} workers × {} callers, {} rows, {} on {}, seed {seed}",
        opts.processes,
        opts.concurrency,
        opts.rows,
        humantime::format_duration(opts.duration),
        shown(&url)
    );
    outln!(
        "nemesis: {}",
        actions
            .iter()
            .map(|a| a.name())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let allowance = worker::L1_TTL + Duration::from_secs(1);
    let checker = Arc::new(Mutex::new(Checker::new(
        opts.rows,
        GROUPS,
        allowance.as_micros() as u64,
        SETTLE.as_micros() as u64,
    )));
    let rows = Arc::new(Mutex::new(Rows::new(opts.rows, GROUPS)));
    let db_addr = db::serve(
        Arc::clone(&rows),
        Arc::clone(&checker),
        Duration::from_millis(2),
    )
    .await
    .map_err(Failure::runtime)?;

    let (events, mut inbox) = mpsc::unbounded_channel();
    let mut fleet = Workers {
        exe,
        url: url.clone(),
        db: db_addr,
        namespace: namespace.clone(),
        seed,
        opts: opts.clone(),
        events,
        running: Vec::new(),
        next: 0,
    };
    for _ in 0..opts.processes {
        fleet.start().map_err(Failure::runtime)?;
    }

    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let began = Instant::now();
    let end = began + opts.duration;
    let mut next_action = began + Duration::from_secs(2);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let bar = crate::progress::bar(opts.duration.as_secs(), "soak (seconds)");
    loop {
        tokio::select! {
            event = inbox.recv() => {
                let Some((worker, line)) = event else { break };
                tally.take(&checker, worker, &line);
            }
            _ = tick.tick() => {
                lock(&checker).judge(now_us());
                bar.set_position(began.elapsed().as_secs());
                if Instant::now() >= end {
                    break;
                }
                fleet.reap();
                if Instant::now() >= next_action && !actions.is_empty() {
                    let action = actions[rng.random_range(0..actions.len())];
                    let done = nemesis(action, &mut rng, &mut redis, &mut fleet, &rows, &namespace).await;
                    *tally.actions.entry(action.name().to_owned()).or_default() += 1;
                    if let Err(e) = done {
                        *tally.nemesis_errors.entry(e).or_default() += 1;
                    }
                    next_action = Instant::now() + Duration::from_millis(rng.random_range(500..3_000));
                }
            }
        }
    }
    bar.finish_and_clear();
    redis.resume();
    fleet.stop().await;
    // What the workers wrote before they exited.
    while let Ok((worker, line)) = inbox.try_recv() {
        tally.take(&checker, worker, &line);
    }
    clean_up(&url, &namespace).await;
    let mut checker = lock(&checker);
    checker.judge(u64::MAX);
    report(&tally, &checker, &rows, seed, allowance);
    if checker.checked() == 0 {
        return Err(Failure::runtime(
            "no read was checked: the workers did not run (see their errors above)",
        ));
    }
    if !checker.violations().is_empty() {
        return Err(Failure::runtime(format!(
            "{} violations; replay the schedule with --seed {seed}",
            checker.violations().len()
        )));
    }
    Ok(())
}

/// What the workers reported, counted.
#[derive(Debug, Default)]
struct Tally {
    served: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    acks: u64,
    unknown_acks: u64,
    garbled: u64,
    actions: BTreeMap<String, u64>,
    nemesis_errors: BTreeMap<String, u64>,
}

impl Tally {
    /// Takes one line of worker `worker`.
    fn take(&mut self, checker: &Mutex<Checker>, worker: u32, line: &str) {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["r", key, began, value, served] => {
                let (Ok(key), Ok(began_us)) = (key.parse(), began.parse()) else {
                    self.garbled += 1;
                    return;
                };
                let value = match *value {
                    "-" => None,
                    v => match v.parse() {
                        Ok(v) => Some(v),
                        Err(_) => {
                            self.garbled += 1;
                            return;
                        }
                    },
                };
                *self.served.entry((*served).to_owned()).or_default() += 1;
                lock(checker).read(Read {
                    worker,
                    key,
                    began_us,
                    value,
                    served: (*served).to_owned(),
                });
            }
            ["a", seq, at, mode] => {
                let (Ok(seq), Ok(at_us)) = (seq.parse(), at.parse()) else {
                    self.garbled += 1;
                    return;
                };
                let mode = if *mode == "s" { Mode::Soft } else { Mode::Hard };
                if lock(checker).acked(worker, seq, at_us, mode) {
                    self.acks += 1;
                } else {
                    self.unknown_acks += 1;
                }
            }
            ["e", what] => *self.errors.entry((*what).to_owned()).or_default() += 1,
            ["ready"] => {}
            _ => self.garbled += 1,
        }
    }
}

fn report(tally: &Tally, checker: &Checker, rows: &Mutex<Rows>, seed: u64, allowance: Duration) {
    let (writes, queries) = {
        let rows = lock(rows);
        (rows.writes, rows.queries)
    };
    let served: u64 = tally.served.values().sum();
    let errors: u64 = tally.errors.values().sum();
    outln!(
        "reads checked: {} ({} answered, {} errors); database: {} queries, {} writes; acknowledged announcements: {}",
        checker.checked(),
        served,
        errors,
        queries,
        writes,
        tally.acks
    );
    let list = |m: &BTreeMap<String, u64>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!("served: {}", list(&tally.served));
    if !tally.errors.is_empty() {
        outln!("errors: {}", list(&tally.errors));
    }
    outln!("nemesis: {}", list(&tally.actions));
    if !tally.nemesis_errors.is_empty() {
        outln!("nemesis steps that failed: {}", list(&tally.nemesis_errors));
    }
    if tally.garbled + tally.unknown_acks > 0 {
        outln!(
            "lines not understood: {}, acknowledgements of unknown writes: {}",
            tally.garbled,
            tally.unknown_acks
        );
    }
    let violations = checker.violations();
    for v in violations.iter().take(20) {
        outln!("violation: {v}");
    }
    if violations.len() > 20 {
        outln!("… and {} more", violations.len() - 20);
    }
    out!(
        "violations: {} (another process's reads held to an acknowledgement {} ms after it; seed {seed})\n",
        violations.len(),
        allowance.as_millis()
    );
}

/// The worker processes, restarted when the nemesis kills one.
struct Workers {
    exe: PathBuf,
    url: String,
    db: SocketAddr,
    namespace: String,
    seed: u64,
    opts: SoakOpts,
    events: mpsc::UnboundedSender<(u32, String)>,
    running: Vec<(u32, Child)>,
    next: u32,
}

impl Workers {
    /// Starts the next worker (an incarnation number of its own).
    fn start(&mut self) -> std::io::Result<()> {
        let id = self.next;
        self.next += 1;
        let mut child = tied(&self.exe)
            .arg("soak-worker")
            .args(["--redis", &self.url])
            .args(["--db", &self.db.to_string()])
            .args(["--namespace", &self.namespace])
            .args(["--worker", &id.to_string()])
            .args([
                "--seed",
                &(self.seed.wrapping_add(u64::from(id) * 7919)).to_string(),
            ])
            .args(["--rows", &self.opts.rows.to_string()])
            .args(["--groups", &GROUPS.to_string()])
            .args(["--concurrency", &self.opts.concurrency.to_string()])
            .args(if id % 2 == 1 { &["--l1"][..] } else { &[][..] })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("a worker has no stdout"))?;
        let events = self.events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if events.send((id, line)).is_err() {
                    break;
                }
            }
        });
        self.running.push((id, child));
        Ok(())
    }

    /// Starts a worker in place of every one that exited on its own.
    fn reap(&mut self) {
        let before = self.running.len();
        self.running
            .retain_mut(|(_, child)| matches!(child.try_wait(), Ok(None)));
        for _ in self.running.len()..before {
            let _ = self.start();
        }
    }

    /// SIGKILLs one worker, chosen by `pick`, and starts another.
    fn kill(&mut self, pick: usize) -> Result<(), String> {
        if self.running.is_empty() {
            return Err("no worker".to_owned());
        }
        let (_, mut child) = self.running.remove(pick % self.running.len());
        let _ = child.kill();
        let _ = child.wait();
        self.start().map_err(|e| e.to_string())
    }

    /// Closes every worker's stdin (they stop), and kills any still
    /// running 5 s later.
    async fn stop(&mut self) {
        for (_, child) in &mut self.running {
            drop(child.stdin.take());
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline
            && self
                .running
                .iter_mut()
                .any(|(_, c)| matches!(c.try_wait(), Ok(None)))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for (_, child) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.running.clear();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, child) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The Redis under the soak.
enum Redis {
    /// Given by URL: disturbed through commands only.
    Given(String),
    /// Started by the soak: signals too.
    Private(Private),
}

impl Redis {
    fn url(&self) -> String {
        match self {
            Redis::Given(url) => url.clone(),
            Redis::Private(p) => p.url(),
        }
    }

    /// Lets a stalled private Redis go on (on every way out).
    fn resume(&mut self) {
        if let Redis::Private(p) = self {
            p.signal("CONT");
        }
    }
}

/// A `redis-server` the soak started: a free loopback port, no
/// persistence, killed when the soak ends.
struct Private {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Private {
    fn start() -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port for a private Redis: {e}"))?
            .port();
        let dir = std::env::temp_dir().join(format!("breakwater-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut private = Private {
            port,
            dir,
            child: None,
        };
        private.spawn()?;
        Ok(private)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let bin =
            std::env::var("BREAKWATER_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let child = tied(&bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("cannot start {bin} ({e}); install the Debian package redis-server, set BREAKWATER_REDIS_SERVER, or give --redis URL --disposable")
            })?;
        self.child = Some(child);
        // Ready when it accepts a connection.
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!("{bin} did not start on port {}", self.port))
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        self.signal("CONT");
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A command for `program` that gets SIGKILL when the soak dies, even
/// killed outright (no destructor runs then): util-linux's `setpriv
/// --pdeathsig KILL` where it is installed, `program` alone otherwise
/// (killed on drop only). Spawned from the main thread, which lives as
/// long as the process (the signal follows the spawning thread).
fn tied(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    match setpriv {
        Some(setpriv) => {
            let mut cmd = Command::new(setpriv);
            cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// A connection for the nemesis's commands, with short deadlines (a
/// stalled Redis must not stall the soak).
async fn connect(url: &str) -> Result<MultiplexedConnection, String> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(url)
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("connect: {e}"))
}

async fn run(
    conn: &mut MultiplexedConnection,
    cmd: &mut redis::Cmd,
) -> Result<redis::Value, String> {
    cmd.query_async(conn)
        .await
        .map_err(|e| format!("{:?}", e.kind()))
}

/// `CLIENT KILL TYPE <kind>`: every connection of that kind but this one.
async fn kill_clients(conn: &mut MultiplexedConnection, kind: &str) -> Result<(), String> {
    run(conn, redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg(kind))
        .await
        .map(drop)
}

/// One nemesis action.
async fn nemesis(
    action: Action,
    rng: &mut StdRng,
    redis: &mut Redis,
    fleet: &mut Workers,
    rows: &Mutex<Rows>,
    namespace: &str,
) -> Result<(), String> {
    let url = redis.url();
    match action {
        Action::Kill => fleet.kill(rng.random_range(0..64)),
        Action::DbDown => {
            let span = Duration::from_millis(rng.random_range(300..3_000));
            lock(rows).down(Instant::now() + span);
            Ok(())
        }
        Action::Stall => {
            let span = Duration::from_millis(rng.random_range(300..3_000));
            match redis {
                Redis::Private(p) => {
                    p.signal("STOP");
                    tokio::time::sleep(span).await;
                    p.signal("CONT");
                    Ok(())
                }
                Redis::Given(_) => {
                    let mut conn = connect(&url).await?;
                    run(
                        &mut conn,
                        redis::cmd("CLIENT")
                            .arg("PAUSE")
                            .arg(span.as_millis() as u64)
                            .arg("ALL"),
                    )
                    .await?;
                    Ok(())
                }
            }
        }
        Action::Restart => match redis {
            Redis::Private(p) => {
                p.kill();
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..1_000))).await;
                p.spawn()
            }
            Redis::Given(_) => {
                let mut conn = connect(&url).await?;
                run(&mut conn, &mut redis::cmd("FLUSHALL")).await?;
                kill_clients(&mut conn, "normal").await?;
                kill_clients(&mut conn, "pubsub").await?;
                Ok(())
            }
        },
        Action::Pubsub => {
            let mut conn = connect(&url).await?;
            kill_clients(&mut conn, "pubsub").await
        }
        Action::Delete => {
            let mut conn = connect(&url).await?;
            let keys = scan(&mut conn, &format!("bw:{namespace}:*")).await?;
            let kind = ["v", "l", "i", "t", "c"][rng.random_range(0..5)];
            let chosen: Vec<String> = keys
                .into_iter()
                .filter(|k| kind_of(k, namespace) == Some(kind))
                // Values: one in five; bookkeeping: every key of the kind.
                .filter(|_| kind != "v" || rng.random_range(0..5) == 0)
                .collect();
            for chunk in chosen.chunks(500) {
                run(&mut conn, redis::cmd("DEL").arg(chunk)).await?;
            }
            Ok(())
        }
        Action::Evict => {
            let mut conn = connect(&url).await?;
            let info = match run(&mut conn, redis::cmd("INFO").arg("memory")).await? {
                redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                redis::Value::VerbatimString { text, .. } => text,
                _ => String::new(),
            };
            let used: u64 = info
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse().ok())
                .ok_or("no used_memory in INFO")?;
            run(
                &mut conn,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("maxmemory-policy")
                    .arg("allkeys-lru"),
            )
            .await?;
            run(
                &mut conn,
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("maxmemory")
                    .arg(used + 256 * 1024),
            )
            .await?;
            let filler = vec![b'x'; 1024];
            let mut result = Ok(());
            for i in 0..2_000u32 {
                if let Err(e) = run(
                    &mut conn,
                    redis::cmd("SET")
                        .arg(format!("soak-filler:{i}"))
                        .arg(&filler[..]),
                )
                .await
                {
                    result = Err(e);
                    break;
                }
                if i % 200 == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            // The limit off again, and the filler gone.
            let off = run(
                &mut conn,
                redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0),
            )
            .await;
            let fill = scan(&mut conn, "soak-filler:*").await.unwrap_or_default();
            for chunk in fill.chunks(500) {
                let _ = run(&mut conn, redis::cmd("DEL").arg(chunk)).await;
            }
            result.and(off.map(drop))
        }
    }
}

/// The kind letter of a key of the namespace (`v`, `l`, `i`, `t`, `c`;
/// `PROTOCOL.md`'s key schema), if it is one.
fn kind_of<'a>(key: &'a str, namespace: &str) -> Option<&'a str> {
    let rest = key
        .strip_prefix("bw:")?
        .strip_prefix(namespace)?
        .strip_prefix(':')?;
    Some(rest.split(':').next().unwrap_or(rest))
}

async fn scan(conn: &mut MultiplexedConnection, pattern: &str) -> Result<Vec<String>, String> {
    let mut cursor: u64 = 0;
    let mut keys = Vec::new();
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| format!("{:?}", e.kind()))?;
        keys.extend(batch);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Deletes what the soak left in a Redis given by URL (a private one goes
/// with its process).
async fn clean_up(url: &str, namespace: &str) {
    let Ok(mut conn) = connect(url).await else {
        return;
    };
    let _ = run(
        &mut conn,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(0),
    )
    .await;
    for pattern in [format!("bw:{namespace}:*"), "soak-filler:*".to_owned()] {
        if let Ok(keys) = scan(&mut conn, &pattern).await {
            for chunk in keys.chunks(500) {
                let _ = run(&mut conn, redis::cmd("DEL").arg(chunk)).await;
            }
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_sorted_by_kind() {
        assert_eq!(kind_of("bw:soak-1:v:{7}", "soak-1"), Some("v"));
        assert_eq!(kind_of("bw:soak-1:c", "soak-1"), Some("c"));
        assert_eq!(kind_of("bw:soak-1:i:", "soak-1"), Some("i"));
        assert_eq!(kind_of("bw:soak-12:c", "soak-1"), None);
        assert_eq!(kind_of("soak-filler:1", "soak-1"), None);
    }
}
