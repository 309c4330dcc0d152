//! The Redis backend: one server, a Redis Cluster, or the master that Redis
//! Sentinel names ([`sentinel`] says how a failover is followed).
//!
//! Commands share one multiplexed connection (or one cluster connection,
//! which routes each command by its key's hash slot), each bounded by a
//! deadline that follows the latency Redis actually has (see [`latency`]).
//! Leases are Lua scripts (`EVALSHA`, with `EVAL` as the
//! fallback on a node that lacks them). Fill and invalidation notices ride
//! on one pub/sub connection per channel. The store's clock is Redis's
//! `TIME`, sampled on connect and every `clock_refresh`. TLS (`rediss://`,
//! the `tls` feature) is set up in [`tls`].

mod tls;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use rand::rngs::StdRng;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, FromRedisValue, IntoConnectionInfo, Pipeline, RedisFuture, Script,
    ToRedisArgs, Value,
};
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::{
    Delivery, FencedWrite, LeaseAttempt, LeaseRequest, Notice, Replace, SUBSCRIPTION_BUFFER, Store,
    StoreFuture, Subscription, ttl_millis,
};
use crate::background::{Duty, Supervised};
use crate::clock::{SystemClock, WallClock, millis};
use crate::error::{ConfigError, Error, ErrorKind, MAX_WAIT};
use crate::jitter::{Backoff, poll_delay};

mod latency;
mod sentinel;

pub use latency::RedisLatency;
use latency::{Latencies, Op};
pub use sentinel::SentinelError;
use sentinel::{MasterAddr, Revocation, Sentinel};

// A lease's value is its holder's token followed by one status byte: `-`,
// or `w` once someone else has tried to take it (a waiter). The holder is
// the value without its last byte, so tokens of any length compare exactly.

/// For each lease `KEYS[i]` (`ARGV[1]` the TTL in ms, `ARGV[1 + i]` the
/// token): `SET NX PX` the lease, `-1` if taken, or already held by this
/// token (a retried call whose first run's reply was lost: idempotent). If
/// someone else holds it, mark it waited on (`SETRANGE` keeps its TTL) —
/// only a value in this format (a token as long as ours plus a status
/// byte), so a lease written by an earlier build, a bare token, is never
/// altered — and reply its remaining TTL in ms (a lease without one, never
/// written by breakwater, counts as a full `ttl`, so waiters do not spin on
/// it). A value of another Redis type under the lease key is no lease: it
/// is replaced by this one. One reply per key, in order.
static ACQUIRE_LEASES: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local ttl = ARGV[1]
          local out = {}
          for i, key in ipairs(KEYS) do
            local token = ARGV[i + 1]
            local left = -1
            if not redis.call('SET', key, token .. '-', 'NX', 'PX', ttl) then
              local held = redis.pcall('GET', key)
              if type(held) == 'table' and held.err then
                redis.call('SET', key, token .. '-', 'PX', ttl)
              elseif held and string.sub(held, 1, -2) == token then
                left = -1
              else
                if held and #held == #token + 1 then
                  local mark = string.sub(held, -1)
                  if mark == '-' or mark == 'w' then
                    redis.call('SETRANGE', key, #held - 1, 'w')
                  end
                end
                left = redis.call('PTTL', key)
                if left < 0 then
                  left = tonumber(ttl)
                end
              end
            end
            out[i] = left
          end
          return out",
    )
});

/// How many keys one `MGET` or lease script of a batch carries.
const BATCH_COMMAND_KEYS: usize = 256;

/// `PEXPIRE` the lease only if `ARGV[1]` holds it.
static EXTEND_LEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local held = redis.call('GET', KEYS[1])
          if held and string.sub(held, 1, -2) == ARGV[1] then
            return redis.call('PEXPIRE', KEYS[1], ARGV[2])
          end
          return 0",
    )
});

/// Delete the lease only if `ARGV[1]` holds it, then publish.
static RELEASE_LEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local held = redis.call('GET', KEYS[1])
          if held and string.sub(held, 1, -2) == ARGV[1] then
            redis.call('DEL', KEYS[1])
            redis.call('PUBLISH', ARGV[2], ARGV[3])
            return 1
          end
          return 0",
    )
});

/// The leader's write: KEYS = value, lease (and, with a condition, the key
/// that must be unchanged); ARGV = token, value, ttl ms, channel, message,
/// value message (empty for none) (and the bytes the third key must hold).
/// Writes only while the token holds the lease (and the third key holds
/// exactly those bytes: if not, the lease is released and the message
/// published, as for a write that failed); a waited-on lease with a value message publishes
/// that message with the value appended. `SET` replaces a value of any
/// Redis type (a list someone pushed under the key is repaired here). If
/// the server refuses the write (an error about this key), the lease is
/// still released and waiters told, so they do not wait out its TTL, and
/// the error is returned.
static FENCED_SET: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local held = redis.call('GET', KEYS[2])
          if held and string.sub(held, 1, -2) == ARGV[1] then
            if KEYS[3] and redis.call('GET', KEYS[3]) ~= ARGV[7] then
              redis.call('DEL', KEYS[2])
              redis.call('PUBLISH', ARGV[4], ARGV[5])
              return 0
            end
            local written = redis.pcall('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
            if type(written) == 'table' and written.err then
              redis.call('DEL', KEYS[2])
              redis.call('PUBLISH', ARGV[4], ARGV[5])
              return written
            end
            redis.call('DEL', KEYS[2])
            if string.sub(held, -1) == 'w' and ARGV[6] ~= '' then
              redis.call('PUBLISH', ARGV[4], ARGV[6] .. ARGV[2])
            else
              redis.call('PUBLISH', ARGV[4], ARGV[5])
            end
            return 1
          end
          return 0",
    )
});

/// What `KEYS[1]` holds, or `ARGV[1]` (the placeholder), written there with
/// `PX` `ARGV[2]` if it holds nothing.
static PIN: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"local held = redis.call('GET', KEYS[1])
          if held then
            return held
          end
          redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
          return ARGV[1]",
    )
});

/// A plain write that revokes any load in flight: KEYS = value, lease; ARGV
/// = value, ttl ms, channel, message.
static REPLACE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"redis.call('DEL', KEYS[2])
          redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
          redis.call('PUBLISH', ARGV[3], ARGV[4])
          return 1",
    )
});

/// Delete value and lease together, then publish.
static INVALIDATE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r"redis.call('DEL', KEYS[1], KEYS[2])
          redis.call('PUBLISH', ARGV[1], ARGV[2])
          return 1",
    )
});

/// What a tag counter holds, in Lua: `generation(key)` is its number if
/// it holds 1 to 16 decimal digits below 2^53 (Lua numbers are doubles,
/// exact up to there), else `nil` (missing, not a number, or a value of
/// another Redis type: `GET` fails, which `pcall` catches).
/// `at_least(key, ttl)` makes its TTL at least `ttl` ms (`PTTL` is -1 for
/// a key without one, so it gets one); never shortens it.
macro_rules! generation_lua {
    ($body:literal) => {
        concat!(
            r"local function generation(key)
                local held = redis.pcall('GET', key)
                if type(held) == 'string' and #held >= 1 and #held <= 16
                    and string.match(held, '^%d+$') then
                  local n = tonumber(held)
                  if n < 9007199254740992 then
                    return n
                  end
                end
                return nil
              end
              local function at_least(key, ttl)
                if redis.call('PTTL', key) < ttl then
                  redis.call('PEXPIRE', key, ttl)
                end
              end
              ",
            $body
        )
    };
}

/// A tag's generation bump: KEYS = the counter; ARGV = channel, message,
/// fresh value, TTL in ms. A counter holding a generation goes up by one;
/// a missing or foreign one is set to the fresh value (`SET` replaces any
/// Redis type). Its TTL is kept if longer than `ARGV[4]` (`SET` drops it, so
/// it is read first). Then publishes; returns the new value as digits.
static BUMP_GENERATION: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(generation_lua!(
        r"local ttl = tonumber(ARGV[4])
          local old = generation(KEYS[1])
          local new = ARGV[3]
          if old then
            new = string.format('%.0f', old + 1)
          end
          local left = redis.call('PTTL', KEYS[1])
          redis.call('SET', KEYS[1], new, 'PX', string.format('%.0f', math.max(left, ttl)))
          redis.call('PUBLISH', ARGV[1], ARGV[2])
          return new"
    ))
});

/// Read-or-create of tag counters: KEYS = the counters; ARGV = fresh
/// value, TTL in ms. Each counter holding a generation is replied as it
/// is; a missing or foreign one is set to the fresh value first. Each
/// one's TTL is made at least `ARGV[2]`. One reply (digits) per key, in
/// order.
static TAG_GENERATIONS: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(generation_lua!(
        r"local fresh, ttl = ARGV[1], tonumber(ARGV[2])
          local out = {}
          for i, key in ipairs(KEYS) do
            local held = generation(key)
            if held then
              at_least(key, ttl)
              out[i] = string.format('%.0f', held)
            else
              redis.call('SET', key, fresh, 'PX', ARGV[2])
              out[i] = fresh
            end
          end
          return out"
    ))
});

/// How many writes of one `replace_many` run at a time on a cluster.
const CLUSTER_WRITES_IN_FLIGHT: usize = 64;

/// A Lua script, run with `EVALSHA`, and with `EVAL` (which also caches it
/// on that node) when the node does not know it yet. Not with
/// `SCRIPT LOAD`: redis-rs sends that to every node of a cluster, and one
/// hung node then makes every lease on a node that lost its scripts time
/// out.
struct Lua {
    code: &'static str,
    sha: String,
}

impl Lua {
    fn new(code: &'static str) -> Self {
        let sha = Script::new(code).get_hash().to_owned();
        Lua { code, sha }
    }

