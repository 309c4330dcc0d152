//! The options several subcommands share, parsed one way everywhere: a
//! duration is a human string (`10m`, `50ms`), a jitter is one spelling
//! (`0.2`, `ratio:0.2`, `down:0.2`, `±30s`, ...), parallelism is
//! `--concurrency N`.
//!
//! Each shared option's `value_parser` lives here, so its bounds are the
//! same in every subcommand; the test in `main.rs` checks that every
//! option of one name parses the same values the same way and reads the
//! same in `--help`.
//!
//! [`rewrite_deprecated`] keeps the spellings of the previous release
//! (`--ttl-secs 3600`, `--loader-ms 5`, `--ratio 0.2`, ...) working for
//! one release, with a warning on stderr.

use std::ffi::OsString;
use std::fmt;
use std::time::Duration;

use breakwater_cache::Jitter;
use clap::builder::RangedU64ValueParser;

/// One year: the longest TTL.
const YEAR: Duration = Duration::from_secs(365 * 86_400);

/// A humantime duration within `min..=max`; `bounds` says them in the
/// error.
fn duration_within(
    s: &str,
    min: Duration,
    max: Duration,
    bounds: &str,
) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|err| format!("{err} (expected a duration such as 500ms, 30s, 10m or 1h)"))?;
    if (min..=max).contains(&d) {
        Ok(d)
    } else {
        Err(format!("must be {bounds}"))
    }
}

/// `--ttl`: a TTL of 1 s to 365 days.
pub(crate) fn ttl(s: &str) -> Result<Duration, String> {
    duration_within(s, Duration::from_secs(1), YEAR, "between 1s and 365d")
}

/// `--loader-latency`: how long one loader call takes, 0 to 1 minute.
pub(crate) fn loader_latency(s: &str) -> Result<Duration, String> {
    duration_within(s, Duration::ZERO, Duration::from_secs(60), "at most 1m")
}

/// `--trial`: the length of one bench trial, 1 ms to 10 minutes.
pub(crate) fn trial(s: &str) -> Result<Duration, String> {
    duration_within(
        s,
        Duration::from_millis(1),
        Duration::from_secs(600),
        "between 1ms and 10m",
    )
}

/// `--lease-ttl` and `--lock-wait` of the stampede worker: 1 ms to 1 hour.
pub(crate) fn short_wait(s: &str) -> Result<Duration, String> {
    duration_within(
        s,
        Duration::from_millis(1),
        Duration::from_secs(3_600),
        "between 1ms and 1h",
    )
}

/// `--concurrency`: calls in flight at once, 1 to 100,000.
pub(crate) fn concurrency() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(1..=100_000)
}

/// `--processes`: worker processes, 1 to 64.
pub(crate) fn processes() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(1..=64)
}

/// `--runs`: repetitions, 1 to 1,000.
pub(crate) fn runs() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::<usize>::new().range(1..=1_000)
}

/// `--rate`: most per second, 1 to 1,000,000.
pub(crate) fn rate() -> RangedU64ValueParser<u64> {
    RangedU64ValueParser::<u64>::new().range(1..=1_000_000)
}

/// A `--jitter` as typed: which kind, and its size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum JitterArg {
    /// A bare number, `0.2`: `ratio:0.2` (for `spread`, which only ever
    /// shortens, `down:0.2`).
    Number(f64),
    /// `ratio:R`: ±R of the TTL.
    Ratio(f64),
    /// `down:R`: −R of the TTL to 0.
    Down(f64),
    /// `±D` or `fixed:D`: ±D.
    Fixed(Duration),
    /// `up-to:D`: 0 to +D.
    UpTo(Duration),
    /// `none`.
    None,
}

impl JitterArg {
    /// The library's jitter.
    pub(crate) fn jitter(self) -> Jitter {
        match self {
            JitterArg::Number(r) | JitterArg::Ratio(r) => Jitter::ratio(r),
            JitterArg::Down(r) => Jitter::down(r),
            JitterArg::Fixed(d) => Jitter::fixed(d),
            JitterArg::UpTo(d) => Jitter::up_to(d),
            JitterArg::None => Jitter::none(),
        }
    }
}

impl fmt::Display for JitterArg {
    /// The library's spelling: `±20%`, `-20%`, `±30s`, `+0..30s`, `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.jitter().fmt(f)
    }
}

