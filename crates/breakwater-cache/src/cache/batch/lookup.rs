//! One store read for many keys, so that what the store returns for a
//! batch is checked as a single key's read is: one `MGET` (per hash slot on
//! a Cluster), the previous version's entries beside them inside a version
//! transition, tagged entries' generations.

use std::sync::Arc;

use tracing::Instrument;

use super::loader::Want;
use crate::cache::fill::Mode;
use crate::cache::handle::Cache;
use crate::cache::options::Options;
use crate::cache::transition::{self};
use crate::cache::value::Value;
use crate::cache::verdict::Refresh;
use crate::entry::Entry;
use crate::error::Error;
use crate::served::{Fetched, Served, StaleReason};
use crate::store::Store;

impl<V: Value> Cache<V> {
    /// Reads `keys` with one `get_many` and decodes each entry as
    /// `Cache::read` does: unreadable bytes and a key fault are a miss, a
    /// tagged entry counts only while its tags' generations are the ones
    /// it recorded (all checked in one more read; one that cannot be
    /// checked is a miss, never served). `Err` where the store failed.
    ///
    /// `own`: `keys` are this version's (inside a version transition the
    /// previous version's entries are then read beside them, see
    /// `transition`); `false` for the previous version's keys themselves.
    pub(super) async fn read_many(
        &self,
        keys: &[&[u8]],
        own: bool,
    ) -> Vec<Result<Option<Entry>, Error>> {
        if keys.is_empty() {
            return Vec::new();
        }
        // Inside a version transition, the previous version's entries are
        // read beside them, in the same batch (see `transition`).
        let beside = own.then(|| transition::beside_keys(self, keys)).flatten();
        let mut all: Vec<&[u8]> = keys.to_vec();
        if let Some(beside) = &beside {
            all.extend(beside.iter().map(Vec::as_slice));
        }
        let mut read = self
            .inner
            .store
            .get_many_split(&all)
            .instrument(tracing::debug_span!("breakwater.store.get_many"))
            .await;
        let previous: Option<Vec<Result<Option<Vec<u8>>, Error>>> =
            beside.is_some().then(|| read.split_off(keys.len()));
        let mut entries: Vec<Result<Option<Entry>, Error>> = keys
            .iter()
            .zip(read)
            .enumerate()
            .map(|(i, (key, read))| match read {
                Ok(Some(bytes)) => {
                    let beside = match &previous {
                        None => None,
                        Some(previous) => match &previous[i] {
                            Ok(held) => Some(held.as_deref()),
                            // Not known: not served.
                            Err(_) => return Ok(None),
                        },
                    };
                    Ok(self.decode_beside(key, bytes, beside))
                }
                Ok(None) => Ok(None),
                Err(err) if err.is_key_fault() => Ok(None),
                Err(err) => Err(err),
            })
            .collect();
        Box::pin(self.keep_current(keys, &mut entries)).await;
        entries
    }

    /// The keys of `load` with nothing in this version (no stale entry,
    /// store usable) that the previous version has: served from it as
    /// `Stale { PreviousVersion }` and queued for a background refresh
    /// (unless throttled), as `get_or_load` does inside a transition.
    pub(super) async fn previous_many<K>(
        &self,
        wants: &mut [Want<K, V>],
        load: &mut Vec<(usize, Mode, Option<Arc<Entry>>)>,
        refreshes: &mut Vec<(usize, Refresh)>,
        options: &Options,
    ) {
        let candidates: Vec<(usize, Vec<u8>)> = load
            .iter()
            .filter(|(_, mode, stale)| *mode == Mode::Fleet && stale.is_none())
            .filter_map(|&(i, _, _)| Some((i, self.inner.previous_key(&wants[i].storage)?)))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let keys: Vec<&[u8]> = candidates.iter().map(|(_, old)| &old[..]).collect();
        // The previous version's own keys: read as they are.
        let read = self.read_many(&keys, false).await;
        let now = self.inner.store.now_ms();
        let mut served = vec![false; wants.len()];
        for ((i, old), read) in candidates.iter().zip(read) {
            let Ok(Some(entry)) = read else { continue };
            if !self.previous_stands_in(&entry, now, options) {
                continue;
            }
            let Some(value) = self.previous_value(old, &entry) else {
                continue;
            };
            wants[*i].outcome = Some(Ok(Fetched {
                value,
                served: Served::Stale {
                    reason: StaleReason::PreviousVersion,
                },
            }));
            if !self.inner.is_throttled(&wants[*i].storage, now) {
                let refresh = Refresh {
                    replacing: 0,
                    early: false,
                };
                refreshes.push((*i, refresh));
            }
            served[*i] = true;
        }
        load.retain(|(i, _, _)| !served[*i]);
    }
}
