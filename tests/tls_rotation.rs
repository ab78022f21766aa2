//! Certificate rotation without a signal, as a Kubernetes Secret does it: `cert.pem` and `key.pem`
//! are symlinks through `..data`, and an update swaps `..data` to a new folder in one rename. A
//! bounded loop of requests, each on a new TLS connection, runs through three swaps (a new
//! certificate, a broken key, another certificate): none fails, each good certificate is served
//! within 2 s of its swap, and the broken one keeps the certificate in use.

use crate::support::{self, Duet, TempDir};
use duet_testbed::{Backend, BackendOptions};
use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{
    rustls::{self, pki_types::ServerName},
    TlsConnector,
};

/// Writes `cert` and `key` into `DIR/NAME/` and points `DIR/..data` at it with one rename.
fn swap_in(dir: &Path, name: &str, cert: &str, key: &str) {
    let folder = dir.join(name);
    std::fs::create_dir(&folder).expect("folder");
    std::fs::write(folder.join("cert.pem"), cert).expect("cert");
    std::fs::write(folder.join("key.pem"), key).expect("key");
    let staged = dir.join("..data_tmp");
    std::os::unix::fs::symlink(name, &staged).expect("symlink");
    std::fs::rename(&staged, dir.join("..data")).expect("swap");
}

