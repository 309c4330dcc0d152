//! The `Store` contract, run against every backend: `MemoryStore` on paused
//! tokio time, and `RedisStore` on a private, real `redis-server`, on a
//! private three-node Redis Cluster, and on the master of a private Redis
//! Sentinel setup.

mod support;

use std::time::Duration;

use breakwater_cache::{
    Delivery, ErrorKind, FencedRenewal, FencedWrite, Invalidate, LeaseAttempt, LeaseRequest,
    NamespaceClear, Notice, Renewal, Replace, Store, Subscription, Unchanged,
};

/// How a backend lets time pass: paused tokio time for the memory store, real
/// time for Redis (whose expiry runs on its own clock).
#[derive(Clone, Copy)]
enum Time {
    Paused,
    Real,
}

impl Time {
    async fn pass(self, d: Duration) {
        match self {
            Time::Paused => tokio::time::advance(d).await,
            Time::Real => tokio::time::sleep(d).await,
        }
    }
}

const BINARY_KEY: &[u8] = b"bw:test:{\x00\xff\r\n}:\xc3\x28 key";
const BINARY_VALUE: &[u8] = b"\x00\x01\x02\xff\xfe\r\n\0value";

async fn missing_key_reads_none(store: &dyn Store, _: Time) {
    assert_eq!(store.get(b"missing").await.unwrap(), None);
    assert_eq!(store.ttl(b"missing").await.unwrap(), None);
    assert!(!store.delete(b"missing").await.unwrap());
}

