//! Where the store's commands go ([`Topology`]) and the state its handles
//! share ([`RedisCore`]): the live connection, made and made again by one
//! background task (with backoff, and the first connection waited for),
//! probed when a command times out, and the background tasks (clock
//! refresh, Sentinel watcher, subscriptions) kept running on a runtime
//! that runs (see `crate::background`). Commands themselves, under their
//! deadlines, are `command`'s.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use rand::rngs::StdRng;
use redis::AsyncConnectionConfig;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::bus::{ChannelFeed, Feed};
use super::clock::RedisClock;
use super::config::RedisStoreConfig;
use super::conn::{Conn, store_error};
use super::latency::{DeadlineKind, Latencies};
use super::sentinel::{self, Sentinel};
use super::slots::{SLOTS, SlotMap};
use super::tls;
use super::writes::Writes;
use crate::background::{Duty, Supervised};
use crate::error::{ConfigError, Error, ErrorKind};
use crate::jitter::Backoff;

/// Where the store's commands go.
// One per store: a client's size (larger with TLS settings) costs nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Topology {
    /// One server.
    Node(redis::Client),
    /// A Redis Cluster: commands are routed by key slot; pub/sub uses one
    /// node at a time (a `PUBLISH` reaches every node's subscribers).
    Cluster {
        client: Box<ClusterClient>,
        nodes: Vec<redis::Client>,
    },
    /// The master that Redis Sentinel names, found again after a failover.
    Sentinel(Arc<Sentinel>),
}

impl Topology {
    /// The one server at `url`.
    pub(super) fn node(url: &str, config: &RedisStoreConfig) -> Result<Topology, Error> {
        Ok(Topology::Node(tls::node_client(url, &config.tls)?))
    }

    /// The Redis Cluster that `nodes` (its nodes' URLs) belong to: all
    /// `rediss://` or all `redis://`, at least one.
    pub(super) fn cluster<I, S>(nodes: I, config: &RedisStoreConfig) -> Result<Topology, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes = nodes
            .into_iter()
            .map(|url| tls::node_client(url.as_ref(), &config.tls))
            .collect::<Result<Vec<_>, _>>()?;
        if nodes.is_empty() {
            return Err(ConfigError::new("a redis cluster needs at least one node url").into());
        }
        let tls_nodes = nodes
            .iter()
            .filter(|n| {
                matches!(
                    n.get_connection_info().addr(),
                    redis::ConnectionAddr::TcpTls { .. }
                )
            })
            .count();
        if tls_nodes != 0 && tls_nodes != nodes.len() {
            return Err(ConfigError::new(
                "a redis cluster's node urls must all be rediss:// (TLS) or all redis://",
            )
            .into());
        }
        let first = nodes[0].get_connection_info();
        let builder =
            // Connecting waits for every seed node and then for the nodes of
            // the slot map, each attempt bounded by this: a silent node must
            // not use up the whole `connect_timeout`.
            ClusterClientBuilder::new(nodes.iter().map(|n| n.get_connection_info().clone()))
                .connection_timeout(config.connect_timeout / 3)
                .response_timeout(config.longest_reply())
                .tcp_settings(first.tcp_settings().clone())
                .retries(2);
        let client = config.tls.cluster(builder).build().map_err(|e| {
            // redis-rs's reason as text, without any node's password.
            let reason = nodes.iter().fold(e.to_string(), |reason, node| {
                match node.get_connection_info().redis_settings().password() {
                    Some(password) if !password.is_empty() => reason.replace(password, "***"),
                    _ => reason,
                }
            });
            Error::new(
                ErrorKind::Config,
                format!("invalid redis cluster node list: {reason}"),
            )
        })?;
        Ok(Topology::Cluster {
            client: Box::new(client),
            nodes,
        })
    }

    /// The master that the sentinels at `sentinels` name `master`.
    pub(super) fn sentinel_master<I, S>(
        sentinels: I,
        master: &str,
        config: &RedisStoreConfig,
    ) -> Result<Topology, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let sentinel = Sentinel::new(sentinels, master, config)?;
        Ok(Topology::Sentinel(Arc::new(sentinel)))
    }

    /// Its failure domains: one for a single server (or the sentinels'
    /// master); for a cluster, one per [`SLOTS_PER_DOMAIN`] hash slots.
    pub(super) fn failure_domains(&self) -> usize {
        match self {
            Topology::Node(_) | Topology::Sentinel(_) => 1,
            Topology::Cluster { .. } => usize::from(SLOTS / SLOTS_PER_DOMAIN),
        }
    }

    /// The servers named by the user: the one server, or the cluster's seed
    /// nodes (which the subscription tries in turn).
    pub(super) fn nodes(&self) -> &[redis::Client] {
        match self {
            Topology::Node(client) => std::slice::from_ref(client),
            Topology::Cluster { nodes, .. } => nodes,
            // The master is whichever server the sentinels name.
            Topology::Sentinel(_) => &[],
        }
    }

    /// The Sentinel state, for a store on a Sentinel-managed master.
    pub(super) fn sentinel(&self) -> Option<&Arc<Sentinel>> {
        match self {
            Topology::Sentinel(sentinel) => Some(sentinel),
            Topology::Node(_) | Topology::Cluster { .. } => None,
        }
    }
}

