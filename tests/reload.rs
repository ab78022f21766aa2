//! SIGHUP reloads the config file: a valid one takes effect without dropping connections; an invalid
//! one is reported (file, line, column) and the running config stays.

use crate::support;

use crate::support::{served_by, Duet};
use duet_testbed::{config::DuetConfig, Backend, BackendOptions};
use std::time::Duration;

fn yaml(backend: std::net::SocketAddr, listen: std::net::SocketAddr) -> String {
    DuetConfig::single("p2c_peak_ewma", &[backend])
        .workers(2)
        .listen(listen)
        .admin()
        .to_yaml()
}

#[test]
fn sighup_applies_a_valid_config_and_keeps_the_old_one_on_errors() {
    let old = Backend::start(BackendOptions::named("old")).expect("old");
    let new = Backend::start(BackendOptions::named("new")).expect("new");
    let duet = Duet::start(&yaml(old.address(), "127.0.0.1:0".parse().expect("addr")));
    assert_eq!(served_by(duet.address), "old");
    let path = duet.config_path();
    let admin = duet.admin_address();
    let metric = |name: &str| crate::admin::sum(&crate::admin::get(admin, "/metrics"), name, "");
    let hash_of = |path: &std::path::Path| {
        let bytes = std::fs::read(path).expect("config file");
        format!(
            "duet_config_info{{hash=\"{:016x}\"}} 1",
            duet_proxy::config_hash(&bytes)
        )
    };
    let started_with = hash_of(&path);
    assert!(crate::admin::get(admin, "/metrics").contains(&started_with));

    // Same listener (now with its real port), new backend.
    std::fs::write(&path, yaml(new.address(), duet.address)).expect("rewrite");
    duet.signal("HUP");
    assert!(
        support::eventually(Duration::from_secs(5), || served_by(duet.address) == "new"),
        "{:#?}",
        duet.log_lines()
    );
    for _ in 0..20 {
        assert_eq!(served_by(duet.address), "new", "every worker switched");
    }
    // The log says what the reload changed, as `duet check --diff` writes it.
    let lines = duet.log_lines();
    let at = (lines.iter().position(|l| l.contains("SIGHUP: reloaded ")))
        .unwrap_or_else(|| panic!("no reload line: {lines:#?}"));
    assert!(lines[at].ends_with(": 2 changes"), "{lines:#?}");
    // The listener, bound to port 0 first and named with the port it got now, did not change.
    assert_eq!(
        lines[at + 1..at + 3],
        [
            format!("  + cluster app: backend {} weight 1", new.address()),
            format!("  - cluster app: backend {}", old.address()),
        ],
        "{lines:#?}"
    );
    let applied = hash_of(&path);
    assert_ne!(applied, started_with);
    assert!(crate::admin::get(admin, "/metrics").contains(&applied));
    assert_eq!(metric("duet_config_reloads_total{result=\"success\"}"), 1.0);

    // A broken file: reported with its location, and duet keeps serving the config it has.
    std::fs::write(&path, "listeners: [ { address: 127.0.0.1:1 } ]\nroutes: [ { cluster: app } ]\nclusters:\n  - name: app\n    backends: [ { adress: 1.2.3.4:5 } ]\n").expect("rewrite");
    duet.signal("HUP");
    let reported = support::eventually(Duration::from_secs(5), || {
        duet.log_lines()
            .iter()
            .any(|l| l.contains("keeping the running configuration"))
            && duet
                .log_lines()
                .iter()
                .any(|l| l.contains("duet.yaml:5:19: unknown field `adress`"))
    });
    assert!(reported, "{:#?}", duet.log_lines());
    assert_eq!(served_by(duet.address), "new");

    // A valid file that moves the listener cannot be applied in place: refused, nothing changes.
    std::fs::write(
        &path,
        yaml(old.address(), "127.0.0.1:1".parse().expect("addr")),
    )
    .expect("rewrite");
    duet.signal("HUP");
    assert!(support::eventually(Duration::from_secs(5), || duet
        .log_lines()
        .iter()
        .any(|l| l.contains("listeners changed"))));
    assert_eq!(served_by(duet.address), "new");

    // Both refusals counted; the running configuration's hash is still the applied file's.
    assert_eq!(metric("duet_config_reloads_total{result=\"failure\"}"), 2.0);
    assert_eq!(metric("duet_config_reloads_total{result=\"success\"}"), 1.0);
    assert_eq!(metric("duet_config_last_reload_successful"), 0.0);
    assert!(crate::admin::get(admin, "/metrics").contains(&applied));
}