    fn key(&self, key: impl ToRedisArgs) -> Invocation<'_> {
        Invocation {
            lua: self,
            keys: key.to_redis_args(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`Lua`] script: its keys and arguments.
struct Invocation<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    fn key(mut self, key: impl ToRedisArgs) -> Self {
        self.keys.extend(key.to_redis_args());
        self
    }

    fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// The failure domain of its first key (they share a hash slot).
    fn domain(&self, inner: &Inner) -> usize {
        self.keys.first().map_or(0, |key| inner.domain(key))
    }

    /// `EVALSHA <sha> …`, or `EVAL <code> …` when `with_code`.
    fn cmd(&self, with_code: bool) -> Cmd {
        let (verb, script) = if with_code {
            ("EVAL", self.lua.code)
        } else {
            ("EVALSHA", self.lua.sha.as_str())
        };
        let mut cmd = redis::cmd(verb);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

/// Connection settings for [`RedisStore`].
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `connect_timeout` | 500 ms: making a connection and its handshake; after a failed attempt the next one gets twice as long, up to `max_response_timeout` |
/// | `response_timeout` | 50 ms: the least deadline of a read (`GET`); a healthy Redis answers in well under a millisecond |
/// | `write_timeout` | 250 ms: the least deadline of a write or a lease script. Writes queue on the one multiplexed connection behind each other: on a 2-core machine 1,000 `set`s in flight took up to 42 ms each (release build; 100 in flight: up to 12 ms), so a bulk of writes needs more room than a read |
/// | `max_response_timeout` | 2 s: the most a deadline grows to when Redis answers slowly (see below) |
/// | `subscription_ping` | 1 s (a pub/sub connection that does not answer a `PING` within `response_timeout` is dropped and re-made) |
/// | `clock_refresh` | 60 s |
/// | `tls_ca_pem` | none: a `rediss://` URL trusts the webpki roots (the `tls` feature) |
/// | `tls_client_cert_pem` | none (no client certificate) |
///
/// # Deadlines follow Redis's latency
///
/// `response_timeout` and `write_timeout` are floors, not fixed deadlines.
/// The store measures every reply's round trip, per failure domain (one
/// for a single server, one per 256 hash slots on a Cluster), and keeps a
/// decaying peak of them: a slower reply raises it at once, quicker ones
/// bring it down within about 10 s. Each command's deadline is 3 × that
/// peak, at least its floor and at most `max_response_timeout`. A command
/// that timed out counts as a round trip of its whole deadline, so while
/// Redis does not answer the deadlines grow threefold per timeout up to
/// the ceiling (as TCP backs off), and come back down once it answers
/// quickly again. [`RedisStore::latency`] reports the round trip and the
/// deadlines in force.
///
/// The bound this gives a cache: **with Redis answering within
/// `max_response_timeout`, however slowly, a key is loaded once
/// fleet-wide** (a read that times out still goes through the lease, and a
/// lease attempt that times out is tried again with the same token; only
/// a Redis that cannot be reached, or whose breaker is open, makes a
/// process load directly). Connecting adapts too: the handshake gets
/// `connect_timeout` (twice that after each failed attempt, up to
/// `max_response_timeout`), the clock samples that follow get the read
/// deadline the handshake's round trip calls for, and calls made before
/// the first connection wait for the attempt in progress. So the first
/// connection needs a round trip within `connect_timeout`: a Redis slower
/// than that when a process starts has its first calls load directly
/// (measured: 2 processes, 700 ms round trips, 2 loads; 400 ms, 1 load)
/// until a later attempt, with twice the time, connects. Through
/// sentinels the lookup (a sentinel's connection and answer, then the
/// master's connection and `ROLE`) gets twice an attempt's budget, and
/// grows with it.
///
/// # TLS
///
/// With the `tls` feature, a `rediss://` URL connects over TLS (rustls),
/// for one server and for a cluster, and every connection the store makes
/// uses it (commands, the cluster's node connections, pub/sub). The
/// server's certificate is always verified: against the webpki roots
/// (compiled in; managed Redis services use public CAs), or only against
/// `tls_ca_pem` when it is given. TLS 1.2 and 1.3.
/// Without the feature a `rediss://` URL is a [`Config`](ErrorKind::Config)
/// error that says to enable it.
///
/// ```toml
/// breakwater-cache = { version = "0.1", features = ["tls"] }
/// ```
///
/// If the program has not installed a process-wide rustls crypto provider,
/// the store installs ring's when it builds its first TLS client.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    connect_timeout: Duration,
    response_timeout: Duration,
    write_timeout: Duration,
    max_response_timeout: Duration,
    clock_refresh: Duration,
    subscription_ping: Duration,
    wall_clock: Arc<dyn WallClock>,
    tls: tls::TlsConfig,
}

impl Default for RedisStoreConfig {
    fn default() -> Self {
        RedisStoreConfig {
            connect_timeout: Duration::from_millis(500),
            response_timeout: Duration::from_millis(50),
            write_timeout: Duration::from_millis(250),
            max_response_timeout: Duration::from_secs(2),
            clock_refresh: Duration::from_secs(60),
            subscription_ping: Duration::from_secs(1),
            wall_clock: Arc::new(SystemClock),
            tls: tls::TlsConfig::default(),
        }
    }
}

impl RedisStoreConfig {
    /// How long the first connection attempt may take to connect and
    /// shake hands (each failed attempt doubles it for the next, up to
    /// `max_response_timeout`).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The least a read (`GET`, `PTTL`, `TIME`) may wait for its reply:
    /// its deadline while Redis answers quickly (see `# Deadlines follow
    /// Redis's latency`).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The least a write (`SET`, `DEL`, `PUBLISH`) or a lease script may
    /// wait for its reply; never less than `response_timeout`.
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = timeout;
        self
    }

    /// The most a command's deadline grows to while Redis answers slowly
    /// (never less than `write_timeout`): with Redis answering within it,
    /// a key is loaded once fleet-wide.
    pub fn max_response_timeout(mut self, timeout: Duration) -> Self {
        self.max_response_timeout = timeout;
        self
    }

    /// The longest any command may wait: what the connection itself allows.
    fn longest_reply(&self) -> Duration {
        self.response_timeout
            .max(self.write_timeout)
            .max(self.max_response_timeout)
    }

    /// How long the connection attempt after `failures` failed ones may
    /// take to connect and shake hands.
    fn connect_budget(&self, failures: u32) -> Duration {
        let grown = self.connect_timeout.saturating_mul(1 << failures.min(16));
        grown.min(self.max_response_timeout.max(self.connect_timeout))
    }

    /// How often Redis's clock is sampled again with `TIME`.
    pub fn clock_refresh(mut self, every: Duration) -> Self {
        self.clock_refresh = every;
        self
    }

    /// How often an idle pub/sub connection is checked with `PING`.
    pub fn subscription_ping(mut self, every: Duration) -> Self {
        self.subscription_ping = every;
        self
    }

    /// The local wall clock, used only until Redis's clock is known (the
    /// system clock by default; a skewed one for simulations and tests).
    pub fn wall_clock(mut self, clock: Arc<dyn WallClock>) -> Self {
        self.wall_clock = clock;
        self
    }

    /// Trust only the CA certificate(s) in `pem` (one or more PEM
    /// `CERTIFICATE` blocks) for `rediss://` connections, instead of the
    /// webpki roots: for a server whose certificate a private CA signed.
    /// Needs a `rediss://` URL. (The `tls` feature.)
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use breakwater_cache::{RedisStore, RedisStoreConfig};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let config = RedisStoreConfig::default()
    ///     .tls_ca_pem(std::fs::read("/etc/redis/ca.crt")?)
    ///     .tls_client_cert_pem(
    ///         std::fs::read("/etc/redis/client.crt")?,
    ///         std::fs::read("/etc/redis/client.key")?,
    ///     );
    /// let store = RedisStore::connect_with("rediss://redis.internal:6380/", config)?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// Present this client certificate (PEM, the chain from the client's
    /// own certificate up) with its private key (PEM: PKCS #8, PKCS #1 or
    /// SEC1) on `rediss://` connections, for servers that require one
    /// (mutual TLS; `redis-server`'s `tls-auth-clients yes`). The key never
    /// appears in `Debug` output or errors. Needs a `rediss://` URL. (The
    /// `tls` feature.)
    #[cfg(feature = "tls")]
    pub fn tls_client_cert_pem(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Every setting greater than zero and at most a day; certificates
    /// and keys that parse.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
            ("write_timeout", self.write_timeout),
            ("max_response_timeout", self.max_response_timeout),
            ("clock_refresh", self.clock_refresh),
            ("subscription_ping", self.subscription_ping),
        ] {
            if value.is_zero() {
                return Err(
                    ConfigError::new(format!("redis {name} must be greater than zero"))
                        .for_key(name),
                );
            }
            ConfigError::at_most(
                &format!("redis {name}"),
                value,
                MAX_WAIT,
                "use milliseconds to seconds (see RedisStoreConfig's defaults)",
            )
            .map_err(|e| e.for_key(name))?;
        }
        self.tls.validate()
    }
}

/// A [`Store`] on one Redis server, or on a Redis Cluster
/// ([`connect_cluster`](RedisStore::connect_cluster)).
///
/// The connection is made lazily, on first use, and each attempt is bounded
/// by `connect_timeout`, so a cache can be built while Redis is down and a
/// down Redis fails fast instead of hanging requests. Commands share one
/// multiplexed connection, re-made in the background when it breaks, each
/// bounded by `response_timeout`. TCP connections are
/// made with `TCP_NODELAY` (redis-rs's default leaves Nagle's algorithm on,
/// which can hold a small command back until the server's delayed ACK).
///
/// The store's clock is Redis's: `TIME` is sampled when the connection is
/// made and every `clock_refresh` after, corrected by half the round trip, so
/// [`now_ms`](Store::now_ms) costs no round trip and a hit stays one `GET`.
///
/// # Examples
///
/// ```no_run
/// use breakwater_cache::{Cache, RedisStore};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cache = Cache::<String>::builder()
///     .namespace("catalog")
///     .store(RedisStore::connect("redis://127.0.0.1:6379")?)
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    target: Target,
    config: RedisStoreConfig,
    /// Round trips per failure domain, and the deadlines they call for.
    latency: Latencies,
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
    /// own runtime ([`revive`](Inner::revive)).
    lost_tasks: Arc<AtomicBool>,
    clock: RwLock<Option<ClockSample>>,
    /// The highest Redis-derived time handed out, so the clock does not run
    /// back by a sample's rounding when a new sample corrects it. Only
    /// readings from a sample count (never the wall-clock stand-in), and a
    /// new sample that is clearly behind resets it: no application-clock
    /// reading can pin the store's clock, and a Redis clock that stepped
    /// back (or a failover to a host behind) is followed, not frozen.
    last_now: AtomicU64,
    /// One pub/sub connection per subscribed channel, fanned out locally.
    channels: Mutex<HashMap<Vec<u8>, ChannelFeed>>,
    /// Background tasks (clock refresh, subscriptions), stopped on drop.
    tasks: Mutex<Vec<AbortHandle>>,
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
    /// Its bound (see [`Inner::attempt_bound`]).
    until: Instant,
}

