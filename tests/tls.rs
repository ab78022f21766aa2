//! TLS termination on a listener: a real rustls client talks HTTPS to duet, duet talks HTTP to the
//! backend and tells it `X-Forwarded-Proto: https`.

use crate::support;

use crate::support::{Duet, TempDir};
use duet_testbed::config::DuetConfig;
use duet_testbed::{Backend, BackendOptions};
use std::{sync::Arc, time::Duration};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{rustls::pki_types::ServerName, TlsConnector};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_in_http_out() {
    let certificate = support::TestCertificate::localhost();
    let backend = Backend::start(BackendOptions::named("plain")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .workers(2)
        .tls(&certificate.cert, &certificate.key)
        .to_yaml();
    let duet = Duet::start(&yaml);

    let config = certificate.client_config();
    let connector = TlsConnector::from(Arc::new(config));
    for _ in 0..3 {
        let tcp = tokio::net::TcpStream::connect(duet.address)
            .await
            .expect("connect");
        let mut tls = connector
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
            .expect("handshake with a certificate for localhost");
        tls.write_all(b"GET /over-tls HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .expect("request");
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response))
            .await
            .expect("in time")
            .ok();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(response.ends_with("plain"), "{response}");
    }
    let seen = backend.recorded().pop().expect("request");
    assert_eq!(seen.uri, "/over-tls");
    assert_eq!(seen.headers["x-forwarded-proto"], "https");

    // Plain HTTP on the TLS port is not served.
    let (response, closed) = support::raw_exchange(
        duet.address,
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        Duration::from_secs(3),
    );
    assert!(!response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(closed);
}

/// GET over TLS trusting only `root`; the response, or why the handshake failed.
async fn fetch(address: std::net::SocketAddr, root: &rcgen::Certificate) -> Result<String, String> {
    let config = support::client_trusting(root)?;
    let mut tls = support::tls_connect(address, config).await?;
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response)).await;
    Ok(response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_the_certificate() {
    let dir = TempDir::new();
    let (cert, key) = (dir.0.join("cert.pem"), dir.0.join("key.pem"));
    let write = |generated: &rcgen::CertifiedKey<rcgen::KeyPair>| {
        std::fs::write(&cert, generated.cert.pem()).expect("cert");
        std::fs::write(&key, generated.signing_key.serialize_pem()).expect("key");
    };
    let old = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("old");
    let new = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("new");
    write(&old);
    let backend = Backend::start(BackendOptions::named("plain")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .workers(2)
        .tls("cert.pem", "key.pem")
        .to_yaml();
    // Relative paths are taken from the config file's folder.
    std::fs::write(dir.0.join("duet.yaml"), &yaml).expect("config");
    let duet = Duet::start_at(&dir.0.join("duet.yaml"));
    assert!(fetch(duet.address, &old.cert)
        .await
        .expect("old cert")
        .starts_with("HTTP/1.1 200"));
    assert!(
        fetch(duet.address, &new.cert).await.is_err(),
        "not yet the new certificate"
    );

    write(&new);
    duet.signal("HUP");
    let rotated = duet_testbed::wait::eventually_async(Duration::from_secs(5), || async {
        fetch(duet.address, &new.cert)
            .await
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await;
    assert!(rotated, "{:#?}", duet.log_lines());
    for _ in 0..5 {
        assert!(
            fetch(duet.address, &old.cert).await.is_err(),
            "every worker rotated"
        );
    }
}

#[test]
fn a_missing_certificate_is_reported_at_its_field() {
    let dir = TempDir::new();
    let config = dir.0.join("tls.yaml");
    std::fs::write(
        &config,
        "listeners:\n  - address: 127.0.0.1:0\n    tls: { cert: /nonexistent/cert.pem, key: /nonexistent/key.pem }\nroutes: [ { cluster: app } ]\nclusters:\n  - name: app\n    backends: [ { address: 127.0.0.1:9 } ]\n",
    )
    .expect("config");
    // Parsing reads nothing but the file; the certificate is read (and found missing) by check and run.
    duet_config::load(&config).expect("the file itself is valid");
    let stderr = check_fails(&config);
    let expected = format!(
        "{}:3:18: listeners[0].tls.cert: /nonexistent/cert.pem: not a PEM certificate chain",
        config.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn check_parses_certificates_and_reports_a_bad_one() {
    let dir = TempDir::new();
    std::fs::write(
        dir.0.join("cert.pem"),
        "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n",
    )
    .expect("cert");
    std::fs::write(dir.0.join("key.pem"), "no key here\n").expect("key");
    let config = dir.0.join("duet.yaml");
    std::fs::write(
        &config,
        "listeners:\n  - address: 127.0.0.1:0\n    tls: { cert: cert.pem, key: key.pem }\nroutes: [ { cluster: app } ]\nclusters:\n  - name: app\n    backends: [ { address: 127.0.0.1:9 } ]\n",
    )
    .expect("config");
    // The certificate's DER is read as X.509 (its names and expiry choose it by SNI), so a PEM
    // block of garbage is named before the key is read.
    let stderr = check_fails(&config);
    assert!(
        stderr.contains("listeners[0].tls.cert: ")
            && stderr.contains("cert.pem: not an X.509 certificate"),
        "{stderr}"
    );
    // With a good certificate, the key is read and refused.
    let good = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    std::fs::write(dir.0.join("cert.pem"), good.cert.pem()).expect("cert");
    let stderr = check_fails(&config);
    assert!(
        stderr.contains("key.pem: not a PEM private key"),
        "{stderr}"
    );
}

/// Runs `duet check` on `config`, expecting exit code 1; returns what it printed on stderr.
fn check_fails(config: &std::path::Path) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(["check", "--config"])
        .arg(config)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    stderr
}

/// `hsts:` (the worked example of a filter) end to end: a backend's response over TLS carries the
/// route's `Strict-Transport-Security`, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_hsts_sets_the_field_on_responses_over_tls() {
    let certificate = support::TestCertificate::localhost();
    let backend = Backend::start(BackendOptions::named("plain")).expect("backend");
    let yaml = DuetConfig::single("p2c_inflight", &[backend.address()])
        .tls(&certificate.cert, &certificate.key)
        .to_yaml()
        .replace(
            "cluster: app }",
            "cluster: app, hsts: { max_age: 10m, include_subdomains: true } }",
        );
    assert!(yaml.contains("hsts:"), "{yaml}");
    let duet = Duet::start(&yaml);
    let mut tls = support::tls_connect(duet.address, certificate.client_config())
        .await
        .expect("handshake");
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response)).await;
    let fields: Vec<&str> = (response.lines())
        .filter(|line| {
            line.to_ascii_lowercase()
                .starts_with("strict-transport-security:")
        })
        .collect();
    assert_eq!(
        fields,
        ["strict-transport-security: max-age=600; includeSubDomains"],
        "{response}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_connection_opened_ahead_of_its_first_request_waits_for_it_as_a_kept_alive_one_would()
{
    let certificate = support::TestCertificate::localhost();
    let backend = Backend::start(BackendOptions::named("plain")).expect("backend");
    let yaml = DuetConfig::single("p2c_peak_ewma", &[backend.address()])
        .tls(&certificate.cert, &certificate.key)
        .section(
            "limits",
            "{ header_read_timeout: 1s, keepalive_timeout: 30s }",
        )
        .to_yaml();
    let duet = Duet::start(&yaml);
    let connector = TlsConnector::from(Arc::new(certificate.client_config()));
    let tcp = tokio::net::TcpStream::connect(duet.address)
        .await
        .expect("connect");
    let mut tls = connector
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("handshake");
    // Wall-clock: the request comes after the header timeout has passed since the handshake.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    tls.write_all(b"GET /late HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response))
        .await
        .expect("in time")
        .ok();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}
