//! PROXY protocol out (`send_proxy_protocol:`): each new connection to a backend starts with a header
//! naming the client it is for, and is reused only for that client. Checked byte for byte by a raw
//! listener, and end to end behind real HAProxy with `accept-proxy` (skipped without haproxy, unless
//! `DUET_REQUIRE_HAPROXY` is set). Clients connect from 127.0.0.2 and 127.0.0.3, duet from 127.0.0.1.

use crate::proxy_protocol::{free_port, haproxy_present, run_haproxy};
use crate::support::Duet;
use duet_testbed::{raw, Backend, BackendOptions};
use socket2::{Domain, Socket, Type};
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// The most connections a [`HeaderBackend`] serves.
const MAX_CONNECTIONS: usize = 16;

/// A keep-alive HTTP/1.1 backend that records the PROXY header each connection starts with (v1 up
/// to its CRLF, v2 by its length) and answers every request `200 ok`.
struct HeaderBackend {
    address: SocketAddr,
    headers: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl HeaderBackend {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let address = listener.local_addr().expect("address");
        let headers = Arc::new(Mutex::new(Vec::new()));
        let recorded = headers.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut served = 0;
            while served < MAX_CONNECTIONS && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        served += 1;
                        let recorded = recorded.clone();
                        std::thread::spawn(move || serve(stream, &recorded));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { address, headers }
    }

    fn headers(&self) -> Vec<Vec<u8>> {
        self.headers.lock().expect("headers").clone()
    }
}

/// One connection: its PROXY header recorded, then up to 100 requests answered.
fn serve(mut stream: TcpStream, recorded: &Mutex<Vec<Vec<u8>>>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let Some(header) = read_proxy_header(&mut stream) else {
        return;
    };
    recorded.lock().expect("headers").push(header);
    for _ in 0..100 {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while raw::head_end(&head).is_none() && head.len() < 64 * 1024 {
            match stream.read(&mut byte) {
                Ok(1) => head.push(byte[0]),
                _ => return,
            }
        }
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        if stream.write_all(answer).is_err() {
            return;
        }
    }
}

fn read_proxy_header(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut header = vec![0u8; 16];
    stream.read_exact(&mut header[..1]).ok()?;
    if header[0] == b'P' {
        header.truncate(1);
        let mut byte = [0u8; 1];
        while !header.ends_with(b"\r\n") && header.len() < 108 {
            stream.read_exact(&mut byte).ok()?;
            header.push(byte[0]);
        }
        return Some(header);
    }
    stream.read_exact(&mut header[1..]).ok()?;
    let length = usize::from(u16::from_be_bytes([header[14], header[15]]));
    let mut block = vec![0u8; length];
    stream.read_exact(&mut block).ok()?;
    header.extend(block);
    Some(header)
}

/// A keep-alive connection to `to` from `source` (an IP of the loopback network).
fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let from: SocketAddr = format!("{source}:0").parse().expect("source");
    socket.bind(&from.into()).expect("bind the source");
    socket.connect(&to.into()).expect("connect");
    let stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
}

/// GET `path` on `stream`: the status and body.
fn get(stream: &mut TcpStream, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("request");
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no whole response");
        if let Some(end) = raw::head_end(&bytes) {
            let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
            let length = raw::content_length(&head).unwrap_or(0);
            if bytes.len() >= end + length {
                let body = String::from_utf8_lossy(&bytes[end..end + length]).into_owned();
                return (raw::status(&head), body);
            }
        }
        let read = stream.read(&mut chunk).expect("response");
        assert!(read > 0, "closed: {:?}", String::from_utf8_lossy(&bytes));
        bytes.extend(&chunk[..read]);
    }
}

fn v2_header(client: SocketAddr, backend: SocketAddr) -> Vec<u8> {
    let (SocketAddr::V4(client), SocketAddr::V4(backend)) = (client, backend) else {
        panic!("IPv4 here");
    };
    let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    header.extend([0x21, 0x11, 0, 12]);
    header.extend(client.ip().octets());
    header.extend(backend.ip().octets());
    header.extend(client.port().to_be_bytes());
    header.extend(backend.port().to_be_bytes());
    header
}

