//! No setting can poison the cache: every builder method (and every
//! per-call override of [`CacheEntry`](breakwater_cache::CacheEntry)) given an
//! extreme value — 0, 1 ns, 1 ms, the bounds and just past them,
//! `Duration::MAX`, `u64::MAX`-ish counts, NaN, ±∞, negative and 1.5 ratios
//! — either gets a `ConfigError` or a cache that works: on a memory store
//! with paused time, `get_or_load` returns the value, `get` finds it, and a
//! second `get_or_load` does not call the loader. Never a panic, never a
//! cache that silently stops caching.
//!
//! Every (setting, extreme) pair is tried once in
//! `every_setting_at_every_extreme`; the property test adds random values
//! between them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use breakwater_cache::{
    Backoff, BreakerConfig, Cache, CacheBuilder, Compression, EarlyRefresh, Jitter, L1Config,
    LimitConfig, MemoryStore, RetryConfig,
};
use proptest::prelude::*;

const DAY: Duration = Duration::from_secs(24 * 3600);
const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
const MS: Duration = Duration::from_millis(1);

/// Extreme durations: zero, the smallest units, the bounds and just past
/// them, and the largest.
const DURATIONS: [Duration; 10] = [
    Duration::ZERO,
    Duration::from_nanos(1),
    MS,
    Duration::from_millis(10),
    Duration::from_secs(1),
    DAY,
    DAY.saturating_add(MS),
    YEAR,
    YEAR.saturating_add(MS),
    Duration::MAX,
];

/// Extreme counts.
const COUNTS: [u64; 9] = [
    0,
    1,
    2,
    1_024,
    1_000_000,
    1_000_001,
    u32::MAX as u64,
    u32::MAX as u64 + 1,
    u64::MAX,
];

/// Extreme ratios.
const RATIOS: [f64; 9] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    -0.5,
    0.0,
    1e-9,
    0.5,
    1.0,
    1.5,
];

/// One value for whichever setting is tried: a duration, a count and a
/// ratio, each used where the setting takes one.
#[derive(Debug, Clone, Copy)]
struct Value {
    d: Duration,
    n: u64,
    r: f64,
}

impl Value {
    fn n32(self) -> u32 {
        u32::try_from(self.n).unwrap_or(u32::MAX)
    }
    fn size(self) -> usize {
        usize::try_from(self.n).unwrap_or(usize::MAX)
    }
}

type Builder = CacheBuilder<u64>;
/// A builder method given one value.
type SetBuilder = fn(Builder, Value) -> Builder;

