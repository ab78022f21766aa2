//! `auth: { jwt: { jwks, issuer, audiences, leeway, cookie, claims_to_headers,
//! forward_authorization } }`: a bearer token signed by one of the public keys of a JWKS file.

use super::read_file;
use crate::{checker::Checker, field::Field, raw::Pairs, raw::Scalar};
use jsonwebtoken::{
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm},
    Algorithm, DecodingKey,
};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::{path::PathBuf, time::Duration};

/// `jwt:`: the route takes requests carrying a token signed by a key of the JWKS, within its
/// `exp`/`nbf`, from the issuer and for one of the audiences; the others get 401 and
/// `WWW-Authenticate: Bearer error="invalid_token"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwt {
    /// The JWKS file, as resolved from the config's folder.
    pub jwks_file: PathBuf,
    /// Its text as read when the config was checked (every key in it usable).
    pub jwks: String,
    /// How many keys it holds.
    pub key_count: usize,
    /// The `iss` a token must carry; any when `None`.
    pub issuer: Option<String>,
    /// The `aud` values of which a token must carry one; any when empty.
    pub audiences: Vec<String>,
    /// How far past `exp` (and before `nbf`) a token is still taken, for clocks that differ.
    pub leeway: Duration,
    /// Where the token is read from.
    pub source: TokenSource,
    /// Claims sent to the backend as request fields: (claim, field name).
    pub claims_to_headers: Vec<(String, String)>,
    /// The backend gets the client's `Authorization` field too (by default it is removed).
    pub forward_authorization: bool,
}

/// Where a route's token is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `Authorization: Bearer TOKEN` only.
    Bearer,
    /// `Authorization: Bearer TOKEN`, or else the cookie of this name.
    BearerOrCookie(String),
}

#[derive(Debug, Deserialize)]
pub(super) struct RawJwt {
    #[serde(default)]
    jwks: Option<Spanned<Scalar>>,
    #[serde(default)]
    issuer: Option<Spanned<Scalar>>,
    #[serde(default)]
    audiences: Option<Spanned<Vec<Spanned<Scalar>>>>,
    #[serde(default)]
    leeway: Option<Spanned<Scalar>>,
    #[serde(default)]
    cookie: Option<Spanned<Scalar>>,
    #[serde(default)]
    claims_to_headers: Option<Pairs<Spanned<Scalar>>>,
    #[serde(default)]
    forward_authorization: Option<Spanned<Scalar>>,
}

/// `leeway` when left out: a minute, as most JWT libraries.
const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);

/// The route's JWT auth, or `None` after recording why it is refused.
pub(super) fn check(checker: &mut Checker, raw: &Spanned<RawJwt>, field: &Field) -> Option<Jwt> {
    let written = &raw.value;
    let Some(jwks) = &written.jwks else {
        let e = checker.error(raw, field, "no `jwks`");
        checker.push(e.hint("name a JWKS file of the issuer's public keys: `jwks: keys.json`"));
        return None;
    };
    let errors = checker.errors.len();
    let text = |s: &Option<Spanned<Scalar>>| s.as_ref().map(|s| s.value.0.trim().to_owned());
    let audiences = (written.audiences.as_ref()).map_or(Vec::new(), |list| {
        list.value
            .iter()
            .map(|a| a.value.0.trim().to_owned())
            .collect()
    });
    let leeway = checker.duration(
        written.leeway.as_ref(),
        &field.key("leeway"),
        DEFAULT_LEEWAY,
    );
    let forward = field.key("forward_authorization");
    let forward_authorization =
        checker.boolean(written.forward_authorization.as_ref(), &forward, false);
    let claims_to_headers = claims(checker, written.claims_to_headers.as_ref(), field);
    let source = match text(&written.cookie) {
        Some(name) => TokenSource::BearerOrCookie(name),
        None => TokenSource::Bearer,
    };
    let (jwks_file, jwks_text) = read_file(checker, jwks, &field.key("jwks"), "JWKS file")?;
    let key_count = match keys(&jwks_text) {
        Ok(count) => count,
        Err(message) => {
            let message = format!("{}: {message}", jwks_file.display());
            let e = checker.error(jwks, field.key("jwks"), message);
            checker.push(e.hint(
                "a JWKS is `{\"keys\": [...]}` of public RSA, EC (P-256, P-384) or Ed25519 keys",
            ));
            return None;
        }
    };
    (checker.errors.len() == errors).then_some(Jwt {
        jwks_file,
        jwks: jwks_text,
        key_count,
        issuer: text(&written.issuer),
        audiences,
        leeway,
        source,
        claims_to_headers,
        forward_authorization,
    })
}

