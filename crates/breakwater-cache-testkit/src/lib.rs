//! Dev-only test support for breakwater.
//!
//! This crate is used only as a `dev-dependency` by breakwater's tests that
//! talk to a *real* Redis (and, for the example service, a real
//! PostgreSQL). It is never published and never linked into production
//! code.
//!
//! The main item is [`RedisServer`]: a private, throw-away `redis-server`
//! process bound to a free loopback port (never 6379), with no persistence,
//! its own temporary working directory, and helpers to kill, restart, pause
//! and resume it so tests can exercise failure handling. Every test starts
//! its own server, so tests can run in parallel.
//!
//! The `redis-server` binary is taken from the `BREAKWATER_REDIS_SERVER`
//! environment variable, or else looked up on `PATH`. On Debian/Ubuntu it is
//! provided by the `redis-server` package, which `./scripts/test` installs.
//!
//! [`RedisCluster`] starts three such servers in cluster mode and forms a
//! cluster of them (each serving a third of the slots), for the tests that
//! must hold on Redis Cluster too; with replicas
//! ([`RedisCluster::start_with_replicas`]) a test can kill a primary and
//! wait for the automatic failover.
//!
//! [`RedisSentinel`] starts a master, a replica and one or more sentinels
//! watching them ([`SentinelSetup`]: how many sentinels, passwords), so a
//! test can fail the master over (`SENTINEL FAILOVER`, or by killing it)
//! and wait for the promotion.
//!
//! [`PostgresServer`] is the same for PostgreSQL: `initdb` and `postgres` in
//! a temporary directory on a free loopback port (never 5432), logging every
//! statement so a test can count the queries that reached the database.
//!
//! Every server dies with the test: on drop, and, through
//! [`tied_command`], when the test process is killed outright. Processes of
//! a test's own (a service binary under test) can be started the same way
//! as a [`TiedChild`].
//!
//! [`RedisServer::start_tls`] and [`RedisCluster::start_tls`] start the
//! same servers listening for TLS only, with certificates made for the test
//! ([`TestCerts`]: a private CA, a server and a client certificate).
//!
//! For network faults that a process cannot simulate (latency, a silent
//! peer, dropped connections, a refused port) put a [`FaultProxy`] between
//! the cache and the server and switch its [`Fault`] during the test.
//!
//! ```no_run
//! use breakwater_cache_testkit::RedisServer;
//!
//! let server = RedisServer::start();
//! assert_eq!(server.command(&["PING"]).unwrap(), "PONG");
//! let url = server.url(); // "redis://127.0.0.1:PORT/"
//! # let _ = url;
//!
//! use breakwater_cache_testkit::{Fault, FaultProxy};
//! use std::time::Duration;
//!
//! let proxy = FaultProxy::start(server.addr());
//! let url = proxy.url(); // connect the cache here
//! proxy.set(Fault::Delay(Duration::from_millis(100)));
//! proxy.set(Fault::Blackhole); // requests are swallowed, nothing answers
//! proxy.set(Fault::Reset); // open connections are closed
//! proxy.set(Fault::Refuse); // the port refuses connections
//! proxy.set(Fault::Pass); // back to normal, same port
//! # let _ = url;
//! ```

mod cluster;
mod postgres;
mod process;
mod proxy;
mod resp;
mod sentinel;
mod server;
mod tls;

pub use cluster::RedisCluster;
pub use postgres::{PostgresServer, Statement};
pub use process::{TiedChild, free_port, tied_command};
pub use proxy::{Fault, FaultProxy};
pub use sentinel::{RedisSentinel, SentinelSetup};
pub use server::RedisServer;
pub use tls::TestCerts;
