//! TLS to backends (a cluster's `tls:`): real rustls backends on loopback with certificates from test
//! CAs made here (rcgen). duet verifies them, presents a client certificate, refuses what it should
//! (502, never a plain-text retry), and picks up rotated files on SIGHUP.

use crate::{
    grpc,
    support::{self, Duet, TempDir},
};
use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use std::{
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{
        atomic::{AtomicUsize, Ordering::SeqCst},
        Arc, Mutex,
    },
    time::Duration,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{
    rustls::{
        self,
        pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
        server::WebPkiClientVerifier,
        RootCertStore, ServerConfig,
    },
    TlsAcceptor,
};

/// A test certificate authority.
struct Ca(CertifiedIssuer<'static, KeyPair>);

/// A certificate issued by a [`Ca`], with its key.
struct Issued {
    der: CertificateDer<'static>,
    pem: String,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("key");
        Self(CertifiedIssuer::self_signed(params, key).expect("CA"))
    }

    fn pem(&self) -> String {
        self.0.pem()
    }

    fn der(&self) -> CertificateDer<'static> {
        self.0.der().clone()
    }

    /// A server certificate for `name`; `expired` makes it valid only in 2019.
    fn server(&self, name: &str, expired: bool) -> Issued {
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if expired {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        self.issue(params)
    }

    fn client(&self, name: &str) -> Issued {
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("params");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.0).expect("issue");
        Issued {
            der: cert.der().clone(),
            pem: cert.pem(),
            key,
        }
    }
}

impl Issued {
    fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()))
    }

    /// Writes `<name>.pem` and `<name>.key` in `dir`.
    fn write(&self, dir: &Path, name: &str) {
        std::fs::write(dir.join(format!("{name}.pem")), &self.pem).expect("cert");
        std::fs::write(dir.join(format!("{name}.key")), self.key.serialize_pem()).expect("key");
    }
}

/// A backend's TLS: its certificate, and the CA its clients' certificates must come from (if any).
fn server_config(cert: &Issued, client_ca: Option<&Ca>) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            roots.add(ca.der()).expect("client CA");
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(vec![cert.der.clone()], cert.key_der())
        .expect("server config");
    Arc::new(config)
}

/// One request as a TLS backend saw it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    path: String,
    /// The client certificate presented, if any.
    client_cert: Option<CertificateDer<'static>>,
    /// SNI sent by the client.
    sni: Option<String>,
    /// Whether the connection's handshake resumed an earlier session.
    resumed: bool,
}

/// A loopback HTTPS/1.1 backend answering `200 tls-backend` to every request, keeping connections
/// alive unless `close` is set; its TLS configuration can be swapped while it runs.
struct TlsBackend {
    address: SocketAddr,
    config: Arc<Mutex<Arc<ServerConfig>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    handshakes: Arc<AtomicUsize>,
    failed_handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsBackend {
    async fn start(config: Arc<ServerConfig>, close: bool) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let config = Arc::new(Mutex::new(config));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let failed_handshakes = Arc::new(AtomicUsize::new(0));
        let (c, s, h, f) = (
            config.clone(),
            seen.clone(),
            handshakes.clone(),
            failed_handshakes.clone(),
        );
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = TlsAcceptor::from(c.lock().expect("config").clone());
                let (seen, handshakes, failed) = (s.clone(), h.clone(), f.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        failed.fetch_add(1, SeqCst);
                        return;
                    };
                    handshakes.fetch_add(1, SeqCst);
                    serve(tls, seen, close).await;
                });
            }
        });
        Self {
            address,
            config,
            seen,
            handshakes,
            failed_handshakes,
            task,
        }
    }

    fn set_config(&self, config: Arc<ServerConfig>) {
        *self.config.lock().expect("config") = config;
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }
}

