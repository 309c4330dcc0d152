//! What a cache holds ([`Value`]) and what loads it (`Load`): the two
//! bounds every step is written against, so no step depends on another
//! for them.

use std::error::Error as StdError;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use std::sync::Arc;

use super::tags::TagSet;

/// A loader as every internal step takes it (the public methods spell the
/// bounds out): `FnOnce() -> impl Future<Output = Result<Option<V>, E>>`,
/// cloned for each call.
pub(crate) trait Load<V>: Clone + Send + Sync + 'static {
    /// The loader's future.
    type Fut: Future<Output = Result<Option<V>, Self::Err>> + Send + 'static;
    /// The loader's error.
    type Err: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static;
    /// Calls the loader.
    fn call(&self) -> Self::Fut;
    /// The tags the call named, recorded in the entry its load writes.
    fn tags(&self) -> Option<&TagSet> {
        None
    }
}

impl<V, F, Fut, E> Load<V> for F
where
    F: FnOnce() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
    E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
{
    type Fut = Fut;
    type Err = E;

    fn call(&self) -> Fut {
        (self.clone())()
    }
}

/// What a cached value must be: serializable, cloneable (one load is shared
/// by every caller waiting on it) and sendable across tasks.
pub trait Value: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}

impl<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static> Value for T {}

/// A loader whose call named tags: the fill records their generations in
/// the entry it writes.
#[derive(Clone)]
pub(super) struct Tagged<L> {
    pub(super) loader: L,
    pub(super) tags: Arc<TagSet>,
}

impl<V, L: Load<V>> Load<V> for Tagged<L> {
    type Fut = L::Fut;
    type Err = L::Err;

    fn call(&self) -> Self::Fut {
        self.loader.call()
    }

    fn tags(&self) -> Option<&TagSet> {
        Some(&self.tags)
    }
}
