//! What a tower user relies on: membership from `Discover` (also behind a `Buffer`), readiness that
//! never pins the balancer, a balancer that is itself a `Load`, and counters that hold under a
//! multi-thread runtime.

use duet_balance::{Balancer, BoxError, DiscoverBalancer, Strategy};
use std::{
    convert::Infallible,
    future::Ready,
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc, Mutex,
    },
    task::{Context, Poll},
};
use tower::{
    buffer::Buffer,
    discover::{Change, ServiceList},
    load::Load,
    Service, ServiceExt,
};

/// An endpoint whose readiness the test sets: answers with its name.
#[derive(Clone)]
struct Switch {
    name: &'static str,
    state: Arc<AtomicU8>,
}

const READY: u8 = 0;
const PENDING: u8 = 1;
const FAILED: u8 = 2;

impl Switch {
    fn new(name: &'static str) -> (Self, Arc<AtomicU8>) {
        let state = Arc::new(AtomicU8::new(READY));
        (
            Self {
                name,
                state: state.clone(),
            },
            state,
        )
    }
}

impl Service<()> for Switch {
    type Response = &'static str;
    type Error = BoxError;
    type Future = Ready<Result<&'static str, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        match self.state.load(Ordering::Relaxed) {
            READY => Poll::Ready(Ok(())),
            PENDING => Poll::Pending,
            _ => Poll::Ready(Err("connection closed".into())),
        }
    }

    fn call(&mut self, (): ()) -> Self::Future {
        std::future::ready(Ok(self.name))
    }
}

fn noop_context() -> Context<'static> {
    Context::from_waker(std::task::Waker::noop())
}

#[tokio::test]
async fn a_buffered_balancer_follows_its_discovery_stream_and_its_handle() {
    let (changes, mut announced) = tokio::sync::mpsc::unbounded_channel();
    let discover = futures_util::stream::poll_fn(move |cx| announced.poll_recv(cx));
    let balance = DiscoverBalancer::new(discover, Strategy::P2cInflight);
    let handle = balance.handle();
    let mut shared = Buffer::new(balance, 16);
    let name = |n: &'static str| Switch::new(n).0;
    let mut call = async || shared.ready().await?.call(()).await;

    changes
        .send(Ok::<_, Infallible>(Change::Insert("a", name("a"))))
        .expect("send");
    assert_eq!(call().await.expect("served"), "a");
    changes
        .send(Ok(Change::Insert("b", name("b"))))
        .expect("send");
    changes.send(Ok(Change::Remove("a"))).expect("send");
    for _ in 0..20 {
        assert_eq!(call().await.expect("served"), "b", "a was removed");
    }
    // Weight and eligibility through the handle, after the stream's own changes.
    changes
        .send(Ok(Change::Insert("c", name("c"))))
        .expect("send");
    handle.set_eligible("b", false);
    for _ in 0..20 {
        assert_eq!(call().await.expect("served"), "c", "b is out of rotation");
    }
    handle.set_eligible("b", true);
    handle.set_weight("c", 0);
    for _ in 0..20 {
        assert_eq!(call().await.expect("served"), "b", "c has weight 0");
    }
}

#[test]
fn a_pending_endpoint_is_passed_over_and_a_failed_one_evicted() {
    let mut cx = noop_context();
    let mut balance = Balancer::with_seed(Strategy::P2cInflight, 3);
    let (stuck, stuck_state) = Switch::new("stuck");
    let (fine, _) = Switch::new("fine");
    let (broken, broken_state) = Switch::new("broken");
    balance.insert("stuck", 1, stuck);
    balance.insert("fine", 1, fine);
    stuck_state.store(PENDING, Ordering::Relaxed);
    for _ in 0..50 {
        assert!(Service::<()>::poll_ready(&mut balance, &mut cx).is_ready());
        let answer = futures_util::FutureExt::now_or_never(balance.call(()))
            .expect("answered at once")
            .expect("served");
        assert_eq!(answer, "fine", "never pinned to the pending one");
    }
    assert!(balance.stats().repicks > 0);

    // Only the pending one left eligible: after its three picks the balancer waits on it.
    balance.set_eligible(&"fine", false);
    assert!(Service::<()>::poll_ready(&mut balance, &mut cx).is_pending());
    stuck_state.store(READY, Ordering::Relaxed);
    assert!(Service::<()>::poll_ready(&mut balance, &mut cx).is_ready());
    drop(balance.call(()));
    balance.set_eligible(&"fine", true);

    // A retry's pick excludes what it tried: passing over a pending endpoint never brings one back.
    let (other, _) = Switch::new("other");
    balance.insert("other", 1, other);
    stuck_state.store(PENDING, Ordering::Relaxed);
    for _ in 0..50 {
        assert!(balance
            .poll_ready_excluding::<()>(&mut cx, &["fine"])
            .is_ready());
        let answer = futures_util::FutureExt::now_or_never(balance.call(()))
            .expect("answered at once")
            .expect("served");
        assert_eq!(answer, "other", "not the excluded one, not the pending one");
    }
    balance.remove(&"other");
    stuck_state.store(READY, Ordering::Relaxed);

    balance.insert("broken", 1, broken);
    broken_state.store(FAILED, Ordering::Relaxed);
    let before = balance.len();
    for _ in 0..50 {
        assert!(Service::<()>::poll_ready(&mut balance, &mut cx).is_ready());
        let answer = futures_util::FutureExt::now_or_never(balance.call(()))
            .expect("answered at once")
            .expect("served");
        assert_ne!(answer, "broken");
    }
    assert_eq!(balance.len(), before - 1, "the failed endpoint is gone");
    assert_eq!(balance.stats().evicted, 1);
}

