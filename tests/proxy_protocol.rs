//! PROXY protocol in, with real HAProxy as the L4 balancer in front (`send-proxy-v2` and
//! `send-proxy`): the backend sees the original client's address in `X-Forwarded-For`. The client
//! connects from another loopback address (127.0.0.2, 127.0.0.3) than HAProxy's (127.0.0.1), so the
//! two cannot be confused. Without haproxy the test is skipped with a note, unless
//! `DUET_REQUIRE_HAPROXY` is set (`.ci/run` installs it and sets it).

use crate::support::{Duet, TempDir};
use duet_testbed::{Backend, BackendOptions};
use socket2::{Domain, Socket, Type};
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// HAProxy, killed when dropped.
pub(crate) struct Haproxy {
    child: Child,
    _dir: TempDir,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn haproxy_present() -> bool {
    let found = Command::new("haproxy")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("DUET_REQUIRE_HAPROXY").is_none(),
            "haproxy is required here"
        );
        eprintln!("SKIPPED: no haproxy (apt-get install haproxy)");
    }
    found
}

pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

/// HAProxy with one TCP frontend per `(port, server option)`, each to `duet`.
fn start_haproxy(duet: SocketAddr, frontends: &[(u16, &str)]) -> Haproxy {
    let mut config = String::from(
        "global\n    nbthread 1\ndefaults\n    mode tcp\n    timeout connect 2s\n    \
         timeout client 10s\n    timeout server 10s\n",
    );
    for (i, (port, option)) in frontends.iter().enumerate() {
        config.push_str(&format!(
            "frontend in{i}\n    bind 127.0.0.1:{port}\n    default_backend duet{i}\n\
             backend duet{i}\n    server duet {duet} {option}\n"
        ));
    }
    run_haproxy(
        &config,
        &frontends.iter().map(|(port, _)| *port).collect::<Vec<_>>(),
    )
}

/// HAProxy on `config`, once it listens on every one of `ports`.
pub(crate) fn run_haproxy(config: &str, ports: &[u16]) -> Haproxy {
    let dir = TempDir::new();
    let path = dir.0.join("haproxy.cfg");
    std::fs::write(&path, config).expect("haproxy config");
    let child = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("haproxy starts");
    let haproxy = Haproxy { child, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(10);
    for port in ports {
        while TcpStream::connect(("127.0.0.1", *port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "haproxy did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    haproxy
}

/// A request from `source` (an IP of the loopback network) to `to`: what came back before the close.
pub(crate) fn request_from(source: &str, to: SocketAddr, request: &[u8]) -> String {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
    let from: SocketAddr = format!("{source}:0").parse().expect("source");
    socket.bind(&from.into()).expect("bind the source");
    socket.connect(&to.into()).expect("connect");
    let mut stream: TcpStream = socket.into();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream.write_all(request).expect("request");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

const GET: &[u8] =
    b"GET /who HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.66\r\nConnection: close\r\n\r\n";

#[test]
fn behind_haproxy_the_backend_sees_the_original_client_by_v2_and_v1() {
    if !haproxy_present() {
        return;
    }
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let yaml = format!(
        "workers: 1\nlisteners:\n  - address: 127.0.0.1:0\n    proxy_protocol: any\n    \
         trusted_proxies: [127.0.0.1/32]\nroutes: [ {{ cluster: app }} ]\n\
         clusters:\n  - name: app\n    backends: [ {{ address: {} }} ]\n",
        backend.address()
    );
    let duet = Duet::start(&yaml);
    let (v2, v1) = (free_port(), free_port());
    let _haproxy = start_haproxy(duet.address, &[(v2, "send-proxy-v2"), (v1, "send-proxy")]);
    for (source, port) in [("127.0.0.2", v2), ("127.0.0.3", v1)] {
        let to: SocketAddr = ([127, 0, 0, 1], port).into();
        let response = request_from(source, to, GET);
        assert!(response.starts_with("HTTP/1.1 200"), "{source}: {response}");
        let seen = backend.recorded().pop().expect("a request");
        // The client is not trusted: its own X-Forwarded-For is replaced by its address.
        assert_eq!(seen.headers["x-forwarded-for"], source, "{port}");
    }
    assert_eq!(backend.recorded().len(), 2);

    // Straight to duet: an untrusted peer, or a trusted one without the header, is closed unserved.
    for source in ["127.0.0.2", "127.0.0.1"] {
        let response = request_from(source, duet.address, GET);
        assert_eq!(response, "", "{source}");
    }
    assert_eq!(backend.recorded().len(), 2);
}
