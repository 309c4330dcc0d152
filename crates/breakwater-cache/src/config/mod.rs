//! Settings from a file or the environment: [`CacheConfig`].
//!
//! A `CacheConfig` holds the settings of [`Cache::builder`](crate::Cache::builder)
//! as data: read it from a TOML file, a JSON file or environment variables,
//! and hand it to [`CacheBuilder::config`](crate::CacheBuilder::config).
//! Every value is checked by the builder's own checks (the same code that
//! checks settings made in code) when the config is loaded, and again by
//! `build`. A bad duration, a value out of bounds or an unknown key is
//! refused with the key in the message:
//! `l1.ttl: l1 ttl must be at least 1ms, got 0ns`,
//! `BREAKWATER_CACHE_TTL (ttl): invalid duration "5x": unknown time unit "x", ...`.
//!
//! ```
//! use breakwater_cache::Cache;
//! use breakwater_cache::config::CacheConfig;
//!
//! let config = CacheConfig::from_toml_str(r#"
//!     namespace = "catalog"
//!     ttl = "5m"
//!     jitter = { ratio = 0.2 }
//!     grace = "1m"
//!
//!     [l1]
//!     entries = 10_000
//!
//!     [breaker]
//!     consecutive_failures = 3
//!     cool_down = "10s"
//! "#)?;
//! let cache = Cache::<String>::builder().config(&config).build()?;
//! # Ok::<(), breakwater_cache::ConfigError>(())
//! ```
//!
//! A `CacheConfig` also fits inside your own configuration: it implements
//! [`serde::Deserialize`] (call [`validate`](CacheConfig::validate) after).
//!
//! # Keys
//!
//! Each key is the builder method it sets; a key left out keeps what the
//! builder has (its default, or what code set before `config`). A table
//! (`l1`, `breaker`, ...) sets its setting as a whole: the keys it leaves
//! out take that setting's defaults. Durations are strings as
//! [`humantime`](https://docs.rs/humantime) reads them: `"250ms"`, `"5s"`,
//! `"10m"`, `"1h 30m"`, `"2days"`. Sizes are whole bytes.
//!
//! | key | value | default |
//! |---|---|---|
//! | `namespace` | string | `"default"` |
//! | `key_prefix` | string: the first part of every key and channel (for a Redis ACL user limited to it) | `"bw:"` |
//! | `ttl` | duration | `"5m"` |
//! | `negative_ttl` | duration | `"30s"`, or `ttl` if shorter |
//! | `jitter` | `"none"`, or a table with one of the four below | `{ ratio = 0.1 }` |
//! | `jitter.ratio` | number in `0..=1`: ± that share of the TTL | |
//! | `jitter.down` | number in `0..=1`: up to that share less, never more | |
//! | `jitter.fixed` | duration: ± that much | |
//! | `jitter.up_to` | duration: up to that much more | |
//! | `jitter.none` | `true`: no jitter (with a `floor`) | |
//! | `jitter.floor` | duration: the shortest result | `"1s"` |
//! | `codec` | `"msgpack"` or `"json"` | `"msgpack"` |
//! | `compression.algorithm` | `"lz4"` or `"none"` | `"lz4"` |
//! | `compression.threshold` | bytes: compress payloads larger than this | `1024` |
//! | `compression.max_decompressed` | bytes: the largest entry read | `67108864` (64 MiB) |
//! | `max_key_len` | bytes | `1024` |
//! | `max_value_size` | bytes of serialized value | `16777216` (16 MiB) |
//! | `version` | integer: the version of what is stored (see `CacheBuilder::version`) | `0` |
//! | `version_transition` | duration: how long a miss reads the previous version | `"0s"` (off) |
//! | `trace_keys` | `true`: spans carry the raw key | `false` |
//! | `startup_check` | `false`: no check of the store when the cache is built (see `CacheBuilder::startup_check`) | `true` |
//! | `grace` | duration | `"0s"` (no stale-while-revalidate) |
//! | `max_stale` | duration | `grace` |
//! | `early_refresh` | `"none"`, or a table with one of the two below | `{ xfetch = 1.0 }` |
//! | `early_refresh.xfetch` | β, a number in `(0, 100]` | |
//! | `early_refresh.after_fraction` | number in `(0, 1)` of the fresh window | |
//! | `soft_timeout` | duration | off |
//! | `fail_safe_throttle` | duration | `"5s"` |
//! | `lease_ttl` | duration | `"3s"` |
//! | `lock_wait` | duration | `queue_wait + load_timeout + 2 × lease_ttl` (`"37s"`) |
//! | `lock_poll` | duration | `"200ms"` |
//! | `on_lock_timeout` | `"load_anyway"`, `"serve_stale"` or `"error"` | `"load_anyway"` |
//! | `load_timeout` | duration | `"30s"` |
//! | `rng_seed` | integer | none (from the OS) |
//! | `breaker.consecutive_failures` | integer | `5` |
//! | `breaker.failure_ratio` | table of the three below, all required | off |
//! | `breaker.failure_ratio.ratio` | number in `(0, 1]` | |
//! | `breaker.failure_ratio.window` | duration | |
//! | `breaker.failure_ratio.min_calls` | integer | |
//! | `breaker.cool_down` | duration | `"5s"` |
//! | `breaker.cool_down_jitter` | as `jitter` | `{ ratio = 0.2, floor = "1ms" }` |
//! | `breaker.half_open_probes` | integer | `1` |
//! | `limit.max_concurrent` | integer | `64` |
//! | `limit.rate` | table of the two below, both required | off |
//! | `limit.rate.per_second` | integer | |
//! | `limit.rate.burst` | integer | |
//! | `limit.queue_wait` | duration | `"1s"` |
//! | `retry.max_attempts` | integer, the first try included | `1` (no retries) |
//! | `retry.backoff.strategy` | `"full_jitter"` or `"decorrelated"` | `"full_jitter"` |
//! | `retry.backoff.base` | duration | `"100ms"` |
//! | `retry.backoff.cap` | duration | `"2s"` |
//! | `l1` | a table turns the near cache on (`[l1]`, or `l1 = {}`) | off |
//! | `l1.entries` | integer | `10000` |
//! | `l1.ttl` | duration | `"30s"` |
//! | `l1.keep` | duration | `"10m"` |
//! | `store_breaker` | as `breaker`, with its own defaults | `consecutive_failures = 5`, `cool_down = "1s"` |
//! | `redis.connect_timeout` | duration | `"500ms"` |
//! | `redis.response_timeout` | duration | `"50ms"` |
//! | `redis.write_timeout` | duration | `"250ms"` |
//! | `redis.max_response_timeout` | duration | `"2s"` |
//! | `redis.clock_refresh` | duration | `"60s"` |
//! | `redis.subscription_ping` | duration | `"1s"` |
//!
//! The `redis` table is for [`CacheConfig::redis_store_config`]: the Redis
//! address carries credentials and is not part of a `CacheConfig`; connect
//! with [`RedisStore::connect_with`](crate::RedisStore::connect_with)`(url,
//! config.redis_store_config())`. Not settable from data: the store, a
//! shared [`Origin`](crate::Origin), a fallback value and a `retry_if`
//! rule (code, not values); set them on the builder.
//!
//! # Environment variables
//!
//! [`CacheConfig::from_env`] reads every variable named
//! [`ENV_PREFIX`] (`BREAKWATER_CACHE_`) followed by a key in capitals,
//! with `__` (two underscores) between a table and its key:
//!
//! ```text
//! BREAKWATER_CACHE_TTL=5m
//! BREAKWATER_CACHE_JITTER__RATIO=0.2
//! BREAKWATER_CACHE_L1__ENTRIES=10000
//! BREAKWATER_CACHE_BREAKER__FAILURE_RATIO__WINDOW=30s
//! BREAKWATER_CACHE_REDIS__RESPONSE_TIMEOUT=50ms
//! BREAKWATER_CACHE_EARLY_REFRESH=none
//! ```
//!
//! Values are the text of the TOML value without quotes. A table whose
//! keys all keep their defaults needs one of them to exist here (`[l1]`
//! is `BREAKWATER_CACHE_L1__ENTRIES=10000`). A variable with
//! the prefix that names no key is an error, so a typo is not silently
//! ignored. The prefix is not plain `BREAKWATER_`: breakwater's own tools
//! use that for other things (`BREAKWATER_REDIS_SERVER`). Several caches
//! in one process take one prefix each:
//! [`from_env_prefixed`](CacheConfig::from_env_prefixed)`("CATALOG_CACHE_")`.
//! [`from_vars`](CacheConfig::from_vars) takes the variables from an
//! iterator (tests use it instead of changing the process environment).

