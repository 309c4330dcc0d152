//! Limits on a real, private `redis-server`: TTLs past what Redis accepts,
//! values past `max_value_size`.

mod support;

use std::time::Duration;

use breakwater::{LeaseAttempt, Store};
use support::redis_store;

/// Redis refuses a `PX` that overflows its clock ("invalid expire time"):
/// the store cuts an endless TTL to ten years instead of failing the write.
#[tokio::test]
async fn an_endless_ttl_is_cut_to_what_redis_accepts() {
    let (_server, store) = redis_store().await;
    store.set(b"k", b"v", Duration::MAX).await.unwrap();
    assert_eq!(store.get(b"k").await.unwrap(), Some(b"v".to_vec()));
    let ttl = store.ttl(b"k").await.unwrap().unwrap();
    assert!(ttl > Duration::from_secs(9 * 365 * 24 * 3600), "{ttl:?}");
    let attempt = store.acquire_lease(b"l", b"t", Duration::MAX).await;
    assert!(matches!(attempt, Ok(LeaseAttempt::Acquired)), "{attempt:?}");
    assert!(store.extend_lease(b"l", b"t", Duration::MAX).await.unwrap());
}
