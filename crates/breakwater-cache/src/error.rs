//! One error type for the whole crate, classified by [`ErrorKind`].
//!
//! [`Error`] is cheap to clone (its source sits behind an `Arc`), so one loader
//! failure can reach every caller that was waiting on the same load. A loader's
//! own error is carried, never stringified: get it back with
//! [`Error::loader_error`].
//!
//! # Messages
//!
//! An error's text says each thing once: what failed (the kind), what
//! breakwater knows about it, then its causes down to the root, e.g.
//! `store failed: broken pipe`, `loader failed: connection refused`. A cause
//! whose text ends the part before it (many errors repeat their source's
//! text at the end of their own) is not repeated. The causes are also reachable as
//! [`source`](std::error::Error::source) (the loader's own error is the
//! first one), so print an [`Error`] with `{}` alone, not with a reporter
//! that walks the source chain as well.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A shared, type-erased error source.
pub(crate) type Source = Arc<dyn StdError + Send + Sync + 'static>;

/// What went wrong, in the terms a caller can act on.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The user's loader returned an error or panicked.
    Loader,
    /// The store (Redis, or a custom backend) failed or timed out.
    Store,
    /// Stored bytes could not be encoded or decoded.
    Codec,
    /// The cache or one of its policies was configured with invalid values.
    Config,
    /// A key was empty, too long or otherwise unusable.
    InvalidKey,
    /// A step ran past its deadline.
    Timeout,
    /// Another process held the key's lease for longer than `lock_wait`, and
    /// the lock-timeout policy said to fail.
    LockTimeout,
    /// The circuit breaker is open: the loader failed repeatedly, so loads are
    /// refused until its cool-down has passed.
    CircuitOpen,
    /// Too many loads were already running or queued; this one was shed
    /// instead of piling onto the database.
    Overloaded,
    /// An encoded value was larger than the cache's `max_value_size`
    /// ([`CacheBuilder::max_value_size`](crate::CacheBuilder::max_value_size)):
    /// it was not written (a loaded value is still returned to its callers).
    TooLarge,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Loader => "loader failed",
            ErrorKind::Store => "store failed",
            ErrorKind::Codec => "codec failed",
            ErrorKind::Config => "invalid configuration",
            ErrorKind::InvalidKey => "invalid key",
            ErrorKind::Timeout => "timed out",
            ErrorKind::LockTimeout => "lock wait timed out",
            ErrorKind::CircuitOpen => "circuit open",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::TooLarge => "value too large",
        }
    }
}

/// The error returned by every fallible breakwater operation.
///
/// # Examples
///
/// ```
/// use breakwater_cache::{Error, ErrorKind};
///
/// #[derive(Debug)]
/// struct DbDown;
/// impl std::fmt::Display for DbDown {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("database down")
///     }
/// }
/// impl std::error::Error for DbDown {}
///
/// let err = Error::loader(DbDown);
/// assert!(err.is_loader());
/// assert_eq!(err.kind(), ErrorKind::Loader);
/// assert!(err.loader_error::<DbDown>().is_some());
/// ```
#[derive(Clone)]
pub struct Error(
    /// Boxed: an `Error` is a pointer, so every `Result` of the hit path
    /// (moved through each layer of a call) stays as small as its value.
    Box<Details>,
);

/// What an [`Error`] holds.
#[derive(Clone)]
struct Details {
    kind: ErrorKind,
    /// What breakwater knows beyond the kind; empty when the source says it
    /// all (`store failed: broken pipe`).
    message: Cow<'static, str>,
    source: Option<Source>,
    /// A store error that belongs to one key, not to the store.
    key_fault: bool,
    /// A store error that says the store cannot be used now (see
    /// [`Error::is_unreachable`]).
    unreachable: bool,
    /// When trying again may succeed; see [`Error::retry_after`].
    retry_after: Option<Duration>,
}