mod env;

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};

use crate::breaker::BreakerConfig;
use crate::cache::{CacheBuilder, OnLockTimeout, Value};
use crate::codec::{Codec, Compression};
use crate::error::ConfigError;
use crate::freshness::EarlyRefresh;
use crate::jitter::{Backoff, Jitter};
use crate::l1::L1Config;
use crate::limit::LimitConfig;
use crate::retry::RetryConfig;
use crate::store::RedisStoreConfig;

/// The prefix of the environment variables [`CacheConfig::from_env`] reads.
pub const ENV_PREFIX: &str = "BREAKWATER_CACHE_";

/// A value as a config holds it, turned into what the builder method of
/// the same name takes.
trait Setting {
    /// What the builder method takes.
    type Value;
    /// The value for the builder.
    fn setting(&self) -> Self::Value;
}

/// Declares [`CacheConfig`]: one line per builder setting, `key: type`,
/// where `key` is the builder method the value goes to and `type`
/// implements [`Setting`] for what that method takes.
macro_rules! cache_config {
    ($($key:ident: $ty:ty,)*) => {
        /// The settings of a [`Cache`](crate::Cache) as data, read from TOML,
        /// JSON or environment variables; see the [module docs](self) for
        /// every key and its default.
        ///
        /// Keys left out keep what the builder has. `Default` is the empty
        /// config, which changes nothing.
        #[derive(Clone, Debug, Default, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct CacheConfig {
            $($key: Option<$ty>,)*
            redis: Option<RedisSection>,
        }

        impl<V: Value> CacheBuilder<V> {
    /// Every setting applied from `config` (see [`CacheConfig`]); the
    /// settings it leaves out keep what this builder has. Checked by
    /// [`build`](CacheBuilder::build) like every other setting.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::Cache;
    /// use breakwater_cache::config::CacheConfig;
    ///
    /// let config = CacheConfig::from_toml_str(r#"
    ///     namespace = "catalog"
    ///     ttl = "10m"
    ///     jitter = { ratio = 0.2 }
    ///     [l1]
    ///     entries = 50_000
    /// "#)?;
    /// let cache = Cache::<String>::builder().config(&config).build()?;
    /// assert_eq!(cache.namespace(), "catalog");
    /// # Ok::<(), breakwater_cache::ConfigError>(())
    /// ```
    pub fn config(self, config: &CacheConfig) -> Self {
        config.apply(self)
    }
}

impl CacheConfig {
            /// Every key that is set, applied to `builder` by the method of
            /// the same name.
            pub(crate) fn apply<V: Value>(&self, builder: CacheBuilder<V>) -> CacheBuilder<V> {
                let mut builder = builder;
                $(if let Some(value) = &self.$key {
                    builder = builder.$key(value.setting());
                })*
                builder
            }
        }
    };
}

