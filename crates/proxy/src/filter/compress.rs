//! `compress:`: a backend's response compressed toward the client in zstd, brotli or gzip, the one
//! the request's `Accept-Encoding` ranks highest (RFC 9110 §12.5.3), streamed frame by frame.
//!
//! Never for a `HEAD`, a range (asked or answered), a gRPC call, `Cache-Control: no-transform` (RFC
//! 9111 §5.2.2.6, asked or answered), a 1xx, 204 or 304, an already encoded response, a type not
//! listed or a length under the minimum. A compressed response says `Vary: Accept-Encoding` (as does
//! any it could have compressed for another client), its strong `ETag` made weak (the bytes are no
//! longer the backend's), its `Content-Length` and `Accept-Ranges` gone.
//!
//! Memory per response is bounded: the encoder's window (brotli's and zstd's held to
//! [`WINDOW_LOG`]) and one output frame per input frame; what the encoder holds back is flushed
//! whenever the backend pauses, so a slow stream still arrives as it is sent.

use crate::{
    attempt::body::{BodyError, ProxyBody},
    filter::phase::{BodyPlan, Build, Phase, Phases},
    grpc,
};
use async_compression::{
    codecs::{
        flate::params::FlateEncoderParams, BrotliEncoder, EncodeV2, GzipEncoder, ZstdEncoder,
    },
    core::util::PartialBuffer,
    Level,
};
use bytes::Bytes;
use duet_config::filter::compress::{Compress as Settings, Encoding};
use duet_config::Route;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::{
    pin::Pin,
    task::{Context, Poll},
};

/// brotli's and zstd's window: 256 KiB of history per response (their defaults hold 4 MiB and
/// 2 MiB at the levels used on the fly), for a ratio on web text within a few percent of theirs.
const WINDOW_LOG: u32 = 18;

/// A route's compression.
#[derive(Debug)]
pub(crate) struct Compress(Settings);

impl Phases for Compress {
    const PHASES: Phase = Phase::RESPONSE_BODY;

    fn build(route: &Route, _: &Build<'_>, _: Option<&Self>) -> Option<Self> {
        route.filters.compress.clone().map(Self)
    }

    fn plan_body(&self, request: &Request<Incoming>) -> Option<BodyPlan> {
        let headers = request.headers();
        if request.method() == Method::HEAD
            || headers.contains_key(header::RANGE)
            || grpc::is_grpc(headers)
            || no_transform(headers)
        {
            return None;
        }
        let chosen = negotiate(headers, &self.0.encodings);
        Some(BodyPlan(chosen.map_or(0, |e| e as u8 + 1)))
    }

    fn on_response_body(&self, plan: BodyPlan, response: &mut Response<ProxyBody>) {
        if !self.compressible(response.status().as_u16(), response.headers()) {
            return;
        }
        let headers = response.headers_mut();
        vary(headers);
        let encoding = match plan.0 {
            1 => Encoding::Zstd,
            2 => Encoding::Brotli,
            3 => Encoding::Gzip,
            _ => return,
        };
        headers.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(encoding.token()),
        );
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::ACCEPT_RANGES);
        if let Some(weak) = (headers.get(header::ETAG)).and_then(weakened) {
            headers.insert(header::ETAG, weak);
        }
        let body = std::mem::replace(response.body_mut(), ProxyBody::local(Bytes::new(), None));
        let encoder = self.encoder(encoding);
        *response.body_mut() = ProxyBody::shaped(Compressing::new(body, encoder));
    }
}

impl Compress {
    /// Whether a response of `status` with `headers` may be compressed.
    fn compressible(&self, status: u16, headers: &HeaderMap) -> bool {
        if status < 200 || matches!(status, 204 | 206 | 304) {
            return false;
        }
        if headers.contains_key(header::CONTENT_ENCODING)
            || headers.contains_key(header::CONTENT_RANGE)
            || no_transform(headers)
        {
            return false;
        }
        let length = (headers.get(header::CONTENT_LENGTH))
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        if length.is_some_and(|length| length < self.0.min_length) {
            return false;
        }
        let Some(media) = (headers.get(header::CONTENT_TYPE)).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let media = media.split(';').next().unwrap_or_default().trim();
        (self.0.types.iter()).any(|listed| match listed.strip_suffix("/*") {
            Some(kind) => {
                (media.split_once('/')).is_some_and(|(k, _)| k.eq_ignore_ascii_case(kind))
            }
            None => media.eq_ignore_ascii_case(listed),
        })
    }

