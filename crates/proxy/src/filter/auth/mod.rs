//! `auth:`, a filter of the admission phase: who may take a route (nginx's `auth_basic` and
//! `auth_request`, Traefik's `BasicAuth` and `ForwardAuth`, Envoy's `jwt_authn` and `ext_authz`).
//!
//! - **basic** ([`basic`]): a user and password from an htpasswd file (bcrypt, SHA-crypt), each
//!   verified credential cached per worker for a short time under a keyed hash.
//! - **jwt** ([`jwt`]): a bearer token verified with the JWKS key its `kid` names, in the key's own
//!   algorithm; `exp`/`nbf` with leeway, `iss`, `aud`; claims copied onto the request. The JWKS is
//!   a file or fetched from the issuer through a cluster ([`jwks_fetch`]).
//! - **forward** ([`forward`]): a subrequest to an auth service through its cluster's own balancer;
//!   a 2xx lets the request through, any other answer goes back to the client.
//!
//! The fields the filter sets (the user, the claims, the auth service's fields) are duet's: a
//! client's own values of them are removed before anything is checked, so a forged `x-user` never
//! reaches a backend. A refused request gets 401 with `WWW-Authenticate` before its body is read.

mod basic;
mod forward;
mod jwt;

mod jwks_fetch;

mod subrequest;

use crate::{
    error::{ErrorKind, ProxyError},
    filter::phase::{Admit, Build, Decision, Phase, Phases},
    peer::Client,
    telemetry::access_log::AccessLog,
    telemetry::metrics::{ClusterCells, CounterFamily, RouteCounters},
};
use duet_config::{filter::auth, Route};
use http::{header, HeaderMap, HeaderName, HeaderValue, Request};
use hyper::body::Incoming;
use std::sync::Arc;

/// A route's auth in one worker, with its counts.
pub(crate) struct Auth {
    way: Way,
    /// The request fields the filter sets, removed from the client's request first.
    identity: Vec<HeaderName>,
    /// The route's first cluster (in `config.clusters`), whose series carry the counts.
    cluster: usize,
    cluster_name: Arc<str>,
    counts: Arc<RouteCounters>,
}

enum Way {
    Basic(basic::BasicAuth),
    Jwt(jwt::JwtAuth),
    Forward(forward::ForwardAuth),
}

/// What a route's `auth:` decided, by `outcome`: `allowed`, the request went on; `denied`, it was
/// refused (401, or the auth service's own answer); `error`, the auth service did not answer (503,
/// or let through by `on_error: allow`). Only the routes with `auth:` have these series.
static OUTCOMES: CounterFamily = CounterFamily {
    name: "duet_auth_requests_total",
    help: "Requests a route's auth judged (under the route's first cluster), by outcome: allowed, denied (401 or the auth service's answer), error (the auth service did not answer).",
    label: "outcome",
    values: &["allowed", "denied", "error"],
    every_route: false,
    status: Some("auth decisions"),
};
const ALLOWED: usize = 0;
const DENIED: usize = 1;
const ERROR: usize = 2;

/// The longest `Authorization` (or token cookie) duet reads: a real one is far shorter, and a long
/// one is refused before any decoding or hashing.
const MAX_CREDENTIAL: usize = 8 << 10;

