//! Settings from a file or the environment (`breakwater_cache::config`): every
//! key gives the cache the builder's settings, whichever source it came
//! from, and a bad value is refused with its key.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use breakwater_cache::config::{CacheConfig, ENV_PREFIX};
use breakwater_cache::{
    Backoff, BreakerConfig, Cache, CacheBuilder, Codec, Compression, EarlyRefresh, Jitter,
    L1Config, LimitConfig, OnLockTimeout, RedisStoreConfig, RetryConfig,
};

/// Every key, none at its default.
const FULL: &str = r#"
namespace = "catalog"
key_prefix = "myapp:"
ttl = "10m"
negative_ttl = "45s"
jitter = { fixed = "20s", floor = "2s" }
codec = "json"
compression = { algorithm = "lz4", threshold = 2048, max_decompressed = 1048576 }
max_key_len = 512
max_value_size = 1048576
version = 3
version_transition = "10m"
trace_keys = true
grace = "1m"
max_stale = "1h"
early_refresh = { after_fraction = 0.8 }
soft_timeout = "250ms"
fail_safe_throttle = "10s"
lease_ttl = "4s"
lock_wait = "1m"
lock_poll = "100ms"
on_lock_timeout = "serve_stale"
load_timeout = "20s"
rng_seed = 7

[breaker]
consecutive_failures = 3
failure_ratio = { ratio = 0.5, window = "30s", min_calls = 20 }
cool_down = "10s"
cool_down_jitter = { down = 0.1, floor = "1ms" }
half_open_probes = 2

[limit]
max_concurrent = 16
rate = { per_second = 200, burst = 20 }
queue_wait = "250ms"

[retry]
max_attempts = 4
backoff = { strategy = "decorrelated", base = "50ms", cap = "1s" }

[l1]
entries = 50000
ttl = "5s"
keep = "5m"

[store_breaker]
consecutive_failures = 10
cool_down = "2s"

[redis]
connect_timeout = "1s"
response_timeout = "80ms"
write_timeout = "400ms"
clock_refresh = "30s"
subscription_ping = "2s"
"#;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// [`FULL`], written in code.
fn full_in_code() -> CacheBuilder<u64> {
    Cache::builder()
        .namespace("catalog")
        .key_prefix("myapp:")
        .ttl(secs(600))
        .negative_ttl(secs(45))
        .jitter(Jitter::fixed(secs(20)).with_floor(secs(2)))
        .codec(Codec::json())
        .compression(
            Compression::lz4()
                .threshold(2048)
                .max_decompressed(1_048_576),
        )
        .max_key_len(512)
        .max_value_size(1_048_576)
        .version(3)
        .version_transition(secs(600))
        .trace_keys(true)
        .grace(secs(60))
        .max_stale(secs(3600))
        .early_refresh(EarlyRefresh::after_fraction(0.8))
        .soft_timeout(ms(250))
        .fail_safe_throttle(secs(10))
        .lease_ttl(secs(4))
        .lock_wait(secs(60))
        .lock_poll(ms(100))
        .on_lock_timeout(OnLockTimeout::serve_stale())
        .load_timeout(secs(20))
        .rng_seed(7)
        .breaker(
            BreakerConfig::new()
                .consecutive_failures(3)
                .failure_ratio(0.5, secs(30), 20)
                .cool_down(secs(10))
                .cool_down_jitter(Jitter::down(0.1).with_floor(ms(1)))
                .half_open_probes(2),
        )
        .limit(
            LimitConfig::new()
                .max_concurrent(16)
                .rate(200, 20)
                .queue_wait(ms(250)),
        )
        .retry(
            RetryConfig::none()
                .max_attempts(4)
                .backoff(Backoff::decorrelated(ms(50), secs(1))),
        )
        .l1(L1Config::new().entries(50_000).ttl(secs(5)).keep(secs(300)))
        .store_breaker(
            BreakerConfig::new()
                .consecutive_failures(10)
                .cool_down(secs(2)),
        )
}

fn full_redis_in_code() -> RedisStoreConfig {
    RedisStoreConfig::default()
        .connect_timeout(secs(1))
        .response_timeout(ms(80))
        .write_timeout(ms(400))
        .clock_refresh(secs(30))
        .subscription_ping(secs(2))
}

/// A file in the temp directory, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("breakwater-config-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A document as environment variables: `BREAKWATER_CACHE_` + the key path
/// in capitals, `__` between a table and its keys, the value's text.
fn as_env(value: &serde_json::Value, path: &str, out: &mut BTreeMap<String, String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                let path = if path.is_empty() {
                    key.to_uppercase()
                } else {
                    format!("{path}__{}", key.to_uppercase())
                };
                as_env(value, &path, out);
            }
        }
        serde_json::Value::String(text) => {
            out.insert(format!("{ENV_PREFIX}{path}"), text.clone());
        }
        other => {
            out.insert(format!("{ENV_PREFIX}{path}"), other.to_string());
        }
    }
}