/// `--jitter`: `0.2` or `ratio:0.2` (±20 %), `down:0.2`, `±30s` or
/// `fixed:30s`, `up-to:30s`, or `none`; checked by the library.
pub(crate) fn jitter(s: &str) -> Result<JitterArg, String> {
    const EXPECTED: &str =
        "expected 0.2, ratio:0.2, down:0.2, ±30s (or fixed:30s), up-to:30s or none";
    let s = s.trim();
    let ratio = |size: &str| {
        size.parse::<f64>()
            .map_err(|_| format!("`{size}` is not a ratio; {EXPECTED}"))
    };
    let span = |size: &str| {
        humantime::parse_duration(size).map_err(|err| format!("`{size}`: {err}; {EXPECTED}"))
    };
    let arg = if s == "none" {
        JitterArg::None
    } else if let Some(size) = s.strip_prefix('±').or_else(|| s.strip_prefix("+-")) {
        JitterArg::Fixed(span(size)?)
    } else if let Some((kind, size)) = s.split_once(':') {
        match kind {
            "ratio" => JitterArg::Ratio(ratio(size)?),
            "down" => JitterArg::Down(ratio(size)?),
            "fixed" => JitterArg::Fixed(span(size)?),
            "up-to" => JitterArg::UpTo(span(size)?),
            _ => return Err(format!("unknown kind `{kind}`; {EXPECTED}")),
        }
    } else {
        match s.parse::<f64>() {
            Ok(r) => JitterArg::Number(r),
            Err(_) => return Err(EXPECTED.to_owned()),
        }
    };
    arg.jitter().validate().map_err(|err| err.to_string())?;
    Ok(arg)
}

/// An old spelling, accepted for one release: `old VALUE` reads as
/// `new converted(VALUE)`.
struct Deprecated {
    /// The subcommand path it belongs to, e.g. `["bench", "hit"]`.
    command: &'static [&'static str],
    /// The old option, e.g. `--ttl-secs`.
    old: &'static str,
    /// The option it now is, e.g. `--ttl`.
    new: &'static str,
    /// How the old value is written in the new spelling.
    unit: Unit,
}

/// How an old value converts.
#[derive(Clone, Copy)]
enum Unit {
    /// Whole seconds, to a duration.
    Seconds,
    /// Whole milliseconds, to a duration.
    Millis,
    /// As it is.
    Same,
}

/// The spellings of the previous release.
const DEPRECATED: &[Deprecated] = &[
    Deprecated {
        command: &["warm"],
        old: "--ttl-secs",
        new: "--ttl",
        unit: Unit::Seconds,
    },
    Deprecated {
        command: &["warm"],
        old: "--loader-ms",
        new: "--loader-latency",
        unit: Unit::Millis,
    },
    Deprecated {
        command: &["warm"],
        old: "--ratio",
        new: "--jitter",
        unit: Unit::Same,
    },
    Deprecated {
        command: &["bench", "stampede"],
        old: "--loader-ms",
        new: "--loader-latency",
        unit: Unit::Millis,
    },
    Deprecated {
        command: &["bench", "grace"],
        old: "--loader-ms",
        new: "--loader-latency",
        unit: Unit::Millis,
    },
    Deprecated {
        command: &["bench", "many"],
        old: "--loader-ms",
        new: "--loader-latency",
        unit: Unit::Millis,
    },
    Deprecated {
        command: &["bench", "many"],
        old: "--callers",
        new: "--concurrency",
        unit: Unit::Same,
    },
    Deprecated {
        command: &["bench", "hit"],
        old: "--trial-ms",
        new: "--trial",
        unit: Unit::Millis,
    },
];

/// `args` (the whole command line, program name first) with the previous
/// release's spellings rewritten to the current ones, a warning on stderr
/// for each old option used (once); or, for an old option whose value is
/// not a number, the usage error to print (exit code 2).
///
/// Only options of the subcommand they belonged to are rewritten, and
/// nothing after a `--`.
pub(crate) fn rewrite_deprecated(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let words: Vec<Option<&str>> = args.iter().map(|a| a.to_str()).collect();
    // The subcommand path: the leading words that are not options.
    let path: Vec<&str> = words
        .iter()
        .skip(1)
        .map_while(|w| w.filter(|w| !w.starts_with('-')))
        .collect();
    let applies = |d: &Deprecated| path.starts_with(d.command) && path.len() == d.command.len();
    let mut out = Vec::with_capacity(args.len());
    let mut warned: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let word = words[i];
        if word == Some("--") {
            out.extend(args[i..].iter().cloned());
            break;
        }
        let found = word.and_then(|w| {
            DEPRECATED.iter().filter(|d| applies(d)).find_map(|d| {
                if w == d.old {
                    Some((d, None))
                } else {
                    w.strip_prefix(d.old)
                        .and_then(|rest| rest.strip_prefix('='))
                        .map(|value| (d, Some(value)))
                }
            })
        });
        let Some((d, inline)) = found else {
            out.push(args[i].clone());
            i += 1;
            continue;
        };
        let value = match inline {
            Some(value) => Some(value),
            None => {
                i += 1;
                words.get(i).copied().flatten()
            }
        };
        let Some(value) = value else {
            return Err(format!(
                "{} needs a value (it is deprecated: use {})",
                d.old, d.new
            ));
        };
        let new_value = convert(d, value)?;
        if !warned.contains(&d.old) {
            warned.push(d.old);
            eprintln!(
                "breakwater {}: warning: {} is deprecated; use {} {new_value}",
                d.command.join(" "),
                d.old,
                d.new
            );
        }
        out.push(d.new.into());
        out.push(new_value.into());
        i += 1;
    }
    Ok(out)
}

