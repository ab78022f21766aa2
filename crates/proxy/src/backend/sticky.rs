//! Sticky sessions (`sticky:` of a cluster): the first answer sets a cookie naming the backend that
//! gave it, and later requests carrying the cookie go back to that backend while it is eligible.
//!
//! The cookie is `NAME=<id>.<tag>`: `id` is the backend's stable id, 16 hex digits of
//! [`stable_hash`] over its address as text, the same in every worker, instance and process (never the
//! address itself); `tag` is HMAC-SHA256 over the cluster's name and the id, base64url, under the
//! cluster's key. The key is `secret:`/`secret_file:` when given, so that every duet instance behind
//! one L4 balancer, and the next process after a restart, accepts the cookies of the others; without
//! one it is drawn once per process (shared by its workers, kept across reloads), and cookies hold only
//! for this process. A cookie whose tag does not verify is ignored as if absent: a client cannot steer
//! itself onto a backend of its choice, only back to the one it was given.
//!
//! A valid cookie binds the request's first attempt to its backend through
//! [`Balancer::pick_and_claim_preferring`](duet_balance::Balancer::pick_and_claim_preferring), counted
//! as load like any pick; when that backend is ineligible or gone, or for a retry (which never goes back
//! to a backend it tried), the policy picks, and the answer sets the cookie again, for the backend
//! that gave it.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use duet_balance::algo::stable_hash;
use duet_config::{Sticky as StickyConfig, StickySecret};
use http::{header, HeaderMap, HeaderValue};
use ring::hmac;
use rustc_hash::FxBuildHasher;
use std::{cell::RefCell, collections::HashMap, net::SocketAddr, sync::LazyLock};

/// Where a request stands with its cluster's sticky cookie.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Session {
    /// The cluster has no `sticky:`.
    #[default]
    Off,
    /// No valid cookie naming a backend of the cluster: the answer sets one.
    New,
    /// A valid cookie naming this backend of the cluster.
    Bound(SocketAddr),
}

impl Session {
    /// The backend the session prefers, if it is bound to one.
    pub(crate) fn backend(self) -> Option<SocketAddr> {
        match self {
            Self::Bound(backend) => Some(backend),
            Self::Off | Self::New => None,
        }
    }
}

/// A cluster's sticky cookies in one worker: how they are named, signed and read back.
pub(crate) struct StickyCookies {
    /// The cookie's name.
    name: Box<str>,
    /// What every `Set-Cookie` ends with: `; Path=/; HttpOnly; Max-Age=…`.
    attributes: Box<str>,
    key: hmac::Key,
    /// What the tag signs before the id: the cluster's name, so that a cookie of one cluster does
    /// not bind a request of another to a backend they share.
    scope: Box<[u8]>,
    /// The cluster's backends by stable id, rebuilt when its membership changes.
    ids: RefCell<HashMap<u64, SocketAddr, FxBuildHasher>>,
}

/// The key of the clusters without a `secret`: drawn once per process, so the workers agree.
static PROCESS_KEY: LazyLock<hmac::Key> = LazyLock::new(|| {
    let random = ring::rand::SystemRandom::new();
    hmac::Key::generate(hmac::HMAC_SHA256, &random).unwrap_or_else(|_| {
        // The system's generator failed (it does not on Linux past early boot). Std's per-process
        // hash keys come from the same source through another path: weaker, but never a fixed key.
        tracing::error!("no random key for sticky cookies from the system; using std's hash keys");
        let bytes: Vec<u8> = (0..4u8)
            .flat_map(|i| {
                use std::hash::BuildHasher;
                std::collections::hash_map::RandomState::new()
                    .hash_one(i)
                    .to_le_bytes()
            })
            .collect();
        hmac::Key::new(hmac::HMAC_SHA256, &bytes)
    })
});