cache_config! {
    namespace: String,
    key_prefix: String,
    ttl: Human,
    negative_ttl: Human,
    jitter: JitterSpec,
    codec: CodecName,
    compression: CompressionSpec,
    max_key_len: usize,
    max_value_size: usize,
    version: u32,
    version_transition: Human,
    trace_keys: bool,
    startup_check: bool,
    grace: Human,
    max_stale: Human,
    early_refresh: EarlyRefreshSpec,
    soft_timeout: Human,
    fail_safe_throttle: Human,
    lease_ttl: Human,
    lock_wait: Human,
    lock_poll: Human,
    on_lock_timeout: LockTimeoutName,
    load_timeout: Human,
    breaker: BreakerSpec,
    limit: LimitSpec,
    retry: RetrySpec,
    l1: L1Spec,
    store_breaker: StoreBreakerSpec,
    rng_seed: u64,
}

impl CacheConfig {
    /// Reads a TOML document (see the [module docs](self) for the keys)
    /// and checks it.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the key ([`ConfigError::key`], and the
    /// message): a syntax error, an unknown key, a value of the wrong type
    /// or out of bounds.
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::config::CacheConfig;
    ///
    /// let err = CacheConfig::from_toml_str("[l1]\ncapacity = 10").unwrap_err();
    /// assert_eq!(err.key(), Some("l1.capacity"));
    /// assert!(err.message().contains("unknown field `capacity`"), "{err}");
    ///
    /// let err = CacheConfig::from_toml_str("ttl = \"0s\"").unwrap_err();
    /// assert_eq!(err.to_string(), "ttl: ttl must be at least 1ms, got 0ns");
    /// ```
    pub fn from_toml_str(toml: &str) -> Result<Self, ConfigError> {
        let parsed: Result<Self, _> = toml::Deserializer::parse(toml)
            .map_err(|e| ConfigError::new(e.to_string().trim_end().to_owned()))
            .and_then(|de| serde_path_to_error::deserialize(de).map_err(parse_error));
        parsed?.checked()
    }

