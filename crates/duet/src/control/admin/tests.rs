//! The admin listener's tests: routes, the connection cap, the header timeout and the lifetime.

use super::*;
use std::net::SocketAddr;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n";

fn state() -> Rc<State> {
    Rc::new(State {
        registry: Registry::new(),
        health: watch::channel(Arc::new(HealthView::default())).1,
        window: RefCell::new(StatusWindow::new()),
    })
}

/// Serves the admin endpoints with `limits` on a loopback port, on the test's `LocalSet`.
async fn start(limits: Limits) -> (SocketAddr, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, shutdown) = watch::channel(false);
    tokio::task::spawn_local(serve_with(listener, state(), limits, shutdown));
    (address, stop)
}

async fn exchange(stream: &mut TcpStream, request: &[u8]) -> String {
    stream.write_all(request).await.expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read");
    answer
}

#[tokio::test]
async fn at_the_cap_a_new_connection_closes_the_oldest_and_is_answered() {
    let limits = Limits {
        connections: 2,
        header_timeout: Duration::from_secs(60),
        lifetime: Duration::from_secs(60),
    };
    tokio::task::LocalSet::new()
        .run_until(async {
            let (address, _stop) = start(limits).await;
            let mut oldest = TcpStream::connect(address).await.expect("connect");
            let mut second = TcpStream::connect(address).await.expect("connect");
            let mut probe = TcpStream::connect(address).await.expect("connect");
            let answer = exchange(&mut probe, HEALTHZ).await;
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
            assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");
            let mut byte = [0; 1];
            assert_eq!(oldest.read(&mut byte).await.expect("read"), 0, "closed");
            let answer = exchange(&mut second, HEALTHZ).await;
            assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        })
        .await;
}

#[tokio::test]
async fn unknown_paths_list_the_routes() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let (address, _stop) = start(Limits::default()).await;
            let mut client = TcpStream::connect(address).await.expect("connect");
            let answer = exchange(
                &mut client,
                b"GET /nowhere HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n",
            )
            .await;
            assert!(answer.starts_with("HTTP/1.1 404 Not Found\r\n"), "{answer}");
            assert!(
                answer.ends_with("\r\n\r\ntry /metrics, /status, /healthz or /ready\n"),
                "{answer}"
            );
        })
        .await;
}

/// One connection over an in-memory pipe, served with the default limits; returns the client's
/// end and the task (finished once the connection closed).
fn pipe() -> (tokio::io::DuplexStream, tokio::task::JoinHandle<()>) {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let served = tokio::task::spawn_local(connection(server, state(), Limits::default()));
    (client, served)
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_closes_at_the_header_timeout() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let started = tokio::time::Instant::now();
            let (mut client, served) = pipe();
            let mut byte = [0; 1];
            assert_eq!(client.read(&mut byte).await.expect("read"), 0, "closed");
            served.await.expect("served");
            assert_eq!(started.elapsed(), Limits::default().header_timeout);
        })
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_busy_connection_closes_after_its_lifetime_between_requests() {
    tokio::task::LocalSet::new()
        .run_until(async {
            let limits = Limits::default();
            let started = tokio::time::Instant::now();
            let (client, served) = pipe();
            let (reader, mut writer) = tokio::io::split(client);
            let mut reader = tokio::io::BufReader::new(reader);
            let request = b"GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n";
            let mut answered = 0;
            // A request every 700 ms keeps the header timeout away; the lifetime still ends it,
            // between two requests (none is due at the lifetime itself).
            let every = Duration::from_millis(700);
            let due = limits.lifetime.as_millis().div_ceil(every.as_millis());
            // Bounded, should the lifetime never end it.
            while answered <= due {
                if writer.write_all(request).await.is_err() {
                    break;
                }
                let mut head = String::new();
                let mut line = String::new();
                while tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line)
                    .await
                    .expect("read")
                    > 2
                {
                    head.push_str(&line);
                    line.clear();
                }
                if head.is_empty() {
                    break;
                }
                assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
                let mut body = [0; 3];
                reader.read_exact(&mut body).await.expect("body");
                assert_eq!(&body, b"ok\n");
                answered += 1;
                tokio::time::sleep(every).await;
            }
            assert!(served.is_finished(), "still open after {answered} requests");
            assert_eq!(answered, due, "every request until the lifetime");
            let took = started.elapsed();
            assert!(
                took >= limits.lifetime && took <= limits.lifetime + every,
                "{took:?}"
            );
        })
        .await;
}

#[test]
fn openmetrics_is_served_when_the_accept_prefers_it_and_prometheus_text_otherwise() {
    // Prometheus's own `Accept` (its default scrape protocols), and a bare ask.
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                      version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert!(prefers_openmetrics(prometheus));
    assert!(prefers_openmetrics("application/openmetrics-text"));
    assert!(prefers_openmetrics(
        "text/plain;q=0.4, Application/OpenMetrics-Text; version=0.0.1; q=0.6"
    ));
    for plain in [
        "",
        "*/*",
        "text/plain",
        "text/plain;version=0.0.4,application/openmetrics-text;q=0.5",
        "application/openmetrics-text;version=2.0.0",
        "application/openmetrics-text;q=0",
    ] {
        assert!(!prefers_openmetrics(plain), "{plain}");
    }
}