impl StickyCookies {
    /// The cookies of cluster `cluster` under `config`.
    pub(crate) fn new(cluster: &str, config: &StickyConfig) -> Self {
        let key = match &config.secret {
            StickySecret::Shared(secret) => hmac::Key::new(hmac::HMAC_SHA256, secret),
            StickySecret::Random => PROCESS_KEY.clone(),
        };
        let mut attributes = String::from("; Path=/; HttpOnly");
        if !config.ttl.is_zero() {
            attributes.push_str(&format!("; Max-Age={}", config.ttl.as_secs().max(1)));
        }
        let mut scope = cluster.as_bytes().to_vec();
        scope.push(0);
        Self {
            name: config.cookie.as_str().into(),
            attributes: attributes.into(),
            key,
            scope: scope.into(),
            ids: RefCell::default(),
        }
    }

    /// Makes `backends` the ones a cookie may name.
    pub(crate) fn set_backends(&self, backends: impl Iterator<Item = SocketAddr>) {
        let mut ids = self.ids.borrow_mut();
        ids.clear();
        ids.extend(backends.map(|backend| (stable_id(backend), backend)));
    }

    /// The request's session: bound when its cookie (the first of that name) verifies and names a
    /// backend of the cluster, else new.
    pub(crate) fn session(&self, headers: &HeaderMap) -> Session {
        let Some(value) = cookie(headers, &self.name) else {
            return Session::New;
        };
        let Some(id) = self.verified_id(value) else {
            return Session::New;
        };
        match self.ids.borrow().get(&id) {
            Some(&backend) => Session::Bound(backend),
            None => Session::New,
        }
    }

    /// The `Set-Cookie` for an answer of `backend` to a request in `session`: none when the session
    /// already names it. `secure`: the request came over TLS, so the cookie is sent back only over
    /// TLS (`Secure`), never in clear on the same host's plain listener.
    pub(crate) fn set_cookie(
        &self,
        session: Session,
        backend: SocketAddr,
        secure: bool,
    ) -> Option<HeaderValue> {
        if session == Session::Bound(backend) {
            return None;
        }
        let id = format!("{:016x}", stable_id(backend));
        let tag = hmac::sign(&self.key, &self.signed(id.as_bytes()));
        let tag = URL_SAFE_NO_PAD.encode(tag.as_ref());
        let secure = if secure { "; Secure" } else { "" };
        let cookie = format!("{}={id}.{tag}{}{secure}", self.name, self.attributes);
        HeaderValue::from_str(&cookie).ok()
    }

    /// The id `value` (`<id>.<tag>`) names, if its tag is this cluster's for it.
    fn verified_id(&self, value: &[u8]) -> Option<u64> {
        let dot = value.iter().position(|&b| b == b'.')?;
        let (id, tag) = (&value[..dot], &value[dot + 1..]);
        if id.len() != 16 {
            return None;
        }
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        hmac::verify(&self.key, &self.signed(id), &tag).ok()?;
        u64::from_str_radix(std::str::from_utf8(id).ok()?, 16).ok()
    }

    /// What a tag signs for `id`: the scope, then the id.
    fn signed(&self, id: &[u8]) -> Vec<u8> {
        let mut signed = Vec::with_capacity(self.scope.len() + id.len());
        signed.extend_from_slice(&self.scope);
        signed.extend_from_slice(id);
        signed
    }
}

/// A backend's stable id: its address as text, hashed with no seed, so every worker, instance and
/// process gives the same backend the same id.
fn stable_id(backend: SocketAddr) -> u64 {
    stable_hash(backend.to_string().as_bytes())
}

