//! The `tracing:` section: where OpenTelemetry spans go, and how many requests start a trace.

use crate::{
    checker::Checker,
    field::Field,
    model::{OtlpEndpoint, Tracing},
    raw::{RawTracing, Scalar},
};
use serde_saphyr::Spanned;

/// The path spans are posted to when the URL names none (OTLP/HTTP's).
const TRACES_PATH: &str = "/v1/traces";

/// `tracing: { otlp: http://127.0.0.1:4318, sample: 1% }`; `None` when the section is absent or
/// its collector's address is not usable (the error is recorded).
pub(super) fn tracing(checker: &mut Checker, raw: Option<&Spanned<RawTracing>>) -> Option<Tracing> {
    let raw = raw?;
    let field = Field::root("tracing");
    let Some(otlp) = raw.value.otlp.as_ref() else {
        let e = checker.error(raw, field.key("otlp"), "the collector's address is missing");
        checker.push(e.hint("write `otlp: http://127.0.0.1:4318` (OTLP over HTTP)"));
        return None;
    };
    let endpoint = endpoint(checker, otlp, &field.key("otlp"));
    let sample = checker.percent(
        raw.value.sample.as_ref(),
        &field.key("sample"),
        Tracing::DEFAULT_SAMPLE,
    );
    let queue = checker.count(
        raw.value.queue.as_ref(),
        &field.key("queue"),
        Tracing::DEFAULT_QUEUE as u32,
        (1, 1_000_000),
    ) as usize;
    let service_name = service_name(checker, raw.value.service_name.as_ref(), &field);
    Some(Tracing {
        otlp: endpoint?,
        sample,
        queue,
        service_name,
    })
}

/// `service_name`: `duet` unless named; any non-empty text.
fn service_name(checker: &mut Checker, raw: Option<&Spanned<Scalar>>, field: &Field) -> String {
    let Some(name) = raw else {
        return "duet".to_owned();
    };
    let text = name.value.0.trim();
    if text.is_empty() {
        checker.reject(
            name,
            field.key("service_name"),
            "an empty service name: expected a name such as `edge`",
        );
        return "duet".to_owned();
    }
    text.to_owned()
}

/// `http://HOST:PORT[/PATH]`: OTLP over HTTP in plain text, the path `/v1/traces` when absent.
fn endpoint(checker: &mut Checker, raw: &Spanned<Scalar>, field: &Field) -> Option<OtlpEndpoint> {
    match parse_endpoint(raw.value.0.trim()) {
        Ok(endpoint) => Some(endpoint),
        Err(message) => {
            let e = checker.error(raw, field, message);
            checker.push(e.hint(
                "write the collector's OTLP/HTTP address, such as `http://127.0.0.1:4318` \
                 (spans are posted to `/v1/traces` unless the URL names a path)",
            ));
            None
        }
    }
}

fn parse_endpoint(text: &str) -> Result<OtlpEndpoint, String> {
    let Some(rest) = text.strip_prefix("http://") else {
        return Err(if text.starts_with("https://") {
            format!("`{text}`: duet exports over plain HTTP only, not HTTPS")
        } else {
            format!("`{text}` is not an http:// URL")
        });
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let path = match path {
        "" | "/" => TRACES_PATH.to_owned(),
        path if path.bytes().all(|b| b.is_ascii_graphic()) => path.to_owned(),
        _ => return Err(format!("`{text}`: its path is not plain visible ASCII")),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (authority, None),
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-._:".contains(&b);
    if host.is_empty() || !host.bytes().all(plain) {
        return Err(format!(
            "`{text}` names no host (or one with spaces or `@`)"
        ));
    }
    let port = match port {
        None => 4318,
        Some(port) => match port.parse::<u16>() {
            Ok(port) if port > 0 => port,
            _ => return Err(format!("`{port}` is not a port: expected 1 to 65535")),
        },
    };
    Ok(OtlpEndpoint {
        host: host.to_owned(),
        port,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_an_http_url_with_the_traces_path_by_default() {
        let parsed = |text: &str| parse_endpoint(text).map(|e| e.to_string());
        assert_eq!(
            parsed("http://127.0.0.1:4318").as_deref(),
            Ok("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            parsed("http://collector/otlp/v1/traces").as_deref(),
            Ok("http://collector:4318/otlp/v1/traces")
        );
        assert_eq!(
            parsed("http://[::1]:9000/").as_deref(),
            Ok("http://[::1]:9000/v1/traces")
        );
        assert!(parsed("https://collector:4318").is_err_and(|e| e.contains("plain HTTP")));
        assert!(parsed("collector:4318").is_err());
        assert!(parsed("http://:4318").is_err());
        assert!(parsed("http://user@host:4318").is_err());
        assert!(parsed("http://host:99999").is_err());
    }
}
