//! `hsts:`, the worked example of a filter (see [the guide](super)): it sets `Strict-Transport-Security`
//! on a backend's responses to requests that came over TLS, as nginx's `add_header
//! Strict-Transport-Security` and Traefik's `stsSeconds` do. Never on plain HTTP, where RFC 6797 §7.2
//! says the field must not be sent (a browser ignores it there, and an attacker in the path could
//! strip or forge it). It replaces a value the backend sent: the route's is the edge's policy.

use crate::filter::phase::{Build, Phase, Phases, ResponseHead};
use duet_config::Route;
use http::{header::STRICT_TRANSPORT_SECURITY, HeaderValue};

/// A route's HSTS field, written once per config.
#[derive(Debug)]
pub(crate) struct Hsts(HeaderValue);

impl Phases for Hsts {
    const PHASES: Phase = Phase::RESPONSE_HEAD;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        let hsts = route.filters.hsts?;
        HeaderValue::from_str(&hsts.to_string()).ok().map(Self)
    }

    fn on_response_head(&self, head: &mut ResponseHead<'_>) {
        if head.client.tls {
            head.headers
                .insert(STRICT_TRANSPORT_SECURITY, self.0.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::Client;
    use http::HeaderMap;

    fn head_for(hsts: &Hsts, tls: bool, sent: Option<&'static str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(sent) = sent {
            headers.insert(STRICT_TRANSPORT_SECURITY, HeaderValue::from_static(sent));
        }
        let client = Client {
            address: "127.0.0.1:1".parse().expect("address"),
            tls,
            trusted: false,
            listener: 0,
        };
        let mut head = ResponseHead {
            headers: &mut headers,
            client: &client,
        };
        hsts.on_response_head(&mut head);
        headers
    }

    #[test]
    fn only_a_response_over_tls_carries_the_route_s_field_in_place_of_the_backend_s() {
        let hsts = Hsts(HeaderValue::from_static("max-age=600; includeSubDomains"));
        let over_tls = head_for(&hsts, true, Some("max-age=0"));
        let values: Vec<_> = over_tls.get_all(STRICT_TRANSPORT_SECURITY).iter().collect();
        assert_eq!(values, ["max-age=600; includeSubDomains"]);
        assert!(
            head_for(&hsts, false, None).is_empty(),
            "never over plain HTTP"
        );
    }
}
