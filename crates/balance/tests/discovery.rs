//! Weights carried through discovery: `Change::Insert` of a `Weighted` service sets the endpoint's
//! weight, and inserting the key again with another weight changes it without resetting its load state.

use duet_balance::{Balancer, DiscoverBalancer, Strategy, Weighted};
use std::{convert::Infallible, future::Ready, sync::Arc};
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
