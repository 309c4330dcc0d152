//! Tags a loader chose ([`Loaded::tags`](crate::Loaded::tags)), stamped
//! after its load: their counters read then
//! ([`Store::tag_states`](crate::Store::tag_states)), and what a write
//! records of each, judged by when the counter last changed hard against
//! when the load began (see `tags`, "Tags chosen by the loader"). Apart
//! from `tags`, which `loaded` checks its tags with.

use std::time::Duration;

use super::handle::Cache;
use super::loaded::Loaded;
use super::options::Options;
use super::tags::{AfterLoad, EXPIRE_SKEW, States, check_tag, counter_ttl, tag_key};
use super::value::Value;
use crate::clock::millis;
use crate::entry::{MAX_TAGS, TagStamp};
use crate::error::{Error, ErrorKind};
use crate::log_limit::{Warning, show_key, warn_limited};
use crate::store::{Store, parse_tag_state};

impl<V: Value> Cache<V> {
    /// The states of the counters of `tags` after a load (see
    /// [`Store::tag_states`](crate::Store::tag_states)): created if
    /// missing, their last hard change's time made known, their TTL at
    /// least `ttl`. By tag.
    pub(super) async fn chosen_states(
        &self,
        tags: &[Vec<u8>],
        ttl: Duration,
    ) -> Result<States, Error> {
        let tag_prefix = &self.inner.tag_prefix;
        let keys: Vec<Vec<u8>> = tags.iter().map(|tag| tag_key(tag_prefix, tag)).collect();
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let fresh = self.inner.fresh_generation();
        let now_ms = self.inner.store.now_ms().max(1);
        let stored = self
            .inner
            .store
            .tag_states(&keys, fresh, ttl, now_ms)
            .await?;
        if stored.len() != tags.len() {
            return Err(Error::new(
                ErrorKind::Store,
                "the store answered a read of tag states with the wrong number of replies",
            ));
        }
        Ok(tags
            .iter()
            .cloned()
            .zip(stored.iter().map(|s| parse_tag_state(s)))
            .collect())
    }

    /// What the writes of one batch load (begun at store-clock
    /// `started_ms`, its answers `found`) need to know of the tags their
    /// loader chose beyond the call's (`stamps`): every such tag's counter,
    /// read once for the whole batch (with the longest counter TTL any of
    /// its writes asks for).
    pub(super) async fn after_batch<'l>(
        &self,
        started_ms: u64,
        found: impl Iterator<Item = &'l Loaded<V>>,
        stamps: &[TagStamp],
        options: &Options,
    ) -> AfterLoad {
        let mut tags = Vec::new();
        let mut ttl = counter_ttl(options);
        for loaded in found {
            let chosen = loaded.chosen_tags();
            if chosen.is_empty() {
                continue;
            }
            if let Ok(chosen) = loaded.choices.apply(options) {
                ttl = ttl.max(counter_ttl(&chosen));
            }
            tags.extend(
                chosen
                    .iter()
                    .filter(|tag| {
                        check_tag(tag).is_ok() && !stamps.iter().any(|stamp| stamp.tag == **tag)
                    })
                    .cloned(),
            );
        }
        let mut after = AfterLoad::starting(started_ms);
        after.ended_ms = Some(self.inner.store.now_ms());
        if tags.is_empty() {
            return after;
        }
        tags.sort_unstable();
        tags.dedup();
        let states = self.chosen_states(&tags, ttl).await;
        if let Err(err) = &states {
            warn_limited!(self.inner.logs, Warning::StoreRead, keys = tags.len(), op = "tag_states", error = %err, "the tags a batch loader chose could not be read; returning its values without writing them");
            self.inner.metrics.store_failed("tag_states", err);
        }
        after.states = Some(states);
        after
    }

    /// The stamps a write records when its loader chose the tags `chosen`
    /// beside the call's own (`stamps`, read before the load): all of
    /// them, sorted by tag. `Ok(None)` if the value must not be written:
    /// a chosen tag's counter changed hard since the load began (or could
    /// not be read); a soft change since records the generation before it
    /// (the entry lands stale). `Err`: too many tags in all (a
    /// [`Config`](ErrorKind::Config) error for the load).
    pub(super) async fn stamp_chosen(
        &self,
        key: &[u8],
        stamps: &[TagStamp],
        chosen: &[Vec<u8>],
        after: &AfterLoad,
        options: &Options,
    ) -> Result<Option<Vec<TagStamp>>, Error> {
        let new: Vec<Vec<u8>> = chosen
            .iter()
            .filter(|tag| !stamps.iter().any(|stamp| stamp.tag == **tag))
            .cloned()
            .collect();
        let named = stamps.iter().filter(|stamp| !stamp.tag.is_empty()).count();
        if named + new.len() > MAX_TAGS {
            return Err(Error::from(crate::error::ConfigError::new(format!(
                "the loader chose an invalid setting: {} tags on one entry with the call's, the limit is {MAX_TAGS}",
                named + new.len()
            ))));
        }
        let mut all = stamps.to_vec();
        if new.is_empty() {
            return Ok(Some(all));
        }
        // Read once for a batch (a failed read fails every key of it, with
        // no read again); else, or for a tag the batch did not read (a
        // "not modified" keeping its entry's tags), read now.
        let read;
        let states = match &after.states {
            Some(Err(_)) => return Ok(None),
            Some(states @ Ok(read)) if new.iter().all(|tag| read.contains_key(tag)) => states,
            _ => {
                read = self.chosen_states(&new, counter_ttl(options)).await;
                &read
            }
        };
        let states = match states {
            Ok(states) => states,
            Err(err) => {
                warn_limited!(self.inner.logs, Warning::StoreRead, key = %show_key(key), op = "tag_states", error = %err, "the tags the loader chose could not be read; returning the value without writing it");
                self.inner.metrics.store_failed("tag_states", err);
                return Ok(None);
            }
        };
        let skew = millis(EXPIRE_SKEW);
        for tag in new {
            let stamped = states
                .get(&tag)
                .copied()
                .flatten()
                .and_then(|state| state.stamp_after(after.started_ms, skew));
            let Some(generation) = stamped else {
                tracing::debug!(key = %show_key(key), tag = %show_key(&tag), "a tag the loader chose changed since the load began (or is new); returning the value without writing it");
                return Ok(None);
            };
            all.push(TagStamp { tag, generation });
        }
        // A transition's stamp (no tag) stays first; the tags sorted.
        all.sort_by(|a, b| a.tag.cmp(&b.tag));
        Ok(Some(all))
    }
}
