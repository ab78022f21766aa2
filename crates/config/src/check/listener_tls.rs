//! A listener's `tls:` block: the certificates it serves by SNI, which one is the default, and the
//! oldest TLS version it accepts. Files are only named here (the binary reads them and warns of names
//! two certificates cover and of expiry).

use crate::{
    checker::Checker,
    field::Field,
    model::{ClientAuth, ListenerTls, Location, TlsFiles, TlsVersion},
    raw::{RawTls, Scalar},
};
use serde_saphyr::Spanned;

/// The listener's TLS settings; `None` (with an error recorded) when no certificate is given.
pub(super) fn listener_tls(
    checker: &mut Checker,
    raw: &Spanned<RawTls>,
    listener: &Field,
) -> Option<ListenerTls> {
    let field = listener.key("tls");
    let tls = &raw.value;
    let certificates = certificates(checker, raw, &field)?;
    let default = tls.default.as_ref().map_or(0, |default| {
        let (wanted, _) = checker.path(default);
        match certificates.iter().position(|c| c.cert == wanted) {
            Some(index) => index,
            None => {
                let message = format!(
                    "`{}` is not the `cert` of one of this listener's certificates",
                    default.value.0
                );
                let e = checker.error(default, field.key("default"), message);
                checker.push(
                    e.hint("write the `cert` path of one of `certificates` as written there"),
                );
                0
            }
        }
    });
    let min_version = min_version(checker, tls.min_version.as_ref(), &field.key("min_version"));
    let client_auth = tls.client_auth.as_ref().map(|auth| {
        let field = field.key("client_auth");
        let (ca, ca_at) = checker.path(&auth.value.ca);
        let required = match &auth.value.mode {
            None => true,
            Some(mode) => match mode.value.0.trim() {
                "required" => true,
                "optional" => false,
                other => {
                    let message = format!(
                        "`{other}` is not a client_auth mode: expected required or optional"
                    );
                    checker.reject(mode, field.key("mode"), message);
                    true
                }
            },
        };
        ClientAuth {
            ca,
            ca_at,
            required,
        }
    });
    let session_tickets = checker.boolean(
        tls.session_tickets.as_ref(),
        &field.key("session_tickets"),
        true,
    );
    Some(ListenerTls {
        certificates,
        default,
        min_version,
        client_auth,
        session_tickets,
        at: Location {
            line: raw.referenced.line(),
            column: raw.referenced.column(),
        },
    })
}

/// `cert` + `key` (one certificate) or `certificates:` (one or more), not both and not neither.
fn certificates(
    checker: &mut Checker,
    raw: &Spanned<RawTls>,
    field: &Field,
) -> Option<Vec<TlsFiles>> {
    let tls = &raw.value;
    let files = |checker: &Checker, cert, key, ocsp: &Option<Spanned<Scalar>>| {
        let ((cert, cert_at), (key, key_at)) = (checker.path(cert), checker.path(key));
        let ocsp = ocsp.as_ref().map(|ocsp| checker.path(ocsp));
        TlsFiles {
            cert,
            key,
            cert_at,
            key_at,
            ocsp,
        }
    };
    if let (Some(ocsp), None) = (&tls.ocsp, &tls.cert) {
        let message = "an `ocsp` response belongs to one certificate, and there is no `cert` here";
        let e = checker.error(ocsp, field.key("ocsp"), message);
        checker.push(e.hint("write it in its certificate's entry: `- { cert, key, ocsp }`"));
    }
    match (&tls.cert, &tls.key, &tls.certificates) {
        (Some(cert), Some(key), None) => Some(vec![files(checker, cert, key, &tls.ocsp)]),
        (None, None, Some(list)) if !list.value.is_empty() => Some(
            list.value
                .iter()
                .map(|c| files(checker, &c.cert, &c.key, &c.ocsp))
                .collect(),
        ),
        (None, None, Some(list)) => {
            let e = checker.error(
                list,
                field.key("certificates"),
                "no certificate in the list",
            );
            checker.push(e.hint("add `- { cert: site.pem, key: site.key }`"));
            None
        }
        (Some(_) | None, Some(_) | None, Some(list)) => {
            let message = "`cert`/`key` and `certificates` together: write one or the other";
            let e = checker.error(list, field.key("certificates"), message);
            checker.push(e.hint("move the `cert` and `key` into `certificates` as one more item"));
            None
        }
        (Some(cert), None, None) => {
            let e = checker.error(cert, field.key("cert"), "a `cert` needs its `key`");
            checker.push(e.hint("add `key: site.key` beside `cert`"));
            None
        }
        (None, Some(key), None) => {
            let e = checker.error(key, field.key("key"), "a `key` needs its `cert`");
            checker.push(e.hint("add `cert: site.pem` beside `key`"));
            None
        }
        (None, None, None) => {
            let e = checker.error(raw, field.clone(), "no certificate: TLS needs one");
            checker.push(e.hint(
                "add `cert: site.pem` and `key: site.key`, or `certificates: [{ cert, key }]`",
            ));
            None
        }
    }
}

/// `"1.2"` (the default) or `"1.3"`.
fn min_version(checker: &mut Checker, raw: Option<&Spanned<Scalar>>, field: &Field) -> TlsVersion {
    let Some(value) = raw else {
        return TlsVersion::default();
    };
    let text = value.value.0.trim();
    let all = [TlsVersion::V1_2, TlsVersion::V1_3];
    if let Some(version) = all.into_iter().find(|v| v.name() == text) {
        return version;
    }
    let message = format!("`{text}` is not a TLS version duet speaks: expected \"1.2\" or \"1.3\"");
    let e = checker.error(value, field.clone(), message);
    checker.push(e.hint("TLS 1.0 and 1.1 are not offered (rustls has neither)"));
    TlsVersion::default()
}
