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
    /// When the stapled OCSP response goes stale (the earliest `nextUpdate` in it), in seconds since
    /// the Unix epoch; `None` without a response, or with one that names no `nextUpdate`.
    pub(crate) ocsp_next_update: Option<i64>,
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
    let mut ocsp_next_update = None;
    if let Some((path, at)) = &files.ocsp {
        let response = super::ocsp::response(path).map_err(|message| TlsError {
            field: "ocsp".to_owned(),
            at: *at,
            message: format!("{}: {message}", path.display()),
        })?;
        ocsp_next_update = super::ocsp::next_update(&response);
        key.ocsp = Some(response);
    }
    Ok(Loaded {
        files: files.clone(),
        key: Arc::new(key),
        names,
        not_after,
        ocsp_next_update,
    })
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
