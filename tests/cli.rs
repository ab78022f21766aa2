//! The command line as a newcomer meets it: `check`, `--version`, bad arguments, and `demo`.

use std::process::Command;

fn duet(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_duet"))
        .args(args)
        .output()
        .expect("run duet");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn check_accepts_the_example_and_summarises_it() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/duet.yaml");
    let (code, stdout, _) = duet(&["check", "--config", config]);
    assert_eq!(code, 0);
    assert!(stdout.contains("config/duet.yaml: ok"), "{stdout}");
    assert!(
        stdout.contains("route api-v1 host api.example.com path /v1 -> api"),
        "{stdout}"
    );
    assert!(
        stdout.contains("cluster web policy p2c_peak_ewma backends 2"),
        "{stdout}"
    );
}

#[test]
fn check_reports_every_error_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("duet-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("bad.yaml");
    std::fs::write(
        &path,
        "listeners: [ { address: nowhere } ]\nroutes: [ { cluster: ghost } ]\nclusters: []\n",
    )
    .expect("write");
    let (code, stdout, stderr) = duet(&["check", "--config", path.to_str().expect("utf-8")]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("bad.yaml:1:25: listeners[0].address: `nowhere` is not a listen address"),
        "{stderr}"
    );
    assert!(
        stderr.contains("bad.yaml:2:22: routes[0].cluster: no cluster is named `ghost`"),
        "{stderr}"
    );
    assert!(stderr.contains("2 errors in configuration"), "{stderr}");
}