async fn set_then_get_is_binary_safe(store: &dyn Store, _: Time) {
    store
        .set(BINARY_KEY, BINARY_VALUE, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        store.get(BINARY_KEY).await.unwrap().as_deref(),
        Some(BINARY_VALUE)
    );
    store
        .set(b"empty", b"", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(store.get(b"empty").await.unwrap(), Some(Vec::new()));
}

async fn set_replaces_value_and_ttl(store: &dyn Store, _: Time) {
    store
        .set(b"k", b"one", Duration::from_secs(600))
        .await
        .unwrap();
    store
        .set(b"k", b"two", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(store.get(b"k").await.unwrap().as_deref(), Some(&b"two"[..]));
    let ttl = store.ttl(b"k").await.unwrap().unwrap();
    assert!(ttl <= Duration::from_secs(5), "{ttl:?}");
    assert!(ttl > Duration::from_secs(4), "{ttl:?}");
}

async fn ttl_is_reported_in_milliseconds(store: &dyn Store, _: Time) {
    store
        .set(b"k", b"v", Duration::from_millis(12_345))
        .await
        .unwrap();
    let ttl = store.ttl(b"k").await.unwrap().unwrap();
    assert!(ttl <= Duration::from_millis(12_345), "{ttl:?}");
    assert!(ttl > Duration::from_millis(12_000), "{ttl:?}");
}

async fn zero_ttl_is_rejected(store: &dyn Store, _: Time) {
    let err = store.set(b"k", b"v", Duration::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let err = store
        .set(b"k", b"v", Duration::from_micros(999))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(
        store.get(b"k").await.unwrap(),
        None,
        "a rejected write wrote"
    );
}

async fn delete_removes_once(store: &dyn Store, _: Time) {
    store
        .set(b"k", b"v", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(store.delete(b"k").await.unwrap());
    assert!(!store.delete(b"k").await.unwrap());
    assert_eq!(store.get(b"k").await.unwrap(), None);
}

async fn keys_expire_after_their_ttl(store: &dyn Store, time: Time) {
    store
        .set(b"short", b"v", Duration::from_millis(50))
        .await
        .unwrap();
    store
        .set(b"long", b"v", Duration::from_secs(60))
        .await
        .unwrap();
    // Redis expires on its own clock and may take a moment to notice; a
    // bounded wait, never a timing assertion.
    let mut waited = Duration::ZERO;
    while store.get(b"short").await.unwrap().is_some() {
        assert!(waited < Duration::from_secs(5), "key did not expire");
        time.pass(Duration::from_millis(25)).await;
        waited += Duration::from_millis(25);
    }
    assert!(
        waited >= Duration::from_millis(25),
        "expired before its TTL"
    );
    assert_eq!(store.ttl(b"short").await.unwrap(), None);
    assert!(store.get(b"long").await.unwrap().is_some());
}

async fn large_values_round_trip(store: &dyn Store, _: Time) {
    let value: Vec<u8> = (0..1_048_576u32).map(|i| (i % 251) as u8).collect();
    store
        .set(b"big", &value, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(store.get(b"big").await.unwrap(), Some(value));
}

async fn clock_is_unix_ms_and_monotonic(store: &dyn Store, time: Time) {
    let a = store.now_ms();
    // 2020-09-13 and 2100-01-01: a Unix-milliseconds clock, not some other unit.
    assert!((1_600_000_000_000..4_102_444_800_000).contains(&a), "{a}");
    time.pass(Duration::from_millis(20)).await;
    let b = store.now_ms();
    assert!(b >= a + 20, "clock did not advance: {a} -> {b}");
    let c = store.now_ms();
    assert!(c >= b, "clock went backwards: {b} -> {c}");
}

const LEASE: &[u8] = b"bw:test:l:{k}";
const VALUE_KEY: &[u8] = b"bw:test:v:{k}";
const CHANNEL: &[u8] = b"bw:test:events";
const TTL: Duration = Duration::from_secs(10);

fn notice(message: &[u8]) -> Notice<'_> {
    Notice {
        channel: CHANNEL,
        message,
        batch_head: None,
    }
}

fn fenced<'a>(token: &'a [u8], value: &'a [u8], value_notice: Option<&'a [u8]>) -> FencedWrite<'a> {
    FencedWrite {
        key: VALUE_KEY,
        value,
        ttl: TTL,
        lease_key: LEASE,
        token,
        notice: notice(b"plain"),
        value_notice,
        unchanged: None,
    }
}

async fn subscribed(store: &dyn Store) -> Subscription {
    let mut sub = store.subscribe(CHANNEL);
    assert!(
        sub.ready(Duration::from_secs(5)).await,
        "subscription never came up"
    );
    // Drain the (re)subscription announcement.
    while let Ok(Some(Delivery::Missed)) =
        tokio::time::timeout(Duration::from_millis(100), sub.recv()).await
    {}
    sub
}

async fn next_message(sub: &mut Subscription) -> Vec<u8> {
    loop {
        match tokio::time::timeout(Duration::from_secs(5), sub.recv()).await {
            Ok(Some(Delivery::Message(m))) => return m.to_vec(),
            Ok(Some(Delivery::Missed)) => {}
            other => panic!("no message: {other:?}"),
        }
    }
}

async fn a_lease_has_one_holder_bound_to_its_token(store: &dyn Store, time: Time) {
    let mut sub = subscribed(store).await;
    assert!(!store.lease_held(LEASE).await.unwrap());
    assert!(
        store
            .acquire_lease(LEASE, b"token-a", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(store.lease_held(LEASE).await.unwrap());
    assert!(
        !store
            .acquire_lease(LEASE, b"token-b", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    // Only the holder extends or releases it, even once it is waited on.
    assert!(!store.extend_lease(LEASE, b"token-b", TTL).await.unwrap());
    assert!(store.extend_lease(LEASE, b"token-a", TTL).await.unwrap());
    assert!(
        !store
            .release_lease(LEASE, b"token-b", notice(b"wrong"))
            .await
            .unwrap()
    );
    assert!(
        store
            .release_lease(LEASE, b"token-a", notice(b"released"))
            .await
            .unwrap()
    );
    assert_eq!(next_message(&mut sub).await, b"released");
    assert!(!store.lease_held(LEASE).await.unwrap());
    // Free again; and a lease runs out on its own.
    assert!(
        store
            .acquire_lease(LEASE, b"token-b", Duration::from_millis(50))
            .await
            .unwrap()
            .is_acquired()
    );
    time.pass(Duration::from_millis(120)).await;
    assert!(!store.lease_held(LEASE).await.unwrap(), "expired");
    assert!(
        store
            .acquire_lease(LEASE, b"token-c", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
}

async fn a_token_that_is_a_prefix_of_the_holders_holds_nothing(store: &dyn Store, _: Time) {
    assert!(
        store
            .acquire_lease(LEASE, b"abw", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        !store
            .acquire_lease(LEASE, b"other", TTL)
            .await
            .unwrap()
            .is_acquired()
    ); // marks it
    assert!(!store.extend_lease(LEASE, b"ab", TTL).await.unwrap());
    assert!(
        !store
            .release_lease(LEASE, b"ab", notice(b"x"))
            .await
            .unwrap()
    );
    assert!(!store.fenced_set(fenced(b"ab", b"v", None)).await.unwrap());
    assert_eq!(store.get(VALUE_KEY).await.unwrap(), None);
    assert!(store.fenced_set(fenced(b"abw", b"v", None)).await.unwrap());
}

async fn a_fenced_write_needs_the_lease(store: &dyn Store, _: Time) {
    assert!(
        store
            .acquire_lease(LEASE, b"token-a", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    store
        .invalidate(VALUE_KEY, LEASE, notice(b"invalidated"))
        .await
        .unwrap();
    assert!(
        !store
            .fenced_set(fenced(b"token-a", b"late", None))
            .await
            .unwrap()
    );
    assert_eq!(store.get(VALUE_KEY).await.unwrap(), None);

    assert!(
        store
            .acquire_lease(LEASE, b"token-b", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        !store
            .fenced_set(fenced(b"token-a", b"late", None))
            .await
            .unwrap()
    );
    assert!(
        store
            .fenced_set(fenced(b"token-b", b"fresh", None))
            .await
            .unwrap()
    );
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap().as_deref(),
        Some(&b"fresh"[..])
    );
    // The write released the lease.
    assert!(
        store
            .acquire_lease(LEASE, b"token-c", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
}

async fn a_waited_on_lease_hands_the_value_to_its_notice(store: &dyn Store, _: Time) {
    let mut sub = subscribed(store).await;
    // Nobody waited: the plain notice.
    assert!(
        store
            .acquire_lease(LEASE, b"token-a", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        store
            .fenced_set(fenced(b"token-a", b"one", Some(b"head:")))
            .await
            .unwrap()
    );
    assert_eq!(next_message(&mut sub).await, b"plain");
    // Somebody waited: the value notice with the value appended.
    assert!(
        store
            .acquire_lease(LEASE, b"token-b", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        !store
            .acquire_lease(LEASE, b"token-c", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        !store
            .acquire_lease(LEASE, b"token-d", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        store
            .fenced_set(fenced(b"token-b", BINARY_VALUE, Some(b"head:")))
            .await
            .unwrap()
    );
    assert_eq!(
        next_message(&mut sub).await,
        [&b"head:"[..], BINARY_VALUE].concat()
    );
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap().as_deref(),
        Some(BINARY_VALUE)
    );
    // Somebody waited but the writer offers no value notice: the plain one.
    assert!(
        store
            .acquire_lease(LEASE, b"token-e", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        !store
            .acquire_lease(LEASE, b"token-f", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        store
            .fenced_set(fenced(b"token-e", b"big", None))
            .await
            .unwrap()
    );
    assert_eq!(next_message(&mut sub).await, b"plain");
    // The mark went with the lease: the next holder starts unwaited.
    assert!(
        store
            .acquire_lease(LEASE, b"token-g", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        store
            .fenced_set(fenced(b"token-g", b"two", Some(b"head:")))
            .await
            .unwrap()
    );
    assert_eq!(next_message(&mut sub).await, b"plain");
}

async fn a_lease_attempt_is_idempotent_and_reports_the_time_left(store: &dyn Store, _: Time) {
    assert!(
        store
            .acquire_lease(LEASE, b"token-a", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    // The same token again (a retried call whose reply was lost): still its.
    assert!(
        store
            .acquire_lease(LEASE, b"token-a", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    match store.acquire_lease(LEASE, b"token-b", TTL).await.unwrap() {
        LeaseAttempt::Held { ttl } => {
            assert!(ttl <= TTL && ttl > TTL - Duration::from_secs(2), "{ttl:?}");
        }
        other => panic!("token-b took a held lease: {other:?}"),
    }
    // Token a still holds it, waited on or not.
    assert!(store.extend_lease(LEASE, b"token-a", TTL).await.unwrap());
}

async fn replace_writes_revokes_the_lease_and_publishes(store: &dyn Store, _: Time) {
    let mut sub = subscribed(store).await;
    assert!(
        store
            .acquire_lease(LEASE, b"token-a", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    store
        .replace(VALUE_KEY, BINARY_VALUE, TTL, LEASE, notice(b"replaced"))
        .await
        .unwrap();
    assert_eq!(next_message(&mut sub).await, b"replaced");
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap().as_deref(),
        Some(BINARY_VALUE)
    );
    assert!(
        !store.lease_held(LEASE).await.unwrap(),
        "the lease was revoked"
    );
    // The revoked holder's write is refused: the replaced value stands.
    assert!(
        !store
            .fenced_set(fenced(b"token-a", b"old", None))
            .await
            .unwrap()
    );
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap().as_deref(),
        Some(BINARY_VALUE)
    );
    // The revoked lease is free: the next load takes it at once.
    assert!(
        store
            .acquire_lease(LEASE, b"token-b", TTL)
            .await
            .unwrap()
            .is_acquired(),
        "a revoked lease is free to take"
    );
    let ttl = store.ttl(VALUE_KEY).await.unwrap().unwrap();
    assert!(ttl <= TTL && ttl > TTL - Duration::from_secs(2), "{ttl:?}");
    let zero = store
        .replace(VALUE_KEY, b"v", Duration::ZERO, LEASE, notice(b"x"))
        .await
        .unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::Config, "{zero}");
}

/// Every one of `keys` is named in exactly one of the next messages, each
/// `head` and then its keys ([`Notice::for_keys`]), and nothing else is.
async fn assert_named_once(sub: &mut Subscription, keys: &[Vec<u8>]) {
    let mut named = std::collections::HashSet::new();
    while named.len() < keys.len() {
        let message = next_message(sub).await;
        let mut list = message.strip_prefix(b"head").expect("the head first");
        assert!(!list.is_empty(), "a message names keys");
        while let Some((len, rest)) = list.split_first_chunk::<4>() {
            let len = u32::from_be_bytes(*len) as usize;
            assert!(named.insert(rest[..len].to_vec()), "named twice");
            list = &rest[len..];
        }
        assert!(list.is_empty(), "a whole list");
    }
    let expected: std::collections::HashSet<Vec<u8>> = keys.iter().cloned().collect();
    assert_eq!(named, expected);
}

async fn replace_many_writes_every_entry_and_revokes_every_lease(store: &dyn Store, _: Time) {
    let mut sub = subscribed(store).await;
    // 1,100 keys: more than one step's worth, spread over many slots.
    let keys: Vec<Vec<u8>> = (0..1_100)
        .map(|i| format!("bw:test:v:{{m{i}}}").into_bytes())
        .collect();
    let leases: Vec<Vec<u8>> = (0..1_100)
        .map(|i| format!("bw:test:l:{{m{i}}}").into_bytes())
        .collect();
    for lease in leases.iter().step_by(100) {
        assert!(
            store
                .acquire_lease(lease, b"holder", TTL)
                .await
                .unwrap()
                .is_acquired()
        );
    }
    let writes: Vec<Replace<'_>> = keys
        .iter()
        .zip(&leases)
        .enumerate()
        .map(|(i, (key, lease_key))| Replace {
            key,
            value: if i % 2 == 0 { BINARY_VALUE } else { b"odd" },
            ttl: TTL,
            lease_key,
        })
        .collect();
    store.replace_many(&writes, notice(b"head")).await.unwrap();
    assert_named_once(&mut sub, &keys).await;
    let values = store
        .get_many(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>())
        .await
        .unwrap();
    for (i, value) in values.iter().enumerate() {
        let want: &[u8] = if i % 2 == 0 { BINARY_VALUE } else { b"odd" };
        assert_eq!(value.as_deref(), Some(want), "key {i}");
    }
    for lease in leases.iter().step_by(100) {
        assert!(!store.lease_held(lease).await.unwrap());
    }
    let ttl = store.ttl(&keys[1_099]).await.unwrap().unwrap();
    assert!(ttl <= TTL && ttl > TTL - Duration::from_secs(2), "{ttl:?}");
    store.replace_many(&[], notice(b"head")).await.unwrap();
    // A zero TTL is refused before anything is written.
    let zero = [Replace {
        key: b"bw:test:v:{zero}",
        value: b"v",
        ttl: Duration::ZERO,
        lease_key: b"bw:test:l:{zero}",
    }];
    let refused = store
        .replace_many(&zero, notice(b"head"))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Config, "{refused}");
    assert_eq!(store.get(b"bw:test:v:{zero}").await.unwrap(), None);
}

/// A bulk write revokes each load in flight of its keys: the holder can
/// no longer write, extend or renew, and another token takes the lease at
/// once (it does not wait out the revoked one).
async fn a_bulk_write_revokes_its_keys_loads_and_frees_their_leases(store: &dyn Store, _: Time) {
    for token in [&b"writer"[..], b"extender", b"renewer"] {
        store.set(VALUE_KEY, b"..abcdef..", TTL).await.unwrap();
        assert!(
            store
                .acquire_lease(LEASE, token, TTL)
                .await
                .unwrap()
                .is_acquired()
        );
        let writes = [
            Replace {
                key: VALUE_KEY,
                value: b"..bulk....",
                ttl: TTL,
                lease_key: LEASE,
            },
            Replace {
                key: b"bw:test:v:{other}",
                value: b"other",
                ttl: TTL,
                lease_key: b"bw:test:l:{other}",
            },
        ];
        store.replace_many(&writes, notice(b"bulk")).await.unwrap();
        assert!(!store.lease_held(LEASE).await.unwrap());
        match token {
            b"writer" => assert!(!store.fenced_set(fenced(token, b"old", None)).await.unwrap()),
            b"extender" => assert!(!store.extend_lease(LEASE, token, TTL).await.unwrap()),
            _ => {
                let renewed = store
                    .fenced_renew(renewal(token, b"bulk", b"BULK"))
                    .await
                    .unwrap();
                assert_eq!(renewed, Renewal::Refused);
            }
        }
        assert_eq!(
            store.get(VALUE_KEY).await.unwrap().as_deref(),
            Some(&b"..bulk...."[..])
        );
        // Free at once for another token (as long as the revoked one's, as
        // every token of one build is), and not the revoked one's.
        let next = token.to_ascii_uppercase();
        assert!(
            store
                .acquire_lease(LEASE, &next, TTL)
                .await
                .unwrap()
                .is_acquired()
        );
        assert!(store.lease_held(LEASE).await.unwrap());
        assert!(!store.fenced_set(fenced(token, b"old", None)).await.unwrap());
        assert!(
            store
                .release_lease(LEASE, &next, notice(b"released"))
                .await
                .unwrap()
        );
    }
}

async fn invalidate_many_deletes_every_entry_and_lease_and_names_each_key(
    store: &dyn Store,
    _: Time,
) {
    let mut sub = subscribed(store).await;
    // 1,100 keys: more than one step's worth, spread over many slots.
    let keys: Vec<Vec<u8>> = (0..1_100)
        .map(|i| format!("bw:test:v:{{d{i}}}").into_bytes())
        .collect();
    let leases: Vec<Vec<u8>> = (0..1_100)
        .map(|i| format!("bw:test:l:{{d{i}}}").into_bytes())
        .collect();
    for key in keys.iter().step_by(2) {
        store.set(key, BINARY_VALUE, TTL).await.unwrap();
    }
    for lease in leases.iter().step_by(100) {
        let taken = store.acquire_lease(lease, b"holder", TTL).await.unwrap();
        assert!(taken.is_acquired());
    }
    let batch: Vec<Invalidate<'_>> = keys
        .iter()
        .zip(&leases)
        .map(|(key, lease_key)| Invalidate { key, lease_key })
        .collect();
    store
        .invalidate_many(&batch, notice(b"head"))
        .await
        .unwrap();
    assert_named_once(&mut sub, &keys).await;
    let values = store
        .get_many(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>())
        .await
        .unwrap();
    assert!(values.iter().all(Option::is_none), "every entry deleted");
    for lease in leases.iter().step_by(100) {
        assert!(!store.lease_held(lease).await.unwrap());
    }
    store.invalidate_many(&[], notice(b"head")).await.unwrap();
}

async fn get_many_reads_in_order_across_slots(store: &dyn Store, _: Time) {
    // 600 keys: more than one command's worth, spread over many slots.
    let keys: Vec<Vec<u8>> = (0..600)
        .map(|i| format!("bw:test:v:{{g{i}}}").into_bytes())
        .collect();
    for (i, key) in keys.iter().enumerate() {
        if i % 3 != 0 {
            store
                .set(key, format!("value {i}").as_bytes(), TTL)
                .await
                .unwrap();
        }
    }
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let values = store.get_many(&refs).await.unwrap();
    assert_eq!(values.len(), keys.len());
    for (i, value) in values.iter().enumerate() {
        let expected = (i % 3 != 0).then(|| format!("value {i}").into_bytes());
        assert_eq!(value, &expected, "key {i}");
    }
    // A key asked twice answers twice; none asked, nothing answered.
    let twice = store.get_many(&[refs[1], refs[1]]).await.unwrap();
    assert_eq!(twice[0], twice[1]);
    assert!(store.get_many(&[]).await.unwrap().is_empty());
}

async fn acquire_leases_takes_each_as_acquire_lease_would(store: &dyn Store, _: Time) {
    let leases: Vec<Vec<u8>> = (0..300)
        .map(|i| format!("bw:test:l:{{b{i}}}").into_bytes())
        .collect();
    // Someone else holds every tenth.
    for lease in leases.iter().step_by(10) {
        assert!(
            store
                .acquire_lease(lease, b"other", TTL)
                .await
                .unwrap()
                .is_acquired()
        );
    }
    let tokens: Vec<Vec<u8>> = (0..300)
        .map(|i| format!("token-{i}").into_bytes())
        .collect();
    let requests: Vec<LeaseRequest<'_>> = leases
        .iter()
        .zip(&tokens)
        .map(|(key, token)| LeaseRequest { key, token })
        .collect();
    let attempts = store.acquire_leases(&requests, TTL).await.unwrap();
    assert_eq!(attempts.len(), leases.len());
    for (i, attempt) in attempts.iter().enumerate() {
        if i % 10 == 0 {
            match attempt {
                LeaseAttempt::Held { ttl } => assert!(*ttl <= TTL, "{ttl:?}"),
                other => panic!("lease {i} is another's, yet {other:?}"),
            }
        } else {
            assert!(attempt.is_acquired(), "lease {i}: {attempt:?}");
            assert!(
                store
                    .extend_lease(&leases[i], &tokens[i], TTL)
                    .await
                    .unwrap()
            );
        }
    }
    // Idempotent for the holders; still refused for the others.
    let again = store.acquire_leases(&requests, TTL).await.unwrap();
    for (i, (a, b)) in attempts.iter().zip(&again).enumerate() {
        assert_eq!(a.is_acquired(), b.is_acquired(), "lease {i}");
    }
    assert!(store.acquire_leases(&[], TTL).await.unwrap().is_empty());
    let zero = store
        .acquire_leases(&requests[..1], Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::Config, "{zero}");
}

/// A fresh generation, as a cache draws them (in `[2^40, 2^52)`).
const FRESH: u64 = 1 << 41;

/// The TTL `key` has left, which must be set.
async fn left(store: &dyn Store, key: &[u8]) -> Duration {
    store
        .ttl(key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{} has no TTL", String::from_utf8_lossy(key)))
}

async fn bump_generation_counts_on_or_starts_fresh_and_publishes(store: &dyn Store, _: Time) {
    const TAG: &[u8] = b"bw:test:t:{tag}";
    let ttl = Duration::from_secs(600);
    let mut sub = subscribed(store).await;
    // A missing counter starts at the fresh value, with the TTL.
    let first = store
        .bump_generation(TAG, FRESH, ttl, notice(b"bumped"))
        .await
        .unwrap();
    assert_eq!(first, FRESH);
    assert_eq!(next_message(&mut sub).await, b"bumped");
    assert_eq!(
        store.get(TAG).await.unwrap(),
        Some(FRESH.to_string().into_bytes()),
        "stored as decimal digits"
    );
    let ttl_left = left(store, TAG).await;
    assert!(ttl_left <= ttl && ttl_left > ttl - Duration::from_secs(5));
    // A counter that exists goes on by one, whatever the fresh value.
    for i in 1..=20 {
        let next = store
            .bump_generation(TAG, FRESH + 1_000, ttl, notice(b"again"))
            .await
            .unwrap();
        assert_eq!(next, FRESH + i);
    }
    // Its TTL is lengthened, never shortened.
    let hour = Duration::from_secs(3600);
    store
        .bump_generation(TAG, FRESH, hour, notice(b"x"))
        .await
        .unwrap();
    assert!(left(store, TAG).await > hour - Duration::from_secs(5));
    let bumped = store
        .bump_generation(TAG, FRESH, Duration::from_secs(1), notice(b"x"))
        .await
        .unwrap();
    assert_eq!(bumped, FRESH + 22);
    assert!(left(store, TAG).await > hour - Duration::from_secs(5));
    // What is not a generation starts again at the fresh value.
    for foreign in [
        &b"not a number"[..],
        b"",
        b"-3",
        b"1.5",
        b"9007199254740992",
    ] {
        store.set(TAG, foreign, ttl).await.unwrap();
        let fresh = store
            .bump_generation(TAG, FRESH + 77, ttl, notice(b"x"))
            .await
            .unwrap();
        assert_eq!(fresh, FRESH + 77, "{foreign:?}");
    }
    // Up to 2^53 a counter goes on exactly (a Lua number is a double).
    store.set(TAG, b"9007199254740990", ttl).await.unwrap();
    assert_eq!(
        store
            .bump_generation(TAG, FRESH, ttl, notice(b"x"))
            .await
            .unwrap(),
        9_007_199_254_740_991
    );
    // Other counters are their own.
    let other = store
        .bump_generation(b"bw:test:t:{other}", FRESH + 5, ttl, notice(b"x"))
        .await
        .unwrap();
    assert_eq!(other, FRESH + 5);
    let zero = store
        .bump_generation(TAG, FRESH, Duration::ZERO, notice(b"x"))
        .await
        .unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::Config, "{zero}");
}

/// Several counters (on several slots of a cluster) bumped in one call:
/// each as `bump_generation` would (a missing or foreign one at the fresh
/// value, one that exists on by one, its TTL only lengthened); the notice
/// is published once per step (once on one server).
async fn bump_generations_bump_each_counter_and_publish(store: &dyn Store, _: Time) {
    let keys: Vec<Vec<u8>> = (0..12)
        .map(|i| format!("bw:test:t:{{tag{i}}}").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let ttl = Duration::from_secs(600);
    let hour = Duration::from_secs(3600);
    store.set(refs[0], b"not a number", ttl).await.unwrap();
    store
        .bump_generation(refs[1], FRESH + 40, hour, notice(b"x"))
        .await
        .unwrap();
    let mut sub = subscribed(store).await;
    store
        .bump_generations(&refs, FRESH, ttl, notice(b"many"))
        .await
        .unwrap();
    assert_eq!(next_message(&mut sub).await, b"many");
    for (i, key) in refs.iter().enumerate() {
        let expected = if i == 1 { FRESH + 41 } else { FRESH };
        assert_eq!(
            store.get(key).await.unwrap(),
            Some(expected.to_string().into_bytes()),
            "{i}"
        );
        let ttl_left = left(store, key).await;
        let floor = if i == 1 { hour } else { ttl };
        assert!(
            ttl_left > floor - Duration::from_secs(5),
            "{i}: {ttl_left:?}"
        );
    }
    // Again: each goes on by one.
    store
        .bump_generations(&refs, FRESH + 500, ttl, notice(b"again"))
        .await
        .unwrap();
    for (i, key) in refs.iter().enumerate() {
        let expected = if i == 1 { FRESH + 42 } else { FRESH + 1 };
        assert_eq!(
            store.get(key).await.unwrap(),
            Some(expected.to_string().into_bytes()),
            "{i}"
        );
    }
    store
        .bump_generations(&[], FRESH, ttl, notice(b"none"))
        .await
        .unwrap();
    let zero = store
        .bump_generations(&refs, FRESH, Duration::ZERO, notice(b"x"))
        .await
        .unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::Config, "{zero}");
}

/// A soft bump (`expire_tag`): `G` or `G:H:T` becomes `G+1:H:at` (the
/// floor kept), a missing or foreign counter starts at the fresh value
/// (plain digits), the notice is published, the TTL only lengthened; a
/// hard bump and a read-or-create read both forms, and the hard bump
/// writes plain digits again.
async fn expire_generation_moves_on_softly_keeping_the_floor(store: &dyn Store, _: Time) {
    const TAG: &[u8] = b"bw:test:t:{soft}";
    let ttl = Duration::from_secs(600);
    let stored = |g: u64, h: u64, t: u64| Some(format!("{g}:{h}:{t}").into_bytes());
    let mut sub = subscribed(store).await;
    // Missing: the fresh value, as plain digits (nothing recorded it).
    let first = store
        .expire_generation(TAG, FRESH, ttl, 5_000, notice(b"expired"))
        .await
        .unwrap();
    assert_eq!(first, FRESH);
    assert_eq!(next_message(&mut sub).await, b"expired");
    assert_eq!(
        store.get(TAG).await.unwrap(),
        Some(FRESH.to_string().into_bytes())
    );
    let ttl_left = left(store, TAG).await;
    assert!(ttl_left <= ttl && ttl_left > ttl - Duration::from_secs(5));
    // Plain `G`: its floor is `G`.
    let next = store
        .expire_generation(TAG, FRESH + 1_000, ttl, 6_000, notice(b"x"))
        .await
        .unwrap();
    assert_eq!(next, FRESH + 1);
    assert_eq!(
        store.get(TAG).await.unwrap(),
        stored(FRESH + 1, FRESH, 6_000)
    );
    // Again: the floor kept, the time the later one.
    let next = store
        .expire_generation(TAG, FRESH + 1_000, ttl, 7_000, notice(b"x"))
        .await
        .unwrap();
    assert_eq!(next, FRESH + 2);
    assert_eq!(
        store.get(TAG).await.unwrap(),
        stored(FRESH + 2, FRESH, 7_000)
    );
    // A write's read-or-create reads `G` and changes nothing.
    assert_eq!(
        store.tag_generations(&[TAG], FRESH + 9, ttl).await.unwrap(),
        vec![FRESH + 2]
    );
    assert_eq!(
        store.get(TAG).await.unwrap(),
        stored(FRESH + 2, FRESH, 7_000)
    );
    // A hard bump: one on, plain digits (the floor moves up to it).
    let hard = store
        .bump_generation(TAG, FRESH + 1_000, ttl, notice(b"x"))
        .await
        .unwrap();
    assert_eq!(hard, FRESH + 3);
    assert_eq!(
        store.get(TAG).await.unwrap(),
        Some((FRESH + 3).to_string().into_bytes())
    );
    let next = store
        .expire_generation(TAG, FRESH + 1_000, ttl, 8_000, notice(b"x"))
        .await
        .unwrap();
    assert_eq!(next, FRESH + 4);
    assert_eq!(
        store.get(TAG).await.unwrap(),
        stored(FRESH + 4, FRESH + 3, 8_000)
    );
    // The TTL is lengthened, never shortened.
    let hour = Duration::from_secs(3600);
    store
        .expire_generation(TAG, FRESH, hour, 9_000, notice(b"x"))
        .await
        .unwrap();
    assert!(left(store, TAG).await > hour - Duration::from_secs(5));
    store
        .expire_generation(TAG, FRESH, Duration::from_secs(1), 9_500, notice(b"x"))
        .await
        .unwrap();
    assert!(left(store, TAG).await > hour - Duration::from_secs(5));
    assert_eq!(
        store.get(TAG).await.unwrap(),
        stored(FRESH + 6, FRESH + 3, 9_500)
    );
    // What is not a state starts again at the fresh value, by either bump
    // and by a read-or-create.
    for foreign in [
        &b"not a number"[..],
        b"",
        b"1:1",
        b"5:6:1",
        b"5:4:1:1:1",
        b"5:4:1:",
        b"5:4:-1",
        b"9007199254740992:4:1",
    ] {
        store.set(TAG, foreign, ttl).await.unwrap();
        let fresh = store
            .expire_generation(TAG, FRESH + 77, ttl, 1, notice(b"x"))
            .await
            .unwrap();
        assert_eq!(fresh, FRESH + 77, "{foreign:?}");
        assert_eq!(
            store.get(TAG).await.unwrap(),
            Some((FRESH + 77).to_string().into_bytes())
        );
        store.set(TAG, foreign, ttl).await.unwrap();
        let fresh = store
            .bump_generation(TAG, FRESH + 78, ttl, notice(b"x"))
            .await
            .unwrap();
        assert_eq!(fresh, FRESH + 78, "{foreign:?}");
        store.set(TAG, foreign, ttl).await.unwrap();
        let fresh = store
            .tag_generations(&[TAG], FRESH + 79, ttl)
            .await
            .unwrap();
        assert_eq!(fresh, vec![FRESH + 79], "{foreign:?}");
    }
    // Up to 2^53 a counter goes on exactly, in either form.
    store.set(TAG, b"9007199254740989:5:1", ttl).await.unwrap();
    assert_eq!(
        store
            .expire_generation(TAG, FRESH, ttl, 2, notice(b"x"))
            .await
            .unwrap(),
        9_007_199_254_740_990
    );
    assert_eq!(
        store
            .bump_generation(TAG, FRESH, ttl, notice(b"x"))
            .await
            .unwrap(),
        9_007_199_254_740_991
    );
    let zero = store
        .expire_generation(TAG, FRESH, Duration::ZERO, 1, notice(b"x"))
        .await
        .unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::Config, "{zero}");
}

/// `tag_states` replies each counter's whole state, `G:H:T:F`: a missing
/// or foreign counter created as `fresh:fresh:0:now`; one whose last hard
/// change has no time (plain digits, or `G:H:T`) dated now, the rest
/// kept; one with a time read as it is. A soft bump keeps the time, a
/// hard bump drops it (plain digits again), and the other counter
/// operations read the four-part form.
async fn tag_states_date_each_counters_last_hard_change(store: &dyn Store, _: Time) {
    let keys: [&[u8]; 4] = [
        b"bw:test:t:{s1}",
        b"bw:test:t:{s2}",
        b"bw:test:t:{s3}",
        b"bw:test:t:{s4}",
    ];
    let ttl = Duration::from_secs(600);
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    store
        .set(keys[1], b"12345", Duration::from_secs(5))
        .await
        .unwrap();
    store.set(keys[2], b"12:10:777", ttl).await.unwrap();
    store.set(keys[3], b"junk", ttl).await.unwrap();
    // A caller's view of the clock ahead of the store's is taken as it is.
    let at = store.now_ms() + 600_000;
    let got = store.tag_states(&keys, FRESH, ttl, at).await.unwrap();
    let got: Vec<String> = got.iter().map(|s| text(s)).collect();
    assert_eq!(
        got,
        [
            format!("{FRESH}:{FRESH}:0:{at}"),
            format!("12345:12345:0:{at}"),
            format!("12:10:777:{at}"),
            format!("{FRESH}:{FRESH}:0:{at}"),
        ]
    );
    for (key, state) in keys.iter().zip(&got) {
        assert_eq!(text(&store.get(key).await.unwrap().unwrap()), *state);
        assert!(left(store, key).await > ttl - Duration::from_secs(5));
    }
    // Read again later: each time kept.
    let again = store
        .tag_states(&keys, FRESH + 1, ttl, 9_000)
        .await
        .unwrap();
    let again: Vec<String> = again.iter().map(|s| text(s)).collect();
    assert_eq!(again, got);
    // The other operations read the four-part form.
    assert_eq!(
        store
            .tag_generations(&keys[1..3], FRESH + 2, ttl)
            .await
            .unwrap(),
        [12_345, 12]
    );
    // A soft bump keeps the time of the last hard change.
    let soft = store
        .expire_generation(keys[1], FRESH + 3, ttl, 9_500, notice(b"x"))
        .await
        .unwrap();
    assert_eq!(soft, 12_346);
    assert_eq!(
        text(&store.get(keys[1]).await.unwrap().unwrap()),
        format!("12346:12345:9500:{at}")
    );
    // A hard bump writes plain digits: no time, until the next read dates it.
    let hard = store
        .bump_generation(keys[2], FRESH + 4, ttl, notice(b"x"))
        .await
        .unwrap();
    assert_eq!(hard, 13);
    assert_eq!(text(&store.get(keys[2]).await.unwrap().unwrap()), "13");
    // Dated no earlier than the store's clock when it runs, whatever the
    // caller's view (a call run late must not date a change before it).
    let before = store.now_ms();
    let dated = store
        .tag_states(&keys[2..3], FRESH + 5, ttl, 1)
        .await
        .unwrap();
    let dated = text(&dated[0]);
    let f: u64 = dated.strip_prefix("13:13:0:").unwrap().parse().unwrap();
    assert!(f + 50 >= before, "{dated} dated before {before}");
}

async fn tag_generations_read_or_create_each_counter(store: &dyn Store, time: Time) {
    // On different slots of a cluster.
    let keys: [&[u8]; 3] = [b"bw:test:t:{a}", b"bw:test:t:{b}", b"bw:test:t:{c}"];
    let ttl = Duration::from_secs(600);
    store
        .set(keys[1], b"12345", Duration::from_secs(5))
        .await
        .unwrap();
    store
        .set(keys[2], b"junk", Duration::from_secs(5))
        .await
        .unwrap();
    // Missing or foreign: created with the fresh value; a generation: read.
    let got = store.tag_generations(&keys, FRESH, ttl).await.unwrap();
    assert_eq!(got, [FRESH, 12_345, FRESH]);
    for (key, expected) in keys.iter().zip(&got) {
        assert_eq!(
            store.get(key).await.unwrap(),
            Some(expected.to_string().into_bytes())
        );
        // Each TTL at least `ttl` (the read one's lengthened from 5 s).
        assert!(left(store, key).await > ttl - Duration::from_secs(5));
    }
    // Read again with another fresh value and a shorter TTL: nothing
    // replaced, no TTL shortened.
    let again = store
        .tag_generations(&keys, FRESH + 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(again, got);
    for key in keys {
        assert!(left(store, key).await > ttl - Duration::from_secs(5));
    }
    // A bump is seen; an expired counter is created again, fresh.
    store
        .bump_generation(keys[0], FRESH + 9, ttl, notice(b"x"))
        .await
        .unwrap();
    store
        .set(keys[1], b"7", Duration::from_millis(10))
        .await
        .unwrap();
    time.pass(Duration::from_millis(50)).await;
    assert_eq!(
        store.tag_generations(&keys, FRESH + 2, ttl).await.unwrap(),
        [FRESH + 1, FRESH + 2, FRESH]
    );
    // Many counters (more than one script carries), in order.
    let many: Vec<Vec<u8>> = (0..300)
        .map(|i| format!("bw:test:t:{{m{i}}}").into_bytes())
        .collect();
    for (i, key) in many.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        store.set(key, i.to_string().as_bytes(), ttl).await.unwrap();
    }
    let many: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
    let got = store.tag_generations(&many, FRESH, ttl).await.unwrap();
    for (i, generation) in got.iter().enumerate() {
        let expected = if i % 3 == 0 { i as u64 } else { FRESH };
        assert_eq!(*generation, expected, "counter {i}");
    }
    assert!(
        store
            .tag_generations(&[], FRESH, ttl)
            .await
            .unwrap()
            .is_empty()
    );
    let zero = store
        .tag_generations(&keys, FRESH, Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(zero.kind(), ErrorKind::Config, "{zero}");
}

/// The previous version's key of `VALUE_KEY`, in its hash slot.
const BESIDE: &[u8] = b"bw:test@1:v:{k}";

/// `pin` returns what a key holds, or writes the placeholder (with its TTL)
/// where it holds nothing; a fenced write with `unchanged` lands only while
/// that key still holds the pinned bytes, and is refused (the lease
/// released, the notice published) once it changed or went.
async fn a_pin_holds_a_key_and_a_fenced_write_can_need_it_unchanged(store: &dyn Store, _: Time) {
    let pinned = store.pin(BESIDE, b"placeholder", TTL).await.unwrap();
    assert_eq!(pinned, b"placeholder");
    assert_eq!(
        store.get(BESIDE).await.unwrap().as_deref(),
        Some(&b"placeholder"[..])
    );
    let ttl = store
        .ttl(BESIDE)
        .await
        .unwrap()
        .expect("the placeholder has a TTL");
    assert!(ttl <= TTL && ttl > TTL / 2, "{ttl:?}");
    store.set(BESIDE, b"old entry", TTL).await.unwrap();
    assert_eq!(
        store.pin(BESIDE, b"other", TTL).await.unwrap(),
        b"old entry"
    );

    let write = |token: &'static [u8], bytes: &'static [u8]| FencedWrite {
        unchanged: Some(Unchanged { key: BESIDE, bytes }),
        ..fenced(token, b"new", None)
    };
    // Unchanged: written.
    assert!(
        store
            .acquire_lease(LEASE, b"t1", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(store.fenced_set(write(b"t1", b"old entry")).await.unwrap());
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap().as_deref(),
        Some(&b"new"[..])
    );
    store.delete(VALUE_KEY).await.unwrap();
    // Changed, then gone: refused, the lease released and waiters told.
    let mut sub = subscribed(store).await;
    for change in [Some(&b"changed"[..]), None] {
        match change {
            Some(bytes) => store.set(BESIDE, bytes, TTL).await.unwrap(),
            None => assert!(store.delete(BESIDE).await.unwrap()),
        }
        assert!(
            store
                .acquire_lease(LEASE, b"t2", TTL)
                .await
                .unwrap()
                .is_acquired()
        );
        assert!(!store.fenced_set(write(b"t2", b"old entry")).await.unwrap());
        assert_eq!(store.get(VALUE_KEY).await.unwrap(), None);
        assert_eq!(next_message(&mut sub).await, b"plain");
        assert!(
            store
                .acquire_lease(LEASE, b"t3", TTL)
                .await
                .unwrap()
                .is_acquired(),
            "the refused write released the lease"
        );
        assert!(
            store
                .release_lease(LEASE, b"t3", notice(b"released"))
                .await
                .unwrap()
        );
        assert_eq!(next_message(&mut sub).await, b"released");
    }
}

fn renewal<'a>(token: &'a [u8], expected: &'a [u8], patch: &'a [u8]) -> FencedRenewal<'a> {
    FencedRenewal {
        key: VALUE_KEY,
        offset: 2,
        expected,
        patch,
        ttl: Duration::from_secs(30),
        lease_key: LEASE,
        token,
        notice: notice(b"renewed"),
    }
}

async fn a_renewal_patches_in_place_only_for_the_holder_of_an_unchanged_value(
    store: &dyn Store,
    _: Time,
) {
    let mut sub = subscribed(store).await;
    store.set(VALUE_KEY, b"..abcdef..", TTL).await.unwrap();
    assert!(
        store
            .acquire_lease(LEASE, b"token-a", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    // Not the holder: refused, nothing changed, the lease still held.
    assert_eq!(
        store
            .fenced_renew(renewal(b"token-b", b"abcdef", b"XY"))
            .await
            .unwrap(),
        Renewal::Refused
    );
    // Not the bytes expected: declined, nothing changed, the lease kept.
    assert_eq!(
        store
            .fenced_renew(renewal(b"token-a", b"abcdeX", b"XY"))
            .await
            .unwrap(),
        Renewal::Declined
    );
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap().as_deref(),
        Some(&b"..abcdef.."[..])
    );
    assert!(store.lease_held(LEASE).await.unwrap());
    // The holder, the bytes as expected: patched at the offset, the TTL
    // reset, the lease released, the notice sent.
    assert_eq!(
        store
            .fenced_renew(renewal(b"token-a", b"abcdef", b"XY"))
            .await
            .unwrap(),
        Renewal::Renewed
    );
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap().as_deref(),
        Some(&b"..XYcdef.."[..])
    );
    let left = store.ttl(VALUE_KEY).await.unwrap().unwrap();
    assert!(left > TTL && left <= Duration::from_secs(30), "{left:?}");
    assert!(!store.lease_held(LEASE).await.unwrap());
    assert_eq!(next_message(&mut sub).await, b"renewed");
    // A value that is gone: declined, nothing written.
    store.delete(VALUE_KEY).await.unwrap();
    assert!(
        store
            .acquire_lease(LEASE, b"token-c", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert_eq!(
        store
            .fenced_renew(renewal(b"token-c", b"XYcdef", b"ZZ"))
            .await
            .unwrap(),
        Renewal::Declined
    );
    assert_eq!(store.get(VALUE_KEY).await.unwrap(), None);
    assert!(store.lease_held(LEASE).await.unwrap());
}

/// An entry's header (format version 1, msgpack, no flags) with these
/// windows, and `body`.
fn entry_bytes(fresh_until: u64, stale_until: u64, body: &[u8]) -> Vec<u8> {
    let mut out = b"BW\x01\x01\x00".to_vec();
    out.extend_from_slice(&fresh_until.to_be_bytes());
    out.extend_from_slice(&stale_until.to_be_bytes());
    out.extend_from_slice(&7u32.to_be_bytes());
    out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    out.extend_from_slice(body);
    out
}

async fn expire_entry_ends_the_fresh_window_revokes_the_lease_and_publishes(
    store: &dyn Store,
    _: Time,
) {
    let mut sub = subscribed(store).await;
    store
        .set(VALUE_KEY, &entry_bytes(5_000, 9_000, b"xyz"), TTL)
        .await
        .unwrap();
    assert!(
        store
            .acquire_lease(LEASE, b"token-a", TTL)
            .await
            .unwrap()
            .is_acquired()
    );
    assert!(
        store
            .expire_entry(VALUE_KEY, LEASE, 4_000, notice(b"expired"))
            .await
            .unwrap()
    );
    assert_eq!(next_message(&mut sub).await, b"expired");
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap(),
        Some(entry_bytes(4_000, 9_000, b"xyz"))
    );
    // The TTL is the entry's own still, and the lease is gone: a load that
    // began before cannot write.
    assert!(store.ttl(VALUE_KEY).await.unwrap().unwrap() > Duration::from_secs(5));
    assert!(
        !store
            .fenced_set(fenced(b"token-a", b"late", None))
            .await
            .unwrap()
    );
    // Never later than it was, never past its stale window; stale
    // already, a millisecond earlier: the bytes always change (a version
    // transition pinned beside them must hear it).
    store
        .expire_entry(VALUE_KEY, LEASE, 4_500, notice(b"again"))
        .await
        .unwrap();
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap(),
        Some(entry_bytes(3_999, 9_000, b"xyz"))
    );
    store
        .set(VALUE_KEY, &entry_bytes(5_000, 6_000, b""), TTL)
        .await
        .unwrap();
    store
        .expire_entry(VALUE_KEY, LEASE, 7_000, notice(b"past"))
        .await
        .unwrap();
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap(),
        Some(entry_bytes(4_999, 6_000, b""))
    );
    // The millisecond borrows across bytes.
    store
        .set(VALUE_KEY, &entry_bytes(0x1_0000, 0x2_0000, b""), TTL)
        .await
        .unwrap();
    store
        .expire_entry(VALUE_KEY, LEASE, 0x3_0000, notice(b"borrow"))
        .await
        .unwrap();
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap(),
        Some(entry_bytes(0xffff, 0x2_0000, b""))
    );
    // Byte order, not a string's collation: 0x80.. is above 0x7f...
    store
        .set(VALUE_KEY, &entry_bytes(0x80 << 8, u64::MAX, b""), TTL)
        .await
        .unwrap();
    store
        .expire_entry(VALUE_KEY, LEASE, 0x7f << 8, notice(b"order"))
        .await
        .unwrap();
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap(),
        Some(entry_bytes(0x7f << 8, u64::MAX, b""))
    );
    // No entry, or bytes that are none: nothing changes.
    store
        .set(VALUE_KEY, b"foreign bytes here!!!!", TTL)
        .await
        .unwrap();
    assert!(
        !store
            .expire_entry(VALUE_KEY, LEASE, 1, notice(b"foreign"))
            .await
            .unwrap()
    );
    assert_eq!(
        store.get(VALUE_KEY).await.unwrap().as_deref(),
        Some(&b"foreign bytes here!!!!"[..])
    );
    store.delete(VALUE_KEY).await.unwrap();
    assert!(
        !store
            .expire_entry(VALUE_KEY, LEASE, 1, notice(b"missing"))
            .await
            .unwrap()
    );
    assert_eq!(store.get(VALUE_KEY).await.unwrap(), None);
}

/// The seven numbers of a clear record.
fn record_of(stored: &[u8]) -> [u64; 7] {
    let text = std::str::from_utf8(stored).expect("digits");
    let parts: Vec<u64> = text
        .split(':')
        .map(|p| p.parse().expect("a number"))
        .collect();
    parts.try_into().expect("seven numbers")
}

async fn clear_namespace_advances_the_record_and_publishes_it(store: &dyn Store, _: Time) {
    const KEY: &[u8] = b"bw:test:c";
    let mut sub = subscribed(store).await;
    let clear = |hard: bool, window_ms: u64, fresh: u64| NamespaceClear {
        key: KEY,
        hard,
        window_ms,
        fresh,
        pin: false,
        restore: None,
        notice: notice(b"c:"),
    };
    // A first clear, soft: generation fresh + 1, floor and legacy fresh,
    // made at the store's clock; published appended to the message; one
    // subscriber reached; stored without a TTL.
    let before = store.now_ms();
    let first = store
        .clear_namespace(clear(false, 60_000, FRESH))
        .await
        .unwrap();
    let [n, h, t, w, l, below, by] = record_of(&first.record);
    assert_eq!(
        (n, h, w, l, below, by),
        (FRESH + 1, FRESH, 60_000, FRESH, FRESH, 0)
    );
    assert!(t >= before && t <= store.now_ms() + 5, "{t} vs {before}");
    // A Redis Cluster counts the subscribers of the node that ran the
    // script only (the bus may listen on another).
    if store.failure_domains() == 1 {
        assert_eq!(first.receivers, 1);
    } else {
        assert!(first.receivers <= 1);
    }
    assert_eq!(
        next_message(&mut sub).await,
        [&b"c:"[..], &first.record].concat()
    );
    assert_eq!(store.get(KEY).await.unwrap(), Some(first.record.clone()));
    let ttl = store.ttl(KEY).await.unwrap();
    assert!(
        ttl.is_none_or(|ttl| ttl > Duration::from_secs(365 * 24 * 3600)),
        "{ttl:?}"
    );
    // A hard one: one more, the floor up to it; the soft clear's time
    // and window kept, the legacy generation too.
    let hard = store
        .clear_namespace(clear(true, 0, FRESH + 500))
        .await
        .unwrap();
    assert_eq!(
        record_of(&hard.record),
        [FRESH + 2, FRESH + 2, t, 60_000, FRESH, FRESH + 2, 0]
    );
    assert_eq!(
        next_message(&mut sub).await,
        [&b"c:"[..], &hard.record].concat()
    );
    // A soft one after it: the floor stays.
    let soft = store
        .clear_namespace(clear(false, 5_000, FRESH + 500))
        .await
        .unwrap();
    let [n, h, t, w, l, below, by] = record_of(&soft.record);
    assert_eq!(
        (n, h, w, l, below, by),
        (FRESH + 3, FRESH + 2, 5_000, FRESH, FRESH + 2, 0)
    );
    // Another inside its window: the start kept, the end the earlier.
    let inside = store
        .clear_namespace(clear(false, 1_000, FRESH + 500))
        .await
        .unwrap();
    let [n, _, t2, w, ..] = record_of(&inside.record);
    assert_eq!((n, t2), (FRESH + 4, t));
    assert!((1_000..1_500).contains(&w), "{w}");
    // A record of five numbers, its soft window long over: the entries it
    // judged stale by its end, a new mark from now.
    store.set(KEY, b"9:4:100:50:3", TTL).await.unwrap();
    let later = store
        .clear_namespace(clear(false, 10, FRESH + 500))
        .await
        .unwrap();
    let [n, h, t, w, l, below, by] = record_of(&later.record);
    assert_eq!((n, h, w, l, below, by), (10, 4, 10, 3, 9, 150));
    assert!(t >= 150);
    // Foreign bytes count as no record: a fresh start.
    for foreign in [&b"garbage"[..], b"1:2:0:0:0", b"5:1:0:0:9"] {
        store
            .set(KEY, foreign, Duration::from_secs(60))
            .await
            .unwrap();
        let again = store
            .clear_namespace(clear(true, 0, FRESH + 900))
            .await
            .unwrap();
        assert_eq!(
            record_of(&again.record),
            [FRESH + 901, FRESH + 901, 0, 0, FRESH + 900, FRESH + 901, 0],
            "{foreign:?}"
        );
    }
}

async fn a_pin_is_made_only_over_no_record(store: &dyn Store, _: Time) {
    const KEY: &[u8] = b"bw:pin:c";
    const PIN_WINDOW: u64 = (1 << 53) - 1;
    let mut sub = subscribed(store).await;
    let pin = |fresh: u64| NamespaceClear {
        key: KEY,
        hard: false,
        window_ms: 0,
        fresh,
        pin: true,
        restore: None,
        notice: notice(b"p:"),
    };
    // Over none: an adopting pin (`H = 0`) that clears nothing, at the
    // store's clock, stored and published as a clear is.
    let before = store.now_ms();
    let made = store.clear_namespace(pin(FRESH)).await.unwrap();
    let [n, h, t, w, l, below, by] = record_of(&made.record);
    assert_eq!(
        (n, h, w, l, below, by),
        (FRESH + 1, 0, PIN_WINDOW, FRESH, 0, 0)
    );
    assert!(t >= before && t <= store.now_ms() + 5, "{t} vs {before}");
    assert_eq!(
        next_message(&mut sub).await,
        [&b"p:"[..], &made.record].concat()
    );
    assert_eq!(store.get(KEY).await.unwrap(), Some(made.record.clone()));
    // Over a record: that record, nothing written, nothing published
    // (also when one is given to put back).
    let kept = store.clear_namespace(pin(FRESH + 50)).await.unwrap();
    assert_eq!((&kept.record, kept.receivers), (&made.record, 0));
    let given = b"77:70:5:6:69:70:0";
    let kept = store
        .clear_namespace(NamespaceClear {
            restore: Some(given),
            ..pin(FRESH + 60)
        })
        .await
        .unwrap();
    assert_eq!((&kept.record, kept.receivers), (&made.record, 0));
    // A clear over the pin is a first clear: its own mark, from now.
    let soft = store
        .clear_namespace(NamespaceClear {
            pin: false,
            window_ms: 1_000,
            ..pin(FRESH + 70)
        })
        .await
        .unwrap();
    let [n, h, t2, w, l, below, by] = record_of(&soft.record);
    assert_eq!((n, h, w, l, below, by), (FRESH + 2, 0, 1_000, FRESH, 0, 0));
    assert!(t2 >= t);
    assert_eq!(
        next_message(&mut sub).await,
        [&b"p:"[..], &soft.record].concat()
    );
    // Over none (or foreign bytes), a record given is put back as it was,
    // stored without a TTL, and not published.
    store.set(KEY, b"garbage", TTL).await.unwrap();
    let back = store
        .clear_namespace(NamespaceClear {
            restore: Some(given),
            ..pin(FRESH + 90)
        })
        .await
        .unwrap();
    assert_eq!((&back.record[..], back.receivers), (&given[..], 0));
    assert_eq!(store.get(KEY).await.unwrap().as_deref(), Some(&given[..]));
    let ttl = store.ttl(KEY).await.unwrap();
    assert!(
        ttl.is_none_or(|ttl| ttl > Duration::from_secs(365 * 24 * 3600)),
        "{ttl:?}"
    );
    // Bytes given that are not a record count as none given.
    store.delete(KEY).await.unwrap();
    let made = store
        .clear_namespace(NamespaceClear {
            restore: Some(b"1:2:3"),
            ..pin(FRESH + 95)
        })
        .await
        .unwrap();
    assert_eq!(record_of(&made.record)[..2], [FRESH + 96, 0]);
    assert_eq!(
        next_message(&mut sub).await,
        [&b"p:"[..], &made.record].concat()
    );
}

macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod memory {
            use breakwater_cache::MemoryStore;
            $(
                #[tokio::test(start_paused = true)]
                async fn $case() {
                    super::$case(&MemoryStore::new(), super::Time::Paused).await;
                }
            )*
        }

        mod redis {
            use crate::support::redis_store;
            $(
                #[tokio::test]
                async fn $case() {
                    let (_server, store) = redis_store().await;
                    super::$case(&store, super::Time::Real).await;
                }
            )*
        }

        mod cluster {
            use crate::support::cluster_store;
            $(
                #[tokio::test]
                async fn $case() {
                    let (_cluster, store) = cluster_store().await;
                    super::$case(&store, super::Time::Real).await;
                }
            )*
        }

        mod sentinel {
            use crate::support::sentinel_store;
            $(
                #[tokio::test]
                async fn $case() {
                    let (_setup, store) = sentinel_store().await;
                    super::$case(&store, super::Time::Real).await;
                }
            )*
        }
    };
}

contract!(
    missing_key_reads_none,
    set_then_get_is_binary_safe,
    set_replaces_value_and_ttl,
    ttl_is_reported_in_milliseconds,
    zero_ttl_is_rejected,
    delete_removes_once,
    keys_expire_after_their_ttl,
    large_values_round_trip,
    clock_is_unix_ms_and_monotonic,
    a_lease_has_one_holder_bound_to_its_token,
    a_fenced_write_needs_the_lease,
    a_token_that_is_a_prefix_of_the_holders_holds_nothing,
    a_waited_on_lease_hands_the_value_to_its_notice,
    a_lease_attempt_is_idempotent_and_reports_the_time_left,
    replace_writes_revokes_the_lease_and_publishes,
    replace_many_writes_every_entry_and_revokes_every_lease,
    a_bulk_write_revokes_its_keys_loads_and_frees_their_leases,
    invalidate_many_deletes_every_entry_and_lease_and_names_each_key,
    get_many_reads_in_order_across_slots,
    acquire_leases_takes_each_as_acquire_lease_would,
    bump_generation_counts_on_or_starts_fresh_and_publishes,
    bump_generations_bump_each_counter_and_publish,
    expire_generation_moves_on_softly_keeping_the_floor,
    tag_generations_read_or_create_each_counter,
    tag_states_date_each_counters_last_hard_change,
    a_pin_holds_a_key_and_a_fenced_write_can_need_it_unchanged,
    a_renewal_patches_in_place_only_for_the_holder_of_an_unchanged_value,
    expire_entry_ends_the_fresh_window_revokes_the_lease_and_publishes,
    clear_namespace_advances_the_record_and_publishes_it,
    a_pin_is_made_only_over_no_record,
);
