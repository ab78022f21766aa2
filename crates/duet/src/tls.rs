//! TLS termination for listeners that configure it (rustls, with the `ring` provider).

use duet_config::TlsFiles;
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use std::{io, sync::Arc};
use tokio_rustls::{rustls, TlsAcceptor};

/// Builds the acceptor for a listener's certificate and key. Errors name the file and what is wrong.
pub(crate) fn acceptor(files: &TlsFiles) -> io::Result<TlsAcceptor> {
    let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| {
            invalid(format!(
                "{}: not a PEM certificate chain: {e}",
                files.cert.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(invalid(format!(
            "{}: no certificate in the file",
            files.cert.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
        invalid(format!(
            "{}: not a PEM private key: {e}",
            files.key.display()
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS setup: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            invalid(format!(
                "{} and {}: the key does not fit the certificate: {e}",
                files.cert.display(),
                files.key.display()
            ))
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
