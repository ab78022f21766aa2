//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the `traceparent` a request comes
//! with, and the one each attempt sends its backend; trace and span ids drawn from a per-worker
//! generator.

use http::HeaderValue;
use rand::{rngs::SmallRng, Rng, SeedableRng};
use std::{
    cell::RefCell,
    hash::{BuildHasher, Hasher},
};

/// A trace's id: 16 bytes, never all zero.
pub(crate) type TraceId = [u8; 16];
/// A span's id: 8 bytes, never all zero.
pub(crate) type SpanId = [u8; 8];

/// What a request's `traceparent` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parent {
    pub(crate) trace_id: TraceId,
    /// The caller's span: the parent of duet's server span.
    pub(crate) span_id: SpanId,
    /// Its `sampled` flag: the caller records this trace.
    pub(crate) sampled: bool,
}

/// `version-traceid-parentid-flags`, as W3C Trace Context level 1 reads it: lowercase hex, the
/// version not `ff`, neither id all zero; a version above `00` may carry more after a `-`. `None`
/// for anything else (the request then starts a trace of its own, if sampled).
pub(crate) fn parse(value: &[u8]) -> Option<Parent> {
    if value.len() < 55 || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let version = hex::<1>(&value[..2])?;
    if version[0] == 0xff || (version[0] == 0 && value.len() != 55) {
        return None;
    }
    if value.len() > 55 && value[55] != b'-' {
        return None;
    }
    let trace_id = hex::<16>(&value[3..35])?;
    let span_id = hex::<8>(&value[36..52])?;
    let flags = hex::<1>(&value[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags[0] & 1 == 1,
    })
}

/// `N` bytes from `2 * N` lowercase hex digits.
fn hex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0; N];
    for (byte, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        *byte = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

/// `bytes` as lowercase hex, appended to `out`.
pub(crate) fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)]);
        out.push(DIGITS[usize::from(byte & 0xf)]);
    }
}

/// `bytes` as lowercase hex.
#[cfg(test)]
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    String::from_utf8(out).unwrap_or_default()
}

/// The `traceparent` of a sampled span: `00-TRACE-SPAN-01`.
pub(crate) fn traceparent(trace_id: &TraceId, span_id: &SpanId) -> HeaderValue {
    let mut text = Vec::with_capacity(55);
    text.extend_from_slice(b"00-");
    push_hex(&mut text, trace_id);
    text.push(b'-');
    push_hex(&mut text, span_id);
    text.extend_from_slice(b"-01");
    HeaderValue::from_bytes(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

thread_local! {
    /// The worker's generator of ids and sampling draws, seeded from the operating system once.
    static DRAWS: RefCell<SmallRng> = RefCell::new(seeded());
}

fn seeded() -> SmallRng {
    SmallRng::try_from_rng(&mut rand::rngs::SysRng).unwrap_or_else(|_| {
        // The standard library's per-process random keys, themselves from the operating system.
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_usize(&hasher as *const _ as usize);
        SmallRng::seed_from_u64(hasher.finish())
    })
}

/// A uniform draw of 64 bits: the sampling decision compares it with the ratio's threshold.
pub(crate) fn draw() -> u64 {
    DRAWS.with(|rng| rng.borrow_mut().next_u64())
}

/// A new trace id (never all zero).
pub(crate) fn trace_id() -> TraceId {
    let mut id = [0; 16];
    while id == [0; 16] {
        id[..8].copy_from_slice(&draw().to_be_bytes());
        id[8..].copy_from_slice(&draw().to_be_bytes());
    }
    id
}

/// A new span id (never all zero).
pub(crate) fn span_id() -> SpanId {
    let mut id = [0; 8];
    while id == [0; 8] {
        id = draw().to_be_bytes();
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specification_s_example_parses_and_formats_back() {
        let parent = parse(EXAMPLE).expect("a valid traceparent");
        assert_eq!(to_hex(&parent.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(to_hex(&parent.span_id), "00f067aa0ba902b7");
        assert!(parent.sampled);
        let written = traceparent(&parent.trace_id, &parent.span_id);
        assert_eq!(written.as_bytes(), EXAMPLE);
        let unsampled = parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert_eq!(unsampled.map(|p| p.sampled), Some(false));
    }

    #[test]
    fn what_the_specification_refuses_is_no_parent() {
        let refused: &[&[u8]] = &[
            b"",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ];
        for value in refused {
            assert_eq!(parse(value), None, "{}", String::from_utf8_lossy(value));
        }
        // A later version may carry more fields after its own.
        let later = parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more");
        assert!(later.is_some_and(|p| p.sampled));
    }

    #[test]
    fn ids_are_never_zero_and_differ() {
        let (a, b) = (trace_id(), trace_id());
        assert_ne!(a, [0; 16]);
        assert_ne!(a, b);
        assert_ne!(span_id(), span_id());
    }
}
