//! TLS session resumption: a client coming back resumes its session (no certificate signature, one
//! round trip) from a ticket, and the ticket keys outlive a reload, which builds every acceptor
//! again. With `session_tickets: false` a session resumes only from the acceptor's own cache, which a
//! reload empties.

use crate::support::{self, Duet, TempDir};
use duet_testbed::{Backend, BackendOptions};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::{self, HandshakeKind};

/// One request on a new connection with `client` (whose session store is kept across calls): how
/// the handshake went.
async fn handshake(address: std::net::SocketAddr, client: &rustls::ClientConfig) -> HandshakeKind {
    let mut tls = support::tls_connect(address, client.clone())
        .await
        .expect("handshake");
    let kind = tls.get_ref().1.handshake_kind().expect("handshake done");
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    // Reading the answer also reads the tickets duet sends after the handshake.
    let mut response = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response)).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    kind
}

/// duet with `tls_extra` in its listener's `tls:` block, its config in a folder of its own.
fn start(
    tls_extra: &str,
    backend: &Backend,
    certificate: &support::TestCertificate,
) -> (Duet, TempDir) {
    let dir = TempDir::new();
    let yaml = format!(
        "workers: 2\nlisteners:\n  - address: 127.0.0.1:0\n    tls: {{ cert: {}, key: {}{tls_extra} }}\n\
         routes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    backends: [ {{ address: {} }} ]\n",
        certificate.cert,
        certificate.key,
        backend.address()
    );
    std::fs::write(dir.0.join("duet.yaml"), yaml).expect("config");
    (Duet::start_at(&dir.0.join("duet.yaml")), dir)
}

/// Sends SIGHUP and waits until duet says it reloaded.
fn reload(duet: &Duet) {
    duet.signal("HUP");
    let reloaded = duet_testbed::wait::eventually(Duration::from_secs(5), || {
        duet.log_lines()
            .iter()
            .any(|l| l.contains("SIGHUP: reloaded "))
    });
    assert!(reloaded, "{:#?}", duet.log_lines());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_client_resumes_its_session_even_after_a_reload() {
    let certificate = support::TestCertificate::localhost();
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let (duet, _dir) = start("", &backend, &certificate);
    let client = certificate.client_config();
    assert_eq!(handshake(duet.address, &client).await, HandshakeKind::Full);
    assert_eq!(
        handshake(duet.address, &client).await,
        HandshakeKind::Resumed
    );
    reload(&duet);
    assert_eq!(
        handshake(duet.address, &client).await,
        HandshakeKind::Resumed,
        "the ticket keys outlive the acceptor a reload replaced"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tickets_a_reload_forgets_every_session() {
    let certificate = support::TestCertificate::localhost();
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let (duet, _dir) = start(", session_tickets: false", &backend, &certificate);
    let client = certificate.client_config();
    assert_eq!(handshake(duet.address, &client).await, HandshakeKind::Full);
    assert_eq!(
        handshake(duet.address, &client).await,
        HandshakeKind::Resumed,
        "the acceptor's own session cache"
    );
    reload(&duet);
    assert_eq!(handshake(duet.address, &client).await, HandshakeKind::Full);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_shown_to_returning_clients_too() {
    let certificate = support::TestCertificate::localhost();
    let rotated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let (duet, _dir) = start("", &backend, &certificate);
    let mut roots = rustls::RootCertStore::empty();
    for root in [&certificate.generated.cert, &rotated.cert] {
        roots.add(root.der().clone()).expect("root");
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    assert_eq!(handshake(duet.address, &client).await, HandshakeKind::Full);
    assert_eq!(
        handshake(duet.address, &client).await,
        HandshakeKind::Resumed
    );

    std::fs::write(&certificate.key, rotated.signing_key.serialize_pem()).expect("key");
    std::fs::write(&certificate.cert, rotated.cert.pem()).expect("cert");
    // The rotation reads the files once a second; until then a returning client still resumes.
    let mut kind = HandshakeKind::Resumed;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        kind = handshake(duet.address, &client).await;
        if kind == HandshakeKind::Full {
            break;
        }
    }
    assert_eq!(kind, HandshakeKind::Full, "{:#?}", duet.log_lines());
}
