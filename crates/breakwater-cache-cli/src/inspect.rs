//! `breakwater inspect`: what a Redis holds for cache keys, as the cache sees
//! it: fresh or stale and for how long, negative, unreadable, the record's
//! TTL, and whether a load holds the key's lease.

use std::process::ExitCode;
use std::time::Duration;

use breakwater_cache::{Cache, Codec, Inspection, Stored};
use clap::{Args, ValueEnum};

use crate::failure::{Failure, bad_url, unreachable};

/// The codec the inspected cache writes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CodecArg {
    /// MessagePack (the library's default).
    Msgpack,
    /// JSON.
    Json,
}

/// Options of `breakwater inspect`.
#[derive(Debug, Clone, Args)]
pub(crate) struct InspectOpts {
    /// Redis URL, e.g. `redis://127.0.0.1:6379`; several, comma-separated,
    /// for the nodes of a Redis Cluster.
    #[arg(long, value_name = "URL")]
    pub(crate) redis: String,
    /// The cache's namespace.
    #[arg(long)]
    pub(crate) namespace: String,
    /// The cache's codec.
    #[arg(long, value_enum, default_value_t = CodecArg::Msgpack)]
    pub(crate) codec: CodecArg,
    /// Check the Redis instead (or as well): its eviction policy and what
    /// breakwater does under it, the permissions of the URL's user on the
    /// namespace's keys and channel, pub/sub, a Cluster. Exits 1 if a
    /// finding needs a look.
    #[arg(long)]
    pub(crate) check: bool,
    /// The user keys to inspect (at least one, unless `--check`).
    pub(crate) keys: Vec<String>,
}

/// Runs `breakwater inspect`.
pub(crate) async fn main(opts: InspectOpts) -> ExitCode {
    if opts.keys.is_empty() && !opts.check {
        eprintln!("error: breakwater inspect needs at least one key to inspect, or --check");
        return ExitCode::from(2);
    }
    match run(&opts).await {
        Ok((text, all_ok)) => {
            crate::out!("{text}");
            if all_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(failure) => failure.exit("inspect"),
    }
}

/// Inspects every key (and, with `--check`, the Redis) and renders the
/// report; also whether every check finding is as expected.
async fn run(opts: &InspectOpts) -> Result<(String, bool), Failure> {
    let store = crate::connect::store(&opts.redis).map_err(|err| bad_url(&opts.redis, err))?;
    if let Err(err) = store.warm_up().await {
        return Err(unreachable(&opts.redis, err).await);
    }
    let codec = match opts.codec {
        CodecArg::Msgpack => Codec::msgpack(),
        CodecArg::Json => Codec::json(),
    };
    // The value type is never decoded: inspection reads the envelope only.
    let cache = Cache::<()>::builder()
        .namespace(opts.namespace.clone())
        .store(store)
        .codec(codec)
        // `--check` runs the check itself; without it, inspect only reads.
        .startup_check(false)
        .build()?;
    let mut out = String::new();
    let mut all_ok = true;
    if opts.check {
        use std::fmt::Write as _;
        for finding in cache.check().await {
            all_ok &= finding.ok;
            let _ = writeln!(out, "{finding}");
        }
    }
    for key in &opts.keys {
        let inspection = cache.inspect(key).await?;
        out.push_str(&render(key, &inspection));
    }
    Ok((out, all_ok))
}

/// One key's report.
pub(crate) fn render(key: &str, inspection: &Inspection) -> String {
    use std::fmt::Write as _;

    let mut out = String::new();
    let _ = writeln!(out, "{key}");
    let _ = writeln!(
        out,
        "  stored as  {}",
        String::from_utf8_lossy(&inspection.storage_key)
    );
    match &inspection.stored {
        Stored::Missing => {
            let _ = writeln!(out, "  entry      none");
        }
        Stored::Unreadable { bytes, reason } => {
            let _ = writeln!(
                out,
                "  entry      unreadable ({bytes} bytes): {reason}; reads treat it as a miss"
            );
        }
        Stored::Entry(entry) => {
            let state = match (entry.fresh_for, entry.stale_for) {
                (Some(fresh), Some(stale)) if stale > fresh => format!(
                    "fresh for {}, then stale for {}",
                    human(fresh),
                    human(stale - fresh)
                ),
                (Some(fresh), _) => format!("fresh for {}, no stale window", human(fresh)),
                (None, Some(stale)) => format!("stale, {} left", human(stale)),
                (None, None) => "expired".to_owned(),
            };
            let servable = if entry.cleared {
                "cleared: a read loads"
            } else if entry.servable {
                "served now"
            } else {
                "not served: a read loads"
            };
            let kind = if entry.negative {
                "negative (the value does not exist)"
            } else {
                "value"
            };
            let _ = writeln!(out, "  entry      {kind}, {state} ({servable})");
            let _ = writeln!(
                out,
                "  size       {} bytes stored, {} bytes of {} value",
                entry.stored_bytes,
                entry.value_bytes,
                entry.codec.name()
            );
            let _ = writeln!(out, "  loaded in  {}", human(entry.load_time));
            if let Some(generation) = entry.generation {
                let _ = writeln!(out, "  written    under namespace generation {generation}");
            }
        }
        other => {
            let _ = writeln!(out, "  entry      {other:?}");
        }
    }
    if let Some(ttl) = inspection.store_ttl {
        let _ = writeln!(out, "  store TTL  {}", human(ttl));
    }
    let lease = if inspection.lease_held {
        "held: a load is running"
    } else {
        "free"
    };
    let _ = writeln!(out, "  lease      {lease}");
    let namespace = match inspection.namespace_generation {
        Some(generation) if inspection.namespace_cleared => {
            format!("generation {generation} (cleared)")
        }
        Some(generation) => format!("generation {generation} (never cleared)"),
        None => "no clear record (never written or cleared)".to_owned(),
    };
    let _ = writeln!(out, "  namespace  {namespace}");
    out
}

/// `1h 02m 03s`, `4m 05s`, `6.5 s` or `12 ms`.
fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 3600 {
        format!(
            "{}h {:02}m {:02}s",
            secs / 3600,
            secs % 3600 / 60,
            secs % 60
        )
    } else if secs >= 60 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else if secs >= 1 {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(human(Duration::from_millis(12)), "12 ms");
        assert_eq!(human(Duration::from_millis(6_500)), "6.5 s");
        assert_eq!(human(Duration::from_secs(245)), "4m 05s");
        assert_eq!(human(Duration::from_secs(3_723)), "1h 02m 03s");
    }
}
