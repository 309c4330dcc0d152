//! breakwater — a cache layer that keeps the primary database standing.
//!
//! Two different failures hide behind "the cache expired":
//!
//! - **Avalanche**: thousands of keys written together with one TTL expire in
//!   the same second, and again one TTL later, so the database takes a wave of
//!   misses on a schedule. The remedy is [`Jitter`] on every write, which
//!   [`Cache`] applies by default (±10 %).
//! - **Stampede** (dogpile, thundering herd): one hot key expires and every
//!   request that wanted it runs the same expensive query. Jitter cannot help
//!   one key; one load per key (single-flight plus a lease) and refreshing
//!   before expiry can.
//!
//! [`Cache::get_or_load`] is the one call that composes the remedies; every
//! policy in it has a documented default and a builder method.
//!
//! # Adding it
//!
//! The crate is `breakwater-cache` (imported as `breakwater_cache`):
//!
//! ```toml
//! [dependencies]
//! breakwater-cache = "0.1"  # features = ["tls"] for rediss:// URLs
//! ```
//!
//! or `cargo add breakwater-cache`; from a checkout of the repository,
//! `cargo add breakwater-cache --path path/to/crates/breakwater-cache`.
//!
//! # I want to…
//!
//! What each call does to a cached value, and what it costs the database
//! (the store's work is O(1) in every row).
//!
//! | I want to… | call | what the database sees |
//! |---|---|---|
//! | drop one key now: its next reader must get new data | [`Cache::invalidate`] | one load, by the next caller, who waits for it (fail-safe has nothing to serve) |
//! | drop many keys now (a price list, a user's views) | [`Cache::invalidate_many`] | as `invalidate`, for each key; the store gets one transaction per 1,024 keys |
//! | mark one key stale, keep serving it while it reloads | [`Cache::expire`] | one load, in the background; callers within grace get the old value at once, and it stands in (within `max_stale`) if the database is down |
//! | reload one key now, keep the old value if that fails | [`Cache::refresh`] | one load now (joined fleet-wide), whatever is cached |
//! | put a value I already have | [`Cache::set`] | nothing; concurrent `set`s that find the store busy go out together, one transaction per batch |
//! | put many values I already have (an import, a rebuild) | [`Cache::set_many`] | nothing; the store gets one transaction per 1,024 keys |
//! | drop every key of a group (a shop, a user) | [`CacheEntry::tags`] or [`CacheEntries::tags`] at write, [`Cache::invalidate_tag`] | one load per key of the group, as each is next read |
//! | mark every key of a group stale, keep serving them while they reload | [`CacheEntry::tags`] or [`CacheEntries::tags`] at write, [`Cache::expire_tag`] | one load per key of the group, in the background, as each is next read; within grace callers get the old value at once, and it stands in (within `max_stale`) if the database is down |
//! | drop every key of a group known only from the value (a product's shop) | [`Loaded::tags`] from a context loader, [`Cache::invalidate_tag`] | as above; plus one load per tag that is not written (the tag's first, and the first after each invalidation of it) |
//! | drop every key of the namespace, now | [`Cache::clear`] with [`ClearMode::Hard`] | one load per key, as each is next read: on a busy namespace, all at once (the avalanche) |
//! | refresh every key of the namespace without an avalanche | [`Cache::clear`] with [`ClearMode::Soft`] | one load per key, spread over the window in the order the entries would have expired; within grace callers get the old value at once |
//! | start over for a whole namespace (a new schema) | a version bump ([`CacheBuilder::version`], with a transition) | one load per key, spread as the old version's entries are read |
//! | cache a value as long as it is valid (a token's `expires_in`), or not at all | [`Cache::get_or_load_with_context`] with [`Loaded::ttl`], [`Loaded::do_not_cache`] | as the loader decides |
//! | skip rewriting a big value that has not changed | [`Loaded::validator`] and [`Loaded::not_modified`] | the loader's cheap check (an ETag, a version); the store is sent a header, not the value |
//!
//! # Choosing a jitter
//!
//! | data | jitter |
//! |---|---|
//! | most keys, TTL of minutes or more | [`Jitter::ratio(0.1)`](Jitter::ratio) to `0.2` |
//! | must never be older than the TTL | [`Jitter::down`] |
//! | short TTLs (seconds) | [`Jitter::fixed`] (e.g. ±3 s on 10 s) |
//!
//! # Stores
//!
//! [`MemoryStore`] keeps entries in-process (one process, no server).
//! [`RedisStore`] shares them between processes. Both judge time on the
//! store's clock, never by comparing application machines' clocks.
//!
//! `rediss://` URLs (managed Redis services) need the `tls` feature
//! (rustls): see [`RedisStoreConfig`]'s `# TLS` for a private CA and client
//! certificates.
//!
//! # Features
//!
//! Both off by default:
//!
//! - `tls`: `rediss://` URLs, through rustls (see above).
//! - `test-util`: the [`testing`] module, store wrappers for your own
//!   tests: `ChaosStore` runs the faults of breakwater's seeded simulation
//!   (delayed, reordered, timed-out, refused and hung store calls, a lost
//!   bus), `CountingStore` counts reads and fails one thing at a time.
//!   For `[dev-dependencies]`:
//!   `cargo add breakwater-cache --dev --features test-util`.
//!
//! # Configuration
//!
//! Every setting has a builder method, and the same settings can come from
//! a TOML or JSON file or from environment variables
//! (`BREAKWATER_CACHE_TTL=5m`): [`config::CacheConfig`], checked by the
//! builder's own checks, with every key and its default in [`config`].
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use breakwater_cache::{Cache, Jitter};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cache = Cache::<u64>::builder()
//!     .namespace("stock")
//!     .ttl(Duration::from_secs(10))
//!     .jitter(Jitter::fixed(Duration::from_secs(3))) // 7..=13 s
//!     .build()?;
//! let units = cache.get_or_load("sku:1", || async { Ok::<_, std::io::Error>(Some(12)) }).await?;
//! assert_eq!(units, Some(12));
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod background;
pub mod breaker;
mod cache;
pub mod clock;
pub mod codec;
pub mod config;
mod entry;
mod error;
mod flight;
pub mod freshness;
pub mod jitter;
pub mod key;
pub mod l1;
pub mod limit;
mod log_limit;
pub mod metrics;
#[cfg(test)]
mod protocol_tests;
pub mod retry;
mod served;
pub mod store;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;

pub use breaker::{BreakerConfig, BreakerState};
pub use cache::{
    CLEAR_ACKED_WITHIN, Cache, CacheBuilder, CacheEntries, CacheEntry, ClearMode, EntryView,
    Inspection, LeaseConfig, LoadContext, Loaded, OnLockTimeout, Origin, OriginBuilder, Settings,
    StaleValue, Stored, Value, Warm, WarmReport,
};
pub use codec::{Codec, Compression};
pub use error::{ConfigError, Error, ErrorKind};
pub use freshness::EarlyRefresh;
pub use jitter::{Backoff, Interval, Jitter};
pub use key::{CacheKey, KeyBytes};
pub use l1::L1Config;
pub use limit::LimitConfig;
pub use metrics::{LeaseStats, LoadStats, NoticeStats, Stats};
pub use retry::RetryConfig;
pub use served::{Fetched, Served, StaleReason};
pub use store::{
    ClearedNamespace, Delivery, FencedRenewal, FencedWrite, Finding, Invalidate, LeaseAttempt,
    LeaseRequest, MemoryStore, NamespaceClear, Notice, RedisLatency, RedisStore, RedisStoreConfig,
    Renewal, Replace, SentinelError, Store, StoreFuture, Subscription, Unchanged,
};

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
