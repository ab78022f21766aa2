//! What discovery carries: `Change::Insert` of a `Weighted` service sets the endpoint's weight,
//! inserting the key again with another weight changes it without resetting its load state, and the
//! key is the endpoint's id, the one keyed picks (affinity) hash.

use duet_balance::{
    algo::stable_hash, Affinity, Balancer, Clock, DiscoverBalancer, Strategy, Weighted,
};
use std::{convert::Infallible, future::poll_fn, future::Ready, sync::Arc, time::Duration};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};
use tower::{discover::Change, service_fn, util::ServiceFn, Service, ServiceExt};

type Endpoint = ServiceFn<Box<dyn FnMut(()) -> Ready<Result<&'static str, Infallible>> + Send>>;
type Announce = UnboundedSender<Result<Change<&'static str, Weighted<Endpoint>>, Infallible>>;

fn backend(name: &'static str) -> Endpoint {
    service_fn(Box::new(move |()| std::future::ready(Ok(name))))
}

/// The share of `n` sequential requests that "a" answered.
async fn share_of_a<S>(balance: &mut S, n: usize) -> f64
where
    S: Service<(), Response = &'static str>,
    S::Error: std::fmt::Debug,
{
    let mut a = 0;
    for _ in 0..n {
        let answer = balance.ready().await.expect("ready").call(()).await;
        a += usize::from(answer.expect("served") == "a");
    }
    a as f64 / n as f64
}

#[tokio::test]
async fn weights_from_discovery_hold_and_an_update_moves_the_share_keeping_load_state() {
    let (announce, mut announced) = unbounded_channel();
    let stream = futures_util::stream::poll_fn(move |cx| announced.poll_recv(cx));
    let mut balance =
        DiscoverBalancer::from_balance(stream, Balancer::with_seed(Strategy::P2cInflight, 7))
            .with_weights();
    let send = |change| {
        let sent: &Announce = &announce;
        sent.send(Ok(change)).expect("balancer alive");
    };
    send(Change::Insert("a", Weighted::new(backend("a"), 3)));
    send(Change::Insert("b", Weighted::new(backend("b"), 1)));

    let share = share_of_a(&mut balance, 8000).await;
    assert!((share - 0.75).abs() < 0.03, "3:1 gave {share}");

    let load = |balance: &DiscoverBalancer<_, _>, key| {
        balance
            .balance()
            .endpoints()
            .find(|e| *e.key == key)
            .map(|e| (e.weight, e.load.clone()))
            .expect("present")
    };
    let (weight, before) = load(&balance, "a");
    assert_eq!(weight, 3);
    let picks = before.picks();
    assert!(picks > 5000, "{picks}");

    // The same key, announced again with weight 1: no Remove, the load state stays.
    send(Change::Insert("a", Weighted::new(backend("a"), 1)));
    let share = share_of_a(&mut balance, 8000).await;
    assert!((share - 0.5).abs() < 0.03, "1:1 gave {share}");
    let (weight, after) = load(&balance, "a");
    assert_eq!(weight, 1);
    assert!(Arc::ptr_eq(&before, &after), "the load state was replaced");
    let expected = picks as f64 + share * 8000.0;
    assert_eq!(
        after.picks() as f64,
        expected.round(),
        "picks kept counting"
    );
    assert_eq!(balance.balance().len(), 2);
}

#[tokio::test]
async fn without_with_weights_an_insert_has_weight_one_and_a_reinsert_keeps_its_weight() {
    let stream = futures_util::stream::iter([
        Ok::<_, Infallible>(Change::Insert("a", Weighted::new(backend("a"), 3))),
        Ok(Change::Insert("b", Weighted::new(backend("b"), 5))),
    ]);
    let mut balance = DiscoverBalancer::new(stream, Strategy::P2cInflight);
    let handle = balance.handle();
    handle.set_weight("a", 2);
    let _ = share_of_a(&mut balance, 1).await;
    let weights: Vec<(&str, u32)> = balance
        .balance()
        .endpoints()
        .map(|e| (*e.key, e.weight))
        .collect();
    assert_eq!(weights, [("a", 2), ("b", 1)]);
}

