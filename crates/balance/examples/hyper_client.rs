//! A hyper client balanced by PeakEWMA over three real servers on loopback, one of them slow.
//!
//! `cargo run -p duet-balance --example hyper_client`
//!
//! The balancer runs on an ordinary multi-threaded tokio runtime: one task drives it as a tower service,
//! and the responses (which carry their load guards) complete on whichever worker thread reads them.

use bytes::Bytes;
use duet_balance::{BalanceLayer, BoxError, CompleteOnBodyEnd, LoadMetric, Picked};
use http_body_util::{BodyExt, Empty, Full};
use hyper::{server::conn::http1, service::service_fn as hyper_service_fn};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use std::{collections::HashMap, convert::Infallible, net::SocketAddr, time::Duration};
use tokio::net::TcpListener;
use tower::{service_fn, Layer, Service, ServiceExt};

/// Serves `name` after `delay`, on a port the OS chooses.
async fn backend(name: &'static str, delay: Duration) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let serve = hyper_service_fn(move |_request| async move {
                    tokio::time::sleep(delay).await;
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(name))))
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), serve)
                    .await;
            });
        }
    });
    Ok(address)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addresses = [
        backend("fast-1", Duration::from_millis(2)).await?,
        backend("fast-2", Duration::from_millis(2)).await?,
        backend("slow", Duration::from_millis(20)).await?,
    ];
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();

    // The shared client learns which backend was picked from the request's extensions.
    let dial = service_fn(move |mut request: hyper::Request<Empty<Bytes>>| {
        let client = client.clone();
        async move {
            let Picked(address) = request
                .extensions()
                .get::<Picked<SocketAddr>>()
                .copied()
                .ok_or("no pick")?;
            *request.uri_mut() = format!("http://{address}/").parse()?;
            Ok::<_, BoxError>(client.request(request).await?)
        }
    });
    let layer = BalanceLayer::new(LoadMetric::default(), addresses.iter().map(|&a| (a, 1)))
        .with_completion(CompleteOnBodyEnd::default());
    let mut balance = layer.layer(dial);

    let mut served: HashMap<String, u32> = HashMap::new();
    let mut in_flight = tokio::task::JoinSet::new();
    for _ in 0..400 {
        let response = balance
            .ready()
            .await?
            .call(hyper::Request::new(Empty::new()));
        in_flight.spawn(async move {
            // The balancer counts this request until its body has been read to the end.
            let body = response.await?.into_body().collect().await?.to_bytes();
            Ok::<_, BoxError>(String::from_utf8_lossy(&body).into_owned())
        });
        if in_flight.len() >= 8 {
            if let Some(done) = in_flight.join_next().await {
                *served.entry(done??).or_default() += 1;
            }
        }
    }
    while let Some(done) = in_flight.join_next().await {
        *served.entry(done??).or_default() += 1;
    }
    let mut shares: Vec<_> = served.into_iter().collect();
    shares.sort();
    for (name, count) in shares {
        println!("{name:>7}: {count:>3} requests");
    }
    let stats = balance.stats();
    println!(
        "picks {}, ties {}, both idle {}",
        stats.picks, stats.ties, stats.both_zero
    );
    Ok(())
}
