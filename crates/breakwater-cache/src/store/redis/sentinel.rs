//! Redis Sentinel: the store's connections go to the master the sentinels
//! name, and follow it through a failover.
//!
//! # Finding the master
//!
//! Each connection attempt asks the sentinels, all at once,
//! `SENTINEL GET-MASTER-ADDR-BY-NAME <name>` (one cached connection per
//! sentinel) and takes the first address given; then it connects there and
//! checks with `ROLE`, on that very connection, that the server is a master.
//! Nothing reconnects to a remembered address: a broken connection, or a
//! write refused with `READONLY`/`MASTERDOWN` (the master was demoted), is
//! dropped and the next one is made through the sentinels again. The
//! pub/sub subscription (fill and invalidation notices) goes to the master
//! found the same way. Failures are typed ([`SentinelError`]): no sentinel
//! answered, none knows the name, or the server named is not a master.
//!
//! This is done here rather than with redis-rs's `sentinel` module: its
//! `SentinelClient` hands out a client for the master of the moment, so the
//! reconnecting, the deadlines and the errors would still be ours; its
//! lookup lists every master (`SENTINEL MASTERS`) and checks the role on a
//! connection of its own, without a connect timeout, and it reports an
//! unknown name and a master in the middle of a failover as the same error.
//! One command per sentinel, under the store's deadlines, is less code
//! than adapting it (and the feature would add `log` and a second `rand`).
//!
//! # Following a failover
//!
//! A background task asks the sentinels every `subscription_ping`; when
//! they name another master, the command connection and the subscription
//! are dropped at once (the subscription's drop marks L1 unverified) and
//! the reconnect skips its backoff. Waiting for the old master to drop its
//! clients is not enough: after `SENTINEL FAILOVER`, or a partition, it
//! stays up and accepts writes until the sentinels demote it (measured:
//! 10 s after the promotion).
//!
//! # Revocations a failover may lose
//!
//! Replication is asynchronous: the old master's last acknowledged writes,
//! and all it acknowledged after the promotion, are lost. A lost
//! revocation (an invalidation, `set`'s replace, a tag's generation
//! bump, or a namespace clear) would bring the old value back, fresh until
//! its TTL. So each one is remembered in a ledger
//! with the master that acknowledged it, for [`REPLAY_WINDOW`] plus twice
//! `subscription_ping` (at most [`REPLAY_CAP`]; a former master's wait for
//! the replay however old), and the first connection to a new master
//! applies the former masters' again, as invalidations with their notices
//! (bumps as bumps; a clear by putting its record back unless the new
//! master holds a later one), before any call can use it. The ledger also records which master is
//! believed in: a revocation acknowledged by another one (the store has
//! moved on since it was sent) is refused, under the same lock, so each
//! revocation is either replayed or reported as failed. The resulting
//! bound is documented on
//! [`RedisStore::connect_sentinel`](crate::RedisStore::connect_sentinel).

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::config::RedisStoreConfig;
use super::conn::{MasterAddr, store_error};
use super::scripts::{BUMP_GENERATION, INVALIDATE, RESTORE_RECORD};
use super::tls;
use super::url::{connection_info, mask_secrets, redact_url};
use crate::background::Supervised;
use crate::error::{ConfigError, Error, ErrorKind};
use crate::store::Notice;

/// How long, at least, a revocation is remembered for a replay on the next
/// master (plus twice `subscription_ping`).
pub(super) const REPLAY_WINDOW: Duration = Duration::from_secs(10);
/// The most revocations remembered.
pub(super) const REPLAY_CAP: usize = 100_000;
/// Revocations applied again per pipeline.
const REPLAY_BATCH: usize = 1000;

/// Why the master of a Sentinel-managed Redis could not be found.
///
/// It is the source of a [`Store`](ErrorKind::Store) error; find it in an
/// error's source chain with [`SentinelError::find`].
///
/// # Examples
///
/// ```no_run
/// use breakwater_cache::{RedisStore, SentinelError};
///
/// # async fn run() -> Result<(), breakwater_cache::Error> {
/// let store = RedisStore::connect_sentinel(["redis://10.0.0.1:26379"], "mymaster")?;
/// if let Err(err) = store.warm_up().await {
///     match SentinelError::find(&err) {
///         Some(SentinelError::UnknownMaster { name, .. }) => eprintln!("no master {name:?}"),
///         Some(other) => eprintln!("sentinel: {other}"),
///         None => eprintln!("redis: {err}"),
///     }
/// }
/// # Ok(()) }
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentinelError {
    /// No sentinel answered in time.
    Unreachable {
        /// Each sentinel's address and why it did not answer.
        failures: Vec<String>,
    },
    /// The sentinels that answered monitor no master of this name.
    UnknownMaster {
        /// The master name asked for.
        name: String,
        /// How many sentinels answered.
        answered: usize,
        /// How many were asked.
        asked: usize,
    },
    /// The server the sentinels name is not a master (a failover is in
    /// progress, or the sentinels are out of date).
    NotMaster {
        /// The master name asked for.
        name: String,
        /// The address the sentinels gave.
        addr: String,
        /// What the server says it is (`replica`, `sentinel`).
        role: String,
    },
    /// The server the sentinels name could not be reached.
    MasterUnreachable {
        /// The master name asked for.
        name: String,
        /// The address the sentinels gave.
        addr: String,
        /// Why.
        reason: String,
    },
}

