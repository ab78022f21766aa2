//! Cost of one `auth:` check as the admission phase runs it (`cargo bench --bench auth`): a basic
//! check answered from the worker's cache, one hashed (bcrypt at `htpasswd -B`'s cost 5; a wrong
//! password, which is never cached), and a JWT verified with ES256, EdDSA and RS256. `open` is the
//! copy of the request's fields every case makes, the floor under the others.

use criterion::{criterion_group, criterion_main, Criterion};
use duet_proxy::AuthCheck;
use http::{header::AUTHORIZATION, HeaderMap, HeaderValue};
use std::{hint::black_box, path::Path};

/// `htpasswd -nbB ann p` (apache2-utils).
const HTPASSWD: &str = "ann:$2y$05$2N5M7N11ybMXZj2oRlDacuBAy3mkS7eUAIRELs7TYTDtCHNqV94O2\n";

fn check(route_auth: &str, dir: &Path) -> AuthCheck {
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n  - cluster: app\n    auth: {route_auth}\nclusters:\n  - {{ name: app, backends: [ {{ address: 127.0.0.1:9 }} ] }}\n"
    );
    let origin = dir.join("bench.yaml");
    let config = duet_config::parse(&yaml, &origin.display().to_string()).expect("config");
    let auth = config.routes[0].filters.auth.as_ref().expect("auth");
    AuthCheck::new(auth).expect("a check")
}

fn token(kid: &str) -> String {
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
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3600;
    let claims = serde_json::json!({"sub": "ann", "aud": "api", "exp": exp});
    encode(&header, &claims, &key).expect("signed")
}

fn fields(authorization: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let value = HeaderValue::from_str(authorization).expect("value");
    headers.insert(AUTHORIZATION, value);
    headers.insert("accept", HeaderValue::from_static("*/*"));
    headers
}

fn bench(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("duet-bench-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("users"), HTPASSWD).expect("htpasswd");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth");
    let basic = check(
        &format!(
            "{{ basic: {{ users: '{}' }} }}",
            dir.join("users").display()
        ),
        &dir,
    );
    let jwt = check(
        &format!(
            "{{ jwt: {{ jwks: '{}', audiences: [api] }} }}",
            fixtures.join("jwks.json").display()
        ),
        &dir,
    );
    let mut group = c.benchmark_group("auth");
    let right = fields("Basic YW5uOnA="); // ann:p
    let wrong = fields("Basic YW5uOnE="); // ann:q
    group.bench_function("open", |b| b.iter(|| black_box(right.clone())));
    assert!(basic.admits(&mut right.clone()), "ann:p is right");
    group.bench_function("basic_cached", |b| {
        b.iter(|| basic.admits(&mut black_box(right.clone())))
    });
    group.bench_function("basic_bcrypt_uncached", |b| {
        b.iter(|| basic.admits(&mut black_box(wrong.clone())))
    });
    for kid in ["ec1", "ed1", "rsa1"] {
        let bearer = fields(&format!("Bearer {}", token(kid)));
        assert!(jwt.admits(&mut bearer.clone()), "{kid} verifies");
        group.bench_function(format!("jwt_{kid}"), |b| {
            b.iter(|| jwt.admits(&mut black_box(bearer.clone())))
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