#[test]
fn watch_reloads_when_the_file_changes_without_a_signal() {
    let old = Backend::start(BackendOptions::named("old")).expect("old");
    let new = Backend::start(BackendOptions::named("new")).expect("new");
    let duet = Duet::start_with_args(
        &yaml(old.address(), "127.0.0.1:0".parse().expect("addr")),
        &["--watch"],
    );
    assert_eq!(served_by(duet.address), "old");
    let path = duet.config_path();
    // Written as a ConfigMap update is: a new file moved over the old one.
    let staged = path.with_extension("new");
    std::fs::write(&staged, yaml(new.address(), duet.address)).expect("stage");
    std::fs::rename(&staged, &path).expect("swap");
    assert!(
        support::eventually(Duration::from_secs(5), || served_by(duet.address) == "new"),
        "{:#?}",
        duet.log_lines()
    );
    // Logged once the new configuration is in place, so possibly after the first request it served.
    assert!(
        support::eventually(Duration::from_secs(5), || duet
            .log_lines()
            .iter()
            .any(|l| l.contains("the file changed: reloaded"))),
        "{:#?}",
        duet.log_lines()
    );

    // A broken version is reported once, and the running configuration stays.
    let admin = duet.admin_address();
    let failures = || {
        crate::admin::sum(
            &crate::admin::get(admin, "/metrics"),
            "duet_config_reloads_total",
            "result=\"failure\"",
        )
    };
    std::fs::write(&path, "listeners: [ oops").expect("break");
    assert!(
        support::eventually(Duration::from_secs(5), || failures() >= 1.0),
        "the broken file was tried: {:#?}",
        duet.log_lines()
    );
    // Wall-clock: that the next look at the unchanged file (1 s later) reports nothing shows only once
    // it has happened, and a look at an unchanged file leaves no trace to wait on.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(failures(), 1.0, "{:#?}", duet.log_lines());
    let reports = duet
        .log_lines()
        .iter()
        .filter(|l| l.contains("keeping the running configuration"))
        .count();
    assert_eq!(reports, 1, "{:#?}", duet.log_lines());
    assert_eq!(served_by(duet.address), "new");
}

/// Whether a thread of duet's is named `name` (`/proc/PID/task/*/comm`).
fn has_thread(pid: u32, name: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
        })
}

/// Replaces the config file by a FIFO nobody writes to: opening it for reading blocks forever.
fn make_fifo(path: &std::path::Path) {
    std::fs::remove_file(path).expect("remove the config");
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(status.success());
}

#[test]
fn sigterm_drains_and_exits_while_a_reload_read_hangs() {
    let old = Backend::start(BackendOptions::named("old")).expect("old");
    let mut duet = Duet::start(&yaml(old.address(), "127.0.0.1:0".parse().expect("addr")));
    make_fifo(&duet.config_path());
    duet.signal("HUP");
    // The read starts on a thread of its own, and hangs there: duet serves on.
    let reading = support::eventually(Duration::from_secs(5), || {
        has_thread(duet.pid(), "duet-reload")
    });
    assert_eq!(served_by(duet.address), "old");
    duet.signal("TERM");
    let status = duet.wait_exit(Duration::from_secs(10));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "reading: {reading}, {:#?}",
        duet.log_lines()
    );
    assert!(reading, "no reader thread: {:#?}", duet.log_lines());
    assert!(duet
        .log_lines()
        .iter()
        .any(|l| l.contains("SIGTERM: draining in-flight requests")));
}