    /// Reads a JSON document (the same keys as TOML, tables as objects) and
    /// checks it.
    ///
    /// # Errors
    ///
    /// As [`from_toml_str`](Self::from_toml_str).
    pub fn from_json_str(json: &str) -> Result<Self, ConfigError> {
        let mut de = serde_json::Deserializer::from_str(json);
        let config: Self = serde_path_to_error::deserialize(&mut de).map_err(parse_error)?;
        de.end()
            .map_err(|e| ConfigError::new(format!("invalid JSON: {e}")))?;
        config.checked()
    }

    /// Reads a `.toml` or `.json` file (by its extension) and checks it.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] if the file cannot be read or has another
    /// extension, else as [`from_toml_str`](Self::from_toml_str), with the
    /// file's path in front.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let shown = path.display();
        let read = || {
            std::fs::read_to_string(path)
                .map_err(|e| ConfigError::new(format!("could not read {shown}: {e}")))
        };
        let parsed = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => Self::from_toml_str(&read()?),
            Some("json") => Self::from_json_str(&read()?),
            _ => {
                return Err(ConfigError::new(format!(
                    "{shown}: a configuration file must end in .toml or .json"
                )));
            }
        };
        parsed.map_err(|e| e.in_front(&format!("{shown}: ")))
    }

    /// Reads the process's environment variables that start with
    /// [`ENV_PREFIX`] (see the [module docs](self#environment-variables))
    /// and checks them.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the variable and its key: an unknown key, a
    /// value that does not parse or is out of bounds, a variable with the
    /// prefix that is not valid UTF-8.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_env_prefixed(ENV_PREFIX)
    }

    /// [`from_env`](Self::from_env) with another prefix, e.g.
    /// `"CATALOG_CACHE_"` for a second cache.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    pub fn from_env_prefixed(prefix: &str) -> Result<Self, ConfigError> {
        let mut vars = Vec::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str().filter(|n| n.starts_with(prefix)) else {
                continue;
            };
            let value = value
                .into_string()
                .map_err(|_| ConfigError::new(format!("{name}: the value is not valid UTF-8")))?;
            vars.push((name.to_owned(), value));
        }
        Self::from_vars(prefix, vars)
    }

    /// Reads the variables of `vars` whose names start with `prefix`, as
    /// [`from_env`](Self::from_env) reads the environment's, and checks
    /// them. Names without the prefix are skipped.
    ///
    /// # Errors
    ///
    /// As [`from_env`](Self::from_env).
    ///
    /// # Examples
    ///
    /// ```
    /// use breakwater_cache::config::{CacheConfig, ENV_PREFIX};
    ///
    /// let config = CacheConfig::from_vars(
    ///     ENV_PREFIX,
    ///     [("BREAKWATER_CACHE_TTL", "5m"), ("BREAKWATER_CACHE_L1__ENTRIES", "10000"), ("HOME", "/root")],
    /// )?;
    /// assert_eq!(config, CacheConfig::from_toml_str("ttl = \"5m\"\nl1.entries = 10000")?);
    ///
    /// let err = CacheConfig::from_vars(ENV_PREFIX, [("BREAKWATER_CACHE_TTL", "5x")]).unwrap_err();
    /// assert_eq!(err.key(), Some("ttl"));
    /// assert!(err.message().starts_with("BREAKWATER_CACHE_TTL (ttl): invalid duration \"5x\""), "{err}");
    /// # Ok::<(), breakwater_cache::ConfigError>(())
    /// ```
    pub fn from_vars<I, K, V>(prefix: &str, vars: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let vars = env::Vars::new(prefix, vars)?;
        let config: Self = serde_path_to_error::deserialize(vars.tree())
            .map_err(parse_error)
            .map_err(|e| vars.name(e))?;
        config.checked().map_err(|e| vars.name(e))
    }

    /// Checks every setting with the builder's own checks (over the
    /// builder's defaults) and the `redis` table with
    /// [`RedisStore`](crate::RedisStore)'s.
    ///
    /// # Errors
    ///
    /// The first invalid setting's [`ConfigError`], its key in front of the
    /// message: `l1.ttl: l1 ttl must be at least 1ms, got 0ns`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let checked = self
            .apply(CacheBuilder::<()>::new())
            .check()
            .map(drop)
            .and_then(|()| match &self.redis {
                Some(redis) => redis.config().validate().map_err(|e| e.within("redis")),
                None => Ok(()),
            });
        checked.map_err(|e| match e.key() {
            Some(key) => {
                let key = key.to_owned();
                e.in_front(&format!("{key}: "))
            }
            None => e,
        })
    }

    /// The `redis` table as a [`RedisStoreConfig`]; its defaults where the
    /// table leaves a key out, or has none.
    pub fn redis_store_config(&self) -> RedisStoreConfig {
        self.redis
            .as_ref()
            .map_or_else(RedisStoreConfig::default, RedisSection::config)
    }

    /// `self`, if [`validate`](Self::validate) passes.
    fn checked(self) -> Result<Self, ConfigError> {
        self.validate()?;
        Ok(self)
    }
}

