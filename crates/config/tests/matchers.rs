//! Route matchers beyond host and path prefix: how each is read, and each mistake located.

use duet_config::{Action, HeaderMatch, PathMatch, Redirect, RedirectPath, Route, ValueMatch};

fn routes(routes: &str) -> Vec<Route> {
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n{routes}clusters:\n  \
         - {{ name: web, backends: [ {{ address: 127.0.0.1:9001 }} ] }}\n"
    );
    match duet_config::parse(&yaml, "r.yaml") {
        Ok(config) => config.routes,
        Err(errors) => panic!("{errors}"),
    }
}

fn errors(routes: &str) -> Vec<String> {
    let yaml = format!(
        "listeners: [ {{ address: 127.0.0.1:0 }} ]\nroutes:\n{routes}clusters:\n  \
         - {{ name: web, backends: [ {{ address: 127.0.0.1:9001 }} ] }}\n"
    );
    match duet_config::parse(&yaml, "r.yaml") {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(errors) => errors.errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn path_exact_prefix_and_regex_are_read() {
    let found = routes(
        "  - { match: { path: { exact: /healthz } }, cluster: web }\n  \
         - { match: { path: { prefix: /v1 } }, cluster: web }\n  \
         - { match: { path: { regex: '^/users/[0-9]+$' } }, cluster: web }\n  \
         - { match: { path_prefix: /v1 }, cluster: web }\n",
    );
    assert_eq!(found[0].path, PathMatch::Exact("/healthz".into()));
    assert_eq!(found[1].path, PathMatch::Prefix("/v1".into()));
    let PathMatch::Regex(pattern) = &found[2].path else {
        panic!("{:?}", found[2].path)
    };
    assert_eq!(pattern.regex().as_str(), "^/users/[0-9]+$");
    assert!(found[2].path.matches("/users/12") && !found[2].path.matches("/users/x"));
    assert_eq!(found[3].path, found[1].path, "path_prefix is path.prefix");
    let names: Vec<&str> = found.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["*=/healthz", "*/v1", "*~^/users/[0-9]+$", "*/v1#3"]);
}

#[test]
fn method_headers_and_query_are_read() {
    let found = routes(
        "  - match:\n      method: [get, HEAD]\n      headers: { X-Env: canary, x-user: { regex: '^u[0-9]+$' } }\n      \
         query: { debug: \"1\" }\n    cluster: web\n",
    );
    let route = &found[0];
    assert_eq!(route.methods, ["GET", "HEAD"]);
    assert_eq!(
        route.headers[0],
        HeaderMatch {
            name: "x-env".into(),
            value: ValueMatch::Exact("canary".into())
        }
    );
    assert!(route.headers[1].value.matches(b"u12") && !route.headers[1].value.matches(b"x"));
    assert_eq!(route.query, [("debug".to_owned(), "1".to_owned())]);
    assert_eq!(
        route.conditions(),
        " method GET,HEAD header x-env=canary header x-user~^u[0-9]+$ query debug=1"
    );
}

#[test]
fn a_bad_regex_is_located() {
    let found = errors(
        "  - { match: { path: { regex: '^/(a' } }, cluster: web }\n  \
         - { match: { headers: { x-user: { regex: '[z-a]' } } }, cluster: web }\n",
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].starts_with(
            "r.yaml:3:31: routes[0].match.path.regex: `^/(a` is not a valid regex: unclosed group"
        ),
        "{}",
        found[0]
    );
    assert!(
        found[1].starts_with(
            "r.yaml:4:44: routes[1].match.headers.x-user.regex: `[z-a]` is not a valid regex"
        ),
        "{}",
        found[1]
    );
}