#[test]
fn each_backend_connection_names_its_client_and_serves_only_that_client() {
    let (v1, v2) = (HeaderBackend::start(), HeaderBackend::start());
    let yaml = format!(
        "workers: 1\nlisteners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n  \
         - {{ match: {{ path_prefix: /v1 }}, cluster: v1 }}\n  - {{ cluster: v2 }}\nclusters:\n  \
         - {{ name: v1, send_proxy_protocol: v1, backends: [ {{ address: {} }} ] }}\n  \
         - {{ name: v2, send_proxy_protocol: v2, backends: [ {{ address: {} }} ] }}\n",
        v1.address, v2.address
    );
    let duet = Duet::start(&yaml);
    for (path, backend) in [("/v1", &v1), ("/v2", &v2)] {
        // Two requests of one client connection share one backend connection.
        let mut first = connect_from("127.0.0.2", duet.address);
        assert_eq!(get(&mut first, path), (200, "ok".to_owned()));
        assert_eq!(get(&mut first, path), (200, "ok".to_owned()));
        // Another client, and the first client's address from another port, get their own, though
        // the first one's is idle in the pool.
        let mut second = connect_from("127.0.0.3", duet.address);
        assert_eq!(get(&mut second, path), (200, "ok".to_owned()));
        let mut third = connect_from("127.0.0.2", duet.address);
        assert_eq!(get(&mut third, path), (200, "ok".to_owned()));
        assert_eq!(get(&mut first, path), (200, "ok".to_owned()));

        let clients = [&first, &second, &third].map(|s| s.local_addr().expect("address"));
        let expected: Vec<Vec<u8>> = clients
            .iter()
            .map(|client| match path {
                "/v1" => format!(
                    "PROXY TCP4 {} {} {} {}\r\n",
                    client.ip(),
                    backend.address.ip(),
                    client.port(),
                    backend.address.port()
                )
                .into_bytes(),
                _ => v2_header(*client, backend.address),
            })
            .collect();
        assert_eq!(backend.headers(), expected, "{path}");
    }
}

#[test]
fn behind_duet_haproxy_with_accept_proxy_sees_the_client_by_v2_and_v1_and_checks_pass() {
    if !haproxy_present() {
        return;
    }
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let (v2, v1) = (free_port(), free_port());
    let mut config = String::from(
        "global\n    nbthread 1\ndefaults\n    mode http\n    timeout connect 2s\n    \
         timeout client 10s\n    timeout server 10s\n",
    );
    for port in [v2, v1] {
        config.push_str(&format!(
            "frontend in{port}\n    bind 127.0.0.1:{port} accept-proxy\n    \
             http-request set-header X-Proxy-Source %[src]:%[src_port]\n    \
             default_backend app\n"
        ));
    }
    config.push_str(&format!(
        "backend app\n    server app {}\n",
        backend.address()
    ));
    let _haproxy = run_haproxy(&config, &[v2, v1]);
    let check = "health_check: { path: /healthz, interval: 100ms, timeout: 2s }";
    let yaml = format!(
        "workers: 1\nlisteners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n  \
         - {{ match: {{ path_prefix: /v1 }}, cluster: v1 }}\n  - {{ cluster: v2 }}\nclusters:\n  \
         - {{ name: v1, send_proxy_protocol: v1, {check}, backends: [ {{ address: 127.0.0.1:{v1} }} ] }}\n  \
         - {{ name: v2, send_proxy_protocol: v2, {check}, backends: [ {{ address: 127.0.0.1:{v2} }} ] }}\n"
    );
    let duet = Duet::start(&yaml);
    // Checks name no client (UNKNOWN, LOCAL): HAProxy takes them, as its own peer's.
    let checked = crate::support::eventually(Duration::from_secs(10), || {
        let checks = backend.recorded();
        let from_duet = |seen: &duet_testbed::Recorded| {
            seen.uri == "/healthz"
                && seen.headers["x-proxy-source"]
                    .to_str()
                    .is_ok_and(|s| s.starts_with("127.0.0.1:"))
        };
        checks.iter().filter(|seen| from_duet(seen)).count() >= 4
    });
    assert!(checked, "{:?}", backend.recorded());
    for (source, path) in [("127.0.0.2", "/v2/who"), ("127.0.0.3", "/v1/who")] {
        let mut client = connect_from(source, duet.address);
        let (status, _) = get(&mut client, path);
        assert_eq!(status, 200, "{path}");
        let seen = backend.recorded();
        let seen = seen.iter().rfind(|r| r.uri == path).expect("the request");
        let named = client.local_addr().expect("address").to_string();
        assert_eq!(seen.headers["x-proxy-source"], named.as_str(), "{path}");
    }
}
