//! Store wrappers for testing code that uses a cache: faults to inject and
//! calls to count. Only with the `test-util` feature, meant for
//! `[dev-dependencies]`:
//!
//! ```toml
//! [dev-dependencies]
//! breakwater-cache = { version = "0.1", features = ["test-util"] }
//! ```
//!
//! # [`ChaosStore`]: the simulation's faults
//!
//! breakwater checks its coherence contract with a seeded simulation: a
//! fleet of caches over one store, each behind a `ChaosStore`. The same
//! wrapper puts your code under those faults: store calls delayed before
//! they run, replies delayed after (so they arrive out of order), calls
//! that ran but answer with a timeout, calls refused without running, a
//! stopped store whose calls hang and fail, bus messages lost without a
//! word, subscription connections that drop and come back, and
//! subscription tasks that die. It protects against code that is only
//! right when the store is: code that takes an error for "nothing was
//! written", assumes replies come in the order the calls were made, or
//! relies on hearing every invalidation. On a current-thread runtime with
//! paused time, one seed replays exactly, so a failure found by a soak of
//! many seeds can be run again and traced ([`ChaosStore::observe`]).
//!
//! # [`CountingStore`]: how many reads reach the store
//!
//! A wrapper that counts `get`s, for asserting what a cache spares the
//! store (one read for a burst of callers, none for an L1 hit), with a few
//! switches for one fault at a time: slow, late or failing reads, lost
//! lease replies, failing invalidations, write replies that never come.
//!
//! Both wrap any [`Store`](crate::Store), [`MemoryStore`](crate::MemoryStore)
//! as well as [`RedisStore`](crate::RedisStore), and are handed to a cache
//! with [`CacheBuilder::shared_store`](crate::CacheBuilder::shared_store)
//! (keep a clone to steer it: clones share their state).

mod chaos;
mod counting;

pub use chaos::{BusChange, ChaosEvent, ChaosStore, Faults};
pub use counting::CountingStore;
