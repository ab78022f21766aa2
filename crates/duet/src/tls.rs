//! TLS termination for listeners that configure it (rustls, with the `ring` provider).

use duet_config::{Location, TlsFiles};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use std::{fmt, io, sync::Arc};
use tokio_rustls::{rustls, TlsAcceptor};

/// A certificate or key that cannot be used, with the config field that names it.
#[derive(Debug)]
pub(crate) struct TlsError {
    /// `cert` or `key`.
    pub(crate) field: &'static str,
    /// Where the field is written in the config file.
    pub(crate) at: Location,
    message: String,
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

/// Builds the acceptor for a listener's certificate and key, reading both files now. Errors name the
/// file and what is wrong.
pub(crate) fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    let cert_error = |message: String| TlsError {
        field: "cert",
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
    if certs.is_empty() {
        return Err(cert_error(format!(
            "{}: no certificate in the file",
            files.cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| TlsError {
        field: "key",
        at: files.key_at,
        message: format!("{}: not a PEM private key: {e}", files.key.display()),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| cert_error(format!("TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            cert_error(format!(
                "{} and {}: the key does not fit the certificate: {e}",
                files.cert.display(),
                files.key.display()
            ))
        })?;
    // HTTP/2 first: a client offering both gets it (served by `duet_proxy`'s h2 path after ALPN).
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
