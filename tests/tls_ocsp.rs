//! OCSP stapling (`certificates[].ocsp`): a response made by `openssl ocsp` from a test CA's index is
//! stapled to the handshakes `openssl s_client -status` makes, over TLS 1.3 and 1.2; a new response
//! written over the file is stapled within 2 s, without a signal; a file that is not a successful
//! response keeps the one in use.

use crate::support::{Duet, TempDir};
use duet_testbed::{Backend, BackendOptions};
use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// Runs `openssl` with `args` in `dir`; panics with its output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl runs");
    assert!(output.status.success(), "openssl {args:?}: {output:?}");
}

/// A CA, a certificate for `ocsp.test` it issued (serial 0x1001) in `site.pem`/`site.key`, and the
/// CA's OCSP responses for it in `good.der` and `revoked.der`.
fn make_pki(dir: &Path) {
    let p256 = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let ca = [
        &["req", "-x509"][..],
        &p256,
        &["-keyout", "ca.key", "-out", "ca.pem"],
    ]
    .concat();
    openssl(
        dir,
        &[&ca[..], &["-subj", "/CN=duet test OCSP CA", "-days", "30"]].concat(),
    );
    let csr = [
        &["req"][..],
        &p256,
        &["-keyout", "site.key", "-out", "site.csr"],
    ]
    .concat();
    let san = [
        "-subj",
        "/CN=ocsp.test",
        "-addext",
        "subjectAltName=DNS:ocsp.test",
    ];
    openssl(dir, &[&csr[..], &san].concat());
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "site.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "0x1001",
            "-days",
            "30",
            "-copy_extensions",
            "copy",
            "-out",
            "site.pem",
        ],
    );
    let request = [
        "ocsp",
        "-issuer",
        "ca.pem",
        "-cert",
        "site.pem",
        "-no_nonce",
    ];
    openssl(dir, &[&request[..], &["-reqout", "request.der"]].concat());
    let respond = [
        "ocsp",
        "-index",
        "index.txt",
        "-rsigner",
        "ca.pem",
        "-rkey",
        "ca.key",
        "-CA",
        "ca.pem",
        "-reqin",
        "request.der",
        "-ndays",
        "7",
        "-respout",
    ];
    for (status, file) in [
        ("V\t301231000000Z\t", "good.der"),
        ("R\t301231000000Z\t260101000000Z", "revoked.der"),
    ] {
        let index = format!("{status}\t1001\tunknown\t/CN=ocsp.test\n");
        std::fs::write(dir.join("index.txt"), index).expect("index");
        openssl(dir, &[&respond[..], &[file]].concat());
    }
}

/// What `openssl s_client -status` (TLS `version`) is told of the certificate's OCSP status:
/// `good`, `revoked`, or `none` when nothing was stapled.
fn stapled(address: std::net::SocketAddr, version: &str) -> String {
    let output = Command::new("timeout")
        .args([
            "10",
            "openssl",
            "s_client",
            "-connect",
            &address.to_string(),
        ])
        .args(["-servername", "ocsp.test", "-status", version])
        .stdin(Stdio::null())
        .output()
        .expect("openssl s_client runs");
    let text = String::from_utf8_lossy(&output.stdout);
    if text.contains("OCSP response: no response sent") {
        return "none".to_owned();
    }
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Cert Status: "))
        .map_or_else(|| format!("no status in {text}"), str::to_owned)
}

/// Replaces `file` in `dir` with `content` in one rename, as a refreshing tool should.
fn replace(dir: &Path, file: &str, content: &[u8]) {
    std::fs::write(dir.join("staged.tmp"), content).expect("staged");
    std::fs::rename(dir.join("staged.tmp"), dir.join(file)).expect("rename");
}

#[test]
fn the_response_in_the_file_is_stapled_and_a_new_one_replaces_it_without_a_signal() {
    let dir = TempDir::new();
    make_pki(&dir.0);
    std::fs::copy(dir.0.join("good.der"), dir.0.join("site.ocsp")).expect("response");
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let yaml = format!(
        "workers: 1\nlisteners:\n  - address: 127.0.0.1:0\n    tls:\n      certificates:\n        \
         - {{ cert: site.pem, key: site.key, ocsp: site.ocsp }}\n\
         routes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    backends: [ {{ address: {} }} ]\n",
        backend.address()
    );
    std::fs::write(dir.0.join("duet.yaml"), yaml).expect("config");
    let duet = Duet::start_at(&dir.0.join("duet.yaml"));
    assert_eq!(stapled(duet.address, "-tls1_3"), "good");
    assert_eq!(stapled(duet.address, "-tls1_2"), "good");

    let revoked = std::fs::read(dir.0.join("revoked.der")).expect("revoked");
    replace(&dir.0, "site.ocsp", &revoked);
    let swapped = Instant::now();
    while stapled(duet.address, "-tls1_3") != "revoked" {
        assert!(
            swapped.elapsed() < Duration::from_secs(2),
            "not stapled in time"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // A response cut short keeps the one in use, for well past a poll.
    replace(&dir.0, "site.ocsp", &revoked[..100]);
    let cut = Instant::now();
    while cut.elapsed() < Duration::from_millis(2500) {
        assert_eq!(stapled(duet.address, "-tls1_3"), "revoked");
        std::thread::sleep(Duration::from_millis(200));
    }
    let logged = duet
        .log_lines()
        .iter()
        .any(|l| l.contains("not a DER OCSP response"));
    assert!(logged, "{:#?}", duet.log_lines());
}

#[test]
fn a_certificate_without_ocsp_staples_nothing_and_an_unusable_file_stops_the_start() {
    let dir = TempDir::new();
    make_pki(&dir.0);
    let backend = Backend::start(BackendOptions::named("app")).expect("backend");
    let yaml = |ocsp: &str| {
        format!(
            "workers: 1\nlisteners:\n  - address: 127.0.0.1:0\n    \
             tls: {{ cert: site.pem, key: site.key{ocsp} }}\n\
             routes: [ {{ cluster: app }} ]\nclusters:\n  - name: app\n    backends: [ {{ address: {} }} ]\n",
            backend.address()
        )
    };
    std::fs::write(dir.0.join("duet.yaml"), yaml("")).expect("config");
    let duet = Duet::start_at(&dir.0.join("duet.yaml"));
    assert_eq!(stapled(duet.address, "-tls1_3"), "none");
    drop(duet);

    std::fs::write(dir.0.join("duet.yaml"), yaml(", ocsp: site.csr")).expect("config");
    let check = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(["check", "--config"])
        .arg(dir.0.join("duet.yaml"))
        .output()
        .expect("duet check runs");
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success(), "{stderr}");
    assert!(
        stderr.contains("listeners[0].tls.ocsp") && stderr.contains("not a DER OCSP response"),
        "{stderr}"
    );
}
