//! A hyper client balanced over servers that a discovery stream announces with their weights, while a
//! handle prints what the balancer does.
//!
//! `cargo run -p duet-balance --example discovery`
//!
//! Three equally fast servers on loopback are announced through a `Discover` stream (here a channel;
//! in a service, whatever watches DNS, Consul or Kubernetes endpoints) with weights 3, 1 and 1. Eight
//! client tasks share one balancer through `tower::buffer::Buffer`. Half-way, the stream announces "a"
//! again at weight 1 (a weight update: its load state is kept) and a fourth server joins. A
//! `BalanceHandle`, taken before the balancer moved into the buffer, prints the counters and each
//! endpoint's state every 100 ms.

use bytes::Bytes;
use duet_balance::{
    BalanceHandle, Balancer, BoxError, CompleteOnBodyEnd, DiscoverBalancer, Picked, SharedEndpoint,
    Strategy, Weighted,
};
use http_body_util::{BodyExt, Empty, Full};
use hyper::{server::conn::http1, service::service_fn as hyper_service_fn};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};
use tokio::{net::TcpListener, sync::mpsc::unbounded_channel, task::JoinSet};
use tower::{buffer::Buffer, discover::Change, service_fn, Service, ServiceExt};

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

/// Sends `requests` requests from each of 8 tasks through `shared`; the answers by server name.
async fn eight_clients<S>(shared: &S, requests: usize) -> Result<BTreeMap<String, usize>, BoxError>
where
    S: Service<hyper::Request<Empty<Bytes>>> + Clone + Send + 'static,
    S::Response: Into<hyper::Response<duet_balance::TrackedBody<hyper::body::Incoming>>>,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    let mut clients = JoinSet::new();
    for _ in 0..8 {
        let mut balance = shared.clone();
        clients.spawn(async move {
            let mut served = BTreeMap::<String, usize>::new();
            for _ in 0..requests {
                let ready = balance.ready().await.map_err(Into::into)?;
                let response = ready
                    .call(hyper::Request::new(Empty::new()))
                    .await
                    .map_err(Into::into)?;
                // The request counts as load until its body has been read to the end.
                let body = response.into().into_body().collect().await?.to_bytes();
                *served
                    .entry(String::from_utf8_lossy(&body).into_owned())
                    .or_default() += 1;
            }
            Ok::<_, BoxError>(served)
        });
    }
    let mut served = BTreeMap::new();
    while let Some(done) = clients.join_next().await {
        for (name, count) in done?? {
            *served.entry(name).or_default() += count;
        }
    }
    Ok(served)
}

/// Prints the handle's counters and endpoints every 100 ms until `done` (at most a minute).
fn print_stats(
    handle: BalanceHandle<SocketAddr>,
    names: BTreeMap<SocketAddr, &'static str>,
    done: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for _ in 0..600 {
            if done.load(Relaxed) {
                return;
            }
            let stats = handle.stats();
            let mut line = format!("picks {:>5}, ties {:>4}:", stats.picks, stats.ties);
            for endpoint in handle.endpoints() {
                let name = names.get(&endpoint.key).copied().unwrap_or("?");
                line.push_str(&format!(
                    "  {name} w{} {:>2} in flight, {:>4} picks, {:>5.1?} |",
                    endpoint.weight,
                    endpoint.load.in_flight(),
                    endpoint.load.picks(),
                    endpoint.load.rtt_estimate(),
                ));
            }
            println!("{line}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut names = BTreeMap::new();
    let mut servers = Vec::new();
    for name in ["a", "b", "c", "d"] {
        let address = backend(name, Duration::from_millis(5)).await?;
        names.insert(address, name);
        servers.push(address);
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();

    // One client for every endpoint: it learns which server was picked from the request's extensions.
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
    let endpoint = |address: SocketAddr, weight: u32| {
        let service = Weighted::new(SharedEndpoint::new(address, dial.clone()), weight);
        Ok::<_, Infallible>(Change::Insert(address, service))
    };

    // The membership stream, and a balancer following it that takes each endpoint's weight from it.
    let (announce, mut announced) = unbounded_channel();
    let discover = futures_util::stream::poll_fn(move |cx| announced.poll_recv(cx));
    let balancer =
        Balancer::new(Strategy::P2cPeakEwma).with_completion(CompleteOnBodyEnd::default());
    let balance = DiscoverBalancer::from_balance(discover, balancer).with_weights();
    let handle = balance.handle();
    let shared = Buffer::new(balance, 64);

    announce.send(endpoint(servers[0], 3))?;
    announce.send(endpoint(servers[1], 1))?;
    announce.send(endpoint(servers[2], 1))?;
    let done = Arc::new(AtomicBool::new(false));
    let printer = print_stats(handle.clone(), names.clone(), done.clone());

    let first = eight_clients(&shared, 100).await?;
    // "a" again at weight 1 (no Remove: its estimate and counts stay), and "d" joins.
    announce.send(endpoint(servers[0], 1))?;
    announce.send(endpoint(servers[3], 1))?;
    let second = eight_clients(&shared, 100).await?;
    done.store(true, Relaxed);
    printer.await?;

    println!("weights a:b:c = 3:1:1        {first:?}");
    println!("weights a:b:c:d = 1:1:1:1    {second:?}");
    println!("{:?}", handle.stats());
    Ok(())
}
