//! Shared helpers: the real `duet` binary on a config with port 0, raw and hyper clients, waiting.

use bytes::Bytes;
pub(crate) use duet_testbed::wait::eventually;
use duet_testbed::{raw::read_until_closed, wait::poll_until};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::Duration,
};

/// The real `duet` binary, serving a config written to a temporary file.
pub(crate) struct Duet {
    pub(crate) child: Child,
    pub(crate) address: SocketAddr,
    pub(crate) log: Arc<Mutex<Vec<String>>>,
    config: PathBuf,
    _dir: Option<TempDir>,
}

impl Duet {
    /// Starts `duet run` on `yaml` (whose listener should use port 0) and waits until it listens.
    pub(crate) fn start(yaml: &str) -> Self {
        Self::start_with(yaml, "info")
    }

    pub(crate) fn start_with(yaml: &str, rust_log: &str) -> Self {
        let dir = TempDir::new();
        let path = dir.0.join("duet.yaml");
        std::fs::write(&path, yaml).expect("write config");
        Self::spawn(path, Some(dir), rust_log, None, &[])
    }

    /// Like [`start`](Self::start), with more arguments to `duet run` (`--log-format json`, `--watch`).
    pub(crate) fn start_with_args(yaml: &str, args: &[&str]) -> Self {
        let dir = TempDir::new();
        let path = dir.0.join("duet.yaml");
        std::fs::write(&path, yaml).expect("write config");
        Self::spawn(path, Some(dir), "info", None, args)
    }

    /// Like [`start_with`](Self::start_with), with the open-file limit (soft and hard) set to `nofile`
    /// by util-linux's `prlimit`.
    pub(crate) fn start_with_nofile(yaml: &str, rust_log: &str, nofile: u64) -> Self {
        let dir = TempDir::new();
        let path = dir.0.join("duet.yaml");
        std::fs::write(&path, yaml).expect("write config");
        Self::spawn(path, Some(dir), rust_log, Some(nofile), &[])
    }

    /// Starts `duet run` on an existing config file (the caller owns its folder).
    pub(crate) fn start_at(path: &std::path::Path) -> Self {
        Self::spawn(path.to_path_buf(), None, "info", None, &[])
    }

    fn spawn(
        path: PathBuf,
        dir: Option<TempDir>,
        rust_log: &str,
        nofile: Option<u64>,
        extra: &[&str],
    ) -> Self {
        let mut command = match nofile {
            None => Command::new(env!("CARGO_BIN_EXE_duet")),
            Some(limit) => {
                let mut prlimit = Command::new("prlimit");
                prlimit
                    .arg(format!("--nofile={limit}:{limit}"))
                    .arg(env!("CARGO_BIN_EXE_duet"));
                prlimit
            }
        };
        let mut child = command
            .args(["run", "--config"])
            .arg(&path)
            .args(extra)
            .env("RUST_LOG", rust_log)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn duet");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let listening = line
                        .split("listening on http://")
                        .nth(1)
                        .or_else(|| line.split("listening on https://").nth(1));
                    if let Some(rest) = listening {
                        // Up to a space (text) or the closing quote (JSON).
                        let address = rest.split([' ', '"']).next().unwrap_or_default();
                        let _ = tx.send(address.to_owned());
                    }
                    log.lock().expect("log").push(line);
                }
            });
        }
        let address = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(address) => address.parse().expect("listen address"),
            Err(_) => {
                let _ = child.kill();
                panic!("duet did not start: {:?}", log.lock().expect("log"));
            }
        };
        Self {
            child,
            address,
            log,
            config: path,
            _dir: dir,
        }
    }

    /// The config file duet was started with (rewrite it, then send SIGHUP).
    pub(crate) fn config_path(&self) -> PathBuf {
        self.config.clone()
    }

    /// The admin listener's address, from duet's start-up log line (the config asked for port 0).
    pub(crate) fn admin_address(&self) -> SocketAddr {
        let mut found = None;
        let logged = eventually(Duration::from_secs(5), || {
            found = self.log_lines().iter().find_map(|l| {
                l.split("admin on http://")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next()?.parse().ok())
            });
            found.is_some()
        });
        assert!(logged, "no admin address in {:#?}", self.log_lines());
        found.expect("admin address")
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.address, path)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal with the system's `kill` command.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit, up to `limit`.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        poll_until(limit, || self.child.try_wait().ok().flatten())
    }

    /// Peak resident memory of the process, in KiB (VmHWM).
    pub(crate) fn peak_rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    pub(crate) fn log_lines(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }
}

impl Drop for Duet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("duet-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes raw bytes and reads until the peer closes or `limit` passes. Returns what was read and whether
/// the peer closed the connection.
pub(crate) fn raw_exchange(address: SocketAddr, request: &[u8], limit: Duration) -> (String, bool) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.write_all(request).expect("write");
    let (out, closed) = read_until_closed(&mut stream, limit);
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// `GET /` on a fresh connection that closes after the response; returns the whole response.
pub(crate) fn get_root(address: SocketAddr) -> String {
    raw_exchange(
        address,
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .0
}

/// `GET /` on a fresh connection; returns the response body (a testbed backend answers with its name).
pub(crate) fn served_by(address: SocketAddr) -> String {
    let response = get_root(address);
    response
        .rsplit("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A plain hyper client for tests.
pub(crate) fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// GET `url` with extra headers; returns status, headers and body.
pub(crate) async fn get(url: &str, headers: &[(&str, &str)]) -> (u16, http::HeaderMap, Bytes) {
    let mut request = http::Request::get(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Full::new(Bytes::new())).expect("request");
    let response = client().request(request).await.expect("response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, headers, body)
}

/// A self-signed certificate for `localhost`, written as `cert.pem` and `key.pem` in a directory of
/// its own, for a TLS listener.
pub(crate) struct TestCertificate {
    pub(crate) generated: rcgen::CertifiedKey<rcgen::KeyPair>,
    pub(crate) cert: String,
    pub(crate) key: String,
    _dir: TempDir,
}

impl TestCertificate {
    pub(crate) fn localhost() -> Self {
        let generated =
            rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("certificate");
        let dir = TempDir::new();
        let (cert, key) = (dir.0.join("cert.pem"), dir.0.join("key.pem"));
        std::fs::write(&cert, generated.cert.pem()).expect("cert");
        std::fs::write(&key, generated.signing_key.serialize_pem()).expect("key");
        Self {
            generated,
            cert: cert.display().to_string(),
            key: key.display().to_string(),
            _dir: dir,
        }
    }

    /// A client that trusts this certificate alone.
    pub(crate) fn client_config(&self) -> tokio_rustls::rustls::ClientConfig {
        client_trusting(&self.generated.cert).expect("a client config")
    }
}

/// A TLS connection to duet at `address` as `localhost`, with `config`; why not, if it fails.
pub(crate) async fn tls_connect(
    address: SocketAddr,
    config: tokio_rustls::rustls::ClientConfig,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    use tokio_rustls::{rustls::pki_types::ServerName, TlsConnector};
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// A rustls client config that trusts `root` alone.
pub(crate) fn client_trusting(
    root: &rcgen::Certificate,
) -> Result<tokio_rustls::rustls::ClientConfig, String> {
    use tokio_rustls::rustls;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.der().clone()).map_err(|e| e.to_string())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
