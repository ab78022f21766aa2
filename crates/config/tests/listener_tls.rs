//! A listener's `tls:`: one `cert`/`key`, or `certificates:` with a `default`, and `min_version`.

use duet_config::{parse, ProxyProtocol, TlsVersion};

/// `listeners` with one route to one cluster.
fn with_listener(listeners: &str) -> String {
    format!(
        "{listeners}\nroutes: [ {{ cluster: web }} ]\nclusters:\n  - name: web\n    \
         backends: [ {{ address: 127.0.0.1:9001 }} ]\n"
    )
}

/// The errors `yaml` gets, as written for people; panics if it loads.
fn errors(yaml: &str) -> Vec<String> {
    match parse(yaml, "bad.yaml") {
        Ok(_) => panic!("expected errors for:\n{yaml}"),
        Err(errors) => errors.errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn certificates_by_sni_take_their_default_by_cert_path_and_the_old_form_is_one_of_them() {
    let yaml = with_listener(
        "listeners:\n  \
         - address: 127.0.0.1:0\n    \
           tls:\n      \
             certificates:\n        \
               - { cert: /c/shop.pem, key: /c/shop.key }\n        \
               - { cert: /c/api.pem, key: /c/api.key }\n      \
             default: /c/api.pem\n      \
             min_version: \"1.3\"\n  \
         - { address: 127.0.0.1:1, tls: { cert: /c/one.pem, key: /c/one.key } }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let sni = config.listeners[0].tls.as_ref().expect("tls");
    let certs: Vec<_> = sni
        .certificates
        .iter()
        .map(|c| c.cert.display().to_string())
        .collect();
    assert_eq!(certs, ["/c/shop.pem", "/c/api.pem"]);
    assert_eq!((sni.default, sni.min_version), (1, TlsVersion::V1_3));
    let one = config.listeners[1].tls.as_ref().expect("tls");
    assert_eq!(one.certificates.len(), 1);
    assert_eq!((one.default, one.min_version), (0, TlsVersion::V1_2));
}

#[test]
fn an_unknown_default_both_forms_a_lone_cert_and_an_old_version_are_located() {
    let found = errors(&with_listener(
        "listeners:\n  \
         - address: 127.0.0.1:0\n    \
           tls: { certificates: [ { cert: a.pem, key: a.key } ], default: b.pem, min_version: \"1.1\" }\n  \
         - address: 127.0.0.1:1\n    \
           tls: { cert: a.pem, key: a.key, certificates: [ { cert: b.pem, key: b.key } ] }\n  \
         - address: 127.0.0.1:2\n    \
           tls: { cert: a.pem }",
    ));
    let first_lines: Vec<&str> = found.iter().filter_map(|e| e.lines().next()).collect();
    assert_eq!(
        first_lines,
        [
            "bad.yaml:3:68: listeners[0].tls.default: `b.pem` is not the `cert` of one of this \
             listener's certificates",
            "bad.yaml:3:88: listeners[0].tls.min_version: `1.1` is not a TLS version duet speaks: \
             expected \"1.2\" or \"1.3\"",
            "bad.yaml:5:51: listeners[1].tls.certificates: `cert`/`key` and `certificates` together: \
             write one or the other",
            "bad.yaml:7:18: listeners[2].tls.cert: a `cert` needs its `key`",
        ]
    );
}

#[test]
fn proxy_protocol_is_a_version_read_only_from_trusted_proxies() {
    let yaml = with_listener(
        "listeners:\n  - { address: 127.0.0.1:0, proxy_protocol: v2, trusted_proxies: [10.0.0.0/8] }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    assert_eq!(config.listeners[0].proxy_protocol, Some(ProxyProtocol::V2));
    let found = errors(&with_listener(
        "listeners:\n  \
         - { address: 127.0.0.1:0, proxy_protocol: v3, trusted_proxies: [10.0.0.0/8] }\n  \
         - { address: 127.0.0.1:1, proxy_protocol: any }",
    ));
    let first_lines: Vec<&str> = found.iter().filter_map(|e| e.lines().next()).collect();
    assert_eq!(
        first_lines,
        [
            "bad.yaml:2:45: listeners[0].proxy_protocol: `v3` is not a PROXY protocol version: \
             expected v1, v2 or any",
            "bad.yaml:3:45: listeners[1].proxy_protocol: the PROXY protocol is read only from \
             `trusted_proxies`, and there are none",
        ]
    );
}

#[test]
fn an_ocsp_response_belongs_to_one_certificate() {
    let yaml = with_listener(
        "listeners:\n  \
         - address: 127.0.0.1:0\n    \
           tls: { certificates: [ { cert: /c/a.pem, key: /c/a.key, ocsp: /c/a.der }, { cert: /c/b.pem, key: /c/b.key } ] }\n  \
         - { address: 127.0.0.1:1, tls: { cert: /c/one.pem, key: /c/one.key, ocsp: /c/one.der } }",
    );
    let config = parse(&yaml, "ok.yaml").expect("valid");
    let ocsp = |listener: usize, certificate: usize| {
        let tls = config.listeners[listener].tls.as_ref().expect("tls");
        (tls.certificates[certificate].ocsp.as_ref()).map(|(path, _)| path.display().to_string())
    };
    assert_eq!(ocsp(0, 0).as_deref(), Some("/c/a.der"));
    assert_eq!(ocsp(0, 1), None);
    assert_eq!(ocsp(1, 0).as_deref(), Some("/c/one.der"));

    let found = errors(&with_listener(
        "listeners:\n  \
         - { address: 127.0.0.1:0, tls: { ocsp: a.der, certificates: [ { cert: a.pem, key: a.key } ] } }",
    ));
    let first_lines: Vec<&str> = found.iter().filter_map(|e| e.lines().next()).collect();
    assert_eq!(
        first_lines,
        ["bad.yaml:2:42: listeners[0].tls.ocsp: an `ocsp` response belongs to one certificate, and \
          there is no `cert` here"]
    );
}