/// `claims_to_headers: { sub: x-user }`: each target a field name.
fn claims(
    checker: &mut Checker,
    raw: Option<&Pairs<Spanned<Scalar>>>,
    field: &Field,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (claim, header) in raw.map_or(&[][..], |p| &p.0[..]) {
        let name = header.value.0.trim().to_ascii_lowercase();
        if crate::checker::token(&name) {
            out.push((claim.value.clone(), name));
        } else {
            let message = format!("`{name}` is not a header field name");
            checker.reject(
                header,
                field.key("claims_to_headers").key(&claim.value),
                message,
            );
        }
    }
    out
}

/// How many keys the JWKS holds, each usable; or what is wrong with it.
pub(super) fn keys(text: &str) -> Result<usize, String> {
    let set: JwkSet = serde_json::from_str(text)
        .map_err(|e| format!("not a JWKS at line {} column {}: {e}", e.line(), e.column()))?;
    if set.keys.is_empty() {
        return Err("no keys".to_owned());
    }
    for (i, jwk) in set.keys.iter().enumerate() {
        let kid = jwk.common.key_id.as_deref().unwrap_or("(no kid)");
        algorithm(jwk).map_err(|why| format!("key {i} ({kid}): {why}"))?;
        DecodingKey::from_jwk(jwk).map_err(|e| format!("key {i} ({kid}): {e}"))?;
    }
    Ok(set.keys.len())
}

/// The one algorithm a key verifies: its `alg` if it names one, else its type's usual one. The
/// token's own `alg` must be this one; symmetric keys are refused, so no token can choose HMAC
/// with a public key as its secret.
pub fn algorithm(jwk: &Jwk) -> Result<Algorithm, &'static str> {
    let usual = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => Algorithm::ES256,
            EllipticCurve::P384 => Algorithm::ES384,
            _ => return Err("an EC key on a curve other than P-256 or P-384"),
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        AlgorithmParameters::OctetKeyPair(_) => return Err("an OKP key that is not Ed25519"),
        AlgorithmParameters::OctetKey(_) => {
            return Err("a symmetric (oct) key: duet takes public keys only")
        }
    };
    let Some(named) = jwk.common.key_algorithm else {
        return Ok(usual);
    };
    let alg = match named {
        KeyAlgorithm::RS256 => Algorithm::RS256,
        KeyAlgorithm::RS384 => Algorithm::RS384,
        KeyAlgorithm::RS512 => Algorithm::RS512,
        KeyAlgorithm::PS256 => Algorithm::PS256,
        KeyAlgorithm::PS384 => Algorithm::PS384,
        KeyAlgorithm::PS512 => Algorithm::PS512,
        KeyAlgorithm::ES256 => Algorithm::ES256,
        KeyAlgorithm::ES384 => Algorithm::ES384,
        KeyAlgorithm::EdDSA => Algorithm::EdDSA,
        _ => return Err("its `alg` is not a public-key signature algorithm"),
    };
    let same_family = matches!(
        (&jwk.algorithm, alg),
        (
            AlgorithmParameters::RSA(_),
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
        ) | (
            AlgorithmParameters::EllipticCurve(_),
            Algorithm::ES256 | Algorithm::ES384
        ) | (AlgorithmParameters::OctetKeyPair(_), Algorithm::EdDSA)
    );
    if same_family
        && (alg != Algorithm::ES256 || usual == Algorithm::ES256)
        && (alg != Algorithm::ES384 || usual == Algorithm::ES384)
    {
        Ok(alg)
    } else {
        Err("its `alg` does not fit its key type")
    }
}