#[tokio::test]
async fn a_weight_update_keeps_the_requests_in_flight_and_the_latency_estimate() {
    let (clock, time) = Clock::mock();
    let (announce, mut announced) = unbounded_channel();
    let stream = futures_util::stream::poll_fn(move |cx| announced.poll_recv(cx));
    let balancer = Balancer::with_seed(Strategy::P2cPeakEwma, 3).with_clock(clock);
    let mut balance = DiscoverBalancer::from_balance(stream, balancer).with_weights();
    let handle = balance.handle();
    let send = |change| {
        let sent: &Announce = &announce;
        sent.send(Ok(change)).expect("balancer alive");
    };
    send(Change::Insert("a", Weighted::new(backend("a"), 3)));
    send(Change::Insert("b", Weighted::new(backend("b"), 1)));
    handle.set_eligible("b", false);

    // One request of 10 ms answered, one still in flight, both on "a".
    let answered = balance.ready().await.expect("ready").call(());
    time.advance(Duration::from_millis(10));
    assert_eq!(answered.await.expect("served"), "a");
    let in_flight = balance.ready().await.expect("ready").call(());
    let a = || {
        let endpoints = handle.endpoints();
        let a = endpoints.iter().find(|e| e.key == "a").expect("a");
        (
            a.weight,
            a.load.in_flight(),
            a.load.picks(),
            a.load.rtt_estimate(),
        )
    };
    assert_eq!(a(), (3, 1, 2, Duration::from_millis(10)));

    send(Change::Insert("a", Weighted::new(backend("a"), 1)));
    poll_fn(|cx| balance.poll_changes(cx))
        .await
        .expect("stream alive");
    assert_eq!(
        a(),
        (1, 1, 2, Duration::from_millis(10)),
        "the weight changed, nothing else"
    );

    // The request started before the update completes on the same state: no count lost or doubled.
    time.advance(Duration::from_millis(20));
    assert_eq!(in_flight.await.expect("served"), "a");
    assert_eq!(a(), (1, 0, 2, Duration::from_millis(20)));
}

/// A balancer with keyed picks (Maglev), seeded with `seed`.
fn keyed<S>(seed: u64) -> Balancer<&'static str, S> {
    Balancer::with_seed(Strategy::P2cPeakEwma, seed).with_affinity(Affinity::maglev())
}

/// The home of each of 500 request keys, by keyed picks on `balance`.
fn homes<S>(balance: &mut Balancer<&'static str, S>) -> Vec<&'static str> {
    (0..500)
        .map(|user| {
            let key = stable_hash(&format!("user-{user}"));
            *balance.pick_for(Some(key)).expect("an endpoint")
        })
        .collect()
}

#[tokio::test]
async fn the_discovered_key_is_the_id_affinity_hashes_whatever_the_order_and_the_seed() {
    let weighted = [("a", 3), ("b", 1), ("c", 1), ("d", 1)];
    // Two balancers that discover the same endpoints, announced in opposite orders.
    let (announce, mut announced) = unbounded_channel();
    let stream = futures_util::stream::poll_fn(move |cx| announced.poll_recv(cx));
    let mut forward = DiscoverBalancer::from_balance(stream, keyed(1)).with_weights();
    for (name, weight) in weighted {
        let sent: &Announce = &announce;
        sent.send(Ok(Change::Insert(
            name,
            Weighted::new(backend(name), weight),
        )))
        .expect("balancer alive");
    }
    let reversed = weighted.into_iter().rev().map(|(name, weight)| {
        Ok::<_, Infallible>(Change::Insert(name, Weighted::new(backend(name), weight)))
    });
    let stream = futures_util::stream::iter(reversed.collect::<Vec<_>>());
    let mut backward = DiscoverBalancer::from_balance(stream, keyed(2)).with_weights();
    // And one whose owner inserted them.
    let mut owned = keyed(3);
    for (name, weight) in weighted {
        owned.insert(name, weight, ());
    }

    poll_fn(|cx| forward.poll_changes(cx)).await.expect("alive");
    poll_fn(|cx| backward.poll_changes(cx))
        .await
        .expect("alive");
    let expected = homes(&mut owned);
    assert_eq!(homes(forward.balance_mut()), expected);
    assert_eq!(homes(backward.balance_mut()), expected);
    let on_a = expected.iter().filter(|home| **home == "a").count();
    assert!(
        (240..=260).contains(&on_a),
        "weight 3 of 6 is half the keys' homes: {on_a} of 500"
    );

    // A removal through the stream reaches the table too.
    let sent: &Announce = &announce;
    sent.send(Ok(Change::Remove("b"))).expect("balancer alive");
    poll_fn(|cx| forward.poll_changes(cx)).await.expect("alive");
    owned.remove(&"b");
    let expected = homes(&mut owned);
    assert!(!expected.contains(&"b"));
    assert_eq!(homes(forward.balance_mut()), expected);

    // A keyed pick claims its home, and the request goes there.
    let key = stable_hash("user-7");
    let home = *owned.pick_for(Some(key)).expect("an endpoint");
    let (_, service, guard) = forward
        .balance_mut()
        .pick_and_claim_for(Some(key), &[])
        .expect("an endpoint");
    let served = service.ready().await.expect("ready").call(()).await;
    assert_eq!(served.expect("served"), home);
    assert_eq!(guard.endpoint_load().in_flight(), 1);
    drop(guard);
    assert_eq!(
        forward
            .balance()
            .endpoint_load(&home)
            .map(|l| l.in_flight()),
        Some(0)
    );
}
