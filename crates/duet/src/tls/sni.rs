//! Which of a listener's certificates a handshake gets: the one covering the name the client asked
//! for (SNI) exactly, else one whose `*.suffix` covers it (one label only, as RFC 6125 §6.4.3 has
//! it: `*.example.com` covers `a.example.com`, not `a.b.example.com`), else the default.

use super::certificate::Loaded;
use std::{collections::HashMap, sync::Arc};
use tokio_rustls::rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};

/// The certificates by name. A name two certificates cover goes to the first listed.
#[derive(Debug)]
pub(crate) struct SniResolver {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the suffix after `*.`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
}

impl SniResolver {
    /// The resolver over `loaded`, with `loaded[default]` (else the first) for no SNI or an unknown
    /// name; `None` if `loaded` is empty.
    pub(crate) fn new(loaded: &[Loaded], default: usize) -> Option<Self> {
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for certificate in loaded {
            for name in &certificate.names {
                let table = match name.strip_prefix("*.") {
                    Some(suffix) => wildcard.entry(suffix.to_owned()),
                    None => exact.entry(name.clone()),
                };
                table.or_insert_with(|| certificate.key.clone());
            }
        }
        let default = loaded.get(default).or(loaded.first())?.key.clone();
        Some(Self {
            exact,
            wildcard,
            default,
        })
    }

    /// The certificate for `name` (SNI, any case), or the default.
    pub(crate) fn pick(&self, name: Option<&str>) -> &Arc<CertifiedKey> {
        let Some(name) = name else {
            return &self.default;
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(key) = self.exact.get(&name) {
            return key;
        }
        name.split_once('.')
            .and_then(|(_, parent)| self.wildcard.get(parent))
            .unwrap_or(&self.default)
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()).clone())
    }
}