/// Consecutive hash slots per failure domain.
const SLOTS_PER_DOMAIN: u16 = 256;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag
/// (the bytes between the first `{` and the next `}`, if not empty), else of
/// the whole key, modulo 16,384.
pub(super) fn hash_slot(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            Some(&rest[..close])
        })
        .filter(|tag| !tag.is_empty());
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % SLOTS
}

/// What a [`RedisStore`](crate::RedisStore)'s handles share: where its
/// commands go, its settings, its latency, its live connection and the
/// background tasks that keep it (and the clock and the bus) going.
pub(super) struct RedisCore {
    pub(super) target: Topology,
    pub(super) config: RedisStoreConfig,
    /// Round trips per failure domain, and the deadlines they call for.
    pub(super) latency: Latencies,
    /// The live connection, if any; dropped when broken or when it fails a
    /// probe after a timeout, and made again in the background.
    conn: RwLock<Option<Live>>,
    /// The runtime that made the live connection (by its generation),
    /// whose task drives it (redis-rs spawns the connection's driver
    /// there). Kept apart from it: a call clones the connection, and a
    /// runtime handle's clone is an atomic on a line every worker of a
    /// multi-thread runtime shares.
    conn_home: Mutex<Option<(u64, tokio::runtime::Handle)>>,
    /// The one task that (re)connects, if it runs (supervised: see
    /// `crate::background`).
    reconnector: Supervised,
    /// Where the (re)connection stands.
    reconnect: Mutex<Reconnect>,
    /// Counts finished connection attempts (made or failed), to wake the
    /// callers waiting on one.
    attempts: watch::Sender<u64>,
    /// Why the last connection attempt failed (cleared when one succeeds):
    /// the cause carried by the errors of calls that find no connection.
    last_failure: Mutex<Option<Error>>,
    generations: AtomicU64,
    /// A probe of the current connection runs (after a command timed out).
    prober: Supervised,
    /// The task that keeps the clock sample current.
    clock_refresh: Supervised,
    /// A background task was dropped with its runtime (or stranded on an
    /// idle one): the next command starts what is missing again, on its
    /// own runtime ([`revive`](RedisCore::revive)).
    pub(super) lost_tasks: Arc<AtomicBool>,
    /// Redis's clock, as sampled.
    pub(super) clock: RedisClock,
    /// One pub/sub connection per subscribed channel, fanned out locally.
    pub(super) channels: Mutex<HashMap<Vec<u8>, ChannelFeed>>,
    /// Background tasks (clock refresh, subscriptions), stopped on drop.
    tasks: Mutex<Vec<AbortHandle>>,
    /// On a cluster, which primary serves which slot (see `slots`).
    pub(super) slots: SlotMap,
    /// On a cluster, concurrent lone writes (see `writes`).
    pub(super) writes: Writes,
}

/// The state of the background (re)connection.
#[derive(Debug, Default)]
struct Reconnect {
    /// When the attempt in progress began, and when it ends at the
    /// latest; `None` while backing off.
    attempt: Option<Attempt>,
    /// A connection was made at least once.
    connected_once: bool,
}

/// A connection attempt in progress.
#[derive(Debug, Clone, Copy)]
struct Attempt {
    since: Instant,
    /// Its bound (see [`RedisCore::attempt_bound`]).
    until: Instant,
}

/// A connection and its generation, so a failure only drops the connection
/// it happened on.
#[derive(Clone)]
pub(super) struct Live {
    pub(super) generation: u64,
    pub(super) conn: Conn,
}