    fn encoder(&self, encoding: Encoding) -> Box<dyn EncodeV2> {
        let level = |l: u32| Level::Precise(i32::try_from(l).unwrap_or(i32::MAX));
        match encoding {
            Encoding::Gzip => Box::new(GzipEncoder::new(FlateEncoderParams::from(level(
                self.0.gzip_level,
            )))),
            Encoding::Brotli => {
                let params = async_compression::brotli::EncoderParams::default()
                    .quality(level(self.0.brotli_level))
                    .window_size(WINDOW_LOG as i32)
                    .text_mode();
                Box::new(BrotliEncoder::new(params))
            }
            Encoding::Zstd => {
                let window = async_compression::zstd::CParameter::window_log(WINDOW_LOG);
                let level = i32::try_from(self.0.zstd_level).unwrap_or(3);
                Box::new(ZstdEncoder::new_with_params(level, &[window]))
            }
        }
    }
}

/// Whether `Cache-Control` says `no-transform`.
fn no_transform(headers: &HeaderMap) -> bool {
    (headers.get_all(header::CACHE_CONTROL).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| d.trim().eq_ignore_ascii_case("no-transform"))
}

/// The coding of `offered` (the route's, preferred first) that `Accept-Encoding` ranks highest above
/// 0; `None` without the field, or when it accepts none of them.
fn negotiate(headers: &HeaderMap, offered: &[Encoding]) -> Option<Encoding> {
    let mut best: Option<(Encoding, u16)> = None;
    for &encoding in offered {
        let q = quality(headers, encoding.token());
        if q > 0 && best.is_none_or(|(_, b)| q > b) {
            best = Some((encoding, q));
        }
    }
    best.map(|(encoding, _)| encoding)
}

/// `token`'s `q` in thousandths in `Accept-Encoding`: its own entry's, else `*`'s, else 0.
fn quality(headers: &HeaderMap, token: &str) -> u16 {
    let (mut own, mut any) = (None, None);
    for value in headers.get_all(header::ACCEPT_ENCODING) {
        let Ok(value) = value.to_str() else { continue };
        for entry in value.split(',') {
            let mut parts = entry.split(';');
            let name = parts.next().unwrap_or_default().trim();
            let q = parts
                .find_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    k.trim().eq_ignore_ascii_case("q").then(|| v.trim())
                })
                .map_or(1000, |v| {
                    (v.parse::<f32>().unwrap_or(0.0).clamp(0.0, 1.0) * 1000.0).round() as u16
                });
            if name.eq_ignore_ascii_case(token)
                || (token == "gzip" && name.eq_ignore_ascii_case("x-gzip"))
            {
                own = Some(own.map_or(q, |o: u16| o.max(q)));
            } else if name == "*" {
                any = Some(q);
            }
        }
    }
    own.or(any).unwrap_or(0)
}

/// `Vary: Accept-Encoding` added, unless the response already varies on it (or on everything).
fn vary(headers: &mut HeaderMap) {
    let varies = (headers.get_all(header::VARY).iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|f| f.trim() == "*" || f.trim().eq_ignore_ascii_case("accept-encoding"));
    if !varies {
        headers.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    }
}

/// A strong `ETag` made weak (`W/"x"`); `None` for one already weak.
fn weakened(etag: &HeaderValue) -> Option<HeaderValue> {
    let bytes = etag.as_bytes();
    if bytes.starts_with(b"W/") {
        return None;
    }
    HeaderValue::from_bytes(&[b"W/", bytes].concat()).ok()
}

/// Where a compressed body is in its stream.
enum State {
    Streaming,
    /// The backend's trailers, sent after the coding's end.
    Trailers(Option<HeaderMap>),
    Done,
}

/// A body compressed as it streams: each input frame becomes (at most) one output frame.
struct Compressing<B> {
    // Boxed: a backend's body is not `Unpin`, and only compressed responses pay for the box.
    inner: Pin<Box<B>>,
    encoder: Box<dyn EncodeV2>,
    state: State,
    /// Input went in since the encoder last flushed.
    unflushed: bool,
}

impl<B> Compressing<B> {
    fn new(inner: B, encoder: Box<dyn EncodeV2>) -> Self {
        Self {
            inner: Box::pin(inner),
            encoder,
            state: State::Streaming,
            unflushed: false,
        }
    }

