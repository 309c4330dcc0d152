//! Writes through `set_many` and concurrent `set`s next to raw pipelined
//! `SET k v PX ttl` of the same 100-byte values, in the same run: on a
//! private `redis-server`, then on a private 3-node cluster. Four
//! interleaved trials of 100,000 writes per scenario and side (which side
//! runs first alternates); the ratio is of the medians.
//!
//! ```sh
//! cargo bench -p breakwater-cache-cli --bench write
//! ```
//!
//! It runs the built binary's `breakwater bench write` (the comparison is
//! the CLI's `src/bench/write.rs`), which does the same against a Redis of
//! your own with `--redis URL[,URL…]`.

use std::process::{Command, ExitCode};

use breakwater_cache_testkit::{RedisCluster, RedisServer};

fn run(urls: &str) -> bool {
    let status = Command::new(env!("CARGO_BIN_EXE_breakwater"))
        .args(["bench", "write", "--redis", urls])
        .status();
    match status {
        Ok(status) if status.success() => true,
        Ok(status) => {
            eprintln!("bench write: breakwater bench write ended with {status}");
            false
        }
        Err(err) => {
            eprintln!("bench write: cannot run breakwater: {err}");
            false
        }
    }
}

fn main() -> ExitCode {
    let server = RedisServer::start();
    let single = run(&server.url());
    drop(server);
    let cluster = RedisCluster::start();
    let clustered = run(&cluster.urls().join(","));
    if single && clustered {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
