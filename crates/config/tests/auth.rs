//! A route's `auth:`: its files read at check, and each mistake located, in the config and in the
//! file it names.

use duet_config::{
    filter::auth::{Auth, Jwks},
    parse,
};

mod support;
use support::{errors, with_routes};

/// A fresh folder for the files a test writes.
fn folder(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("duet-config-auth-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}

const ANN: &str = "ann:$2y$05$2N5M7N11ybMXZj2oRlDacuBAy3mkS7eUAIRELs7TYTDtCHNqV94O2\n";

#[test]
fn the_three_ways_load_with_their_files_and_defaults() {
    let dir = folder("ok");
    std::fs::write(dir.join("users"), ANN).expect("write");
    let jwks = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/auth/jwks.json"
    );
    let yaml = with_routes(&format!(
        "routes:\n  \
         - {{ match: {{ path_prefix: /a }}, cluster: web, auth: {{ basic: {{ users: '{}' }} }} }}\n  \
         - {{ match: {{ path_prefix: /b }}, cluster: web, auth: {{ jwt: {{ jwks: '{jwks}', claims_to_headers: {{ sub: X-User }} }} }} }}\n  \
         - {{ cluster: web, auth: {{ forward: {{ cluster: web, path: /check }} }} }}",
        dir.join("users").display()
    ));
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let auth = |i: usize| config.routes[i].filters.auth.clone().expect("auth");
    let Auth::Basic(basic) = auth(0) else {
        panic!("basic")
    };
    assert_eq!((basic.users.len(), basic.realm.as_str()), (1, "duet"));
    let Auth::Jwt(jwt) = auth(1) else {
        panic!("jwt")
    };
    assert!(
        matches!(jwt.jwks, Jwks::File { key_count: 3, .. }),
        "{:?}",
        jwt.jwks
    );
    assert_eq!(
        jwt.claims_to_headers,
        [("sub".to_owned(), "x-user".to_owned())]
    );
    assert_eq!(jwt.leeway, std::time::Duration::from_secs(60));
    let Auth::Forward(forward) = auth(2) else {
        panic!("forward")
    };
    assert_eq!((forward.cluster, forward.timeout.as_millis()), (0, 1000));
}

#[test]
fn a_missing_file_a_weak_htpasswd_line_a_bad_jwks_and_a_wrong_cluster_are_located() {
    let dir = folder("bad");
    std::fs::write(
        dir.join("users"),
        format!("{ANN}\nbob:$apr1$x$yyyyyyyyyyyyyyyyyyyyyy\n"),
    )
    .expect("write");
    std::fs::write(
        dir.join("oct.json"),
        r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#,
    )
    .expect("write");
    std::fs::write(dir.join("broken.json"), "{\"keys\": [\n  {\"kty\": }").expect("write");
    let at = |name: &str| dir.join(name).display().to_string();
    let found = errors(&with_routes(&format!(
        "routes:\n  \
         - {{ match: {{ path_prefix: /a }}, cluster: web, auth: {{ basic: {{ users: '{}' }} }} }}\n  \
         - {{ match: {{ path_prefix: /b }}, cluster: web, auth: {{ basic: {{ users: nowhere.htpasswd }} }} }}\n  \
         - {{ match: {{ path_prefix: /c }}, cluster: web, auth: {{ jwt: {{ jwks: '{}' }} }} }}\n  \
         - {{ match: {{ path_prefix: /d }}, cluster: web, auth: {{ jwt: {{ jwks: '{}' }} }} }}\n  \
         - {{ match: {{ path_prefix: /e }}, cluster: web, auth: {{ forward: {{ cluster: wbe }} }} }}\n  \
         - {{ cluster: web, auth: {{ basic: {{ users: x }}, jwt: {{ jwks: y }} }} }}",
        at("users"),
        at("oct.json"),
        at("broken.json")
    )));
    assert_eq!(found.len(), 6, "{found:#?}");
    let expected = [
        "bad.yaml:3:",
        "routes[0].auth.basic.users: ",
        "users line 3: user `bob` has an MD5 hash",
        "bad.yaml:4:",
        "routes[1].auth.basic.users: cannot read the htpasswd file",
        "routes[2].auth.jwt.jwks: ",
        "key 0 ((no kid)): a symmetric (oct) key",
        "routes[3].auth.jwt.jwks: ",
        "not a JWKS at line 2 column",
        "routes[4].auth.forward.cluster: no cluster named `wbe`",
        "routes[5].auth: expected exactly one of `basic`, `jwt`, `forward`",
    ];
    for part in expected {
        assert!(found.iter().any(|e| e.contains(part)), "{part}\n{found:#?}");
    }
    assert!(
        found.iter().any(|e| e.contains("did you mean `web`?")),
        "{found:#?}"
    );
}

#[test]
fn a_fetched_jwks_names_a_cluster_and_a_refresh_above_zero() {
    let yaml = with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, auth: { jwt: { jwks: { cluster: web } } } }\n  \
         - { match: { path_prefix: /b }, cluster: web, auth: { jwt: { jwks: { cluster: web, path: /keys, refresh: 30s } } } }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let source = |i: usize| match &config.routes[i].filters.auth {
        Some(Auth::Jwt(jwt)) => match &jwt.jwks {
            Jwks::Fetched(source) => source.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    let a = source(0);
    assert_eq!(
        (
            a.cluster_name.as_str(),
            a.path.as_str(),
            a.refresh.as_secs()
        ),
        ("web", "/.well-known/jwks.json", 300)
    );
    let b = source(1);
    assert_eq!((b.path.as_str(), b.refresh.as_secs()), ("/keys", 30));

    let found = errors(&with_routes(
        "routes:\n  \
         - { match: { path_prefix: /a }, cluster: web, auth: { jwt: { jwks: { cluster: idp } } } }\n  \
         - { match: { path_prefix: /b }, cluster: web, auth: { jwt: { jwks: { cluster: web, refresh: 0s } } } }\n  \
         - { match: { path_prefix: /c }, cluster: web, auth: { jwt: { jwks: { cluster: web, path: keys } } } }\n  \
         - { match: { path_prefix: /d }, cluster: web, auth: { jwt: { jwks: { path: /keys } } } }\n  \
         - { cluster: web, auth: { jwt: { jwks: { cluster: web, refesh: 1m } } } }",
    ));
    let expected = [
        "bad.yaml:3:",
        "routes[0].auth.jwt.jwks.cluster: no cluster named `idp`",
        "bad.yaml:4:",
        "routes[1].auth.jwt.jwks.refresh: `0s` would fetch the keys without pause",
        "routes[2].auth.jwt.jwks.path: `keys` is not a path",
        "routes[3].auth.jwt.jwks: no `cluster`",
        "refesh",
    ];
    for part in expected {
        assert!(found.iter().any(|e| e.contains(part)), "{part}\n{found:#?}");
    }
}
