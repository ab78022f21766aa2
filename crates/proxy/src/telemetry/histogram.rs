//! Latency histograms: one worker's cells, summed over workers when scraped.
//!
//! A cell is a fixed array of atomic bucket counts and a sum, written only by its worker (relaxed
//! adds, no lock, no allocation); the admin endpoint adds the workers' cells together and writes
//! Prometheus's cumulative `_bucket`/`_sum`/`_count` lines.
//!
//! # Exemplars
//!
//! Each bucket of a cell also keeps its latest traced observation, an [`Exemplar`]: the trace's id,
//! the value and when. An untraced observation pays one test of a `None` for it; a traced one a few
//! stores. Workers' exemplars are merged at scrape, the newest of each bucket winning, and written
//! only in the OpenMetrics exposition (`# {trace_id="…"} value timestamp` after the bucket's count).

use std::{
    fmt::Write,
    sync::atomic::Ordering::Relaxed,
    sync::atomic::{fence, AtomicU64, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
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

/// What an exemplar names its observation by: a trace's id (16 bytes, never all zero).
pub(crate) type ExemplarId = [u8; 16];

/// Buckets per histogram: one per bound, and the one above every bound.
const BUCKETS: usize = BOUNDS_MICROS.len() + 1;

/// One worker's histogram of durations.
#[derive(Debug, Default)]
pub(crate) struct Histogram {
    /// Observations per bucket (not cumulative); the last is above every bound.
    buckets: [AtomicU64; BUCKETS],
    sum_micros: AtomicU64,
    /// Each bucket's latest traced observation.
    exemplars: [ExemplarCell; BUCKETS],
}

impl Histogram {
    /// Observes `duration`, untraced (the request path says whether with [`observe_with`]).
    ///
    /// [`observe_with`]: Histogram::observe_with
    #[cfg(test)]
    pub(crate) fn observe(&self, duration: Duration) {
        self.add(duration);
    }

    /// Observes `duration`; with an `exemplar` (the request is traced), it becomes its bucket's
    /// exemplar.
    #[inline]
    pub(crate) fn observe_with(&self, duration: Duration, exemplar: Option<&ExemplarId>) {
        let (bucket, micros) = self.add(duration);
        if let Some(id) = exemplar {
            self.exemplars[bucket].store(id, micros);
        }
    }

    /// Counts `duration`: its bucket and its microseconds.
    #[inline]
    fn add(&self, duration: Duration) -> (usize, u64) {
        let (bucket, micros) = bucket_of(duration);
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(micros, Relaxed);
        (bucket, micros)
    }
}

#[cfg(test)]
impl Histogram {
    /// Makes `id`, observed as `duration` at `unix_millis`, its bucket's exemplar without counting
    /// it: fixtures at fixed times.
    pub(crate) fn set_exemplar(&self, duration: Duration, id: &ExemplarId, unix_millis: u64) {
        let (bucket, micros) = bucket_of(duration);
        self.exemplars[bucket].store_at(id, micros, unix_millis);
    }
}

/// The bucket that holds `duration` (the first whose bound it does not pass), and `duration` in
/// microseconds.
#[inline]
fn bucket_of(duration: Duration) -> (usize, u64) {
    let micros = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
    let bucket = BOUNDS_MICROS
        .iter()
        .position(|&bound| micros <= bound)
        .unwrap_or(BOUNDS_MICROS.len());
    (bucket, micros)
}

/// An observation named by a trace, as a scrape reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exemplar {
    pub(crate) id: ExemplarId,
    /// The observed duration.
    pub(crate) micros: u64,
    /// When it was observed, in milliseconds since the Unix epoch.
    pub(crate) unix_millis: u64,
}

/// One bucket's latest [`Exemplar`]: written by its worker alone, read by scrapes on another thread.
/// A sequence lock keeps a reader from pairing one request's id with another's value: the writer
/// makes the sequence odd while it writes, and a reader that saw it odd, or changed, reads again.
#[derive(Debug, Default)]
struct ExemplarCell {
    sequence: AtomicU64,
    id: [AtomicU64; 2],
    micros: AtomicU64,
    /// 0 until the bucket has an exemplar.
    unix_millis: AtomicU64,
}

impl ExemplarCell {
    /// Records a traced observation now (only the cell's worker writes it).
    #[inline(never)]
    fn store(&self, id: &ExemplarId, micros: u64) {
        let unix_millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |since| {
                u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
            });
        self.store_at(id, micros, unix_millis);
    }

    fn store_at(&self, id: &ExemplarId, micros: u64, unix_millis: u64) {
        let (high, low) = id.split_at(8);
        let word = |bytes: &[u8]| u64::from_be_bytes(bytes.try_into().unwrap_or_default());
        let sequence = self.sequence.load(Relaxed);
        self.sequence.store(sequence.wrapping_add(1), Relaxed);
        // The odd sequence is visible before any field changes.
        fence(Ordering::Release);
        self.id[0].store(word(high), Relaxed);
        self.id[1].store(word(low), Relaxed);
        self.micros.store(micros, Relaxed);
        self.unix_millis.store(unix_millis.max(1), Relaxed);
        self.sequence
            .store(sequence.wrapping_add(2), Ordering::Release);
    }

    /// The cell's exemplar, if it has one and a consistent reading of it came within a few tries
    /// (a scrape never waits on a worker: a bucket written over and over mid-read goes without).
    fn load(&self) -> Option<Exemplar> {
        for _ in 0..4 {
            let before = self.sequence.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let (high, low) = (self.id[0].load(Relaxed), self.id[1].load(Relaxed));
            let micros = self.micros.load(Relaxed);
            let unix_millis = self.unix_millis.load(Relaxed);
            // The fields are read before the sequence is read again.
            fence(Ordering::Acquire);
            if self.sequence.load(Relaxed) != before {
                continue;
            }
            if unix_millis == 0 {
                return None;
            }
            let mut id = [0; 16];
            id[..8].copy_from_slice(&high.to_be_bytes());
            id[8..].copy_from_slice(&low.to_be_bytes());
            return Some(Exemplar {
                id,
                micros,
                unix_millis,
            });
        }
        None
    }
}