impl SentinelError {
    /// The `SentinelError` in `err` or its sources, if any.
    pub fn find<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a SentinelError> {
        let mut next = Some(err);
        while let Some(err) = next {
            if let Some(found) = err.downcast_ref::<SentinelError>() {
                return Some(found);
            }
            next = err.source();
        }
        None
    }
}

impl fmt::Display for SentinelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SentinelError::Unreachable { failures } => {
                write!(f, "no redis sentinel answered ({})", failures.join("; "))
            }
            SentinelError::UnknownMaster {
                name,
                answered,
                asked,
            } => write!(
                f,
                "no redis sentinel monitors a master named {name:?} ({answered} of {asked} \
                 sentinels answered); check the name in the sentinels' `sentinel monitor` lines"
            ),
            SentinelError::NotMaster { name, addr, role } => write!(
                f,
                "the redis sentinels name {addr} as master {name:?}, but it answers as a {role} \
                 (a failover may be in progress)"
            ),
            SentinelError::MasterUnreachable { name, addr, reason } => write!(
                f,
                "the redis sentinels name {addr} as master {name:?}, but it cannot be reached: \
                 {reason}"
            ),
        }
    }
}

impl std::error::Error for SentinelError {}

/// A revocation (invalidation or replace, a tag's generation bump, or a
/// namespace clear) to remember: its keys and notice.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Revocation<'a> {
    key: &'a [u8],
    lease_key: &'a [u8],
    notice: Notice<'a>,
    again: Again<'a>,
}

/// How a remembered revocation is applied again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Again<'a> {
    /// As an invalidation: the value and its lease deleted.
    Invalidate,
    /// A generation bump (`key` is the counter; no lease), with its fresh
    /// value and TTL in ms: applied again as a bump, never as a delete (a
    /// deleted counter would invalidate every entry of the tag, not only
    /// those from before the bump).
    Bump(u64, u64),
    /// A namespace clear (`key` is the clear record): the record written
    /// is put back unless the new master holds a later one (see
    /// `RESTORE_RECORD`), and published after the notice's message.
    Restore(&'a [u8]),
}

impl<'a> Revocation<'a> {
    pub(crate) fn new(key: &'a [u8], lease_key: &'a [u8], notice: Notice<'a>) -> Self {
        Revocation {
            key,
            lease_key,
            notice,
            again: Again::Invalidate,
        }
    }

    /// A clear that wrote `record` under `key`.
    pub(crate) fn restore(key: &'a [u8], notice: Notice<'a>, record: &'a [u8]) -> Self {
        Revocation {
            key,
            lease_key: &[],
            notice,
            again: Again::Restore(record),
        }
    }

    /// A bump of the generation counter `key`, with the fresh value and
    /// the TTL (ms) it was sent with.
    pub(crate) fn bump(key: &'a [u8], notice: Notice<'a>, fresh: u64, ttl_ms: u64) -> Self {
        Revocation {
            key,
            lease_key: &[],
            notice,
            again: Again::Bump(fresh, ttl_ms),
        }
    }
}

/// A remembered revocation.
#[derive(Debug)]
struct Revoked {
    seq: u64,
    at: Instant,
    master: MasterAddr,
    key: Vec<u8>,
    lease_key: Vec<u8>,
    channel: Vec<u8>,
    message: Vec<u8>,
    /// Applied again as a generation bump (its fresh value, TTL in ms).
    bump: Option<(u64, u64)>,
    /// Applied again by putting this clear record back.
    record: Option<Vec<u8>>,
}

/// The master this store believes in, and the revocations to apply again
/// should it be replaced.
#[derive(Debug, Default)]
struct Ledger {
    master: Option<MasterAddr>,
    revoked: VecDeque<Revoked>,
    next_seq: u64,
    /// Revocations forgotten past [`REPLAY_CAP`] since the last warning.
    forgotten: u64,
}

/// One sentinel: where it is, and a connection to it once made.
struct SentinelNode {
    client: redis::Client,
    addr: String,
    conn: Mutex<Option<MultiplexedConnection>>,
}

/// The sentinels of a store, the master's name and settings, and what the
/// store knows of the master.
pub(crate) struct Sentinel {
    name: String,
    nodes: Vec<SentinelNode>,
    /// The master's connection settings (user, password, database, TLS);
    /// its address is the sentinels' answer.
    master_info: ConnectionInfo,
    /// Passwords in the URLs given, masked in every message.
    secrets: Vec<String>,
    ledger: Mutex<Ledger>,
    /// The master believed in, for the tasks that follow it.
    named: watch::Sender<Option<MasterAddr>>,
    /// Cuts the reconnect backoff short when a new master is named.
    renamed: Notify,
    /// The task that follows the master (`connection::run_master_watch`,
    /// with [`check`](Self::check)).
    pub(super) watcher: Supervised,
    /// How long the current master's revocations are remembered.
    retention: Duration,
}

