//! A `BalanceHandle` reads a balancer's counters and endpoints and sets weights and eligibility while
//! the balancer sits in a `tower::buffer::Buffer` shared by 8 tasks, for `Balancer` and
//! `DiscoverBalancer` alike.

use duet_balance::{BalanceHandle, Balancer, DiscoverBalancer, Strategy};
use futures_util::StreamExt;
use std::{collections::HashMap, convert::Infallible, time::Duration};
use tower::{buffer::Buffer, discover::Change, service_fn, util::BoxService, Service, ServiceExt};

type Endpoint = BoxService<(), &'static str, Infallible>;

/// An endpoint that answers its name after yielding once (so requests overlap).
fn backend(name: &'static str) -> Endpoint {
    BoxService::new(service_fn(move |()| async move {
        tokio::task::yield_now().await;
        Ok::<_, Infallible>(name)
    }))
}

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

/// 8 tasks, each sending `per_task` requests through its clone of `buffer`; the answers by endpoint.
async fn eight_tasks<S>(buffer: &Buffer<(), S>, per_task: usize) -> HashMap<&'static str, usize>
where
    S: std::future::Future<Output = Result<&'static str, duet_balance::BoxError>> + Send + 'static,
{
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut client = buffer.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::with_capacity(per_task);
            for _ in 0..per_task {
                let answer = client.ready().await.expect("ready").call(()).await;
                answers.push(answer.expect("served"));
            }
            answers
        }));
    }
    let mut by_name = HashMap::new();
    for task in tasks {
        for name in task.await.expect("task") {
            *by_name.entry(name).or_insert(0) += 1;
        }
    }
    by_name
}

/// Reads the handle until `rounds` reads are done, checking what must hold at any moment.
fn watch(handle: BalanceHandle<&'static str>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut last = 0;
        for _ in 0..200 {
            let stats = handle.stats();
            assert!(stats.picks >= last, "picks went back: {stats:?}");
            // Read while picks go on: the pick under way may be counted without its two reads yet,
            // and picks made between the two counters' reads add reads only.
            assert!(stats.load_reads + 2 >= 2 * stats.picks, "{stats:?}");
            last = stats.picks;
            let endpoints = handle.endpoints();
            // None before a discovering balancer's first poll_ready, then all four.
            assert!(
                endpoints.is_empty() || endpoints.len() == 4,
                "{endpoints:?}"
            );
            let in_flight: u64 = endpoints.iter().map(|e| e.load.in_flight()).sum();
            assert!(in_flight <= 8, "{in_flight} in flight from 8 tasks");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        last
    })
}

async fn check_handle(
    buffer: Buffer<
        (),
        impl std::future::Future<Output = Result<&'static str, duet_balance::BoxError>> + Send + 'static,
    >,
    handle: BalanceHandle<&'static str>,
) {
    let watcher = watch(handle.clone());
    let first = eight_tasks(&buffer, 250).await;
    assert_eq!(first.values().sum::<usize>(), 2000);
    let stats = handle.stats();
    assert_eq!((stats.picks, stats.load_reads), (2000, 4000));
    let picks: HashMap<&str, u64> = handle
        .endpoints()
        .iter()
        .map(|e| (e.key, e.load.picks()))
        .collect();
    for name in NAMES {
        assert_eq!(
            picks[name],
            first.get(name).copied().unwrap_or(0) as u64,
            "{name}"
        );
    }

    // Through the handle, while the balancer is in the Buffer: c out, d at weight 0.
    handle.set_eligible("c", false);
    handle.set_weight("d", 0);
    let second = eight_tasks(&buffer, 250).await;
    assert_eq!(second.get("c"), None, "{second:?}");
    assert_eq!(second.get("d"), None, "{second:?}");
    assert_eq!(second.values().sum::<usize>(), 2000);
    let endpoints = handle.endpoints();
    let state: Vec<(&str, u32, bool, u64)> = endpoints
        .iter()
        .map(|e| (e.key, e.weight, e.load.is_eligible(), e.load.in_flight()))
        .collect();
    assert_eq!(
        state,
        [
            ("a", 1, true, 0),
            ("b", 1, true, 0),
            ("c", 1, false, 0),
            ("d", 0, true, 0)
        ]
    );
    assert_eq!(handle.stats().picks, 4000);
    assert!(watcher.await.expect("watcher") <= 4000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_reads_and_steers_a_balance_shared_by_eight_tasks_through_a_buffer() {
    for strategy in [Strategy::P2cInflight, Strategy::P2cMemoryInflight] {
        let mut balance = Balancer::with_seed(strategy, 3);
        for name in NAMES {
            balance.insert(name, 1, backend(name));
        }
        let handle = balance.handle();
        let buffer = Buffer::new(balance, 64);
        check_handle(buffer, handle).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_reads_and_steers_a_discover_balance_shared_by_eight_tasks_through_a_buffer() {
    let stream = futures_util::stream::iter(
        NAMES.map(|name| Ok::<_, Infallible>(Change::Insert(name, backend(name)))),
    )
    .chain(futures_util::stream::pending());
    let balance =
        DiscoverBalancer::from_balance(stream, Balancer::with_seed(Strategy::P2cPeakEwma, 5));
    let handle = balance.handle();
    let buffer = Buffer::new(balance, 64);
    check_handle(buffer, handle).await;
}

#[test]
fn a_balancer_without_a_handle_publishes_nothing_and_a_late_handle_sees_everything() {
    let mut balance: Balancer<&str, ()> = Balancer::with_seed(Strategy::P2cInflight, 1);
    for name in NAMES {
        balance.insert(name, 2, ());
    }
    for _ in 0..10 {
        let _ = balance.pick();
    }
    let handle = balance.handle();
    assert_eq!(handle.stats().picks, 10);
    let weights: Vec<(&str, u32)> = handle
        .endpoints()
        .iter()
        .map(|e| (e.key, e.weight))
        .collect();
    assert_eq!(weights, NAMES.map(|n| (n, 2)));
    balance.remove(&"b");
    assert_eq!(handle.endpoints().len(), 3);

    // Every pick hands its counts on, a refused one too.
    for _ in 0..5 {
        let _ = balance.pick();
    }
    balance.retain(|_| false);
    assert!(balance.pick().is_err());
    let stats = handle.stats();
    assert_eq!((stats.picks, stats.no_eligible), (15, 1));
    assert_eq!(stats, balance.stats());
}