/// Serves requests (heads only, no bodies) on one TLS connection, at most 100.
async fn serve(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    seen: Arc<Mutex<Vec<Seen>>>,
    close: bool,
) {
    let (_, session) = tls.get_ref();
    let client_cert = session
        .peer_certificates()
        .and_then(|certs| certs.first().cloned());
    let sni = session.server_name().map(str::to_owned);
    let resumed = session.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
    let mut buffer = Vec::new();
    for _ in 0..100 {
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
        buffer.drain(..head_end);
        let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
        seen.lock().expect("seen").push(Seen {
            path,
            client_cert: client_cert.clone(),
            sni: sni.clone(),
            resumed,
        });
        let connection = if close { "close" } else { "keep-alive" };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: {connection}\r\n\r\ntls-backend"
        );
        if tls.write_all(response.as_bytes()).await.is_err() || close {
            let _ = tls.shutdown().await;
            return;
        }
    }
}

/// duet with one cluster `app` over `backend`, its `tls:` block as given, and `extra` cluster keys.
fn start_duet(dir: &TempDir, backend: SocketAddr, tls: &str, extra: &str) -> Duet {
    let yaml = format!(
        "workers: 1\nlisteners: [ {{ address: 127.0.0.1:0 }} ]\nadmin: {{ address: 127.0.0.1:0 }}\n\
         routes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    backends: [ {{ address: {backend} }} ]\n\
         \x20   tls: {tls}\n{extra}"
    );
    let path = dir.0.join("duet.yaml");
    std::fs::write(&path, yaml).expect("config");
    Duet::start_at(&path)
}

