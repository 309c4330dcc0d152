//! Expiries per second as compact text: a few rows over a shared time axis,
//! one column of bars per series on one shared scale, so a spike of 100,000
//! and an even spread of 800 a second look as different as they are.

use std::fmt::Write as _;

use crate::report::thousands;

/// At most this many rows; buckets widen to fit.
const MAX_ROWS: usize = 12;
/// Cells of the longest bar.
const BAR_CELLS: usize = 24;

/// The most expiries in any half-open window `[t, t + 1 s)`; `sorted_ms`
/// in ascending order.
pub(crate) fn peak_1s(sorted_ms: &[u64]) -> usize {
    let mut peak = 0;
    let mut start = 0;
    for (end, &t) in sorted_ms.iter().enumerate() {
        while t - sorted_ms[start] >= 1000 {
            start += 1;
        }
        peak = peak.max(end - start + 1);
    }
    peak
}

/// A bucket width in seconds at least `min_s`, rounded up to one a clock
/// reader expects.
fn nice_width(min_s: u64) -> u64 {
    const NICE: [u64; 16] = [
        1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21_600,
    ];
    NICE.into_iter()
        .find(|&w| w >= min_s)
        .unwrap_or_else(|| min_s.div_ceil(86_400) * 86_400)
}

/// The histogram of `series` (a title and expiry times in ms, any order)
/// over one time axis labelled `axis` (e.g. "seconds from now"): one row
/// per bucket, one column per series, bars on one scale. Empty if every
/// series is empty.
pub(crate) fn render(axis: &str, series: &[(&str, &[u64])]) -> String {
    let all = series.iter().flat_map(|(_, ms)| ms.iter().copied());
    let (Some(first), Some(last)) = (all.clone().min(), all.max()) else {
        return String::new();
    };
    let (first_s, last_s) = (first / 1000, last / 1000);
    let width = nice_width((last_s - first_s + 1).div_ceil(MAX_ROWS as u64));
    let start = first_s / width * width;
    let rows = usize::try_from((last_s - start) / width + 1).unwrap_or(MAX_ROWS);
    let buckets: Vec<Vec<usize>> = series
        .iter()
        .map(|(_, ms)| {
            let mut buckets = vec![0; rows];
            for &t in ms.iter() {
                let row = usize::try_from((t / 1000 - start) / width).unwrap_or(rows - 1);
                buckets[row.min(rows - 1)] += 1;
            }
            buckets
        })
        .collect();
    let max = buckets.iter().flatten().copied().max().unwrap_or(0).max(1);
    let labels: Vec<String> = (0..rows as u64)
        .map(|row| {
            let from = start + row * width;
            if width == 1 {
                format!("{from}")
            } else {
                format!("{from}–{}", from + width)
            }
        })
        .collect();
    let label_width = labels
        .iter()
        .map(|l| l.chars().count())
        .chain([axis.chars().count()])
        .max()
        .unwrap_or(0);
    let column = BAR_CELLS + 9;

    let mut out = String::new();
    let _ = write!(out, "  {axis:<label_width$}");
    for (title, _) in series {
        let _ = write!(out, "  {title:<column$}");
    }
    out = out.trim_end().to_owned();
    out.push('\n');
    for (row, label) in labels.iter().enumerate() {
        let _ = write!(out, "  {label:<label_width$}");
        for column_buckets in &buckets {
            let n = column_buckets[row];
            let cells = if n == 0 {
                0
            } else {
                (n * BAR_CELLS).div_ceil(max).max(1)
            };
            let bar = "█".repeat(cells);
            let _ = write!(out, "  {bar:<BAR_CELLS$} {:>8}", thousands(n));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_second_slides() {
        assert_eq!(peak_1s(&[]), 0);
        assert_eq!(peak_1s(&[0, 999, 1000, 1500, 1999, 2999]), 3);
        assert_eq!(peak_1s(&[0, 999, 1000]), 2);
        assert_eq!(peak_1s(&[5, 5, 5]), 3);
    }

    #[test]
    fn a_spike_and_a_spread_share_one_axis_and_one_scale() {
        let spike: Vec<u64> = vec![299_500; 120];
        let spread: Vec<u64> = (0..120).map(|i| 240_000 + i * 500).collect();
        let text = render(
            "seconds from now",
            &[("before", &spike), ("after", &spread)],
        );
        let rows: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(rows.len(), 12, "{text}");
        assert!(rows[0].starts_with("  240–245"), "{text}");
        // The spike's row has the full bar; each row of the spread a twelfth.
        let last = rows[11];
        assert_eq!(last.matches('█').count(), BAR_CELLS + 2, "{text}");
        assert!(last.contains(" 120"), "{text}");
        assert_eq!(rows[0].matches('█').count(), 2, "{text}");
        // Every series sums to its length.
        let total: usize = rows
            .iter()
            .map(|r| {
                r.split_whitespace()
                    .last()
                    .unwrap()
                    .replace(',', "")
                    .parse::<usize>()
                    .unwrap()
            })
            .sum();
        assert_eq!(total, 120);
    }

    #[test]
    fn nothing_to_show_is_empty() {
        assert_eq!(render("s", &[("a", &[])]), "");
    }
}
