//! The [`Cache`] handle, its builder, and the `get_or_load` pipeline.
//!
//! # Order
//!
//! One `get_or_load(key, loader)` reads top to bottom:
//!
//! 1. **Key**: validated and namespaced (a bad key never reaches the store).
//! 2. **Read**: one `GET` of the envelope. Corrupt or foreign bytes are a miss
//!    plus a warning; a store failure is a miss plus a warning too, so a sick
//!    store degrades to direct loads instead of failing requests.
//! 3. **Freshness**: judged on the store's clock. Fresh → return.
//! 4. **Load**: the loader runs; `Ok(None)` becomes a negative entry.
//! 5. **Write**: the envelope is written with a jittered TTL. A failed write
//!    is logged; the caller still gets the loaded value.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::codec::{Codec, Compression};
use crate::entry::Entry;
use crate::error::{ConfigError, Error, ErrorKind};
use crate::jitter::Jitter;
use crate::store::{MemoryStore, Store};

/// What a cached value must be: serializable, cloneable (one load is shared
/// by every caller waiting on it) and sendable across tasks.
pub trait Value: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> Value for T {}

/// A typed cache of `V` values in one namespace of a [`Store`].
///
/// Cheap to clone: clones share the store, settings and random source.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use breakwater::{Cache, Jitter, MemoryStore};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cache = Cache::<String>::builder()
///     .namespace("greetings")
///     .store(MemoryStore::new())
///     .ttl(Duration::from_secs(300))
///     .jitter(Jitter::ratio(0.2)) // 240..=360 s
///     .build()?;
///
/// let v = cache
///     .get_or_load("en", || async { Ok::<_, std::io::Error>(Some("hello".to_string())) })
///     .await?;
/// assert_eq!(v.as_deref(), Some("hello"));
/// assert_eq!(cache.get("en").await?.as_deref(), Some("hello"));
/// # Ok(()) }
/// ```
pub struct Cache<V> {
    inner: Arc<Inner>,
    _value: PhantomData<fn() -> V>,
}

impl<V> Clone for Cache<V> {
    fn clone(&self) -> Self {
        Cache {
            inner: Arc::clone(&self.inner),
            _value: PhantomData,
        }
    }
}

impl<V> fmt::Debug for Cache<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cache")
            .field("namespace", &self.inner.namespace)
            .field("store", &self.inner.store)
            .field("ttl", &self.inner.ttl)
            .field("jitter", &self.inner.jitter)
            .finish_non_exhaustive()
    }
}

/// Everything a cache knows, independent of its value type.
struct Inner {
    namespace: String,
    /// `bw:<namespace>:v:`; the user key follows inside a hash tag.
    value_prefix: Vec<u8>,
    store: Arc<dyn Store>,
    ttl: Duration,
    negative_ttl: Duration,
    jitter: Jitter,
    codec: Codec,
    compression: Compression,
    max_key_len: usize,
    rng: Mutex<StdRng>,
}

/// Builds a [`Cache`]; every setting has a default, and [`build`](Self::build)
/// rejects invalid ones with an exact message.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | `namespace` | `"default"` |
/// | `store` | a new [`MemoryStore`] |
/// | `ttl` | 5 minutes |
/// | `jitter` | [`Jitter::ratio(0.1)`](Jitter::ratio) (±10 %, floor 1 s) |
/// | `negative_ttl` | 30 s, or `ttl` if shorter |
/// | `codec` | [`Codec::msgpack`] |
/// | `compression` | [`Compression::lz4`] above 1 KiB |
/// | `max_key_len` | 1024 bytes |
/// | `rng_seed` | none (seeded from the OS) |
pub struct CacheBuilder<V> {
    namespace: String,
    store: Option<Arc<dyn Store>>,
    ttl: Duration,
    negative_ttl: Option<Duration>,
    jitter: Jitter,
    codec: Codec,
    compression: Compression,
    max_key_len: usize,
    rng_seed: Option<u64>,
    _value: PhantomData<fn() -> V>,
}

impl<V> fmt::Debug for CacheBuilder<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheBuilder")
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("jitter", &self.jitter)
            .finish_non_exhaustive()
    }
}

