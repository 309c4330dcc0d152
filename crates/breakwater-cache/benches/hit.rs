//! A Redis hit through `get_or_load` next to a raw `GET` on one multiplexed
//! connection, in the same run, on a private `redis-server` (L1 off, so
//! every hit reads Redis: one `GET`, or its share of an `MGET` when reads
//! meet). Six interleaved trials per scenario (which side runs first
//! alternates, three times each: the second of two back-to-back runs can
//! measure faster); the ratio is of the medians. `breakwater bench hit --redis URL` runs the
//! same comparison against a Redis of your own.
//!
//! ```sh
//! cargo bench -p breakwater-cache --bench hit
//! ```
//!
//! Scenarios: one caller; 50 callers on 50 distinct keys; 50 callers on
//! one hot key (where concurrent reads of a key share one `GET`).

use std::time::Duration;

use breakwater_cache_testkit::RedisServer;

#[path = "../../breakwater-cache-cli/src/bench/hit.rs"]
#[allow(unreachable_pub)]
mod hit;

fn main() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let rows = rt
        .block_on(hit::compare(&server.url(), 6, Duration::from_secs(1)))
        .expect("bench");
    for row in rows {
        println!("{row}");
    }
}
