//! The store behind its own circuit breaker.
//!
//! Every store call a cache makes goes through [`GuardedStore`]. After
//! consecutive store failures (errors or timeouts) the breaker opens: for a
//! jittered cool-down every call fails at once, without touching the store,
//! so a hung Redis costs each request at most one deadline before the cache
//! stops waiting on it. While open, reads miss (the L1 near cache and direct
//! loads serve), writes are dropped (never queued), and leases fail, so each
//! process loads a key at most once at a time through its single-flight,
//! under the origin's bulkhead. Half-open probes find out when the store is
//! back; the breaker then closes on its own.

use std::fmt;
use std::time::Duration;

use crate::breaker::{BreakerConfig, BreakerState, CircuitBreaker};
use crate::error::{Error, ErrorKind};
use crate::store::{FencedWrite, Notice, Store, StoreFuture, Subscription};
use std::sync::Arc;

/// A store behind a circuit breaker; see the module docs.
pub(crate) struct GuardedStore {
    store: Arc<dyn Store>,
    breaker: CircuitBreaker,
}

impl fmt::Debug for GuardedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedStore")
            .field("store", &self.store)
            .field("breaker", &self.breaker.state())
            .finish()
    }
}

impl GuardedStore {
    pub(crate) fn new(store: Arc<dyn Store>, config: BreakerConfig, seed: Option<u64>) -> Self {
        GuardedStore {
            store,
            breaker: CircuitBreaker::new(config, seed),
        }
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// Runs one store call through the breaker: refused at once while open;
    /// store failures count against it, successes close it.
    fn guard<'a, T: Send + 'a>(
        &'a self,
        call: impl FnOnce() -> StoreFuture<'a, T> + Send + 'a,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let permit = self.breaker.try_acquire().map_err(|rejected| {
                Error::new(
                    ErrorKind::Store,
                    rejected.describe("the store", "store calls", "store call"),
                )
            })?;
            match call().await {
                Ok(value) => {
                    permit.success();
                    Ok(value)
                }
                Err(err) if err.is_store() => {
                    permit.failure();
                    Err(err)
                }
                Err(err) => Err(err),
            }
        })
    }
}

impl Store for GuardedStore {
    fn get<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Vec<u8>>> {
        self.guard(move || self.store.get(key))
    }

    fn set<'a>(&'a self, key: &'a [u8], value: &'a [u8], ttl: Duration) -> StoreFuture<'a, ()> {
        self.guard(move || self.store.set(key, value, ttl))
    }

    fn delete<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, bool> {
        self.guard(move || self.store.delete(key))
    }

    fn ttl<'a>(&'a self, key: &'a [u8]) -> StoreFuture<'a, Option<Duration>> {
        self.guard(move || self.store.ttl(key))
    }

    fn now_ms(&self) -> u64 {
        self.store.now_ms()
    }

    fn name(&self) -> &'static str {
        self.store.name()
    }

    fn acquire_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        self.guard(move || self.store.acquire_lease(lease_key, token, ttl))
    }

    fn lease_held<'a>(&'a self, lease_key: &'a [u8]) -> StoreFuture<'a, bool> {
        self.guard(move || self.store.lease_held(lease_key))
    }

    fn extend_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        ttl: Duration,
    ) -> StoreFuture<'a, bool> {
        self.guard(move || self.store.extend_lease(lease_key, token, ttl))
    }

    fn release_lease<'a>(
        &'a self,
        lease_key: &'a [u8],
        token: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, bool> {
        self.guard(move || self.store.release_lease(lease_key, token, notice))
    }

    fn fenced_set<'a>(&'a self, write: FencedWrite<'a>) -> StoreFuture<'a, bool> {
        self.guard(move || self.store.fenced_set(write))
    }

    fn invalidate<'a>(
        &'a self,
        key: &'a [u8],
        lease_key: &'a [u8],
        notice: Notice<'a>,
    ) -> StoreFuture<'a, ()> {
        self.guard(move || self.store.invalidate(key, lease_key, notice))
    }

    fn publish<'a>(&'a self, channel: &'a [u8], message: &'a [u8]) -> StoreFuture<'a, ()> {
        self.guard(move || self.store.publish(channel, message))
    }

    fn subscribe(&self, channel: &[u8]) -> Subscription {
        // The subscription reconnects on its own; it is not guarded.
        self.store.subscribe(channel)
    }
}