/// Which text a scrape asked for: Prometheus's (0.0.4) or OpenMetrics 1.0, which differ here in
/// how `le` is written and in the exemplars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exposition {
    Prometheus,
    OpenMetrics,
}

/// Several workers' cells of one series, added together and written as a Prometheus histogram.
pub(crate) trait Sum: Default {
    /// One worker's cell.
    type Cell;

    /// Adds one worker's cell.
    fn add(&mut self, cell: &Self::Cell);

    /// Takes one worker's cell's exemplars, each bucket keeping the newest; those with none have
    /// nothing to take.
    fn add_exemplars(&mut self, _cell: &Self::Cell) {}

    /// Writes the series `name{labels}` (labels already escaped, without braces) in the text format
    /// `exposition`: cumulative `_bucket`s, `_sum`, `_count`.
    fn write(&self, out: &mut String, name: &str, labels: &str, exposition: Exposition);
}

/// Several workers' [`Histogram`]s of one series, added together.
#[derive(Debug, Default, Clone)]
pub(crate) struct Summed {
    buckets: [u64; BUCKETS],
    sum_micros: u64,
    /// The newest exemplar of each bucket, once [`Sum::add_exemplars`] took any (OpenMetrics only).
    exemplars: Option<Box<[Option<Exemplar>; BUCKETS]>>,
}

impl Sum for Summed {
    type Cell = Histogram;

    fn add(&mut self, cell: &Histogram) {
        for (total, bucket) in self.buckets.iter_mut().zip(&cell.buckets) {
            *total += bucket.load(Relaxed);
        }
        self.sum_micros += cell.sum_micros.load(Relaxed);
    }

    fn add_exemplars(&mut self, cell: &Histogram) {
        let newest = self.exemplars.get_or_insert_with(Default::default);
        for (kept, exemplar) in newest.iter_mut().zip(&cell.exemplars) {
            let Some(exemplar) = exemplar.load() else {
                continue;
            };
            if kept.is_none_or(|kept| kept.unix_millis < exemplar.unix_millis) {
                *kept = Some(exemplar);
            }
        }
    }

