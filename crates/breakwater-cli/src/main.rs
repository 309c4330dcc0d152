//! `breakwater`: the command line of the breakwater cache layer.
//!
//! One module per subcommand; [`Command`] lists them and [`main`] dispatches.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod db;
mod demo;
mod failure;
mod histogram;
mod inspect;
mod progress;
mod simulate;
mod spread;
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
    /// Show how TTL jitter spreads expiries (embedded memory store, no server).
    #[command(after_help = "Example:\n  breakwater demo")]
    Demo(demo::DemoOpts),
    /// Simulate minutes of traffic on a virtual clock: a naive cache next to
    /// breakwater, database queries per second and latency.
    #[command(after_help = "Example:\n  breakwater simulate")]
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
    /// Measure: `bench stampede` (one hot key, breakwater vs the naive algorithm)
    /// and `bench grace` (callers during a grace refresh).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Test support: one process of a multi-process stampede.
    #[command(hide = true)]
    StampedeWorker(worker::WorkerOpts),
}

/// A store on `urls`: one Redis URL, or several (comma-separated) nodes of
/// a Redis Cluster.
fn redis_store(urls: &str) -> Result<breakwater::RedisStore, breakwater::Error> {
    if urls.contains(',') {
        breakwater::RedisStore::connect_cluster(urls.split(',').map(str::trim))
    } else {
        breakwater::RedisStore::connect(urls)
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

    #[test]
    fn demo_defaults() {
        let cli = Cli::try_parse_from(["breakwater", "demo"]).unwrap();
        let Command::Demo(opts) = cli.command else {
            panic!("expected the demo subcommand");
        };
        assert_eq!(opts.keys, 10_000);
        assert_eq!(opts.ttl_secs, 10);
        assert_eq!(opts.ratio, 0.2);
        assert_eq!(opts.seed, None);
    }

    /// clap takes `-0.5` as a value, not a flag, so the library's own check
    /// (with its exact message) is what rejects it.
    #[tokio::test]
    async fn negative_ratio_reaches_the_library_check() {
        let cli = Cli::try_parse_from(["breakwater", "demo", "--ratio", "-0.5"]).unwrap();
        let Command::Demo(opts) = cli.command else {
            panic!("expected the demo subcommand");
        };
        assert_eq!(opts.ratio, -0.5);
        let err = demo::run(&opts).await.unwrap_err();
        assert!(matches!(err, demo::DemoError::Config(_)), "{err:?}");
        assert_eq!(err.to_string(), "jitter ratio must be in 0..=1, got -0.5");
    }
}
