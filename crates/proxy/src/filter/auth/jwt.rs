//! `auth: { jwt: ... }`: a bearer token verified with a key of the route's JWKS.
//!
//! The algorithm is the key's, never the token's: each key verifies in the one algorithm its JWKS
//! entry names (or its type's usual one), and a token whose `alg` differs is refused; `none` and
//! HMAC are never among them, so a token signed with HS256 and the public key as its secret fails.
//! The key is the one the token's `kid` names; a token without `kid` is tried against a key of its
//! `alg` only when there is exactly one.
//!
//! A JWKS file is read again by the process whenever its content changes (the route is rebuilt
//! with its new keys). A JWKS fetched from the issuer ([`JwksFetch`]) is fetched by each worker
//! when its route first takes a request, again in the background once `refresh` has passed, and
//! for a `kid` the keys lack at most once per [`REFRESH_EVERY`], the request waiting for that
//! fetch; a fetch that fails keeps the keys in use (logged). Keys are rotated by publishing the
//! new one first.

use super::{credentials, jwks_fetch::JwksFetch, jwks_fetch::FETCH_TIMEOUT};
use crate::filter::phase::Build;
use duet_config::filter::auth::{jwk_algorithm, Jwks, Jwt, TokenSource};
use http::{header, HeaderMap, HeaderName, HeaderValue};
use jsonwebtoken::{decode, decode_header, jwk::JwkSet, Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use std::{
    cell::{Cell, RefCell},
    rc::Rc,
    time::{Duration, Instant},
};
use tokio::sync::Notify;

/// The least time between two fetches for an unknown `kid`.
const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// One key of the JWKS, with its validation (its algorithm, the route's `iss`, `aud`, leeway).
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
    validation: Validation,
}

pub(crate) struct JwtAuth {
    keys: Rc<KeyStore>,
    claims: Vec<(String, HeaderName)>,
}

/// A route's keys in one worker, shared with the fetch under way.
struct KeyStore {
    settings: Jwt,
    keys: RefCell<Rc<Vec<Key>>>,
    /// Where the keys are fetched; `None` for a file.
    fetch: Option<JwksFetch>,
    /// When the last fetch started.
    fetched: Cell<Option<Instant>>,
    /// When the last fetch for an unknown `kid` started.
    asked: Cell<Option<Instant>>,
    fetching: Cell<bool>,
    /// The text of the last JWKS fetched, handed on to the route rebuilt by a reload.
    last_text: RefCell<Option<Rc<str>>>,
    /// Wakes the requests waiting for the fetch under way.
    done: Notify,
}

/// What a token's check found.
pub(super) enum Checked {
    /// Let through (its claims set on the request), with its `sub` when the log wants it.
    Admitted(Option<HeaderValue>),
    /// Refused with this `WWW-Authenticate` value.
    Refused(HeaderValue),
    /// Its `kid` is not among the keys, which are being fetched: this token, checked again then.
    AfterFetch(String),
}

/// Why a token is not taken.
enum Unverified {
    Invalid,
    UnknownKey,
}

impl JwtAuth {
    /// The route's keys: a file's, or (fetched) the same route's before a reload, until the next
    /// fetch. `None` if the file's keys are unusable or the cluster is missing.
    pub(super) fn new(
        settings: &Jwt,
        build: Option<&Build<'_>>,
        previous: Option<&JwtAuth>,
    ) -> Option<Self> {
        let (keys, fetch, last_text) = match &settings.jwks {
            Jwks::File { text, .. } => (keys(text, settings)?, None, None),
            Jwks::Fetched(source) => {
                let cluster = build?.clusters.get(source.cluster)?.clone();
                let fetch = JwksFetch::new(cluster, &source.path, source.refresh)?;
                let same = previous.filter(|p| p.keys.settings.jwks == settings.jwks);
                let last_text = same.and_then(|p| p.keys.last_text.borrow().clone());
                let kept = last_text.as_deref().and_then(|text| keys(text, settings));
                (kept.unwrap_or_default(), Some(fetch), last_text)
            }
        };
        let claims = (settings.claims_to_headers.iter())
            .filter_map(|(claim, name)| {
                Some((claim.clone(), HeaderName::from_bytes(name.as_bytes()).ok()?))
            })
            .collect();
        Some(Self {
            keys: Rc::new(KeyStore {
                settings: settings.clone(),
                keys: RefCell::new(Rc::new(keys)),
                fetch,
                fetched: Cell::new(None),
                asked: Cell::new(None),
                fetching: Cell::new(false),
                last_text: RefCell::new(last_text),
                done: Notify::new(),
            }),
            claims,
        })
    }

