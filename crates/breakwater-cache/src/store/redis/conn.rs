//! The live connection ([`Conn`]): one server's, a cluster's, or the
//! master's that the sentinels named; and what its errors mean
//! ([`store_error`]). How a connection is made, and made again, is
//! `connection`'s.

use std::sync::Arc;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::error::{Error, ErrorKind};

/// A master's address, `host:port`, as the sentinels name it.
pub(crate) type MasterAddr = Arc<str>;

/// A live connection: to one server, to a cluster, or to the master that
/// the sentinels named.
#[derive(Clone)]
pub(super) enum Conn {
    /// One server's multiplexed connection. Not a `ConnectionManager`:
    /// the store already re-makes a broken connection in the background
    /// (see `connection::run_reconnect`), and the manager's own machinery (a shared
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
    pub(super) fn master(&self) -> Option<&MasterAddr> {
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
    pub(super) async fn time(&mut self, any_node: bool) -> redis::RedisResult<(u64, u64)> {
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

    /// Runs `tx`, a transaction (an atomic pipeline) whose keys share hash
    /// slot `slot`. A cluster connection is told the slot's primary: its
    /// own routing takes a command's first argument for a key, and a
    /// `PUBLISH` channel in the transaction would cross slots. An error
    /// among the commands' replies fails it.
    pub(super) async fn transaction(&mut self, tx: &Pipeline, slot: u16) -> redis::RedisResult<()> {
        match self {
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let replies = c.route_pipeline(tx.clone(), tx.len() + 1, 1, route).await?;
                // `EXEC`'s reply holds the commands' own.
                let failed = replies
                    .into_iter()
                    .flat_map(|reply| match reply {
                        Value::Array(each) => each,
                        other => vec![other],
                    })
                    .find_map(|reply| match reply {
                        Value::ServerError(err) => Some(err),
                        _ => None,
                    });
                failed.map_or(Ok(()), |err| Err(err.into()))
            }
            // Not redis-rs's own transaction: its multiplexed connection
            // (1.8.1) panics in debug builds, and misreads the replies in
            // release builds, when Redis refuses the `MULTI` itself (a
            // user without `+multi`). The same commands go as a plain
            // pipeline between a `MULTI` and an `EXEC` of their own, and
            // the replies are read here.
            Conn::Node(c) | Conn::Master(c, _) => {
                let mut plain = redis::pipe();
                plain.cmd("MULTI");
                for cmd in tx.cmd_iter() {
                    plain.add_command(cmd.clone());
                }
                plain.cmd("EXEC");
                let replies = c.req_packed_commands(&plain, 0, plain.len()).await?;
                transaction_outcome(replies)
            }
        }
    }

    /// A cluster's `CLUSTER SLOTS`, asked of any node.
    pub(super) async fn cluster_slots(&mut self) -> redis::RedisResult<Value> {
        match self {
            Conn::Cluster(c) => {
                let mut cmd = redis::cmd("CLUSTER");
                cmd.arg("SLOTS");
                c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                    .await
            }
            Conn::Node(_) | Conn::Master(..) => Ok(Value::Nil),
        }
    }

    /// Runs `pipe`, a plain pipeline (not a transaction), with each
    /// command's reply, Redis's refusals among them. A cluster connection
    /// sends it whole to the primary serving `slot`: its commands may be
    /// about other slots, and one about a slot that node does not serve
    /// answers `MOVED` or `ASK` (see `plain`).
    pub(super) async fn replies(
        &mut self,
        pipe: &Pipeline,
        slot: u16,
    ) -> redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Cluster(c) => {
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                c.route_pipeline(pipe.clone(), 0, pipe.len(), route).await
            }
            Conn::Node(c) | Conn::Master(c, _) => c.req_packed_commands(pipe, 0, pipe.len()).await,
        }
    }
}

/// What a transaction sent as a plain pipeline (`MULTI`, its commands,
/// `EXEC`) came to, from each of their replies: `Ok` if `EXEC` ran every
/// command and none was refused.
///
/// A refused `MULTI` (`NOPERM`: the user lacks `+multi`) is that error,
/// said plainly: the commands after it ran one by one, in order (as a
/// cluster's plain steps do), and `EXEC` had no transaction. A refused
/// `EXEC` after an accepted `MULTI` would leave the connection inside the
/// transaction: it is an I/O error then, so the connection is dropped and
/// made again.
fn transaction_outcome(replies: Vec<Value>) -> redis::RedisResult<()> {
    fn first_refusal(replies: impl Iterator<Item = Value>) -> Option<redis::ServerError> {
        replies
            .filter_map(|reply| match reply {
                Value::ServerError(err) => Some(err),
                _ => None,
            })
            .next()
    }
    let mut replies = replies.into_iter();
    match replies.next() {
        Some(Value::ServerError(refused)) => {
            let err: redis::RedisError = refused.into();
            Err(redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
                "the Redis user may not run MULTI, which breakwater's bulk writes \
                 (set_many, invalidate_many, queued sets) need: grant it +multi and +exec \
                 (this step's commands ran one by one, in order, without the transaction)",
                err.to_string(),
            )))
        }
        Some(_) => {
            let Some(exec) = replies.next_back() else {
                return Ok(());
            };
            match exec {
                Value::Array(each) => {
                    first_refusal(each.into_iter()).map_or(Ok(()), |e| Err(e.into()))
                }
                Value::ServerError(refused) => {
                    // Queued commands that Redis refused abort the
                    // transaction (`EXECABORT`): the first refusal says why.
                    match first_refusal(replies) {
                        Some(err) => Err(err.into()),
                        None if refused.code() == "EXECABORT" => Err(refused.into()),
                        None => Err(std::io::Error::other(format!(
                            "redis refused EXEC after MULTI ({refused:?}); the connection is made again"
                        ))
                        .into()),
                    }
                }
                _ => Ok(()),
            }
        }
        None => Ok(()),
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

/// A command's failure as a store error: a [key fault](Error::key_fault)
/// if Redis answered with an error about the command's key, else a store
/// failure.
pub(super) fn store_error(err: redis::RedisError) -> Error {
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
