//! The in-flight count moves up once per request and back down exactly once, whatever ends the request.

use bytes::Bytes;
use duet_balance::{Balancer, CompleteOnBodyEnd, NoEligibleEndpoint, Strategy};
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use proptest::prelude::*;
use std::{
    collections::VecDeque,
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};
use tower::{service_fn, Service, ServiceExt};

/// A response body that yields scripted frames, then ends or fails.
#[derive(Debug)]
struct Scripted {
    frames: VecDeque<Bytes>,
    fail_at_end: bool,
}

impl Body for Scripted {
    type Data = Bytes;
    type Error = &'static str;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.frames.pop_front() {
            Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
            None if self.fail_at_end => Poll::Ready(Some(Err("backend died mid-body"))),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && !self.fail_at_end
    }
}

#[derive(Debug, Clone, Copy)]
enum Ending {
    /// The body is read to its end.
    BodyEnd,
    /// The body fails after its frames.
    BodyError,
    /// The body is dropped after the first frame.
    BodyDroppedMidStream,
    /// The response future is dropped before it resolves.
    FutureDropped,
    /// The inner service fails (e.g. connect refused).
    InnerError,
}

fn ending() -> impl proptest::strategy::Strategy<Value = Ending> {
    prop_oneof![
        Just(Ending::BodyEnd),
        Just(Ending::BodyError),
        Just(Ending::BodyDroppedMidStream),
        Just(Ending::FutureDropped),
        Just(Ending::InnerError),
    ]
}

type Request = (Ending, usize);

fn backend() -> impl Service<
    Request,
    Response = http::Response<Scripted>,
    Error = &'static str,
    Future = impl Future<Output = Result<http::Response<Scripted>, &'static str>>,
> + Clone {
    service_fn(|(ending, frames): Request| async move {
        if let Ending::InnerError = ending {
            return Err("connection refused");
        }
        if let Ending::FutureDropped = ending {
            std::future::pending::<()>().await;
        }
        let body = Scripted {
            frames: (0..frames)
                .map(|i| Bytes::from(vec![b'x'; i + 1]))
                .collect(),
            fail_at_end: matches!(ending, Ending::BodyError),
        };
        Ok(http::Response::new(body))
    })
}

fn in_flight<K: std::hash::Hash + Eq + Clone, S, C>(balance: &Balancer<K, S, C>) -> u64 {
    balance.endpoints().map(|e| e.load.in_flight()).sum()
}

/// Runs one request to completion along `ending` and checks the count went 0 → 1 → 0.
async fn run(ending: Ending, frames: usize, metric: Strategy) {
    let mut balance = Balancer::new(metric).with_completion(CompleteOnBodyEnd::default());
    balance.insert("a", 1, backend());
    balance.insert("b", 1, backend());
    let svc = balance.ready().await.expect("ready");
    let mut future = Box::pin(svc.call((ending, frames)));
    assert_eq!(
        in_flight(&balance),
        1,
        "counted before the inner service resolves"
    );

    match ending {
        Ending::FutureDropped => {
            let waker = std::task::Waker::noop();
            assert!(future
                .as_mut()
                .poll(&mut Context::from_waker(waker))
                .is_pending());
            assert_eq!(in_flight(&balance), 1);
            drop(future);
        }
        Ending::InnerError => {
            assert!(future.await.is_err());
        }
        Ending::BodyEnd | Ending::BodyError => {
            let response = future.await.expect("response");
            assert_eq!(
                in_flight(&balance) as usize,
                usize::from(frames > 0 || matches!(ending, Ending::BodyError))
            );
            let collected = response.into_body().collect().await;
            assert_eq!(collected.is_err(), matches!(ending, Ending::BodyError));
        }
        Ending::BodyDroppedMidStream => {
            let mut body = future.await.expect("response").into_body();
            if frames > 1 {
                let _first = body.frame().await;
                assert_eq!(in_flight(&balance), 1, "still streaming");
            }
            drop(body);
        }
    }
    assert_eq!(in_flight(&balance), 0, "{ending:?} with {frames} frames");
    let waiting: u64 = balance.endpoints().map(|e| e.load.waiting()).sum();
    assert_eq!(
        waiting, 0,
        "no sample still awaited: {ending:?} with {frames} frames"
    );
}

#[tokio::test]
async fn every_ending_releases_exactly_once() {
    for ending in [
        Ending::BodyEnd,
        Ending::BodyError,
        Ending::BodyDroppedMidStream,
        Ending::FutureDropped,
        Ending::InnerError,
    ] {
        for frames in [0, 1, 3] {
            run(ending, frames, Strategy::P2cInflight).await;
            run(ending, frames, Strategy::P2cPeakEwma).await;
        }
    }
}

