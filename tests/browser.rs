//! The status page in a real browser: headless Chromium (Debian's `chromium`) loads it from a running
//! duet, and what it rendered is checked. Skipped with a note where no Chromium is installed, unless
//! `DUET_REQUIRE_CHROMIUM` is set (`.ci/run` installs it and sets it).

use std::{net::SocketAddr, path::PathBuf, process::Command, time::Duration};

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// Runs headless Chromium with `args` on `url`, bounded in time; its stdout.
fn headless(browser: &str, args: &[&str], url: &str) -> String {
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg("--disable-dev-shm-usage")
        .arg(format!(
            "--user-data-dir={}",
            std::env::temp_dir()
                .join(format!("duet-chromium-{}", std::process::id()))
                .display()
        ))
        .args(args)
        .arg(url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start chromium");
    let finished = duet_testbed::wait::eventually(Duration::from_secs(60), || {
        !matches!(child.try_wait(), Ok(None))
    });
    if !finished {
        let _ = child.kill();
        panic!("chromium did not finish within 60 s");
    }
    let output = child.wait_with_output().expect("chromium output");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Loads `/status` from the admin listener in Chromium: every backend in `backends` is on the page as
/// the browser rendered it, `down` in a row marked down; a screenshot goes to the test's target dir.
pub(crate) fn check_status_page(admin: SocketAddr, backends: &[SocketAddr], down: SocketAddr) {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("DUET_REQUIRE_CHROMIUM").is_none(),
            "Chromium is required here"
        );
        eprintln!("status page not loaded in a browser: install Debian's `chromium`");
        return;
    };
    let url = format!("http://{admin}/status");
    let dom = headless(browser, &["--dump-dom"], &url);
    assert!(dom.contains("<h1>duet "), "the page did not render: {dom}");
    for backend in backends {
        assert!(
            dom.contains(&backend.to_string()),
            "{backend} missing: {dom}"
        );
    }
    let down_row = dom
        .split("<tr>")
        .find(|row| row.contains(&down.to_string()))
        .expect("a row for the backend taken down");
    assert!(down_row.contains("class=\"down\""), "{down_row}");
    let shot: PathBuf = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status.png");
    let _ = std::fs::remove_file(&shot);
    headless(
        browser,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1500,520",
            "--hide-scrollbars",
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    eprintln!("status page screenshot: {}", shot.display());
}