impl Drop for RedisCore {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        for task in tasks.drain(..) {
            task.abort();
        }
    }
}

impl RedisCore {
    /// A store's shared state on `target`, not connected yet.
    pub(super) fn new(target: Topology, config: RedisStoreConfig) -> RedisCore {
        let latency = Latencies::new(
            target.failure_domains(),
            config.response_timeout,
            config.write_timeout,
            config.max_response_timeout,
        );
        let lost_tasks = Arc::new(AtomicBool::new(false));
        RedisCore {
            target,
            config,
            latency,
            conn: RwLock::new(None),
            conn_home: Mutex::new(None),
            reconnector: Supervised::reporting_to(&lost_tasks),
            reconnect: Mutex::default(),
            attempts: watch::Sender::new(0),
            last_failure: Mutex::default(),
            generations: AtomicU64::new(0),
            prober: Supervised::reporting_to(&lost_tasks),
            clock_refresh: Supervised::reporting_to(&lost_tasks),
            clock: RedisClock::default(),
            channels: Mutex::default(),
            tasks: Mutex::default(),
            slots: SlotMap::default(),
            writes: Writes::default(),
            lost_tasks,
        }
    }

    /// The live connection, if any.
    pub(super) fn current(&self) -> Option<Live> {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The connection, or an error at once if none can be had by
    /// `deadline`; with it, whether it is the first one the store made
    /// and this call waited for it. No caller makes a connection or
    /// queues behind one: a single background task (re)connects, with
    /// jittered backoff between failed attempts (see [`run_reconnect`]).
    /// Before the first connection was ever made, a caller waits for the
    /// attempt in progress, as long as that attempt may take (see
    /// [`attempt_bound`](Self::attempt_bound)): a slow Redis is not an
    /// unreachable one. After, it waits only while the attempt is young
    /// (younger than one read deadline) and never past `deadline`; an
    /// attempt older than that is taken for hung, and during backoff
    /// calls fail at once. A `patient` caller (`warm_up`, the clock
    /// refresh) waits until `deadline` whatever the attempts do (and for
    /// the first attempt in progress as any caller does).
    pub(super) async fn conn(
        self: &Arc<Self>,
        deadline: Instant,
        patient: bool,
    ) -> Result<(Live, bool), Error> {
        let mut attempts = self.attempts.subscribe();
        let mut first = false;
        loop {
            if let Some(live) = self.current() {
                return Ok((live, first));
            }
            let (attempt, connected_once) = self.start_reconnect();
            let until = match attempt {
                // A little past its bound: the attempt's own outcome
                // (made, or why not) is what the caller gets.
                Some(attempt) if !connected_once => {
                    first = true;
                    let end = attempt.until + Duration::from_millis(5);
                    if patient { end.max(deadline) } else { end }
                }
                _ if patient => deadline,
                Some(attempt) => {
                    (attempt.since + self.latency.deadline(0, DeadlineKind::Read)).min(deadline)
                }
                // Backing off, or an attempt just ended (it may have made
                // the connection since it was looked for above).
                None => {
                    return self
                        .current()
                        .map(|live| (live, first))
                        .ok_or_else(|| self.reconnecting());
                }
            };
            if tokio::time::timeout_at(until, attempts.changed())
                .await
                .is_err()
            {
                return Err(self.reconnecting());
            }
        }
    }

    /// Starts the reconnecting task unless it runs; the attempt in
    /// progress (`None` while it backs off), and whether a connection was
    /// ever made.
    ///
    /// The task is supervised (see `crate::background`): one whose runtime
    /// went away, or that overstayed an attempt (its bound) or a backoff by
    /// `connect_timeout` (its runtime is idle), is replaced by one on the
    /// caller's runtime.
    fn start_reconnect(self: &Arc<Self>) -> (Option<Attempt>, bool) {
        let weak = Arc::downgrade(self);
        let started = self
            .reconnector
            .ensure(self.config.connect_timeout, |duty| {
                // Before the task can run (and end its first attempt).
                self.reconnect
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .attempt = Some(self.attempt(0));
                run_reconnect(weak, duty)
            });
        if let Some(task) = started {
            self.track(task);
        }
        let reconnect = self.reconnect.lock().unwrap_or_else(|p| p.into_inner());
        (reconnect.attempt, reconnect.connected_once)
    }

    /// An attempt that starts now, after `failures` failed ones.
    fn attempt(&self, failures: u32) -> Attempt {
        let since = Instant::now();
        Attempt {
            since,
            until: since + self.attempt_bound(failures),
        }
    }

    /// How long the connection attempt after `failures` failed ones may
    /// take in all: connecting and the handshake (the
    /// [handshake budget](Self::handshake_budget)), sampling the clock
    /// (each reply within the read deadline, and no new sample begun past
    /// `max_response_timeout`: at most twice that), and on a Sentinel
    /// store the lookup (twice the handshake budget: see
    /// `sentinel::lookup_time`) and what the former master may have lost
    /// (the handshake budget again).
    fn attempt_bound(&self, failures: u32) -> Duration {
        let handshake = self.handshake_budget(failures);
        let connect = match self.target {
            Topology::Sentinel(_) => sentinel::lookup_time(handshake) + handshake,
            _ => handshake * 2,
        };
        connect + self.latency.ceiling() * 2
    }

    /// How long the attempt after `failures` failed ones may take to
    /// connect and shake hands: `connect_timeout`, doubled per failed
    /// attempt, and at least the write deadline the latency seen so far
    /// calls for; at most `max_response_timeout` (or `connect_timeout`, if
    /// that is longer).
    fn handshake_budget(&self, failures: u32) -> Duration {
        self.config
            .connect_budget(failures)
            .max(self.latency.deadline(0, DeadlineKind::Write))
            .min(
                self.config
                    .max_response_timeout
                    .max(self.config.connect_timeout),
            )
    }

    /// The failure domain of `key` (see
    /// [`Store::failure_domain`](crate::store::Store::failure_domain)).
    #[inline]
    pub(super) fn domain(&self, key: &[u8]) -> usize {
        match self.target {
            Topology::Node(_) | Topology::Sentinel(_) => 0,
            Topology::Cluster { .. } => usize::from(hash_slot(key) / SLOTS_PER_DOMAIN),
        }
    }

    /// Starts again, on the caller's runtime, the background tasks that
    /// were lost (dropped with their runtime, or stranded on an idle one):
    /// the clock refresh and the Sentinel watcher once a connection was
    /// made, and every channel's subscription. Cheap when nothing was lost
    /// (one atomic load, on every command).
    #[inline]
    pub(super) fn revive(self: &Arc<Self>) {
        if self.lost_tasks.load(Ordering::Relaxed) {
            self.revive_lost();
        }
    }

    #[cold]
    fn revive_lost(self: &Arc<Self>) {
        if tokio::runtime::Handle::try_current().is_err()
            || !self.lost_tasks.swap(false, Ordering::AcqRel)
        {
            return;
        }
        let connected_once = self
            .reconnect
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .connected_once;
        if connected_once {
            self.keep_clock();
        }
        let channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        for (channel, feed) in channels.iter() {
            self.keep_subscribed(channel, feed);
        }
    }

    /// Makes sure the clock refresh (and, on a Sentinel store, the master
    /// watcher) runs.
    fn keep_clock(self: &Arc<Self>) {
        let grace = self.config.connect_timeout;
        let weak = Arc::downgrade(self);
        if let Some(task) = self
            .clock_refresh
            .ensure(grace, |duty| run_clock_refresh(weak, duty))
        {
            self.track(task);
        }
        if let Some(sentinel) = self.target.sentinel() {
            let weak = Arc::downgrade(self);
            if let Some(task) = sentinel
                .watcher
                .ensure(grace, |duty| run_master_watch(weak, duty))
            {
                self.track(task);
            }
        }
    }

    /// Makes sure a task keeps `channel` subscribed for `feed`.
    pub(super) fn keep_subscribed(self: &Arc<Self>, channel: &[u8], feed: &ChannelFeed) {
        let source = match self.target.sentinel() {
            Some(sentinel) => Feed::Sentinel(Arc::clone(sentinel)),
            None => Feed::Nodes(self.target.nodes().to_vec()),
        };
        let store = Arc::downgrade(self);
        let deadlines = move |op| store.upgrade().map(|inner| inner.latency.deadline(0, op));
        if let Some(task) = feed.keep(source, &self.config, channel, deadlines) {
            self.track(task);
        }
    }

    /// A call that found no connection and will not wait for one; the
    /// last attempt's failure, if any, is its source. Redis is unusable
    /// for now ([`Error::is_unreachable`]).
    fn reconnecting(&self) -> Error {
        let err = Error::new(
            ErrorKind::Store,
            "redis is unreachable; reconnecting in the background (calls fail at once until then)",
        )
        .unreachable();
        let last = self
            .last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        match last {
            Some(cause) => err.with_source(cause),
            None => err,
        }
    }

    /// One connection attempt after `failures` failed ones, bounded by
    /// [`attempt_bound`](Self::attempt_bound): the connection is made and
    /// its handshake answered within the
    /// [handshake budget](Self::handshake_budget) (its round trip seeds the
    /// latency of domains that have none yet), Redis's clock sampled (each
    /// reply within the read deadline), and the connection installed.
    async fn connect(self: &Arc<Self>, failures: u32) -> Result<(), Error> {
        let budget = self.handshake_budget(failures);
        let too_slow = |what: &str, within: Duration| {
            Error::new(
                ErrorKind::Store,
                format!("could not {what} redis within {within:?}"),
            )
        };
        let attempt = async {
            let started = Instant::now();
            let made = async {
                match &self.target {
                    // No response timeout of the connection's own: every
                    // command through `call` has its deadline, and a second
                    // timer per command cost a hit a fifth of a raw `GET`.
                    Topology::Node(client) => {
                        let config = AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(budget))
                            .set_response_timeout(None);
                        client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await
                            .map(Conn::Node)
                            .map_err(store_error)
                    }
                    Topology::Cluster { client, .. } => client
                        .get_async_connection()
                        .await
                        .map(Conn::Cluster)
                        .map_err(store_error),
                    Topology::Sentinel(sentinel) => {
                        let (conn, master) = sentinel.connect_master(&self.config, budget).await?;
                        Ok(Conn::Master(conn, master))
                    }
                }
            };
            // Through sentinels: two connections (see `sentinel::lookup_time`).
            let within = match self.target {
                Topology::Sentinel(_) => sentinel::lookup_time(budget),
                _ => budget,
            };
            let mut conn = tokio::time::timeout(within, made)
                .await
                .map_err(|_| too_slow("connect to", within))??;
            // At least one round trip (the handshake's), likely more: a
            // generous first guess, for the clock samples' deadlines.
            self.latency.seed(started.elapsed());
            let sampled = self.clock.sample(&mut conn, &self.latency).await;
            // After a failover, first what the former master may have lost.
            if let (Some(sentinel), Conn::Master(conn, master)) = (self.target.sentinel(), &conn) {
                tokio::time::timeout(budget, sentinel.replay(&mut conn.clone(), master))
                    .await
                    .map_err(|_| too_slow("replay lost revocations on", budget))??;
            }
            Ok::<_, Error>((conn, sampled))
        };
        let bound = self.attempt_bound(failures);
        let (conn, sampled) = tokio::time::timeout(bound, attempt)
            .await
            .map_err(|_| too_slow("connect to", bound))??;
        if let Err(err) = sampled {
            match &conn {
                // A cluster whose clock nodes do not answer still serves the
                // other nodes' keys: the previous sample (or the system
                // clock) stands in until the next refresh.
                Conn::Cluster(_) => {
                    tracing::warn!(error = %err, "redis cluster clock unavailable; keeping the previous sample or the system clock until the next one");
                }
                // One server that cannot answer `TIME` cannot serve either
                // (a hung server accepts connections it never answers).
                Conn::Node(_) | Conn::Master(..) => return Err(err),
            }
        }
        self.keep_clock();
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let home = tokio::runtime::Handle::try_current().ok();
        *self.conn_home.lock().unwrap_or_else(|p| p.into_inner()) =
            home.map(|home| (generation, home));
        let live = Live { generation, conn };
        *self.conn.write().unwrap_or_else(|p| p.into_inner()) = Some(live);
        Ok(())
    }