#[test]
fn a_file_and_the_environment_give_the_builders_settings() {
    let in_code = full_in_code().build().unwrap();
    let defaults = Cache::<u64>::builder().build().unwrap();
    assert_ne!(in_code.settings(), defaults.settings());

    let document: serde_json::Value = toml::from_str(FULL).unwrap();
    let toml_file = TempFile::new("full.toml", FULL);
    let json_file = TempFile::new("full.json", &document.to_string());
    let mut env = BTreeMap::new();
    as_env(&document, "", &mut env);
    assert_eq!(env["BREAKWATER_CACHE_TTL"], "10m");
    assert_eq!(env["BREAKWATER_CACHE_L1__ENTRIES"], "50000");
    assert_eq!(
        env["BREAKWATER_CACHE_BREAKER__FAILURE_RATIO__WINDOW"],
        "30s"
    );
    assert_eq!(env["BREAKWATER_CACHE_JITTER__FIXED"], "20s");
    assert_eq!(env.len(), 52, "every key: {env:#?}");
    // Variables of other programs are left alone.
    let vars = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain([
        ("PATH", "/bin"),
        ("BREAKWATER_REDIS_SERVER", "redis-server"),
    ]);

    let sources = [
        ("toml", CacheConfig::from_file(&toml_file.0).unwrap()),
        ("json", CacheConfig::from_file(&json_file.0).unwrap()),
        ("env", CacheConfig::from_vars(ENV_PREFIX, vars).unwrap()),
    ];
    for (source, config) in &sources {
        let cache = Cache::<u64>::builder().config(config).build().unwrap();
        assert_eq!(
            cache.settings(),
            in_code.settings(),
            "{source}: {:#?}",
            cache.settings()
        );
        assert_eq!(
            format!("{:?}", config.redis_store_config()),
            format!("{:?}", full_redis_in_code()),
            "{source}"
        );
    }
    assert_eq!(sources[0].1, sources[1].1);
    assert_eq!(sources[0].1, sources[2].1);
}

#[test]
fn shorthand_forms_give_the_builders_settings() {
    let config = CacheConfig::from_toml_str(
        r#"
        jitter = "none"
        early_refresh = "none"
        codec = "msgpack"
        compression = { algorithm = "none" }
        on_lock_timeout = "error"
        l1 = {}
        "#,
    )
    .unwrap();
    let from_config = Cache::<u64>::builder().config(&config).build().unwrap();
    let in_code = Cache::<u64>::builder()
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .codec(Codec::msgpack())
        .compression(Compression::none())
        .on_lock_timeout(OnLockTimeout::error())
        .l1(L1Config::new())
        .build()
        .unwrap();
    assert_eq!(from_config.settings(), in_code.settings());

    let env = CacheConfig::from_vars(
        ENV_PREFIX,
        [
            ("BREAKWATER_CACHE_JITTER", "none"),
            ("BREAKWATER_CACHE_EARLY_REFRESH", "none"),
            ("BREAKWATER_CACHE_CODEC", "msgpack"),
            ("BREAKWATER_CACHE_COMPRESSION__ALGORITHM", "none"),
            ("BREAKWATER_CACHE_ON_LOCK_TIMEOUT", "error"),
            ("BREAKWATER_CACHE_L1__ENTRIES", "10000"),
            // Text where a string is wanted stays text.
            ("BREAKWATER_CACHE_NAMESPACE", "42"),
        ],
    )
    .unwrap();
    let from_env = Cache::<u64>::builder().config(&env).build().unwrap();
    assert_eq!(from_env.namespace(), "42");
    let in_code = Cache::<u64>::builder()
        .namespace("42")
        .jitter(Jitter::none())
        .early_refresh(EarlyRefresh::none())
        .compression(Compression::none())
        .on_lock_timeout(OnLockTimeout::error())
        .l1(L1Config::new())
        .build()
        .unwrap();
    assert_eq!(from_env.settings(), in_code.settings());
}