    fn write(&self, out: &mut String, name: &str, labels: &str, exposition: Exposition) {
        let mut cumulative = 0;
        for (i, (bound, count)) in BOUNDS_SECONDS.iter().zip(&self.buckets).enumerate() {
            cumulative += count;
            let _ = match exposition {
                Exposition::Prometheus => write!(out, "{name}_bucket{{{labels},le=\"{bound}\"}}"),
                // OpenMetrics's canonical numbers: `1.0`, not `1`.
                Exposition::OpenMetrics => {
                    write!(out, "{name}_bucket{{{labels},le=\"{bound:?}\"}}")
                }
            };
            let _ = write!(out, " {cumulative}");
            self.write_exemplar(out, i);
            out.push('\n');
        }
        cumulative += self.buckets[BOUNDS_SECONDS.len()];
        let _ = write!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        self.write_exemplar(out, BOUNDS_SECONDS.len());
        out.push('\n');
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum_micros as f64 / 1e6
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

impl Summed {
    /// ` # {trace_id="…"} value timestamp`: bucket `bucket`'s exemplar, if it has one.
    fn write_exemplar(&self, out: &mut String, bucket: usize) {
        let Some(exemplar) = (self.exemplars.as_ref()).and_then(|all| all[bucket]) else {
            return;
        };
        out.push_str(" # {trace_id=\"");
        for byte in exemplar.id {
            let _ = write!(out, "{byte:02x}");
        }
        let (seconds, millis) = (exemplar.unix_millis / 1000, exemplar.unix_millis % 1000);
        let value = exemplar.micros as f64 / 1e6;
        let _ = write!(out, "\"}} {value} {seconds}.{millis:03}");
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
            exemplars: None,
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

    fn write(&self, out: &mut String, name: &str, labels: &str, exposition: Exposition) {
        let mut cumulative = 0;
        let mut sum = 0;
        // OpenMetrics's canonical numbers: `1.0`, not `1`.
        let decimal = match exposition {
            Exposition::Prometheus => "",
            Exposition::OpenMetrics => ".0",
        };
        for (i, count) in self.buckets.iter().enumerate() {
            cumulative += count;
            sum += count * (i as u64 + 1);
            if i < 5 {
                let _ = writeln!(
                    out,
                    "{name}_bucket{{{labels},le=\"{}{decimal}\"}} {cumulative}",
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
        summed.write(&mut out, "t", "cluster=\"c\"", Exposition::Prometheus);
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

    #[test]
    fn a_scrape_never_reads_one_request_s_id_with_another_s_value_while_the_worker_writes() {
        let cell = std::sync::Arc::new(ExemplarCell::default());
        // Both sides start together, so that the reads overlap the writes.
        let start = std::sync::Arc::new(std::sync::Barrier::new(2));
        let writer = {
            let (cell, start) = (cell.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..200_000_u64 {
                    // The id's bytes and the value say the same number: a torn read shows.
                    let n = (i % 251) as u8;
                    cell.store_at(&[n; 16], u64::from(n), 1 + i);
                }
            })
        };
        start.wait();
        while !writer.is_finished() {
            if let Some(exemplar) = cell.load() {
                assert!(
                    exemplar.id.iter().all(|&b| u64::from(b) == exemplar.micros),
                    "{exemplar:?}"
                );
            }
        }
        writer.join().expect("the writer");
        let last = cell.load().expect("the last exemplar");
        assert_eq!((last.micros, last.unix_millis), (199_999 % 251, 200_000));
    }

    #[test]
    fn a_bucket_s_exemplar_is_its_newest_traced_observation_of_any_worker_and_only_in_openmetrics()
    {
        let (a, b) = (Histogram::default(), Histogram::default());
        a.observe_with(Duration::from_micros(300), Some(&[0xaa; 16]));
        a.observe(Duration::from_micros(400)); // untraced: the exemplar stays
        b.observe(Duration::from_micros(200));
        // Worker b's traced observations of the first bucket and of the last, both later.
        b.set_exemplar(Duration::from_micros(100), &[0xbb; 16], u64::MAX / 2);
        b.set_exemplar(Duration::from_secs(61), &[0x0c; 16], 1_700_000_000_005);
        a.set_exemplar(Duration::from_secs(70), &[0x0d; 16], 1_700_000_000_004);
        let mut summed = Summed::default();
        for cell in [&a, &b] {
            summed.add(cell);
            summed.add_exemplars(cell);
        }
        let mut out = String::new();
        summed.write(&mut out, "t", "r=\"x\"", Exposition::OpenMetrics);
        let first = out.lines().next().expect("a line");
        let bb = "bb".repeat(16);
        let seconds = u64::MAX / 2 / 1000;
        assert_eq!(
            first,
            format!(
                "t_bucket{{r=\"x\",le=\"0.0005\"}} 3 # {{trace_id=\"{bb}\"}} 0.0001 {seconds}.807"
            )
        );
        let inf = out.lines().find(|l| l.contains("+Inf")).expect("+Inf");
        let oc = "0c".repeat(16);
        assert_eq!(
            inf,
            format!("t_bucket{{r=\"x\",le=\"+Inf\"}} 3 # {{trace_id=\"{oc}\"}} 61 1700000000.005")
        );
        assert!(out.contains("t_bucket{r=\"x\",le=\"1.0\"} 3\n"), "{out}");
        assert_eq!(out.matches(" # {").count(), 2, "{out}");
        // Without the exemplars taken, the same sums in Prometheus's text.
        let mut plain = Summed::default();
        plain.add(&a);
        plain.add(&b);
        let mut text = String::new();
        plain.write(&mut text, "t", "r=\"x\"", Exposition::Prometheus);
        assert!(
            text.starts_with("t_bucket{r=\"x\",le=\"0.0005\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("t_bucket{r=\"x\",le=\"1\"} 3\n"), "{text}");
        assert!(!text.contains('#'), "{text}");
    }
}
