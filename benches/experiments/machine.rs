//! What the machine did while a run measured a balancer: time the hypervisor took from this virtual
//! machine (`steal` in `/proc/stat`), and how late a thread that sleeps 1 ms at a time woke up. A
//! stall of the machine makes every timer late at once, backends and client included, so a round it
//! touched measures the machine, not the balancer; the capacity table reports medians with and without
//! such rounds, judged by these figures alone (never by the latencies the round measured).

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// A round is calm when the machine lost less than this much CPU to the hypervisor (2.5% of two CPUs
/// over a 20 s run; a busy but undisturbed run of the capacity cell loses 20-170 ms)...
pub(crate) const CALM_STEAL_MS: f64 = 1000.0;
/// ...and the sleeping thread never woke more than this late: over two service times of the capacity
/// experiment, long enough to back every queue up (undisturbed runs: 8-26 ms, builds at `nice 19`
/// beside them).
pub(crate) const CALM_LATE_MS: f64 = 100.0;

/// Watches the machine while a run lasts.
pub(crate) struct Watch {
    steal_at_start: Option<u64>,
    stop: Arc<AtomicBool>,
    sleeper: JoinHandle<Duration>,
}

/// What a watch saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Disturbance {
    /// CPU time the hypervisor took, over all CPUs, in ms (0 where `/proc/stat` cannot be read).
    pub(crate) steal_ms: f64,
    /// The latest a 1 ms sleep woke beyond its 1 ms, in ms.
    pub(crate) late_ms: f64,
}

/// Whether a round with this much stolen CPU and this late a wake-up (ms) measured the balancer rather
/// than the machine.
pub(crate) fn calm(steal_ms: f64, late_ms: f64) -> bool {
    steal_ms < CALM_STEAL_MS && late_ms < CALM_LATE_MS
}

impl Watch {
    pub(crate) fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let sleeper = std::thread::spawn(move || {
            let (tick, mut latest) = (Duration::from_millis(1), Duration::ZERO);
            while !stopped.load(Ordering::Relaxed) {
                let before = Instant::now();
                std::thread::sleep(tick);
                latest = latest.max(before.elapsed().saturating_sub(tick));
            }
            latest
        });
        Self {
            steal_at_start: steal_ticks(),
            stop,
            sleeper,
        }
    }

    pub(crate) fn finish(self) -> Disturbance {
        self.stop.store(true, Ordering::Relaxed);
        let late = self.sleeper.join().unwrap_or(Duration::MAX);
        let steal = match (self.steal_at_start, steal_ticks()) {
            (Some(before), Some(after)) => after.saturating_sub(before),
            _ => 0,
        };
        Disturbance {
            steal_ms: steal as f64 * 1000.0 / USER_HZ,
            late_ms: late.as_secs_f64() * 1000.0,
        }
    }
}

/// The `steal` column of `/proc/stat`'s first line (all CPUs), in clock ticks.
fn steal_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?;
    // cpu user nice system idle iowait irq softirq steal ...
    line.split_whitespace().nth(8)?.parse().ok()
}

/// `/proc/stat`'s clock ticks per second: `USER_HZ`, 100 on every Linux architecture.
const USER_HZ: f64 = 100.0;
