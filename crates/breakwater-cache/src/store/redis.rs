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
//!
//! # Layout
//!
//! This file is [`RedisStore`]: its constructors, its public API and
//! `impl Store`. Below it, each file uses only the ones listed after it:
//!
//! - [`plain`]: a cluster's bulk and single writes as plain pipelines.
//! - [`command`]: one command under its deadline, a script, a revoking
//!   write, one command per hash slot.
//! - [`connection`]: where commands go (`Topology`) and what the handles
//!   share (`RedisCore`): the live connection, reconnecting, the probe, the
//!   background tasks.
//! - [`bus`]: the subscription feed of each channel.
//! - [`clock`]: Redis's clock, sampled with `TIME`.
//! - [`sentinel`]: finding the master, and what a failover may lose.
//! - [`conn`]: the live connection itself, and what its errors mean.
//! - [`slots`]: which node serves which hash slot, for grouping.
//! - [`config`]: [`RedisStoreConfig`] and its validation.
//! - [`tls`]: clients for `redis://` and `rediss://` URLs.
//! - [`url`]: URLs parsed, and shown with their passwords masked.
//! - [`scripts`]: the Lua scripts.
//! - [`latency`]: round trips and the deadlines they call for.

mod bus;
mod check;
mod clock;
mod command;
mod config;
mod conn;
mod connection;
mod index;
mod latency;
mod plain;
mod scripts;
mod sentinel;
mod slots;
mod tls;
mod url;
mod writer;
mod writes;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use self::bus::ChannelFeed;
use self::command::{WRITE_STEP_KEYS, WRITE_STEPS_IN_FLIGHT, wrong_count};
use self::connection::{RedisCore, Topology, hash_slot};
use self::latency::DeadlineKind;
use self::scripts::{
    ACQUIRE_LEASES, BUMP_GENERATION, BUMP_GENERATIONS, CLEAR_NAMESPACE, EXPIRE_ENTRY,
    EXPIRE_GENERATION, EXTEND_LEASE, FENCED_SET, INVALIDATE, LEASE_HELD, PIN, RELEASE_LEASE, RENEW,
    REPLACE, TAG_GENERATIONS, TAG_STATES, run_script,
};
use self::sentinel::Revocation;
use super::namespace::NamespaceState;
use super::{
    ClearedNamespace, FencedRenewal, FencedWrite, Finding, Invalidate, LeaseAttempt, LeaseRequest,
    NamespaceClear, Notice, Renewal, Replace, Store, StoreFuture, Subscription, parse_generation,
    ttl_millis,
};
use crate::error::{Error, ErrorKind};

pub use self::config::RedisStoreConfig;
pub use self::latency::RedisLatency;
pub use self::sentinel::SentinelError;

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
    inner: Arc<RedisCore>,
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
        let target = Topology::node(url, &config)?;
        Ok(Self::with_target(target, config))
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
        let target = Topology::cluster(nodes, &config)?;
        Ok(Self::with_target(target, config))
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
        let target = Topology::sentinel_master(sentinels, master, &config)?;
        Ok(Self::with_target(target, config))
    }

    fn with_target(target: Topology, config: RedisStoreConfig) -> Self {
        RedisStore {
            inner: Arc::new(RedisCore::new(target, config)),
        }
    }
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

impl RedisStore {
    /// Runs `script`, a hard or soft bump of the tag counter `key` (sent
    /// with `fresh` and a TTL of `ttl_ms`), on the counter's node; on a
    /// Sentinel store the master's acknowledgement is remembered as a bump.
    /// The new generation.
    async fn move_on(
        &self,
        script: scripts::Invocation<'_>,
        key: &[u8],
        fresh: u64,
        ttl_ms: u64,
        notice: Notice<'_>,
    ) -> Result<u64, Error> {
        let script = &script;
        let (digits, master) = self
            .inner
            .call(
                DeadlineKind::Write,
                self.inner.domain(key),
                |mut conn| async move {
                    let digits: String = run_script(&mut conn, script).await?;
                    Ok((digits, conn.master().cloned()))
                },
            )
            .await?;
        self.inner
            .acknowledged(master, &[Revocation::bump(key, notice, fresh, ttl_ms)])?;
        generation_reply(&digits)
    }
}

