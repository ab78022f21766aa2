//! Instructions per request of a pick and its completion, counted by callgrind: the figure a noisy
//! shared machine reproduces to the instruction, where the criterion bench (`benches/balance.rs` at the
//! repository's root) moves by tens of percent. Every endpoint answers at once, so what is counted is
//! the balancer: `poll_ready` (the pick), `call`, and the response future (the guard's release).
//!
//! ```text
//! cargo build --release -p duet-balance --example pick_cost
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null --collect-atstart=no \
//!     --toggle-collect='*run_requests*' target/release/examples/pick_cost p2c_inflight 16 50000
//! ```
//!
//! Divide callgrind's "Collected" by the requests (50,000 here). Arguments: the strategy (duet's
//! config name), the endpoints, the requests, and `handle` to make a `BalanceHandle` first (a
//! balancer with one pays for nothing more per pick).

use duet_balance::{Balancer, BoxError, Strategy};
use std::{
    convert::Infallible,
    future::Future,
    hint::black_box,
    task::{Context, Poll},
};
use tower::{service_fn, Service};

fn echo() -> impl Service<
    u32,
    Response = u32,
    Error = Infallible,
    Future = std::future::Ready<Result<u32, Infallible>>,
> + Clone {
    service_fn(|x: u32| std::future::ready(Ok(x)))
}

/// `poll_ready`, `call`, and the response, as in the criterion bench; the endpoints here are always
/// ready and answer at once, so anything else is a bug worth stopping on.
#[inline]
fn one_request<S: Service<u32>>(balance: &mut S, cx: &mut Context<'_>) {
    match balance.poll_ready(cx) {
        Poll::Ready(Ok(())) => {}
        _ => panic!("these endpoints are always ready"),
    }
    let mut future = std::pin::pin!(balance.call(black_box(1)));
    match future.as_mut().poll(cx) {
        Poll::Ready(Ok(response)) => {
            black_box(response);
        }
        _ => panic!("these endpoints answer at once"),
    }
}

/// What callgrind counts (`--toggle-collect='*run_requests*'`): the requests, none of the setup.
#[inline(never)]
fn run_requests<S: Service<u32>>(balance: &mut S, cx: &mut Context<'_>, requests: u64) {
    for _ in 0..requests {
        one_request(balance, cx);
    }
}

fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let strategy: Strategy = args.next().as_deref().unwrap_or("p2c_peak_ewma").parse()?;
    let endpoints: usize = args.next().as_deref().unwrap_or("16").parse()?;
    let requests: u64 = args.next().as_deref().unwrap_or("50000").parse()?;
    let with_handle = args.next().as_deref() == Some("handle");

    let mut balance = Balancer::with_seed(strategy, 1);
    for key in 0..endpoints {
        balance.insert(key, 1, echo());
    }
    let handle = with_handle.then(|| balance.handle());
    let mut cx = Context::from_waker(std::task::Waker::noop());
    run_requests(&mut balance, &mut cx, requests);
    let stats = handle.map_or_else(|| balance.stats(), |handle| handle.stats());
    println!(
        "{} over {endpoints} endpoints: {} picks, {} loads read",
        strategy.name(),
        stats.picks,
        stats.load_reads
    );
    Ok(())
}
