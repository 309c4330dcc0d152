//! breakwater — a cache layer that keeps the primary database standing.
#![deny(missing_docs)]

mod cache;
pub mod codec;
mod entry;
mod error;
pub mod jitter;
pub mod store;

pub use cache::{Cache, CacheBuilder, Value};
pub use codec::{Codec, Compression};
pub use error::{ConfigError, Error, ErrorKind};
pub use jitter::{Backoff, Interval, Jitter};
pub use store::{MemoryStore, RedisStore, RedisStoreConfig, Store};