/// Every builder method that takes a value, by name.
const BUILDER_SETTINGS: &[(&str, SetBuilder)] = &[
    ("ttl", |b, v| b.ttl(v.d)),
    ("negative_ttl", |b, v| b.negative_ttl(v.d)),
    ("jitter ratio", |b, v| b.jitter(Jitter::ratio(v.r))),
    ("jitter down", |b, v| b.jitter(Jitter::down(v.r))),
    ("jitter fixed", |b, v| b.jitter(Jitter::fixed(v.d))),
    ("jitter up_to", |b, v| b.jitter(Jitter::up_to(v.d))),
    ("jitter floor", |b, v| {
        b.jitter(Jitter::ratio(0.1).with_floor(v.d))
    }),
    ("compression threshold", |b, v| {
        b.compression(Compression::lz4().threshold(v.size()))
    }),
    ("compression max_decompressed", |b, v| {
        b.compression(Compression::lz4().max_decompressed(v.size()))
    }),
    ("max_key_len", |b, v| b.max_key_len(v.size())),
    ("max_value_size", |b, v| b.max_value_size(v.size())),
    ("grace", |b, v| b.grace(v.d)),
    ("max_stale", |b, v| b.max_stale(v.d)),
    ("grace = max_stale", |b, v| b.grace(v.d).max_stale(v.d)),
    ("early_refresh xfetch", |b, v| {
        b.early_refresh(EarlyRefresh::xfetch(v.r))
    }),
    ("early_refresh xfetch count", |b, v| {
        b.early_refresh(EarlyRefresh::xfetch(v.n as f64))
    }),
    ("early_refresh after_fraction", |b, v| {
        b.early_refresh(EarlyRefresh::after_fraction(v.r))
    }),
    ("soft_timeout", |b, v| b.soft_timeout(v.d)),
    ("fail_safe_throttle", |b, v| b.fail_safe_throttle(v.d)),
    ("lease_ttl", |b, v| b.lease_ttl(v.d)),
    ("lock_wait", |b, v| b.lock_wait(v.d)),
    ("lock_wait serve_stale", |b, v| {
        b.lock_wait(v.d)
            .on_lock_timeout(breakwater_cache::OnLockTimeout::serve_stale())
    }),
    ("lock_poll", |b, v| b.lock_poll(v.d)),
    ("load_timeout", |b, v| b.load_timeout(v.d)),
    ("breaker consecutive_failures", |b, v| {
        b.breaker(BreakerConfig::new().consecutive_failures(v.n32()))
    }),
    ("breaker failure_ratio", |b, v| {
        b.breaker(BreakerConfig::new().failure_ratio(v.r, Duration::from_secs(10), 10))
    }),
    ("breaker failure window", |b, v| {
        b.breaker(BreakerConfig::new().failure_ratio(0.5, v.d, 10))
    }),
    ("breaker min_calls", |b, v| {
        b.breaker(BreakerConfig::new().failure_ratio(0.5, Duration::from_secs(10), v.n32()))
    }),
    ("breaker cool_down", |b, v| {
        b.breaker(BreakerConfig::new().cool_down(v.d))
    }),
    ("breaker cool_down_jitter", |b, v| {
        b.breaker(BreakerConfig::new().cool_down_jitter(Jitter::fixed(v.d)))
    }),
    ("breaker half_open_probes", |b, v| {
        b.breaker(BreakerConfig::new().half_open_probes(v.n32()))
    }),
    ("store_breaker consecutive_failures", |b, v| {
        b.store_breaker(BreakerConfig::new().consecutive_failures(v.n32()))
    }),
    ("store_breaker cool_down", |b, v| {
        b.store_breaker(BreakerConfig::new().cool_down(v.d))
    }),
    ("store_breaker cool_down_jitter", |b, v| {
        b.store_breaker(BreakerConfig::new().cool_down_jitter(Jitter::ratio(v.r)))
    }),
    ("limit max_concurrent", |b, v| {
        b.limit(LimitConfig::new().max_concurrent(v.n32()))
    }),
    ("limit rate", |b, v| {
        b.limit(LimitConfig::new().rate(v.n32(), 1))
    }),
    ("limit burst", |b, v| {
        b.limit(LimitConfig::new().rate(10, v.n32()))
    }),
    ("limit queue_wait", |b, v| {
        b.limit(LimitConfig::new().queue_wait(v.d))
    }),
    ("retry max_attempts", |b, v| {
        b.retry(RetryConfig::new().max_attempts(v.n32()))
    }),
    ("retry backoff base", |b, v| {
        b.retry(RetryConfig::new().backoff(Backoff::full_jitter(v.d, v.d.max(MS))))
    }),
    ("retry backoff cap", |b, v| {
        b.retry(RetryConfig::new().backoff(Backoff::decorrelated(MS, v.d)))
    }),
    ("l1 entries", |b, v| b.l1(L1Config::new().entries(v.n))),
    ("l1 ttl", |b, v| b.l1(L1Config::new().ttl(v.d).keep(v.d))),
    ("l1 keep", |b, v| b.l1(L1Config::new().keep(v.d))),
    ("rng_seed", |b, v| b.rng_seed(v.n)),
];

type Entry<'a> = breakwater_cache::CacheEntry<'a, u64>;
/// A per-call override given one value.
type SetEntry = for<'a> fn(Entry<'a>, Value) -> Entry<'a>;

/// Every per-call override of `CacheEntry`, by name.
const ENTRY_SETTINGS: &[(&str, SetEntry)] = &[
    ("entry ttl", |e, v| e.ttl(v.d)),
    ("entry negative_ttl", |e, v| e.negative_ttl(v.d)),
    ("entry jitter fixed", |e, v| e.jitter(Jitter::fixed(v.d))),
    ("entry jitter up_to", |e, v| e.jitter(Jitter::up_to(v.d))),
    ("entry jitter ratio", |e, v| e.jitter(Jitter::ratio(v.r))),
    ("entry jitter down", |e, v| e.jitter(Jitter::down(v.r))),
    ("entry grace", |e, v| e.grace(v.d)),
    ("entry max_stale", |e, v| e.max_stale(v.d)),
    ("entry early_refresh", |e, v| {
        e.early_refresh(EarlyRefresh::xfetch(v.r))
    }),
    ("entry soft_timeout", |e, v| e.soft_timeout(v.d)),
    ("entry load_timeout", |e, v| e.load_timeout(v.d)),
];