/// A connection and its generation, so a failure only drops the connection
/// it happened on.
#[derive(Clone)]
struct Live {
    generation: u64,
    conn: Conn,
}

/// Where the store's commands go.
// One per store: a client's size (larger with TLS settings) costs nothing.
#[allow(clippy::large_enum_variant)]
enum Target {
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

impl Target {
    /// The servers named by the user: the one server, or the cluster's seed
    /// nodes (which the subscription tries in turn).
    fn nodes(&self) -> &[redis::Client] {
        match self {
            Target::Node(client) => std::slice::from_ref(client),
            Target::Cluster { nodes, .. } => nodes,
            // The master is whichever server the sentinels name.
            Target::Sentinel(_) => &[],
        }
    }

    /// The Sentinel state, for a store on a Sentinel-managed master.
    fn sentinel(&self) -> Option<&Arc<Sentinel>> {
        match self {
            Target::Sentinel(sentinel) => Some(sentinel),
            Target::Node(_) | Target::Cluster { .. } => None,
        }
    }
}

/// A live connection: to one server, to a cluster, or to the master that
/// the sentinels named.
#[derive(Clone)]
enum Conn {
    /// One server's multiplexed connection. Not a `ConnectionManager`:
    /// the store already re-makes a broken connection in the background
    /// (see [`run_reconnect`]), and the manager's own machinery (a shared
    /// future awaited, and the connection cloned, on every command) cost
    /// a hit a fifth of a raw `GET`.
    Node(MultiplexedConnection),
    Cluster(ClusterConnection),
    /// A plain multiplexed connection, not a `ConnectionManager`: that one
    /// would reconnect to the same address by itself, and after a failover
    /// the address may be a replica, or a restarted, empty master. A broken
    /// connection is made again through the sentinels instead.
    Master(MultiplexedConnection, MasterAddr),
}

impl Conn {
    /// The master this connection goes to, on a Sentinel store.
    fn master(&self) -> Option<&MasterAddr> {
        match self {
            Conn::Master(_, addr) => Some(addr),
            Conn::Node(_) | Conn::Cluster(_) => None,
        }
    }

    /// The server's `TIME`. In a cluster it is asked of the primary that
    /// serves slot 0, so every process that shares the cluster reads the same
    /// node's clock (a keyless `TIME` goes to a random node, and two nodes'
    /// clocks may disagree); if that node does not answer and `any_node`,
    /// of any node.
    async fn time(&mut self, any_node: bool) -> redis::RedisResult<(u64, u64)> {
        match self {
            Conn::Node(c) => redis::cmd("TIME").query_async(c).await,
            Conn::Master(c, _) => redis::cmd("TIME").query_async(c).await,
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(0, SlotAddr::Master));
                match c
                    .route_command(redis::cmd("TIME"), RoutingInfo::SingleNode(route))
                    .await
                {
                    Ok(reply) => Ok(redis::from_redis_value(reply)?),
                    Err(err) if any_node => {
                        tracing::debug!(error = %err, "TIME on slot 0's primary failed; asking any node");
                        redis::cmd("TIME").query_async(c).await
                    }
                    Err(err) => Err(err),
                }
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Master(c, _) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Master(c, _) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Master(c, _) => c.get_db(),
        }
    }
}

struct ChannelFeed {
    messages: broadcast::Sender<Delivery>,
    ready: watch::Sender<bool>,
    /// The task that keeps the channel subscribed.
    task: Supervised,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let tasks = self.tasks.get_mut().unwrap_or_else(|p| p.into_inner());
        for task in tasks.drain(..) {
            task.abort();
        }
    }
}

/// Redis's clock at a local instant.
#[derive(Debug, Clone, Copy)]
struct ClockSample {
    local: Instant,
    redis_ms: u64,
    rtt: Duration,
}

impl ClockSample {
    /// Redis's clock now, as this sample extrapolates it.
    fn reading(&self) -> u64 {
        self.redis_ms.saturating_add(millis(self.local.elapsed()))
    }
}

impl RedisStore {
    /// A store for the Redis at `url` (`redis://host:port/db`), with default
    /// timeouts. No connection is made yet.
    ///
    /// # Errors
    ///
    /// [`Config`](ErrorKind::Config) if the URL cannot be parsed.
    pub fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(url, RedisStoreConfig::default())
    }

    /// Like [`connect`](RedisStore::connect), with explicit timeouts.
    ///
    /// # Errors
    ///
    /// [`Config`](ErrorKind::Config) if the URL cannot be parsed or a
    /// timeout is zero.
    pub fn connect_with(url: &str, config: RedisStoreConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self::with_target(
            Target::Node(node_client(url, &config)?),
            config,
        ))
    }

    /// A store on the Redis Cluster that `nodes` (one or more of its nodes'
    /// URLs, e.g. `redis://10.0.0.1:6379`) belong to, with default timeouts.
    /// No connection is made yet; the cluster's other nodes are discovered
    /// from the ones given.
    ///
    /// Every key of a cache entry (its value and its lease) carries the same
    /// hash tag, so each lease script runs on one node. Commands follow
    /// `MOVED`/`ASK` redirects within `response_timeout`; a failed node is
    /// reconnected by the cluster client while the other nodes keep serving.
    /// The store's clock is the `TIME` of the primary that serves slot 0
    /// (any node's while that one is down), in every process, so processes
    /// agree on freshness even if the nodes' clocks differ. The subscription
    /// for fill notices uses the URLs given here, one at a time: give more
    /// than one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use breakwater_cache::{Cache, RedisStore};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect_cluster([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://10.0.0.3:6379",
    /// ])?;
    /// let cache = Cache::<String>::builder()
    ///     .namespace("catalog")
    ///     .store(store)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Config`](ErrorKind::Config) if `nodes` is empty or a URL cannot be
    /// parsed.
    pub fn connect_cluster<I, S>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::connect_cluster_with(nodes, RedisStoreConfig::default())
    }

    /// Like [`connect_cluster`](RedisStore::connect_cluster), with explicit
    /// timeouts.
    ///
    /// # Errors
    ///
    /// [`Config`](ErrorKind::Config) if `nodes` is empty, a URL cannot be
    /// parsed, or a timeout is zero.
    pub fn connect_cluster_with<I, S>(nodes: I, config: RedisStoreConfig) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        config.validate()?;
        let nodes = nodes
            .into_iter()
            .map(|url| node_client(url.as_ref(), &config))
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
        Ok(Self::with_target(
            Target::Cluster {
                client: Box::new(client),
                nodes,
            },
            config,
        ))
    }

    /// A store on the master that the Redis Sentinels at `sentinels` (one or
    /// more of their URLs, `redis://[:password@]host:port`) name `master`,
    /// with default timeouts. No connection is made yet.
    ///
    /// `master` is the name the sentinels monitor it under (`"mymaster"`),
    /// or, when the master needs a password or another database, a URL
    /// whose host is that name: `redis://:password@mymaster/2` (user,
    /// password and database apply to the master and its replacements; each
    /// sentinel URL carries the sentinels' own password, if they have one).
    ///
    /// # Failover
    ///
    /// Every connection, commands and the pub/sub subscription alike, goes
    /// to the master the sentinels name, checked with `ROLE`; nothing
    /// reconnects to a remembered address. The store moves to a new master
    /// when its connection breaks, when a write is refused as `READONLY`,
    /// or when the sentinels (asked every `subscription_ping`) name another
    /// one; the reconnect then starts at once.
    ///
    /// Replication is asynchronous, so a failover can lose the last writes
    /// the old master acknowledged; after `SENTINEL FAILOVER` the old master
    /// even keeps accepting writes until the sentinels demote it (measured:
    /// 10 s later). Lost fills and leases cost a miss or a second load. Lost
    /// invalidations (and `set`s) would bring old values back, so the store
    /// remembers those of the last 10 s + 2 × `subscription_ping` (up to
    /// 100,000) with the master that acknowledged them, and applies them
    /// again, notices included, on a new master before using it. One that a
    /// master the sentinels no longer name acknowledged fails instead (and
    /// `invalidate` tries it again).
    ///
    /// The bound: once the sentinels name the new master, an invalidated
    /// value may still be served as fresh by a process that has not noticed
    /// yet (at most `subscription_ping` + `connect_timeout`; its L1 then
    /// becomes unverified, as whenever the bus drops), and from the new
    /// master until the invalidating process has reconnected there (about
    /// as long). Not covered: an invalidating process that dies before it
    /// reconnects, and more invalidations in the window than it keeps.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use breakwater_cache::{Cache, RedisStore};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::connect_sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "redis://:master-password@mymaster/0",
    /// )?;
    /// let cache = Cache::<String>::builder()
    ///     .namespace("catalog")
    ///     .store(store)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Config`](ErrorKind::Config) if `sentinels` is empty, a URL cannot
    /// be parsed, a sentinel URL selects a database, or `master` is neither
    /// a name nor a URL with the name as its host. Once connecting, calls
    /// fail with a [`Store`](ErrorKind::Store) error whose source chain holds
    /// a [`SentinelError`] when no sentinel answers, none knows `master`, or
    /// the server they name is not a master.
    pub fn connect_sentinel<I, S>(sentinels: I, master: &str) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::connect_sentinel_with(sentinels, master, RedisStoreConfig::default())
    }

    /// Like [`connect_sentinel`](RedisStore::connect_sentinel), with explicit
    /// timeouts (`subscription_ping` is also how often the sentinels are
    /// asked whether the master moved).
    ///
    /// # Errors
    ///
    /// As [`connect_sentinel`](RedisStore::connect_sentinel); also if a
    /// timeout is zero.
    pub fn connect_sentinel_with<I, S>(
        sentinels: I,
        master: &str,
        config: RedisStoreConfig,
    ) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        config.validate()?;
        let sentinel = Sentinel::new(sentinels, master, &config)?;
        Ok(Self::with_target(
            Target::Sentinel(Arc::new(sentinel)),
            config,
        ))
    }

    fn with_target(target: Target, config: RedisStoreConfig) -> Self {
        let domains = match target {
            Target::Node(_) | Target::Sentinel(_) => 1,
            Target::Cluster { .. } => usize::from(SLOTS / SLOTS_PER_DOMAIN),
        };
        let latency = Latencies::new(
            domains,
            config.response_timeout,
            config.write_timeout,
            config.max_response_timeout,
        );
        let lost_tasks = Arc::new(AtomicBool::new(false));
        RedisStore {
            inner: Arc::new(Inner {
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
                clock: RwLock::new(None),
                last_now: AtomicU64::new(0),
                channels: Mutex::default(),
                tasks: Mutex::default(),
                lost_tasks,
            }),
        }
    }
}