#[test]
fn each_matcher_mistake_is_located() {
    let found = errors(
        "  - { match: { path: { exact: /a, prefix: /b } }, cluster: web }\n  \
         - { match: { path: { exact: healthz } }, cluster: web }\n  \
         - { match: { path_prefix: /a, path: { prefix: /b } }, cluster: web }\n  \
         - { match: { method: [] }, cluster: web }\n  \
         - { match: { method: [G ET] }, cluster: web }\n  \
         - { match: { headers: { 'x env': a } }, cluster: web }\n  \
         - { match: { headers: { x-env: { regx: a } } }, cluster: web }\n  \
         - { match: { path: { exakt: /a } }, cluster: web }\n",
    );
    let expected = [
        "r.yaml:3:22: routes[0].match.path: expected exactly one of `exact`, `prefix`, `regex`",
        "r.yaml:4:31: routes[1].match.path.exact: `healthz` must start with `/`",
        "r.yaml:5:39: routes[2].match.path: both `path` and `path_prefix`",
        "r.yaml:6:24: routes[3].match.method: an empty list: the route would match nothing",
        "r.yaml:7:25: routes[4].match.method[0]: `G ET` is not an HTTP method",
        "r.yaml:8:27: routes[5].match.headers.x env: `x env` is not a header name",
        "r.yaml:9:36: routes[6].match.headers.x-env: `regx` is not a way to match a value",
    ];
    for (i, want) in expected.iter().enumerate() {
        assert!(
            found.iter().any(|e| e.starts_with(want)),
            "{i}: {want}\nnot in {found:#?}"
        );
    }
    assert!(
        found.iter().any(|e| e.contains("exakt")),
        "an unknown key under path is reported: {found:#?}"
    );
}

#[test]
fn a_redirect_route_is_read() {
    let found = routes(
        "  - { match: { path_prefix: /old }, redirect: { path_prefix: /new, status: 301 } }\n  \
         - { redirect: { scheme: https, host: Shop.Example.com, port: 8443, path: /x } }\n",
    );
    assert_eq!(
        found[0].action,
        Action::Redirect(Redirect {
            scheme: None,
            host: None,
            port: None,
            path: Some(RedirectPath::Prefix("/new".into())),
            status: 301,
        })
    );
    assert_eq!(
        found[1].target(&[]),
        "redirect 302 scheme https host shop.example.com port 8443 path /x"
    );
}

#[test]
fn each_redirect_mistake_is_located() {
    let found = errors(
        "  - { redirect: { scheme: ftp } }\n  \
         - { redirect: { status: 200, path: /a } }\n  \
         - { match: { path: { exact: /a } }, redirect: { path_prefix: /b } }\n  \
         - { redirect: { status: 301 } }\n  \
         - { cluster: web, redirect: { path: /a } }\n  \
         - { match: { path_prefix: /a } }\n  \
         - { redirect: { path: //evil.example } }\n",
    );
    let expected = [
        "r.yaml:3:27: routes[0].redirect.scheme: `ftp` is not a scheme duet redirects to",
        "r.yaml:4:27: routes[1].redirect.status: `200` is not a redirect status",
        "r.yaml:5:64: routes[2].redirect.path_prefix: the route matches no prefix to replace",
        "r.yaml:6:17: routes[3].redirect: changes nothing",
        "r.yaml:7:31: routes[4].redirect: both `cluster` and `redirect`",
        "r.yaml:8:5: routes[5]: neither `cluster`, `backends` nor `redirect`",
        "r.yaml:9:25: routes[6].redirect.path: `//evil.example` would read as a host",
    ];
    for (i, want) in expected.iter().enumerate() {
        assert!(
            found.iter().any(|e| e.starts_with(want)),
            "{i}: {want}\nnot in {found:#?}"
        );
    }
    assert_eq!(found.len(), expected.len(), "{found:#?}");
}

#[test]
fn a_header_matcher_on_a_client_address_field_duet_replaces_is_refused_with_a_hint() {
    let found = errors(
        "  - { match: { headers: { X-Real-IP: 10.0.0.1 } }, cluster: web }\n  \
         - { match: { headers: { x-forwarded-for: { regex: '^10\\.' } } }, cluster: web }\n  \
         - { match: { headers: { Forwarded: for=10.0.0.1 } }, cluster: web }\n",
    );
    assert_eq!(found.len(), 3, "{found:#?}");
    let expected = [
        "r.yaml:3:27: routes[0].match.headers.X-Real-IP: `x-real-ip` is replaced by duet from what it saw",
        "r.yaml:4:27: routes[1].match.headers.x-forwarded-for: `x-forwarded-for` is replaced by duet from what it saw",
        "r.yaml:5:27: routes[2].match.headers.Forwarded: `forwarded` is replaced by duet from what it saw",
    ];
    for (error, want) in found.iter().zip(expected) {
        assert!(error.starts_with(want), "{error}\nwanted {want}");
        assert!(
            error.contains("hint: a client writes any address it likes here"),
            "{error}"
        );
    }
    // How the client came in, which a trusted front proxy says, can still be matched.
    let kept = routes("  - { match: { headers: { x-forwarded-proto: http } }, cluster: web }\n");
    assert_eq!(kept[0].headers[0].name, "x-forwarded-proto");
}

