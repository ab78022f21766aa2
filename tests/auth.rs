//! Authentication at the edge through the real binary (`auth:`): htpasswd files written by
//! Apache's `htpasswd` (apache2-utils), JWTs signed in the test with keys made there, and forward
//! auth against a real HTTP service.

use crate::{
    admin,
    support::{Duet, TempDir},
};
use duet_testbed::{raw::read_until_closed, Backend, BackendOptions};
use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    path::Path,
    process::Command,
    time::Duration,
};

/// `GET path` with `fields`; the whole response.
fn get(to: SocketAddr, path: &str, fields: &str) -> String {
    let mut stream = TcpStream::connect(to).expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{fields}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("write");
    let (response, _) = read_until_closed(&mut stream, Duration::from_secs(5));
    String::from_utf8_lossy(&response).into_owned()
}

fn status(response: &str) -> &str {
    response.get(9..12).unwrap_or_default()
}

/// A config whose `routes` (YAML list items) send to `web` (and `authz` when given).
fn config(routes: &str, web: SocketAddr, authz: Option<SocketAddr>) -> String {
    let authz = authz.map_or(String::new(), |a| {
        format!("  - {{ name: authz, backends: [ {{ address: {a} }} ] }}\n")
    });
    format!(
        "workers: 1
admin: {{ address: 127.0.0.1:0 }}
listeners: [ {{ address: 127.0.0.1:0 }} ]
routes:
{routes}
clusters:
  - {{ name: web, backends: [ {{ address: {web} }} ] }}
{authz}"
    )
}

/// `htpasswd -b FLAG file user password`, as an operator writes the file.
fn htpasswd(file: &Path, flag: &str, user: &str, password: &str) {
    let create = if file.exists() { "-b" } else { "-cb" };
    let status = Command::new("htpasswd")
        .args([create, flag])
        .arg(file)
        .args([user, password])
        .status()
        .expect("htpasswd (apache2-utils) runs");
    assert!(status.success());
}

fn basic(user: &str, password: &str) -> String {
    use std::fmt::Write as _;
    let plain = format!("{user}:{password}");
    // Base64 by hand: the test binary has no base64 crate, and this is all it needs.
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in plain.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    let mut field = String::new();
    let _ = write!(field, "Authorization: Basic {out}\r\n");
    field
}

#[test]
fn basic_auth_takes_htpasswd_users_strips_credentials_and_forged_identity_and_counts() {
    let dir = TempDir::new();
    let file = dir.0.join("admin.htpasswd");
    htpasswd(&file, "-B", "ann", "s3cret");
    htpasswd(&file, "-5", "bob", "hunter2");
    let mut options = BackendOptions::named("web");
    options.record_requests = true;
    let backend = Backend::start(options).expect("backend");
    let routes = format!(
        "  - name: admin\n    cluster: web\n    auth: {{ basic: {{ users: '{}', realm: admin, user_header: x-user }} }}",
        file.display()
    );
    let duet = Duet::start(&config(&routes, backend.address(), None));
    let none = get(duet.address, "/", "");
    assert_eq!(status(&none), "401", "{none}");
    assert!(
        none.contains("www-authenticate: Basic realm=\"admin\", charset=\"UTF-8\"\r\n"),
        "{none}"
    );
    let forged = "X-User: mallory\r\n";
    let ann = get(
        duet.address,
        "/",
        &format!("{}{forged}", basic("ann", "s3cret")),
    );
    assert_eq!(status(&ann), "200", "{ann}");
    assert_eq!(
        status(&get(duet.address, "/", &basic("bob", "hunter2"))),
        "200"
    );
    assert_eq!(
        status(&get(duet.address, "/", &basic("ann", "s3cret"))),
        "200"
    );
    assert_eq!(
        status(&get(duet.address, "/", &basic("ann", "wrong"))),
        "401"
    );
    assert_eq!(
        status(&get(duet.address, "/", &basic("eve", "s3cret"))),
        "401"
    );
    let long = format!("Authorization: Basic {}\r\n", "A".repeat(9000));
    assert_eq!(status(&get(duet.address, "/", &long)), "401");
    let recorded = backend.recorded();
    assert_eq!(
        recorded.len(),
        3,
        "only the right credentials reach the backend"
    );
    for request in &recorded {
        assert!(
            request.headers.get("authorization").is_none(),
            "not forwarded"
        );
    }
    let users: Vec<_> = (recorded.iter())
        .map(|r| {
            r.headers
                .get_all("x-user")
                .iter()
                .map(|v| v.to_str().unwrap_or(""))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        users,
        [vec!["ann"], vec!["bob"], vec!["ann"]],
        "the client's x-user is gone"
    );
    let metrics = admin::get(duet.admin_address(), "/metrics");
    let count = |outcome: &str| {
        let labels = format!("route=\"admin\",outcome=\"{outcome}\"");
        admin::sum(&metrics, "duet_auth_requests_total", &labels)
    };
    assert_eq!(
        (count("allowed"), count("denied"), count("error")),
        (3.0, 4.0, 0.0),
        "{metrics}"
    );
}
