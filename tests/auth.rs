//! Authentication at the edge through the real binary (`auth:`): htpasswd files written by
//! Apache's `htpasswd` (apache2-utils), JWTs signed in the test with keys made there, and forward
//! auth against a real HTTP service.

use crate::{
    admin,
    support::{eventually, Duet, TempDir},
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
    format!(
        "Authorization: Basic {}\r\n",
        basic_b64(format!("{user}:{password}").as_bytes())
    )
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

#[test]
fn an_htpasswd_file_rewritten_applies_without_a_signal_and_a_broken_one_keeps_the_users() {
    let dir = TempDir::new();
    let file = dir.0.join("users.htpasswd");
    htpasswd(&file, "-B", "ann", "s3cret");
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let routes = format!(
        "  - name: admin\n    cluster: web\n    auth: {{ basic: {{ users: '{}' }} }}",
        file.display()
    );
    let duet = Duet::start(&config(&routes, backend.address(), None));
    let answer = |user: &str, password: &str| {
        let response = get(duet.address, "/", &basic(user, password));
        status(&response).to_owned()
    };
    assert_eq!(answer("cy", "n3w"), "401");
    htpasswd(&file, "-B", "cy", "n3w");
    let limit = Duration::from_secs(10);
    assert!(
        eventually(limit, || answer("cy", "n3w") == "200"),
        "the new user is taken without SIGHUP"
    );
    assert_eq!(answer("ann", "s3cret"), "200");

    let users = std::fs::read_to_string(&file).expect("read");
    std::fs::write(&file, format!("{users}dee\n")).expect("write");
    let refused = || {
        (duet.log_lines().iter())
            .any(|l| l.contains("auth file changed but does not load") && l.contains("line 3"))
    };
    assert!(eventually(limit, refused), "{:?}", duet.log_lines());
    assert_eq!(answer("cy", "n3w"), "200", "the users in use stay");
    assert_eq!(answer("ann", "s3cret"), "200");

    std::fs::write(&file, "").expect("empty");
    htpasswd(&file, "-B", "cy", "n3w");
    assert!(
        eventually(limit, || answer("ann", "s3cret") == "401"),
        "a later good file is taken: ann is gone"
    );
    assert_eq!(answer("cy", "n3w"), "200");
}

/// A JWT for `claims`, signed with the fixture key `kid` in its algorithm.
fn token(kid: &str, claims: &serde_json::Value) -> String {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth");
    let der = |name: &str| std::fs::read(dir.join(name)).expect("fixture key");
    let (alg, key) = match kid {
        "ec1" => (
            Algorithm::ES256,
            EncodingKey::from_ec_der(&der("ec.pk8.der")),
        ),
        "ed1" => (
            Algorithm::EdDSA,
            EncodingKey::from_ed_der(&der("ed.pk8.der")),
        ),
        _ => (Algorithm::RS256, EncodingKey::from_rsa_der(&der("rsa.der"))),
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_owned());
    encode(&header, claims, &key).expect("signed")
}

fn now() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_secs())
}

fn b64url(bytes: &[u8]) -> String {
    let mut text = basic_b64(bytes);
    text = text.replace('+', "-").replace('/', "_");
    text.trim_end_matches('=').to_owned()
}

fn basic_b64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            let c = if i <= chunk.len() {
                ALPHABET[(n >> (18 - 6 * i) & 63) as usize]
            } else {
                b'='
            };
            out.push(c as char);
        }
    }
    out
}