proptest! {
    /// Many requests in flight at once, ended in any order along any path: each ending lowers the count by
    /// exactly one, and it returns to zero. A double release would wrap the counter; a missed one leaves it
    /// above zero.
    #[test]
    fn interleaved_endings_move_the_count_one_step_each(
        endings in proptest::collection::vec(ending(), 1..12),
        order in proptest::collection::vec(any::<u32>(), 12),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(async {
            let mut balance = Balancer::new(Strategy::P2cInflight).with_completion(CompleteOnBodyEnd::default());
            balance.insert("only", 1, backend());
            let waker = std::task::Waker::noop();
            let mut cx = Context::from_waker(waker);
            let mut pending = Vec::new();
            for &ending in &endings {
                let svc = balance.ready().await.expect("ready");
                let mut future = Box::pin(svc.call((ending, 2)));
                // Resolve what can resolve now; bodies stay open until we end them.
                let resolved = match future.as_mut().poll(&mut cx) {
                    Poll::Ready(result) => Some(result),
                    Poll::Pending => None,
                };
                pending.push((ending, future, resolved));
            }
            let mut expected = endings.len() as u64 - endings.iter().filter(|e| matches!(e, Ending::InnerError)).count() as u64;
            prop_assert_eq!(in_flight(&balance), expected);
            let mut order_iter = order.into_iter();
            while !pending.is_empty() {
                let at = order_iter.next().unwrap_or(0) as usize % pending.len();
                let (ending, future, resolved) = pending.swap_remove(at);
                match (ending, resolved) {
                    (Ending::InnerError, _) => continue,
                    (_, None) => drop(future),
                    (Ending::BodyDroppedMidStream, Some(Ok(response))) => drop(response),
                    (_, Some(Ok(response))) => { let _ = response.into_body().collect().await; }
                    (_, Some(Err(e))) => panic!("unexpected error {e}"),
                }
                expected -= 1;
                prop_assert_eq!(in_flight(&balance), expected);
            }
            prop_assert_eq!(in_flight(&balance), 0);
            Ok(())
        })?;
    }
}

#[tokio::test]
async fn an_empty_pool_answers_no_eligible_endpoint() {
    let mut balance: Balancer<&str, _> = Balancer::new(Strategy::P2cInflight);
    let svc = balance
        .ready()
        .await
        .expect("an empty balancer is ready, to answer with the error");
    let error = svc.call(1u32).await.expect_err("no endpoint");
    assert!(
        error.downcast_ref::<NoEligibleEndpoint>().is_some(),
        "{error}"
    );
    balance.insert(
        "late",
        1,
        service_fn(|x: u32| async move { Ok::<_, Infallible>(x) }),
    );
    assert_eq!(
        balance
            .ready()
            .await
            .expect("ready")
            .call(7)
            .await
            .expect("served"),
        7
    );
    assert_eq!(balance.stats().no_eligible, 1);
}

#[test]
fn pick_and_claim_excluding_never_picks_an_excluded_key_and_claims_the_winner() {
    let mut balance: Balancer<&str, ()> = Balancer::with_seed(Strategy::P2cInflight, 7);
    for key in ["a", "b", "c", "d"] {
        balance.insert(key, 1, ());
    }
    let mut guards = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..200 {
        let reads = balance.stats().load_reads;
        let (key, (), guard) = balance
            .pick_and_claim_excluding(&["a", "c"])
            .expect("b and d are left");
        assert!(*key == "b" || *key == "d", "picked {key}");
        seen.insert(*key);
        assert_eq!(
            balance.stats().load_reads - reads,
            2,
            "two loads read per pick"
        );
        guards.push(guard);
    }
    assert_eq!(seen.len(), 2, "both remaining keys are picked");
    let load = |key: &'static str| balance.endpoint_load(&key).expect("member").in_flight();
    assert_eq!((load("a"), load("c")), (0, 0));
    assert_eq!(load("b") + load("d"), 200, "every pick is claimed as load");
    assert!(
        load("b").abs_diff(load("d")) <= 1,
        "P2C on in-flight keeps them level"
    );
    drop(guards);
    assert_eq!(load("b") + load("d"), 0, "each guard released once");

    // Excluding all but one takes no comparison; excluding all is NoEligibleEndpoint.
    let reads = balance.stats().load_reads;
    let (key, (), _guard) = balance
        .pick_and_claim_excluding(&["a", "b", "c"])
        .expect("d is left");
    assert_eq!((*key, balance.stats().load_reads - reads), ("d", 0));
    assert_eq!(
        balance
            .pick_and_claim_excluding(&["a", "b", "c", "d"])
            .map(|(k, _, _)| *k)
            .err(),
        Some(NoEligibleEndpoint)
    );
}

#[test]
fn set_eligible_reports_the_previous_flag_which_metrics_read_through_the_load() {
    let mut balance: Balancer<&str, ()> = Balancer::with_seed(Strategy::P2cInflight, 1);
    balance.insert("a", 1, ());
    let load = balance.endpoint_load(&"a").expect("a").clone();
    assert!(load.is_eligible());
    assert_eq!(balance.set_eligible(&"a", false), Some(true));
    assert!(
        !load.is_eligible(),
        "the flag a metrics reader holds moved too"
    );
    assert_eq!(balance.set_eligible(&"a", false), Some(false));
    assert_eq!(balance.eligible_len(), 0);
    assert_eq!(balance.set_eligible(&"missing", true), None);
}