/// A parse error with the path of the key it is about.
fn parse_error<E: fmt::Display>(err: serde_path_to_error::Error<E>) -> ConfigError {
    let path = err.path().to_string();
    let message = err.inner().to_string();
    let message = message.trim_end();
    if path == "." || path.is_empty() {
        return ConfigError::new(message.to_owned());
    }
    ConfigError::new(format!("{path}: {message}")).for_key(&path)
}

impl ConfigError {
    /// The same error with `prefix` in front of its message.
    fn in_front(self, prefix: &str) -> Self {
        let key = self.key().map(str::to_owned);
        let err = ConfigError::new(format!("{prefix}{}", self.message()));
        match key {
            Some(key) => err.for_key(&key),
            None => err,
        }
    }
}

impl Setting for String {
    type Value = String;
    fn setting(&self) -> String {
        self.clone()
    }
}

impl Setting for usize {
    type Value = usize;
    fn setting(&self) -> usize {
        *self
    }
}

impl Setting for u64 {
    type Value = u64;
    fn setting(&self) -> u64 {
        *self
    }
}

impl Setting for u32 {
    type Value = u32;
    fn setting(&self) -> u32 {
        *self
    }
}

impl Setting for bool {
    type Value = bool;
    fn setting(&self) -> bool {
        *self
    }
}

/// A duration written for people: `"250ms"`, `"5m"`, `"1h 30m"`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Human(Duration);

impl Setting for Human {
    type Value = Duration;
    fn setting(&self) -> Duration {
        self.0
    }
}

impl<'de> Deserialize<'de> for Human {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HumanVisitor;
        impl Visitor<'_> for HumanVisitor {
            type Value = Human;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"250ms\", \"5s\" or \"10m\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<Human, E> {
                humantime::parse_duration(text)
                    .map(Human)
                    .map_err(|e| E::custom(format!("invalid duration {text:?}: {e}")))
            }
        }
        deserializer.deserialize_str(HumanVisitor)
    }
}

/// A [`Jitter`]: `"none"`, or a table with one kind and an optional floor.
#[derive(Clone, Copy, Debug, PartialEq)]
struct JitterSpec(Jitter);

impl Setting for JitterSpec {
    type Value = Jitter;
    fn setting(&self) -> Jitter {
        self.0
    }
}

/// The table form of a jitter.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JitterTable {
    ratio: Option<f64>,
    down: Option<f64>,
    fixed: Option<Human>,
    up_to: Option<Human>,
    none: Option<bool>,
    floor: Option<Human>,
}