#[test]
fn a_regex_past_its_memory_limit_is_refused_where_written() {
    let found = errors(
        "  - { match: { path: { regex: '^/u/\\w{1,50}$' } }, cluster: web }\n  \
         - { match: { headers: { x-user: { regex: '\\pL{1,100}' } } }, cluster: web }\n",
    );
    let expected = [
        "r.yaml:3:31: routes[0].match.path.regex: `^/u/\\w{1,50}$` compiles to more than 1024 KiB, the most a regex may",
        "r.yaml:4:44: routes[1].match.headers.x-user.regex: `\\pL{1,100}` compiles to more than 1024 KiB, the most a regex may",
    ];
    assert_eq!(found.len(), 2, "{found:#?}");
    for (error, want) in found.iter().zip(expected) {
        assert!(error.starts_with(want), "{error}\nwanted {want}");
        assert!(error.contains("hint: a counted repetition"), "{error}");
    }
    // The same shapes at ASCII or a small count are far below it.
    let small = routes(
        "  - { match: { path: { regex: '^/u/[0-9A-Za-z_]{1,50}$' } }, cluster: web }\n  \
         - { match: { path: { regex: '^/u/\\w+$' } }, cluster: web }\n",
    );
    for route in &small {
        let PathMatch::Regex(pattern) = &route.path else {
            panic!("{:?}", route.path)
        };
        assert!(pattern.memory_usage() < 64 * 1024, "{}", pattern.regex());
    }
}

#[test]
fn a_configs_regexes_past_their_total_memory_limit_are_refused_once_where_they_cross_it() {
    // Each under the limit for one regex (about 0.9 MiB), forty of them far over the total.
    let routes: String = (0..40)
        .map(|i| {
            format!(
                "  - {{ match: {{ path: {{ regex: '^/{i:02}/\\w{{1,17}}$' }} }}, cluster: web }}\n"
            )
        })
        .collect();
    let found = errors(&routes);
    assert_eq!(found.len(), 1, "{found:#?}");
    let error = &found[0];
    let index: usize = error
        .split("routes[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .and_then(|i| i.parse().ok())
        .expect("a route index");
    assert!((10..40).contains(&index), "{error}");
    let want = format!(
        "r.yaml:{}:31: routes[{index}].match.path.regex: with `^/{index:02}/\\w{{1,17}}$`, the regexes so far hold ",
        index + 3
    );
    assert!(error.starts_with(&want), "{error}\nwanted {want}");
    assert!(
        error.contains("KiB, over the 16384 KiB a config's regexes may hold together"),
        "{error}"
    );
}

#[test]
fn a_path_written_with_parameters_is_refused_since_routes_match_paths_without_them() {
    let found = errors(
        "  - { match: { path: { exact: '/page;jsessionid=1' } }, cluster: web }\n  \
         - { match: { path_prefix: '/api;v=2/' }, cluster: web }\n",
    );
    let expected = [
        "r.yaml:3:31: routes[0].match.path.exact: `/page;jsessionid=1` holds `;`: routes match a request's path without its `;` parameters",
        "r.yaml:4:29: routes[1].match.path_prefix: `/api;v=2/` holds `;`: routes match a request's path without its `;` parameters",
    ];
    assert_eq!(found.len(), 2, "{found:#?}");
    for (error, want) in found.iter().zip(expected) {
        assert!(error.starts_with(want), "{error}\nwanted {want}");
    }
    assert!(found[0].contains("hint: write `/page`"), "{}", found[0]);
}
