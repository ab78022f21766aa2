//! `least_inflight`, the opt-in full scan: every eligible endpoint's load read once per pick, the
//! minimum wins, equal minimums settled by exactly one draw (in proportion to weight), none otherwise;
//! eligibility and a retry's exclusions decided before anything is read. On a clock that stands still
//! every latency average is the same, so equal counts are exact ties; `latency` below moves the clock.

use duet_balance::{Balancer, Clock, Draws, LoadGuard, NoEligibleEndpoint, Strategy};
use std::{
    convert::Infallible,
    sync::{
        atomic::{AtomicUsize, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};
use tower::service_fn;

type Endpoint = tower::util::ServiceFn<fn(u32) -> std::future::Ready<Result<u32, Infallible>>>;

fn echo(x: u32) -> std::future::Ready<Result<u32, Infallible>> {
    std::future::ready(Ok(x))
}

fn endpoint() -> Endpoint {
    service_fn(echo as fn(u32) -> _)
}

/// Draws `draws` in order, and how many it has handed out. Running out of script fails the test: a
/// draw nobody expected is a bug.
fn script(draws: Vec<u64>) -> (Draws, Arc<AtomicUsize>) {
    let taken = Arc::new(AtomicUsize::new(0));
    let counter = taken.clone();
    let mut draws = draws.into_iter();
    let source = move || {
        counter.fetch_add(1, Relaxed);
        draws.next().expect("a draw the test did not expect")
    };
    (Draws::from_source(source), taken)
}

/// A clock that stands still, a second after its start.
fn still() -> Clock {
    let (clock, time) = Clock::mock();
    time.advance(Duration::from_secs(1));
    clock
}

/// A full-scan balancer over `weights.len()` endpoints keyed 0.. (on a clock that stands still) drawing
/// `draws` in order, and how many draws it has taken.
fn scripted(draws: Vec<u64>, weights: &[u32]) -> (Balancer<u32, Endpoint>, Arc<AtomicUsize>) {
    let (draws, taken) = script(draws);
    let mut balance = Balancer::with_draws(Strategy::LeastInflight, draws).with_clock(still());
    for (key, &weight) in (0u32..).zip(weights) {
        balance.insert(key, weight, endpoint());
    }
    (balance, taken)
}

/// Claims `key` `times` times (a pick made for it: every other endpoint excluded).
fn hold(balance: &mut Balancer<u32, Endpoint>, key: u32, times: usize) -> Vec<LoadGuard> {
    let others: Vec<u32> = (0..balance.len() as u32).filter(|&k| k != key).collect();
    (0..times)
        .map(|_| {
            let (&got, _, guard) = balance
                .pick_and_claim_excluding(&others)
                .expect("the one left");
            assert_eq!(got, key);
            guard
        })
        .collect()
}

#[test]
fn the_minimum_wins_after_exactly_one_read_per_endpoint_and_no_draw() {
    let (mut balance, taken) = scripted(vec![], &[1; 5]);
    // Loads 2, 1, 3, 0, 1: endpoint 3 is the only minimum.
    let _held: Vec<_> = [(0, 2), (1, 1), (2, 3), (4, 1)]
        .into_iter()
        .flat_map(|(key, times)| hold(&mut balance, key, times))
        .collect();
    let before = balance.stats();
    for _ in 0..3 {
        assert_eq!(*balance.pick().expect("eligible"), 3);
    }
    let after = balance.stats();
    assert_eq!(
        after.load_reads - before.load_reads,
        3 * 5,
        "n reads per pick"
    );
    assert_eq!(after.ties, before.ties);
    assert_eq!(taken.load(Relaxed), 0, "no tie, no draw");
}

#[test]
fn a_tie_takes_exactly_one_draw_which_decides_among_the_minimums() {
    // Loads 1, 0, 1, 0: endpoints 1 and 3 tie; draw 5 % 2 = 1 takes the second of them, 4 the first.
    let (mut balance, taken) = scripted(vec![5, 4], &[1; 4]);
    let _held: Vec<_> = [0, 2]
        .into_iter()
        .flat_map(|key| hold(&mut balance, key, 1))
        .collect();
    assert_eq!(*balance.pick().expect("eligible"), 3);
    assert_eq!(taken.load(Relaxed), 1, "one draw per tie");
    assert_eq!(*balance.pick().expect("eligible"), 1);
    assert_eq!(taken.load(Relaxed), 2);
    assert_eq!(balance.stats().ties, 2);
}

#[test]
fn a_seeded_balancer_settles_ties_the_same_way_every_time() {
    let picks = |seed| {
        let mut balance = Balancer::with_seed(Strategy::LeastInflight, seed).with_clock(still());
        for key in 0..6u32 {
            balance.insert(key, 1, endpoint());
        }
        (0..64)
            .map(|_| *balance.pick().expect("eligible"))
            .collect::<Vec<_>>()
    };
    let first = picks(7);
    assert_eq!(first, picks(7));
    assert!((0..6).all(|key| first.contains(&key)), "{first:?}");
}

#[test]
fn one_candidate_takes_no_draw_and_no_read_and_none_is_an_error() {
    let (mut balance, taken) = scripted(vec![], &[1, 1]);
    balance.set_eligible(&0, false);
    assert_eq!(*balance.pick().expect("one eligible"), 1);
    assert_eq!((balance.stats().load_reads, taken.load(Relaxed)), (0, 0));
    balance.set_eligible(&1, false);
    assert_eq!(balance.pick().err(), Some(NoEligibleEndpoint));
    assert_eq!(balance.stats().no_eligible, 1);
}

#[test]
fn ineligible_weight_zero_and_excluded_endpoints_are_never_read_or_picked() {
    let (mut balance, taken) = scripted(vec![], &[1; 5]);
    // Loads 1, 1, 1, 0, 0: 3 and 4 are the lightest, and out of reach.
    let _held: Vec<_> = [0, 1, 2]
        .into_iter()
        .flat_map(|key| hold(&mut balance, key, 1))
        .collect();
    let _more = hold(&mut balance, 1, 1);
    balance.set_eligible(&3, false);
    balance.set_weight(&4, 0);
    let before = balance.stats().load_reads;
    // Loads left 1, 2, 1 for 0, 1, 2; a retry that tried 0 reads 1 and 2 only, and 2 wins.
    let (&key, _, _guard) = balance.pick_and_claim_excluding(&[0]).expect("eligible");
    assert_eq!(key, 2);
    assert_eq!(balance.stats().load_reads - before, 2);
    assert_eq!(taken.load(Relaxed), 0);
}

#[test]
fn loads_are_divided_by_weight_and_ties_drawn_by_weight() {
    // Weights 3 and 1, idle: a tie; one draw on the line of 4,000 thousandths: under 3,000 is endpoint 0.
    let (mut balance, taken) = scripted(vec![2_999, 3_000, 7_500], &[3, 1]);
    assert_eq!(*balance.pick().expect("eligible"), 0);
    assert_eq!(*balance.pick().expect("eligible"), 1);
    assert_eq!(taken.load(Relaxed), 2);
    // Endpoint 0 at 2 in flight (2/3) is lighter than endpoint 1 at 1 (1/1): no draw.
    let _held: Vec<_> = [(0, 2), (1, 1)]
        .into_iter()
        .flat_map(|(key, times)| hold(&mut balance, key, times))
        .collect();
    assert_eq!(*balance.pick().expect("eligible"), 0);
    assert_eq!(taken.load(Relaxed), 2);
    // At 3 in flight (3/3) it ties with endpoint 1 (1/1) again: 7,500 % 4,000 = 3,500 is endpoint 1's.
    let _third = hold(&mut balance, 0, 1);
    assert_eq!(*balance.pick().expect("eligible"), 1);
    assert_eq!(taken.load(Relaxed), 3);
}

/// `least_inflight`'s metric: equal counts ordered by each endpoint's latency average.
mod latency_order {
    use super::*;
    use duet_balance::MockTime;

    /// A full scan under `least_inflight` on a mock clock over `n` endpoints drawing `draws` in
    /// order, how many draws it has taken, and the clock's hand.
    fn balancer(n: u32, draws: Vec<u64>) -> (Balancer<u32, Endpoint>, Arc<AtomicUsize>, MockTime) {
        let (clock, time) = Clock::mock();
        time.advance(Duration::from_secs(1));
        let (draws, taken) = script(draws);
        let mut balance = Balancer::with_draws(Strategy::LeastInflight, draws).with_clock(clock);
        for key in 0..n {
            balance.insert(key, 1, endpoint());
        }
        (balance, taken, time)
    }

    #[test]
    fn equal_counts_go_to_the_faster_average_without_a_draw_and_counts_still_come_first() {
        let (mut balance, taken, time) = balancer(3, vec![]);
        // One answered request each, a minute (6 τ) after the start, so that each average is close to
        // its one sample: endpoint 1 in 5 ms, 2 in 20 ms, 0 in 80 ms.
        time.advance(Duration::from_secs(60));
        for (key, rtt) in [(1u32, 5), (2, 20), (0, 80)] {
            let others: Vec<u32> = (0..3).filter(|&k| k != key).collect();
            let (_, _, guard) = balance.pick_and_claim_excluding(&others).expect("one left");
            time.advance(Duration::from_millis(rtt));
            drop(guard);
        }
        let before = balance.stats();
        // All idle: the fastest average wins.
        let (&first, _, hold_first) = balance.pick_and_claim().expect("eligible");
        assert_eq!(first, 1);
        // Endpoint 1 holds one: a lower count beats any average, and 2 is faster than 0.
        let (&second, _, hold_second) = balance.pick_and_claim().expect("eligible");
        assert_eq!(second, 2);
        let (&third, _, _hold_third) = balance.pick_and_claim().expect("eligible");
        assert_eq!(third, 0);
        // All at one in flight: the averages order them again.
        assert_eq!(*balance.pick().expect("eligible"), 1);
        drop((hold_first, hold_second));
        let after = balance.stats();
        assert_eq!(
            after.load_reads - before.load_reads,
            4 * 3,
            "n reads per pick"
        );
        assert_eq!(after.ties, before.ties, "no exact tie");
        assert_eq!(taken.load(Relaxed), 0, "no tie, no draw");
    }

    #[test]
    fn exactly_equal_averages_take_one_draw() {
        // Fresh endpoints share the initial estimate: idle and equal, one draw per pick
        // (5 % 3 = 2, then 3 % 3 = 0).
        let (mut balance, taken, _time) = balancer(3, vec![5, 3]);
        assert_eq!(*balance.pick().expect("eligible"), 2);
        assert_eq!(*balance.pick().expect("eligible"), 0);
        assert_eq!(taken.load(Relaxed), 2);
        assert_eq!(balance.stats().ties, 2);
    }
}
