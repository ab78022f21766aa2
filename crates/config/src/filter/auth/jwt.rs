//! `auth: { jwt: { jwks, issuer, audiences, leeway, cookie, claims_to_headers,
//! forward_authorization } }`: a bearer token signed by one of the public keys of a JWKS, a file
//! or `{ cluster, path, refresh }` fetched from the issuer through a cluster of the config.

use super::{forward::named_cluster, read_file};
use crate::{
    checker::Checker,
    field::Field,
    raw::{Pairs, Scalar},
};
use jsonwebtoken::{
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm},
    Algorithm, DecodingKey,
};
use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::{fmt, path::PathBuf, time::Duration};

/// `jwt:`: the route takes requests carrying a token signed by a key of the JWKS, within its
/// `exp`/`nbf`, from the issuer and for one of the audiences; the others get 401 and
/// `WWW-Authenticate: Bearer error="invalid_token"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwt {
    /// Where the keys come from.
    pub jwks: Jwks,
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

/// Where a route's keys come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Jwks {
    /// `jwks: keys.json`: a file, read again whenever its content changes.
    File {
        /// The file, as resolved from the config's folder.
        path: PathBuf,
        /// Its text as read (every key in it usable).
        text: String,
        /// How many keys it holds.
        key_count: usize,
    },
    /// `jwks: { cluster, path, refresh }`: fetched from the issuer.
    Fetched(JwksSource),
}

/// A JWKS fetched with `GET path` through a cluster of the config (its balancer, health, metrics),
/// every `refresh` and for a `kid` the keys lack (at most once per 10 s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksSource {
    /// The issuer's cluster, as an index into `config.clusters`.
    pub cluster: usize,
    /// Its name.
    pub cluster_name: String,
    /// The path (and query) fetched.
    pub path: String,
    /// How long fetched keys are used before they are fetched again.
    pub refresh: Duration,
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
    jwks: Option<Spanned<RawJwks>>,
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

/// `jwks:` as written: a file, or where to fetch it.
#[derive(Debug)]
enum RawJwks {
    File(Scalar),
    Fetched(Box<RawJwksSource>),
}

/// `jwks: { cluster, path, refresh }`.
#[derive(Debug, Deserialize)]
pub(super) struct RawJwksSource {
    #[serde(default)]
    cluster: Option<Spanned<Scalar>>,
    #[serde(default)]
    path: Option<Spanned<Scalar>>,
    #[serde(default)]
    refresh: Option<Spanned<Scalar>>,
}

impl<'de> Deserialize<'de> for RawJwks {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = RawJwks;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JWKS file, or { cluster, path, refresh }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawJwks, E> {
                Ok(RawJwks::File(Scalar(v.to_owned())))
            }
            // A file name YAML reads as another scalar (`1`, `yes`) is still a name, as `Scalar` takes it.
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawJwks, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawJwks, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawJwks, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawJwks, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<RawJwks, A::Error> {
                let source = RawJwksSource::deserialize(de::value::MapAccessDeserializer::new(map));
                source.map(|s| RawJwks::Fetched(Box::new(s)))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `leeway` when left out: a minute, as most JWT libraries.
const DEFAULT_LEEWAY: Duration = Duration::from_secs(60);

/// The route's JWT auth, or `None` after recording why it is refused.
pub(super) fn check(
    checker: &mut Checker,
    raw: &Spanned<RawJwt>,
    field: &Field,
    clusters: &[String],
) -> Option<Jwt> {
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
    let jwks = match &jwks.value {
        RawJwks::File(name) => {
            let name = Spanned::new(name.clone(), jwks.referenced, jwks.defined);
            jwks_file(checker, &name, &field.key("jwks"))?
        }
        RawJwks::Fetched(source) => Jwks::Fetched(jwks_source(
            checker,
            jwks,
            source,
            &field.key("jwks"),
            clusters,
        )?),
    };
    (checker.errors.len() == errors).then_some(Jwt {
        jwks,
        issuer: text(&written.issuer),
        audiences,
        leeway,
        source,
        claims_to_headers,
        forward_authorization,
    })
}

/// `jwks: keys.json`: the file's keys, or `None` after recording why they cannot be used.
fn jwks_file(checker: &mut Checker, name: &Spanned<Scalar>, field: &Field) -> Option<Jwks> {
    let (path, text) = read_file(checker, name, field, "JWKS file")?;
    match keys(&text) {
        Ok(key_count) => Some(Jwks::File {
            path,
            text,
            key_count,
        }),
        Err(message) => {
            let message = format!("{}: {message}", path.display());
            let e = checker.error(name, field, message);
            checker.push(e.hint(
                "a JWKS is `{\"keys\": [...]}` of public RSA, EC (P-256, P-384) or Ed25519 keys",
            ));
            None
        }
    }
}

/// `path` when left out: where OpenID Connect providers commonly serve their keys.
const DEFAULT_JWKS_PATH: &str = "/.well-known/jwks.json";
/// `refresh` when left out.
const DEFAULT_REFRESH: Duration = Duration::from_secs(300);

/// `jwks: { cluster, path, refresh }`, or `None` after recording what is wrong.
fn jwks_source(
    checker: &mut Checker,
    raw: &Spanned<RawJwks>,
    written: &RawJwksSource,
    field: &Field,
    clusters: &[String],
) -> Option<JwksSource> {
    let errors = checker.errors.len();
    let hint = "name the cluster of the issuer's key server: `cluster: idp`";
    let cluster = named_cluster(
        checker,
        raw,
        written.cluster.as_ref(),
        field,
        clusters,
        hint,
    );
    let path = (written.path.as_ref()).map_or(DEFAULT_JWKS_PATH.to_owned(), |p| {
        p.value.0.trim().to_owned()
    });
    if let Some(p) = (written.path.as_ref())
        .filter(|_| !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()))
    {
        let message = format!("`{path}` is not a path: expected one starting with `/`");
        checker.reject(p, field.key("path"), message);
    }
    let refresh = checker.timeout(
        written.refresh.as_ref(),
        &field.key("refresh"),
        DEFAULT_REFRESH,
        "fetch the keys without pause",
        None,
    );
    let (cluster, cluster_name) = cluster?;
    (checker.errors.len() == errors).then_some(JwksSource {
        cluster,
        cluster_name,
        path,
        refresh,
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
