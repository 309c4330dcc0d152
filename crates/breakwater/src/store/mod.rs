//! Where entries live: the [`Store`] trait and its two backends.
//!
//! A store is the handful of operations the `get_or_load` pipeline needs, not a
//! Redis client: read one key with one command, write with a TTL, delete, and
//! tell the time on the store's own clock. [`MemoryStore`] is the embedded
//! backend (one process, no server); [`RedisStore`] shares entries between
//! processes through Redis.
//!
//! # The store's clock
//!
//! Every freshness decision compares an entry's `fresh_until` and
//! `stale_until` (written in store-clock milliseconds) with
//! [`Store::now_ms`]. For [`MemoryStore`] that clock is tokio's, so tests can
//! pause and advance it; for [`RedisStore`] it is Redis's own `TIME`, so two
//! application machines whose clocks disagree still agree on what is fresh.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::Error;

mod memory;
mod redis;

pub use memory::MemoryStore;
pub use redis::{RedisStore, RedisStoreConfig};

/// The future returned by [`Store`] operations.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// The operations the cache needs from a backend.
///
/// Keys and values are bytes; the cache has already namespaced the key and
/// encoded the entry. Implementations must be cheap to share (`Arc<dyn Store>`)
/// and must never block the async runtime.
///
/// # Contract
///
/// - [`get`](Store::get) is exactly one round trip (one `GET` in Redis) and
///   returns `None` for a missing or expired key.
/// - [`set`](Store::set) replaces the value and its TTL; the key disappears
///   once the TTL has passed on the store's clock. A TTL below 1 ms is rejected
///   with a [`Config`](crate::ErrorKind::Config) error.
/// - [`delete`](Store::delete) reports whether a key was removed.
/// - [`now_ms`](Store::now_ms) is the store's clock in Unix milliseconds; it
///   never goes backwards within one store handle.
///
/// The same contract test suite runs against every backend in this crate.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Reads the value under `key`, or `None` if it is missing or expired.
    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>>;

    /// Writes `value` under `key`, expiring after `ttl` (millisecond precision).
    fn set<'a>(&'a self, key: &'a [u8], value: &'a [u8], ttl: Duration) -> StoreFuture<'a, ()>;

    /// Deletes `key`; `true` if it existed.
    fn delete<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, bool>;

    /// The time `key` has left to live, or `None` if it is missing or has no
    /// expiry. For inspection and tests; the request path never calls it.
    fn ttl<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Duration>>;

    /// The store's clock, in Unix milliseconds.
    fn now_ms(&self) -> u64;

    /// A short name for logs and metrics, e.g. `"redis"`.
    fn name(&self) -> &'static str;
}

/// Converts a TTL to whole milliseconds, rejecting anything below 1 ms.
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64, Error> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(crate::error::ConfigError::new(format!(
            "store TTL must be at least 1ms, got {ttl:?}"
        ))
        .into());
    }
    Ok(ms)
}
