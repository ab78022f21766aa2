//! `X-Forwarded-Client-Cert` (Envoy's format) for a client that showed a certificate the listener's
//! `client_auth` verified: `Hash=<sha256 of its DER, hex>;Subject="<RFC 2253>";URI=<each URI
//! SAN>;DNS=<each DNS SAN>`. A client-sent field of that name is never forwarded (Envoy's default
//! `sanitize`): every request has it removed first.

use http::{HeaderName, HeaderValue};
use std::fmt::Write;
use x509_parser::extensions::GeneralName;

/// The field's name.
pub(crate) static X_FORWARDED_CLIENT_CERT: HeaderName =
    HeaderName::from_static("x-forwarded-client-cert");

/// The field's value for the leaf certificate `der`; `None` if it does not parse (rustls verified
/// it, so it does) or has bytes no field value may hold.
pub(crate) fn value(der: &[u8]) -> Option<HeaderValue> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let mut text = String::from("Hash=");
    for byte in ring::digest::digest(&ring::digest::SHA256, der).as_ref() {
        let _ = write!(text, "{byte:02x}");
    }
    let _ = write!(
        text,
        ";Subject=\"{}\"",
        quoted(&rfc2253(certificate.subject()))
    );
    if let Ok(Some(san)) = certificate.subject_alternative_name() {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name {
                let _ = write!(text, ";URI={uri}");
            }
        }
        for name in &san.value.general_names {
            if let GeneralName::DNSName(dns) = name {
                let _ = write!(text, ";DNS={dns}");
            }
        }
    }
    HeaderValue::from_str(&text).ok()
}

/// The name as RFC 2253 writes it (and Envoy): its last RDN first, `,` between RDNs, `+` within
/// one, attribute types by their short names (`CN`, `O`) or dotted OID.
fn rfc2253(name: &x509_parser::x509::X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let rdns: Vec<String> = name
        .iter()
        .map(|rdn| {
            let parts: Vec<String> = rdn
                .iter()
                .map(|attribute| {
                    let kind = x509_parser::objects::oid2abbrev(attribute.attr_type(), registry)
                        .map_or_else(|_| attribute.attr_type().to_id_string(), str::to_owned);
                    let value = attribute.as_str().unwrap_or("");
                    format!("{kind}={}", escape(value))
                })
                .collect();
            parts.join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// RFC 2253 §2.4's escapes.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for (i, c) in value.chars().enumerate() {
        let edge =
            (i == 0 && (c == ' ' || c == '#')) || (i + 1 == value.chars().count() && c == ' ');
        if edge || matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Inside the field's double quotes: `"` and `\` escaped.
fn quoted(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}