    /// Forgets connection `generation` (if still current), so the next call
    /// reconnects: the connection is broken, or it failed a probe (a host
    /// that vanished never resets it).
    pub(super) fn forget(&self, generation: u64) {
        let mut conn = self.conn.write().unwrap_or_else(|p| p.into_inner());
        if conn.as_ref().is_some_and(|c| c.generation == generation) {
            *conn = None;
        }
    }

    /// A command on connection `generation` timed out (ignored if that is
    /// no longer the live one: a newer one is not in doubt). One slow reply (a large value ahead
    /// of it, a busy server) says little, and dropping a shared connection
    /// for it would fail or delay every call behind a reconnect; so the
    /// connection is kept and probed instead: one `PING` in the background
    /// (at most one probe at a time), given `connect_timeout` (at least the
    /// write deadline in force). A connection that does not answer, or
    /// answers with anything but `PONG` (its replies shifted onto other
    /// commands: a request lost on the way while a later one was answered),
    /// is forgotten and re-made in the background; until then calls keep
    /// failing after one deadline each, never more.
    ///
    /// A timeout may also mean that the runtime driving the connection (or
    /// a background task) has gone idle: the lost tasks are looked for too.
    pub(super) fn suspect(self: &Arc<Self>, generation: u64) {
        self.lost_tasks.store(true, Ordering::Release);
        let Some(live) = self.current().filter(|live| live.generation == generation) else {
            return;
        };
        let inner = Arc::downgrade(self);
        let wait = self
            .config
            .connect_timeout
            .max(self.latency.deadline(0, DeadlineKind::Write));
        let home = self
            .conn_home
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|(made, _)| *made == live.generation)
            .map(|(_, home)| home.clone());
        let probe = |duty: Duty| async move {
            duty.due_by(Some(Instant::now() + wait));
            let Live {
                generation,
                mut conn,
            } = live;
            // Made on another runtime: its driver runs there. A runtime
            // that no longer runs anything (idle, or gone) cannot drive it,
            // and the connection is as good as dead.
            if let Some(home) = home.filter(|home| !runs_here(home))
                && !runs_anything(&home).await
            {
                if let Some(inner) = inner.upgrade()
                    && duty.is_current()
                {
                    tracing::debug!(
                        "the runtime that drives the redis connection runs nothing; reconnecting"
                    );
                    inner.forget(generation);
                }
                return duty.done();
            }
            let answered = tokio::time::timeout(
                wait,
                redis::cmd("PING").query_async::<redis::Value>(&mut conn),
            )
            .await;
            let Some(inner) = inner.upgrade() else {
                return duty.done();
            };
            let pong = matches!(&answered, Ok(Ok(redis::Value::SimpleString(s))) if s == "PONG");
            if !pong && duty.is_current() {
                tracing::debug!(
                    ?wait,
                    "redis connection did not answer a probe; reconnecting"
                );
                inner.forget(generation);
            }
            duty.done();
        };
        if let Some(task) = self.prober.ensure(wait, probe) {
            self.track(task);
        }
    }

    /// Keeps `task`, to abort it when the store is dropped.
    fn track(&self, task: AbortHandle) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }
}

