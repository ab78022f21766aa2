//! A cluster's `tls:` block: TLS toward its backends. Files are only named here (the binary reads
//! them); what is checked is that the block can be used as written: a client key with its
//! certificate, and a name to verify every backend's certificate against.

use crate::{
    checker::Checker,
    field::Field,
    model::{Backend, BackendAddress, Location, TlsFiles, UpstreamTls},
    raw::RawUpstreamTls,
};
use serde_saphyr::Spanned;

pub(super) fn upstream_tls(
    checker: &mut Checker,
    raw: &Spanned<RawUpstreamTls>,
    cluster: &Field,
    backends: &[Backend],
) -> UpstreamTls {
    let field = cluster.key("tls");
    let tls = &raw.value;
    let verify = match &tls.verify {
        None => true,
        Some(v) => match v.value.0.as_str() {
            "true" => true,
            "false" => false,
            other => {
                let message = format!("`{other}` is not a boolean: expected true or false");
                checker.reject(v, field.key("verify"), message);
                true
            }
        },
    };
    let server_name = tls.server_name.as_ref().and_then(|name| {
        let text = name.value.0.trim();
        let valid = !text.is_empty()
            && text.len() <= 253
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
        if !valid {
            let message = format!(
                "`{text}` is not a server name: expected the host name on the backends' \
                 certificate, such as api.internal"
            );
            checker.reject(name, field.key("server_name"), message);
            return None;
        }
        Some(text.to_ascii_lowercase())
    });
    let client = client_files(checker, tls, &field);
    if verify && tls.server_name.is_none() {
        ip_backends_need_a_name(checker, raw, &field, backends);
    }
    UpstreamTls {
        ca: tls.ca.as_ref().map(|ca| checker.path(ca)),
        server_name,
        client,
        verify,
        at: Location {
            line: raw.referenced.line(),
            column: raw.referenced.column(),
        },
    }
}

/// `cert` and `key` come together: one without the other cannot authenticate.
fn client_files(checker: &mut Checker, tls: &RawUpstreamTls, field: &Field) -> Option<TlsFiles> {
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let ((cert, cert_at), (key, key_at)) = (checker.path(cert), checker.path(key));
            Some(TlsFiles {
                cert,
                key,
                cert_at,
                key_at,
                ocsp: None,
            })
        }
        (Some(cert), None) => {
            let e = checker.error(cert, field.key("cert"), "a client `cert` needs its `key`");
            checker.push(e.hint("add `key: client.key` beside `cert`, or remove `cert`"));
            None
        }
        (None, Some(key)) => {
            let e = checker.error(key, field.key("key"), "a client `key` needs its `cert`");
            checker.push(e.hint("add `cert: client.pem` beside `key`, or remove `key`"));
            None
        }
        (None, None) => None,
    }
}

/// A backend given by IP has no name to verify its certificate against (and none to send as SNI):
/// without `server_name`, that is an error rather than a certificate check that can never pass.
fn ip_backends_need_a_name(
    checker: &mut Checker,
    raw: &Spanned<RawUpstreamTls>,
    field: &Field,
    backends: &[Backend],
) {
    let Some(ip) = backends.iter().find_map(|b| match b.address {
        BackendAddress::Ip(address) => Some(address),
        BackendAddress::Name { .. } => None,
    }) else {
        return;
    };
    let message = format!(
        "backend {ip} is given by IP and `tls` has no `server_name`: there is no name to verify \
         its certificate against"
    );
    let e = checker.error(raw, field.clone(), message);
    checker.push(e.hint(
        "add `server_name: api.internal` (the name on the backends' certificate), or \
         `verify: false` to encrypt without verifying",
    ));
}