#[test]
fn code_stands_where_the_config_is_silent() {
    let config = CacheConfig::from_toml_str("grace = \"30s\"").unwrap();
    let cache = Cache::<u64>::builder()
        .ttl(secs(60))
        .grace(secs(5))
        .config(&config)
        .build()
        .unwrap();
    let in_code = Cache::<u64>::builder()
        .ttl(secs(60))
        .grace(secs(30))
        .build()
        .unwrap();
    assert_eq!(
        cache.settings(),
        in_code.settings(),
        "ttl from code, grace from the file"
    );
    // A table is a setting as a whole: the store breaker's own defaults
    // fill what it leaves out.
    let config = CacheConfig::from_toml_str("store_breaker = { half_open_probes = 3 }").unwrap();
    let cache = Cache::<u64>::builder().config(&config).build().unwrap();
    let in_code = Cache::<u64>::builder()
        .store_breaker(
            BreakerConfig::new()
                .consecutive_failures(5)
                .cool_down(secs(1))
                .half_open_probes(3),
        )
        .build()
        .unwrap();
    assert_eq!(cache.settings(), in_code.settings());
    // An empty config changes nothing.
    let cache = Cache::<u64>::builder()
        .config(&CacheConfig::default())
        .build()
        .unwrap();
    let defaults = Cache::<u64>::builder().build().unwrap();
    assert_eq!(cache.settings(), defaults.settings());
}

/// A bad value, in TOML, JSON and the environment: the key it is about,
/// and a part of the message.
const BAD: &[(&str, &str, &str, &str)] = &[
    // (toml, key, environment variable, message part)
    (
        "ttl = \"5x\"",
        "ttl",
        "BREAKWATER_CACHE_TTL=5x",
        "invalid duration \"5x\": unknown time unit \"x\"",
    ),
    (
        "ttl = \"0s\"",
        "ttl",
        "BREAKWATER_CACHE_TTL=0s",
        "ttl must be at least 1ms, got 0ns",
    ),
    (
        "[l1]\ncapacity = 10",
        "l1.capacity",
        "BREAKWATER_CACHE_L1__CAPACITY=10",
        "unknown field `capacity`, expected one of `entries`, `ttl`, `keep`",
    ),
    (
        "tll = \"5m\"",
        "tll",
        "BREAKWATER_CACHE_TLL=5m",
        "unknown field `tll`",
    ),
    (
        "l1 = { ttl = \"400days\" }",
        "l1.ttl",
        "BREAKWATER_CACHE_L1__TTL=400days",
        "l1 ttl must be at most 365 days, got 34560000s",
    ),
    (
        "limit = { max_concurrent = 0 }",
        "limit.max_concurrent",
        "BREAKWATER_CACHE_LIMIT__MAX_CONCURRENT=0",
        "max concurrent loads must be at least 1",
    ),
    (
        "limit = { max_concurrent = -1 }",
        "limit.max_concurrent",
        "BREAKWATER_CACHE_LIMIT__MAX_CONCURRENT=-1",
        "",
    ),
    (
        "jitter = { ratio = 1.5 }",
        "jitter.ratio",
        "BREAKWATER_CACHE_JITTER__RATIO=1.5",
        "jitter ratio must be in 0..=1, got 1.5",
    ),
    (
        "breaker = { cool_down_jitter = { floor = \"0s\" } }",
        "breaker.cool_down_jitter.floor",
        "BREAKWATER_CACHE_BREAKER__COOL_DOWN_JITTER__FLOOR=0s",
        "jitter floor must be at least 1ms, got 0ms",
    ),
    (
        "retry = { backoff = { cap = \"2days\" } }",
        "retry.backoff.cap",
        "BREAKWATER_CACHE_RETRY__BACKOFF__CAP=2days",
        "backoff cap must be at most 1 day",
    ),
    (
        "on_lock_timeout = \"wait\"",
        "on_lock_timeout",
        "BREAKWATER_CACHE_ON_LOCK_TIMEOUT=wait",
        "unknown variant `wait`, expected one of `load_anyway`, `serve_stale`, `error`",
    ),
    (
        "grace = \"1m\"\nmax_stale = \"30s\"",
        "grace",
        "",
        "grace (60s) must not exceed max_stale (30s)",
    ),
    (
        "redis = { response_timeout = \"0s\" }",
        "redis.response_timeout",
        "BREAKWATER_CACHE_REDIS__RESPONSE_TIMEOUT=0s",
        "redis response_timeout must be greater than zero",
    ),
];

