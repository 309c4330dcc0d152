//! `breakwater`: the command line of the breakwater cache layer.
//!
//! One module per subcommand; [`Command`] lists them and [`main`] dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod chart;
mod db;
mod demo;
mod failure;
mod histogram;
mod inspect;
mod many;
mod output;
mod progress;
mod simulate;
mod spread;
mod traffic;
mod warm;
mod worker;

/// breakwater — a Redis caching layer that fights cache avalanche and stampede.
#[derive(Debug, Parser)]
#[command(name = "breakwater", version)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
///
/// Exit codes, for every subcommand: 0 on success, 2 for a usage or
/// configuration error (a bad option value, a URL that does not parse), 1
/// for a failure at run time (Redis unreachable, a command failed).
#[derive(Debug, Subcommand)]
enum Command {
    /// Three stories, a naive cache next to breakwater: avalanche, stampede,
    /// outage (embedded store, virtual clock, no server); tables and charts.
    #[command(
        after_help = "Example:\n  breakwater demo\n  breakwater demo --seed 7 --out /tmp/charts"
    )]
    Demo(demo::DemoOpts),
    /// Simulate minutes of traffic on a virtual clock: a naive cache next to
    /// breakwater, database queries per second and latency, with a chart.
    #[command(
        after_help = "Example:\n  breakwater simulate\n  breakwater simulate --keys 100000 --ttl 5m --jitter ratio:0.1 --duration 7m --rps 2000"
    )]
    Simulate(simulate::SimulateOpts),
    /// Warm a cold cache at a bounded rate and width, and show how the
    /// warmed keys' expiries spread (memory store, or `--redis URL`).
    #[command(
        after_help = "Example:\n  breakwater warm --keys 2000 --rate 1000 --concurrency 16\n  breakwater warm --redis redis://127.0.0.1:6379 --namespace shop --keys 10000"
    )]
    Warm(warm::WarmOpts),
    /// Show what Redis holds for cache keys: fresh or stale and for how
    /// long, negative, unreadable, the record's TTL, the lease.
    #[command(
        after_help = "Example:\n  breakwater inspect --redis redis://127.0.0.1:6379 --namespace shop product:1 product:2"
    )]
    Inspect(inspect::InspectOpts),
    /// Fix an avalanche already in a live Redis: shorten the TTLs of the
    /// keys matching a pattern by up to a ratio, so they expire spread out
    /// instead of together (single node; not Redis Cluster).
    #[command(after_help = spread::AFTER_HELP)]
    Spread(spread::SpreadOpts),
    /// Measure: `bench stampede` (one hot key, breakwater vs the naive algorithm),
    /// `bench grace` (callers during a grace refresh), `bench hit` (hit cost)
    /// and `bench many` (`get_many` across processes).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Test support: one process of a multi-process stampede.
    #[command(hide = true)]
    StampedeWorker(worker::WorkerOpts),
    /// Test support: one process of `bench many`.
    #[command(hide = true)]
    ManyWorker(many::ManyWorkerOpts),
}

/// A store on `urls`: one Redis URL, or several (comma-separated) nodes of
/// a Redis Cluster.
fn redis_store(urls: &str) -> Result<breakwater_cache::RedisStore, breakwater_cache::Error> {
    if urls.contains(',') {
        breakwater_cache::RedisStore::connect_cluster(urls.split(',').map(str::trim))
    } else {
        breakwater_cache::RedisStore::connect(urls)
    }
}

/// Parses the command line and runs the chosen subcommand.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(opts) => demo::main(opts).await,
        Command::Simulate(opts) => simulate::main(opts).await,
        Command::Warm(opts) => warm::main(opts).await,
        Command::Inspect(opts) => inspect::main(opts).await,
        Command::Spread(opts) => spread::main(opts).await,
        Command::Bench(command) => bench::main(command).await,
        Command::StampedeWorker(opts) => worker::main(opts).await,
        Command::ManyWorker(opts) => many::worker(opts).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }
}