/// One request on a new connection: the leaf certificate served (DER), or why it failed.
async fn one(address: std::net::SocketAddr, client: &TlsConnector) -> Result<Vec<u8>, String> {
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = client.connect(name, tcp).await.map_err(|e| e.to_string())?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec());
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response)).await;
    if !response.starts_with("HTTP/1.1 200") {
        return Err(format!("response: {response:?}"));
    }
    leaf.ok_or_else(|| "no certificate".to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapped_files_are_served_within_2s_with_no_failed_request_and_a_broken_one_keeps_the_old()
{
    let dir = TempDir::new();
    let generated: Vec<_> = (0..3)
        .map(|_| rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert"))
        .collect();
    let pem = |i: usize| {
        (
            generated[i].cert.pem(),
            generated[i].signing_key.serialize_pem(),
        )
    };
    let (cert0, key0) = pem(0);
    swap_in(&dir.0, "v0", &cert0, &key0);
    std::os::unix::fs::symlink("..data/cert.pem", dir.0.join("cert.pem")).expect("link");
    std::os::unix::fs::symlink("..data/key.pem", dir.0.join("key.pem")).expect("link");
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let yaml = format!(
        "workers: 2\nlisteners:\n  - address: 127.0.0.1:0\n    tls: {{ cert: cert.pem, key: key.pem }}\n\
         routes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    backends: [ {{ address: {} }} ]\n",
        backend.address()
    );
    std::fs::write(dir.0.join("duet.yaml"), yaml).expect("config");
    let duet = Duet::start_at(&dir.0.join("duet.yaml"));

    let mut roots = rustls::RootCertStore::empty();
    for g in &generated {
        roots.add(g.cert.der().clone()).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = TlsConnector::from(Arc::new(config));
    let der = |i: usize| generated[i].cert.der().to_vec();
    let (mut requests, mut failed) = (0u32, Vec::new());

    // Requests until `until`, or until `wanted` is served; when it was first served after `since`.
    let mut run = async |until: Duration, wanted: Option<Vec<u8>>, keep: Option<Vec<u8>>| {
        let since = Instant::now();
        while since.elapsed() < until {
            requests += 1;
            match one(duet.address, &client).await {
                Ok(leaf) if Some(&leaf) == wanted.as_ref() => return Some(since.elapsed()),
                Ok(leaf) => {
                    if let Some(keep) = &keep {
                        assert_eq!(&leaf, keep, "the certificate in use stays");
                    }
                }
                Err(error) => failed.push(error),
            }
        }
        None
    };
    assert!(run(Duration::from_millis(500), None, Some(der(0)))
        .await
        .is_none());
    let (cert1, key1) = pem(1);
    swap_in(&dir.0, "v1", &cert1, &key1);
    let first = run(Duration::from_secs(4), Some(der(1)), None).await;
    // A key that does not fit the certificate: the one in use stays, for well past a poll.
    let (cert2, _) = pem(2);
    swap_in(&dir.0, "v2", &cert2, &key1);
    assert!(run(Duration::from_millis(2500), None, Some(der(1)))
        .await
        .is_none());
    let (cert2, key2) = pem(2);
    swap_in(&dir.0, "v3", &cert2, &key2);
    let second = run(Duration::from_secs(4), Some(der(2)), None).await;
    eprintln!("{requests} requests; new certificate served after {first:?} and {second:?}");
    assert_eq!(failed, Vec::<String>::new(), "of {requests}");
    let limit = Duration::from_secs(2);
    assert!(first.is_some_and(|t| t <= limit), "{first:?}");
    assert!(second.is_some_and(|t| t <= limit), "{second:?}");
    let metrics = duet.log_lines().join("\n");
    assert!(metrics.contains("do not load"), "the broken swap is logged");
}

/// A self-signed `localhost` certificate expiring at midnight UTC of `year-month-day`: PEM, key
/// PEM, DER.
fn expiring(year: i32, month: u8, day: u8) -> (String, String, Vec<u8>) {
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("names");
    params.not_after = rcgen::date_time_ymd(year, month, day);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("certificate");
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expiry_gauge_and_the_handshakes_name_the_listener_and_follow_a_rotation() {
    let dir = TempDir::new();
    let (cert0, key0, der0) = expiring(2031, 1, 2);
    let (cert1, key1, der1) = expiring(2032, 3, 4);
    swap_in(&dir.0, "v0", &cert0, &key0);
    std::os::unix::fs::symlink("..data/cert.pem", dir.0.join("cert.pem")).expect("link");
    std::os::unix::fs::symlink("..data/key.pem", dir.0.join("key.pem")).expect("link");
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let yaml = format!(
        "workers: 1\nadmin: {{ address: 127.0.0.1:0 }}\nlisteners:\n  - address: 127.0.0.1:0\n  \
         - name: edge\n    address: 127.0.0.1:0\n    tls: {{ cert: cert.pem, key: key.pem }}\n\
         routes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    backends: [ {{ address: {} }} ]\n",
        backend.address()
    );
    std::fs::write(dir.0.join("duet.yaml"), yaml).expect("config");
    let duet = Duet::start_at(&dir.0.join("duet.yaml"));
    // `Duet` waits for the first listener's line; the TLS listener's may come a moment later.
    let tls_line = || -> Option<std::net::SocketAddr> {
        duet.log_lines().iter().find_map(|l| {
            l.split("listening on https://")
                .nth(1)?
                .split([' ', '"'])
                .next()?
                .parse()
                .ok()
        })
    };
    assert!(
        support::eventually(std::time::Duration::from_secs(5), || tls_line().is_some()),
        "{:#?}",
        duet.log_lines()
    );
    let tls_address = tls_line().expect("the TLS listener's address");
    let mut roots = rustls::RootCertStore::empty();
    for der in [&der0, &der1] {
        roots.add(der.clone().into()).expect("root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let client = TlsConnector::from(Arc::new(config));
    assert_eq!(one(tls_address, &client).await, Ok(der0.clone()));
    let gauge = |metrics: &str| -> Vec<String> {
        let name = "duet_tls_certificate_expiry_timestamp_seconds{";
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .map(str::to_owned)
            .collect()
    };
    let metrics = crate::admin::get(duet.admin_address(), "/metrics");
    let certificate = dir.0.join("cert.pem").display().to_string();
    let line = |at: u64| {
        format!(
            "duet_tls_certificate_expiry_timestamp_seconds{{listener=\"edge\",\
             certificate=\"{certificate}\",names=\"localhost\"}} {at}"
        )
    };
    assert_eq!(gauge(&metrics), [line(1_925_078_400)], "{metrics}");
    // Only the TLS listener has handshake series, under its name.
    let handshakes =
        "duet_tls_handshakes_total{worker=\"0\",listener=\"edge\",result=\"success\"} 1";
    assert!(metrics.contains(handshakes), "{metrics}");
    assert_eq!(metrics.matches("duet_tls_handshakes_total{").count(), 8);

    swap_in(&dir.0, "v1", &cert1, &key1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while one(tls_address, &client).await != Ok(der1.clone()) {
        assert!(Instant::now() < deadline, "the new certificate is served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = crate::admin::get(duet.admin_address(), "/metrics");
    assert_eq!(gauge(&metrics), [line(1_961_971_200)], "{metrics}");
}