#[test]
fn bad_values_are_refused_with_their_key() {
    for &(toml_text, key, var, part) in BAD {
        let err = CacheConfig::from_toml_str(toml_text).unwrap_err();
        assert_eq!(err.key(), Some(key), "{toml_text}: {err}");
        let text = err.to_string();
        assert!(text.starts_with(&format!("{key}: ")), "{text}");
        assert!(text.contains(part), "{toml_text}: {text}");

        let json: serde_json::Value = toml::from_str(toml_text).unwrap();
        let err = CacheConfig::from_json_str(&json.to_string()).unwrap_err();
        assert_eq!(err.key(), Some(key), "{json}: {err}");
        assert!(err.to_string().starts_with(&format!("{key}: ")), "{err}");
        assert!(err.to_string().contains(part), "{json}: {err}");

        if let Some((name, value)) = var.split_once('=') {
            let err = CacheConfig::from_vars(ENV_PREFIX, [(name, value)]).unwrap_err();
            assert_eq!(err.key(), Some(key), "{var}: {err}");
            let text = err.to_string();
            assert!(text.starts_with(&format!("{name} ({key}): ")), "{text}");
            assert!(text.contains(part), "{var}: {text}");
        }
    }
    // The file's name is in front of what is wrong in it.
    let file = TempFile::new("bad.toml", "[l1]\nttl = \"0s\"\n");
    let err = CacheConfig::from_file(&file.0).unwrap_err();
    assert_eq!(err.key(), Some("l1.ttl"));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: l1.ttl: l1 ttl must be at least 1ms, got 0ns",
            file.0.display()
        )
    );
    let err = CacheConfig::from_file("settings.yaml").unwrap_err();
    assert_eq!(
        err.to_string(),
        "settings.yaml: a configuration file must end in .toml or .json"
    );
    // Two kinds of jitter at once, a table and a value under one name.
    let err = CacheConfig::from_toml_str("jitter = { ratio = 0.1, fixed = \"1s\" }").unwrap_err();
    assert_eq!(err.key(), Some("jitter"));
    assert!(err.to_string().contains("got ratio and fixed"), "{err}");
    let err = CacheConfig::from_vars(
        ENV_PREFIX,
        [
            ("BREAKWATER_CACHE_L1", "on"),
            ("BREAKWATER_CACHE_L1__TTL", "1s"),
        ],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("`l1` is given both as a value and as a table"),
        "{err}"
    );
}

/// The builder says which setting is wrong too.
#[test]
fn builder_errors_name_their_key() {
    let key = |b: CacheBuilder<u64>| b.build().unwrap_err().key().map(str::to_owned);
    assert_eq!(
        key(Cache::builder().ttl(Duration::ZERO)).as_deref(),
        Some("ttl")
    );
    assert_eq!(
        key(Cache::builder().store_breaker(BreakerConfig::new().cool_down(Duration::ZERO)))
            .as_deref(),
        Some("store_breaker.cool_down")
    );
    assert_eq!(
        key(Cache::builder().retry(RetryConfig::new().max_attempts(0))).as_deref(),
        Some("retry.max_attempts")
    );
    assert_eq!(
        key(Cache::builder().early_refresh(EarlyRefresh::xfetch(f64::NAN))).as_deref(),
        Some("early_refresh.xfetch")
    );
    assert_eq!(
        key(Cache::builder().lock_wait(secs(1))).as_deref(),
        Some("lock_wait")
    );
}

const CHILD: &str = "BREAKWATER_CONFIG_TEST_CHILD";

/// In the child process: the environment it was started with.
#[test]
fn child_reads_its_environment() {
    if std::env::var_os(CHILD).is_none() {
        return; // only meaningful when run by the test below
    }
    let config = CacheConfig::from_env().unwrap();
    let cache = Cache::<u64>::builder().config(&config).build().unwrap();
    let expected = Cache::<u64>::builder()
        .ttl(secs(420))
        .l1(L1Config::new().entries(123))
        .build()
        .unwrap();
    assert_eq!(cache.settings(), expected.settings());
    let err = CacheConfig::from_env_prefixed("BREAKWATER_CONFIG_TEST_BAD_").unwrap_err();
    assert_eq!(err.key(), Some("ttl"));
}

/// `from_env` reads the real environment; a child process gets its own,
/// so no other test sees these variables.
#[test]
fn from_env_reads_the_process_environment() {
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reads_its_environment", "--nocapture"])
        .env(CHILD, "1")
        .env("BREAKWATER_CACHE_TTL", "7m")
        .env("BREAKWATER_CACHE_L1__ENTRIES", "123")
        .env("BREAKWATER_CONFIG_TEST_BAD_TTL", "soon")
        .status()
        .unwrap();
    assert!(status.success(), "the child failed: {status}");
}

/// The snapshot tells caches apart by what they run with, code-only
/// settings included.
#[test]
fn settings_tell_caches_apart() {
    let plain = Cache::<u64>::builder().build().unwrap();
    let same = Cache::<u64>::builder().build().unwrap();
    assert_eq!(plain.settings(), same.settings());
    let custom_retry = Cache::<u64>::builder()
        .retry(RetryConfig::none().retry_if(|_| true))
        .build()
        .unwrap();
    assert_ne!(plain.settings(), custom_retry.settings());
    let fallback = Cache::<u64>::builder().fallback(0).build().unwrap();
    assert_ne!(plain.settings(), fallback.settings());
    let shown = format!("{:?}", fallback.settings());
    assert!(shown.contains("fallback: true"), "{shown}");
    assert!(shown.contains("origin: \"default\""), "{shown}");
}