/// A generation a script replied, as digits.
fn generation_reply(digits: &str) -> Result<u64, Error> {
    parse_generation(digits.as_bytes()).ok_or_else(|| {
        Error::new(
            ErrorKind::Store,
            format!("redis answered a tag generation with {digits:?}, not a generation"),
        )
    })
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
    /// Runs `step` once per group of the positions of `writes` (by hash
    /// slot, [`WRITE_STEP_KEYS`] and [`WRITE_STEP_BYTES`](command::WRITE_STEP_BYTES) at most),
    /// [`WRITE_STEPS_IN_FLIGHT`] at a time; `Err` if any step failed (the
    /// others ran to their end).
    async fn in_steps<W, F, Fut>(&self, writes: &[W], step: F) -> Result<(), Error>
    where
        W: plain::PlainWrite,
        F: Fn(Vec<usize>) -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let keys: Vec<&[u8]> = writes.iter().map(W::key).collect();
        let groups = self
            .inner
            .by_slot_in_runs(&keys, WRITE_STEP_KEYS, |i| writes[i].bytes());
        self.steps(groups, step).await
    }

    /// A bulk write on a cluster (`writes`, their keys `keys`, their TTLs
    /// in ms `ttls`): its plain steps (see [`plain`]), then the keys they
    /// handed back written again per slot by `again` (the single-server
    /// path's transaction); `Err` if any step failed.
    async fn on_cluster<W, F, Fut>(
        &self,
        keys: &[&[u8]],
        writes: &[W],
        ttls: &[u64],
        notice: Notice<'_>,
        again: F,
    ) -> Result<(), Error>
    where
        W: plain::PlainWrite + Sync,
        F: Fn(Vec<usize>) -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let (refused, failed) = self.inner.plain_steps(keys, writes, ttls, notice).await;
        // The refused positions grouped by slot, mapped back to `keys`.
        let picked: Vec<&[u8]> = refused.iter().map(|&i| keys[i]).collect();
        let groups = self
            .inner
            .by_slot_in_runs(&picked, WRITE_STEP_KEYS, |j| writes[refused[j]].bytes())
            .into_iter()
            .map(|group| group.into_iter().map(|j| refused[j]).collect())
            .collect();
        let again = self.steps(groups, again).await;
        failed.map_or(again, Err)
    }

    /// Runs `step` once per group, [`WRITE_STEPS_IN_FLIGHT`] at a time;
    /// `Err` if any step failed (the others ran to their end).
    async fn steps<F, Fut>(&self, groups: Vec<Vec<usize>>, step: F) -> Result<(), Error>
    where
        F: Fn(Vec<usize>) -> Fut,
        Fut: Future<Output = Result<(), Error>>,
    {
        let steps: Vec<Fut> = groups.into_iter().map(step).collect();
        let done: Vec<Result<(), Error>> = futures_util::stream::iter(steps)
            .buffer_unordered(WRITE_STEPS_IN_FLIGHT)
            .collect()
            .await;
        done.into_iter().collect()
    }

    /// One step of [`replace_many`](Store::replace_many): the writes at
    /// the positions `group` (one hash slot), their TTLs in ms `ttls` (by
    /// position), as one transaction (`MULTI`, one `SREM` of the leases
    /// from their lease index, a `SET … PX` each, one `PUBLISH`, `EXEC`):
    /// atomic as a script is, at the cost of the plain commands (a script's
    /// Lua turns every argument into a Lua string and back: twice the
    /// server's time). Taken off the index, a lease no longer holds (see
    /// `index`); a `DEL` per lease key cost a third of the server's time.
    async fn replace_group(
        &self,
        writes: &[Replace<'_>],
        ttls: &[u64],
        group: Vec<usize>,
        notice: Notice<'_>,
    ) -> Result<(), Error> {
        let mut tx = redis::Pipeline::with_capacity(group.len() + 2);
        tx.atomic();
        index::unlist(
            &mut tx,
            |i| writes[i].lease_key,
            &group,
            self.inner.is_cluster(),
        );
        for &i in &group {
            tx.add_command(plain::set_px(&writes[i], ttls[i])).ignore();
        }
        let revoked = group.iter().map(|&i| (writes[i].key, writes[i].lease_key));
        self.revoking_step(tx, revoked, notice).await
    }

    /// One step of [`invalidate_many`](Store::invalidate_many): the keys
    /// at the positions `group` (one hash slot) deleted in one `DEL`, their
    /// leases taken off their index in one `SREM` (as in
    /// [`replace_group`](Self::replace_group)), as one transaction with the
    /// notice.
    async fn invalidate_group(
        &self,
        keys: &[Invalidate<'_>],
        group: Vec<usize>,
        notice: Notice<'_>,
    ) -> Result<(), Error> {
        let mut tx = redis::pipe();
        tx.atomic();
        let del = tx.cmd("DEL");
        for &i in &group {
            del.arg(keys[i].key);
        }
        del.ignore();
        index::unlist(
            &mut tx,
            |i| keys[i].lease_key,
            &group,
            self.inner.is_cluster(),
        );
        let revoked = group.iter().map(|&i| (keys[i].key, keys[i].lease_key));
        self.revoking_step(tx, revoked, notice).await
    }

    /// Runs `tx`, a transaction of revoking writes on the keys (with their
    /// leases) `revoked`, all of one hash slot, with one `PUBLISH` of the
    /// notice naming them appended. On a Sentinel store each key is
    /// remembered as an invalidation of its own, to apply again should a
    /// failover lose the step.
    async fn revoking_step<'k>(
        &self,
        mut tx: redis::Pipeline,
        revoked: impl Iterator<Item = (&'k [u8], &'k [u8])> + Clone,
        notice: Notice<'_>,
    ) -> Result<(), Error> {
        let message = notice.for_keys(revoked.clone().map(|(key, _)| key));
        tx.cmd("PUBLISH").arg(notice.channel).arg(&message).ignore();
        let Some((first, _)) = revoked.clone().next() else {
            return Ok(());
        };
        let tx = &tx;
        let master = self
            .inner
            .call(
                DeadlineKind::Write,
                self.inner.domain(first),
                |mut conn| async move {
                    conn.transaction(tx, hash_slot(first)).await?;
                    Ok(conn.master().cloned())
                },
            )
            .await?;
        // Only a Sentinel store names the master that acknowledged it.
        if master.is_none() {
            return Ok(());
        }
        let singles: Vec<(&[u8], &[u8], Vec<u8>)> = revoked
            .map(|(key, lease)| (key, lease, notice.for_keys([key])))
            .collect();
        let revocations: Vec<Revocation<'_>> = singles
            .iter()
            .map(|(key, lease, message)| Revocation::new(key, lease, notice.with_message(message)))
            .collect();
        self.inner.acknowledged(master, &revocations)
    }

    /// The key of the lease index that names `lease` when it is held (see
    /// [`index`]).
    fn lease_index(&self, lease: &[u8]) -> Vec<u8> {
        index::index_key(lease, self.inner.is_cluster())
    }

    /// [`Store::get`], unboxed: the cache calls it directly on the hit
    /// path when its store is a `RedisStore`.
    pub(crate) async fn get_unboxed(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        // Sized up front: the command's buffer is not grown for the key.
        let mut get = redis::Cmd::with_capacity(2, 3 + key.len());
        get.arg("GET").arg(key);
        self.inner.query(DeadlineKind::Read, key, &get).await
    }

    /// One `MGET` of `keys`, unboxed: on a single server (or a Sentinel's
    /// primary), where any keys share one command
    /// ([`batches_reads`](Store::batches_reads)); the cache reads a tagged
    /// entry and its tags' counters so.
    pub(crate) async fn get_many_unboxed(
        &self,
        keys: &[&[u8]],
    ) -> Result<Vec<Option<Vec<u8>>>, Error> {
        let mut mget = redis::Cmd::with_capacity(
            1 + keys.len(),
            4 + keys.iter().map(|key| key.len()).sum::<usize>(),
        );
        mget.arg("MGET");
        for key in keys {
            mget.arg(*key);
        }
        self.inner.query(DeadlineKind::Read, keys[0], &mget).await
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
                    DeadlineKind::Write,
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
                .query(DeadlineKind::Write, key, redis::cmd("DEL").arg(key))
                .await?;
            Ok(removed > 0)
        })
    }

    fn ttl<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        Box::pin(async move {
            let ms: i64 = self
                .inner
                .query(DeadlineKind::Read, key, redis::cmd("PTTL").arg(key))
                .await?;
            // -2: no such key; -1: no expiry.
            Ok(u64::try_from(ms).ok().map(Duration::from_millis))
        })
    }

    /// Redis's clock, from the last `TIME` sample plus the local time elapsed
    /// since. Before the first connection it falls back to the system clock.
    fn now_ms(&self) -> u64 {
        // Not recorded: the first sample replaces it entirely.
        self.inner
            .clock
            .now_ms()
            .unwrap_or_else(|| self.inner.config.wall_clock.unix_ms())
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

    /// 3 × the recent *answered* round trips of `key`'s failure domain,
    /// within `response_timeout` and `max_response_timeout` (see
    /// [`RedisLatency::soft_deadline`]): a stall (timeouts, no answers)
    /// leaves it where the last answers put it.
    fn soft_deadline(&self, key: &[u8]) -> Duration {
        let core = &self.inner;
        core.latency.soft_deadline(core.domain(key))
    }

    /// The write deadline in force, in the slowest failure domain.
    fn write_deadline(&self) -> Duration {
        self.latency().write_deadline
    }

    /// One for a single server; for a cluster, one per 256 consecutive hash
    /// slots (64 in all): nodes own ranges of slots, so a failed node's
    /// keys fall into its own domains.
    fn failure_domains(&self) -> usize {
        self.inner.target.failure_domains()
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
                .eval(
                    ACQUIRE_LEASES
                        .key(self.lease_index(lease_key))
                        .key(lease_key)
                        .arg(ms)
                        .arg(token),
                )
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
        Box::pin(self.inner.per_slot(keys, "an MGET", move |group| {
            let mut mget = redis::cmd("MGET");
            for &i in group {
                mget.arg(keys[i]);
            }
            let first = keys[group[0]];
            async move { self.inner.query(DeadlineKind::Read, first, &mget).await }
        }))
    }

    /// One script (per 256 leases of one lease index) on a single server;
    /// on a cluster one per hash slot, side by side.
    fn acquire_leases<'a>(
        &'a self,
        leases: &'a [LeaseRequest<'a>],
        ttl: Duration,
    ) -> StoreFuture<'a, Vec<LeaseAttempt>> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            let keys: Vec<&[u8]> = leases.iter().map(|l| l.key).collect();
            let left: Vec<i64> = self
                .inner
                .per_slot(&keys, "a lease script", |group| {
                    let runs =
                        index::runs_by_index(|i| leases[i].key, group, self.inner.is_cluster());
                    let count = group.len();
                    async move {
                        let mut left: Vec<i64> = Vec::with_capacity(count);
                        for (index, run) in runs {
                            let mut script = ACQUIRE_LEASES.key(index).arg(ms);
                            for &i in &run {
                                script = script.key(leases[i].key).arg(leases[i].token);
                            }
                            let more: Vec<i64> = self.inner.eval(script).await?;
                            left.extend(more);
                        }
                        Ok(left)
                    }
                })
                .await?;
            Ok(left.into_iter().map(lease_attempt).collect())
        })
    }

    fn lease_held<'a>(&'a self, lease_key: &'a [u8]) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            let held: i64 = self
                .inner
                .eval(LEASE_HELD.key(lease_key).key(self.lease_index(lease_key)))
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
                .eval(
                    EXTEND_LEASE
                        .key(lease_key)
                        .key(self.lease_index(lease_key))
                        .arg(token)
                        .arg(ms),
                )
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
                        .key(self.lease_index(lease_key))
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
                .key(self.lease_index(write.lease_key))
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

    fn expire_entry<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        Box::pin(async move {
            // Remembered on a Sentinel store as an invalidation would be
            // (applied again, as one, on a master that lost it).
            let script = EXPIRE_ENTRY
                .key(key)
                .key(lease_key)
                .arg(&at_ms.to_be_bytes()[..])
                .arg(notice.channel)
                .arg(notice.message);
            let found = self
                .inner
                .revoke(script, &[Revocation::new(key, lease_key, notice)])
                .await?;
            Ok(found == 1)
        })
    }

    fn fenced_renew<'a>(&'a self, renewal: FencedRenewal<'a>) -> StoreFuture<'a, Renewal> {
        Box::pin(async move {
            let ms = ttl_millis(renewal.ttl)?;
            let renewed: i64 = self
                .inner
                .eval(
                    RENEW
                        .key(renewal.key)
                        .key(renewal.lease_key)
                        .key(self.lease_index(renewal.lease_key))
                        .arg(renewal.token)
                        .arg(renewal.offset)
                        .arg(renewal.expected)
                        .arg(renewal.patch)
                        .arg(ms)
                        .arg(renewal.notice.channel)
                        .arg(renewal.notice.message),
                )
                .await?;
            Ok(match renewed {
                1 => Renewal::Renewed,
                2 => Renewal::Declined,
                _ => Renewal::Refused,
            })
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

    /// The `REPLACE` script; on a cluster a plain pipeline of the same
    /// commands (see [`plain`]; with others in flight, combined with
    /// theirs, see [`writes`]), the script only if Redis refused one.
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
            if self.inner.is_cluster() {
                let write = Replace {
                    key,
                    value,
                    ttl,
                    lease_key,
                };
                // Others in flight: queued, to go out with theirs (see
                // `writes`).
                let (_writing, alone) = self.inner.writes.enter();
                let queued = match notice.batch_head {
                    Some(head) if !alone => {
                        self.inner.replace_queued(&write, ms, notice, head).await
                    }
                    _ => None,
                };
                let landed = match queued {
                    Some(landed) => landed?,
                    None => self.inner.replace_plain(write, ms, notice).await?,
                };
                if landed {
                    return Ok(());
                }
            }
            let script = REPLACE
                .key(key)
                .key(lease_key)
                .arg(value)
                .arg(ms)
                .arg(notice.channel)
                .arg(notice.message);
            self.inner
                .revoke(script, &[Revocation::new(key, lease_key, notice)])
                .await
                .map(drop)
        })
    }

    /// One transaction per 1,024 writes, a bounded number of them in
    /// flight; each revokes its writes' leases, writes the values and
    /// publishes one message. On a cluster, where a transaction keeps to
    /// one hash slot, one plain pipeline per node instead (see [`plain`]).
    fn replace_many<'a>(
        &'a self,
        writes: &'a [Replace<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let ttls = writes
                .iter()
                .map(|w| ttl_millis(w.ttl))
                .collect::<Result<Vec<u64>, Error>>()?;
            let ttls = &ttls;
            let keys: Vec<&[u8]> = writes.iter().map(|w| w.key).collect();
            if self.inner.is_cluster() {
                return self
                    .on_cluster(&keys, writes, ttls, notice, |group| {
                        self.replace_group(writes, ttls, group, notice)
                    })
                    .await;
            }
            self.in_steps(writes, |group| {
                self.replace_group(writes, ttls, group, notice)
            })
            .await
        })
    }

    /// One transaction per 1,024 keys, a bounded number in flight: one
    /// `DEL` of the keys, one `SREM` revoking their leases, one message. On
    /// a cluster one plain pipeline per node (see [`plain`]).
    fn invalidate_many<'a>(
        &'a self,
        keys: &'a [Invalidate<'a>],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let stored: Vec<&[u8]> = keys.iter().map(|k| k.key).collect();
            if self.inner.is_cluster() {
                return self
                    .on_cluster(&stored, keys, &[], notice, |group| {
                        self.invalidate_group(keys, group, notice)
                    })
                    .await;
            }
            self.in_steps(keys, |group| self.invalidate_group(keys, group, notice))
                .await
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
                .revoke(script, &[Revocation::new(key, lease_key, notice)])
                .await
                .map(drop)
        })
    }

    fn check<'a>(&'a self, probe: &'a [u8], channel: &'a [u8]) -> StoreFuture<'a, Vec<Finding>> {
        Box::pin(async move { Ok(self.inner.findings(probe, channel).await) })
    }

    /// One script. On a Sentinel store the master's acknowledgement is
    /// remembered, and the record put back on the next master should a
    /// failover lose it (unless that master holds a later one); a pin's
    /// too.
    fn clear_namespace<'a>(
        &'a self,
        clear: NamespaceClear<'a>,
    ) -> StoreFuture<'a, ClearedNamespace> {
        Box::pin(async move {
            let script = &CLEAR_NAMESPACE
                .key(clear.key)
                .arg(clear.notice.channel)
                .arg(clear.notice.message)
                .arg(clear.fresh)
                .arg(u8::from(clear.hard))
                .arg(clear.window_ms)
                .arg(self.now_ms())
                .arg(u8::from(clear.pin))
                .arg(clear.restore.unwrap_or_default());
            let ((record, receivers), master): ((Vec<u8>, u64), _) = self
                .inner
                .call(
                    DeadlineKind::Write,
                    self.inner.domain(clear.key),
                    |mut conn| async move {
                        let reply = run_script(&mut conn, script).await?;
                        Ok((reply, conn.master().cloned()))
                    },
                )
                .await?;
            if NamespaceState::parse(&record).is_none() {
                return Err(Error::new(
                    ErrorKind::Store,
                    "redis answered a namespace clear with something that is not a clear record",
                ));
            }
            self.inner.acknowledged(
                master,
                &[Revocation::restore(clear.key, clear.notice, &record)],
            )?;
            Ok(ClearedNamespace { record, receivers })
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
            let script = BUMP_GENERATION
                .key(key)
                .arg(notice.channel)
                .arg(notice.message)
                .arg(fresh)
                .arg(ms);
            self.move_on(script, key, fresh, ms, notice).await
        })
    }

    /// One script per hash slot of the counters (one, on a single
    /// server), side by side, each publishing the notice. On a Sentinel
    /// store each bump is remembered as `bump_generation`'s is.
    fn bump_generations<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            if keys.is_empty() {
                return Ok(());
            }
            let ms = ttl_millis(ttl)?;
            let _: Vec<String> = self
                .inner
                .per_slot(keys, "a tag bump script", |group| {
                    let mut script = BUMP_GENERATIONS
                        .key(keys[group[0]])
                        .arg(notice.channel)
                        .arg(notice.message)
                        .arg(fresh)
                        .arg(ms);
                    for &i in &group[1..] {
                        script = script.key(keys[i]);
                    }
                    let (first, group) = (keys[group[0]], group.to_vec());
                    async move {
                        let script = &script;
                        let (digits, master) = self
                            .inner
                            .call(
                                DeadlineKind::Write,
                                self.inner.domain(first),
                                |mut conn| async move {
                                    let digits: Vec<String> = run_script(&mut conn, script).await?;
                                    Ok((digits, conn.master().cloned()))
                                },
                            )
                            .await?;
                        let bumps: Vec<Revocation<'_>> = group
                            .iter()
                            .map(|&i| Revocation::bump(keys[i], notice, fresh, ms))
                            .collect();
                        self.inner.acknowledged(master, &bumps)?;
                        Ok(digits)
                    }
                })
                .await?;
            Ok(())
        })
    }

    /// One script on the counter's node, publishing atomically as
    /// [`bump_generation`](Store::bump_generation) does. On a Sentinel
    /// store it is remembered as a bump and applied again as one (a hard
    /// bump: stricter, never wrong) should a failover lose it, as `expire`
    /// is applied again as an invalidation.
    fn expire_generation<'a>(
        &'a self,
        key: &'a [u8],
        fresh: u64,
        ttl: Duration,
        at_ms: u64,
        notice: Notice<'a>,
    ) -> StoreFuture<'a, u64> {
        Box::pin(async move {
            let ms = ttl_millis(ttl)?;
            let script = EXPIRE_GENERATION
                .key(key)
                .arg(notice.channel)
                .arg(notice.message)
                .arg(fresh)
                .arg(ms)
                .arg(at_ms);
            self.move_on(script, key, fresh, ms, notice).await
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
                .inner
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

    /// As [`tag_generations`](Store::tag_generations): one script (per
    /// 256 counters) on a single server; on a cluster one per hash slot.
    fn tag_states<'a>(
        &'a self,
        keys: &'a [&'a [u8]],
        fresh: u64,
        ttl: Duration,
        now_ms: u64,
    ) -> StoreFuture<'a, Vec<Vec<u8>>> {
        Box::pin(async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            let ms = ttl_millis(ttl)?;
            let states: Vec<Vec<u8>> = self
                .inner
                .per_slot(keys, "a tag states script", |group| {
                    let mut script = TAG_STATES
                        .key(keys[group[0]])
                        .arg(fresh)
                        .arg(ms)
                        .arg(now_ms.max(1));
                    for &i in &group[1..] {
                        script = script.key(keys[i]);
                    }
                    async move { self.inner.eval(script).await }
                })
                .await?;
            Ok(states)
        })
    }

    fn publish<'a>(&'a self, channel: &'a [u8], message: &'a [u8]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.inner
                .query::<i64>(
                    DeadlineKind::Write,
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
            .or_insert_with(|| ChannelFeed::new(&self.inner.lost_tasks));
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
                        feed.renew();
                    }
                    inner.keep_subscribed(&owned, feed);
                }
            }
        };
        feed.subscription().kept_by(Arc::new(keeper))
    }
}

impl RedisStore {
    /// The round trip of the clock sample in use, or `None` before the first
    /// connection. Redis's clock is known to within half of it.
    pub fn clock_uncertainty(&self) -> Option<Duration> {
        self.inner.clock.uncertainty()
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