impl Error {
    /// Creates an error of `kind` with a message.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<Cow<'static, str>>) -> Self {
        Error(Box::new(Details {
            kind,
            message: message.into(),
            source: None,
            key_fault: false,
            unreachable: false,
            retry_after: None,
        }))
    }

    /// Says when trying again may succeed (see [`Error::retry_after`]).
    pub(crate) fn with_retry_after(mut self, after: Duration) -> Self {
        self.0.retry_after = Some(after);
        self
    }

    /// Marks a store error as saying the store cannot be used now.
    pub(crate) fn unreachable(mut self) -> Self {
        self.0.unreachable = true;
        self
    }

    /// `true` for a store error that says the store cannot be used now,
    /// rather than that it was slow: no connection can be had (refused,
    /// broken again after a retry, reconnecting), or the store's circuit
    /// breaker is open. A cache loads directly, without the fleet's lease,
    /// only after such an error; a store that timed out is still asked for
    /// the lease.
    pub(crate) fn is_unreachable(&self) -> bool {
        self.0.unreachable
    }

    /// Attaches a source error.
    pub(crate) fn with_source(
        mut self,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        self.0.source = Some(Arc::from(source.into()));
        self
    }

    /// Wraps a loader's error, keeping it intact for [`Error::loader_error`].
    pub fn loader(source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Error::new(ErrorKind::Loader, "").with_source(source)
    }

    /// Wraps a store (backend) failure. Custom [`Store`](crate::Store)
    /// implementations use this to report their errors.
    pub fn store(source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        Error::new(ErrorKind::Store, "").with_source(source)
    }

    /// A store error that belongs to one key, not to the store: the store
    /// answered, and refused this operation on this key (in Redis: a value
    /// of another type under it, `WRONGTYPE`; a script or argument error
    /// about it; a value too large for the server). Its kind is
    /// [`Store`](ErrorKind::Store) and [`is_key_fault`](Error::is_key_fault)
    /// is `true`: it never counts toward the store's circuit breaker, a read
    /// that meets it is a miss for that key, and the key's next fenced write
    /// replaces what is there. Custom [`Store`](crate::Store)
    /// implementations use this for such errors.
    pub fn key_fault(source: impl Into<Box<dyn StdError + Send + Sync + 'static>>) -> Self {
        let mut err = Error::new(ErrorKind::Store, "refused for this key").with_source(source);
        err.0.key_fault = true;
        err
    }

    /// A store failure described by a message only.
    pub fn store_msg(message: impl Into<Cow<'static, str>>) -> Self {
        Error::new(ErrorKind::Store, message)
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// How long to wait before trying again, when the refusal is temporary
    /// and its end is known; for a `Retry-After` header.
    ///
    /// - [`CircuitOpen`](ErrorKind::CircuitOpen) (the origin's breaker) and a
    ///   [`Store`](ErrorKind::Store) error from the store's open breaker:
    ///   the time until the breaker lets a probe through. Zero when it is
    ///   half-open and its probes are already running: they decide in about
    ///   one load (or store call), so try again shortly.
    /// - [`Overloaded`](ErrorKind::Overloaded): with a load rate limit, the
    ///   time until the next load may start; else the bulkhead's
    ///   `queue_wait`, the wait that just ran out (loads were all busy for
    ///   that long; a retry sooner would most likely queue behind them).
    /// - Anything else: `None` (no known time: a loader error, a timeout, a
    ///   store failure without an open breaker...).
    ///
    /// A `Retry-After` header takes whole seconds: round up.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{BreakerConfig, Cache, Jitter};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), breakwater_cache::Error> {
    /// let cache = Cache::<u64>::builder()
    ///     .breaker(
    ///         BreakerConfig::new()
    ///             .consecutive_failures(1)
    ///             .cool_down(Duration::from_secs(30))
    ///             .cool_down_jitter(Jitter::none().with_floor(Duration::from_millis(1))),
    ///     )
    ///     .build()?;
    /// let failing = || async { Err::<Option<u64>, _>(std::io::Error::other("db down")) };
    /// let err = cache.get_or_load("a", failing).await.unwrap_err();
    /// assert_eq!(err.to_string(), "loader failed: db down");
    /// assert_eq!(err.retry_after(), None);
    ///
    /// // The breaker is open now: refused at once, with the time until it probes.
    /// let err = cache.get_or_load("b", failing).await.unwrap_err();
    /// assert!(err.is_circuit_open());
    /// let after = err.retry_after().unwrap();
    /// let header = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    /// assert_eq!(header, 30);
    /// # Ok(()) }
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        self.0.retry_after
    }

    /// The loader's own error, if this error carries one of type `E`.
    pub fn loader_error<E: StdError + 'static>(&self) -> Option<&E> {
        if self.0.kind != ErrorKind::Loader {
            return None;
        }
        self.0.source.as_deref()?.downcast_ref::<E>()
    }

    /// `true` if the loader failed or panicked.
    pub fn is_loader(&self) -> bool {
        self.0.kind == ErrorKind::Loader
    }

    /// `true` if the store failed.
    pub fn is_store(&self) -> bool {
        self.0.kind == ErrorKind::Store
    }

    /// `true` for a store error that belongs to one key, not to the store
    /// (see [`Error::key_fault`]); [`is_store`](Error::is_store) is `true`
    /// too.
    pub fn is_key_fault(&self) -> bool {
        self.0.key_fault
    }

    /// `true` if bytes could not be encoded or decoded.
    pub fn is_codec(&self) -> bool {
        self.0.kind == ErrorKind::Codec
    }

    /// `true` if the configuration was invalid.
    pub fn is_config(&self) -> bool {
        self.0.kind == ErrorKind::Config
    }

    /// `true` if the key was rejected.
    pub fn is_invalid_key(&self) -> bool {
        self.0.kind == ErrorKind::InvalidKey
    }

    /// `true` if a deadline ran out.
    pub fn is_timeout(&self) -> bool {
        self.0.kind == ErrorKind::Timeout
    }

    /// `true` if waiting for another process's load timed out.
    pub fn is_lock_timeout(&self) -> bool {
        self.0.kind == ErrorKind::LockTimeout
    }

    /// `true` if the circuit breaker refused the load.
    pub fn is_circuit_open(&self) -> bool {
        self.0.kind == ErrorKind::CircuitOpen
    }

    /// `true` if the load was shed because too many were running.
    pub fn is_overloaded(&self) -> bool {
        self.0.kind == ErrorKind::Overloaded
    }

    /// `true` if an encoded value was larger than `max_value_size` and was
    /// not cached.
    pub fn is_too_large(&self) -> bool {
        self.0.kind == ErrorKind::TooLarge
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.0.kind)
            .field("message", &self.0.message);
        if self.0.key_fault {
            d.field("key_fault", &true);
        }
        if let Some(after) = self.0.retry_after {
            d.field("retry_after", &after);
        }
        if let Some(source) = &self.0.source {
            d.field("source", source);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    /// `kind: message: cause: ... : root cause`, each part once (see the
    /// module docs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.kind.as_str())?;
        if !self.0.message.is_empty() {
            write!(f, ": {}", self.0.message)?;
        }
        // The last part written: a cause that only repeats its end (as
        // `db error: {source}` does) is not written again.
        let mut last = self.0.message.to_string();
        let mut cause = self
            .0
            .source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static));
        while let Some(err) = cause {
            let part = match err.downcast_ref::<Error>() {
                // One of ours inside: its own part only (its causes follow),
                // and its kind only when it differs.
                Some(inner) if inner.0.kind == self.0.kind => inner.0.message.to_string(),
                Some(inner) if inner.0.message.is_empty() => inner.0.kind.as_str().to_owned(),
                Some(inner) => format!("{}: {}", inner.0.kind.as_str(), inner.0.message),
                None => err.to_string(),
            };
            if !part.is_empty() && !last.ends_with(&part) {
                write!(f, ": {part}")?;
                last = part;
            }
            cause = err.source();
        }
        Ok(())
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// A configuration value was invalid. The message names the setting, the
/// allowed range and the value given, e.g.
/// `jitter ratio must be in 0..=1, got 1.5`; [`key`](Self::key) names the
/// setting as a configuration key (`jitter.ratio`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
    key: Option<String>,
}

