//! The process-wide sections: `workers`, `limits` and `shutdown`.

use crate::{
    checker::Checker,
    field::Field,
    model::{Http2Limits, Http2Windows, Limits, Shutdown, Workers},
    raw::{RawHttp2Limits, RawLimits, RawShutdown, Scalar},
};
use serde_saphyr::Spanned;
use std::num::NonZeroUsize;

/// `auto` (the default) or a count of 1 or more.
pub(super) fn workers(checker: &mut Checker, raw: Option<&Spanned<Scalar>>) -> Workers {
    let Some(w) = raw.filter(|w| w.value.0 != "auto") else {
        return Workers::Auto;
    };
    match w.value.0.parse::<usize>().ok().and_then(NonZeroUsize::new) {
        Some(n) => Workers::Count(n),
        None => {
            let message = format!(
                "`{}` is not a worker count: expected `auto` or a number of 1 or more",
                w.value.0
            );
            checker.reject(w, "workers", message);
            Workers::Auto
        }
    }
}

pub(super) fn limits(checker: &mut Checker, raw: Option<&RawLimits>) -> Limits {
    let field = Field::root("limits");
    let d = Limits::default();
    Limits {
        max_request_head: checker.size(
            raw.and_then(|l| l.max_request_head.as_ref()),
            &field.key("max_request_head"),
            d.max_request_head,
            8192,
        ),
        max_uri_length: checker.size(
            raw.and_then(|l| l.max_uri_length.as_ref()),
            &field.key("max_uri_length"),
            d.max_uri_length,
            64,
        ),
        header_read_timeout: checker.timeout(
            raw.and_then(|l| l.header_read_timeout.as_ref()),
            &field.key("header_read_timeout"),
            d.header_read_timeout,
            "give clients no time to send a request head",
            None,
        ),
        body_read_timeout: checker.timeout(
            raw.and_then(|l| l.body_read_timeout.as_ref()),
            &field.key("body_read_timeout"),
            d.body_read_timeout,
            "give clients no time to send a request body",
            None,
        ),
        min_upload_rate: checker.rate(
            raw.and_then(|l| l.min_upload_rate.as_ref()),
            &field.key("min_upload_rate"),
            d.min_upload_rate,
        ),
        upload_rate_grace: checker.duration(
            raw.and_then(|l| l.upload_rate_grace.as_ref()),
            &field.key("upload_rate_grace"),
            d.upload_rate_grace,
        ),
        send_timeout: checker.timeout(
            raw.and_then(|l| l.send_timeout.as_ref()),
            &field.key("send_timeout"),
            d.send_timeout,
            "cut every response a client does not read at once",
            None,
        ),
        max_connections: checker.count(
            raw.and_then(|l| l.max_connections.as_ref()),
            &field.key("max_connections"),
            d.max_connections as u32,
            (1, 10_000_000),
        ) as usize,
        keepalive_timeout: checker.timeout(
            raw.and_then(|l| l.keepalive_timeout.as_ref()),
            &field.key("keepalive_timeout"),
            d.keepalive_timeout,
            "close every kept-alive connection at once",
            Some("to close each connection after one request, set `keepalive_requests: 1`"),
        ),
        keepalive_requests: u64::from(checker.count(
            raw.and_then(|l| l.keepalive_requests.as_ref()),
            &field.key("keepalive_requests"),
            d.keepalive_requests as u32,
            (1, u32::MAX),
        )),
        max_mirrors_in_flight: checker.count(
            raw.and_then(|l| l.max_mirrors_in_flight.as_ref()),
            &field.key("max_mirrors_in_flight"),
            d.max_mirrors_in_flight as u32,
            (0, 1_000_000),
        ) as usize,
        max_request_body: max_request_body(checker, raw, &field),
        max_buffered_bytes: buffered_bytes(checker, raw, &field),
        http2: http2(checker, raw.and_then(|l| l.http2.as_ref()), &field),
    }
}

