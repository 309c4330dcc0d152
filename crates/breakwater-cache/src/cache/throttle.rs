//! The fail-safe throttle: keys whose load failed recently, served stale
//! without calling the loader until their throttle ends.
//!
//! A mass failure (the database down) throttles every key that is asked
//! for, so this map is hottest exactly when things go wrong. It is sharded
//! (one lock per shard, chosen by the key's hash), swept in amortised O(1)
//! per insert (a shard drops its ended entries once the inserts since its
//! last sweep exceed half its size, as the memory store does), and bounded:
//! a shard full of live entries takes no more, and such a key is simply
//! not throttled (its loader is called, under the origin's breaker and
//! bulkhead). Before, one global mutex guarded one map that was scanned
//! whole (`retain`) on every insert past 4,096 entries.
//!
//! Times are store-clock milliseconds, as the cache passes them in.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::fnv1a;

/// Shards; a power of two.
const SHARDS: usize = 16;

/// The most keys one shard holds: 65,536 in all.
const SHARD_CAPACITY: usize = 4096;

/// Keys throttled until a store-clock instant; see the module docs.
#[derive(Debug, Default)]
pub(super) struct Throttle {
    shards: [Mutex<ThrottleShard>; SHARDS],
}

#[derive(Debug, Default)]
struct ThrottleShard {
    /// Key → store-clock ms until which it is throttled.
    until: HashMap<Vec<u8>, u64>,
    inserts_since_sweep: usize,
}

impl Throttle {
    fn shard(&self, key: &[u8]) -> std::sync::MutexGuard<'_, ThrottleShard> {
        // Truncation is fine: any bits pick a shard.
        let index = fnv1a(key) as usize & (SHARDS - 1);
        self.shards[index].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `true` if `key` is throttled at `now_ms`.
    pub(super) fn is_throttled(&self, key: &[u8], now_ms: u64) -> bool {
        self.shard(key)
            .until
            .get(key)
            .is_some_and(|&until| now_ms < until)
    }

    /// Throttles `key` until `until_ms` (unless its shard is full of live
    /// entries).
    pub(super) fn insert(&self, key: &[u8], now_ms: u64, until_ms: u64) {
        let mut shard = self.shard(key);
        let shard = &mut *shard;
        shard.inserts_since_sweep += 1;
        if shard.inserts_since_sweep > shard.until.len() / 2 + 64 {
            shard.until.retain(|_, &mut until| until > now_ms);
            shard.inserts_since_sweep = 0;
        }
        if let Some(until) = shard.until.get_mut(key) {
            *until = until_ms;
        } else if shard.until.len() < SHARD_CAPACITY {
            shard.until.insert(key.to_vec(), until_ms);
        }
    }

    /// Lifts `key`'s throttle.
    pub(super) fn remove(&self, key: &[u8]) {
        self.shard(key).until.remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap().until.len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttled_until_its_end_then_lifted() {
        let throttle = Throttle::default();
        throttle.insert(b"k", 1_000, 2_000);
        assert!(throttle.is_throttled(b"k", 1_999));
        assert!(!throttle.is_throttled(b"k", 2_000));
        assert!(!throttle.is_throttled(b"other", 1_000));
        throttle.insert(b"k", 3_000, 4_000);
        assert!(throttle.is_throttled(b"k", 3_500));
        throttle.remove(b"k");
        assert!(!throttle.is_throttled(b"k", 3_500));
    }

    #[test]
    fn a_mass_failure_keeps_the_map_bounded_by_the_live_keys() {
        let throttle = Throttle::default();
        // A million failing keys, each throttled for 1 s, one per ms: about
        // 1,000 are live at any time.
        for i in 0..1_000_000u64 {
            throttle.insert(format!("k{i}").as_bytes(), i, i + 1_000);
        }
        assert!(
            throttle.len() < 4 * SHARDS * 64 + 3_000,
            "{}",
            throttle.len()
        );
        assert!(throttle.is_throttled(b"k999999", 999_999));
    }

    #[test]
    fn a_shard_full_of_live_keys_takes_no_more() {
        let throttle = Throttle::default();
        for i in 0..200_000u64 {
            throttle.insert(format!("k{i}").as_bytes(), 0, u64::MAX);
        }
        assert_eq!(throttle.len(), SHARDS * SHARD_CAPACITY);
    }
}
