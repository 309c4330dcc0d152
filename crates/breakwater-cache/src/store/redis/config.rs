//! [`RedisStoreConfig`]: the store's timeouts, its clock stand-in and its
//! TLS settings, with their defaults and their validation.

use std::sync::Arc;
use std::time::Duration;

use super::tls::TlsConfig;
use crate::clock::{SystemClock, WallClock};
use crate::error::{ConfigError, MAX_WAIT};

/// Connection settings for [`RedisStore`](crate::RedisStore).
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
/// quickly again. [`RedisStore::latency`](crate::RedisStore::latency)
/// reports the round trip and the deadlines in force.
///
/// A slow Redis and a stalled one are told apart: beside that peak the
/// store keeps the same peak of *answered* round trips only, and a caller
/// that holds a servable stand-in (an L1 copy past its fresh time) waits
/// for a read no longer than 3 × that (its *soft* deadline, within the
/// same floor and ceiling), then is served the copy (`Stale {
/// StoreUnavailable }`). A stalled Redis (a `BGSAVE` fork, a paused VM, a
/// partition that drops packets) so costs such a caller about
/// `response_timeout`, never the hard deadline its timeouts have grown;
/// the give-ups count toward the store's breaker (once per soft deadline),
/// which opens within a few of them and closes once Redis answers a
/// probe. Measured (`tests/stall.rs`, defaults, 8 callers on 50 warm
/// keys, Redis stopped 3 s): max 52 ms per call, breaker open after
/// 165 ms. A caller with nothing to serve waits for the hard deadline.
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
/// Without the feature a `rediss://` URL is a
/// [`Config`](crate::ErrorKind::Config) error that says to enable it.
///
/// ```toml
/// breakwater-cache = { version = "0.1", features = ["tls"] }
/// ```
///
/// If the program has not installed a process-wide rustls crypto provider,
/// the store installs ring's when it builds its first TLS client.
#[derive(Debug, Clone)]
pub struct RedisStoreConfig {
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
    pub(super) write_timeout: Duration,
    pub(super) max_response_timeout: Duration,
    pub(super) clock_refresh: Duration,
    pub(super) subscription_ping: Duration,
    pub(super) wall_clock: Arc<dyn WallClock>,
    pub(super) tls: TlsConfig,
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
            tls: TlsConfig::default(),
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
    pub(super) fn longest_reply(&self) -> Duration {
        self.response_timeout
            .max(self.write_timeout)
            .max(self.max_response_timeout)
    }

    /// How long the connection attempt after `failures` failed ones may
    /// take to connect and shake hands.
    pub(super) fn connect_budget(&self, failures: u32) -> Duration {
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
