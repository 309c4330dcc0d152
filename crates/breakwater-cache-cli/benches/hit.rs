//! A Redis hit through `get_or_load` next to a raw `GET` on one multiplexed
//! connection, in the same run, on a private `redis-server` (L1 off, so
//! every hit reads Redis: one `GET`, or its share of an `MGET` when reads
//! meet). Six interleaved trials of 1 s per scenario on 2 worker threads
//! (which side runs first alternates, three times each: the second of two
//! back-to-back runs can measure faster); the ratio is of the medians.
//!
//! ```sh
//! cargo bench -p breakwater-cache-cli --bench hit
//! ```
//!
//! It runs the built binary's `breakwater bench hit` (the comparison is
//! the CLI's `src/bench/hit.rs`), which does the same against a Redis of
//! your own with `--redis URL`. Scenarios: one caller; 50 callers on 50
//! distinct keys; 50 callers on one hot key (where concurrent reads of a
//! key share one `GET`).

use std::process::{Command, ExitCode};

use breakwater_cache_testkit::RedisServer;

fn main() -> ExitCode {
    let server = RedisServer::start();
    let url = server.url();
    let status = Command::new(env!("CARGO_BIN_EXE_breakwater"))
        .args(["bench", "hit", "--redis", url.as_str()])
        .args(["--workers", "2", "--trials", "6", "--trial", "1s"])
        .status();
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("bench hit: breakwater bench hit ended with {status}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("bench hit: cannot run breakwater: {err}");
            ExitCode::FAILURE
        }
    }
}
