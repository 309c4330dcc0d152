//! What a cache holds ([`Value`]) and what loads it (`Load`, a plain
//! loader or a context loader): the two
//! bounds every step is written against, so no step depends on another
//! for them.

use std::error::Error as StdError;
use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use std::sync::Arc;

use super::loaded::{LoadContext, Loaded};
use super::tags::TagSet;

/// A loader as every internal step takes it (the public methods spell the
/// bounds out): a plain `FnOnce() -> impl Future<Output = Result<Option<V>,
/// E>>`, or a context loader ([`WithContext`]) that takes a
/// [`LoadContext`] and answers a [`Loaded`]; cloned for each call.
pub(crate) trait Load<V>: Clone + Send + Sync + 'static {
    /// What the loader answers: `Option<V>`, or a [`Loaded`].
    type Out: Into<Loaded<V>> + Send + 'static;
    /// The loader's future.
    type Fut: Future<Output = Result<Self::Out, Self::Err>> + Send + 'static;
    /// The loader's error.
    type Err: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static;
    /// Whether the loader reads its context: the value it replaces is
    /// decoded for it only then.
    const READS_CONTEXT: bool = false;
    /// Calls the loader.
    fn call(&self, context: LoadContext<V>) -> Self::Fut;
    /// The tags the call named, recorded in the entry its load writes.
    fn tags(&self) -> Option<&TagSet> {
        None
    }
}

impl<V, F, Fut, E> Load<V> for F
where
    V: Send + 'static,
    F: FnOnce() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<V>, E>> + Send + 'static,
    E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
{
    type Out = Option<V>;
    type Fut = Fut;
    type Err = E;

    fn call(&self, _context: LoadContext<V>) -> Fut {
        (self.clone())()
    }
}

/// A context loader: `FnOnce(LoadContext<V>) -> impl Future<Output =
/// Result<Loaded<V>, E>>` (a newtype, as a closure type could implement
/// both `FnOnce()` and `FnOnce(LoadContext<V>)`).
#[derive(Clone)]
pub(super) struct WithContext<F>(pub(super) F);

impl<V, F, Fut, E> Load<V> for WithContext<F>
where
    V: Send + 'static,
    F: FnOnce(LoadContext<V>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Loaded<V>, E>> + Send + 'static,
    E: Into<Box<dyn StdError + Send + Sync + 'static>> + 'static,
{
    type Out = Loaded<V>;
    type Fut = Fut;
    type Err = E;
    const READS_CONTEXT: bool = true;

    fn call(&self, context: LoadContext<V>) -> Fut {
        (self.0.clone())(context)
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
    type Out = L::Out;
    type Fut = L::Fut;
    type Err = L::Err;
    const READS_CONTEXT: bool = L::READS_CONTEXT;

    fn call(&self, context: LoadContext<V>) -> Self::Fut {
        self.loader.call(context)
    }

    fn tags(&self) -> Option<&TagSet> {
        Some(&self.tags)
    }
}
