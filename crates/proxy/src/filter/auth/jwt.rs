//! `auth: { jwt: ... }`: a bearer token verified with a key of the route's JWKS.
//!
//! The algorithm is the key's, never the token's: each key verifies in the one algorithm its JWKS
//! entry names (or its type's usual one), and a token whose `alg` differs is refused; `none` and
//! HMAC are never among them, so a token signed with HS256 and the public key as its secret fails.
//! The key is the one the token's `kid` names; a token without `kid` is tried against a key of its
//! `alg` only when there is exactly one. A `kid` the keys lack makes the worker read the JWKS file
//! again, at most once per [`REFRESH_EVERY`] (keys are rotated by adding one to the file first).

use super::credentials;
use duet_config::filter::auth::{jwk_algorithm, Jwt, TokenSource};
use http::{header, HeaderMap, HeaderName, HeaderValue};
use jsonwebtoken::{decode, decode_header, jwk::JwkSet, Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};
use std::{
    cell::{Cell, RefCell},
    path::PathBuf,
    rc::Rc,
    time::{Duration, Instant},
};

/// The least time between two reads of the JWKS file for an unknown `kid`.
const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// One key of the JWKS, with its validation (its algorithm, the route's `iss`, `aud`, leeway).
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
    validation: Validation,
}

pub(crate) struct JwtAuth {
    settings: Jwt,
    keys: RefCell<Rc<Vec<Key>>>,
    refreshed: Cell<Option<Instant>>,
    claims: Vec<(String, HeaderName)>,
}

impl JwtAuth {
    /// The route's keys; `previous` (the same route's filter before a reload) hands on when it
    /// last read the file.
    pub(super) fn new(settings: &Jwt, previous: Option<&JwtAuth>) -> Option<Self> {
        let keys = keys(&settings.jwks, settings)?;
        let claims = (settings.claims_to_headers.iter())
            .filter_map(|(claim, name)| {
                Some((claim.clone(), HeaderName::from_bytes(name.as_bytes()).ok()?))
            })
            .collect();
        Some(Self {
            settings: settings.clone(),
            keys: RefCell::new(Rc::new(keys)),
            refreshed: Cell::new(previous.and_then(|p| p.refreshed.get())),
            claims,
        })
    }

    /// Lets the request through (its `Authorization` removed unless the route forwards it, the
    /// listed claims set as fields), or the challenge of the 401.
    /// Lets a request with a valid token through (its claims copied onto it), and says who it is
    /// (its `sub`) when `want_user`; refuses anyone else with the challenge.
    pub(super) fn admit(
        &self,
        headers: &mut HeaderMap,
        want_user: bool,
    ) -> Result<Option<HeaderValue>, HeaderValue> {
        let invalid = || HeaderValue::from_static("Bearer error=\"invalid_token\"");
        let Some(token) = self.token(headers) else {
            // RFC 6750 §3.1: no error code for a request without credentials; an `Authorization`
            // that is not a readable bearer token (too long, another scheme) is an invalid one.
            return Err(if headers.contains_key(header::AUTHORIZATION) {
                invalid()
            } else {
                HeaderValue::from_static("Bearer")
            });
        };
        let claims = self.verify(&token).ok_or_else(invalid)?;
        if !self.settings.forward_authorization {
            headers.remove(header::AUTHORIZATION);
        }
        for (claim, name) in &self.claims {
            let text = match claims.get(claim) {
                Some(Value::String(s)) => s.clone(),
                Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
                _ => continue,
            };
            if let Ok(value) = HeaderValue::from_str(&text) {
                headers.insert(name.clone(), value);
            }
        }
        let subject = || match claims.get("sub") {
            Some(Value::String(sub)) => HeaderValue::from_str(sub).ok(),
            _ => None,
        };
        Ok(want_user.then(subject).flatten())
    }

    /// The token, from `Authorization: Bearer` or else the route's cookie.
    fn token(&self, headers: &HeaderMap) -> Option<String> {
        if let Some(token) = credentials(headers, "bearer") {
            return Some(token.trim().to_owned());
        }
        let TokenSource::BearerOrCookie(name) = &self.settings.source else {
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

    /// The token's claims, if it is valid.
    fn verify(&self, token: &str) -> Option<Map<String, Value>> {
        if token.len() > super::MAX_CREDENTIAL {
            return None;
        }
        let head = decode_header(token).ok()?;
        let mut keys = self.keys.borrow().clone();
        if let Some(kid) = &head.kid {
            if !keys.iter().any(|k| k.kid.as_ref() == Some(kid)) {
                keys = self.refresh()?;
            }
        }
        let key = match &head.kid {
            Some(kid) => keys.iter().find(|k| k.kid.as_ref() == Some(kid))?,
            None => {
                let mut fitting = keys.iter().filter(|k| k.alg == head.alg);
                let only = fitting.next()?;
                fitting.next().is_none().then_some(only)?
            }
        };
        if key.alg != head.alg {
            return None;
        }
        decode::<Map<String, Value>>(token, &key.key, &key.validation)
            .ok()
            .map(|data| data.claims)
    }

    /// The keys read again from the file, if the last read is [`REFRESH_EVERY`] old.
    fn refresh(&self) -> Option<Rc<Vec<Key>>> {
        let now = Instant::now();
        if (self.refreshed.get()).is_some_and(|at| now.duration_since(at) < REFRESH_EVERY) {
            return None;
        }
        self.refreshed.set(Some(now));
        let text = read(&self.settings.jwks_file)?;
        let fresh = Rc::new(keys(&text, &self.settings)?);
        *self.keys.borrow_mut() = fresh.clone();
        Some(fresh)
    }
}

/// The JWKS file's text (bounded), if it can be read.
fn read(path: &PathBuf) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    (text.len() <= 4 << 20).then_some(text)
}

/// Every key of a JWKS with its validation; `None` if the text is not a JWKS or a key is unusable.
fn keys(text: &str, settings: &Jwt) -> Option<Vec<Key>> {
    let set: JwkSet = serde_json::from_str(text).ok()?;
    (set.keys.iter())
        .map(|jwk| {
            let alg = jwk_algorithm(jwk).ok()?;
            let key = DecodingKey::from_jwk(jwk).ok()?;
            Some(Key {
                kid: jwk.common.key_id.clone(),
                alg,
                key,
                validation: validation(alg, settings),
            })
        })
        .collect()
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