/// Builds with one setting (`setting` indexes builder settings, then entry
/// overrides) and checks the cache works, or was refused with a config
/// error. `Err` says what went wrong.
fn check(setting: usize, value: Value) -> Result<(), String> {
    std::panic::catch_unwind(|| check_inner(setting, value)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let name = match BUILDER_SETTINGS.get(setting) {
            Some((name, _)) => name,
            None => ENTRY_SETTINGS[setting - BUILDER_SETTINGS.len()].0,
        };
        Err(format!("{name} {value:?}: panicked: {what}"))
    })
}

fn check_inner(setting: usize, value: Value) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async move {
        let builder = Cache::<u64>::builder().store(MemoryStore::new());
        let (name, entry) = match BUILDER_SETTINGS.get(setting) {
            Some((name, apply)) => {
                let cache = match apply(builder, value).build() {
                    Ok(cache) => cache,
                    // Refused with a message: fine.
                    Err(err) => {
                        return if err.message().is_empty() {
                            Err(format!("{name}: an empty message"))
                        } else {
                            Ok(())
                        };
                    }
                };
                return works(name, &cache, None, value).await;
            }
            None => ENTRY_SETTINGS[setting - BUILDER_SETTINGS.len()],
        };
        let cache = builder.build().map_err(|e| e.to_string())?;
        works(name, &cache, Some(entry), value).await
    })
}

/// `get_or_load` returns the value, `get` finds it, and a second
/// `get_or_load` is served from the cache.
async fn works(
    name: &str,
    cache: &Cache<u64>,
    entry: Option<SetEntry>,
    value: Value,
) -> Result<(), String> {
    let calls = Arc::new(AtomicUsize::new(0));
    let loader = {
        let calls = Arc::clone(&calls);
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, std::io::Error>(Some(7)) }
        }
    };
    let call = |loader| async {
        match entry {
            Some(apply) => apply(cache.entry("k"), value).get_or_load(loader).await,
            None => cache.get_or_load("k", loader).await,
        }
    };
    match call(loader.clone()).await {
        Ok(Some(7)) => {}
        // A per-call override is refused when the call is made.
        Err(err) if entry.is_some() && err.is_config() => return Ok(()),
        other => return Err(format!("{name} {value:?}: first call gave {other:?}")),
    }
    match cache.get("k").await {
        Ok(Some(7)) => {}
        other => return Err(format!("{name} {value:?}: not cached, get gave {other:?}")),
    }
    match call(loader).await {
        Ok(Some(7)) => {}
        other => return Err(format!("{name} {value:?}: second call gave {other:?}")),
    }
    match calls.load(Ordering::SeqCst) {
        1 => Ok(()),
        n => Err(format!(
            "{name} {value:?}: the loader ran {n} times (not cached)"
        )),
    }
}

fn settings() -> usize {
    BUILDER_SETTINGS.len() + ENTRY_SETTINGS.len()
}

/// Every setting at every extreme, once (a few hundred caches, well under a
/// second).
#[test]
fn every_setting_at_every_extreme() {
    let mut failures = Vec::new();
    for setting in 0..settings() {
        let values = DURATIONS
            .iter()
            .zip(COUNTS.iter().cycle())
            .zip(RATIOS.iter().cycle())
            .map(|((&d, &n), &r)| Value { d, n, r })
            .chain(COUNTS.iter().map(|&n| Value {
                d: Duration::from_secs(1),
                n,
                r: 0.5,
            }))
            .chain(RATIOS.iter().map(|&r| Value {
                d: Duration::from_secs(1),
                n: 1,
                r,
            }));
        for value in values {
            if let Err(failure) = check(setting, value) {
                failures.push(failure);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        proptest::sample::select(DURATIONS.to_vec()),
        any::<u64>().prop_map(Duration::from_millis),
        (0..=YEAR.as_millis() as u64 * 2).prop_map(Duration::from_millis),
        any::<u64>().prop_map(Duration::from_nanos),
    ]
}

fn any_count() -> impl Strategy<Value = u64> {
    prop_oneof![
        proptest::sample::select(COUNTS.to_vec()),
        any::<u64>(),
        0..=2_000_000u64,
    ]
}

fn any_ratio() -> impl Strategy<Value = f64> {
    prop_oneof![
        proptest::sample::select(RATIOS.to_vec()),
        any::<f64>(),
        -2.0..2.0f64,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random values between the extremes, for any setting.
    #[test]
    fn any_setting_builds_a_working_cache_or_is_refused(
        setting in 0..settings(),
        d in any_duration(),
        n in any_count(),
        r in any_ratio(),
    ) {
        let value = Value { d, n, r };
        if let Err(failure) = check(setting, value) {
            prop_assert!(false, "{}", failure);
        }
    }
}