impl JitterTable {
    fn jitter(self) -> Result<Jitter, String> {
        let kinds = [
            self.ratio.map(|r| ("ratio", Jitter::ratio(r))),
            self.down.map(|r| ("down", Jitter::down(r))),
            self.fixed.map(|d| ("fixed", Jitter::fixed(d.0))),
            self.up_to.map(|d| ("up_to", Jitter::up_to(d.0))),
            self.none.filter(|n| *n).map(|_| ("none", Jitter::none())),
        ];
        let mut given = kinds.into_iter().flatten();
        let jitter = match (given.next(), given.next()) {
            (Some((_, jitter)), None) => jitter,
            (None, _) => Jitter::ratio(0.1),
            (Some((first, _)), Some((second, _))) => {
                return Err(format!(
                    "a jitter is one of ratio, down, fixed, up_to or none; got {first} and {second}"
                ));
            }
        };
        Ok(match self.floor {
            Some(floor) => jitter.with_floor(floor.0),
            None => jitter,
        })
    }
}

impl<'de> Deserialize<'de> for JitterSpec {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct JitterVisitor;
        impl<'de> Visitor<'de> for JitterVisitor {
            type Value = JitterSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"none\" or a table such as { ratio = 0.2 }")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<JitterSpec, E> {
                match text {
                    "none" => Ok(JitterSpec(Jitter::none())),
                    _ => Err(E::invalid_value(de::Unexpected::Str(text), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<JitterSpec, A::Error> {
                let table = JitterTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                table.jitter().map(JitterSpec).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(JitterVisitor)
    }
}

/// An [`EarlyRefresh`]: `"none"`, or a table with one of `xfetch` and
/// `after_fraction`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct EarlyRefreshSpec(EarlyRefresh);

impl Setting for EarlyRefreshSpec {
    type Value = EarlyRefresh;
    fn setting(&self) -> EarlyRefresh {
        self.0
    }
}

/// The table form of an early refresh.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EarlyRefreshTable {
    xfetch: Option<f64>,
    after_fraction: Option<f64>,
}

impl<'de> Deserialize<'de> for EarlyRefreshSpec {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EarlyRefreshVisitor;
        impl<'de> Visitor<'de> for EarlyRefreshVisitor {
            type Value = EarlyRefreshSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"none\", { xfetch = 1.0 } or { after_fraction = 0.8 }")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<EarlyRefreshSpec, E> {
                match text {
                    "none" => Ok(EarlyRefreshSpec(EarlyRefresh::none())),
                    _ => Err(E::invalid_value(de::Unexpected::Str(text), &self)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<EarlyRefreshSpec, A::Error> {
                let table =
                    EarlyRefreshTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                match (table.xfetch, table.after_fraction) {
                    (Some(beta), None) => Ok(EarlyRefreshSpec(EarlyRefresh::xfetch(beta))),
                    (None, Some(f)) => Ok(EarlyRefreshSpec(EarlyRefresh::after_fraction(f))),
                    _ => Err(de::Error::custom(
                        "an early refresh is one of xfetch or after_fraction",
                    )),
                }
            }
        }
        deserializer.deserialize_any(EarlyRefreshVisitor)
    }
}

/// A [`Codec`] by name.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CodecName {
    Msgpack,
    Json,
}

impl Setting for CodecName {
    type Value = Codec;
    fn setting(&self) -> Codec {
        match self {
            CodecName::Msgpack => Codec::msgpack(),
            CodecName::Json => Codec::json(),
        }
    }
}

/// An [`OnLockTimeout`] by name.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LockTimeoutName {
    LoadAnyway,
    ServeStale,
    Error,
}

impl Setting for LockTimeoutName {
    type Value = OnLockTimeout;
    fn setting(&self) -> OnLockTimeout {
        match self {
            LockTimeoutName::LoadAnyway => OnLockTimeout::load_anyway(),
            LockTimeoutName::ServeStale => OnLockTimeout::serve_stale(),
            LockTimeoutName::Error => OnLockTimeout::error(),
        }
    }
}

/// A compression algorithm by name.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Algorithm {
    Lz4,
    None,
}

/// A [`Compression`].
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompressionSpec {
    algorithm: Option<Algorithm>,
    threshold: Option<usize>,
    max_decompressed: Option<usize>,
}

impl Setting for CompressionSpec {
    type Value = Compression;
    fn setting(&self) -> Compression {
        let mut compression = match self.algorithm {
            Some(Algorithm::None) => Compression::none(),
            Some(Algorithm::Lz4) | None => Compression::lz4(),
        };
        if let Some(bytes) = self.threshold {
            compression = compression.threshold(bytes);
        }
        if let Some(bytes) = self.max_decompressed {
            compression = compression.max_decompressed(bytes);
        }
        compression
    }
}

/// A [`BreakerConfig`], over [`BreakerConfig::new`].
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct BreakerSpec {
    consecutive_failures: Option<u32>,
    failure_ratio: Option<RatioSpec>,
    cool_down: Option<Human>,
    cool_down_jitter: Option<JitterSpec>,
    half_open_probes: Option<u32>,
}

/// The breaker's failure-ratio rule.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RatioSpec {
    ratio: f64,
    window: Human,
    min_calls: u32,
}

