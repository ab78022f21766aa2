//! A listener's certificates chosen by SNI, as a real OpenSSL client sees them: three names get three
//! certificates, a wildcard covers one label only, no SNI or an unknown name gets the default;
//! `min_version: "1.3"` refuses TLS 1.2; `duet check` warns of a name two certificates cover and of
//! an expired one.

use crate::support::{Duet, TempDir};
use duet_testbed::{Backend, BackendOptions};
use std::{path::Path, process::Command};

/// A self-signed certificate for `names`, written to `DIR/FILE.pem` and `DIR/FILE.key`.
fn certificate(dir: &Path, file: &str, names: &[&str], expired: bool) -> String {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = rcgen::CertificateParams::new(names).expect("names");
    if expired {
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
    }
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("certificate");
    std::fs::write(dir.join(format!("{file}.pem")), cert.pem()).expect("cert");
    std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).expect("key");
    cert.pem()
}

/// The certificate (PEM, whitespace removed) `openssl s_client` is served at `address` for `name`
/// (`None`: no SNI), with extra `args`; `None` if the handshake fails.
fn served(address: std::net::SocketAddr, name: Option<&str>, args: &[&str]) -> Option<String> {
    let mut command = Command::new("timeout");
    command
        .args([
            "10",
            "openssl",
            "s_client",
            "-connect",
            &address.to_string(),
        ])
        .args(args);
    match name {
        Some(name) => command.args(["-servername", name]),
        None => command.arg("-noservername"),
    };
    let output = command
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let begin = text.find("-----BEGIN CERTIFICATE-----")?;
    let end = text[begin..].find("-----END CERTIFICATE-----")? + begin;
    Some(compact(&text[begin..end]))
}

fn compact(pem: &str) -> String {
    let end = pem.find("-----END").unwrap_or(pem.len());
    pem[..end].split_whitespace().collect()
}

fn config(backend: std::net::SocketAddr, tls: &str) -> String {
    format!(
        "workers: 1\nlisteners:\n  - address: 127.0.0.1:0\n    tls:\n{tls}\nroutes: [ {{ cluster: app }} ]\n\
         clusters:\n  - name: app\n    backends: [ {{ address: {backend} }} ]\n"
    )
}

#[test]
fn three_names_get_three_certificates_and_the_rest_the_default() {
    let dir = TempDir::new();
    let shop = compact(&certificate(
        &dir.0,
        "shop",
        &["shop.test", "www.shop.test"],
        false,
    ));
    let api = compact(&certificate(&dir.0, "api", &["api.test"], false));
    let apps = compact(&certificate(&dir.0, "apps", &["*.apps.test"], false));
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let tls = "      certificates:\n        \
               - { cert: shop.pem, key: shop.key }\n        \
               - { cert: api.pem, key: api.key }\n        \
               - { cert: apps.pem, key: apps.key }\n      \
               default: api.pem";
    let path = dir.0.join("duet.yaml");
    std::fs::write(&path, config(backend.address(), tls)).expect("config");
    let duet = Duet::start_at(&path);
    let cases = [
        (Some("shop.test"), &shop, "exact name"),
        (Some("WWW.Shop.Test"), &shop, "a name in any case"),
        (Some("api.test"), &api, "exact name"),
        (Some("eu.apps.test"), &apps, "wildcard, one label"),
        (
            Some("a.eu.apps.test"),
            &api,
            "wildcard covers one label only: default",
        ),
        (
            Some("apps.test"),
            &api,
            "wildcard does not cover its parent: default",
        ),
        (Some("other.test"), &api, "unknown name: default"),
        (None, &api, "no SNI: default"),
    ];
    for (name, expected, why) in cases {
        let got = served(duet.address, name, &[]);
        assert_eq!(got.as_ref(), Some(expected), "{name:?}: {why}");
    }
}

#[test]
fn min_version_1_3_refuses_tls_1_2() {
    let dir = TempDir::new();
    let only = compact(&certificate(&dir.0, "only", &["only.test"], false));
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let tls = "      { cert: only.pem, key: only.key, min_version: \"1.3\" }";
    let path = dir.0.join("duet.yaml");
    std::fs::write(
        &path,
        config(backend.address(), tls).replace("tls:\n      {", "tls: {"),
    )
    .expect("config");
    let duet = Duet::start_at(&path);
    assert_eq!(
        served(duet.address, Some("only.test"), &["-tls1_3"]),
        Some(only)
    );
    assert_eq!(served(duet.address, Some("only.test"), &["-tls1_2"]), None);
}

#[test]
fn check_warns_of_a_name_two_certificates_cover_and_of_an_expired_one() {
    let dir = TempDir::new();
    certificate(&dir.0, "a", &["shop.test", "*.apps.test"], false);
    certificate(&dir.0, "b", &["*.apps.test"], true);
    let tls = "      certificates:\n        \
               - { cert: a.pem, key: a.key }\n        \
               - { cert: b.pem, key: b.key }";
    let path = dir.0.join("duet.yaml");
    std::fs::write(&path, config("127.0.0.1:9".parse().expect("address"), tls)).expect("config");
    let output = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let (file, b) = (path.display(), dir.0.join("b.pem"));
    let b = b.display();
    let a = dir.0.join("a.pem");
    let a = a.display();
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    let expired_days = {
        let expired_at = 1_609_459_200; // 2021-01-01T00:00:00Z
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        (now - expired_at) / 86_400
    };
    assert_eq!(
        warnings,
        [
            format!(
                "{file}:7:19: warning: listeners[0].tls.certificates[1].cert: {b}: `*.apps.test` is \
                 covered by {a} too, which is listed first and gets it"
            ),
            format!(
                "{file}:7:19: warning: listeners[0].tls.certificates[1].cert: {b}: expired \
                 {expired_days} days ago: clients refuse it"
            ),
        ]
    );
}