/// Hash slots in a Redis Cluster.
const SLOTS: u16 = 16_384;
/// Consecutive hash slots per failure domain.
const SLOTS_PER_DOMAIN: u16 = 256;

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag
/// (the bytes between the first `{` and the next `}`, if not empty), else of
/// the whole key, modulo 16,384.
fn hash_slot(key: &[u8]) -> u16 {
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

/// A lease script's reply for one lease: `-1` taken, else the ms its
/// holder has left.
fn lease_attempt(left: i64) -> LeaseAttempt {
    match u64::try_from(left) {
        Ok(ms) => LeaseAttempt::Held {
            ttl: Duration::from_millis(ms),
        },
        Err(_) => LeaseAttempt::Acquired,
    }
}

/// Redis answered `what` with the wrong number of replies.
/// A generation a script replied, as digits.
fn generation_reply(digits: &str) -> Result<u64, Error> {
    super::parse_generation(digits.as_bytes()).ok_or_else(|| {
        Error::new(
            ErrorKind::Store,
            format!("redis answered a tag generation with {digits:?}, not a generation"),
        )
    })
}

fn wrong_count(what: &str) -> Error {
    Error::new(
        ErrorKind::Store,
        format!("redis answered {what} with the wrong number of replies"),
    )
}

/// A client for one server's URL (with `TCP_NODELAY`, see
/// [`connection_info`]; TLS as the URL and `config` say, see [`tls`]). A
/// URL that does not parse is named with its password masked
/// ([`redact_url`]), and redis-rs's reason is kept as text with any copy
/// of the URL or password masked too.
fn node_client(url: &str, config: &RedisStoreConfig) -> Result<redis::Client, Error> {
    tls::check_supported(url)?;
    let info = connection_info(url).map_err(|e| invalid_url(url, &e))?;
    tls::client(url, info, &config.tls)
}

/// A URL redis-rs refused, named with its password masked.
fn invalid_url(url: &str, err: &redis::RedisError) -> Error {
    let reason = mask_secrets(&err.to_string(), url);
    Error::new(
        ErrorKind::Config,
        format!("invalid redis url {:?}: {reason}", redact_url(url)),
    )
}

/// `url` with its password masked, for errors, logs and `Debug`:
/// `redis://user:hunter2@host/0` → `redis://user:***@host/0`, a bare
/// `redis://secret@host` → `redis://***@host`, and a `pass=`/`password=`
/// query parameter (`redis+unix:` URLs) → `pass=***`. It works on the text
/// alone, so a URL that does not parse is masked too; everything up to the
/// last `@` counts as credentials (more is masked, never less).
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let rest = match rest.rfind('@') {
        Some(at) => {
            let (userinfo, host) = rest.split_at(at);
            match userinfo.find(':') {
                Some(colon) => format!("{}:***{host}", &userinfo[..colon]),
                None => format!("***{host}"),
            }
        }
        None => rest.to_owned(),
    };
    let mut out = String::with_capacity(scheme.len() + rest.len());
    out.push_str(scheme);
    let mut rest = rest.as_str();
    // Query parameters that carry a password.
    while let Some(i) = find_password_param(rest) {
        let (head, tail) = rest.split_at(i);
        out.push_str(head);
        let eq = tail.find('=').map_or(tail.len(), |e| e + 1);
        out.push_str(&tail[..eq]);
        out.push_str("***");
        let end = tail[eq..].find('&').map_or(tail.len(), |e| eq + e);
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Where a `pass=` or `password=` query parameter starts in `s`.
fn find_password_param(s: &str) -> Option<usize> {
    ["?pass=", "&pass=", "?password=", "&password="]
        .iter()
        .filter_map(|p| s.find(p).map(|i| i + 1))
        .min()
}

/// `text` with every copy of `url`, and of the password in it, masked.
fn mask_secrets(text: &str, url: &str) -> String {
    let mut text = text.replace(url, &redact_url(url));
    let secrets = url.find("://").map_or(url, |i| &url[i + 3..]);
    if let Some(at) = secrets.rfind('@') {
        let userinfo = &secrets[..at];
        let password = userinfo.find(':').map_or(userinfo, |c| &userinfo[c + 1..]);
        if !password.is_empty() {
            text = text.replace(password, "***");
        }
    }
    text
}

/// The URL parsed, with `TCP_NODELAY` on: redis-rs leaves Nagle's algorithm
/// on, and a small command written while an earlier one is unacknowledged
/// then waits for the peer's delayed ACK (up to 40 ms on Linux) — measured
/// here as waiters woken 3 to 40 ms after a fill instead of well under 1 ms.
fn connection_info(url: &str) -> redis::RedisResult<redis::ConnectionInfo> {
    let info = url.into_connection_info()?;
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    Ok(info.set_tcp_settings(tcp))
}

impl Inner {
    fn current(&self) -> Option<Live> {
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
    async fn conn(
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
                Some(attempt) => (attempt.since + self.latency.deadline(0, Op::Read)).min(deadline),
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
            Target::Sentinel(_) => sentinel::lookup_time(handshake) + handshake,
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
            .max(self.latency.deadline(0, Op::Write))
            .min(
                self.config
                    .max_response_timeout
                    .max(self.config.connect_timeout),
            )
    }

    /// The failure domain of `key` (see [`Store::failure_domain`]).
    #[inline]
    fn domain(&self, key: &[u8]) -> usize {
        match self.target {
            Target::Node(_) | Target::Sentinel(_) => 0,
            Target::Cluster { .. } => usize::from(hash_slot(key) / SLOTS_PER_DOMAIN),
        }
    }

    /// Starts again, on the caller's runtime, the background tasks that
    /// were lost (dropped with their runtime, or stranded on an idle one):
    /// the clock refresh and the Sentinel watcher once a connection was
    /// made, and every channel's subscription. Cheap when nothing was lost
    /// (one atomic load, on every command).
    #[inline]
    fn revive(self: &Arc<Self>) {
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
                .ensure(grace, |duty| sentinel::watch(weak, duty))
            {
                self.track(task);
            }
        }
    }

    /// Makes sure a task keeps `channel` subscribed for `feed`.
    fn keep_subscribed(self: &Arc<Self>, channel: &[u8], feed: &ChannelFeed) {
        let source = match self.target.sentinel() {
            Some(sentinel) => Feed::Sentinel(Arc::clone(sentinel)),
            None => Feed::Nodes(self.target.nodes().to_vec()),
        };
        let (config, channel) = (self.config.clone(), channel.to_vec());
        let (messages, ready) = (feed.messages.clone(), feed.ready.clone());
        let grace = self.config.connect_timeout;
        let store = Arc::downgrade(self);
        if let Some(task) = feed.task.ensure(grace, |duty| {
            run_subscription(
                source,
                config,
                channel,
                FeedDuty {
                    duty: Some(duty),
                    messages,
                    ready,
                    store,
                },
            )
        }) {
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
                    Target::Node(client) => {
                        let config = AsyncConnectionConfig::new()
                            .set_connection_timeout(Some(budget))
                            .set_response_timeout(None);
                        client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await
                            .map(Conn::Node)
                            .map_err(store_error)
                    }
                    Target::Cluster { client, .. } => client
                        .get_async_connection()
                        .await
                        .map(Conn::Cluster)
                        .map_err(store_error),
                    Target::Sentinel(sentinel) => {
                        let (conn, master) = sentinel.connect_master(&self.config, budget).await?;
                        Ok(Conn::Master(conn, master))
                    }
                }
            };
            // Through sentinels: two connections (see `sentinel::lookup_time`).
            let within = match self.target {
                Target::Sentinel(_) => sentinel::lookup_time(budget),
                _ => budget,
            };
            let mut conn = tokio::time::timeout(within, made)
                .await
                .map_err(|_| too_slow("connect to", within))??;
            // At least one round trip (the handshake's), likely more: a
            // generous first guess, for the clock samples' deadlines.
            self.latency.seed(started.elapsed());
            let sampled = self.sample_clock(&mut conn).await;
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
    fn forget(&self, generation: u64) {
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
    fn suspect(self: &Arc<Self>, generation: u64) {
        self.lost_tasks.store(true, Ordering::Release);
        let Some(live) = self.current().filter(|live| live.generation == generation) else {
            return;
        };
        let inner = Arc::downgrade(self);
        let wait = self
            .config
            .connect_timeout
            .max(self.latency.deadline(0, Op::Write));
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

    /// Runs one command on the connection, about a key of failure domain
    /// `domain`, within the deadline of `op` there (see [`latency`]); its
    /// round trip is recorded, a timeout as a round trip of the whole
    /// deadline. A broken connection is dropped
    /// (the next call reconnects); a timeout has the connection probed
    /// ([`suspect`](Self::suspect)). A broken connection
    /// (not a timeout: that would double the deadline) is retried once on a
    /// fresh connection after a short jittered pause, so a Redis restart or a
    /// failover costs a request nothing; broken again, the error says Redis
    /// is [unreachable](Error::is_unreachable).
    async fn call<T, F, Fut>(
        self: &Arc<Self>,
        op: Op,
        domain: usize,
        command: F,
    ) -> Result<T, Error>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        self.revive();
        let mut retried = false;
        loop {
            let wait = self.latency.deadline(domain, op);
            // One deadline for the call: waiting for a reconnect in
            // progress counts against it (not for the first connection,
            // which the call waits for in full: then the command's deadline
            // starts once it is made, from the latency it measured).
            let mut sent = Instant::now();
            let mut deadline = sent + wait;
            let (live, waited) = match self.current() {
                Some(live) => (live, false),
                // Boxed: no connection is the rare case, and its wait
                // would grow every command's future.
                None => match Box::pin(self.conn(deadline, false)).await? {
                    (live, true) => {
                        sent = Instant::now();
                        deadline = sent + self.latency.deadline(domain, op);
                        (live, false)
                    }
                    (live, false) => (live, true),
                },
            };
            // A cluster connection reconnects each node on its own, and one
            // node's failure says nothing about the others': it is kept, and
            // a failed command is not retried on it.
            let cluster = matches!(live.conn, Conn::Cluster(_));
            let generation = live.generation;
            let sentinel_master = live.conn.master().is_some();
            let mut reply = pin!(command(live.conn));
            let outcome = loop {
                match tokio::time::timeout_at(deadline, reply.as_mut()).await {
                    Ok(outcome) => break outcome,
                    // After waiting for a reconnect: what was left of the
                    // deadline ran out, which says nothing about the new
                    // connection; it is kept.
                    Err(_) if waited => {
                        return Err(Error::new(
                            ErrorKind::Store,
                            "redis did not answer in time (part of the deadline went to a reconnect)",
                        ));
                    }
                    // The command's own deadline (the connection allows the
                    // longest of them): as a timeout reported by the
                    // connection. The reply takes at least that long: the
                    // next deadline grows. Another command's timeout may
                    // have grown it already (they were sent together): then
                    // this one waits on for its reply, to that deadline, so
                    // a burst of commands when Redis slows down costs one
                    // failure, not one each (which would open the store's
                    // breaker).
                    Err(_) => {
                        let now = Instant::now();
                        let news = self.latency.timed_out(domain, deadline - sent, now);
                        let grown = sent + self.latency.deadline(domain, op);
                        if !news && grown > now {
                            deadline = grown;
                            continue;
                        }
                        if !cluster {
                            self.suspect(generation);
                        }
                        tracing::debug!(
                            after = ?deadline - sent,
                            next = ?self.latency.deadline(domain, op),
                            "redis did not answer in time; the next deadline grows"
                        );
                        return Err(Error::new(ErrorKind::Store, "redis did not answer in time"));
                    }
                }
            };
            match outcome {
                Ok(value) => {
                    // Not after a reconnect: part of the time went to it.
                    if !waited {
                        let now = Instant::now();
                        self.latency.record(domain, now - sent, now);
                    }
                    return Ok(value);
                }
                Err(err) => {
                    let broken = err.is_connection_dropped()
                        || err.is_io_error()
                        || err.is_connection_refusal()
                        // The sentinels' master was demoted: the connection
                        // is made again to the master they name now.
                        || (sentinel_master && sentinel::moved(&err));
                    if broken && !cluster {
                        self.forget(generation);
                    } else if err.is_timeout() && !cluster {
                        self.suspect(generation);
                    }
                    if !broken && !err.is_timeout() && !waited {
                        // Redis answered, with an error: a round trip.
                        let now = Instant::now();
                        self.latency.record(domain, now - sent, now);
                    }
                    if !broken || err.is_timeout() || retried || cluster {
                        let err = store_error(err);
                        return Err(if broken && !cluster {
                            err.unreachable()
                        } else {
                            err
                        });
                    }
                    retried = true;
                    let pause = {
                        let mut rng: StdRng = rand::make_rng();
                        poll_delay(Duration::from_millis(10), &mut rng)
                    };
                    tracing::debug!(error = %err, ?pause, "redis connection broken; retrying once");
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// One command about `key` through [`call`](Self::call), with the
    /// deadline of `op`.
    async fn query<T: FromRedisValue>(
        self: &Arc<Self>,
        op: Op,
        key: &[u8],
        cmd: &redis::Cmd,
    ) -> Result<T, Error> {
        self.call(op, self.domain(key), |mut conn| async move {
            cmd.query_async(&mut conn).await
        })
        .await
    }

    /// One script invocation through [`call`](Self::call), with the write
    /// deadline: `EVALSHA`, then `EVAL` if the node does not have the
    /// script.
    async fn eval<T: FromRedisValue>(self: &Arc<Self>, script: Invocation<'_>) -> Result<T, Error> {
        let script = &script;
        self.call(Op::Write, script.domain(self), |mut conn| async move {
            run_script(&mut conn, script).await
        })
        .await
    }

    /// A write that revokes (`INVALIDATE`, `REPLACE`) through
    /// [`eval`](Self::eval). On a Sentinel store it counts only if the
    /// master that acknowledged it is still the one the sentinels name, and
    /// it is remembered, to be applied again on the next master should the
    /// failover have lost it (see [`sentinel`]).
    async fn revoke(
        self: &Arc<Self>,
        script: Invocation<'_>,
        revoked: Revocation<'_>,
    ) -> Result<(), Error> {
        let script = &script;
        let master = self
            .call(Op::Write, script.domain(self), |mut conn| async move {
                let _: i64 = run_script(&mut conn, script).await?;
                Ok(conn.master().cloned())
            })
            .await?;
        self.acknowledged(master, std::slice::from_ref(&revoked))
    }

    /// Revocations that the master `master` acknowledged (`None`: not a
    /// Sentinel store), recorded for the next failover; an error if the
    /// sentinels have named another master since.
    fn acknowledged(
        &self,
        master: Option<MasterAddr>,
        revoked: &[Revocation<'_>],
    ) -> Result<(), Error> {
        match (self.target.sentinel(), master) {
            (Some(sentinel), Some(master)) => sentinel.acknowledged(&master, revoked),
            _ => Ok(()),
        }
    }

    fn track(&self, task: AbortHandle) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(task);
    }

    /// Samples `TIME` a few times and keeps the sample with the shortest
    /// round trip (the tightest bound on Redis's clock).
    ///
    /// Any one good sample will do. Until the store has a sample, a cluster
    /// may take it from any node; after that only from slot 0's primary (a
    /// failed refresh keeps the previous sample rather than switch clocks).
    ///
    /// Each reply gets the read deadline of the clock's domain (domain 0:
    /// the one server, or slot 0's primary) and is recorded there as a
    /// round trip (and seeds the domains that have none yet); a `TIME`
    /// that does not answer in time ends the sampling, and so does
    /// `max_response_timeout` spent. Each sample better than the ones
    /// before is put in use at once, so a sampling cut short keeps what it
    /// found.
    async fn sample_clock(&self, conn: &mut Conn) -> Result<(), Error> {
        let any_node = self
            .clock
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none();
        let started = Instant::now();
        let mut best: Option<ClockSample> = None;
        let mut failure = None;
        for _ in 0..3 {
            if best.is_some() && started.elapsed() >= self.latency.ceiling() {
                break;
            }
            let wait = self.latency.deadline(0, Op::Read);
            let sent = Instant::now();
            let (secs, micros): (u64, u64) =
                match tokio::time::timeout(wait, conn.time(any_node)).await {
                    Ok(Ok(time)) => time,
                    Ok(Err(err)) => {
                        failure = Some(store_error(err));
                        continue;
                    }
                    Err(_) => {
                        self.latency.record(0, wait, Instant::now());
                        failure = Some(Error::new(
                            ErrorKind::Store,
                            format!("redis did not answer TIME within {wait:?}"),
                        ));
                        break;
                    }
                };
            let now = Instant::now();
            let rtt = now - sent;
            self.latency.record(0, rtt, now);
            self.latency.seed(rtt);
            let sample = ClockSample {
                local: sent + rtt / 2,
                redis_ms: secs.saturating_mul(1000).saturating_add(micros / 1000),
                rtt,
            };
            if best.is_none_or(|b| sample.rtt < b.rtt) {
                best = Some(sample);
                self.install_clock(sample);
            }
        }
        match (best, failure) {
            (Some(_), _) | (None, None) => Ok(()),
            (None, Some(err)) => Err(err),
        }
    }

    /// Puts clock sample `sample` in use.
    fn install_clock(&self, sample: ClockSample) {
        let mut clock = self.clock.write().unwrap_or_else(|p| p.into_inner());
        *clock = Some(sample);
        // Behind the last time handed out by more than the sample's
        // own uncertainty: Redis's clock stepped back (or this is
        // another host's). Follow it rather than stand still.
        let now = sample.reading();
        let slack = millis(sample.rtt).max(1);
        if self.last_now.load(Ordering::Relaxed) > now.saturating_add(slack) {
            self.last_now.store(now, Ordering::Relaxed);
        }
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

/// `EVALSHA`, then `EVAL` if the node does not have the script.
async fn run_script<T: FromRedisValue>(
    conn: &mut Conn,
    script: &Invocation<'_>,
) -> redis::RedisResult<T> {
    match script.cmd(false).query_async(conn).await {
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.cmd(true).query_async(conn).await
        }
        other => other,
    }
}

/// (Re)connects until a connection is made: one attempt at a time, with
/// full-jitter backoff (50 ms doubling to 2 s) between failed attempts, so
/// a fleet does not reconnect in lockstep (on a Sentinel store, the
/// sentinels naming a new master cuts the backoff short). Holds the store
/// only during an attempt; ends when the store is dropped, or when it
/// finds itself replaced (its runtime went idle; see `crate::background`).
async fn run_reconnect(inner: Weak<Inner>, duty: Duty) {
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
async fn run_clock_refresh(inner: Weak<Inner>, duty: Duty) {
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
            Ok((mut live, _)) => {
                tokio::time::timeout_at(deadline, inner.sample_clock(&mut live.conn))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Error::new(
                            ErrorKind::Store,
                            "redis did not answer TIME in time",
                        ))
                    })
            }
            Err(err) => Err(err),
        };
        if let Err(err) = sampled {
            tracing::warn!(error = %err, "redis clock sample failed; keeping the previous one");
        }
    }
}

/// Where a subscription connects.
enum Feed {
    /// The store's one server, or the cluster's seed nodes in turn.
    Nodes(Vec<redis::Client>),
    /// The master the sentinels name.
    Sentinel(Arc<Sentinel>),
}

impl Feed {
    /// A client for attempt `attempt`, and the master it goes to on a
    /// Sentinel store (found within `budget`); `None` if there is nowhere
    /// to connect.
    async fn client(
        &self,
        attempt: usize,
        config: &RedisStoreConfig,
        budget: Duration,
    ) -> Option<Result<(redis::Client, Option<MasterAddr>), Error>> {
        match self {
            Feed::Nodes(clients) => {
                let client = clients.get(attempt % clients.len().max(1))?;
                Some(Ok((client.clone(), None)))
            }
            Feed::Sentinel(sentinel) => Some(
                sentinel
                    .subscription_client(config, budget)
                    .await
                    .map(|(client, master)| (client, Some(master))),
            ),
        }
    }

    /// Resolves once the sentinels name another master than `master`;
    /// never for a subscription that is not on a Sentinel's master.
    async fn master_moved(&self, master: Option<&MasterAddr>) {
        match (self, master) {
            (Feed::Sentinel(sentinel), Some(master)) => sentinel.moved_from(master).await,
            _ => std::future::pending().await,
        }
    }
}

/// Keeps one channel subscribed on a dedicated pub/sub connection,
/// reconnecting with jittered backoff, and fans its messages out. An idle
/// connection is checked with `PING` every `subscription_ping`; one that does
/// not answer within the store's read deadline in force (a hung or
/// unreachable Redis) is dropped; connecting and subscribing get
/// `connect_timeout`, or twice the write deadline in force if that is
/// longer (deadlines follow the latency Redis has: see `latency`). Every (re)connection is announced as [`Delivery::Missed`], since
/// messages sent while it was down are lost. In a cluster each attempt tries
/// the next node: a `PUBLISH` on any node reaches every node's subscribers.
/// On a Sentinel store it subscribes on the master the sentinels name, and
/// drops the subscription as soon as they name another one (what is
/// published there would not reach it).
///
/// The task is supervised (see `crate::background`): dropped with its
/// runtime, it tells the subscribers the bus is down (`ready` false,
/// [`Delivery::Missed`]), and the store's next command starts it again.
async fn run_subscription(feed: Feed, config: RedisStoreConfig, channel: Vec<u8>, duty: FeedDuty) {
    let FeedDuty {
        ref messages,
        ref ready,
        ..
    } = duty;
    let backoff = Backoff::full_jitter(Duration::from_millis(50), Duration::from_secs(2));
    let mut rng: StdRng = rand::make_rng();
    let mut failures = 0u32;
    for attempt in 0usize.. {
        let budget = config
            .connect_timeout
            .max(duty.deadline(Op::Write).saturating_mul(2));
        // Through sentinels, the lookup first (see `sentinel::lookup_time`).
        let within = match feed {
            Feed::Sentinel(_) => sentinel::lookup_time(budget) + budget,
            Feed::Nodes(_) => budget,
        };
        if !duty.due_by(Instant::now() + within) {
            return duty.done();
        }
        let connect = async {
            // In a cluster, each new attempt tries the next node.
            let Some(client) = feed.client(attempt, &config, budget).await else {
                return Ok(None);
            };
            let (client, master) = client?;
            let mut pubsub = client.get_async_pubsub().await.map_err(store_error)?;
            pubsub.subscribe(&channel).await.map_err(store_error)?;
            Ok::<_, Error>(Some((pubsub, master)))
        };
        match tokio::time::timeout(within, connect).await {
            Ok(Ok(None)) => return duty.done(),
            Ok(Ok(Some((pubsub, master)))) => {
                failures = 0;
                if !duty.due_by(Instant::now() + config.subscription_ping + duty.deadline(Op::Read))
                {
                    return duty.done();
                }
                ready.send_replace(true);
                let _ = messages.send(Delivery::Missed);
                let (mut sink, mut stream) = pubsub.split();
                let mut ping = tokio::time::interval(config.subscription_ping);
                ping.tick().await;
                loop {
                    tokio::select! {
                        msg = stream.next() => match msg {
                            Some(msg) => {
                                let payload = Arc::from(msg.get_payload_bytes());
                                let _ = messages.send(Delivery::Message(payload));
                            }
                            None => break,
                        },
                        _ = ping.tick() => {
                            let back_by = Instant::now() + config.subscription_ping + duty.deadline(Op::Read);
                            if !duty.due_by(back_by) {
                                break;
                            }
                            let pong = tokio::time::timeout(
                                duty.deadline(Op::Read),
                                sink.ping::<redis::Value>(),
                            )
                            .await;
                            if !matches!(pong, Ok(Ok(_))) {
                                break;
                            }
                        }
                        () = feed.master_moved(master.as_ref()) => {
                            tracing::warn!("the redis sentinels name a new master; subscribing there");
                            break;
                        }
                    }
                }
                if !duty.is_current() {
                    // Replaced (this runtime was idle): the new task
                    // speaks for the channel now.
                    return duty.done();
                }
                ready.send_replace(false);
                let _ = messages.send(Delivery::Missed);
                tracing::warn!("redis subscription dropped; reconnecting");
            }
            Ok(Err(err)) => tracing::debug!(error = %err, "redis subscription failed"),
            Err(_) => tracing::debug!("redis subscription timed out"),
        }
        failures = failures.saturating_add(1);
        let delay = backoff.delay(failures, None, &mut rng);
        if !duty.due_by(Instant::now() + delay) {
            return duty.done();
        }
        tokio::time::sleep(delay).await;
    }
}

/// A subscription task's hold on its channel (see `crate::background`):
/// dropped before it was done (its runtime went away), it tells the
/// channel's subscribers that the bus is down, since nobody listens for
/// them any more.
struct FeedDuty {
    duty: Option<Duty>,
    messages: broadcast::Sender<Delivery>,
    ready: watch::Sender<bool>,
    /// The store, for the deadlines in force.
    store: Weak<Inner>,
}

impl FeedDuty {
    /// The store's deadline in force for `op` (its first failure
    /// domain's), or the configured floor once the store is gone.
    fn deadline(&self, op: Op) -> Duration {
        self.store
            .upgrade()
            .map_or(Duration::from_millis(50), |inner| {
                inner.latency.deadline(0, op)
            })
    }

    /// Promises to be back by `due`; `false` if the task was replaced.
    fn due_by(&self, due: Instant) -> bool {
        self.duty.as_ref().is_some_and(|d| d.due_by(Some(due)))
    }

    fn is_current(&self) -> bool {
        self.duty.as_ref().is_some_and(Duty::is_current)
    }

    /// The task ends of its own accord.
    fn done(mut self) {
        if let Some(duty) = self.duty.take() {
            duty.done();
        }
    }
}

impl Drop for FeedDuty {
    fn drop(&mut self) {
        let Some(duty) = self.duty.take() else { return };
        if duty.is_current() && *self.ready.borrow() {
            self.ready.send_replace(false);
            let _ = self.messages.send(Delivery::Missed);
        }
        drop(duty);
    }
}

/// A command's failure as a store error: a [key fault](Error::key_fault)
/// if Redis answered with an error about the command's key, else a store
/// failure.
fn store_error(err: redis::RedisError) -> Error {
    if err.is_timeout() {
        Error::new(ErrorKind::Store, "redis did not answer in time").with_source(err)
    } else if is_key_fault(&err) {
        Error::key_fault(err)
    } else {
        Error::store(err)
    }
}

/// Whether Redis answered with an error that belongs to the command's key
/// (every command here is about one key, or a key and its lease): the
/// server is up and answered, so this is not a store failure.
///
/// - `WRONGTYPE`: a value of another type under the key (a list where a
///   string belongs); also when raised inside a script.
/// - `ERR`: a general error about this command: a script's error, an
///   argument the server refused (an expiry out of range), a value over
///   `proto-max-bulk-len`.
///
/// Everything that says the server or node cannot serve (`LOADING`,
/// `MASTERDOWN`, `CLUSTERDOWN`, `TRYAGAIN`, `READONLY`, `BUSY`, `OOM`,
/// `NOPERM`, I/O, timeouts, ...) stays a store failure. Classified by
/// redis-rs's kind and the reply's code, never by its message.
fn is_key_fault(err: &redis::RedisError) -> bool {
    match err.kind() {
        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => true,
        redis::ErrorKind::Extension => err.code() == Some("WRONGTYPE"),
        _ => false,
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedisStore");
        match self.inner.target.sentinel() {
            Some(sentinel) => d
                .field("sentinels", &sentinel.addrs())
                .field("master", &sentinel.master_name()),
            None => d.field(
                "addrs",
                &self
                    .inner
                    .target
                    .nodes()
                    .iter()
                    .map(|c| c.get_connection_info().addr().to_string())
                    .collect::<Vec<_>>(),
            ),
        };
        d.field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// The positions of `keys` grouped for one multi-key command each: on a
    /// single server in runs of [`BATCH_COMMAND_KEYS`]; on a cluster by
    /// hash slot (a command's keys must share one), then in such runs.
    fn by_slot(&self, keys: &[&[u8]]) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        if matches!(self.inner.target, Target::Cluster { .. }) {
            let mut slots: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
            for (i, key) in keys.iter().enumerate() {
                let slot = hash_slot(key);
                match slots.get(&slot) {
                    Some(&g) if groups[g].len() < BATCH_COMMAND_KEYS => groups[g].push(i),
                    _ => {
                        slots.insert(slot, groups.len());
                        groups.push(vec![i]);
                    }
                }
            }
        } else {
            let all: Vec<usize> = (0..keys.len()).collect();
            groups.extend(all.chunks(BATCH_COMMAND_KEYS).map(<[usize]>::to_vec));
        }
        groups
    }
}

impl RedisStore {
    /// Runs `command` once per group of `keys` ([`by_slot`](Self::by_slot)),
    /// side by side; its replies in the order of `keys` (`what` names the
    /// command, should a reply have the wrong length).
    async fn per_slot<T, F, Fut>(
        &self,
        keys: &[&[u8]],
        what: &str,
        command: F,
    ) -> Result<Vec<T>, Error>
    where
        F: Fn(&[usize]) -> Fut,
        Fut: Future<Output = Result<Vec<T>, Error>>,
    {
        let groups = self.by_slot(keys);
        // One group (one server, or keys of one slot): its positions are
        // every key's in order, and its reply needs no putting back.
        if let [group] = groups.as_slice() {
            let reply = command(group).await?;
            if reply.len() != keys.len() {
                return Err(wrong_count(what));
            }
            return Ok(reply);
        }
        let replies = futures_util::future::join_all(groups.iter().map(|g| command(g))).await;
        let mut out: Vec<Option<T>> = (0..keys.len()).map(|_| None).collect();
        for (group, reply) in groups.iter().zip(replies) {
            let reply = reply?;
            if reply.len() != group.len() {
                return Err(wrong_count(what));
            }
            for (&i, value) in group.iter().zip(reply) {
                out[i] = Some(value);
            }
        }
        // `by_slot` puts every position in one group.
        out.into_iter()
            .map(|value| value.ok_or_else(|| wrong_count(what)))
            .collect()
    }
}

impl RedisStore {
    /// [`Store::get`], unboxed: the cache calls it directly on the hit
    /// path when its store is a `RedisStore`.
    pub(crate) async fn get_unboxed(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        // Sized up front: the command's buffer is not grown for the key.
        let mut get = redis::Cmd::with_capacity(2, 3 + key.len());
        get.arg("GET").arg(key);
        self.inner.query(Op::Read, key, &get).await
    }
}

impl Store for RedisStore {
    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        Box::pin(self.get_unboxed(key))
    }

    fn set<'a>(&'a self, key: &'a [u8], value: &'a [u8], ttl: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            self.inner
                .query(
                    Op::Write,
                    key,
                    redis::cmd("SET").arg(key).arg(value).arg("PX").arg(ms),
                )
                .await
        })
    }

    fn delete<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let removed: u64 = self
                .inner
                .query(Op::Write, key, redis::cmd("DEL").arg(key))
                .await?;
            Ok(removed > 0)
        })
    }

    fn ttl<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        Box::pin(async move {
            let ms: i64 = self
                .inner
                .query(Op::Read, key, redis::cmd("PTTL").arg(key))
                .await?;
            // -2: no such key; -1: no expiry.
            Ok(u64::try_from(ms).ok().map(Duration::from_millis))
        })
    }

    /// Redis's clock, from the last `TIME` sample plus the local time elapsed
    /// since. Before the first connection it falls back to the system clock.
    fn now_ms(&self) -> u64 {
        let sample = *self.inner.clock.read().unwrap_or_else(|p| p.into_inner());
        match sample {
            Some(s) => {
                let now = s.reading();
                // Written only when the clock moved on: within one
                // millisecond, calls from every thread only read it.
                let prev = self.inner.last_now.load(Ordering::Relaxed);
                if now <= prev {
                    return prev;
                }
                self.inner
                    .last_now
                    .fetch_max(now, Ordering::Relaxed)
                    .max(now)
            }
            // Not recorded: the first sample replaces it entirely.
            None => self.inner.config.wall_clock.unix_ms(),
        }
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    /// On one server or a Sentinel-managed primary, one `MGET` for many
    /// reads; not on a Cluster, where a batch splits per hash slot.
    fn batches_reads(&self) -> bool {
        self.failure_domains() == 1
    }

    /// The read deadline in force, in the slowest failure domain: it
    /// follows the latency Redis has (see [`RedisStore::latency`]).
    fn read_deadline(&self) -> Duration {
        self.latency().read_deadline
    }

    /// One for a single server; for a cluster, one per 256 consecutive hash
    /// slots (64 in all): nodes own ranges of slots, so a failed node's
    /// keys fall into its own domains.
    fn failure_domains(&self) -> usize {
        match self.inner.target {
            Target::Node(_) | Target::Sentinel(_) => 1,
            Target::Cluster { .. } => usize::from(SLOTS / SLOTS_PER_DOMAIN),
        }
    }

    fn failure_domain(&self, key: &[u8]) -> usize {
        self.inner.domain(key)
    }

    fn acquire_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, LeaseAttempt> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            let left: Vec<i64> = self
                .inner
                .eval(ACQUIRE_LEASES.key(lease_key).arg(ms).arg(token))
                .await?;
            match left.as_slice() {
                [left] => Ok(lease_attempt(*left)),
                _ => Err(wrong_count("a lease script")),
            }
        })
    }

    /// One `MGET` (per 256 keys) on a single server; on a cluster one per
    /// hash slot, side by side (the cluster connection pipelines those
    /// that go to one node).
    fn get_many<'a>(&'a self, keys: &'a [&'a [u8]]) -> StoreFuture<'a, Vec<Option<Vec<u8>>>> {
        Box::pin(self.per_slot(keys, "an MGET", move |group| {
            let mut mget = redis::cmd("MGET");
            for &i in group {
                mget.arg(keys[i]);
            }
            let first = keys[group[0]];
            async move { self.inner.query(Op::Read, first, &mget).await }
        }))
    }

    /// One script (per 256 leases) on a single server; on a cluster one
    /// per hash slot, side by side.
    fn acquire_leases<'a>(
        &'a self,
        leases: &'a [LeaseRequest<'a>],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<LeaseAttempt>> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            let keys: Vec<&[u8]> = leases.iter().map(|l| l.key).collect();
            let left: Vec<i64> = self
                .per_slot(&keys, "a lease script", |group| {
                    let first = leases[group[0]];
                    let mut script = ACQUIRE_LEASES.key(first.key).arg(ms).arg(first.token);
                    for &i in &group[1..] {
                        script = script.key(leases[i].key).arg(leases[i].token);
                    }
                    async move { self.inner.eval(script).await }
                })
                .await?;
            Ok(left.into_iter().map(lease_attempt).collect())
        })
    }

    fn lease_held<'a>(&'a self, lease_key: &'a [u8]) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let held: i64 = self
                .inner
                .query(Op::Read, lease_key, redis::cmd("EXISTS").arg(lease_key))
                .await?;
            Ok(held == 1)
        })
    }

    fn extend_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            let extended: i64 = self
                .inner
                .eval(EXTEND_LEASE.key(lease_key).arg(token).arg(ms))
                .await?;
            Ok(extended == 1)
        })
    }

    fn release_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let released: i64 = self
                .inner
                .eval(
                    RELEASE_LEASE
                        .key(lease_key)
                        .arg(token)
                        .arg(notice.channel)
                        .arg(notice.message),
                )
                .await?;
            Ok(released == 1)
        })
    }

    fn fenced_set<'a>(&'a self, write: FencedWrite<'a>) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let ms = ttl_millis(write.ttl)?;
            let mut script = FENCED_SET
                .key(write.key)
                .key(write.lease_key)
                .arg(write.token)
                .arg(write.value)
                .arg(ms)
                .arg(write.notice.channel)
                .arg(write.notice.message)
                .arg(write.value_notice.unwrap_or_default());
            if let Some(unchanged) = write.unchanged {
                script = script.key(unchanged.key).arg(unchanged.bytes);
            }
            let written: i64 = self.inner.eval(script).await?;
            Ok(written == 1)
        })
    }

    fn pin<'a>(
        &'a self,
        key: &'a [u8],
        placeholder: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            let held: Vec<u8> = self
                .inner
                .eval(PIN.key(key).arg(placeholder).arg(ms))
                .await?;
            Ok(held)
        })
    }

    fn replace<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
        ttl: Duration,
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            let script = REPLACE
                .key(key)
                .key(lease_key)
                .arg(value)
                .arg(ms)
                .arg(notice.channel)
                .arg(notice.message);
            self.inner
                .revoke(script, Revocation::new(key, lease_key, notice))
                .await
        })
    }

    /// One pipeline of `EVAL`s on a single server (the script's code rides
    /// along, so no write depends on the node already knowing it), bounded
    /// by the write deadline; one after another on a cluster, whose writes
    /// go to different nodes.
    fn replace_many<'a>(&'a self, writes: &'a [Replace<'a>]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if writes.is_empty() {
                return Ok(());
            }
            if matches!(self.inner.target, Target::Cluster { .. }) {
                // Keys of a batch live on many nodes: the writes run
                // side by side (each routed to its key's node), a bounded
                // number at a time.
                for chunk in writes.chunks(CLUSTER_WRITES_IN_FLIGHT) {
                    let written = futures_util::future::join_all(
                        chunk
                            .iter()
                            .map(|w| self.replace(w.key, w.value, w.ttl, w.lease_key, w.notice)),
                    )
                    .await;
                    written.into_iter().collect::<Result<(), Error>>()?;
                }
                return Ok(());
            }
            let mut invocations = Vec::with_capacity(writes.len());
            for w in writes {
                let ms = ttl_millis(w.ttl)?;
                invocations.push(
                    REPLACE
                        .key(w.key)
                        .key(w.lease_key)
                        .arg(w.value)
                        .arg(ms)
                        .arg(w.notice.channel)
                        .arg(w.notice.message),
                );
            }
            // One pipeline of `EVALSHA`; a node that does not know the
            // script (`NOSCRIPT` for all of them, so none ran) gets the
            // batch again with `EVAL`, which also caches it there.
            let pipeline = |with_code: bool| {
                let mut pipeline = redis::pipe();
                for invocation in &invocations {
                    pipeline.add_command(invocation.cmd(with_code)).ignore();
                }
                pipeline
            };
            let by_sha = &pipeline(false);
            let pipeline = &pipeline;
            let master = self
                .inner
                .call(Op::Write, 0, |mut conn| async move {
                    match by_sha.query_async::<()>(&mut conn).await {
                        Err(err)
                            if err.kind()
                                == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                        {
                            pipeline(true).query_async::<()>(&mut conn).await?
                        }
                        other => other?,
                    }
                    Ok(conn.master().cloned())
                })
                .await?;
            let revoked: Vec<_> = writes
                .iter()
                .map(|w| Revocation::new(w.key, w.lease_key, w.notice))
                .collect();
            self.inner.acknowledged(master, &revoked)
        })
    }

    fn invalidate<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let script = INVALIDATE
                .key(key)
                .key(lease_key)
                .arg(notice.channel)
                .arg(notice.message);
            self.inner
                .revoke(script, Revocation::new(key, lease_key, notice))
                .await
        })
    }

    /// One script on the counter's node. On a Sentinel store the bump is
    /// remembered like an invalidation and applied again (as a bump, with
    /// the same fresh value) on the next master should a failover lose it.
    fn bump_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            let script = &BUMP_GENERATION
                .key(key)
                .arg(notice.channel)
                .arg(notice.message)
                .arg(fresh)
                .arg(ms);
            let (digits, master) = self
                .inner
                .call(Op::Write, self.inner.domain(key), |mut conn| async move {
                    let digits: String = run_script(&mut conn, script).await?;
                    Ok((digits, conn.master().cloned()))
                })
                .await?;
            self.inner
                .acknowledged(master, &[Revocation::bump(key, notice, fresh, ms)])?;
            generation_reply(&digits)
        })
    }

    /// One script (per 256 counters) on a single server; on a cluster one
    /// per hash slot, side by side.
    fn tag_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<u64>> {
        Box::pin(async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            let ms = ttl_millis(ttl)?;
            let digits: Vec<String> = self
                .per_slot(keys, "a tag generations script", |group| {
                    let mut script = TAG_GENERATIONS.key(keys[group[0]]).arg(fresh).arg(ms);
                    for &i in &group[1..] {
                        script = script.key(keys[i]);
                    }
                    async move { self.inner.eval(script).await }
                })
                .await?;
            digits.iter().map(|d| generation_reply(d)).collect()
        })
    }

    fn publish<'a>(&'a self, channel: &'a [u8], message: &'a [u8]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.inner
                .query::<i64>(
                    Op::Write,
                    channel,
                    redis::cmd("PUBLISH").arg(channel).arg(message),
                )
                .await
                .map(drop)
        })
    }

    fn subscribe(&self, channel: &[u8]) -> Subscription {
        let mut channels = self
            .inner
            .channels
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let feed = channels
            .entry(channel.to_vec())
            .or_insert_with(|| ChannelFeed {
                messages: broadcast::channel(SUBSCRIPTION_BUFFER).0,
                ready: watch::Sender::new(false),
                task: Supervised::reporting_to(&self.inner.lost_tasks),
            });
        // Started here, or again if its runtime went away.
        self.inner.keep_subscribed(channel, feed);
        // And again if it is stranded on an idle runtime, which only the
        // subscriber, polled elsewhere, can notice.
        let (inner, owned) = (Arc::downgrade(&self.inner), channel.to_vec());
        let keeper = move |renew: bool| {
            if let Some(inner) = inner.upgrade() {
                let channels = inner.channels.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(feed) = channels.get(&owned) {
                    if renew {
                        feed.task.reset();
                        feed.ready.send_replace(false);
                        let _ = feed.messages.send(Delivery::Missed);
                    }
                    inner.keep_subscribed(&owned, feed);
                }
            }
        };
        Subscription::new(feed.messages.subscribe(), feed.ready.subscribe())
            .kept_by(Arc::new(keeper))
    }
}