/// The value of the first cookie named `name` in the request's `Cookie` fields.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    (headers.get_all(header::COOKIE).iter())
        .flat_map(|value| value.as_bytes().split(|&b| b == b';'))
        .find_map(|pair| {
            let rest = pair.trim_ascii().strip_prefix(name.as_bytes())?;
            rest.strip_prefix(b"=")
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(secret: StickySecret) -> StickyConfig {
        StickyConfig {
            cookie: "sid".to_owned(),
            ttl: Duration::from_secs(3600),
            secret,
            at: duet_config::Location { line: 1, column: 1 },
        }
    }

    fn backends() -> [SocketAddr; 2] {
        [([127, 0, 0, 1], 8001).into(), ([127, 0, 0, 1], 8002).into()]
    }

    fn cookies(cluster: &str, secret: StickySecret) -> StickyCookies {
        let cookies = StickyCookies::new(cluster, &config(secret));
        cookies.set_backends(backends().into_iter());
        cookies
    }

    /// The `Cookie` field a client sends back for `set_cookie`.
    fn sent_back(set_cookie: &HeaderValue) -> HeaderMap {
        let text = set_cookie.to_str().unwrap_or_default();
        let pair = text.split(';').next().unwrap_or_default();
        let mut headers = HeaderMap::new();
        let value = format!("other=1; {pair}");
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&value).unwrap_or_else(|e| panic!("{e}")),
        );
        headers
    }

    #[test]
    fn a_cookie_set_for_a_backend_binds_to_it_and_is_not_set_again() {
        let cookies = cookies("web", StickySecret::Random);
        let [a, b] = backends();
        let set = cookies
            .set_cookie(Session::New, b, false)
            .unwrap_or_else(|| panic!("no cookie"));
        let text = set.to_str().unwrap_or_default();
        assert!(text.starts_with("sid="), "{text}");
        assert!(text.ends_with("; Path=/; HttpOnly; Max-Age=3600"), "{text}");
        assert!(
            !text.contains("127.0.0.1") && !text.contains("8002"),
            "no address: {text}"
        );
        let session = cookies.session(&sent_back(&set));
        assert_eq!(session, Session::Bound(b));
        assert_eq!(cookies.set_cookie(session, b, false), None);
        let moved = cookies.set_cookie(session, a, true);
        let moved = moved
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(
            moved.ends_with("; Max-Age=3600; Secure"),
            "moved, over TLS: {moved}"
        );
    }

    #[test]
    fn forged_garbled_foreign_and_unknown_cookies_are_new_sessions() {
        let cookies = cookies("web", StickySecret::Shared(b"0123456789abcdef".to_vec()));
        let [_, b] = backends();
        let set = cookies
            .set_cookie(Session::New, b, false)
            .unwrap_or_else(|| panic!("no cookie"));
        let good = sent_back(&set);
        let value = good
            .get(header::COOKIE)
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        let value = value.unwrap_or_default();
        let with = |cookie: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::COOKIE,
                HeaderValue::from_str(cookie).unwrap_or_else(|e| panic!("{e}")),
            );
            cookies.session(&headers)
        };
        // Another backend's id with this backend's tag.
        let (id, tag) = value
            .split_once("sid=")
            .map(|(_, v)| v)
            .unwrap_or_default()
            .split_once('.')
            .unwrap_or_default();
        let other = format!("{:016x}", stable_id(backends()[0]));
        assert_ne!(id, other);
        assert_eq!(with(&format!("sid={other}.{tag}")), Session::New);
        assert_eq!(with(&format!("sid={id}.{tag}x")), Session::New);
        assert_eq!(with(&format!("sid={id}")), Session::New);
        assert_eq!(with("sid=garbage.%%%"), Session::New);
        assert_eq!(with(&value), Session::Bound(b));
        // Another key (another instance without the shared secret), another cluster's scope.
        let foreign = self::cookies("web", StickySecret::Shared(b"fedcba9876543210".to_vec()));
        assert_eq!(foreign.session(&good), Session::New);
        let elsewhere = self::cookies("api", StickySecret::Shared(b"0123456789abcdef".to_vec()));
        assert_eq!(elsewhere.session(&good), Session::New);
        // Same key and cluster (another worker, another instance): bound.
        let twin = self::cookies("web", StickySecret::Shared(b"0123456789abcdef".to_vec()));
        assert_eq!(twin.session(&good), Session::Bound(b));
        // The backend left the cluster.
        cookies.set_backends(backends()[..1].iter().copied());
        assert_eq!(cookies.session(&good), Session::New);
    }
}
