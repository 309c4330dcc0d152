//! What `get_many` is made of: the batch loader as the steps take it
//! (`BatchLoad`, cut into chunks of [`MAX_BATCH`] keys), each key's part
//! in the call (`Want`, `Led`) and the lease jobs of a batch.

use std::error::Error as StdError;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::cache::coherence::Landed;
use crate::cache::loaded::{LoadContext, Loaded};
use crate::cache::tags::TagSet;
use crate::cache::transition::Pinned;
use crate::cache::value::Load;
use crate::entry::Entry;
use crate::error::{Error, ErrorKind};
use crate::flight::{Joined, Lander, Role};
use crate::key::CacheKey;
use crate::l1::NearCopy;
use crate::served::Fetched;
use crate::store::LeaseRequest;

/// The most keys one batch loader call is asked for; larger batches are
/// split into calls of this size.
pub(crate) const MAX_BATCH: usize = 500;

/// How many of a batch's waiting keys poll the store per `lock_poll`.
pub(super) const WAITER_POLLS: usize = 100;

/// How long a takeover waits for the other leases of the same dead holder
/// to run out (they were taken, and extended, together, so they expire
/// within a few milliseconds of each other), so they are loaded in one
/// batch; at most a tenth of the lease TTL.
pub(super) const TAKEOVER_GATHER: Duration = Duration::from_millis(50);

/// Time allowed for the store calls of a `get_many` beyond its waits and
/// its load.
pub(super) const STORE_SLACK: Duration = Duration::from_secs(1);

pub(super) type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What a batch load returns: each found value, with its own settings, by
/// its user key's bytes.
type Found<V> = Vec<(Vec<u8>, Loaded<V>)>;

/// The future of one batch loader call.
type BatchFuture<V> = Pin<Box<dyn Future<Output = Result<Option<Found<V>>, BoxError>> + Send>>;

/// A batch loader as the internals take it: called with the keys to load,
/// each with what its load replaces.
pub(super) trait BatchLoad<K, V>: Send + Sync + 'static {
    /// Whether the loader reads its keys' contexts: the values they
    /// replace are decoded for it only then.
    const READS_CONTEXT: bool = false;
    fn call(&self, keys: Vec<(K, LoadContext<V>)>) -> BatchFuture<V>;
    /// The tags the call named, recorded in every entry its loads write.
    fn tags(&self) -> Option<&TagSet> {
        None
    }
}

/// A batch loader whose call named tags.
pub(super) struct TaggedBatch<B> {
    pub(super) batch: B,
    pub(super) tags: TagSet,
}

impl<K, V, B: BatchLoad<K, V>> BatchLoad<K, V> for TaggedBatch<B> {
    const READS_CONTEXT: bool = B::READS_CONTEXT;

    fn call(&self, keys: Vec<(K, LoadContext<V>)>) -> BatchFuture<V> {
        self.batch.call(keys)
    }

    fn tags(&self) -> Option<&TagSet> {
        Some(&self.tags)
    }
}

/// The user's batch loader.
pub(super) struct UserBatch<F, K>(pub(super) F, pub(super) PhantomData<fn(K)>);