impl Sentinel {
    /// The sentinels at `sentinels` (URLs, each `redis://[:password@]host:port`),
    /// watching the master `master`: its name, or a URL whose host is its
    /// name and which carries its user, password and database
    /// (`redis://user:password@mymaster/2`).
    pub(crate) fn new<I, S>(
        sentinels: I,
        master: &str,
        config: &RedisStoreConfig,
    ) -> Result<Sentinel, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        tls::refuse_for_sentinel(master, &config.tls)?;
        let (name, master_info) = parse_master(master)?;
        let mut secrets = Vec::new();
        let mut nodes = Vec::new();
        for url in sentinels {
            let url = url.as_ref();
            tls::refuse_for_sentinel(url, &config.tls)?;
            let client = tls::node_client(url, &config.tls)?;
            let info = client.get_connection_info();
            if info.redis_settings().db() != 0 {
                return Err(ConfigError::new(format!(
                    "redis sentinel url {:?} selects database {}: sentinels have no databases; \
                     give the database in the master's url (redis://:password@{name}/{})",
                    redact_url(url),
                    info.redis_settings().db(),
                    info.redis_settings().db(),
                ))
                .into());
            }
            secrets.extend(info.redis_settings().password().map(str::to_owned));
            nodes.push(SentinelNode {
                addr: info.addr().to_string(),
                client,
                conn: Mutex::new(None),
            });
        }
        if nodes.is_empty() {
            return Err(ConfigError::new("redis sentinel needs at least one sentinel url").into());
        }
        secrets.extend(master_info.redis_settings().password().map(str::to_owned));
        secrets.retain(|s| !s.is_empty());
        Ok(Sentinel {
            name,
            nodes,
            master_info,
            secrets,
            ledger: Mutex::default(),
            named: watch::Sender::new(None),
            renamed: Notify::new(),
            watcher: Supervised::default(),
            retention: REPLAY_WINDOW.saturating_add(config.subscription_ping.saturating_mul(2)),
        })
    }

    /// The master's name.
    pub(crate) fn master_name(&self) -> &str {
        &self.name
    }

    /// The sentinels' addresses (no passwords).
    pub(crate) fn addrs(&self) -> Vec<&str> {
        self.nodes.iter().map(|n| n.addr.as_str()).collect()
    }

    /// `text` with every password given masked.
    fn scrub(&self, text: &str) -> String {
        self.secrets
            .iter()
            .fold(text.to_owned(), |text, secret| text.replace(secret, "***"))
    }

    /// Asks one sentinel for the master's address (`None`: it does not know
    /// the name); the error is a reason to show.
    async fn ask(
        &self,
        node: &SentinelNode,
        config: &RedisStoreConfig,
        budget: Duration,
    ) -> Result<Option<(String, u16)>, String> {
        let cached = node.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut conn = match cached {
            Some(conn) => conn,
            None => {
                let conn = node
                    .client
                    .get_multiplexed_async_connection_with_config(&connection_config(
                        config, budget,
                    ))
                    .await
                    .map_err(|e| format!("{}: {}", node.addr, self.scrub(&e.to_string())))?;
                *node.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn.clone());
                conn
            }
        };
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.name)
            .query_async(&mut conn)
            .await
            .map_err(|e| {
                if !matches!(e.kind(), redis::ErrorKind::Server(_)) {
                    // Not an answer: the connection may be dead.
                    *node.conn.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                format!("{}: {}", node.addr, self.scrub(&e.to_string()))
            })
    }

    /// The master's address as the first sentinel to answer with one gives
    /// it, asking every sentinel at once, by `deadline`.
    async fn master_addr(
        &self,
        config: &RedisStoreConfig,
        budget: Duration,
        deadline: Instant,
    ) -> Result<(String, u16), SentinelError> {
        let mut asks: FuturesUnordered<_> = self
            .nodes
            .iter()
            .map(|node| async move {
                match tokio::time::timeout_at(deadline, self.ask(node, config, budget)).await {
                    Ok(answer) => answer,
                    Err(_) => Err(format!("{}: no answer in time", node.addr)),
                }
            })
            .collect();
        let (mut answered, mut failures) = (0, Vec::new());
        while let Some(answer) = asks.next().await {
            match answer {
                Ok(Some(addr)) => return Ok(addr),
                Ok(None) => answered += 1,
                Err(reason) => failures.push(reason),
            }
        }
        if answered == 0 {
            return Err(SentinelError::Unreachable { failures });
        }
        Err(SentinelError::UnknownMaster {
            name: self.name.clone(),
            answered,
            asked: self.nodes.len(),
        })
    }

    /// A connection to the master the sentinels name, checked with `ROLE`,
    /// and its address (now the master believed in). `budget` is what a
    /// single server's connection and handshake get (the store's handshake
    /// budget, which follows the latency it sees); the lookup makes two
    /// (a sentinel's, then the master's) and gets twice that.
    pub(crate) async fn connect_master(
        &self,
        config: &RedisStoreConfig,
        budget: Duration,
    ) -> Result<(MultiplexedConnection, MasterAddr), Error> {
        let deadline = Instant::now() + lookup_time(budget);
        let (conn, master) = self.verified_master(config, budget, deadline).await?;
        self.believe(&master);
        Ok((conn, master))
    }

    /// A client for the master the sentinels name (checked with `ROLE`), for
    /// the subscription, and its address; within `budget`, as
    /// [`connect_master`](Self::connect_master).
    pub(crate) async fn subscription_client(
        &self,
        config: &RedisStoreConfig,
        budget: Duration,
    ) -> Result<(redis::Client, MasterAddr), Error> {
        let deadline = Instant::now() + lookup_time(budget);
        let (_, master) = self.verified_master(config, budget, deadline).await?;
        self.believe(&master);
        let client = redis::Client::open(self.master_info_at(&master)?).map_err(store_error)?;
        Ok((client, master))
    }

    /// Asks the sentinels, connects to the master they name and checks
    /// that it is one.
    async fn verified_master(
        &self,
        config: &RedisStoreConfig,
        budget: Duration,
        deadline: Instant,
    ) -> Result<(MultiplexedConnection, MasterAddr), Error> {
        let lookup = |err: SentinelError| {
            Error::new(ErrorKind::Store, "redis sentinel lookup failed").with_source(err)
        };
        let (host, port) = self
            .master_addr(config, budget, deadline)
            .await
            .map_err(lookup)?;
        let master: MasterAddr = Arc::from(format!("{host}:{port}"));
        let unreachable = |reason: String| {
            lookup(SentinelError::MasterUnreachable {
                name: self.name.clone(),
                addr: master.to_string(),
                reason,
            })
        };
        let client = redis::Client::open(self.master_info_at(&master)?)
            .map_err(|e| unreachable(self.scrub(&e.to_string())))?;
        let connect = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&connection_config(config, budget))
                .await?;
            let role: redis::Role = redis::cmd("ROLE").query_async(&mut conn).await?;
            Ok::<_, redis::RedisError>((conn, role))
        };
        let (conn, role) = tokio::time::timeout_at(deadline, connect)
            .await
            .map_err(|_| unreachable("no answer in time".to_owned()))?
            .map_err(|e| unreachable(self.scrub(&e.to_string())))?;
        let role = match role {
            redis::Role::Primary { .. } => return Ok((conn, master)),
            redis::Role::Replica { .. } => "replica",
            redis::Role::Sentinel { .. } => "sentinel",
            _ => "server of an unknown role",
        };
        Err(lookup(SentinelError::NotMaster {
            name: self.name.clone(),
            addr: master.to_string(),
            role: role.to_owned(),
        }))
    }

    /// The master's connection settings at `master` (`host:port`).
    fn master_info_at(&self, master: &MasterAddr) -> Result<ConnectionInfo, Error> {
        let bad = || {
            Error::new(
                ErrorKind::Store,
                format!("the redis sentinels gave an address that is not host:port: {master:?}"),
            )
        };
        let (host, port) = master.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host.to_owned();
        let addr = match self.master_info.addr().clone() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                tls_params,
            },
            _ => ConnectionAddr::Tcp(host, port),
        };
        Ok(self.master_info.clone().set_addr(addr))
    }

    /// From now on `master` is the master: revocations acknowledged by
    /// another do not count. Wakes the tasks that follow the master, and a
    /// reconnect that is backing off, if it is a new one.
    fn believe(&self, master: &MasterAddr) {
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        if ledger.master.as_ref() == Some(master) {
            return;
        }
        if let Some(old) = &ledger.master {
            tracing::warn!(from = %old, to = %master, name = %self.name, "the redis sentinels name a new master");
        }
        ledger.master = Some(Arc::clone(master));
        self.named.send_replace(Some(Arc::clone(master)));
        drop(ledger);
        self.renamed.notify_one();
    }

    /// The master believed in.
    pub(crate) fn believed(&self) -> Option<MasterAddr> {
        self.named.borrow().clone()
    }

    /// The master believed in, as it changes.
    pub(crate) fn named(&self) -> watch::Receiver<Option<MasterAddr>> {
        self.named.subscribe()
    }

    /// Asks the sentinels, within `budget`, which master they name now,
    /// and believes it (see [`believe`](Self::believe)); a failed check
    /// changes nothing. The store's watcher runs it every
    /// `subscription_ping`.
    pub(crate) async fn check(&self, config: &RedisStoreConfig, budget: Duration) {
        let deadline = Instant::now() + budget;
        match self.master_addr(config, budget, deadline).await {
            Ok((host, port)) => self.believe(&Arc::from(format!("{host}:{port}"))),
            Err(err) => tracing::debug!(error = %err, "redis sentinel check failed"),
        }
    }

    /// Resolves once a master other than `master` is believed in.
    pub(crate) async fn moved_from(&self, master: &MasterAddr) {
        let mut named = self.named.subscribe();
        if named
            .wait_for(|m| m.as_ref() != Some(master))
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves when a new master is named (or was, since the last call).
    pub(crate) async fn new_master_named(&self) {
        self.renamed.notified().await;
    }

    /// Revocations that `master` acknowledged: remembered, unless another
    /// master is believed in by now (then the write may be lost with the
    /// old master: an error, so the caller tries again).
    pub(crate) fn acknowledged(
        &self,
        master: &MasterAddr,
        revoked: &[Revocation<'_>],
    ) -> Result<(), Error> {
        let now = Instant::now();
        let mut ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        if ledger.master.as_ref() != Some(master) {
            return Err(Error::new(
                ErrorKind::Store,
                format!(
                    "the write was acknowledged by {master}, which the redis sentinels no longer \
                     name as the master; it may be lost with it"
                ),
            ));
        }
        for r in revoked {
            let seq = ledger.next_seq;
            ledger.next_seq += 1;
            ledger.revoked.push_back(Revoked {
                seq,
                at: now,
                master: Arc::clone(master),
                key: r.key.to_vec(),
                lease_key: r.lease_key.to_vec(),
                channel: r.notice.channel.to_vec(),
                message: r.notice.message.to_vec(),
                bump: match r.again {
                    Again::Bump(fresh, ttl_ms) => Some((fresh, ttl_ms)),
                    _ => None,
                },
                record: match r.again {
                    Again::Restore(record) => Some(record.to_vec()),
                    _ => None,
                },
            });
        }
        ledger.prune(now, self.retention);
        Ok(())
    }

    /// Applies again, on `master`, every remembered revocation that another
    /// master acknowledged (a failover may have lost it), in batches, and
    /// forgets each batch once applied. Returns how many were applied.
    pub(crate) async fn replay(
        &self,
        conn: &mut MultiplexedConnection,
        master: &MasterAddr,
    ) -> Result<usize, Error> {
        let mut replayed = 0;
        loop {
            let (pipeline, last, count) = {
                let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
                let mut pipeline = redis::pipe();
                let (mut last, mut count) = (0, 0);
                for r in ledger
                    .revoked
                    .iter()
                    .filter(|r| &r.master != master)
                    .take(REPLAY_BATCH)
                {
                    let invalidate = if let Some(record) = &r.record {
                        RESTORE_RECORD
                            .key(&r.key)
                            .arg(&r.channel)
                            .arg(&r.message)
                            .arg(record)
                    } else if let Some((fresh, ttl_ms)) = r.bump {
                        BUMP_GENERATION
                            .key(&r.key)
                            .arg(&r.channel)
                            .arg(&r.message)
                            .arg(fresh)
                            .arg(ttl_ms)
                    } else {
                        INVALIDATE
                            .key(&r.key)
                            .key(&r.lease_key)
                            .arg(&r.channel)
                            .arg(&r.message)
                    };
                    // With the script's code: a promoted replica does not
                    // have its master's scripts.
                    pipeline.add_command(invalidate.cmd(true)).ignore();
                    (last, count) = (r.seq, count + 1);
                }
                (pipeline, last, count)
            };
            if count == 0 {
                break;
            }
            pipeline
                .query_async::<()>(conn)
                .await
                .map_err(store_error)?;
            self.ledger
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .revoked
                .retain(|r| &r.master == master || r.seq > last);
            replayed += count;
        }
        if replayed > 0 {
            tracing::warn!(
                replayed,
                %master,
                "applied again the invalidations the former redis master acknowledged (a failover may have lost them)"
            );
        }
        Ok(replayed)
    }
}

impl fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinel")
            .field("sentinels", &self.addrs())
            .field("master", &self.name)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Forgets the current master's revocations older than `retention`
    /// (those of a former master wait for the replay), and the oldest past
    /// [`REPLAY_CAP`].
    fn prune(&mut self, now: Instant, retention: Duration) {
        while let Some(oldest) = self.revoked.front() {
            let expired = Some(&oldest.master) == self.master.as_ref()
                && now.saturating_duration_since(oldest.at) > retention;
            if !expired && self.revoked.len() <= REPLAY_CAP {
                break;
            }
            if !expired {
                self.forgotten += 1;
            }
            self.revoked.pop_front();
        }
        if self.forgotten > 0 && self.forgotten.is_power_of_two() {
            tracing::warn!(
                forgotten = self.forgotten,
                cap = REPLAY_CAP,
                "more revocations than a failover replay keeps: the oldest are forgotten"
            );
        }
    }
}

