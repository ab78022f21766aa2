//! Keyed picks: consistent hashing (Maglev) with bounded loads, the walk past a full home, retries,
//! and agreement between balancers that share nothing.

use duet_balance::{algo::stable_hash, Affinity, Balancer, LoadGuard, Strategy, Walk};
use std::collections::HashMap;

fn balancer(names: &[u32], affinity: Affinity) -> Balancer<u32, ()> {
    let mut balance = Balancer::new(Strategy::P2cInflight).with_affinity(affinity);
    for &name in names {
        balance.insert(name, 1, ());
    }
    balance
}

/// Where each of `keys` goes from an idle balancer.
fn homes(balance: &mut Balancer<u32, ()>, keys: u64) -> Vec<u32> {
    (0..keys)
        .map(|k| balance.pick_for(Some(stable_hash(&k))).copied())
        .collect::<Result<_, _>>()
        .unwrap_or_default()
}

#[test]
fn two_balancers_and_a_restart_send_a_key_to_the_same_endpoint() {
    let names: Vec<u32> = (0..10).collect();
    let mut first = balancer(&names, Affinity::maglev());
    let mut reversed: Vec<u32> = names.clone();
    reversed.reverse();
    // Another worker: its own OS-seeded generator, endpoints added in another order, one removed and
    // added back (positions moved).
    let mut second = balancer(&reversed, Affinity::maglev());
    second.remove(&3);
    second.insert(3, 1, ());
    let expected = homes(&mut first, 2_000);
    assert_eq!(expected.len(), 2_000);
    assert_eq!(homes(&mut second, 2_000), expected);
    // A restart: a new balancer, nothing carried over.
    drop(first);
    assert_eq!(
        homes(&mut balancer(&names, Affinity::maglev()), 2_000),
        expected
    );
    // Pinned: a change of hash or table moves every deployed key, so it must be deliberate.
    assert_eq!(&expected[..8], [3, 1, 2, 9, 6, 9, 5, 9]);
}

#[test]
fn an_ineligible_endpoint_moves_only_its_keys_and_a_removed_one_little_more() {
    let names: Vec<u32> = (0..10).collect();
    let before = homes(&mut balancer(&names, Affinity::maglev()), 20_000);
    let of_seven = before.iter().filter(|&&b| b == 7).count();
    // Ineligible (unhealthy, ejected): the table keeps it and the walk skips it, so exactly its keys
    // move, and coming back restores every key.
    let mut flapping = balancer(&names, Affinity::maglev());
    flapping.set_eligible(&7, false);
    let skipped = homes(&mut flapping, 20_000);
    for (b, a) in before.iter().zip(&skipped) {
        assert!(b == a || *b == 7, "a key of {b} moved to {a}");
        assert_ne!(*a, 7);
    }
    flapping.set_eligible(&7, true);
    assert_eq!(homes(&mut flapping, 20_000), before);
    // Removed: the table is rebuilt; Maglev moves a few other keys too (its ideal is 1/n of them).
    let mut fewer = balancer(&names, Affinity::maglev());
    fewer.remove(&7);
    let after = homes(&mut fewer, 20_000);
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    assert!(after.iter().all(|&a| a != 7));
    println!("removed 1 of 10: {moved} of 20,000 keys moved, {of_seven} were its own");
    assert!(moved as f64 <= 1.1 * 20_000.0 / 10.0, "{moved} moved");
}

#[test]
fn keys_split_by_weight() {
    let mut balance = Balancer::new(Strategy::P2cInflight).with_affinity(Affinity::maglev());
    balance.insert(1u32, 3, ());
    balance.insert(2u32, 1, ());
    let served = homes(&mut balance, 40_000);
    let heavy = served.iter().filter(|&&b| b == 1).count();
    assert!((29_000..31_000).contains(&heavy), "{heavy} of 40,000");
}

/// Claims `n` requests for `key` and keeps them in flight.
fn claim(
    balance: &mut Balancer<u32, ()>,
    key: u64,
    n: usize,
    held: &mut Vec<LoadGuard>,
) -> Vec<u32> {
    (0..n)
        .filter_map(|_| {
            let (name, _, guard) = balance.pick_and_claim_for(Some(key), &[]).ok()?;
            let name = *name;
            held.push(guard);
            Some(name)
        })
        .collect()
}

fn in_flight(balance: &Balancer<u32, ()>) -> HashMap<u32, u64> {
    balance
        .endpoints()
        .map(|e| (*e.key, e.load.in_flight()))
        .collect()
}

#[test]
fn a_hot_key_fills_its_home_to_the_bound_then_spills() {
    for walk in [Walk::Next, Walk::P2c] {
        let names: Vec<u32> = (0..10).collect();
        let mut balance = balancer(&names, Affinity::maglev().with_walk(walk));
        let mut held = Vec::new();
        // Background: one request for each of 100 cold keys, then 200 for one hot key.
        for k in 0..100u64 {
            claim(&mut balance, stable_hash(&(k + 1_000)), 1, &mut held);
        }
        let hot = stable_hash("hot");
        let home = balance.pick_for(Some(hot)).copied().ok();
        let walked_before = balance.stats().walked;
        let served = claim(&mut balance, hot, 200, &mut held);
        let loads = in_flight(&balance);
        let total: u64 = loads.values().sum();
        assert_eq!(total, 300);
        let bound = (1.25 * 300.0 / 10.0f64).ceil() as u64;
        let busiest = loads.values().copied().max().unwrap_or(0);
        assert!(busiest <= bound, "{walk:?}: {loads:?} over {bound}");
        // The home is full to the bound; the spill went elsewhere, and the walk's stats count it.
        assert_eq!(home.map(|h| loads[&h]), Some(bound), "{walk:?}");
        let at_home = served.iter().filter(|&&b| Some(b) == home).count() as u64;
        assert_eq!(balance.stats().walked - walked_before, 200 - at_home);
        drop(held);
        assert_eq!(in_flight(&balance).values().sum::<u64>(), 0);
    }
}