    /// Lets a request with a valid token through (its claims copied onto it, its `Authorization`
    /// removed unless the route forwards it), and says who it is (its `sub`) when `want_user`;
    /// refuses anyone else with the challenge. A token whose key is being fetched waits for it.
    pub(super) fn admit(&self, headers: &mut HeaderMap, want_user: bool) -> Checked {
        let store = &self.keys;
        store.refresh_if_due();
        let Some(token) = self.token(headers) else {
            // RFC 6750 §3.1: no error code for a request without credentials; an `Authorization`
            // that is not a readable bearer token (too long, another scheme) is an invalid one.
            return Checked::Refused(if headers.contains_key(header::AUTHORIZATION) {
                invalid()
            } else {
                HeaderValue::from_static("Bearer")
            });
        };
        if !store.settings.forward_authorization {
            headers.remove(header::AUTHORIZATION);
        }
        match store.verify(&token) {
            Ok(claims) => {
                headers.extend(self.claim_fields(&claims));
                Checked::Admitted(want_user.then(|| subject(&claims)).flatten())
            }
            Err(Unverified::UnknownKey) if store.fetch_for_unknown_key() => {
                Checked::AfterFetch(token)
            }
            Err(_) => Checked::Refused(invalid()),
        }
    }

    /// [`admit`](Self::admit) again once the fetch under way has ended: the claims' fields to set
    /// and the `sub`, or the challenge.
    pub(super) async fn admit_after_fetch(
        &self,
        token: &str,
        want_user: bool,
    ) -> Result<(HeaderMap, Option<HeaderValue>), HeaderValue> {
        let store = &self.keys;
        let done = store.done.notified();
        if store.fetching.get() {
            // A fetch that hangs ends at its own timeout; this one is a bound on top of it.
            let _ = tokio::time::timeout(FETCH_TIMEOUT * 2, done).await;
        }
        let claims = store.verify(token).map_err(|_| invalid())?;
        let user = want_user.then(|| subject(&claims)).flatten();
        Ok((self.claim_fields(&claims), user))
    }

    /// The fields `claims_to_headers` names, from the token's claims.
    fn claim_fields(&self, claims: &Map<String, Value>) -> HeaderMap {
        let mut fields = HeaderMap::new();
        for (claim, name) in &self.claims {
            let text = match claims.get(claim) {
                Some(Value::String(s)) => s.clone(),
                Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
                _ => continue,
            };
            if let Ok(value) = HeaderValue::from_str(&text) {
                fields.insert(name.clone(), value);
            }
        }
        fields
    }

    /// The token, from `Authorization: Bearer` or else the route's cookie.
    fn token(&self, headers: &HeaderMap) -> Option<String> {
        if let Some(token) = credentials(headers, "bearer") {
            return Some(token.trim().to_owned());
        }
        let TokenSource::BearerOrCookie(name) = &self.keys.settings.source else {
            return None;
        };
        (headers.get_all(header::COOKIE).iter())
            .filter(|v| v.len() <= super::MAX_CREDENTIAL)
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                (k == name).then(|| v.to_owned())
            })
    }
}

impl KeyStore {
    /// The token's claims, if it is valid.
    fn verify(&self, token: &str) -> Result<Map<String, Value>, Unverified> {
        if token.len() > super::MAX_CREDENTIAL {
            return Err(Unverified::Invalid);
        }
        let head = decode_header(token).map_err(|_| Unverified::Invalid)?;
        let keys = self.keys.borrow().clone();
        let key = match &head.kid {
            Some(kid) => keys.iter().find(|k| k.kid.as_ref() == Some(kid)),
            None => {
                let mut fitting = keys.iter().filter(|k| k.alg == head.alg);
                let only = fitting.next();
                only.filter(|_| fitting.next().is_none())
            }
        };
        let key = key.ok_or(Unverified::UnknownKey)?;
        if key.alg != head.alg {
            return Err(Unverified::Invalid);
        }
        decode::<Map<String, Value>>(token, &key.key, &key.validation)
            .map(|data| data.claims)
            .map_err(|_| Unverified::Invalid)
    }

