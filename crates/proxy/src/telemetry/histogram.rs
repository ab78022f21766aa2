//! Latency histograms: one worker's cells, summed over workers when scraped.
//!
//! A cell is a fixed array of atomic bucket counts and a sum, written only by its worker (relaxed
//! adds, no lock, no allocation); the admin endpoint adds the workers' cells together and writes
//! Prometheus's cumulative `_bucket`/`_sum`/`_count` lines.

use std::{
    fmt::Write,
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::Duration,
};

/// Upper bounds of the buckets, in seconds: sub-millisecond (a proxy on the same host) to a minute
/// (`timeouts.read`'s default), about three per decade, like Envoy's and Linkerd's defaults.
pub(crate) const BOUNDS_SECONDS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// The same bounds in microseconds, compared against on the request path.
const BOUNDS_MICROS: [u64; 16] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// One worker's histogram of durations.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    buckets: [AtomicU64; BOUNDS_MICROS.len() + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    pub(crate) fn observe(&self, duration: Duration) {
        let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_MICROS
            .iter()
            .position(|&bound| micros <= bound)
            .unwrap_or(BOUNDS_MICROS.len());
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(micros, Relaxed);
    }
}

/// Several workers' cells of one series, added together and written as a Prometheus histogram.
pub(crate) trait Sum: Default {
    /// One worker's cell.
    type Cell;

    /// Adds one worker's cell.
    fn add(&mut self, cell: &Self::Cell);

    /// Writes the series `name{labels}` (labels already escaped, without braces) in the Prometheus
    /// text format: cumulative `_bucket`s, `_sum`, `_count`.
    fn write(&self, out: &mut String, name: &str, labels: &str);
}

/// Several workers' [`Histogram`]s of one series, added together.
#[derive(Debug, Default, Clone)]
pub(crate) struct Summed {
    buckets: [u64; BOUNDS_MICROS.len() + 1],
    sum_micros: u64,
}

impl Sum for Summed {
    type Cell = Histogram;

    fn add(&mut self, cell: &Histogram) {
        for (total, bucket) in self.buckets.iter_mut().zip(&cell.buckets) {
            *total += bucket.load(Relaxed);
        }
        self.sum_micros += cell.sum_micros.load(Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, count) in BOUNDS_SECONDS.iter().zip(&self.buckets) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.buckets[BOUNDS_SECONDS.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum_micros as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

impl Summed {
    /// What was observed since `earlier` (an older reading of the same series).
    pub(crate) fn since(&self, earlier: &Summed) -> Summed {
        let mut buckets = self.buckets;
        for (bucket, old) in buckets.iter_mut().zip(&earlier.buckets) {
            *bucket = bucket.saturating_sub(*old);
        }
        Summed {
            buckets,
            sum_micros: self.sum_micros.saturating_sub(earlier.sum_micros),
        }
    }

    /// Observations so far.
    pub(crate) fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper bound (seconds) of the bucket holding quantile `q`, as Prometheus's
    /// `histogram_quantile` would bound it; `None` with no observations, infinity above every bound.
    pub(crate) fn quantile_bound(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut cumulative = 0;
        for (bound, count) in BOUNDS_SECONDS.iter().zip(&self.buckets) {
            cumulative += count;
            if cumulative >= rank {
                return Some(*bound);
            }
        }
        Some(f64::INFINITY)
    }
}

/// Attempts per request (1: no retry), one worker's cells: counts for 1 to 5 attempts and above.
#[derive(Debug, Default)]
pub(crate) struct AttemptCounts {
    /// Requests by attempts: 1, 2, 3, 4, 5, more.
    buckets: [AtomicU64; 6],
}

impl AttemptCounts {
    pub(crate) fn observe(&self, attempts: usize) {
        let bucket = attempts.clamp(1, 6) - 1;
        self.buckets[bucket].fetch_add(1, Relaxed);
    }
}

/// Several workers' [`AttemptCounts`] added together.
#[derive(Debug, Default)]
pub(crate) struct SummedAttempts {
    buckets: [u64; 6],
}

/// Written with buckets `le` 1 to 5 (the sum counts six for the few above five: a lower bound).
impl Sum for SummedAttempts {
    type Cell = AttemptCounts;

    fn add(&mut self, cell: &AttemptCounts) {
        for (total, bucket) in self.buckets.iter_mut().zip(&cell.buckets) {
            *total += bucket.load(Relaxed);
        }
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let mut sum = 0;
        for (i, count) in self.buckets.iter().enumerate() {
            cumulative += count;
            sum += count * (i as u64 + 1);
            if i < 5 {
                let _ = writeln!(
                    out,
                    "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}",
                    i + 1
                );
            }
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them_and_sum_across_workers() {
        let (a, b) = (Histogram::default(), Histogram::default());
        a.observe(Duration::from_micros(400)); // <= 0.0005
        a.observe(Duration::from_micros(500)); // <= 0.0005: bounds are inclusive
        a.observe(Duration::from_millis(3)); // <= 0.005
        b.observe(Duration::from_secs(90)); // above every bound
        let mut summed = Summed::default();
        summed.add(&a);
        summed.add(&b);
        let mut out = String::new();
        summed.write(&mut out, "t", "cluster=\"c\"");
        let line = |le: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("t_bucket{{cluster=\"c\",le=\"{le}\"}}")))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        assert_eq!(line("0.0005"), Some(2));
        assert_eq!(line("0.0025"), Some(2));
        assert_eq!(line("0.005"), Some(3));
        assert_eq!(line("60"), Some(3));
        assert_eq!(line("+Inf"), Some(4));
        assert!(out.contains("t_count{cluster=\"c\"} 4\n"), "{out}");
        assert!(out.contains("t_sum{cluster=\"c\"} 90.0039\n"), "{out}");
    }
}