#[test]
fn check_works_offline_for_names_only_the_cluster_can_resolve() {
    let dir = crate::support::TempDir::new();
    let path = dir.0.join("names.yaml");
    let config = duet_testbed::config::DuetConfig::new()
        .route(None, "/", "app")
        .cluster(
            duet_testbed::config::Cluster::new("app").named("app.default.svc.cluster.local:8080"),
        );
    std::fs::write(&path, config.to_yaml()).expect("write");
    // No --resolve: nothing is looked up, so this answers the same on a laptop as in the cluster.
    let (code, stdout, stderr) = duet(&["check", "--config", path.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains(
            "app.default.svc.cluster.local:8080 weight 1 (host name: resolved when duet runs"
        ),
        "{stdout}"
    );
}

#[test]
fn check_diff_says_what_a_reload_would_change() {
    let old = concat!(env!("CARGO_MANIFEST_DIR"), "/config/duet.yaml");
    let (code, stdout, _) = duet(&["check", "--config", old, "--diff", old]);
    assert_eq!(code, 0);
    assert!(stdout.contains("no changes from"), "{stdout}");
    let dir = std::env::temp_dir().join(format!("duet-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let new = dir.join("new.yaml");
    let text = std::fs::read_to_string(old).expect("example");
    std::fs::write(&new, text.replace("weight: 2 ", "weight: 4 ")).expect("write");
    let (code, stdout, _) = duet(&["check", "--config", &new.to_string_lossy(), "--diff", old]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("1 change from")
            && stdout.contains("~ cluster web: backend 127.0.0.1:9002 weight 2 -> 4"),
        "{stdout}"
    );
}

#[test]
fn version_and_usage_errors() {
    let (code, stdout, _) = duet(&["--version"]);
    assert_eq!(
        (code, stdout.trim()),
        (0, concat!("duet ", env!("CARGO_PKG_VERSION")))
    );
    let usage_error = |args: &[&str], expected: &str| {
        let (code, _, stderr) = duet(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    };
    usage_error(&["run"], "--config <FILE>");
    usage_error(
        &["serve", "--config", "x"],
        "unrecognized subcommand 'serve'",
    );
    // What the hand-written parser let through: a repeated option silently won, a command ignored an
    // option it has no use for, a missing value became "", an unknown flag was accepted.
    usage_error(
        &["check", "--config", "a.yaml", "--config", "b.yaml"],
        "cannot be used multiple times",
    );
    usage_error(
        &["demo", "--config", "x.yaml"],
        "unexpected argument '--config'",
    );
    usage_error(
        &["check", "--config"],
        "a value is required for '--config <FILE>'",
    );
    usage_error(
        &["check", "--config", "x", "--fast"],
        "unexpected argument '--fast'",
    );
    usage_error(
        &["run", "--config", "x", "--log-format", "xml"],
        "invalid value 'xml'",
    );

    // Shell completions and a man page, from the same definition.
    let (code, stdout, _) = duet(&["completions", "bash"]);
    assert!(
        code == 0 && stdout.contains("--access-log") && stdout.contains("--diff"),
        "{stdout}"
    );
    let (code, stdout, _) = duet(&["man"]);
    assert!(code == 0 && stdout.contains(".TH duet 1"), "{stdout}");
    every_manual_page_is_written_and_renders();

    // Per-command help, and the file from the environment.
    let (code, stdout, _) = duet(&["check", "--help"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("--resolve") && stdout.contains("DUET_CONFIG"),
        "{stdout}"
    );
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/config/duet.yaml");
    let output = Command::new(env!("CARGO_BIN_EXE_duet"))
        .arg("check")
        .env("DUET_CONFIG", config)
        .output()
        .expect("run duet");
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("config/duet.yaml: ok"));
}

/// `duet man --out DIR`: duet(1), a page per command and duet.yaml(5); `man -l` renders each where
/// man is installed.
fn every_manual_page_is_written_and_renders() {
    let dir = std::env::temp_dir().join(format!("duet-man-{}", std::process::id()));
    let (code, stdout, stderr) = duet(&["man", "--out", &dir.to_string_lossy()]);
    assert_eq!(code, 0, "{stderr}");
    let pages = [
        "duet.1",
        "duet-run.1",
        "duet-check.1",
        "duet-demo.1",
        "duet-probe.1",
        "duet-completions.1",
        "duet-man.1",
        "duet.yaml.5",
    ];
    for page in pages {
        let path = dir.join(page);
        assert!(
            stdout.contains(&*path.to_string_lossy()),
            "{page} not named: {stdout}"
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.contains("\n.TH ") || text.starts_with(".TH "),
            "{page}: {text}"
        );
        let Ok(output) = Command::new("man")
            .arg("-l")
            .arg(&path)
            .env("MANWIDTH", "80")
            .output()
        else {
            continue; // no man on this machine: the roff is checked above only
        };
        assert!(
            output.status.success() && output.stdout.len() > 200,
            "man -l {page}: {output:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One row of `duet demo`'s table: (slow backend's share in %, p99 in ms), the errors column 0.
fn demo_row(stdout: &str, label: &str) -> (f64, f64) {
    let line = (stdout.lines())
        .find(|l| {
            l.strip_prefix(label)
                .is_some_and(|rest| rest.starts_with("  "))
        })
        .unwrap_or_else(|| panic!("no {label} row:\n{stdout}"));
    // The label may hold a space: the figures are the last six columns.
    let columns: Vec<&str> = line.split_whitespace().rev().take(6).collect();
    let [errors, p99, _p50, slow, ..] = columns[..] else {
        panic!("six figures in {line}");
    };
    assert_eq!(errors, "0", "errors column: {line}");
    let number = |text: &str| -> f64 { text.trim_end_matches('%').parse().expect("a number") };
    (number(slow), number(p99))
}

/// The p99 of a short burst on a busy 2-core machine is noise-prone (the tests run in parallel):
/// noise only makes a row slower, so the demo gets three runs to show its hedged row at the floor.
#[test]
fn the_demo_shows_p2c_steering_away_and_hedged_peak_ewma_at_the_fast_backends_tail() {
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (code, stdout, stderr) = duet(&["demo"]);
        assert_eq!(code, 0, "{stderr}");
        let (round_robin, _) = demo_row(&stdout, "round_robin");
        let (peak_ewma, _) = demo_row(&stdout, "p2c_peak_ewma");
        assert!((round_robin - 33.3).abs() < 2.0, "{stdout}");
        assert!(peak_ewma < round_robin / 2.0, "{stdout}");
        // Warm and hedged, the few requests PeakEWMA still sends the slow backend (50× slower)
        // answer from a fast one: the p99 is within 1.5× of the floor (the fast backends alone).
        let (_, hedged_p99) = demo_row(&stdout, "+ hedge p95, warm");
        let (floor_slow, floor_p99) = demo_row(&stdout, "fast only");
        assert_eq!(floor_slow, 0.0, "{stdout}");
        if hedged_p99 <= 1.5 * floor_p99 {
            return;
        }
        runs.push(stdout);
    }
    panic!("in no run was the hedged row's p99 within 1.5x of the floor:\n{runs:#?}");
}

#[test]
fn check_warns_of_a_route_that_can_never_match_with_both_lines_and_exits_0() {
    let dir = crate::support::TempDir::new();
    let path = dir.0.join("shadowed.yaml");
    let yaml = "listeners: [ { address: 127.0.0.1:0 } ]\nclusters:\n  - { name: app, backends: [ { address: 127.0.0.1:9 } ] }\nroutes:\n  - name: api\n    match: { path_prefix: /api }\n    cluster: app\n  - name: api-v1\n    match: { path_prefix: /api/v1, method: [GET] }\n    cluster: app\n  - { name: rest, match: { path_prefix: / }, cluster: app }\n";
    std::fs::write(&path, yaml).expect("write");
    let (code, stdout, stderr) = duet(&["check", "--config", path.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("shadowed.yaml: ok"), "{stdout}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .collect();
    assert_eq!(
        warnings,
        [format!(
            "warning: {}: line 8: route `api-v1` can never match: route `api` (line 5) comes first and matches every request it would",
            path.display()
        )],
        "{stderr}"
    );
}

#[test]
fn check_warns_of_a_sticky_cookie_key_drawn_per_process_and_not_of_a_shared_one() {
    let dir = crate::support::TempDir::new();
    std::fs::write(
        dir.0.join("sticky.key"),
        "0123456789abcdef0123456789abcdef\n",
    )
    .expect("key");
    let cluster = |name: &str, sticky: &str| {
        format!(
            "  - {{ name: {name}, sticky: {sticky}, backends: [ {{ address: 127.0.0.1:9 }} ] }}\n"
        )
    };
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nclusters:\n{}{}routes:\n  - {{ match: {{ path_prefix: /s }}, cluster: shared }}\n  - {{ match: {{ path_prefix: / }}, cluster: random }}\n",
        cluster("random", "{ cookie: sid }"),
        cluster("shared", "{ cookie: sid, secret_file: sticky.key }"),
    );
    let path = dir.0.join("sticky.yaml");
    std::fs::write(&path, yaml).expect("write");
    let (code, stdout, stderr) = duet(&["check", "--config", path.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("sticky.yaml: ok"), "{stdout}");
    let warnings: Vec<&str> = (stderr.lines()).filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    let expected = format!(
        "{}:3:29: warning: clusters[0].sticky: cluster `random` signs",
        path.display()
    );
    assert!(warnings[0].starts_with(&expected), "{stderr}");
    assert!(warnings[0].contains("do not survive a restart"), "{stderr}");
}