/// Whether the caller runs on `runtime`.
fn runs_here(runtime: &tokio::runtime::Handle) -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|here| here.id() == runtime.id())
}

/// How long a runtime has to run a trivial task before it counts as
/// running nothing (idle: a current-thread runtime whose `block_on`
/// returned; or shut down).
const CANARY_WAIT: Duration = Duration::from_millis(100);

/// Whether `runtime` runs a trivial task within [`CANARY_WAIT`].
async fn runs_anything(runtime: &tokio::runtime::Handle) -> bool {
    let (ran, answer) = tokio::sync::oneshot::channel();
    drop(runtime.spawn(async move {
        let _ = ran.send(());
    }));
    matches!(tokio::time::timeout(CANARY_WAIT, answer).await, Ok(Ok(())))
}

/// (Re)connects until a connection is made: one attempt at a time, with
/// full-jitter backoff (50 ms doubling to 2 s) between failed attempts, so
/// a fleet does not reconnect in lockstep (on a Sentinel store, the
/// sentinels naming a new master cuts the backoff short). Holds the store
/// only during an attempt; ends when the store is dropped, or when it
/// finds itself replaced (its runtime went idle; see `crate::background`).
async fn run_reconnect(inner: Weak<RedisCore>, duty: Duty) {
    let backoff = Backoff::full_jitter(Duration::from_millis(50), Duration::from_secs(2));
    let mut rng: StdRng = rand::make_rng();
    let mut failures = 0u32;
    loop {
        let Some(inner) = inner.upgrade() else {
            return duty.done();
        };
        // Due by the end of its attempt's bound (plus the supervisor's
        // grace, `connect_timeout`): an attempt may take that long.
        let attempt = inner.attempt(failures);
        if !duty.due_by(Some(attempt.until)) {
            return duty.done();
        }
        inner
            .reconnect
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .attempt = Some(attempt);
        let made = inner.connect(failures).await;
        if !duty.is_current() {
            // Replaced while its runtime was idle: the new task speaks for
            // the store now.
            return duty.done();
        }
        {
            let mut reconnect = inner.reconnect.lock().unwrap_or_else(|p| p.into_inner());
            reconnect.attempt = None;
            if made.is_ok() {
                reconnect.connected_once = true;
            }
        }
        *inner.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = made.clone().err();
        inner.attempts.send_modify(|n| *n = n.wrapping_add(1));
        match made {
            Ok(()) => return duty.done(),
            Err(err) => {
                tracing::debug!(error = %err, "redis connection attempt failed; backing off")
            }
        }
        failures = failures.saturating_add(1);
        let sentinel = inner.target.sentinel().cloned();
        drop(inner);
        let delay = backoff.delay(failures, None, &mut rng);
        if !duty.due_by(Some(Instant::now() + delay)) {
            return duty.done();
        }
        let pause = tokio::time::sleep(delay);
        match sentinel {
            Some(sentinel) => {
                tokio::select! {
                    () = pause => {}
                    () = sentinel.new_master_named() => {}
                }
            }
            None => pause.await,
        }
    }
}