#[tokio::test]
async fn a_balancer_is_a_load_so_balancers_nest() {
    let zone = |names: [&'static str; 2]| {
        let mut balance = Balancer::new(Strategy::P2cInflight);
        for name in names {
            balance.insert(name, 1, Switch::new(name).0);
        }
        balance
    };
    let mut east = zone(["e1", "e2"]);
    assert_eq!(east.load(), 0.0);
    // Two requests in flight on east's two endpoints: one each on average.
    let guards: Vec<_> = (0..2)
        .map(|_| east.pick_and_claim().expect("an endpoint").2)
        .collect();
    assert_eq!(east.load(), 1.0);

    // tower's own p2c balancer reads it through `Load`: a zone of endpoints is one endpoint there.
    let mut busy = zone(["y1", "y2"]);
    let held = busy.pick_and_claim().expect("an endpoint").2;
    let mut zones = tower::balance::p2c::Balance::new(tower::discover::ServiceList::new(vec![
        zone(["x1", "x2"]),
        busy,
    ]));
    for _ in 0..20 {
        let served = zones
            .ready()
            .await
            .expect("ready")
            .call(())
            .await
            .expect("served");
        assert!(served.starts_with('x'), "the idle zone wins: {served}");
    }
    drop(held);
    drop(guards);
}

#[tokio::test]
async fn a_discover_balance_is_a_load_so_it_nests_too() {
    let zone = |names: [&'static str; 2]| {
        let switches = names.map(|name| Switch::new(name).0);
        DiscoverBalancer::new(ServiceList::new(switches), Strategy::P2cInflight)
    };
    let mut idle = zone(["x1", "x2"]);
    assert_eq!(
        idle.load(),
        f64::INFINITY,
        "nothing is discovered before the first poll_ready"
    );
    idle.ready().await.expect("ready");
    assert_eq!(idle.load(), 0.0);
    let mut busy = zone(["y1", "y2"]);
    // Called but never polled: the request stays in flight on one of busy's two endpoints.
    let held = busy.ready().await.expect("ready").call(());
    assert_eq!(busy.load(), 0.5);

    // tower's own p2c balancer reads it through `Load`: a discovered zone is one endpoint there.
    let mut zones = tower::balance::p2c::Balance::new(ServiceList::new(vec![idle, busy]));
    for _ in 0..20 {
        let served = zones
            .ready()
            .await
            .expect("ready")
            .call(())
            .await
            .expect("served");
        assert!(served.starts_with('x'), "the idle zone wins: {served}");
    }
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counters_hold_when_guards_end_on_other_threads() {
    // A mock clock standing still an hour after its zero: every request takes no time, so every
    // estimate read is the starting 30 ms until an endpoint's first answer and 0 after it, however
    // slowly a loaded machine runs the threads. A
    // read that tore the counts from the sum of start times would see a start counted but missing from
    // the sum, an age of an hour over the number waiting: minutes. (With the real clock, a thread
    // descheduled while it held a guard made real samples of hundreds of milliseconds.)
    let (clock, time) = duet_balance::Clock::mock();
    time.advance(std::time::Duration::from_secs(3600));
    let starting = std::time::Duration::from_millis(30);
    let balance = Arc::new(Mutex::new(
        Balancer::new(Strategy::P2cPeakEwma).with_clock(clock),
    ));
    for name in ["a", "b", "c", "d"] {
        let mut balance = balance.lock().expect("lock");
        balance.insert(name, 1, Switch::new(name).0);
    }
    // A reader on its own thread, as a metrics scrape would be, sees every estimate in range while
    // guards start and end everywhere: counts and the sum of start times are read as one moment.
    let loads: Vec<_> = {
        let balance = balance.lock().expect("lock");
        balance.endpoints().map(|e| e.load.clone()).collect()
    };
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut worst = std::time::Duration::ZERO;
            let mut reads = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) && reads < 50_000_000 {
                for load in &loads {
                    worst = worst.max(load.rtt_estimate());
                    reads += 1;
                }
            }
            (worst, reads)
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let balance = balance.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..500u32 {
                let guard = {
                    let mut balance = balance.lock().expect("lock");
                    balance.pick_and_claim().expect("an endpoint").2
                };
                // Completed on whichever thread runs this task next, sometimes after a hop.
                if i % 3 == 0 {
                    tokio::task::yield_now().await;
                }
                tokio::spawn(async move { drop(guard) })
                    .await
                    .expect("dropped");
            }
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (worst, reads) = reader.join().expect("reader");
    assert!(worst <= starting, "{worst:?} over {reads} reads");
    let balance = balance.lock().expect("lock");
    let picks: u64 = balance.endpoints().map(|e| e.load.picks()).sum();
    assert_eq!(picks, 8 * 500);
    for endpoint in balance.endpoints() {
        assert_eq!(endpoint.load.in_flight(), 0, "{}", endpoint.key);
        assert_eq!(endpoint.load.waiting(), 0, "{}", endpoint.key);
        // Nothing is waiting for a sample any more: the estimate is the EWMA alone, which the first
        // answer (of no time) replaced and later ones, of no time at no time apart, leave there.
        assert!(endpoint.load.is_measured(), "{}", endpoint.key);
        assert_eq!(
            endpoint.load.rtt_estimate(),
            std::time::Duration::ZERO,
            "{}",
            endpoint.key
        );
    }
}