    /// The encoder's output for `input`.
    fn encode(&mut self, input: &[u8]) -> std::io::Result<Bytes> {
        let mut input = PartialBuffer::new(input);
        let mut out = vec![0; input.unwritten().len() / 2 + 64];
        let mut written = 0;
        while !input.unwritten().is_empty() {
            if written == out.len() {
                out.resize(out.len() * 2, 0);
            }
            let mut output = PartialBuffer::new(&mut out[written..]);
            let before = input.written_len();
            async_compression::codecs::Encode::encode(&mut *self.encoder, &mut input, &mut output)?;
            written += output.written_len();
            if input.written_len() == before && output.written_len() == 0 {
                return Err(std::io::Error::other("the encoder made no progress"));
            }
        }
        out.truncate(written);
        self.unflushed = true;
        Ok(Bytes::from(out))
    }

    /// What the encoder holds, flushed (`end`: and the coding's end written).
    fn drain(&mut self, end: bool) -> std::io::Result<Bytes> {
        let mut out = vec![0; 1024];
        let mut written = 0;
        for _ in 0..64 {
            if written == out.len() {
                out.resize(out.len() * 2, 0);
            }
            let mut output = PartialBuffer::new(&mut out[written..]);
            let encoder = &mut *self.encoder;
            let done = match end {
                true => async_compression::codecs::Encode::finish(encoder, &mut output)?,
                false => async_compression::codecs::Encode::flush(encoder, &mut output)?,
            };
            written += output.written_len();
            if done {
                out.truncate(written);
                self.unflushed = false;
                return Ok(Bytes::from(out));
            }
        }
        Err(std::io::Error::other("the encoder did not finish"))
    }
}

/// What a body's poll gives.
type Polled = Poll<Option<Result<Frame<Bytes>, BodyError>>>;

/// A frame of `data`, or the next poll's for none.
fn data(bytes: Bytes) -> Option<Polled> {
    (!bytes.is_empty()).then(|| Poll::Ready(Some(Ok(Frame::data(bytes)))))
}