impl<K, V, F, Fut, R, E> BatchLoad<K, V> for UserBatch<F, K>
where
    K: CacheKey + Send + 'static,
    V: Send + 'static,
    F: Fn(Vec<K>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
    R: IntoIterator<Item = (K, V)>,
    E: Into<BoxError> + 'static,
{
    fn call(&self, keys: Vec<(K, LoadContext<V>)>) -> BatchFuture<V> {
        let load = (self.0)(keys.into_iter().map(|(key, _)| key).collect());
        Box::pin(async move {
            let found = load.await.map_err(Into::into)?;
            Ok(Some(
                found
                    .into_iter()
                    .map(|(key, value)| (key.key_bytes().to_vec(), Loaded::value(value)))
                    .collect(),
            ))
        })
    }
}

/// The user's batch loader that reads each key's context and answers a
/// [`Loaded`] per key.
pub(super) struct ContextBatch<F, K>(pub(super) F, pub(super) PhantomData<fn(K)>);

impl<K, V, F, Fut, R, E> BatchLoad<K, V> for ContextBatch<F, K>
where
    K: CacheKey + Send + 'static,
    V: Send + 'static,
    F: Fn(Vec<(K, LoadContext<V>)>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, E>> + Send + 'static,
    R: IntoIterator<Item = (K, Loaded<V>)>,
    E: Into<BoxError> + 'static,
{
    const READS_CONTEXT: bool = true;

    fn call(&self, keys: Vec<(K, LoadContext<V>)>) -> BatchFuture<V> {
        let load = (self.0)(keys);
        Box::pin(async move {
            let found = load.await.map_err(Into::into)?;
            Ok(Some(
                found
                    .into_iter()
                    .map(|(key, loaded)| (key.key_bytes().to_vec(), loaded))
                    .collect(),
            ))
        })
    }
}

/// One call of the batch loader with its keys, as the origin runs a load
/// (retries call it again with the same keys).
pub(super) struct Chunk<K, V, B> {
    pub(super) keys: Vec<(K, LoadContext<V>)>,
    pub(super) batch: Arc<B>,
}

impl<K: Clone, V, B> Clone for Chunk<K, V, B> {
    fn clone(&self) -> Self {
        Chunk {
            keys: self.keys.clone(),
            batch: Arc::clone(&self.batch),
        }
    }
}

impl<K, V, B> Load<Found<V>> for Chunk<K, V, B>
where
    K: Clone + Send + Sync + 'static,
    V: Send + Sync + 'static,
    B: BatchLoad<K, V>,
{
    type Out = Option<Found<V>>;
    type Fut = BatchFuture<V>;
    type Err = BoxError;

    fn call(&self, _context: LoadContext<Found<V>>) -> Self::Fut {
        self.batch.call(self.keys.clone())
    }
}

/// A key whose lease this process took, to load: its place in the call,
/// its flight, its lease, and (inside a version transition) the previous
/// version's entry it is loaded beside.
pub(super) type Taken<'a, K, V> = (usize, Led<K, V>, LeaseRequest<'a>, Option<Pinned>);

/// A key's flight, awaited: the key, its flight, this call's part in
/// it, and the stale entry that may stand in if it fails.
pub(super) type Wait<V> = (usize, Joined<Landed<V>>, Role, Option<Arc<Entry>>);

/// A key of a batch waiting for another process's load.
pub(super) struct WaitingKeys<K, V> {
    pub(super) led: Led<K, V>,
    /// When its holder's lease runs out, as last seen (plus a margin): the
    /// moment to try to take it over.
    pub(super) retry_at: Instant,
    /// A readable entry no longer fresh, for the lock-wait policy.
    pub(super) stale: Option<Entry>,
}

/// A lease this process took (or tried): its key and the token.
pub(super) type OwnedLease = (Vec<u8>, [u8; 16]);

/// A load `wait_many` hands to `run_jobs`.
pub(super) enum Job<K, V> {
    /// Keys taken over (their leases with the tokens taken, asked for at
    /// `asked`): loaded as one batch.
    Lead {
        taken: Vec<(Led<K, V>, OwnedLease)>,
        asked: Instant,
    },
    /// Keys whose lease attempt failed (the store): loaded directly, or
    /// failed in the background; the tokens given back.
    Unleased {
        failed: Vec<(Led<K, V>, OwnedLease, Error)>,
        failure: Error,
    },
    /// Keys still held past `lock_wait`, for
    /// [`OnLockTimeout::load_anyway`](crate::OnLockTimeout): loaded, not written.
    Unwritten(Vec<Led<K, V>>),
}

/// One key of a `get_many`, deduplicated.
pub(super) struct Want<K, V> {
    pub(super) key: K,
    pub(super) user: Vec<u8>,
    pub(super) storage: Vec<u8>,
    /// An L1 copy past its fresh time, for a store that fails.
    pub(super) local_stale: Option<Arc<NearCopy<V>>>,
    pub(super) outcome: Option<Result<Fetched<V>, Error>>,
}

impl<K: Clone, V> Want<K, V> {
    /// This key, led by this call: `lander` lands its flight; `replacing`
    /// for a refresh of an entry still stored.
    pub(super) fn led(&self, lander: Lander<Landed<V>>, replacing: Option<u64>) -> Led<K, V> {
        Led {
            key: self.key.clone(),
            user: self.user.clone(),
            storage: self.storage.clone(),
            replacing,
            seen: None,
            lander,
        }
    }
}

/// A key this call loads (it leads the key's flight).
pub(super) struct Led<K, V> {
    pub(super) key: K,
    pub(super) user: Vec<u8>,
    pub(super) storage: Vec<u8>,
    /// The `fresh_until` of the entry a refresh replaces (still fresh, so
    /// not a sign that someone else filled the key).
    pub(super) replacing: Option<u64>,
    /// The entry read under this call's lease, which the load replaces
    /// (shown to a context loader, kept by "not modified").
    pub(super) seen: Option<Entry>,
    pub(super) lander: Lander<Landed<V>>,
}

/// `items` in runs of at most [`MAX_BATCH`], in order.
pub(super) fn in_batches<T>(items: Vec<T>) -> Vec<Vec<T>> {
    let mut items = items.into_iter().peekable();
    let mut batches = Vec::new();
    while items.peek().is_some() {
        batches.push(items.by_ref().take(MAX_BATCH).collect());
    }
    batches
}

/// A key of a `get_many` not done by the call's deadline.
pub(super) fn batch_timeout() -> Error {
    Error::new(
        ErrorKind::Timeout,
        "get_many's deadline passed before this key was loaded (lock_wait + queue_wait + load_timeout + 1 s); its load goes on",
    )
}
