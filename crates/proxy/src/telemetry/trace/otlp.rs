//! Finished spans, and their OTLP encoding: an `ExportTraceServiceRequest` in protobuf's binary
//! form, the body OTLP/HTTP posts to `/v1/traces`.
//!
//! Written by hand from the OTLP protos (`opentelemetry/proto/trace/v1/trace.proto` and
//! `common/v1/common.proto`): duet sends a handful of message types and decodes none, which a
//! hundred lines do without a code generator; the tests decode it with the protos themselves
//! (Python's `opentelemetry-proto`, `tests/traces.rs`).

use super::context::{SpanId, TraceId};

/// A finished span, as the exporter sends it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Span {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    pub(crate) parent: Option<SpanId>,
    /// The `tracestate` the request came with.
    pub(crate) trace_state: Option<String>,
    pub(crate) name: String,
    pub(crate) kind: Kind,
    /// Nanoseconds since the Unix epoch.
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) attributes: Vec<(&'static str, Value)>,
    /// The span's status is `ERROR` (else unset, as the conventions want for success).
    pub(crate) error: bool,
}

/// Which side of a call a span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The request duet received.
    Server = 2,
    /// An attempt duet sent a backend.
    Client = 3,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Text(String),
    Int(i64),
    Bool(bool),
}

/// Protobuf's wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const BYTES: u8 = 2;
const FIXED32: u8 = 5;

/// The `ExportTraceServiceRequest` of `spans`, under one resource named `service`.
pub(crate) fn encode(spans: &[Span], service: &str) -> Vec<u8> {
    let mut request = Vec::with_capacity(256 + spans.len() * 512);
    message(&mut request, 1, |resource_spans| {
        encode_resource_spans(resource_spans, spans, service);
    });
    request
}

/// A `ResourceSpans`' fields: the resource, and one scope's spans.
fn encode_resource_spans(resource_spans: &mut Vec<u8>, spans: &[Span], service: &str) {
    message(resource_spans, 1, |resource| {
        key_value(
            resource,
            1,
            "service.name",
            &Value::Text(service.to_owned()),
        );
        let version = Value::Text(env!("CARGO_PKG_VERSION").to_owned());
        key_value(resource, 1, "service.version", &version);
    });
    message(resource_spans, 2, |scope_spans| {
        message(scope_spans, 1, |scope| {
            text(scope, 1, "duet");
            text(scope, 2, env!("CARGO_PKG_VERSION"));
        });
        for span in spans {
            message(scope_spans, 2, |out| encode_span(out, span));
        }
    });
}

fn encode_span(out: &mut Vec<u8>, span: &Span) {
    bytes(out, 1, &span.trace_id);
    bytes(out, 2, &span.span_id);
    if let Some(state) = &span.trace_state {
        text(out, 3, state);
    }
    if let Some(parent) = &span.parent {
        bytes(out, 4, parent);
    }
    text(out, 5, &span.name);
    tag(out, 6, VARINT);
    varint(out, span.kind as u64);
    tag(out, 7, FIXED64);
    out.extend_from_slice(&span.start.to_le_bytes());
    tag(out, 8, FIXED64);
    out.extend_from_slice(&span.end.to_le_bytes());
    for (key, value) in &span.attributes {
        key_value(out, 9, key, value);
    }
    if span.error {
        // Status { code = STATUS_CODE_ERROR (2) }.
        message(out, 15, |status| {
            tag(status, 3, VARINT);
            varint(status, 2);
        });
    }
    // Flags: the W3C trace flags (sampled); bits 8 and 9 say whether the parent is remote.
    let remote = if span.kind == Kind::Server && span.parent.is_some() {
        0x300
    } else {
        0x100
    };
    tag(out, 16, FIXED32);
    out.extend_from_slice(&(1u32 | remote).to_le_bytes());
}

/// A `KeyValue` as field `field`.
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    message(out, field, |kv| {
        text(kv, 1, key);
        message(kv, 2, |any| match value {
            Value::Text(value) => text(any, 1, value),
            Value::Bool(value) => {
                tag(any, 2, VARINT);
                varint(any, u64::from(*value));
            }
            Value::Int(value) => {
                tag(any, 3, VARINT);
                varint(any, *value as u64);
            }
        });
    });
}

/// A nested message as field `field`, written in place after one byte kept for its length: a
/// message under 128 bytes (an attribute) needs no more; a longer one (a span, the batch) moves
/// over for the bytes its length takes. No buffer of its own: writing each nested message aside
/// cost more than the rest of a traced request.
fn message(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    tag(out, field, BYTES);
    let at = out.len();
    out.push(0);
    write(out);
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
        return;
    }
    let mut prefix = Vec::with_capacity(10);
    varint(&mut prefix, len as u64);
    out.splice(at..=at, prefix);
}

fn text(out: &mut Vec<u8>, field: u32, value: &str) {
    bytes(out, field, value.as_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    tag(out, field, BYTES);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, u64::from(field) << 3 | u64::from(wire));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_tags_are_protobuf_s() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        out.clear();
        tag(&mut out, 16, FIXED32);
        assert_eq!(out, [0x85, 0x01]);
        out.clear();
        varint(&mut out, -1i64 as u64);
        assert_eq!(out.len(), 10, "a negative int64 takes ten bytes");
    }

    #[test]
    fn a_nested_message_of_any_length_is_prefixed_by_its_length() {
        for len in [0, 1, 127, 128, 300, 20_000] {
            let mut out = vec![7];
            message(&mut out, 2, |inner| {
                inner.extend(std::iter::repeat_n(9, len))
            });
            let mut expected = vec![7, 0x12];
            varint(&mut expected, len as u64);
            expected.extend(std::iter::repeat_n(9, len));
            assert_eq!(out, expected, "{len} bytes");
        }
    }

    #[test]
    fn a_span_is_written_field_by_field() {
        let span = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent: None,
            trace_state: None,
            name: "GET".to_owned(),
            kind: Kind::Client,
            start: 1,
            end: 2,
            attributes: vec![("duet.attempt", Value::Int(1))],
            error: false,
        };
        let mut out = Vec::new();
        encode_span(&mut out, &span);
        let mut expected = vec![0x0a, 16];
        expected.extend([1; 16]);
        expected.extend([0x12, 8]);
        expected.extend([2; 8]);
        expected.extend([0x2a, 3, b'G', b'E', b'T', 0x30, 3]);
        expected.extend([0x39, 1, 0, 0, 0, 0, 0, 0, 0, 0x41, 2, 0, 0, 0, 0, 0, 0, 0]);
        // KeyValue { key: "duet.attempt", value: AnyValue { int_value: 1 } }.
        expected.extend([0x4a, 18, 0x0a, 12]);
        expected.extend(b"duet.attempt");
        expected.extend([0x12, 2, 0x18, 1]);
        expected.extend([0x85, 0x01, 0x01, 0x01, 0, 0]);
        assert_eq!(out, expected);
    }
}