#[test]
fn a_hung_read_is_given_up_and_the_next_sighup_reloads() {
    let old = Backend::start(BackendOptions::named("old")).expect("old");
    let new = Backend::start(BackendOptions::named("new")).expect("new");
    let duet = Duet::start(&yaml(old.address(), "127.0.0.1:0".parse().expect("addr")));
    let path = duet.config_path();
    let admin = duet.admin_address();
    make_fifo(&path);
    duet.signal("HUP");
    let given_up = support::eventually(Duration::from_secs(10), || {
        duet.log_lines().iter().any(|l| {
            l.contains("SIGHUP: keeping the running configuration;")
                && l.contains("reading it has not finished after 5s (a FIFO, a hung mount?)")
        })
    });
    assert!(given_up, "{:#?}", duet.log_lines());
    let metrics = crate::admin::get(admin, "/metrics");
    assert_eq!(
        crate::admin::sum(
            &metrics,
            "duet_config_reloads_total{result=\"failure\"}",
            ""
        ),
        1.0
    );
    std::fs::remove_file(&path).expect("remove the FIFO");
    std::fs::write(&path, yaml(new.address(), duet.address)).expect("rewrite");
    duet.signal("HUP");
    assert!(
        support::eventually(Duration::from_secs(5), || served_by(duet.address) == "new"),
        "{:#?}",
        duet.log_lines()
    );
}

/// A reload that takes a peer off `trusted_proxies` applies to its connections already open: the next
/// request on a kept-alive connection is no longer trusted with its forwarding fields.
#[test]
fn a_reload_that_revokes_trust_applies_to_open_connections() {
    use duet_testbed::raw::read_response;
    use std::{io::Write, net::TcpStream};
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let config = |trusted: &[&str], listen: std::net::SocketAddr| {
        DuetConfig::single("p2c_inflight", &[backend.address()])
            .listen(listen)
            .trusted_proxies(trusted)
            .admin()
            .to_yaml()
    };
    let duet = Duet::start(&config(
        &["127.0.0.1"],
        "127.0.0.1:0".parse().expect("addr"),
    ));
    let admin = duet.admin_address();
    let mut stream = TcpStream::connect(duet.address).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut pending = Vec::new();
    let mut forged_request = |stream: &mut TcpStream| {
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 1.2.3.4\r\nX-Real-IP: 1.2.3.4\r\nX-Request-Id: forged-id\r\n\r\n")
            .expect("write");
        let response = read_response(stream, &mut pending).expect("response");
        assert_eq!(response.status(), 200, "{}", response.head);
        backend.recorded().pop().expect("recorded").headers
    };
    let seen = forged_request(&mut stream);
    assert_eq!(seen["x-forwarded-for"], "1.2.3.4, 127.0.0.1", "trusted");
    assert_eq!(seen["x-real-ip"], "1.2.3.4");
    assert_eq!(seen["x-request-id"], "forged-id");

    std::fs::write(duet.config_path(), config(&[], duet.address)).expect("rewrite");
    duet.signal("HUP");
    let applied = support::eventually(Duration::from_secs(5), || {
        crate::admin::sum(
            &crate::admin::get(admin, "/metrics"),
            "duet_config_reloads_total{result=\"success\"}",
            "",
        ) == 1.0
            && duet
                .log_lines()
                .iter()
                .any(|l| l.contains("configuration reloaded"))
    });
    assert!(applied, "{:#?}", duet.log_lines());
    // The same connection, still open.
    let seen = forged_request(&mut stream);
    assert_eq!(
        seen["x-forwarded-for"], "127.0.0.1",
        "trust revoked: the forged chain is dropped"
    );
    assert!(!seen.contains_key("x-real-ip"), "{seen:?}");
    assert_ne!(seen["x-request-id"], "forged-id");
}