/// Keeps the clock sample current while the store is alive (and while it
/// is the store's clock refresh: see `crate::background`).
async fn run_clock_refresh(inner: Weak<RedisCore>, duty: Duty) {
    loop {
        let (every, within) = match inner.upgrade() {
            Some(inner) => (inner.config.clock_refresh, inner.config.connect_timeout),
            None => return duty.done(),
        };
        if !duty.due_by(Some(Instant::now() + every + within)) {
            return duty.done();
        }
        tokio::time::sleep(every).await;
        let Some(inner) = inner.upgrade() else {
            return duty.done();
        };
        let deadline = Instant::now() + inner.config.connect_timeout;
        let sampled = match inner.conn(deadline, true).await {
            // The connection has no response timeout of its own.
            Ok((mut live, _)) => tokio::time::timeout_at(
                deadline,
                inner.clock.sample(&mut live.conn, &inner.latency),
            )
            .await
            .unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Store,
                    "redis did not answer TIME in time",
                ))
            }),
            Err(err) => Err(err),
        };
        if let Err(err) = sampled {
            tracing::warn!(error = %err, "redis clock sample failed; keeping the previous one");
        }
    }
}

/// Follows the master while a Sentinel store is alive: asks the sentinels
/// every `subscription_ping` ([`Sentinel::check`]); when they name another
/// master (or a subscription found one), drops the store's connection to
/// the old one and reconnects.
///
/// Supervised (see `crate::background`): started again by the store when
/// its runtime went away, it ends when it finds itself replaced.
async fn run_master_watch(inner: Weak<RedisCore>, duty: Duty) {
    let (sentinel, config) = {
        let Some(inner) = inner.upgrade() else {
            return duty.done();
        };
        let Some(sentinel) = inner.target.sentinel() else {
            return duty.done();
        };
        (Arc::clone(sentinel), inner.config.clone())
    };
    let mut named = sentinel.named();
    loop {
        // As long as a connection may take, at the latency seen.
        let Some(budget) = inner.upgrade().map(|inner| inner.handshake_budget(0)) else {
            return duty.done();
        };
        let back_by = Instant::now() + config.subscription_ping + budget;
        if !duty.due_by(Some(back_by)) {
            return duty.done();
        }
        tokio::select! {
            () = tokio::time::sleep(config.subscription_ping) => {
                sentinel.check(&config, budget).await;
            }
            changed = named.changed() => if changed.is_err() { return duty.done() },
        }
        let Some(inner) = inner.upgrade() else {
            return duty.done();
        };
        let believed = sentinel.believed();
        if let Some(live) = inner.current()
            && let Conn::Master(_, at) = &live.conn
            && Some(at) != believed.as_ref()
        {
            inner.forget(live.generation);
            let _ = inner.start_reconnect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_slots_match_redis() {
        // Values from `CLUSTER KEYSLOT` (and the cluster specification).
        assert_eq!(hash_slot(b"foo"), 12_182);
        assert_eq!(hash_slot(b"bar"), 5_061);
        assert_eq!(hash_slot(b"123456789"), 0x31c3);
        // The hash tag decides; an empty tag does not count.
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"{user1000}.followers"), hash_slot(b"user1000"));
        // `{}` is an empty tag: the whole key is hashed, not `bar`.
        assert_ne!(hash_slot(b"foo{}{bar}"), hash_slot(b"bar"));
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
    }
}
