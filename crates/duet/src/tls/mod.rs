//! TLS termination for listeners that configure it (rustls, with the `ring` provider): each
//! listener's certificates, chosen by the name the client asks for (SNI), its oldest TLS version, and
//! what `duet check` warns of in its certificates.

pub(crate) mod rotation;

mod tickets;

mod sni;
mod warnings;
mod certificate;
mod ocsp;

pub(crate) use certificate::TlsError;
pub(crate) use warnings::warnings;

use certificate::Loaded;
use duet_config::{ClientAuth, ListenerTls, TlsVersion};
use rustls_pki_types::{pem::PemObject, CertificateDer};
use std::sync::Arc;
use tokio_rustls::{rustls, TlsAcceptor};

/// Reads every certificate and key of a listener. Errors name the file, its field and what is wrong.
pub(crate) fn load(tls: &ListenerTls) -> Result<Vec<Loaded>, TlsError> {
    let listed = tls.certificates.len() > 1;
    let provider = rustls::crypto::ring::default_provider();
    tls.certificates
        .iter()
        .enumerate()
        .map(|(i, files)| {
            certificate::load(files, &provider).map_err(|mut error| {
                if listed {
                    error.field = format!("certificates[{i}].{}", error.field);
                }
                error
            })
        })
        .collect()
}

/// Builds the acceptor for a listener's certificates, reading them now; with what it read of them.
/// `resumable`: the listener's sessions resume from tickets under its keys ([`tickets`]); `None`: only
/// from the acceptor's own session cache (`session_tickets: false`).
pub(crate) fn acceptor(
    tls: &ListenerTls,
    resumable: Option<&tickets::Resumable>,
) -> Result<(TlsAcceptor, Vec<Loaded>), TlsError> {
    let loaded = load(tls)?;
    let resolver = sni::SniResolver::new(&loaded, tls.default)
        .ok_or_else(|| TlsError::at_tls(tls, "no certificate".to_owned()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = match tls.min_version {
        TlsVersion::V1_2 => rustls::DEFAULT_VERSIONS,
        TlsVersion::V1_3 => &[&rustls::version::TLS13],
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::at_tls(tls, format!("TLS setup: {e}")))?;
    let builder = match &tls.client_auth {
        None => builder.with_no_client_auth(),
        Some(auth) => builder.with_client_cert_verifier(client_verifier(auth, provider)?),
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    if let Some(resumable) = resumable {
        config.ticketer = tickets::ticketer(resumable)
            .map_err(|e| TlsError::at_tls(tls, format!("session ticket keys: {e}")))?;
    }
    // HTTP/2 first: a client offering both gets it (served by `duet_proxy`'s h2 path after ALPN).
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((TlsAcceptor::from(Arc::new(config)), loaded))
}

/// Verifies client certificates against `auth.ca`; `optional` lets a client without one through.
fn client_verifier(
    auth: &ClientAuth,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let error = |message: String| TlsError {
        field: "client_auth.ca".to_owned(),
        at: auth.ca_at,
        message: format!("{}: {message}", auth.ca.display()),
    };
    let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&auth.ca)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| error(format!("not PEM certificates: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(ca)
            .map_err(|e| error(format!("not a CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(error("no certificate in the file".to_owned()));
    }
    let builder =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if auth.required {
        builder
    } else {
        builder.allow_unauthenticated()
    };
    builder
        .build()
        .map_err(|e| error(format!("cannot verify clients with it: {e}")))
}
