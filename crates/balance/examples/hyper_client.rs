//! A hyper client balanced by PeakEWMA over three real servers on loopback, one of them slow.
//!
//! `cargo run -p duet-balance --example hyper_client`
//!
//! The balancer runs on an ordinary multi-threaded tokio runtime, shared by eight client tasks through
//! `tower::buffer::Buffer` (whose worker task owns it), and the responses (which carry their load guards)
//! complete on whichever thread reads them.

use bytes::Bytes;
use duet_balance::{BalanceLayer, BoxError, CompleteOnBodyEnd, Picked, Strategy};
use http_body_util::{BodyExt, Empty, Full};
use hyper::{server::conn::http1, service::service_fn as hyper_service_fn};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use std::{collections::HashMap, convert::Infallible, net::SocketAddr, time::Duration};
use tokio::net::TcpListener;
use tower::{buffer::Buffer, service_fn, Layer, Service, ServiceExt};

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
    let layer = BalanceLayer::new(Strategy::P2cPeakEwma, addresses.iter().map(|&a| (a, 1)))
        .with_completion(CompleteOnBodyEnd::default());
    // One balancer, shared: every clone of the buffer sends to the task that owns it.
    let shared = Buffer::new(layer.layer(dial), 64);

    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let mut balance = shared.clone();
        clients.spawn(async move {
            let mut served: HashMap<String, u32> = HashMap::new();
            for _ in 0..50 {
                let response = balance
                    .ready()
                    .await?
                    .call(hyper::Request::new(Empty::new()))
                    .await?;
                // The balancer counts this request until its body has been read to the end.
                let body = response.into_body().collect().await?.to_bytes();
                *served
                    .entry(String::from_utf8_lossy(&body).into_owned())
                    .or_default() += 1;
            }
            Ok::<_, BoxError>(served)
        });
    }
    let mut served: HashMap<String, u32> = HashMap::new();
    while let Some(done) = clients.join_next().await {
        for (name, count) in done?? {
            *served.entry(name).or_default() += count;
        }
    }
    let mut shares: Vec<_> = served.into_iter().collect();
    shares.sort();
    for (name, count) in shares {
        println!("{name:>7}: {count:>3} requests");
    }
    Ok(())
}