#[test]
fn jwt_takes_es256_eddsa_rs256_tokens_of_the_issuer_and_refuses_the_attacks() {
    let mut options = BackendOptions::named("web");
    options.record_requests = true;
    let backend = Backend::start(options).expect("backend");
    let jwks = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth/jwks.json");
    let routes = format!(
        "  - name: api\n    cluster: web\n    auth:\n      jwt:\n        jwks: '{}'\n        issuer: https://id.example.com\n        audiences: [api]\n        leeway: 5s\n        cookie: session\n        claims_to_headers: {{ sub: x-user }}",
        jwks.display()
    );
    let duet = Duet::start(&config(&routes, backend.address(), None));
    let t = now();
    let good = |sub: &str| serde_json::json!({"sub": sub, "iss": "https://id.example.com", "aud": "api", "exp": t + 300});
    let bearer = |token: &str| format!("Authorization: Bearer {token}\r\nX-User: mallory\r\n");
    for (kid, sub) in [("ec1", "ann"), ("ed1", "bob"), ("rsa1", "cy")] {
        let response = get(duet.address, "/", &bearer(&token(kid, &good(sub))));
        assert_eq!(status(&response), "200", "{kid}: {response}");
    }
    let cookie = format!("Cookie: a=b; session={}\r\n", token("ec1", &good("dee")));
    assert_eq!(status(&get(duet.address, "/", &cookie)), "200");
    let users: Vec<String> = (backend.recorded().iter())
        .map(|r| {
            assert!(r.headers.get("authorization").is_none());
            let all: Vec<_> = r.headers.get_all("x-user").iter().collect();
            assert_eq!(all.len(), 1, "one x-user, duet's");
            all[0].to_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert_eq!(users, ["ann", "bob", "cy", "dee"]);

    let with = |change: serde_json::Value| {
        let mut claims = good("x");
        for (k, v) in change.as_object().into_iter().flatten() {
            claims[k] = v.clone();
        }
        claims
    };
    let payload = b64url(good("x").to_string().as_bytes());
    let none = format!(
        "{}.{payload}.",
        b64url(br#"{"alg":"none","typ":"JWT","kid":"ec1"}"#)
    );
    let hs256 = {
        use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
        let pem = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth/rsa.pub.pem"),
        )
        .expect("pem");
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some("rsa1".to_owned());
        encode(&header, &good("x"), &EncodingKey::from_secret(&pem)).expect("hs256")
    };
    let attacks = [
        ("alg none", none),
        ("HS256 with the public key", hs256),
        (
            "expired",
            token("ec1", &with(serde_json::json!({"exp": t - 60}))),
        ),
        (
            "not yet valid",
            token("ec1", &with(serde_json::json!({"nbf": t + 60}))),
        ),
        (
            "wrong aud",
            token("ec1", &with(serde_json::json!({"aud": "other"}))),
        ),
        (
            "wrong iss",
            token(
                "ec1",
                &with(serde_json::json!({"iss": "https://evil.example"})),
            ),
        ),
        ("unknown kid", token("nope", &good("x"))),
        (
            "no exp",
            token(
                "ed1",
                &serde_json::json!({"sub": "x", "iss": "https://id.example.com", "aud": "api"}),
            ),
        ),
        ("very long", "A".repeat(10_000)),
    ];
    for (what, token) in &attacks {
        let response = get(duet.address, "/", &bearer(token));
        assert_eq!(status(&response), "401", "{what}: {response}");
        assert!(
            response.contains("www-authenticate: Bearer error=\"invalid_token\"\r\n"),
            "{what}: {response}"
        );
    }
    let missing = get(duet.address, "/", "");
    assert_eq!(status(&missing), "401");
    assert!(
        missing.contains("www-authenticate: Bearer\r\n"),
        "{missing}"
    );
    assert_eq!(
        backend.recorded().len(),
        4,
        "no refused token reaches the backend"
    );
    let metrics = admin::get(duet.admin_address(), "/metrics");
    let count = |outcome: &str| {
        let labels = format!("route=\"api\",outcome=\"{outcome}\"");
        admin::sum(&metrics, "duet_auth_requests_total", &labels)
    };
    assert_eq!(
        (count("allowed"), count("denied")),
        (4.0, 10.0),
        "{metrics}"
    );
}

/// An auth service on loopback that answers by the `X-Forwarded-Uri` it is sent: `/ok` 200 with
/// `X-User: alice` (and an `X-Other` duet must not copy), `/login` 302 to a login page, `/slow`
/// after 2 s, anything else 401. It records the subrequests' heads.
fn auth_service() -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(64) {
            let Ok(mut stream) = stream else { continue };
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16_384 {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).to_lowercase();
                let uri = (head.lines())
                    .find_map(|l| l.strip_prefix("x-forwarded-uri: "))
                    .unwrap_or("")
                    .to_owned();
                if let Ok(mut heads) = seen.lock() {
                    heads.push(head.clone());
                }
                let answer = match uri.as_str() {
                    "/ok" => "HTTP/1.1 200 OK\r\nX-User: alice\r\nX-Other: no\r\nContent-Length: 0\r\n",
                    "/login" => "HTTP/1.1 302 Found\r\nLocation: https://sso.example/login\r\nContent-Length: 5\r\n",
                    "/slow" => {
                        std::thread::sleep(Duration::from_secs(2));
                        "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n"
                    }
                    _ => "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Cookie\r\nContent-Length: 5\r\n",
                };
                let body = if answer.contains("Length: 5") {
                    "nope\n"
                } else {
                    ""
                };
                let _ = write!(stream, "{answer}Connection: close\r\n\r\n{body}");
            });
        }
    });
    (address, heads)
}

