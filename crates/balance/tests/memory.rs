//! `p2c_memory_inflight` (P2C with memory): the endpoints requests completed on since the last pick
//! (the last two) are the next pick's candidates, once; exactly two load reads per pick either way.

use duet_balance::{Balancer, Draws, Strategy};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
};
use tower::service_fn;

type Events = Arc<Mutex<Vec<([u32; 2], u32)>>>;

/// A balancer over endpoints 0..4 (in flight metric) drawing exactly `draws`, in order, and recording
/// each comparison's candidates and winner.
fn scripted(
    draws: Vec<u64>,
) -> (
    Balancer<u32, impl tower::Service<u32, Response = u32, Error = Infallible>>,
    Events,
) {
    let mut draws = draws.into_iter();
    let source = move || draws.next().expect("the test scripted every draw");
    let events: Events = Arc::default();
    let seen = events.clone();
    let mut balance = Balancer::with_draws(Strategy::P2cMemoryInflight, Draws::from_source(source))
        .with_observer(move |event| {
            let keys = [*event.candidates[0].0, *event.candidates[1].0];
            seen.lock().expect("lock").push((keys, *event.chosen));
        });
    for k in 0..4u32 {
        balance.insert(k, 1, service_fn(|x: u32| std::future::ready(Ok(x))));
    }
    (balance, events)
}

#[test]
fn the_endpoint_that_completed_last_is_one_candidate_once() {
    let (mut balance, events) = scripted(vec![
        // No completion yet: plain P2C. 0 vs 1 (tie, even coin) -> 0; 0 vs 1 -> 1; 2 vs 1 -> 2.
        0, 0, 2, 0, 0, 2, 1,
        // Endpoint 1 completed: 1 (load 0) against draw 0 % 3 = 0 -> endpoint 0 (load 1); one draw.
        0,
        // Nothing completed since: plain P2C again, two draws. 3 (load 0) vs 0 (load 1) -> 3.
        3, 0,
    ]);
    let mut guards = Vec::new();
    for _ in 0..3 {
        let (&key, _, guard) = balance.pick_and_claim().expect("eligible");
        guards.push((key, guard));
    }
    assert_eq!(
        guards.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    guards.remove(1);
    let (&remembered, _, _kept) = balance.pick_and_claim().expect("eligible");
    assert_eq!(remembered, 1);
    let (&fresh, _, _also) = balance.pick_and_claim().expect("eligible");
    assert_eq!(fresh, 3);
    let events = events.lock().expect("lock").clone();
    assert_eq!(
        events[3..],
        [([1, 0], 1), ([3, 0], 3)],
        "the remembered endpoint is the first candidate, once"
    );
    assert_eq!(balance.stats().picks, 5);
    assert_eq!(balance.stats().load_reads, 10, "two load reads per pick");
}

#[test]
fn the_remembered_endpoint_loses_to_a_lighter_fresh_candidate() {
    let (mut balance, events) = scripted(vec![
        // 0 vs 1 tie, even coin -> 0; 0 vs 1 -> 1; 2 vs 1 -> 2; 1 vs 2 tie, even coin -> 1.
        0, 0, 2, 0, 0, 2, 1, 1, 1, 0,
        // Endpoint 1 completed one of its two: 1 (load 1) against draw 2 % 3 = 2 -> endpoint 3 (load 0).
        2,
    ]);
    let mut guards: Vec<_> = (0..4)
        .map(|_| {
            let (&key, _, guard) = balance.pick_and_claim().expect("eligible");
            (key, guard)
        })
        .collect();
    assert_eq!(
        guards.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        [0, 1, 2, 1]
    );
    guards.remove(1);
    let (&chosen, _, _guard) = balance.pick_and_claim().expect("eligible");
    assert_eq!(chosen, 3);
    assert_eq!(events.lock().expect("lock")[4], ([1, 3], 3));
    assert_eq!(balance.stats().load_reads, 10);
}

#[test]
fn two_completions_make_both_candidates_without_a_draw() {
    let (mut balance, events) = scripted(vec![
        // As above: 0, 1, 2, then 1 again (in flight 1, 2, 1, 0).
        0, 0, 2, 0, 0, 2, 1, 1, 1,
        0,
        // Endpoints 1 then 0 complete: 0 (load 0) against 1 (load 1), no draw -> 0.
    ]);
    let mut guards: Vec<_> = (0..4)
        .map(|_| {
            let (&key, _, guard) = balance.pick_and_claim().expect("eligible");
            (key, guard)
        })
        .collect();
    guards.remove(1);
    guards.remove(0);
    let (&chosen, _, _guard) = balance.pick_and_claim().expect("eligible");
    assert_eq!(chosen, 0);
    assert_eq!(events.lock().expect("lock")[4], ([0, 1], 0));
    assert_eq!(balance.stats().load_reads, 10);
}

#[test]
fn a_retry_keeps_the_memory_for_the_next_first_pick() {
    let (mut balance, events) = scripted(vec![
        // 0 vs 1 tie, even coin -> 0.
        0, 0, 2,
        // Retry without 0: draws 1, 1 give ranks 1 and 2 of 1, 2, 3: endpoints 2 and 3, tie, even coin -> 2.
        1, 1, 0,
        // First pick: remembered 0 against draw 0 % 3 = 0 -> endpoint 1; tie, odd coin -> 1.
        0, 1,
    ]);
    let (_, _, first) = balance.pick_and_claim().expect("eligible");
    drop(first);
    let (&retried, _, _r) = balance.pick_and_claim_excluding(&[0]).expect("eligible");
    assert_eq!(retried, 2);
    let (&next, _, _n) = balance.pick_and_claim().expect("eligible");
    assert_eq!(next, 1);
    let events = events.lock().expect("lock").clone();
    assert_eq!(
        events[2],
        ([0, 1], 1),
        "endpoint 0 is remembered after the retry"
    );
}
