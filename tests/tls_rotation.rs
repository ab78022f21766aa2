//! Certificate rotation without a signal, as a Kubernetes Secret does it: `cert.pem` and `key.pem`
//! are symlinks through `..data`, and an update swaps `..data` to a new folder in one rename. A
//! bounded loop of requests, each on a new TLS connection, runs through three swaps (a new
//! certificate, a broken key, another certificate): none fails, each good certificate is served
//! within 2 s of its swap, and the broken one keeps the certificate in use.

use crate::support::{Duet, TempDir};
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