/// The longest namespace accepted, in bytes.
const MAX_NAMESPACE_LEN: usize = 128;

impl<V: Value> CacheBuilder<V> {
    fn new() -> Self {
        CacheBuilder {
            namespace: "default".to_owned(),
            store: None,
            ttl: Duration::from_secs(300),
            negative_ttl: None,
            jitter: Jitter::ratio(0.1),
            codec: Codec::msgpack(),
            compression: Compression::lz4(),
            max_key_len: 1024,
            rng_seed: None,
            _value: PhantomData,
        }
    }

    /// The namespace every key of this cache lives in. Two caches with
    /// different namespaces never see each other's keys.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The backend: a [`MemoryStore`], a [`RedisStore`](crate::RedisStore),
    /// or your own [`Store`].
    pub fn store(mut self, store: impl Store) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A backend shared with other caches.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// How long a loaded value stays fresh, before jitter.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long "not found" (a loader returning `Ok(None)`) is remembered,
    /// before jitter.
    pub fn negative_ttl(mut self, ttl: Duration) -> Self {
        self.negative_ttl = Some(ttl);
        self
    }

    /// The jitter applied to every write's TTL.
    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// How values are serialized.
    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// When payloads are compressed, and the cap on decompressed size.
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// The longest user key accepted, in bytes.
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.max_key_len = bytes;
        self
    }

    /// Seeds the random source behind jitter, for reproducible runs.
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.rng_seed = Some(seed);
        self
    }

    /// Checks every setting and builds the cache. No I/O happens here: a
    /// [`RedisStore`](crate::RedisStore) connects on first use.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the first invalid setting, e.g.
    /// `jitter ratio must be in 0..=1, got 1.5`.
    pub fn build(self) -> Result<Cache<V>, ConfigError> {
        validate_namespace(&self.namespace)?;
        if self.ttl < Duration::from_millis(1) {
            return Err(ConfigError::new(format!(
                "ttl must be at least 1ms, got {:?}",
                self.ttl
            )));
        }
        let negative_ttl = self
            .negative_ttl
            .unwrap_or_else(|| self.ttl.min(Duration::from_secs(30)));
        if negative_ttl < Duration::from_millis(1) {
            return Err(ConfigError::new(format!(
                "negative_ttl must be at least 1ms, got {negative_ttl:?}"
            )));
        }
        if self.max_key_len == 0 {
            return Err(ConfigError::new("max_key_len must be greater than zero"));
        }
        self.jitter.validate()?;
        self.compression.validate()?;
        let rng = match self.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => rand::make_rng(),
        };
        let value_prefix = format!("bw:{}:v:", self.namespace).into_bytes();
        Ok(Cache {
            inner: Arc::new(Inner {
                namespace: self.namespace,
                value_prefix,
                store: self.store.unwrap_or_else(|| Arc::new(MemoryStore::new())),
                ttl: self.ttl,
                negative_ttl,
                jitter: self.jitter,
                codec: self.codec,
                compression: self.compression,
                max_key_len: self.max_key_len,
                rng: Mutex::new(rng),
            }),
            _value: PhantomData,
        })
    }
}

fn validate_namespace(ns: &str) -> Result<(), ConfigError> {
    if ns.is_empty() {
        return Err(ConfigError::new("namespace must not be empty"));
    }
    if ns.len() > MAX_NAMESPACE_LEN {
        return Err(ConfigError::new(format!(
            "namespace must be at most {MAX_NAMESPACE_LEN} bytes, got {}",
            ns.len()
        )));
    }
    if let Some(c) = ns
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_whitespace() || c.is_control())
    {
        return Err(ConfigError::new(format!(
            "namespace must not contain braces, whitespace or control characters \
             (found {c:?} in {ns:?})"
        )));
    }
    Ok(())
}

impl<V: Value> Cache<V> {
    /// Starts a [`CacheBuilder`] with the documented defaults.
    pub fn builder() -> CacheBuilder<V> {
        CacheBuilder::new()
    }

