//! TTL jitter against an avalanche: 10,000 keys written at once, with and
//! without jitter, and the second in which most of them expire.
//!
//! ```sh
//! cargo run -p breakwater-cache --example jitter
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use breakwater_cache::Jitter;
use rand::SeedableRng;
use rand::rngs::StdRng;

fn main() {
    let mut rng = StdRng::seed_from_u64(7);
    let base = Duration::from_secs(300);
    for jitter in [Jitter::none(), Jitter::ratio(0.2), Jitter::down(0.2)] {
        let mut per_second: BTreeMap<u64, u32> = BTreeMap::new();
        for _ in 0..10_000 {
            *per_second
                .entry(jitter.apply(base, &mut rng).as_secs())
                .or_default() += 1;
        }
        let (first, last) = (
            per_second.keys().next().copied().unwrap_or(0),
            per_second.keys().last().copied().unwrap_or(0),
        );
        let peak = per_second.values().max().copied().unwrap_or(0);
        println!(
            "{jitter:>6}: expiries from {first} s to {last} s, at most {peak} keys in one second"
        );
    }
}
