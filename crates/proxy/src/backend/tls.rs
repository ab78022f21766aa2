//! A cluster's `tls:` made usable: its files read and turned into one rustls client configuration
//! (ring, as the listeners use), whose session cache lets reconnections resume instead of doing a full
//! handshake.

use duet_config::{Location, UpstreamTls};
use rustls::{
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider},
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use std::{fmt, path::Path, sync::Arc};

/// A file of a cluster's `tls:` that cannot be used, with the field that names it.
#[derive(Debug)]
pub struct UpstreamTlsError {
    /// `ca`, `cert`, `key` or `server_name`.
    pub field: &'static str,
    /// Where the field (or the `tls` block) is written in the config file.
    pub at: Location,
    message: String,
}

impl fmt::Display for UpstreamTlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UpstreamTlsError {}

/// A cluster's TLS client: the configuration every connection to its backends starts from, and the
/// bytes of the files it was built from (a reload that reads the same bytes keeps this one, and with
/// it the pool and the session cache).
pub(crate) struct LoadedTls {
    pub(crate) config: Arc<ClientConfig>,
    /// `server_name` from the file, else each backend's host name.
    pub(crate) server_name: Option<ServerName<'static>>,
    files: Vec<Vec<u8>>,
    settings: UpstreamTls,
}

impl LoadedTls {
    /// Whether `other` was built from the same settings and the same file contents.
    pub(crate) fn same_as(&self, other: &LoadedTls) -> bool {
        self.settings == other.settings && self.files == other.files
    }
}

/// Reads the files a cluster's `tls:` names and checks that they make a TLS client: CA certificates
/// that parse, a client key that fits its certificate. `duet check`, `duet run` and reloads call it
/// before any worker does, so a bad file is refused with its place in the config.
pub fn check_upstream_tls(tls: &UpstreamTls) -> Result<(), UpstreamTlsError> {
    load(tls).map(drop)
}

/// The TLS client for `tls`, its files read now.
pub(crate) fn load(tls: &UpstreamTls) -> Result<LoadedTls, UpstreamTlsError> {
    let mut files = Vec::new();
    let roots = match &tls.ca {
        Some((path, at)) => {
            let bytes = read(path, "ca", *at)?;
            let roots = ca_roots(&bytes, path, *at)?;
            files.push(bytes);
            roots
        }
        // Compiled in (webpki-roots): the image is FROM scratch, with no CA bundle to read.
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let setup = |e: rustls::Error| UpstreamTlsError {
        field: "ca",
        at: tls.at,
        message: format!("TLS setup: {e}"),
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(setup)?;
    let builder = if tls.verify {
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
    };
    let config = match &tls.client {
        None => builder.with_no_client_auth(),
        Some(client) => {
            let cert_bytes = read(&client.cert, "cert", client.cert_at)?;
            let key_bytes = read(&client.key, "key", client.key_at)?;
            let (certs, key) = client_identity(&cert_bytes, &key_bytes, client)?;
            files.push(cert_bytes);
            files.push(key_bytes);
            builder.with_client_auth_cert(certs, key).map_err(|e| {
                let (cert, key) = (client.cert.display(), client.key.display());
                let message =
                    format!("{cert} and {key}: the key does not fit the certificate: {e}");
                UpstreamTlsError {
                    field: "key",
                    at: client.key_at,
                    message,
                }
            })?
        }
    };
    let server_name = tls
        .server_name
        .as_deref()
        .map(|name| {
            ServerName::try_from(name.to_owned()).map_err(|e| UpstreamTlsError {
                field: "server_name",
                at: tls.at,
                message: format!("`{name}` is not a server name: {e}"),
            })
        })
        .transpose()?;
    Ok(LoadedTls {
        config: Arc::new(config),
        server_name,
        files,
        settings: tls.clone(),
    })
}

fn read(path: &Path, field: &'static str, at: Location) -> Result<Vec<u8>, UpstreamTlsError> {
    std::fs::read(path).map_err(|e| UpstreamTlsError {
        field,
        at,
        message: format!("{}: cannot read: {e}", path.display()),
    })
}

/// The certificates of a `ca` file, every one of which must be usable as a trust anchor.
fn ca_roots(bytes: &[u8], path: &Path, at: Location) -> Result<RootCertStore, UpstreamTlsError> {
    let error = |message: String| UpstreamTlsError {
        field: "ca",
        at,
        message: format!("{}: {message}", path.display()),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| error(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(error("no certificate in the file".to_owned()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| error(format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn client_identity(
    cert_bytes: &[u8],
    key_bytes: &[u8],
    files: &duet_config::TlsFiles,
) -> Result<Identity, UpstreamTlsError> {
    let cert_error = |message: String| UpstreamTlsError {
        field: "cert",
        at: files.cert_at,
        message: format!("{}: {message}", files.cert.display()),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| cert_error(format!("not a PEM certificate chain: {e}")))?;
    if certs.is_empty() {
        return Err(cert_error("no certificate in the file".to_owned()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_bytes).map_err(|e| UpstreamTlsError {
        field: "key",
        at: files.key_at,
        message: format!("{}: not a PEM private key: {e}", files.key.display()),
    })?;
    Ok((certs, key))
}

/// `verify: false`: any certificate is accepted (the connection is encrypted, not authenticated), but
/// the handshake's signatures are still checked, so the peer holds the key of what it presented.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
