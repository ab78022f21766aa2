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

/// Runs headless Chromium with `args` on `url`, bounded in time; its stdout. Each run has a profile
/// folder of its own (Chromium locks its profile, and tests run side by side), removed afterwards.
fn headless(browser: &str, args: &[&str], url: &str) -> String {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile = std::env::temp_dir().join(format!("duet-chromium-{}-{run}", std::process::id()));
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg("--disable-dev-shm-usage")
        .arg(format!("--user-data-dir={}", profile.display()))
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
        let _ = child.wait();
        let _ = std::fs::remove_dir_all(&profile);
        panic!("chromium did not finish within 60 s");
    }
    let output = child.wait_with_output().expect("chromium output");
    let _ = std::fs::remove_dir_all(&profile);
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

/// Loads `/status` in Chromium after traffic: each cluster plot (share of picks, in flight, p50 and
/// p99 response head) holds one series (`<path>`) per backend of `backends`, each drawn (a non-empty
/// `d`); a screenshot goes to the test's target dir (`status-over-time.png`).
pub(crate) fn check_status_plots(admin: SocketAddr, backends: &[SocketAddr]) {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("DUET_REQUIRE_CHROMIUM").is_none(),
            "Chromium is required here"
        );
        eprintln!("status plots not loaded in a browser: install Debian's `chromium`");
        return;
    };
    let url = format!("http://{admin}/status");
    let dom = headless(browser, &["--dump-dom"], &url);
    let svgs: Vec<&str> = dom.split("<svg").skip(1).collect();
    assert!(svgs.len() >= 4, "the cluster's four plots: {dom}");
    for svg in &svgs[..4] {
        for backend in backends {
            let series = format!("<path class=\"series\" data-series=\"{backend}\" d=\"M");
            assert_eq!(svg.matches(&series).count(), 1, "{backend} in {svg}");
        }
        assert_eq!(svg.matches("<path ").count(), backends.len(), "{svg}");
    }
    let shot: PathBuf = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-over-time.png");
    let _ = std::fs::remove_file(&shot);
    headless(
        browser,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1500,700",
            "--hide-scrollbars",
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    eprintln!("status plots screenshot: {}", shot.display());
}

/// CORS as a browser keeps it: a page of `http://page.localhost:PORT` (served by duet itself) calls
/// `fetch` on `http://127.0.0.1:PORT/api` (another origin) with credentials, a `PUT` with an
/// `X-Token` field (so a preflight first) and a `GET` (the page: [`CORS_PAGE`]); the same page from
/// `http://evil.localhost:PORT` gets both blocked. `backend_requests` says how many requests the
/// API's backend must have had (none of the preflights: duet answers them).
pub(crate) fn check_cors(duet: SocketAddr, backend_requests: impl Fn() -> u64) {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("DUET_REQUIRE_CHROMIUM").is_none(),
            "Chromium is required here"
        );
        eprintln!("CORS not tried in a browser: install Debian's `chromium`");
        return;
    };
    let port = duet.port();
    let run = |host: &str| {
        let url = format!("http://{host}.localhost:{port}/page");
        let dom = headless(
            browser,
            &["--dump-dom", "--virtual-time-budget=10000"],
            &url,
        );
        let marker = "<pre id=\"out\">";
        let start = dom.find(marker).map_or(0, |i| i + marker.len());
        let end = dom[start..].find("</pre>").map_or(start, |i| start + i);
        dom[start..end].to_owned()
    };
    assert_eq!(run("page"), "put:200 get:200", "from an allowed origin");
    assert_eq!(
        backend_requests(),
        2,
        "the PUT and the GET; duet answered the preflight"
    );
    assert_eq!(
        run("evil"),
        "put:blocked get:blocked",
        "from a disallowed origin"
    );
    // Its preflight (the backend's to answer, without CORS fields) and its GET (served, then
    // hidden from the page by the browser); never the PUT.
    assert_eq!(backend_requests(), 4);
}

/// The page [`check_cors`] loads: it calls the API on 127.0.0.1 at its own port and writes what
/// came of each call.
pub(crate) const CORS_PAGE: &str = r#"<!doctype html>
<pre id="out"></pre>
<script>
const api = "http://127.0.0.1:" + location.port + "/api/x";
const call = (label, init) => fetch(api, Object.assign({ credentials: "include" }, init))
  .then((r) => label + ":" + r.status, () => label + ":blocked");
(async () => {
  const put = await call("put", { method: "PUT", headers: { "X-Token": "t" } });
  const get = await call("get", {});
  document.getElementById("out").textContent = put + " " + get;
})();
</script>
"#;
