//! A JWKS fetched from the issuer (`jwks: { cluster, path, refresh }`): `GET path` through the
//! named cluster's own pool and balancer, as forward auth asks its service, so the key server gets
//! health checks, outlier ejection and metrics like any backend.

use super::subrequest;
use crate::{backend::cluster::Cluster, backend::request_body::BodySource, exchange::Prepared};
use http::{header, HeaderValue, Method, Request, Uri};
use std::{rc::Rc, time::Duration};
use tokio::time::timeout;

/// The most of a JWKS read: a real one is a few KiB.
const MAX_JWKS: usize = 1 << 20;

/// How long a fetch may take, answer and body.
pub(super) const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a route's keys are fetched.
pub(super) struct JwksFetch {
    cluster: Rc<Cluster>,
    uri: Uri,
    /// How long fetched keys are used before they are fetched again.
    pub(super) refresh: Duration,
}

impl JwksFetch {
    pub(super) fn new(cluster: Rc<Cluster>, path: &str, refresh: Duration) -> Option<Self> {
        Some(Self {
            cluster,
            uri: path.parse().ok()?,
            refresh,
        })
    }

    /// The JWKS text, or why there is none (a refused answer, no answer within
    /// [`FETCH_TIMEOUT`], a body that is not UTF-8 or too long).
    pub(super) async fn text(&self) -> Result<String, String> {
        let fetched = timeout(FETCH_TIMEOUT, self.get()).await;
        fetched.unwrap_or_else(|_| Err(format!("no answer within {FETCH_TIMEOUT:?}")))
    }

    async fn get(&self) -> Result<String, String> {
        let request = Request::builder()
            .method(Method::GET)
            .uri(self.uri.clone())
            .header(header::ACCEPT, HeaderValue::from_static("application/json"))
            .body(())
            .map_err(|e| e.to_string())?;
        let mut prepared = Prepared::new(request.into_parts().0, BodySource::Empty, None);
        let answer = subrequest::ask(&self.cluster, &mut prepared, MAX_JWKS).await?;
        if answer.cut {
            return Err(format!("a body longer than {MAX_JWKS} bytes"));
        }
        if !answer.head.status.is_success() {
            return Err(format!("answered {}", answer.head.status));
        }
        String::from_utf8(answer.body.to_vec()).map_err(|_| "a body that is not UTF-8".to_owned())
    }
}
