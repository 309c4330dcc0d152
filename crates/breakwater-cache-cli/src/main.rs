//! `breakwater`: the command line of the breakwater cache layer.
//!
//! One module per subcommand; [`Command`] lists them and [`main`] dispatches.
//! What several subcommands share has a module of its own, and no module
//! uses anything of this file:
//!
//! - `args` (shared options), `failure` (exit codes, one-line errors),
//!   `output` (`out!`, `outln!`), `progress` (bars), `report` (how figures
//!   read), `connect` (stores on a `--redis`);
//! - `fleet`: the worker processes of `bench stampede` (`worker`) and
//!   `bench many`, and their line protocol;
//! - `traffic` (requests against the simulated database, `db`), `scenario`
//!   (what `demo` and `simulate` run, and the runner) and `outcome` (what
//!   it measured, as tables and charts: `chart`, `histogram`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod args;
mod bench;
mod chart;
mod connect;
mod db;
mod demo;
mod failure;
mod fleet;
mod histogram;
mod inspect;
mod many;
mod outcome;
mod output;
mod progress;
mod report;
mod scenario;
mod simulate;
mod soak;
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
    /// `bench grace` (callers during a grace refresh), `bench hit` (hit cost),
    /// `bench many` (`get_many` across processes), `bench write` (writes)
    /// and `bench mixed` (a production-shaped workload).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Run a fleet of worker processes on one Redis while a nemesis kills,
    /// stalls, empties, evicts and cuts it, and check every read against
    /// every acknowledged invalidation; exit code 1 on a violation.
    #[command(
        after_help = "Example:\n  breakwater soak --duration 5m\n  breakwater soak --redis redis://127.0.0.1:6390 --disposable --duration 30m --seed 7"
    )]
    Soak(soak::SoakOpts),
    /// Test support: one process of `breakwater soak`.
    #[command(hide = true)]
    SoakWorker(soak::worker::SoakWorkerOpts),
    /// Test support: one process of a multi-process stampede.
    #[command(hide = true)]
    StampedeWorker(worker::WorkerOpts),
    /// Test support: one process of `bench many`.
    #[command(hide = true)]
    ManyWorker(many::ManyWorkerOpts),
    /// Test support: one process of `bench mixed`.
    #[command(hide = true)]
    MixedWorker(bench::mixed::MixedWorkerOpts),
}

