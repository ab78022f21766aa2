//! `limit_methods:`, a filter of the request phase: a request of a method the route does not list is
//! answered 405 with `Allow` naming the ones it does (RFC 9110 §15.5.6), before anything of it is
//! read or sent. nginx's `limit_except` answers 403 instead; 405 tells a client what would have
//! worked.

use crate::{
    error::{ErrorKind, ProxyError},
    filter::phase::{Arrival, Build, Decision, Phase, Phases},
    telemetry::access_log::AccessLog,
};
use duet_config::Route;
use http::{header::ALLOW, HeaderMap, HeaderValue, Method};

/// A route's methods, parsed once per config, and its `Allow` value.
#[derive(Debug)]
pub(crate) struct LimitMethods {
    methods: Vec<Method>,
    allow: HeaderValue,
}

impl Phases for LimitMethods {
    const PHASES: Phase = Phase::REQUEST;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let limit = route.filters.limit_methods.as_ref()?;
        let methods = (limit.methods.iter())
            .filter_map(|m| Method::from_bytes(m.as_bytes()).ok())
            .collect();
        let allow = HeaderValue::from_str(&limit.to_string()).ok()?;
        Some(Self { methods, allow })
    }

    fn on_request(&self, arrival: &Arrival<'_>, _: &mut Option<Box<AccessLog>>) -> Decision {
        // A handful of methods: a scan beats a set.
        if self.methods.contains(arrival.request.method()) {
            return Decision::Continue;
        }
        let mut fields = HeaderMap::with_capacity(1);
        fields.insert(ALLOW, self.allow.clone());
        Decision::RefuseWith(ProxyError::new(ErrorKind::MethodNotAllowed), fields)
    }
}