    /// Starts a fetch in the background if the keys were never fetched or `refresh` has passed.
    fn refresh_if_due(self: &Rc<Self>) {
        let Some(fetch) = &self.fetch else { return };
        let due = (self.fetched.get()).is_none_or(|at| at.elapsed() >= fetch.refresh);
        if due && !self.fetching.get() {
            self.start_fetch();
        }
    }

    /// Whether a request with an unknown `kid` waits for a fetch: the one under way, or one
    /// started now if none was for [`REFRESH_EVERY`].
    fn fetch_for_unknown_key(self: &Rc<Self>) -> bool {
        if self.fetch.is_none() {
            return false;
        }
        if self.fetching.get() {
            return true;
        }
        if (self.asked.get()).is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
            return false;
        }
        self.asked.set(Some(Instant::now()));
        self.start_fetch();
        true
    }

    fn start_fetch(self: &Rc<Self>) {
        self.fetching.set(true);
        self.fetched.set(Some(Instant::now()));
        tokio::task::spawn_local(self.clone().fetch());
    }

    /// Fetches the keys; they replace the ones in use if they are a JWKS with a usable key.
    async fn fetch(self: Rc<Self>) {
        let Some(fetch) = &self.fetch else { return };
        let fetched = fetch.text().await.and_then(|text| {
            let keys = keys(&text, &self.settings).ok_or("not a JWKS")?;
            if keys.is_empty() {
                return Err("no usable key".to_owned());
            }
            Ok((text, keys))
        });
        match fetched {
            Ok((text, keys)) => {
                *self.keys.borrow_mut() = Rc::new(keys);
                *self.last_text.borrow_mut() = Some(text.into());
            }
            Err(error) => {
                tracing::warn!("jwks: cannot fetch the keys ({error}); the keys in use stay")
            }
        }
        self.fetching.set(false);
        self.done.notify_waiters();
    }
}

fn invalid() -> HeaderValue {
    HeaderValue::from_static("Bearer error=\"invalid_token\"")
}

/// The token's `sub`, as a field value.
fn subject(claims: &Map<String, Value>) -> Option<HeaderValue> {
    match claims.get("sub") {
        Some(Value::String(sub)) => HeaderValue::from_str(sub).ok(),
        _ => None,
    }
}

/// Every usable key of a JWKS with its validation (keys duet cannot use, an encryption key or a
/// symmetric one, are left out); `None` if the text is not a JWKS.
fn keys(text: &str, settings: &Jwt) -> Option<Vec<Key>> {
    let set: JwkSet = serde_json::from_str(text).ok()?;
    let usable = (set.keys.iter()).filter_map(|jwk| {
        let alg = jwk_algorithm(jwk).ok()?;
        let key = DecodingKey::from_jwk(jwk).ok()?;
        Some(Key {
            kid: jwk.common.key_id.clone(),
            alg,
            key,
            validation: validation(alg, settings),
        })
    });
    Some(usable.collect())
}

/// The checks of every token: `exp` required, `nbf` if present, the issuer and audiences if set.
fn validation(alg: Algorithm, settings: &Jwt) -> Validation {
    let mut validation = Validation::new(alg);
    validation.leeway = settings.leeway.as_secs();
    validation.validate_nbf = true;
    let mut required = vec!["exp"];
    if let Some(issuer) = &settings.issuer {
        validation.set_issuer(&[issuer]);
        required.push("iss");
    }
    if settings.audiences.is_empty() {
        validation.validate_aud = false;
    } else {
        validation.set_audience(&settings.audiences);
        required.push("aud");
    }
    validation.set_required_spec_claims(&required);
    validation
}