impl BreakerSpec {
    /// These settings over `base`.
    fn over(&self, mut config: BreakerConfig) -> BreakerConfig {
        if let Some(n) = self.consecutive_failures {
            config = config.consecutive_failures(n);
        }
        if let Some(rule) = self.failure_ratio {
            config = config.failure_ratio(rule.ratio, rule.window.0, rule.min_calls);
        }
        if let Some(d) = self.cool_down {
            config = config.cool_down(d.0);
        }
        if let Some(jitter) = self.cool_down_jitter {
            config = config.cool_down_jitter(jitter.0);
        }
        if let Some(n) = self.half_open_probes {
            config = config.half_open_probes(n);
        }
        config
    }
}

impl Setting for BreakerSpec {
    type Value = BreakerConfig;
    fn setting(&self) -> BreakerConfig {
        self.over(BreakerConfig::new())
    }
}

/// The store's breaker: a [`BreakerSpec`] over the store breaker's own
/// defaults.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(transparent)]
struct StoreBreakerSpec(BreakerSpec);

impl Setting for StoreBreakerSpec {
    type Value = BreakerConfig;
    fn setting(&self) -> BreakerConfig {
        self.0.over(crate::cache::default_store_breaker())
    }
}

/// A [`LimitConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitSpec {
    max_concurrent: Option<u32>,
    rate: Option<RateSpec>,
    queue_wait: Option<Human>,
}

/// The bulkhead's rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateSpec {
    per_second: u32,
    burst: u32,
}

impl Setting for LimitSpec {
    type Value = LimitConfig;
    fn setting(&self) -> LimitConfig {
        let mut config = LimitConfig::new();
        if let Some(n) = self.max_concurrent {
            config = config.max_concurrent(n);
        }
        if let Some(rate) = self.rate {
            config = config.rate(rate.per_second, rate.burst);
        }
        if let Some(d) = self.queue_wait {
            config = config.queue_wait(d.0);
        }
        config
    }
}

/// A [`RetryConfig`], over [`RetryConfig::none`] (the origin's default).
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetrySpec {
    max_attempts: Option<u32>,
    backoff: Option<BackoffSpec>,
}

/// A [`Backoff`] strategy by name.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Strategy {
    FullJitter,
    Decorrelated,
}

/// A [`Backoff`], over the retry default's.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackoffSpec {
    strategy: Option<Strategy>,
    base: Option<Human>,
    cap: Option<Human>,
}

impl Setting for RetrySpec {
    type Value = RetryConfig;
    fn setting(&self) -> RetryConfig {
        let mut config = RetryConfig::none();
        if let Some(n) = self.max_attempts {
            config = config.max_attempts(n);
        }
        if let Some(spec) = self.backoff {
            let (base, cap, decorrelated) = config.backoff_config().parts();
            let base = spec.base.map_or(base, |d| d.0);
            let cap = spec.cap.map_or(cap, |d| d.0);
            let backoff = match spec.strategy {
                Some(Strategy::Decorrelated) => Backoff::decorrelated(base, cap),
                Some(Strategy::FullJitter) => Backoff::full_jitter(base, cap),
                None if decorrelated => Backoff::decorrelated(base, cap),
                None => Backoff::full_jitter(base, cap),
            };
            config = config.backoff(backoff);
        }
        config
    }
}

