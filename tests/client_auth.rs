//! Client certificates on a TLS listener (`tls.client_auth`), with a real rustls client that shows
//! one or not: `required` refuses a client without one, `optional` serves it without
//! `X-Forwarded-Client-Cert`; the backend sees the field (Envoy's format) exactly when a verified
//! certificate was shown, and never the one a client wrote itself.

use crate::support::{self, Duet, TempDir};
use duet_testbed::{Backend, BackendOptions};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use std::{sync::Arc, time::Duration};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::{
    self,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
};

/// A CA, and a client certificate it signed (CN `duet client`, a URI and a DNS name).
struct Clients {
    ca_pem: String,
    cert: CertificateDer<'static>,
    key: KeyPair,
}

fn clients() -> Clients {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "duet test CA");
    let ca_key = KeyPair::generate().expect("ca key");
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let mut client = CertificateParams::new(vec!["client.test".to_owned()]).expect("client params");
    client
        .distinguished_name
        .push(DnType::CommonName, "duet client");
    client
        .distinguished_name
        .push(DnType::OrganizationName, "Duet");
    let uri = "spiffe://duet/test".try_into().expect("ia5");
    client.subject_alt_names.push(SanType::URI(uri));
    let key = KeyPair::generate().expect("client key");
    let issuer = Issuer::new(ca, ca_key);
    let cert = client.signed_by(&key, &issuer).expect("client cert");
    Clients {
        ca_pem: ca_cert.pem(),
        cert: cert.der().clone(),
        key,
    }
}

/// A GET over TLS (trusting `server`), showing `clients`' certificate if `show`; the response, or
/// why nothing came.
async fn fetch(
    address: std::net::SocketAddr,
    server: &rcgen::Certificate,
    clients: &Clients,
    show: bool,
) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(server.der().clone()).map_err(|e| e.to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = if show {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(clients.key.serialize_der()));
        builder
            .with_client_auth_cert(vec![clients.cert.clone()], key)
            .map_err(|e| e.to_string())?
    } else {
        builder.with_no_client_auth()
    };
    let mut tls = support::tls_connect(address, config).await?;
    tls.write_all(
        b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Forwarded-Client-Cert: Hash=forged\r\nConnection: close\r\n\r\n",
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut response = String::new();
    let read =
        tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response)).await;
    match read {
        Ok(Ok(_)) if !response.is_empty() => Ok(response),
        Ok(Err(e)) => Err(e.to_string()),
        _ => Err(format!("nothing came: {response:?}")),
    }
}

fn start(
    mode: &str,
    dir: &TempDir,
    certificate: &support::TestCertificate,
    backend: &Backend,
) -> Duet {
    let yaml = format!(
        "workers: 1\nlisteners:\n  - address: 127.0.0.1:0\n    tls:\n      cert: {}\n      key: {}\n      \
         client_auth: {{ ca: ca.pem, mode: {mode} }}\nadmin: {{ address: 127.0.0.1:0 }}\nroutes: [ {{ cluster: app }} ]\n\
         clusters:\n  - name: app\n    backends: [ {{ address: {} }} ]\n",
        certificate.cert,
        certificate.key,
        backend.address()
    );
    let path = dir.0.join(format!("{mode}.yaml"));
    std::fs::write(&path, yaml).expect("config");
    Duet::start_at(&path)
}

/// What the backend was told of the last request's client certificate.
fn forwarded(backend: &Backend) -> Option<String> {
    let seen = backend.recorded().pop().expect("a request");
    let value = seen.headers.get("x-forwarded-client-cert")?;
    Some(value.to_str().expect("ascii").to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_refuses_a_client_without_one_and_the_backend_sees_who_showed_one() {
    let dir = TempDir::new();
    let clients = clients();
    std::fs::write(dir.0.join("ca.pem"), &clients.ca_pem).expect("ca");
    let certificate = support::TestCertificate::localhost();
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let server = &certificate.generated.cert;
    let hash: String = {
        std::fs::write(dir.0.join("client.der"), &clients.cert).expect("der");
        let output = std::process::Command::new("sha256sum")
            .arg(dir.0.join("client.der"))
            .output()
            .expect("sha256sum");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.split_whitespace().next().expect("a digest").to_owned()
    };
    let expected = format!(
        "Hash={hash};Subject=\"O=Duet,CN=duet client\";URI=spiffe://duet/test;DNS=client.test"
    );

    let required = start("required", &dir, &certificate, &backend);
    let refused = fetch(required.address, server, &clients, false).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(backend.recorded().is_empty());
    let response = fetch(required.address, server, &clients, true)
        .await
        .expect("served");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(forwarded(&backend).as_deref(), Some(expected.as_str()));
    let metrics = crate::admin::get(required.admin_address(), "/metrics");
    let handshakes = |result: &str| {
        let labels = format!("result=\"{result}\"");
        crate::admin::sum(&metrics, "duet_tls_handshakes_total", &labels)
    };
    assert_eq!(handshakes("no_client_certificate"), 1.0, "{metrics}");
    assert_eq!(handshakes("success"), 1.0);

    let optional = start("optional", &dir, &certificate, &backend);
    let response = fetch(optional.address, server, &clients, false)
        .await
        .expect("served");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(
        forwarded(&backend),
        None,
        "the client's own field is removed"
    );
    let response = fetch(optional.address, server, &clients, true)
        .await
        .expect("served");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert_eq!(forwarded(&backend).as_deref(), Some(expected.as_str()));
    assert_eq!(backend.recorded().len(), 3);
}