impl Phases for Auth {
    const PHASES: Phase = Phase::ADMIT;
    const COUNTERS: &'static [&'static CounterFamily] = &[&OUTCOMES];

    fn build(route: &Route, build: &Build<'_>, previous: Option<&Self>) -> Option<Self> {
        let settings = route.filters.auth.as_ref()?;
        let cluster = route.action.clusters().next()?;
        let cluster_name = build.clusters.get(cluster)?.name.clone();
        let counts = match previous {
            Some(old) if old.cluster_name == cluster_name => old.counts.clone(),
            _ => Arc::new(RouteCounters::new(&OUTCOMES, &route.name)),
        };
        let identity = (settings.identity_fields().into_iter())
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .collect();
        let way = match settings {
            auth::Auth::Basic(b) => Some(Way::Basic(basic::BasicAuth::new(b))),
            auth::Auth::Jwt(j) => {
                jwt::JwtAuth::new(j, Some(build), previous.and_then(Self::jwt)).map(Way::Jwt)
            }
            auth::Auth::Forward(f) => forward::ForwardAuth::new(f, build).map(Way::Forward),
        };
        // The config's check took these settings, so this does not happen; if it did, the route
        // would refuse everyone rather than take everyone.
        let way = way.unwrap_or_else(|| Way::Basic(basic::BasicAuth::nobody()));
        Some(Self {
            way,
            identity,
            cluster,
            cluster_name,
            counts,
        })
    }

    fn admit<'a>(
        &'a self,
        request: &mut Request<Incoming>,
        _client: &Client,
        log: &'a mut Option<Box<AccessLog>>,
    ) -> Admit<'a> {
        for name in &self.identity {
            request.headers_mut().remove(name);
        }
        let want_user = log.as_ref().is_some_and(|log| log.wants_user());
        let decided = match &self.way {
            Way::Basic(basic) => basic.admit(request.headers_mut()),
            Way::Jwt(jwt) => match jwt.admit(request.headers_mut(), want_user) {
                jwt::Checked::Admitted(user) => Ok(user),
                jwt::Checked::Refused(challenge) => Err(challenge),
                jwt::Checked::AfterFetch(token) => {
                    return Admit::Later(Box::pin(self.after_fetch(jwt, token, log, want_user)))
                }
            },
            Way::Forward(forward) => {
                return Admit::Later(Box::pin(forward.admit(request, log, &self.counts)))
            }
        };
        match decided {
            Ok(user) => {
                self.counts.add(ALLOWED);
                if let Some(log) = log.as_mut().filter(|_| want_user) {
                    log.user = user;
                }
                Admit::Now(Decision::Continue)
            }
            Err(challenge) => {
                self.counts.add(DENIED);
                Admit::Now(unauthorized(challenge))
            }
        }
    }

    fn publish(&self, cells: &mut [ClusterCells]) {
        if let Some(cells) = cells.get_mut(self.cluster) {
            cells.route_counters.push(self.counts.clone());
        }
    }
}

impl Auth {
    /// The decision on a token whose key was being fetched, once the fetch has ended.
    async fn after_fetch(
        &self,
        jwt: &jwt::JwtAuth,
        token: String,
        log: &mut Option<Box<AccessLog>>,
        want_user: bool,
    ) -> Result<HeaderMap, Decision> {
        match jwt.admit_after_fetch(&token, want_user).await {
            Ok((fields, user)) => {
                self.counts.add(ALLOWED);
                if let Some(log) = log.as_mut().filter(|_| want_user) {
                    log.user = user;
                }
                Ok(fields)
            }
            Err(challenge) => {
                self.counts.add(DENIED);
                Err(unauthorized(challenge))
            }
        }
    }

    fn jwt(&self) -> Option<&jwt::JwtAuth> {
        match &self.way {
            Way::Jwt(jwt) => Some(jwt),
            _ => None,
        }
    }
}

/// 401 with this `WWW-Authenticate` value.
fn unauthorized(challenge: HeaderValue) -> Decision {
    let mut fields = HeaderMap::new();
    fields.insert(header::WWW_AUTHENTICATE, challenge);
    Decision::RefuseWith(ProxyError::new(ErrorKind::Unauthorized), fields)
}

/// The credentials of `Authorization: SCHEME credentials` (the scheme matched without regard to
/// case), when no longer than [`MAX_CREDENTIAL`].
fn credentials<'h>(headers: &'h HeaderMap, scheme: &str) -> Option<&'h str> {
    let value = headers.get(header::AUTHORIZATION)?;
    if value.len() > MAX_CREDENTIAL {
        return None;
    }
    let text = value.to_str().ok()?;
    let (given, rest) = text.split_once(' ')?;
    given
        .eq_ignore_ascii_case(scheme)
        .then(|| rest.trim_start_matches(' '))
}

/// A route's basic or JWT check on its own, as the admission phase runs it: for benchmarks
/// (`benches/auth.rs`), which have no request to run it on.
pub struct AuthCheck(Way);

impl AuthCheck {
    /// The check of `settings`; `None` for forward auth (a subrequest, not a check), a fetched
    /// JWKS (no cluster to fetch it through) or unusable keys.
    pub fn new(settings: &auth::Auth) -> Option<Self> {
        match settings {
            auth::Auth::Basic(b) => Some(Self(Way::Basic(basic::BasicAuth::new(b)))),
            auth::Auth::Jwt(j) => Some(Self(Way::Jwt(jwt::JwtAuth::new(j, None, None)?))),
            auth::Auth::Forward(_) => None,
        }
    }

    /// Whether a request with `headers` is let through (its fields edited as the filter does).
    pub fn admits(&self, headers: &mut HeaderMap) -> bool {
        match &self.0 {
            Way::Basic(basic) => basic.admit(headers).is_ok(),
            Way::Jwt(jwt) => matches!(jwt.admit(headers, false), jwt::Checked::Admitted(_)),
            Way::Forward(_) => false,
        }
    }
}