/// `limits.max_request_body`: 0 (the default) is no limit.
fn max_request_body(checker: &mut Checker, raw: Option<&RawLimits>, limits: &Field) -> u64 {
    let value = raw.and_then(|l| l.max_request_body.as_ref());
    checker.size(value, &limits.key("max_request_body"), 0, 0) as u64
}

/// `limits.max_buffered_bytes`: at least 64 KiB, a small body kept for retries.
fn buffered_bytes(checker: &mut Checker, raw: Option<&RawLimits>, limits: &Field) -> usize {
    checker.size(
        raw.and_then(|l| l.max_buffered_bytes.as_ref()),
        &limits.key("max_buffered_bytes"),
        Limits::default().max_buffered_bytes,
        64 * 1024,
    )
}

fn http2(checker: &mut Checker, raw: Option<&RawHttp2Limits>, limits: &Field) -> Http2Limits {
    let field = limits.key("http2");
    let d = Http2Limits::default();
    let list_size = raw.and_then(|h| h.max_header_list_size.as_ref());
    Http2Limits {
        max_concurrent_streams: checker.count(
            raw.and_then(|h| h.max_concurrent_streams.as_ref()),
            &field.key("max_concurrent_streams"),
            d.max_concurrent_streams,
            (1, 10_000),
        ),
        max_header_list_size: list_size
            .map(|value| checker.size(Some(value), &field.key("max_header_list_size"), 0, 1024)),
        keepalive_interval: checker.duration(
            raw.and_then(|h| h.keepalive_interval.as_ref()),
            &field.key("keepalive_interval"),
            d.keepalive_interval,
        ),
        keepalive_timeout: checker.timeout(
            raw.and_then(|h| h.keepalive_timeout.as_ref()),
            &field.key("keepalive_timeout"),
            d.keepalive_timeout,
            "close every connection at its first PING",
            None,
        ),
        windows: windows(
            checker,
            raw.map(|h| {
                [
                    h.initial_stream_window_size.as_ref(),
                    h.initial_connection_window_size.as_ref(),
                    h.adaptive_window.as_ref(),
                ]
            }),
            &field,
            Http2Windows::CLIENT,
        ),
    }
}

/// `initial_stream_window_size`, `initial_connection_window_size` and `adaptive_window`, as written
/// (in that order) in `field`, each `default`'s when left out.
pub(super) fn windows(
    checker: &mut Checker,
    raw: Option<[Option<&Spanned<Scalar>>; 3]>,
    field: &Field,
    default: Http2Windows,
) -> Http2Windows {
    let [stream, connection, adaptive] = raw.unwrap_or_default();
    Http2Windows {
        // Below a frame's worth, a stream's body crawls one small DATA frame per round trip.
        initial_stream_window_size: checker.size_within(
            stream,
            &field.key("initial_stream_window_size"),
            default.initial_stream_window_size,
            (16_384, Http2Windows::MAX),
            "RFC 9113 §6.9.2 caps a window at 2^31-1; below 16 KiB no full frame fits",
        ),
        // RFC 9113 §6.9.2: a connection's window starts at 65,535 and SETTINGS cannot lower it.
        initial_connection_window_size: checker.size_within(
            connection,
            &field.key("initial_connection_window_size"),
            default.initial_connection_window_size,
            (65_535, Http2Windows::MAX),
            "RFC 9113 §6.9 starts a connection's window at 65535 and caps it at 2^31-1",
        ),
        adaptive_window: checker.boolean(
            adaptive,
            &field.key("adaptive_window"),
            default.adaptive_window,
        ),
    }
}

pub(super) fn shutdown(checker: &mut Checker, raw: Option<&RawShutdown>) -> Shutdown {
    let field = Field::root("shutdown");
    let d = Shutdown::default();
    Shutdown {
        drain_timeout: checker.timeout(
            raw.and_then(|s| s.drain_timeout.as_ref()),
            &field.key("drain_timeout"),
            d.drain_timeout,
            "cut every request in flight at SIGTERM",
            None,
        ),
        drain_delay: checker.duration(
            raw.and_then(|s| s.drain_delay.as_ref()),
            &field.key("drain_delay"),
            d.drain_delay,
        ),
    }
}