impl<B: Body<Data = Bytes, Error = BodyError>> Body for Compressing<B> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Done => return Poll::Ready(None),
                State::Trailers(trailers) => {
                    let trailers = trailers.take();
                    this.state = State::Done;
                    return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
                }
                State::Streaming => {}
            }
            let frame = match this.inner.as_mut().poll_frame(cx) {
                Poll::Pending if this.unflushed => match this.drain(false) {
                    Ok(bytes) => return data(bytes).unwrap_or(Poll::Pending),
                    Err(e) => return Poll::Ready(Some(Err(e.into()))),
                },
                Poll::Pending => return Poll::Pending,
                Poll::Ready(frame) => frame,
            };
            let output = match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(input) => this.encode(&input),
                    Err(frame) => {
                        this.state = State::Trailers(frame.into_trailers().ok());
                        this.drain(true)
                    }
                },
                Some(Err(e)) => {
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(e)));
                }
                None => {
                    this.state = State::Trailers(None);
                    this.drain(true)
                }
            };
            match output {
                Ok(bytes) => {
                    if let Some(ready) = data(bytes) {
                        return ready;
                    }
                }
                Err(e) => {
                    this.state = State::Done;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_compression::codecs::{Decode, GzipDecoder};
    use std::collections::VecDeque;

    /// A body that gives each step in turn: a frame of data, or (`None`) a pause that wakes at once;
    /// then its trailers.
    struct Scripted {
        steps: VecDeque<Option<&'static [u8]>>,
        trailers: Option<HeaderMap>,
        /// How many steps were taken.
        taken: std::rc::Rc<std::cell::Cell<usize>>,
    }

    impl Body for Scripted {
        type Data = Bytes;
        type Error = BodyError;

        fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
            self.taken.set(self.taken.get() + 1);
            match self.steps.pop_front() {
                Some(Some(data)) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(data))))),
                Some(None) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                None => Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t)))),
            }
        }
    }

    /// Polls until the body ends or the script has taken `until` steps: the data it gave, and its
    /// trailers.
    fn run(body: &mut Compressing<Scripted>, until: usize) -> (Vec<u8>, Option<HeaderMap>) {
        let taken = body.inner.taken.clone();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let (mut data, mut trailers) = (Vec::new(), None);
        for _ in 0..100 {
            if taken.get() >= until {
                break;
            }
            match Pin::new(&mut *body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(bytes) => data.extend_from_slice(&bytes),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                },
                Poll::Ready(Some(Err(e))) => panic!("{e}"),
                Poll::Ready(None) | Poll::Pending => break,
            }
        }
        (data, trailers)
    }

    /// `compressed` (the whole stream or a flushed part of it) decoded.
    fn gunzip(compressed: &[u8]) -> Vec<u8> {
        let mut decoder = GzipDecoder::new();
        let mut input = PartialBuffer::new(compressed);
        let mut out = vec![0; 1 << 20];
        let mut output = PartialBuffer::new(&mut out[..]);
        for _ in 0..16 {
            let ended = decoder.decode(&mut input, &mut output).expect("gzip");
            if ended || input.unwritten().is_empty() {
                break;
            }
        }
        let _ = decoder.flush(&mut output);
        let written = output.written_len();
        out.truncate(written);
        out
    }

    #[test]
    fn what_came_before_a_pause_is_flushed_and_the_trailers_follow_the_end() {
        let first: &'static [u8] = &[b'a'; 10_000];
        let second: &'static [u8] = b"and the rest";
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", HeaderValue::from_static("1"));
        let scripted = Scripted {
            steps: VecDeque::from([Some(first), None, Some(second)]),
            trailers: Some(trailers),
            taken: std::rc::Rc::default(),
        };
        let encoder = Compress(Settings {
            encodings: vec![Encoding::Gzip],
            types: Vec::new(),
            min_length: 0,
            gzip_level: 5,
            brotli_level: 4,
            zstd_level: 3,
        })
        .encoder(Encoding::Gzip);
        let mut body = Compressing::new(scripted, encoder);
        // The first frame in and the pause after it seen: what the encoder held is out.
        let (before_pause, _) = run(&mut body, 2);
        let decoded = gunzip(&before_pause);
        let wanted = first.len();
        assert!(
            decoded == first,
            "{} of {wanted} bytes before the rest",
            decoded.len()
        );
        let (rest, trailers) = run(&mut body, usize::MAX);
        let whole = [before_pause, rest].concat();
        let decoded = gunzip(&whole);
        assert!(
            decoded == [first, second].concat(),
            "{} bytes",
            decoded.len()
        );
        assert_eq!(
            trailers.map(|t| t["x-checksum"].clone()),
            Some(HeaderValue::from_static("1"))
        );
        assert!(body.is_end_stream());
    }

    #[test]
    fn only_a_listed_type_at_the_minimum_length_and_not_yet_encoded_is_compressed() {
        let compress = Compress(Settings {
            encodings: vec![Encoding::Gzip],
            types: vec!["text/*".to_owned(), "application/json".to_owned()],
            min_length: 100,
            gzip_level: 5,
            brotli_level: 4,
            zstd_level: 3,
        });
        let head = |fields: &[(&str, &str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in fields {
                let name = http::HeaderName::from_bytes(name.as_bytes()).expect("name");
                headers.append(name, HeaderValue::from_str(value).expect("value"));
            }
            headers
        };
        type Fields<'a> = &'a [(&'a str, &'a str)];
        let rows: [(u16, Fields<'_>, bool); 9] = [
            (200, &[("content-type", "text/css")], true),
            (
                404,
                &[("content-type", "Application/JSON; charset=utf-8")],
                true,
            ),
            (200, &[("content-type", "image/png")], false),
            (200, &[], false),
            (
                200,
                &[("content-type", "text/html"), ("content-length", "99")],
                false,
            ),
            (
                200,
                &[("content-type", "text/html"), ("content-length", "100")],
                true,
            ),
            (
                200,
                &[("content-type", "text/html"), ("content-encoding", "br")],
                false,
            ),
            (
                200,
                &[
                    ("content-type", "text/html"),
                    ("cache-control", "No-Transform"),
                ],
                false,
            ),
            (304, &[("content-type", "text/html")], false),
        ];
        for (status, fields, compressible) in rows {
            assert_eq!(
                compress.compressible(status, &head(fields)),
                compressible,
                "{status} {fields:?}"
            );
        }
        assert_eq!(
            weakened(&HeaderValue::from_static("\"x\"")),
            Some(HeaderValue::from_static("W/\"x\""))
        );
        assert_eq!(weakened(&HeaderValue::from_static("W/\"x\"")), None);
        let mut varied = head(&[("vary", "origin, accept-encoding")]);
        vary(&mut varied);
        assert_eq!(varied.get_all(header::VARY).iter().count(), 1);
    }
}