#[test]
fn forward_auth_lets_2xx_through_with_its_fields_returns_other_answers_and_times_out_closed() {
    let mut options = BackendOptions::named("web");
    options.record_requests = true;
    let backend = Backend::start(options).expect("backend");
    let (authz, heads) = auth_service();
    let forward = "forward: { cluster: authz, path: /check, request_headers: [cookie], response_headers: [x-user], timeout: 300ms";
    let routes = format!(
        "  - {{ name: open_on_error, match: {{ path_prefix: /slow-open }}, cluster: web, auth: {{ {forward}, on_error: allow }} }} }}
  - {{ name: app, cluster: web, auth: {{ {forward}, on_error: deny }} }} }}"
    );
    let duet = Duet::start(&config(&routes, backend.address(), Some(authz)));
    let fields = "Cookie: sid=1\r\nX-User: mallory\r\n";
    let ok = get(duet.address, "/ok", fields);
    assert_eq!(status(&ok), "200", "{ok}");
    let login = get(duet.address, "/login", fields);
    assert_eq!(status(&login), "302", "{login}");
    assert!(
        login.contains("location: https://sso.example/login\r\n"),
        "{login}"
    );
    let refused = get(duet.address, "/other", fields);
    assert_eq!(status(&refused), "401", "{refused}");
    assert!(
        refused.contains("www-authenticate: Cookie\r\n") && refused.ends_with("nope\n"),
        "{refused}"
    );
    let slow = get(duet.address, "/slow", fields);
    assert_eq!(status(&slow), "503", "on_error: deny never passes: {slow}");
    let recorded = backend.recorded();
    assert_eq!(recorded.len(), 1, "only the 2xx reaches the backend");
    let users: Vec<_> = recorded[0].headers.get_all("x-user").iter().collect();
    assert_eq!(
        users,
        ["alice"],
        "the auth service's x-user, not the client's"
    );
    assert!(recorded[0].headers.get("x-other").is_none());
    let first = heads.lock().map(|h| h[0].clone()).unwrap_or_default();
    assert!(first.starts_with("get /check http/1.1\r\n"), "{first}");
    for field in [
        "x-forwarded-method: get",
        "x-forwarded-host: x",
        "x-forwarded-uri: /ok",
        "cookie: sid=1",
    ] {
        assert!(first.contains(&format!("{field}\r\n")), "{field}: {first}");
    }
    assert!(!first.contains("mallory"), "{first}");
    let metrics = admin::get(duet.admin_address(), "/metrics");
    let count = |outcome: &str| {
        let labels = format!("route=\"app\",outcome=\"{outcome}\"");
        admin::sum(&metrics, "duet_auth_requests_total", &labels)
    };
    assert_eq!(
        (count("allowed"), count("denied"), count("error")),
        (1.0, 2.0, 1.0),
        "{metrics}"
    );
}

/// A key server on loopback: `GET /jwks` answers what `served` holds now (an empty string: 500),
/// one request per connection; it counts the requests.
fn key_server() -> (
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<String>>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    let served = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (text, fetches) = (served.clone(), count.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming().take(256) {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 16_384 {
                match stream.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            if !head.starts_with(b"GET /jwks ") {
                continue;
            }
            fetches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = text.lock().map(|t| t.clone()).unwrap_or_default();
            let status = if body.is_empty() {
                "500 Oops"
            } else {
                "200 OK"
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (address, served, count)
}

/// The fixture JWKS with only the keys `kids`.
fn jwks_of(kids: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth/jwks.json");
    let text = std::fs::read_to_string(path).expect("fixture");
    let mut set: serde_json::Value = serde_json::from_str(&text).expect("json");
    if let Some(keys) = set["keys"].as_array_mut() {
        keys.retain(|k| kids.iter().any(|kid| k["kid"] == *kid));
    }
    set.to_string()
}

#[test]
fn a_jwks_fetched_through_a_cluster_follows_rotation_rate_limits_unknown_kids_and_survives_a_failed_fetch(
) {
    let backend = Backend::start(BackendOptions::named("web")).expect("backend");
    let (idp, served, fetches) = key_server();
    *served.lock().expect("lock") = jwks_of(&["ec1"]);
    let routes = "  - name: api\n    cluster: web\n    auth: { jwt: { jwks: { cluster: authz, path: /jwks, refresh: 2s } } }";
    let duet = Duet::start(&config(routes, backend.address(), Some(idp)));
    let t = now();
    let claims = serde_json::json!({"sub": "ann", "exp": t + 300});
    let answer = |kid: &str| {
        let fields = format!("Authorization: Bearer {}\r\n", token(kid, &claims));
        status(&get(duet.address, "/", &fields)).to_owned()
    };
    let fetched = || fetches.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        answer("ec1"),
        "200",
        "the first request waits for the first fetch"
    );
    assert_eq!(fetched(), 1);
    assert_eq!(
        answer("ed1"),
        "401",
        "an unknown kid: fetched again, still unknown"
    );
    assert_eq!(fetched(), 2);
    assert_eq!(answer("ed1"), "401");
    assert_eq!(
        fetched(),
        2,
        "no second fetch for an unknown kid within 10 s"
    );

    *served.lock().expect("lock") = jwks_of(&["ed1"]);
    let limit = Duration::from_secs(10);
    assert!(
        eventually(limit, || answer("ed1") == "200"),
        "the rotated key is fetched once `refresh` has passed"
    );
    assert_eq!(answer("ec1"), "401", "the key taken out is gone");
    assert!(fetched() <= 4, "{} fetches", fetched());

    served.lock().expect("lock").clear();
    let before = fetched();
    assert!(eventually(limit, || {
        answer("ed1");
        fetched() > before
    }));
    let failed = || (duet.log_lines().iter()).any(|l| l.contains("cannot fetch the keys"));
    assert!(eventually(limit, failed), "{:?}", duet.log_lines());
    assert_eq!(answer("ed1"), "200", "a failed fetch keeps the keys in use");
}
