//! How figures read in every command's report: counts with thousands
//! separators, latencies in milliseconds, nearest-rank percentiles, and
//! one line of what [`Cache::stats`](breakwater_cache::Cache::stats)
//! counted.
//!
//! Nothing here knows a command; the commands and their renderers use it.

use breakwater_cache::{BreakerState, Served, Stats};

/// `n` with thousands separators: `10,000`.
pub(crate) fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The `q` quantile of sorted samples (nearest rank); `None` with none.
pub(crate) fn percentile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted.get(rank - 1).copied()
}

/// Microseconds as milliseconds with two decimals; `-` for no sample.
pub(crate) fn us_as_ms(us: Option<u64>) -> String {
    us.map_or("-".to_owned(), |u| format!("{:.2}", u as f64 / 1000.0))
}

/// Milliseconds with one decimal; `-` for no sample.
pub(crate) fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
}

/// One line of what [`Cache::stats`](breakwater_cache::Cache::stats)
/// counted: calls and hit ratio, stale values by reason, loader calls,
/// coalesced calls, errors, breakers.
pub(crate) fn stats_line(stats: &Stats) -> String {
    let stale = if stats.stale.is_empty() {
        "none".to_owned()
    } else {
        stats
            .stale
            .iter()
            .map(|(reason, n)| {
                let word = Served::Stale { reason: *reason }.as_str();
                format!(
                    "{} {}",
                    word.trim_start_matches("stale_"),
                    thousands(*n as usize)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let state = |s: BreakerState| match s {
        BreakerState::Closed => "closed",
        BreakerState::HalfOpen => "half-open",
        BreakerState::Open => "open",
    };
    format!(
        "{} calls, hit ratio {:.1}%; stale: {stale}; loader calls {}, coalesced {}, errors {}; \
         breakers now: origin {}, store {}",
        thousands(stats.requests as usize),
        stats.hit_ratio() * 100.0,
        thousands(stats.loads.total() as usize),
        thousands(stats.coalesced as usize),
        thousands(stats.errors_total() as usize),
        state(stats.origin_breaker),
        state(stats.store_breaker)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_with_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.50), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&[7], 0.99), Some(7));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