impl ConfigError {
    /// Creates a configuration error with an exact message.
    pub(crate) fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: message.into(),
            key: None,
        }
    }

    /// The message, without any prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The setting at fault, as a key of a [`CacheConfig`](crate::config::CacheConfig)
    /// (the builder method's name, and its config type's inside it):
    /// `ttl`, `l1.ttl`, `breaker.cool_down`, `retry.backoff.cap`,
    /// `redis.response_timeout`... `None` when no one setting is to blame.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use breakwater_cache::{Cache, L1Config};
    ///
    /// let err = Cache::<u64>::builder()
    ///     .l1(L1Config::new().ttl(Duration::ZERO))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.key(), Some("l1.ttl"));
    /// assert_eq!(err.message(), "l1 ttl must be at least 1ms, got 0ns");
    /// ```
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// Names the setting at fault, unless a more precise key is known.
    pub(crate) fn for_key(mut self, key: &str) -> Self {
        if self.key.is_none() {
            self.key = Some(key.to_owned());
        }
        self
    }

    /// Puts the key inside `section` (`ttl` in `l1` is `l1.ttl`).
    pub(crate) fn within(mut self, section: &str) -> Self {
        self.key = Some(match self.key.take() {
            Some(key) => format!("{section}.{key}"),
            None => section.to_owned(),
        });
        self
    }

    /// `Err` unless `value <= limit`: "`{name}` must be at most {limit},
    /// got {value:?}; {instead}".
    pub(crate) fn at_most(
        name: &str,
        value: Duration,
        limit: Duration,
        instead: &str,
    ) -> Result<(), ConfigError> {
        if value <= limit {
            return Ok(());
        }
        Err(ConfigError::new(format!(
            "{name} must be at most {}, got {value:?}; {instead}",
            show_limit(limit)
        )))
    }
}