/// An [`L1Config`]; the table's presence turns L1 on.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct L1Spec {
    entries: Option<u64>,
    ttl: Option<Human>,
    keep: Option<Human>,
}

impl Setting for L1Spec {
    type Value = L1Config;
    fn setting(&self) -> L1Config {
        let mut config = L1Config::new();
        if let Some(n) = self.entries {
            config = config.entries(n);
        }
        if let Some(d) = self.ttl {
            config = config.ttl(d.0);
        }
        if let Some(d) = self.keep {
            config = config.keep(d.0);
        }
        config
    }
}

/// The timeouts of a [`RedisStoreConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedisSection {
    connect_timeout: Option<Human>,
    response_timeout: Option<Human>,
    write_timeout: Option<Human>,
    max_response_timeout: Option<Human>,
    clock_refresh: Option<Human>,
    subscription_ping: Option<Human>,
}

impl RedisSection {
    fn config(&self) -> RedisStoreConfig {
        let mut config = RedisStoreConfig::default();
        if let Some(d) = self.connect_timeout {
            config = config.connect_timeout(d.0);
        }
        if let Some(d) = self.response_timeout {
            config = config.response_timeout(d.0);
        }
        if let Some(d) = self.write_timeout {
            config = config.write_timeout(d.0);
        }
        if let Some(d) = self.max_response_timeout {
            config = config.max_response_timeout(d.0);
        }
        if let Some(d) = self.clock_refresh {
            config = config.clock_refresh(d.0);
        }
        if let Some(d) = self.subscription_ping {
            config = config.subscription_ping(d.0);
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use serde::de::value::Error;

    use super::*;

    /// Asks a derived `Deserialize` for its field names.
    struct Probe<'a>(&'a Cell<&'static [&'static str]>);

    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Error> {
            self.0.set(fields);
            Err(de::Error::custom("probed"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }

    fn fields<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
        let seen = Cell::new(&[][..]);
        let _ = T::deserialize(Probe(&seen));
        seen.get()
    }

    /// The keys of the module docs' table.
    fn documented() -> Vec<String> {
        include_str!("mod.rs")
            .lines()
            .filter_map(|line| line.strip_prefix("//! | `"))
            .filter_map(|row| row.split_once('`').map(|(key, _)| key.to_owned()))
            .collect()
    }

    /// Every key a config reads is in the docs' table, and every key there
    /// is one a config reads: a new setting cannot go undocumented.
    #[test]
    fn the_docs_table_lists_every_key() {
        let tables: &[(&str, &[&str])] = &[
            ("jitter", fields::<JitterTable>()),
            ("compression", fields::<CompressionSpec>()),
            ("early_refresh", fields::<EarlyRefreshTable>()),
            ("breaker", fields::<BreakerSpec>()),
            ("breaker.failure_ratio", fields::<RatioSpec>()),
            ("limit", fields::<LimitSpec>()),
            ("limit.rate", fields::<RateSpec>()),
            ("retry", fields::<RetrySpec>()),
            ("retry.backoff", fields::<BackoffSpec>()),
            ("l1", fields::<L1Spec>()),
            ("redis", fields::<RedisSection>()),
        ];
        let mut read: Vec<String> = fields::<CacheConfig>()
            .iter()
            .map(|f| (*f).to_owned())
            .collect();
        assert_eq!(read.len(), 30);
        for (table, keys) in tables {
            assert!(!keys.is_empty(), "{table}");
            read.extend(keys.iter().map(|key| format!("{table}.{key}")));
        }
        let documented = documented();
        for key in &read {
            let nested = |d: &String| d.starts_with(&format!("{key}."));
            assert!(
                documented.contains(key) || documented.iter().any(nested),
                "`{key}` is read but not in the docs' table"
            );
        }
        for key in &documented {
            assert!(read.contains(key), "`{key}` is documented but not read");
        }
    }

    #[test]
    fn a_duration_is_human() {
        let config = CacheConfig::from_toml_str("ttl = \"1h 30m\"\nlock_poll = \"250ms\"").unwrap();
        assert_eq!(config.ttl, Some(Human(Duration::from_secs(5400))));
        assert_eq!(config.lock_poll, Some(Human(Duration::from_millis(250))));
    }
}