/// The old option's value in the new spelling.
fn convert(d: &Deprecated, value: &str) -> Result<String, String> {
    let number = |unit: &str| {
        value.trim().parse::<u64>().map_err(|_| {
            format!(
                "{} takes whole {unit}, got {value:?} (it is deprecated: use {}, e.g. {} {})",
                d.old,
                d.new,
                d.new,
                if unit == "seconds" { "1h" } else { "50ms" }
            )
        })
    };
    Ok(match d.unit {
        Unit::Seconds => {
            humantime::format_duration(Duration::from_secs(number("seconds")?)).to_string()
        }
        Unit::Millis => {
            let ms = number("milliseconds")?;
            if ms == 0 {
                "0ms".to_owned()
            } else {
                humantime::format_duration(Duration::from_millis(ms)).to_string()
            }
        }
        Unit::Same => value.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_jitter_spelling_parses() {
        assert_eq!(jitter("0.2"), Ok(JitterArg::Number(0.2)));
        assert_eq!(jitter("ratio:0.2"), Ok(JitterArg::Ratio(0.2)));
        assert_eq!(jitter("down:0.2"), Ok(JitterArg::Down(0.2)));
        assert_eq!(
            jitter("±30s"),
            Ok(JitterArg::Fixed(Duration::from_secs(30)))
        );
        assert_eq!(
            jitter("+-30s"),
            Ok(JitterArg::Fixed(Duration::from_secs(30)))
        );
        assert_eq!(
            jitter("fixed:30s"),
            Ok(JitterArg::Fixed(Duration::from_secs(30)))
        );
        assert_eq!(
            jitter("up-to:1m"),
            Ok(JitterArg::UpTo(Duration::from_secs(60)))
        );
        assert_eq!(jitter("none"), Ok(JitterArg::None));
        assert_eq!(jitter("0.2").unwrap().to_string(), "±20%");
        let err = jitter("ratio:1.5").unwrap_err();
        assert!(
            err.contains("jitter ratio must be in 0..=1, got 1.5"),
            "{err}"
        );
        assert!(jitter("-0.2").is_err());
        assert!(jitter("sideways:3").is_err());
        assert!(jitter("±").is_err());
    }

    #[test]
    fn durations_keep_their_bounds() {
        assert_eq!(ttl("10m"), Ok(Duration::from_secs(600)));
        assert!(ttl("500ms").is_err());
        assert!(ttl("366d").is_err());
        assert_eq!(loader_latency("0s"), Ok(Duration::ZERO));
        assert!(loader_latency("2m").is_err());
        assert!(loader_latency("5").is_err(), "a unit is required");
        assert_eq!(trial("1s"), Ok(Duration::from_secs(1)));
        assert!(trial("0s").is_err());
    }

    fn rewritten(args: &[&str]) -> Result<Vec<String>, String> {
        let args = args.iter().map(OsString::from).collect();
        rewrite_deprecated(args)
            .map(|out| out.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn old_spellings_become_new_ones_in_their_own_subcommand_only() {
        assert_eq!(
            rewritten(&[
                "bw",
                "warm",
                "--ttl-secs",
                "3600",
                "--loader-ms=5",
                "--ratio",
                "0.1"
            ]),
            Ok(vec![
                "bw".to_owned(),
                "warm".to_owned(),
                "--ttl".to_owned(),
                "1h".to_owned(),
                "--loader-latency".to_owned(),
                "5ms".to_owned(),
                "--jitter".to_owned(),
                "0.1".to_owned(),
            ])
        );
        assert_eq!(
            rewritten(&["bw", "bench", "hit", "--trial-ms", "1500"]).unwrap()[3..],
            ["--trial", "1s 500ms"]
        );
        assert_eq!(
            rewritten(&["bw", "bench", "many", "--callers", "4"]).unwrap()[3..],
            ["--concurrency", "4"]
        );
        // Not an option of simulate before: left for clap to refuse.
        assert_eq!(
            rewritten(&["bw", "simulate", "--loader-ms", "5"]).unwrap()[2..],
            ["--loader-ms", "5"]
        );
        // After `--`, nothing is an option.
        assert_eq!(
            rewritten(&["bw", "warm", "--", "--ratio", "1"]).unwrap()[2..],
            ["--", "--ratio", "1"]
        );
        let err = rewritten(&["bw", "warm", "--loader-ms", "5ms"]).unwrap_err();
        assert!(err.contains("use --loader-latency"), "{err}");
        assert!(rewritten(&["bw", "warm", "--ttl-secs"]).is_err());
    }
}