/// The longest TTL-like window any setting accepts (a TTL, grace,
/// `max_stale`, a jitter spread or floor, an L1 lifetime, a breaker window
/// or cool-down): 365 days. Sums of such windows stay far from overflowing
/// a store-clock millisecond count, an [`Instant`](tokio::time::Instant),
/// moka's 1,000-year limit or Redis's `PX`.
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(365 * DAY_SECS);

/// The longest wait, timeout or interval any setting accepts
/// (`load_timeout`, `fail_safe_throttle`, a queue wait, a backoff cap, a
/// breaker cool-down, a Redis timeout): a day.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(DAY_SECS);

const DAY_SECS: u64 = 24 * 3600;

/// A limit as a message shows it: `365 days`, `1 day`, else `{:?}`.
fn show_limit(limit: Duration) -> String {
    let secs = limit.as_secs();
    if limit.subsec_nanos() == 0 && secs > 0 && secs.is_multiple_of(DAY_SECS) {
        let days = secs / DAY_SECS;
        format!("{days} day{}", if days == 1 { "" } else { "s" })
    } else {
        format!("{limit:?}")
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for ConfigError {}

/// [`ConfigError::for_key`] and [`ConfigError::within`] on a result.
pub(crate) trait KeyedResult {
    /// Names the setting at fault, unless a more precise key is known.
    fn for_key(self, key: &str) -> Self;
    /// Puts the key inside `section`.
    fn within(self, section: &str) -> Self;
}

impl<T> KeyedResult for Result<T, ConfigError> {
    fn for_key(self, key: &str) -> Self {
        self.map_err(|e| e.for_key(key))
    }

    fn within(self, section: &str) -> Self {
        self.map_err(|e| e.within(section))
    }
}

impl From<ConfigError> for Error {
    fn from(err: ConfigError) -> Self {
        Error::new(ErrorKind::Config, err.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Boom;
    impl fmt::Display for Boom {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("boom")
        }
    }
    impl StdError for Boom {}

    #[test]
    fn loader_error_is_carried_not_stringified() {
        let err = Error::loader(Boom);
        let clone = err.clone();
        assert!(clone.loader_error::<Boom>().is_some());
        assert!(clone.loader_error::<ConfigError>().is_none());
        assert_eq!(clone.to_string(), "loader failed: boom");
    }

    /// An error that says what it is and keeps its cause in `source`.
    #[derive(Debug)]
    struct Query(std::io::Error);
    impl fmt::Display for Query {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("query failed")
        }
    }
    impl StdError for Query {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    /// An error that repeats its cause's text in its own.
    #[derive(Debug)]
    struct Repeats(std::io::Error);
    impl fmt::Display for Repeats {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "db error: {}", self.0)
        }
    }
    impl StdError for Repeats {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn messages_say_each_thing_once_down_to_the_root_cause() {
        let io = || std::io::Error::other("relation \"users\" does not exist");
        let err = Error::loader(Query(io()));
        assert_eq!(
            err.to_string(),
            "loader failed: query failed: relation \"users\" does not exist"
        );
        assert!(err.loader_error::<Query>().is_some(), "still typed");
        let source = StdError::source(&err).unwrap();
        assert!(
            source.is::<Query>(),
            "the loader's error is the first source"
        );

        let err = Error::loader(Repeats(io()));
        assert_eq!(
            err.to_string(),
            "loader failed: db error: relation \"users\" does not exist"
        );

        let err = Error::store(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert_eq!(err.to_string(), "store failed: broken pipe");

        // A cause is never hidden because the kind's words contain it.
        let err = Error::loader(std::io::Error::other("failed"));
        assert_eq!(err.to_string(), "loader failed: failed");

        // One of ours inside one of ours: its kind is not repeated.
        let err = Error::new(ErrorKind::Store, "the invalidation was not delivered")
            .with_source(Error::store(std::io::Error::other("connection reset")));
        assert_eq!(
            err.to_string(),
            "store failed: the invalidation was not delivered: connection reset"
        );
        let err = Error::new(ErrorKind::Store, "the invalidation was not delivered").with_source(
            Error::new(ErrorKind::Timeout, "no attempt finished in time"),
        );
        assert_eq!(
            err.to_string(),
            "store failed: the invalidation was not delivered: timed out: no attempt finished in time"
        );
    }

    #[test]
    fn only_temporary_refusals_say_when_to_retry() {
        assert_eq!(Error::loader(Boom).retry_after(), None);
        let err =
            Error::new(ErrorKind::CircuitOpen, "open").with_retry_after(Duration::from_secs(3));
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
        assert_eq!(err.clone().retry_after(), Some(Duration::from_secs(3)));
    }

    #[test]
    fn store_error_does_not_expose_loader_error() {
        let err = Error::store(Boom);
        assert!(err.is_store());
        assert!(err.loader_error::<Boom>().is_none());
    }

    #[test]
    fn a_key_fault_is_a_store_error_of_one_key() {
        let err = Error::key_fault(Boom);
        assert!(err.is_store() && err.is_key_fault());
        assert!(!Error::store(Boom).is_key_fault());
        assert_eq!(err.to_string(), "store failed: refused for this key: boom");
    }

    #[test]
    fn config_error_converts_with_its_message() {
        let err: Error = ConfigError::new("jitter ratio must be in 0..=1, got 1.5").into();
        assert!(err.is_config());
        assert_eq!(
            err.to_string(),
            "invalid configuration: jitter ratio must be in 0..=1, got 1.5"
        );
    }
}