/// Parses the command line and runs the chosen subcommand.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match args::rewrite_deprecated(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("breakwater: {message}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::Demo(opts) => demo::main(opts).await,
        Command::Simulate(opts) => simulate::main(opts).await,
        Command::Warm(opts) => warm::main(opts).await,
        Command::Inspect(opts) => inspect::main(opts).await,
        Command::Spread(opts) => spread::main(opts).await,
        Command::Bench(command) => bench::main(command).await,
        Command::Soak(opts) => soak::main(opts).await,
        Command::SoakWorker(opts) => soak::worker::main(opts).await,
        Command::StampedeWorker(opts) => worker::main(opts).await,
        Command::ManyWorker(opts) => many::worker(opts).await,
        Command::MixedWorker(opts) => bench::mixed::worker(opts).await,
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

    /// Every subcommand, recursively, hidden ones too, with its path.
    fn all_commands(cmd: &clap::Command, path: String, out: &mut Vec<(String, clap::Command)>) {
        out.push((path.clone(), cmd.clone()));
        for sub in cmd.get_subcommands() {
            all_commands(sub, format!("{path} {}", sub.get_name()), out);
        }
    }

    fn commands() -> Vec<(String, clap::Command)> {
        let mut root = Cli::command();
        root.build();
        let mut out = Vec::new();
        all_commands(&root, "breakwater".to_owned(), &mut out);
        out
    }

    /// Every option with a long name: (command path, command, option).
    fn options() -> Vec<(String, clap::Command, clap::Arg)> {
        let mut out = Vec::new();
        for (path, cmd) in commands() {
            for arg in cmd.get_arguments() {
                if arg
                    .get_long()
                    .is_some_and(|l| l != "help" && l != "version")
                {
                    out.push((path.clone(), cmd.clone(), arg.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn no_option_is_spelled_with_a_unit_or_as_a_bare_ratio() {
        for (path, _, arg) in options() {
            let mut names: Vec<&str> = arg.get_long_and_visible_aliases().unwrap_or_default();
            names.extend(arg.get_all_aliases().unwrap_or_default());
            for name in names {
                assert!(
                    !name.ends_with("-ms") && !name.ends_with("-secs") && name != "ratio",
                    "{path} --{name}: a duration is `--name 10m`, a jitter `--jitter 0.2`"
                );
            }
        }
    }

    /// Values every shared option's parser is tried on.
    const PROBES: &[&str] = &[
        "0",
        "1",
        "5",
        "64",
        "65",
        "1000",
        "1001",
        "100000",
        "100001",
        "1000000",
        "1000001",
        "-1",
        "0.2",
        "1.5",
        "ratio:0.2",
        "down:0.2",
        "±30s",
        "up-to:1m",
        "none",
        "0s",
        "1ms",
        "500ms",
        "1s",
        "1m",
        "61s",
        "10m",
        "1h",
        "365d",
        "366d",
        "abc",
        "redis://x",
    ];

    /// The options that mean the same thing wherever they appear.
    const SHARED: &[&str] = &[
        "ttl",
        "jitter",
        "loader-latency",
        "concurrency",
        "processes",
        "runs",
        "rate",
        "seed",
        "redis",
        "namespace",
        "out",
    ];

    /// Of these, the help text is the same too (among options that take
    /// one value, and among those that take a comma-separated list).
    const SAME_HELP: &[&str] = &["ttl", "jitter", "loader-latency", "concurrency"];

    #[test]
    fn a_shared_option_parses_and_reads_the_same_everywhere() {
        let options = options();
        for name in SHARED {
            let all: Vec<_> = options
                .iter()
                .filter(|(_, _, arg)| arg.get_long() == Some(name))
                .collect();
            assert!(!all.is_empty(), "--{name} is used nowhere");
            let (first_path, first_cmd, first) = all[0];
            // Each probe on a command line of the option alone.
            let accepts = |cmd: &clap::Command, arg: &clap::Arg| -> Vec<bool> {
                let cmd = cmd.clone().mut_args(|a| a.required(false));
                let long = arg.get_long().unwrap_or_default();
                PROBES
                    .iter()
                    .map(|probe| {
                        cmd.clone()
                            .try_get_matches_from([
                                "breakwater".to_owned(),
                                format!("--{long}={probe}"),
                            ])
                            .is_ok()
                    })
                    .collect()
            };
            let first_accepts = accepts(first_cmd, first);
            for (path, cmd, arg) in &all {
                assert_eq!(
                    arg.get_value_names(),
                    first.get_value_names(),
                    "--{name}: {path} and {first_path} name its value differently"
                );
                assert_eq!(
                    accepts(cmd, arg),
                    first_accepts,
                    "--{name}: {path} and {first_path} accept different values ({PROBES:?})"
                );
                if SAME_HELP.contains(name) {
                    let list = arg.get_value_delimiter().is_some();
                    for (other_path, _, other) in &all {
                        if other.get_value_delimiter().is_some() == list {
                            assert_eq!(
                                arg.get_help().map(ToString::to_string),
                                other.get_help().map(ToString::to_string),
                                "--{name}: {path} and {other_path} explain it differently"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn list_defaults_show_as_typed() {
        for (path, cmd, arg) in options() {
            let Some(delimiter) = arg.get_value_delimiter() else {
                continue;
            };
            let name = arg.get_long().unwrap_or_default();
            let defaults = arg.get_default_values();
            assert!(
                defaults.len() <= 1,
                "{path} --{name}: give the default as one string, \"a{delimiter}b\", so \
                 --help shows it as it is typed"
            );
            if let Some(default) = defaults.first() {
                let default = default.to_string_lossy();
                let help = cmd.clone().render_help().to_string();
                assert!(
                    help.contains(&format!("[default: {default}]")),
                    "{path} --{name}: {help}"
                );
            }
        }
        // And nowhere a list default clap joined with spaces.
        for (path, cmd) in commands() {
            let help = cmd.clone().render_long_help().to_string();
            for default in help.split("[default: ").skip(1) {
                let value = default.split(']').next().unwrap_or_default();
                assert!(!value.contains(' '), "{path}: [default: {value}]");
            }
        }
    }
}