/// Whether a command's error says the server is no longer the master
/// (`READONLY`: a replica refused a write; `MASTERDOWN`: a replica that
/// lost its master refused a read).
pub(super) fn moved(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        redis::ErrorKind::Server(
            redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown
        )
    )
}

/// Connection settings for a sentinel or the master: the store's timeouts.
/// How long finding and connecting to the master may take, for `budget`
/// per connection: a sentinel's connection and answer, then the master's
/// connection and `ROLE`.
pub(super) fn lookup_time(budget: Duration) -> Duration {
    budget.saturating_mul(2)
}

/// A connection to a sentinel or the master, made within `budget` (at
/// least `connect_timeout`), and replies waited for as long as any
/// command may take.
fn connection_config(config: &RedisStoreConfig, budget: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(budget.max(config.connect_timeout)))
        .set_response_timeout(Some(config.longest_reply().max(budget)))
}

/// The master's name and connection settings from `master`: a bare name,
/// or a URL whose host is the name (`redis://user:password@mymaster/2`).
fn parse_master(master: &str) -> Result<(String, ConnectionInfo), Error> {
    let invalid = |why: &str| {
        Error::from(ConfigError::new(format!(
            "invalid redis sentinel master {:?}: {why}",
            redact_url(master)
        )))
    };
    let Some((scheme, rest)) = master.split_once("://") else {
        if master.is_empty() || master.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid(
                "give the name the sentinels monitor it under, e.g. \"mymaster\"",
            ));
        }
        let info = connection_info("redis://127.0.0.1/").map_err(store_error)?;
        return Ok((master.to_owned(), info));
    };
    let (userinfo, host_and_path) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let end = host_and_path
        .find(['/', '?'])
        .unwrap_or(host_and_path.len());
    let (name, path) = host_and_path.split_at(end);
    if name.is_empty() {
        return Err(invalid(
            "the url's host must be the master's name, e.g. redis://:password@mymaster/0",
        ));
    }
    if name.contains(':') {
        return Err(invalid(
            "the url's host is the master's name, not an address: the sentinels give the \
             address (drop the port)",
        ));
    }
    let template = format!("{scheme}://{userinfo}127.0.0.1{path}");
    let info = connection_info(&template)
        .map_err(|e| invalid(&mask_secrets(&e.to_string(), &template)))?;
    if !matches!(
        info.addr(),
        ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. }
    ) {
        return Err(invalid("the master is reached over TCP"));
    }
    Ok((name.to_owned(), info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(master: &str) -> Sentinel {
        Sentinel::new(
            ["redis://:s3cret@127.0.0.1:26379/"],
            master,
            &RedisStoreConfig::default(),
        )
        .unwrap()
    }

    fn notice() -> Notice<'static> {
        Notice {
            channel: b"ch",
            message: b"msg",
            batch_head: None,
        }
    }

    fn addr(s: &str) -> MasterAddr {
        Arc::from(s)
    }

    #[test]
    fn the_master_is_a_name_or_a_url_with_the_name_as_host() {
        let (name, info) = parse_master("mymaster").unwrap();
        assert_eq!(name, "mymaster");
        assert_eq!(info.redis_settings().db(), 0);
        assert_eq!(info.redis_settings().password(), None);

        let (name, info) = parse_master("redis://app:pw@my-master.1/2").unwrap();
        assert_eq!(name, "my-master.1");
        assert_eq!(info.redis_settings().db(), 2);
        assert_eq!(info.redis_settings().username(), Some("app"));
        assert_eq!(info.redis_settings().password(), Some("pw"));
        // Nagle is off, as on every connection of the store.
        assert!(info.tcp_settings().nodelay());

        let (name, info) = parse_master("redis://:p@ss@mymaster").unwrap();
        assert_eq!(name, "mymaster");
        assert_eq!(info.redis_settings().password(), Some("p@ss"));
    }

    #[test]
    fn a_bad_master_is_a_config_error_without_its_password() {
        for (master, why) in [
            ("", "give the name"),
            ("my master", "give the name"),
            ("redis://:hunter2@/0", "must be the master's name"),
            ("redis://:hunter2@10.0.0.1:6379/0", "not an address"),
            ("redis+unix:///tmp/redis.sock", "must be the master's name"),
            (
                "redis://:hunter2@mymaster/notadb",
                "invalid redis sentinel master",
            ),
        ] {
            let err = parse_master(master).unwrap_err();
            assert!(err.is_config(), "{master}: {err}");
            let shown = format!("{err} | {err:?}");
            assert!(shown.contains(why), "{master}: {shown}");
            assert!(!shown.contains("hunter2"), "{master}: {shown}");
        }
    }

    #[test]
    fn sentinel_urls_are_checked() {
        let config = RedisStoreConfig::default();
        let err = Sentinel::new(Vec::<&str>::new(), "m", &config).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid configuration: redis sentinel needs at least one sentinel url"
        );
        let err = Sentinel::new(["redis://:hunter2@127.0.0.1:26379/3"], "m", &config).unwrap_err();
        assert!(err.is_config(), "{err}");
        let shown = format!("{err} | {err:?}");
        assert!(shown.contains("selects database 3"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let err = Sentinel::new(["redis://:hunter2@host:notaport/"], "m", &config).unwrap_err();
        assert!(!format!("{err} | {err:?}").contains("hunter2"), "{err:?}");

        let sentinel = Sentinel::new(
            [
                "redis://:hunter2@127.0.0.1:26379",
                "redis://127.0.0.1:26380",
            ],
            "redis://:other-secret@m/1",
            &config,
        )
        .unwrap();
        assert_eq!(sentinel.addrs(), ["127.0.0.1:26379", "127.0.0.1:26380"]);
        assert_eq!(sentinel.master_name(), "m");
        assert_eq!(
            sentinel.scrub("AUTH hunter2 failed; other-secret"),
            "AUTH *** failed; ***"
        );
        let info = sentinel.master_info_at(&addr("10.0.0.7:6380")).unwrap();
        assert_eq!(info.addr().to_string(), "10.0.0.7:6380");
        assert_eq!(info.redis_settings().db(), 1);
        assert!(sentinel.master_info_at(&addr("no-port")).is_err());
    }

    /// A failover lost a tag's generation bump: it is applied again as a
    /// bump (the counter moves on past what any entry recorded, and keeps
    /// a TTL), not as a delete (which would invalidate the entries loaded
    /// after the bump too); an invalidation is applied again as one.
    #[tokio::test]
    async fn a_former_masters_bump_is_replayed_as_a_bump() {
        let server = breakwater_cache_testkit::RedisServer::start();
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let sentinel = sentinel("m");
        let (old, new) = (addr("127.0.0.1:7000"), addr("127.0.0.1:7001"));
        sentinel.believe(&old);
        sentinel
            .acknowledged(
                &old,
                &[
                    Revocation::bump(b"bw:ns:t:{tag}", notice(), 1 << 41, 60_000),
                    Revocation::new(b"bw:ns:v:{k}", b"bw:ns:l:{k}", notice()),
                ],
            )
            .unwrap();
        // What the new master holds: the counter from before the lost
        // bump, the value the lost invalidation deleted.
        let _: () = redis::cmd("SET")
            .arg("bw:ns:t:{tag}")
            .arg("7")
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg("bw:ns:v:{k}")
            .arg("old")
            .query_async(&mut conn)
            .await
            .unwrap();
        sentinel.believe(&new);
        assert_eq!(sentinel.replay(&mut conn, &new).await.unwrap(), 2);
        let counter: Option<u64> = redis::cmd("GET")
            .arg("bw:ns:t:{tag}")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(counter, Some(8));
        let left: i64 = redis::cmd("PTTL")
            .arg("bw:ns:t:{tag}")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(left > 0 && left <= 60_000, "{left}");
        let value: Option<String> = redis::cmd("GET")
            .arg("bw:ns:v:{k}")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(value, None);
        assert!(sentinel.ledger.lock().unwrap().revoked.is_empty());
    }

    /// A failover lost a namespace clear: its record is put back where
    /// the new master holds none; one that contains it stands; any other
    /// is cleared hard (the histories cannot be merged exactly).
    #[tokio::test]
    async fn a_former_masters_clear_is_replayed_unless_a_later_one_stands() {
        let server = breakwater_cache_testkit::RedisServer::start();
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let sentinel = sentinel("m");
        let (old, new) = (addr("127.0.0.1:7000"), addr("127.0.0.1:7001"));
        let reader = conn.clone();
        let get = |key: &'static str| {
            let mut conn = reader.clone();
            async move {
                let held: Option<String> = redis::cmd("GET")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                held
            }
        };
        sentinel.believe(&old);
        sentinel
            .acknowledged(
                &old,
                &[
                    Revocation::restore(b"bw:a:c", notice(), b"6:6:0:0:4:6:0"),
                    Revocation::restore(b"bw:b:c", notice(), b"6:6:0:0:4:6:0"),
                    Revocation::restore(b"bw:c:c", notice(), b"6:6:0:0:4:6:0"),
                    Revocation::restore(b"bw:d:c", notice(), b"6:6:0:0:4:6:0"),
                    Revocation::restore(b"bw:e:c", notice(), b"6:6:0:0:4:6:0"),
                ],
            )
            .unwrap();
        // The new master: a: the record from before the clear; b: a later
        // hard clear made since; c: none; d: a record of another history;
        // e: a soft clear made since to the same generation.
        for (key, record) in [
            ("bw:a:c", "5:4:0:0:4:4:0"),
            ("bw:b:c", "7:7:0:0:4:7:0"),
            ("bw:d:c", "9:9:0:0:8:9:0"),
            ("bw:e:c", "6:4:100:50:4:4:0"),
        ] {
            let _: () = redis::cmd("SET")
                .arg(key)
                .arg(record)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
        sentinel.believe(&new);
        assert_eq!(sentinel.replay(&mut conn, &new).await.unwrap(), 5);
        // a, d, e do not contain the lost hard clear: cleared hard over
        // what they hold; b contains it; c had none.
        assert_eq!(get("bw:a:c").await.as_deref(), Some("7:7:0:0:4:7:0"));
        assert_eq!(get("bw:b:c").await.as_deref(), Some("7:7:0:0:4:7:0"));
        assert_eq!(get("bw:c:c").await.as_deref(), Some("6:6:0:0:4:6:0"));
        assert_eq!(get("bw:d:c").await.as_deref(), Some("10:10:0:0:8:10:0"));
        assert_eq!(get("bw:e:c").await.as_deref(), Some("7:7:100:50:4:7:0"));
    }

    #[tokio::test(start_paused = true)]
    async fn revocations_count_only_on_the_master_believed_in() {
        let sentinel = sentinel("m");
        let (x, y) = (addr("127.0.0.1:7000"), addr("127.0.0.1:7001"));
        let revoked = [Revocation::new(b"k", b"lease", notice())];
        sentinel.believe(&x);
        let named = sentinel.named.subscribe();
        sentinel.acknowledged(&x, &revoked).unwrap();
        sentinel.believe(&y);
        assert!(named.has_changed().unwrap());
        // Acknowledged by the old master after the sentinels named a new one.
        let err = sentinel.acknowledged(&x, &revoked).unwrap_err();
        assert!(err.is_store(), "{err}");
        assert!(err.to_string().contains("127.0.0.1:7000"), "{err}");
        sentinel.acknowledged(&y, &revoked).unwrap();
        let ledger = sentinel.ledger.lock().unwrap();
        let masters: Vec<&str> = ledger.revoked.iter().map(|r| &*r.master).collect();
        assert_eq!(masters, ["127.0.0.1:7000", "127.0.0.1:7001"]);
        assert_eq!(ledger.revoked[0].key, b"k");
        assert_eq!(ledger.revoked[0].message, b"msg");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_master_cuts_the_backoff_and_ends_a_subscription() {
        let sentinel = Arc::new(sentinel("m"));
        let (x, y) = (addr("127.0.0.1:7000"), addr("127.0.0.1:7001"));
        sentinel.believe(&x);
        let moved = tokio::spawn({
            let sentinel = Arc::clone(&sentinel);
            let x = Arc::clone(&x);
            async move { sentinel.moved_from(&x).await }
        });
        tokio::task::yield_now().await;
        assert!(!moved.is_finished());
        // The same master again changes nothing.
        sentinel.believe(&x);
        tokio::task::yield_now().await;
        assert!(!moved.is_finished());
        sentinel.believe(&y);
        moved.await.unwrap();
        // The permit left by the change wakes a reconnect's backoff.
        tokio::time::timeout(Duration::from_millis(1), sentinel.new_master_named())
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_current_masters_revocations_expire_a_former_masters_wait() {
        let sentinel = sentinel("m");
        let (x, y) = (addr("127.0.0.1:7000"), addr("127.0.0.1:7001"));
        let revoked = [Revocation::new(b"k", b"lease", notice())];
        let retention = sentinel.retention;
        assert_eq!(retention, REPLAY_WINDOW + Duration::from_secs(2));
        sentinel.believe(&x);
        sentinel.acknowledged(&x, &revoked).unwrap();
        tokio::time::advance(retention + Duration::from_millis(1)).await;
        sentinel.acknowledged(&x, &revoked).unwrap();
        assert_eq!(sentinel.ledger.lock().unwrap().revoked.len(), 1, "expired");
        // X is left: its revocation waits for the replay however old.
        sentinel.believe(&y);
        tokio::time::advance(retention * 10).await;
        sentinel.acknowledged(&y, &revoked).unwrap();
        let ledger = sentinel.ledger.lock().unwrap();
        let masters: Vec<&str> = ledger.revoked.iter().map(|r| &*r.master).collect();
        assert_eq!(masters, ["127.0.0.1:7000", "127.0.0.1:7001"]);
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_cap_the_oldest_revocations_are_forgotten() {
        let sentinel = sentinel("m");
        let x = addr("127.0.0.1:7000");
        sentinel.believe(&x);
        let revoked: Vec<_> = (0..1000)
            .map(|_| Revocation::new(b"k", b"lease", notice()))
            .collect();
        for _ in 0..REPLAY_CAP / 1000 + 2 {
            sentinel.acknowledged(&x, &revoked).unwrap();
        }
        let ledger = sentinel.ledger.lock().unwrap();
        assert_eq!(ledger.revoked.len(), REPLAY_CAP);
        assert_eq!(ledger.forgotten, 2000);
        assert_eq!(ledger.revoked.front().unwrap().seq, 2000);
    }

    #[test]
    fn readonly_and_masterdown_mean_the_master_moved() {
        use redis::{ErrorKind, ServerErrorKind};
        let err = |kind| redis::RedisError::from((kind, "test"));
        assert!(moved(&err(ErrorKind::Server(ServerErrorKind::ReadOnly))));
        assert!(moved(&err(ErrorKind::Server(ServerErrorKind::MasterDown))));
        assert!(!moved(&err(ErrorKind::Server(
            ServerErrorKind::ResponseError
        ))));
        assert!(!moved(&err(ErrorKind::Io)));
    }

    #[test]
    fn sentinel_errors_are_found_in_a_source_chain() {
        let cause = SentinelError::UnknownMaster {
            name: "m".into(),
            answered: 2,
            asked: 3,
        };
        let err = Error::new(ErrorKind::Store, "lookup").with_source(cause.clone());
        let outer = Error::new(ErrorKind::Store, "reconnecting").with_source(err);
        assert_eq!(SentinelError::find(&outer), Some(&cause));
        assert_eq!(
            outer.to_string(),
            "store failed: reconnecting: lookup: no redis sentinel monitors a \
             master named \"m\" (2 of 3 sentinels answered); check the name in the sentinels' \
             `sentinel monitor` lines"
        );
        assert_eq!(SentinelError::find(&Error::store_msg("other")), None);
    }
}