#[test]
fn without_a_bound_the_hot_key_stays_home() {
    let names: Vec<u32> = (0..10).collect();
    let mut balance = balancer(&names, Affinity::maglev().unbounded());
    let mut held = Vec::new();
    let served = claim(&mut balance, stable_hash("hot"), 50, &mut held);
    assert!(served.iter().all(|&b| b == served[0]));
    assert_eq!(balance.stats().walked, 0);
}

#[test]
fn a_retry_goes_to_the_keys_next_candidate_never_back() {
    let names: Vec<u32> = (0..10).collect();
    let mut balance = balancer(&names, Affinity::maglev().with_walk(Walk::Next));
    let key = stable_hash("user-7");
    let walk: Vec<u32> = {
        let table = duet_balance::algo::Maglev::new(
            &names
                .iter()
                .map(|n| (stable_hash(n), 1))
                .collect::<Vec<_>>(),
            65_537,
        );
        table.walk(key).map(|slot| names[slot as usize]).collect()
    };
    let mut tried = Vec::new();
    for expected in walk.iter().take(4) {
        let picked = balance
            .pick_and_claim_for(Some(key), &tried)
            .map(|(n, _, _)| *n);
        assert_eq!(picked, Ok(*expected));
        tried.push(*expected);
    }
    // Every endpoint tried: nothing left.
    assert!(balance.pick_and_claim_for(Some(key), &names).is_err());
}

#[test]
fn a_pick_without_a_key_is_the_policy_s() {
    let names: Vec<u32> = (0..10).collect();
    let mut balance = balancer(&names, Affinity::maglev());
    assert!(balance.pick_for(None).is_ok());
    assert_eq!(balance.stats().load_reads, 2, "P2C reads two loads");
    assert!(balance.pick_for(Some(1)).is_ok());
    assert_eq!(
        balance.stats().load_reads,
        2,
        "a keyed pick compares nothing by P2C"
    );
    let mut empty: Balancer<u32, ()> =
        Balancer::new(Strategy::P2cInflight).with_affinity(Affinity::maglev());
    assert!(empty.pick_for(Some(1)).is_err());
}

/// A sticky session's endpoint: taken while eligible and not excluded, counted as load like any pick
/// (the key's table too), and never in panic mode when it is the ineligible one.
#[test]
fn a_preferred_endpoint_is_claimed_while_eligible_and_counted_as_load() {
    let mut balance = balancer(&[1, 2, 3, 4], Affinity::maglev());
    let key = Some(stable_hash("user-42"));
    let load = |balance: &Balancer<u32, ()>, at: u32| {
        balance
            .endpoint_load(&at)
            .map(|l| l.in_flight())
            .unwrap_or(u64::MAX)
    };
    let home = balance.pick_for(key).copied().unwrap_or_default();
    let other = if home == 1 { 2 } else { 1 };
    let mut guards: Vec<LoadGuard> = Vec::new();
    for i in 0..20u64 {
        let (picked, _, guard) = (balance.pick_and_claim_preferring(Some(&other), key, &[]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            *picked, other,
            "pick {i}: the preference beats the key and the bound"
        );
        guards.push(guard);
        assert_eq!(load(&balance, other), i + 1);
    }
    guards.clear();
    assert_eq!(load(&balance, other), 0, "released at drop");
    // Excluded (a retry): the key's pick, never the tried one.
    // Each guard dropped at once: the home stays under its bound.
    let pick = |balance: &mut Balancer<u32, ()>, prefer: u32, exclude: &[u32]| {
        (balance.pick_and_claim_preferring(Some(&prefer), key, exclude))
            .map(|(picked, _, _)| *picked)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(pick(&mut balance, other, &[other]), home);
    // Ineligible, and unknown: the key's pick.
    balance.set_eligible(&other, false);
    assert_eq!(pick(&mut balance, other, &[]), home);
    assert_eq!(pick(&mut balance, 99, &[]), home);
    // Panic mode makes every endpoint a candidate again; an ineligible preference still is not taken.
    let mut balance = balancer(&[1, 2, 3, 4], Affinity::maglev()).with_panic_threshold(0.5);
    for at in [1, 2, 3] {
        balance.set_eligible(&at, false);
    }
    // (P2C over all four may still draw it: the picks are spread, not bound to it.)
    let bound = (0..40)
        .filter(|_| {
            (balance.pick_and_claim_preferring(Some(&3), None, &[]))
                .map(|(picked, _, _)| *picked == 3)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .count();
    assert!(balance.is_panicking());
    assert!(bound < 30, "{bound} of 40 on the ineligible preference");
}
