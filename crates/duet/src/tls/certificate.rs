//! One certificate of a listener, read from its files: the chain and key rustls serves, and the names
//! and expiry SNI and `duet check` go by.

use duet_config::{ListenerTls, Location, TlsFiles};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use std::{fmt, io, sync::Arc};
use tokio_rustls::rustls::{self, crypto::CryptoProvider, sign::CertifiedKey};

/// A certificate or key that cannot be used, with the config field that names it.
#[derive(Debug)]
pub(crate) struct TlsError {
    /// `cert`, `key` or `certificates[N].cert`...: under the listener's `tls`.
    pub(crate) field: String,
    /// Where the field is written in the config file.
    pub(crate) at: Location,
    pub(crate) message: String,
}

impl TlsError {
    /// An error of the `tls` block as a whole.
    pub(crate) fn at_tls(tls: &ListenerTls, message: String) -> Self {
        Self {
            field: String::new(),
            at: tls.at,
            message,
        }
    }
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<TlsError> for io::Error {
    fn from(error: TlsError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, error.message)
    }
}

/// A certificate chain with its key, ready to serve, and what its leaf says.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub(crate) files: TlsFiles,
    pub(crate) key: Arc<CertifiedKey>,
    /// The DNS names the leaf covers, lower case (`*.example.com` for a wildcard): its subject
    /// alternative names, or its common name when it has none.
    pub(crate) names: Vec<String>,
    /// When the leaf expires, in seconds since the Unix epoch.
    pub(crate) not_after: i64,
}

/// Reads `files`: a PEM chain (leaf first) and the private key that fits its leaf.
pub(crate) fn load(files: &TlsFiles, provider: &CryptoProvider) -> Result<Loaded, TlsError> {
    let cert_error = |message: String| TlsError {
        field: "cert".to_owned(),
        at: files.cert_at,
        message,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| {
            cert_error(format!(
                "{}: not a PEM certificate chain: {e}",
                files.cert.display()
            ))
        })?;
    let Some(leaf) = certs.first() else {
        return Err(cert_error(format!(
            "{}: no certificate in the file",
            files.cert.display()
        )));
    };
    let (names, not_after) = describe(leaf).map_err(|e| {
        cert_error(format!(
            "{}: not an X.509 certificate: {e}",
            files.cert.display()
        ))
    })?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError {
        field: "key".to_owned(),
        at: files.key_at,
        message: format!("{}: not a PEM private key: {e}", files.key.display()),
    })?;
    let mut key = CertifiedKey::from_der(certs, key, provider).map_err(|e| {
        let message = match e {
            rustls::Error::InconsistentKeys(_) => "the key does not fit the certificate".to_owned(),
            other => format!("the key cannot be used: {other}"),
        };
        cert_error(format!(
            "{} and {}: {message}",
            files.cert.display(),
            files.key.display()
        ))
    })?;
    if let Some((path, at)) = &files.ocsp {
        key.ocsp = Some(ocsp_response(path).map_err(|message| TlsError {
            field: "ocsp".to_owned(),
            at: *at,
            message: format!("{}: {message}", path.display()),
        })?);
    }
    Ok(Loaded {
        files: files.clone(),
        key: Arc::new(key),
        names,
        not_after,
    })
}

/// The most of an OCSP response read (they are a few KiB).
const MAX_OCSP: u64 = 64 * 1024;

/// A DER OCSP response (RFC 6960 §4.2.1) to staple, as an outside tool (`openssl ocsp`, certbot, a
/// cron job) wrote it: refused unless its status is `successful`, since a `tryLater` or cut-off
/// file stapled would make strict clients fail every handshake. Its signature and freshness are the
/// client's to check.
fn ocsp_response(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_OCSP + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read the OCSP response: {e}"))?;
    if bytes.len() as u64 > MAX_OCSP {
        return Err(format!("an OCSP response over {MAX_OCSP} bytes"));
    }
    match ocsp_status(&bytes) {
        Some(0) => Ok(bytes),
        Some(status) => Err(format!(
            "an OCSP response with status {status}, not successful (0)"
        )),
        None => Err("not a DER OCSP response".to_owned()),
    }
}

/// The `responseStatus` of a DER `OCSPResponse`: `SEQUENCE { ENUMERATED, [0] ... }`, whose
/// length (short or long form) covers the rest of the bytes.
fn ocsp_status(bytes: &[u8]) -> Option<u8> {
    let (&tag, rest) = bytes.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        0x81..=0x84 => {
            let count = usize::from(first & 0x7f);
            let (digits, rest) = rest.split_at_checked(count)?;
            let length = digits
                .iter()
                .fold(0usize, |n, &d| (n << 8) | usize::from(d));
            (length, rest)
        }
        _ => return None,
    };
    match (tag, rest) {
        (0x30, [0x0a, 0x01, status, ..]) if rest.len() == length => Some(*status),
        _ => None,
    }
}

/// The leaf's DNS names and expiry.
fn describe(leaf: &CertificateDer<'_>) -> Result<(Vec<String>, i64), String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf).map_err(|e| e.to_string())?;
    let mut names: Vec<String> = match parsed.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    Some(dns.to_ascii_lowercase())
                }
                _ => None,
            })
            .collect(),
        Ok(None) => Vec::new(),
        Err(e) => return Err(e.to_string()),
    };
    if names.is_empty() {
        let common = parsed.subject().iter_common_name().next();
        if let Some(cn) = common.and_then(|cn| cn.as_str().ok()) {
            names.push(cn.to_ascii_lowercase());
        }
    }
    Ok((names, parsed.validity().not_after.timestamp()))
}

#[cfg(test)]
mod tests {
    use super::ocsp_status;

    #[test]
    fn an_ocsp_response_s_status_is_read_from_its_der_and_anything_else_is_refused() {
        // `successful`, with (made-up) response bytes after it; short and long length forms.
        assert_eq!(
            ocsp_status(&[0x30, 0x05, 0x0a, 0x01, 0x00, 0xa0, 0x00]),
            Some(0)
        );
        let mut long = vec![0x30, 0x82, 0x01, 0x03, 0x0a, 0x01, 0x00, 0xa0, 0x81, 0xfc];
        long.extend([0u8; 0xfd]);
        assert_eq!(ocsp_status(&long), Some(0));
        // `tryLater` (3), as a responder answers when it cannot.
        assert_eq!(ocsp_status(&[0x30, 0x03, 0x0a, 0x01, 0x03]), Some(3));
        // Cut short, not a SEQUENCE, empty, PEM.
        assert_eq!(ocsp_status(&long[..100]), None);
        assert_eq!(ocsp_status(&[0x31, 0x03, 0x0a, 0x01, 0x00]), None);
        assert_eq!(ocsp_status(&[]), None);
        assert_eq!(ocsp_status(b"-----BEGIN"), None);
    }
}