/// GET `path` through duet: status and body.
async fn get(duet: &Duet, path: &str) -> (u16, String) {
    let (status, _, body) = support::get(&duet.url(path), &[]).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The admin page at `path`.
async fn admin(duet: &Duet, path: &str) -> String {
    let url = format!("http://{}{path}", duet.admin_address());
    let (_, _, body) = support::get(&url, &[]).await;
    String::from_utf8_lossy(&body).into_owned()
}

fn logged(duet: &Duet, text: &str) -> bool {
    support::eventually(Duration::from_secs(5), || {
        duet.log_lines().iter().any(|l| l.contains(text))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_backend_gets_the_requests_over_one_kept_alive_tls_connection() {
    let dir = TempDir::new();
    let ca = Ca::new("backends");
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let backend = TlsBackend::start(
        server_config(&ca.server("api.internal", false), None),
        false,
    )
    .await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: api.internal }",
        "",
    );
    for i in 0..3 {
        assert_eq!(
            get(&duet, &format!("/hello/{i}?q=1")).await,
            (200, "tls-backend".to_owned())
        );
    }
    let seen = backend.seen();
    let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
    assert_eq!(paths, ["/hello/0?q=1", "/hello/1?q=1", "/hello/2?q=1"]);
    assert!(
        seen.iter()
            .all(|s| s.sni.as_deref() == Some("api.internal")),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|s| s.client_cert.is_none()),
        "no client certificate configured"
    );
    // The pool kept the connection: one handshake for three requests.
    assert_eq!(backend.handshakes.load(SeqCst), 1);
    let metrics = admin(&duet, "/metrics").await;
    assert!(
        metrics.contains("duet_upstream_tls_handshakes_total{worker=\"0\",cluster=\"app\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "duet_upstream_tls_handshake_failures_total{worker=\"0\",cluster=\"app\"} 0\n"
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_resumes_the_tls_session_of_an_earlier_one() {
    let dir = TempDir::new();
    let ca = Ca::new("backends");
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let config = server_config(&ca.server("api.internal", false), None);
    // The backend closes after each response: every request needs a new connection.
    let backend = TlsBackend::start(config, true).await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: api.internal }",
        "",
    );
    for _ in 0..3 {
        assert_eq!(get(&duet, "/").await.0, 200);
    }
    let resumed: Vec<bool> = backend.seen().iter().map(|s| s.resumed).collect();
    assert_eq!(
        resumed,
        [false, true, true],
        "a full handshake, then resumptions"
    );
    assert_eq!(backend.handshakes.load(SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_with_a_certificate_from_another_ca_gets_502_and_no_request() {
    let dir = TempDir::new();
    let (trusted, other) = (Ca::new("trusted"), Ca::new("other"));
    std::fs::write(dir.0.join("ca.pem"), trusted.pem()).expect("ca");
    let config = server_config(&other.server("api.internal", false), None);
    let backend = TlsBackend::start(config, false).await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: api.internal }",
        "    retries: { attempts: 1 }\n",
    );
    assert_eq!(
        get(&duet, "/secret").await,
        (502, "TLS handshake with the backend failed\n".to_owned())
    );
    // Never sent in plain text, nor over the refused connection.
    assert_eq!(backend.seen(), []);
    assert_eq!(backend.handshakes.load(SeqCst), 0);
    assert!(
        logged(&duet, "outcome=backend_tls_failed"),
        "{:#?}",
        duet.log_lines()
    );
    assert!(logged(&duet, "UnknownIssuer"), "{:#?}", duet.log_lines());
    let metrics = admin(&duet, "/metrics").await;
    let failed = format!(
        "duet_backend_failures_total{{worker=\"0\",cluster=\"app\",backend=\"{}\",kind=\"tls\"}} 1\n",
        backend.address
    );
    assert!(metrics.contains(&failed), "{metrics}");
    let failures = "duet_upstream_tls_handshake_failures_total{worker=\"0\",cluster=\"app\"} 1\n";
    assert!(metrics.contains(failures), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_with_a_refused_certificate_is_ejected_and_the_status_page_says_why() {
    let dir = TempDir::new();
    let (trusted, other) = (Ca::new("trusted"), Ca::new("other"));
    std::fs::write(dir.0.join("ca.pem"), trusted.pem()).expect("ca");
    let good = TlsBackend::start(
        server_config(&trusted.server("api.internal", false), None),
        false,
    )
    .await;
    let bad = TlsBackend::start(
        server_config(&other.server("api.internal", false), None),
        false,
    )
    .await;
    let yaml = format!(
        "workers: 1\nlisteners: [ {{ address: 127.0.0.1:0 }} ]\nadmin: {{ address: 127.0.0.1:0 }}\n\
         routes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n\
         \x20   backends: [ {{ address: {} }}, {{ address: {} }} ]\n\
         \x20   tls: {{ ca: ca.pem, server_name: api.internal }}\n\
         \x20   retries: {{ attempts: 2 }}\n\
         \x20   outlier_detection: {{ consecutive_failures: 1, base_ejection_time: 10m }}\n",
        good.address, bad.address
    );
    std::fs::write(dir.0.join("duet.yaml"), yaml).expect("config");
    let duet = Duet::start_at(&dir.0.join("duet.yaml"));
    let failed = format!(
        "duet_backend_failures_total{{worker=\"0\",cluster=\"app\",backend=\"{}\",kind=\"tls\"}} 1\n",
        bad.address
    );
    // Until P2C has tried the bad backend once; each request is retried on the good one.
    let mut requests = 0;
    loop {
        assert_eq!(get(&duet, "/").await, (200, "tls-backend".to_owned()));
        requests += 1;
        if admin(&duet, "/metrics").await.contains(&failed) {
            break;
        }
        assert!(requests < 50, "the bad backend was never picked");
    }
    for _ in 0..5 {
        assert_eq!(get(&duet, "/").await.0, 200);
    }
    assert_eq!(bad.seen(), []);
    assert_eq!(good.seen().len(), requests + 5);
    let metrics = admin(&duet, "/metrics").await;
    assert!(
        metrics.contains(&failed),
        "one failure, then never picked again: {metrics}"
    );
    let ejected = format!(
        "duet_backend_ejections_total{{worker=\"0\",cluster=\"app\",backend=\"{}\"}} 1\n",
        bad.address
    );
    assert!(metrics.contains(&ejected), "{metrics}");
    let status = admin(&duet, "/status?format=json").await;
    assert!(
        status
            .contains("ejected by 1 of 1 workers (consecutive failures; 1 TLS handshakes failed)"),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_or_expired_is_refused() {
    let dir = TempDir::new();
    let ca = Ca::new("backends");
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    for (cert, reason) in [
        (
            ca.server("other.internal", false),
            "certificate not valid for name",
        ),
        (ca.server("api.internal", true), "certificate expired"),
    ] {
        let backend = TlsBackend::start(server_config(&cert, None), false).await;
        let duet = start_duet(
            &dir,
            backend.address,
            "{ ca: ca.pem, server_name: api.internal }",
            "    retries: { attempts: 1 }\n",
        );
        assert_eq!(get(&duet, "/").await.0, 502, "{reason}");
        assert_eq!(backend.seen(), [], "{reason}");
        assert!(logged(&duet, reason), "{reason}: {:#?}", duet.log_lines());
        assert!(logged(&duet, "outcome=backend_tls_failed"), "{reason}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_requires_a_client_certificate_gets_duets() {
    let dir = TempDir::new();
    let (ca, clients) = (Ca::new("backends"), Ca::new("clients"));
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let client = clients.client("duet.internal");
    client.write(&dir.0, "client");
    let config = server_config(&ca.server("api.internal", false), Some(&clients));
    let backend = TlsBackend::start(config, false).await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: api.internal, cert: client.pem, key: client.key }",
        "",
    );
    assert_eq!(get(&duet, "/mutual").await, (200, "tls-backend".to_owned()));
    let seen = backend.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/mutual");
    assert_eq!(
        seen[0].client_cert.as_ref(),
        Some(&client.der),
        "duet's certificate"
    );

    // Without it, the backend refuses the handshake: 502.
    let bare_dir = TempDir::new();
    std::fs::write(bare_dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let bare = start_duet(
        &bare_dir,
        backend.address,
        "{ ca: ca.pem, server_name: api.internal }",
        "    retries: { attempts: 1 }\n",
    );
    assert_eq!(get(&bare, "/no-cert").await.0, 502);
    assert_eq!(backend.seen().len(), 1, "nothing more reached the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_picks_up_a_rotated_ca_and_client_certificate() {
    let dir = TempDir::new();
    let (old_ca, new_ca) = (Ca::new("old backends"), Ca::new("new backends"));
    let (old_clients, new_clients) = (Ca::new("old clients"), Ca::new("new clients"));
    let (old_client, new_client) = (old_clients.client("duet"), new_clients.client("duet"));
    std::fs::write(dir.0.join("ca.pem"), old_ca.pem()).expect("ca");
    old_client.write(&dir.0, "client");
    let old_server = server_config(&old_ca.server("api.internal", false), Some(&old_clients));
    // Each request on a new connection, so each one is a handshake with the backend's TLS of the time.
    let backend = TlsBackend::start(old_server, true).await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: api.internal, cert: client.pem, key: client.key }",
        "    retries: { attempts: 1 }\n    outlier_detection: { consecutive_failures: 0 }\n",
    );
    assert_eq!(get(&duet, "/before").await, (200, "tls-backend".to_owned()));

    // The backend moves to the new CA and the new client CA: the old files no longer fit.
    backend.set_config(server_config(
        &new_ca.server("api.internal", false),
        Some(&new_clients),
    ));
    assert_eq!(get(&duet, "/between").await.0, 502);

    std::fs::write(dir.0.join("ca.pem"), new_ca.pem()).expect("ca");
    new_client.write(&dir.0, "client");
    duet.signal("HUP");
    let rotated = duet_testbed::wait::eventually_async(Duration::from_secs(10), || async {
        get(&duet, "/after").await.0 == 200
    })
    .await;
    assert!(rotated, "{:#?}", duet.log_lines());
    let seen = backend.seen();
    let first = seen.first().expect("the first request");
    assert_eq!(
        (first.path.as_str(), first.client_cert.as_ref()),
        ("/before", Some(&old_client.der))
    );
    let last = seen.last().expect("the rotated request");
    assert_eq!(
        (last.path.as_str(), last.client_cert.as_ref()),
        ("/after", Some(&new_client.der))
    );
    assert!(seen.iter().all(|s| s.path != "/between"), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_speak_tls_with_the_clusters_settings() {
    let dir = TempDir::new();
    let ca = Ca::new("backends");
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let backend = TlsBackend::start(
        server_config(&ca.server("api.internal", false), None),
        false,
    )
    .await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: api.internal }",
        "    health_check: { path: /healthz, interval: 100ms, timeout: 2s }\n",
    );
    let checked = duet_testbed::wait::eventually_async(Duration::from_secs(10), || async {
        admin(&duet, "/status?format=json")
            .await
            .contains("\"health\": \"passing\"")
    })
    .await;
    assert!(checked, "{:#?}", duet.log_lines());
    let seen = backend.seen();
    assert!(seen.iter().any(|s| s.path == "/healthz"), "{seen:?}");
    assert_eq!(get(&duet, "/served").await, (200, "tls-backend".to_owned()));

    // A backend whose certificate the cluster does not trust fails its checks, and the log says why.
    let stranger = TlsBackend::start(
        server_config(&Ca::new("other").server("api.internal", false), None),
        false,
    )
    .await;
    let other_dir = TempDir::new();
    std::fs::write(other_dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let refused = start_duet(
        &other_dir,
        stranger.address,
        "{ ca: ca.pem, server_name: api.internal }",
        "    health_check: { path: /healthz, interval: 100ms, timeout: 2s }\n",
    );
    assert!(
        logged(&refused, "backend not admitted: its health check failed"),
        "{:#?}",
        refused.log_lines()
    );
    assert!(
        logged(&refused, "UnknownIssuer"),
        "{:#?}",
        refused.log_lines()
    );
    let status = admin(&refused, "/status?format=json").await;
    assert!(status.contains("\"health\": \"failing\""), "{status}");
    assert_eq!(stranger.seen(), []);
    assert!(stranger.failed_handshakes.load(SeqCst) >= 1);
}

#[test]
fn check_reports_unusable_files_and_warns_about_verify_false() {
    let dir = TempDir::new();
    std::fs::write(dir.0.join("ca.pem"), "not a certificate\n").expect("ca");
    let config = dir.0.join("duet.yaml");
    let yaml = |tls: &str| {
        format!(
            "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    backends: [ {{ address: 127.0.0.1:9 }} ]\n    tls: {tls}\n"
        )
    };
    let check = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_duet"))
            .args(["check", "--config"])
            .arg(&config)
            .output()
            .expect("run")
    };
    std::fs::write(&config, yaml("{ ca: ca.pem, server_name: api.internal }")).expect("config");
    let output = check();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let expected = format!(
        "{}:6:16: clusters[0].tls.ca: {}: no certificate in the file",
        config.display(),
        dir.0.join("ca.pem").display()
    );
    assert!(stderr.contains(&expected), "{stderr}");

    std::fs::write(
        &config,
        yaml("{ ca: /nonexistent/ca.pem, server_name: api.internal }"),
    )
    .expect("config");
    let stderr = String::from_utf8_lossy(&check().stderr).into_owned();
    assert!(
        stderr.contains(
            "clusters[0].tls.ca: /nonexistent/ca.pem: cannot read: No such file or directory"
        ),
        "{stderr}"
    );

    // A backend given by IP has no name to verify: an error, unless verification is off.
    std::fs::write(&config, yaml("{ }")).expect("config");
    let output = check();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("backend 127.0.0.1:9 is given by IP and `tls` has no `server_name`"),
        "{stderr}"
    );
    assert!(stderr.contains("6:10"), "{stderr}");

    std::fs::write(&config, yaml("{ verify: false }")).expect("config");
    let output = check();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "warning: clusters[0].tls.verify: false: cluster `app` accepts any certificate"
        ),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_server_name_a_backend_is_verified_against_its_host_name() {
    let dir = TempDir::new();
    let ca = Ca::new("backends");
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let config = server_config(&ca.server("api.internal", false), None);
    let backend = TlsBackend::start(config, false).await;
    let port = backend.address.port();
    let yaml = format!(
        "workers: 1\nlisteners: [ {{ address: 127.0.0.1:0 }} ]\nroutes: [ {{ cluster: app }} ]\n\
         clusters:\n  - name: app\n    backends: [ {{ address: api.internal:{port} }} ]\n\
         \x20   tls: {{ ca: ca.pem }}\n"
    );
    let path = dir.0.join("duet.yaml");
    std::fs::write(&path, yaml).expect("config");
    let config = duet_config::load(&path).expect("valid");
    // Stands in for DNS: the name resolves to the loopback backend.
    let address = backend.address;
    let resolver: duet::Resolver = Arc::new(move |name: &str| {
        assert_eq!(name, format!("api.internal:{port}"));
        Ok(vec![address])
    });
    let server = duet::Server::start_with_resolver(config, resolver).expect("start");
    let url = format!("http://{}/by-name", server.local_addrs()[0]);
    let (status, _, body) = support::get(&url, &[]).await;
    assert_eq!((status, &body[..]), (200, &b"tls-backend"[..]));
    let seen = backend.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].sni.as_deref(), Some("api.internal"));
    assert_eq!(seen[0].path, "/by-name");
    let _ = tokio::task::spawn_blocking(move || server.shutdown()).await;
}

/// A gRPC backend speaking h2 over TLS, offering only `h2` by ALPN; counts the TCP connections it
/// accepts.
struct H2TlsBackend {
    address: SocketAddr,
    calls: Arc<Mutex<Vec<grpc::Call>>>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for H2TlsBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl H2TlsBackend {
    async fn start(cert: &Issued) -> Self {
        let mut config = (*server_config(cert, None)).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (c, n) = (calls.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                n.fetch_add(1, SeqCst);
                let (acceptor, calls) = (acceptor.clone(), c.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = service_fn(move |request| {
                        let calls = calls.clone();
                        async move {
                            let answer = grpc::answer("h2tls", Duration::ZERO, request, &calls);
                            Ok::<_, Infallible>(answer.await)
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            address,
            calls,
            connections,
            task,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_reach_an_h2_backend_over_tls_with_their_trailers_on_one_connection() {
    let dir = TempDir::new();
    let ca = Ca::new("backends");
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let backend = H2TlsBackend::start(&ca.server("grpc.internal", false)).await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: grpc.internal }",
        "    protocol: h2\n",
    );
    let sender = grpc::client(duet.address).await;
    for _ in 0..3 {
        let answer = grpc::call(&sender, "/test.Echo/Unary", &[]).await;
        assert_eq!(answer.head.status(), 200);
        assert_eq!(answer.messages, [Bytes::from_static(b"h2tls:hello")]);
        assert_eq!(grpc::grpc_status(&answer), Some("0"));
        assert_eq!(answer.trailers["x-served-by"], "h2tls");
    }
    let calls = backend.calls.lock().expect("calls").clone();
    assert_eq!(calls.len(), 3);
    for call in &calls {
        assert_eq!(call.path, "/test.Echo/Unary");
        assert_eq!(call.version, http::Version::HTTP_2);
        assert_eq!(call.te.as_deref(), Some("trailers"));
        assert_eq!(call.messages, [Bytes::from_static(b"hello")]);
    }
    // One TLS connection carried every call.
    assert_eq!(backend.connections.load(SeqCst), 1);

    // A reload that reads the same files keeps the h2 pool, its connection included.
    duet.signal("HUP");
    assert!(
        logged(&duet, "configuration reloaded"),
        "{:#?}",
        duet.log_lines()
    );
    let answer = grpc::call(&sender, "/test.Echo/Unary", &[]).await;
    assert_eq!(grpc::grpc_status(&answer), Some("0"));
    assert_eq!(backend.calls.lock().expect("calls").len(), 4);
    assert_eq!(backend.connections.load(SeqCst), 1);
    let metrics = admin(&duet, "/metrics").await;
    assert!(
        metrics.contains("duet_upstream_tls_handshakes_total{worker=\"0\",cluster=\"app\"} 1\n"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_cluster_refuses_a_tls_backend_that_does_not_choose_h2_by_alpn() {
    let dir = TempDir::new();
    let ca = Ca::new("backends");
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    // An HTTP/1.1 backend with no ALPN at all: its handshake succeeds, but it chose no h2.
    let config = server_config(&ca.server("api.internal", false), None);
    let backend = TlsBackend::start(config, false).await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: api.internal }",
        "    protocol: h2\n    retries: { attempts: 1 }\n",
    );
    assert_eq!(
        get(&duet, "/x").await,
        (502, "TLS handshake with the backend failed\n".to_owned())
    );
    assert_eq!(backend.seen(), [], "no h2 preface sent to it, no request");
    assert!(
        logged(&duet, "did not choose h2 by ALPN"),
        "{:#?}",
        duet.log_lines()
    );
    let metrics = admin(&duet, "/metrics").await;
    let failed = format!(
        "duet_backend_failures_total{{worker=\"0\",cluster=\"app\",backend=\"{}\",kind=\"tls\"}} 1\n",
        backend.address
    );
    assert!(metrics.contains(&failed), "{metrics}");
    let failures = "duet_upstream_tls_handshake_failures_total{worker=\"0\",cluster=\"app\"} 1\n";
    assert!(metrics.contains(failures), "{metrics}");
}

/// An h2-only TLS backend (ALPN `h2` alone) is health-checked over h2, with the cluster's TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_only_tls_backend_passes_its_health_check_over_h2() {
    let dir = TempDir::new();
    let ca = Ca::new("backends");
    std::fs::write(dir.0.join("ca.pem"), ca.pem()).expect("ca");
    let backend = H2TlsBackend::start(&ca.server("grpc.internal", false)).await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: grpc.internal }",
        "    protocol: h2\n    health_check: { path: /healthz, interval: 100ms, timeout: 2s }\n",
    );
    let checked = duet_testbed::wait::eventually_async(Duration::from_secs(10), || async {
        admin(&duet, "/status?format=json")
            .await
            .contains("\"health\": \"passing\"")
    })
    .await;
    assert!(checked, "{:#?}", duet.log_lines());
    let calls = backend.calls.lock().expect("calls").clone();
    assert!(calls.iter().any(|c| c.path == "/healthz"), "{calls:?}");
    assert!(calls.iter().all(|c| c.version == http::Version::HTTP_2));
    let refused = duet
        .log_lines()
        .into_iter()
        .find(|l| l.contains("not admitted"));
    assert_eq!(refused, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_call_over_a_failed_backend_tls_handshake_gets_grpc_status_unavailable() {
    let dir = TempDir::new();
    let (trusted, other) = (Ca::new("trusted"), Ca::new("other"));
    std::fs::write(dir.0.join("ca.pem"), trusted.pem()).expect("ca");
    let backend = H2TlsBackend::start(&other.server("grpc.internal", false)).await;
    let duet = start_duet(
        &dir,
        backend.address,
        "{ ca: ca.pem, server_name: grpc.internal }",
        "    protocol: h2\n    retries: { attempts: 1 }\n",
    );
    let sender = grpc::client(duet.address).await;
    let answer = grpc::call(&sender, "/test.Echo/Unary", &[]).await;
    assert_eq!(answer.head.status(), 200, "a trailers-only gRPC error");
    // gRPC's HTTP mapping: the backend could not be reached, so a client may retry elsewhere.
    assert_eq!(grpc::grpc_status(&answer), Some("14"));
    assert!(backend.calls.lock().expect("calls").is_empty());
    assert!(
        logged(&duet, "outcome=backend_tls_failed"),
        "{:#?}",
        duet.log_lines()
    );
}