    /// The cached value under `key`, or `None` if it is missing, expired,
    /// cached as "not found", or unreadable (corrupt bytes are logged and
    /// treated as missing).
    ///
    /// A hit costs exactly one store read (one `GET` in Redis).
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty or over-long key,
    /// [`Store`](ErrorKind::Store) if the store fails.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<V>, Error> {
        let key = self.storage_key(key.as_ref())?;
        let Some(entry) = self.read(&key).await? else {
            return Ok(None);
        };
        if entry.negative || !self.is_fresh(&entry) {
            return Ok(None);
        }
        Ok(self.decode_value(&key, &entry))
    }

    /// Stores `value` under `key` with the cache's jittered TTL.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey), [`Codec`](ErrorKind::Codec) if
    /// the value cannot be serialized, [`Store`](ErrorKind::Store) if the
    /// write fails.
    pub async fn set(&self, key: impl AsRef<[u8]>, value: &V) -> Result<(), Error> {
        let key = self.storage_key(key.as_ref())?;
        let payload = self.inner.codec.encode(value)?;
        self.write(&key, payload, false, Duration::ZERO).await
    }

    /// Removes `key`, so the next read loads it again.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey), or [`Store`](ErrorKind::Store)
    /// if the delete fails.
    pub async fn invalidate(&self, key: impl AsRef<[u8]>) -> Result<(), Error> {
        let key = self.storage_key(key.as_ref())?;
        self.inner.store.delete(&key).await.map(drop)
    }

    /// The cached value under `key`, or the loader's, which is then cached.
    ///
    /// The loader returns `Ok(Some(value))`, `Ok(None)` for "does not exist"
    /// (cached as a negative entry for `negative_ttl`, so a missing row is not
    /// queried on every request), or an error, which is returned to the caller
    /// intact inside [`Error`] (see [`Error::loader_error`]) and not cached.
    ///
    /// If the store fails or holds unreadable bytes, the value is loaded
    /// directly: a sick cache degrades to the loader, never to wrong data.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty or over-long key,
    /// [`Loader`](ErrorKind::Loader) if the loader failed,
    /// [`Codec`](ErrorKind::Codec) if the loaded value cannot be serialized.
    ///
    /// # Examples
    ///
    /// ```
    /// # use breakwater::{Cache, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), breakwater::Error> {
    /// let cache = Cache::<u64>::builder().build()?;
    /// let price = cache
    ///     .get_or_load("price:42", || async { Ok::<_, std::io::Error>(Some(1999)) })
    ///     .await?;
    /// assert_eq!(price, Some(1999));
    /// # Ok(()) }
    /// ```
    pub async fn get_or_load<F, Fut, E>(
        &self,
        key: impl AsRef<[u8]>,
        loader: F,
    ) -> Result<Option<V>, Error>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
        E: Into<Box<dyn StdError + Send + Sync + 'static>>,
    {
        // 1. Key.
        let key = self.storage_key(key.as_ref())?;

        // 2. Read; 3. Freshness.
        match self.read(&key).await {
            Ok(Some(entry)) if self.is_fresh(&entry) => {
                if entry.negative {
                    return Ok(None);
                }
                if let Some(value) = self.decode_value(&key, &entry) {
                    return Ok(Some(value));
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(key = %show_key(&key), error = %err, "store read failed; loading directly");
            }
        }

        // 4. Load.
        let started = Instant::now();
        let loaded = loader().await.map_err(Error::loader)?;
        let load_time = started.elapsed();

        // 5. Write.
        let write = match &loaded {
            Some(value) => match self.inner.codec.encode(value) {
                Ok(payload) => self.write(&key, payload, false, load_time).await,
                Err(err) => return Err(err),
            },
            None => self.write(&key, Vec::new(), true, load_time).await,
        };
        if let Err(err) = write {
            tracing::warn!(key = %show_key(&key), error = %err, "store write failed; returning the loaded value");
        }
        Ok(loaded)
    }

    /// The exact key the entry for `key` is stored under:
    /// `bw:<namespace>:v:{<key>}`, or `bw:<namespace>:v:{#<hash>}<key>` when
    /// the key itself contains a brace. The braces are a Redis Cluster hash
    /// tag, so every record of one key shares one slot.
    ///
    /// # Errors
    ///
    /// [`InvalidKey`](ErrorKind::InvalidKey) for an empty key or one longer
    /// than `max_key_len`.
    pub fn storage_key(&self, key: &[u8]) -> Result<Vec<u8>, Error> {
        if key.is_empty() {
            return Err(Error::new(ErrorKind::InvalidKey, "key must not be empty"));
        }
        if key.len() > self.inner.max_key_len {
            return Err(Error::new(
                ErrorKind::InvalidKey,
                format!(
                    "key is {} bytes, the limit is {} (see CacheBuilder::max_key_len)",
                    key.len(),
                    self.inner.max_key_len
                ),
            ));
        }
        let prefix = &self.inner.value_prefix;
        let mut out = Vec::with_capacity(prefix.len() + key.len() + 20);
        out.extend_from_slice(prefix);
        if key.iter().any(|b| matches!(b, b'{' | b'}')) {
            out.extend_from_slice(format!("{{#{:016x}}}", fnv1a(key)).as_bytes());
            out.extend_from_slice(key);
        } else {
            out.push(b'{');
            out.extend_from_slice(key);
            out.push(b'}');
        }
        Ok(out)
    }

    /// The namespace this cache was built with.
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The store behind this cache.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Reads and decodes the envelope; unreadable bytes are a miss plus a
    /// warning, never an error and never a wrong value.
    async fn read(&self, key: &[u8]) -> Result<Option<Entry>, Error> {
        let Some(bytes) = self.inner.store.get(key).await? else {
            return Ok(None);
        };
        match Entry::decode(&bytes, self.inner.compression.max_decompressed_len()) {
            Ok(entry) if entry.codec == self.inner.codec => Ok(Some(entry)),
            Ok(entry) => {
                tracing::warn!(
                    key = %show_key(key),
                    stored = entry.codec.name(),
                    expected = self.inner.codec.name(),
                    "cached entry has another codec; treating it as a miss"
                );
                Ok(None)
            }
            Err(err) => {
                tracing::warn!(key = %show_key(key), error = %err, "cached entry is unreadable; treating it as a miss");
                Ok(None)
            }
        }
    }

    fn is_fresh(&self, entry: &Entry) -> bool {
        entry.fresh_until > self.inner.store.now_ms()
    }

    fn decode_value(&self, key: &[u8], entry: &Entry) -> Option<V> {
        match entry.value::<V>() {
            Ok(value) => Some(value),
            Err(err) => {
                tracing::warn!(key = %show_key(key), error = %err, "cached value does not decode; treating it as a miss");
                None
            }
        }
    }

    /// Writes an envelope with the jittered TTL (the negative TTL for
    /// negative entries). The physical TTL ends at `stale_until`.
    async fn write(
        &self,
        key: &[u8],
        payload: Vec<u8>,
        negative: bool,
        load_time: Duration,
    ) -> Result<(), Error> {
        let inner = &self.inner;
        let base = if negative {
            inner.negative_ttl
        } else {
            inner.ttl
        };
        let ttl = {
            let mut rng = inner.rng.lock().unwrap_or_else(|p| p.into_inner());
            inner.jitter.apply(base, &mut *rng)
        };
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let now = inner.store.now_ms();
        let fresh_until = now.saturating_add(ttl_ms);
        let entry = Entry {
            codec: inner.codec,
            negative,
            fresh_until,
            stale_until: fresh_until,
            load_ms: u32::try_from(load_time.as_millis()).unwrap_or(u32::MAX),
            payload,
        };
        let bytes = entry.encode(&inner.compression);
        inner
            .store
            .set(key, &bytes, Duration::from_millis(ttl_ms))
            .await
    }
}

/// FNV-1a, 64 bit: a stable hash for the hash tag of keys that contain
/// braces (it only chooses a Cluster slot, never identifies a key).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A key as it may appear in logs: lossy UTF-8, cut at 128 bytes.
fn show_key(key: &[u8]) -> String {
    let cut = &key[..key.len().min(128)];
    let mut s = String::from_utf8_lossy(cut).into_owned();
    if key.len() > cut.len() {
        s.push('…');
    }
    s
}