impl RedisStore {
    /// The round trip of the clock sample in use, or `None` before the first
    /// connection. Redis's clock is known to within half of it.
    pub fn clock_uncertainty(&self) -> Option<Duration> {
        let sample = *self.inner.clock.read().unwrap_or_else(|p| p.into_inner());
        sample.map(|s| s.rtt / 2)
    }

    /// Connects now (if not yet connected) and samples Redis's clock, so the
    /// first request does not pay for the connection. Waits for the
    /// connection attempt in progress, at least `connect_timeout`.
    ///
    /// # Errors
    ///
    /// [`Store`](ErrorKind::Store) if Redis cannot be reached in time.
    pub async fn warm_up(&self) -> Result<(), Error> {
        let deadline = Instant::now() + self.inner.config.connect_timeout;
        self.inner.conn(deadline, true).await.map(drop)
    }

    /// The round trip this store sees and the deadlines it gives commands
    /// now (see `# Deadlines follow Redis's latency` on
    /// [`RedisStoreConfig`]), for its slowest failure domain (a single
    /// server has one; a Cluster one per 256 hash slots).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), breakwater_cache::Error> {
    /// let store = breakwater_cache::RedisStore::connect("redis://127.0.0.1:6379")?;
    /// store.warm_up().await?;
    /// let latency = store.latency();
    /// println!(
    ///     "round trip {:?}: reads get {:?}, writes {:?}",
    ///     latency.round_trip, latency.read_deadline, latency.write_deadline
    /// );
    /// # Ok(()) }
    /// ```
    pub fn latency(&self) -> RedisLatency {
        let latency = &self.inner.latency;
        latency.report(latency.slowest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_url_is_a_config_error() {
        let err = RedisStore::connect("mysql://nope").unwrap_err();
        assert!(err.is_config(), "{err}");
        assert!(err.to_string().contains("invalid redis url"), "{err}");
    }

    const SECRET_URL: &str = "redis://user:hunter2@host:notaport/0";

    /// Display and Debug of an error, which must not show a password.
    fn shown(err: &Error) -> String {
        format!("{err} | {err:?}")
    }

    #[test]
    fn a_bad_url_is_named_with_its_password_masked() {
        let err = RedisStore::connect(SECRET_URL).unwrap_err();
        assert!(err.is_config(), "{err}");
        let shown = shown(&err);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            err.to_string().starts_with(
                "invalid configuration: invalid redis url \"redis://user:***@host:notaport/0\""
            ),
            "{err}"
        );
        let config = RedisStoreConfig::default();
        let err = RedisStore::connect_with(SECRET_URL, config).unwrap_err();
        assert!(!self::shown(&err).contains("hunter2"), "{err:?}");
    }

    #[test]
    fn a_bad_cluster_url_is_named_with_its_password_masked() {
        let err = RedisStore::connect_cluster(["redis://:other-secret@127.0.0.1:7000", SECRET_URL])
            .unwrap_err();
        let shown = shown(&err);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("redis://user:***@host:notaport/0"),
            "{shown}"
        );
        // Valid URLs whose passwords differ: the cluster client's reason
        // does not show them either.
        let result = RedisStore::connect_cluster([
            "redis://:s3cret-a@127.0.0.1:7000",
            "redis://:s3cret-b@127.0.0.1:7001",
        ]);
        if let Err(err) = result {
            let shown = self::shown(&err);
            assert!(!shown.contains("s3cret"), "{shown}");
        }
    }

