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
        .to_yaml()
}

#[test]
fn sighup_applies_a_valid_config_and_keeps_the_old_one_on_errors() {
    let old = Backend::start(BackendOptions::named("old")).expect("old");
    let new = Backend::start(BackendOptions::named("new")).expect("new");
    let duet = Duet::start(&yaml(old.address(), "127.0.0.1:0".parse().expect("addr")));
    assert_eq!(served_by(duet.address), "old");
    let path = duet.config_path();

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
}