    #[test]
    fn debug_never_shows_a_password() {
        let store = RedisStore::connect("redis://user:hunter2@127.0.0.1:1/0").unwrap();
        let shown = format!("{store:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let cluster = RedisStore::connect_cluster(["redis://:hunter2@127.0.0.1:1/"]).unwrap();
        let shown = format!("{cluster:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[tokio::test]
    async fn connect_errors_never_show_a_password() {
        let store = RedisStore::connect("redis://user:hunter2@127.0.0.1:1/0").unwrap();
        let err = store.get(b"k").await.unwrap_err();
        assert!(!shown(&err).contains("hunter2"), "{err:?}");
    }

    #[test]
    fn urls_are_redacted() {
        for (url, redacted) in [
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            (
                "redis://user:hunter2@host:notaport/0",
                "redis://user:***@host:notaport/0",
            ),
            ("redis://:hunter2@host", "redis://:***@host"),
            ("redis://hunter2@host", "redis://***@host"),
            ("rediss://u:p@ss:w/rd@host/0", "rediss://u:***@host/0"),
            ("user:hunter2@host", "user:***@host"),
            (
                "redis+unix:///tmp/r.sock?db=1&pass=hunter2&x=1",
                "redis+unix:///tmp/r.sock?db=1&pass=***&x=1",
            ),
            (
                "redis+unix:///tmp/r.sock?password=hunter2",
                "redis+unix:///tmp/r.sock?password=***",
            ),
            ("", ""),
        ] {
            assert_eq!(redact_url(url), redacted, "{url}");
        }
        assert_eq!(
            mask_secrets("bad redis://u:hunter2@h and hunter2", "redis://u:hunter2@h"),
            "bad redis://u:***@h and ***"
        );
    }

    #[test]
    fn connections_turn_nagle_off() {
        let info = connection_info("redis://127.0.0.1:6390/2").unwrap();
        assert!(info.tcp_settings().nodelay());
        assert_eq!(info.redis_settings().db(), 2);
    }

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

    #[test]
    fn a_cluster_needs_valid_node_urls() {
        let err = RedisStore::connect_cluster(Vec::<&str>::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: a redis cluster needs at least one node url"
        );
        let err = RedisStore::connect_cluster(["redis://127.0.0.1:7000", "not a url"]).unwrap_err();
        assert!(err.is_config(), "{err}");
        assert!(err.to_string().contains("not a url"), "{err}");
        // Valid URLs make a store without connecting.
        assert!(RedisStore::connect_cluster(["redis://127.0.0.1:1/"]).is_ok());
    }

    #[test]
    fn zero_timeout_is_rejected() {
        let config = RedisStoreConfig::default().response_timeout(Duration::ZERO);
        let err = RedisStore::connect_with("redis://127.0.0.1:1/", config).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: redis response_timeout must be greater than zero"
        );
    }

    #[test]
    fn timeouts_past_a_day_are_rejected() {
        let config = RedisStoreConfig::default().connect_timeout(Duration::MAX);
        let err = RedisStore::connect_with("redis://127.0.0.1:1/", config).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "invalid configuration: redis connect_timeout must be at most 1 day, got {:?}; \
                 use milliseconds to seconds (see RedisStoreConfig's defaults)",
                Duration::MAX
            )
        );
        let config = RedisStoreConfig::default().clock_refresh(Duration::from_secs(86_401));
        assert!(RedisStore::connect_cluster_with(["redis://127.0.0.1:1/"], config).is_err());
    }

    #[tokio::test]
    async fn unreachable_redis_fails_fast_with_a_store_error() {
        // Port 1 on loopback: nothing listens, the connection is refused.
        let store = RedisStore::connect("redis://127.0.0.1:1/").unwrap();
        let err = store.get(b"k").await.unwrap_err();
        assert!(err.is_store(), "{err}");
        // The clock falls back to the system clock until Redis is reached.
        assert!(store.now_ms() > 1_600_000_000_000);
    }
}
