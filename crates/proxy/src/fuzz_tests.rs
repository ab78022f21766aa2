//! Hostile requests, generated: what clients send (odd methods, escaped and dotted targets, absolute
//! forms, Host variants, conflicting framing, odd bytes in fields, trailers, pipelining) written byte for
//! byte to a worker's real accept loop, each case on a fresh connection, and what must hold whatever
//! was sent:
//!
//! - the worker never panics and keeps serving (a last plain request gets its 200);
//! - every response is a well-formed HTTP/1.1 response with a 2xx, 4xx or 5xx status;
//! - a refused request never reached the backend: the backend saw as many requests as the client got
//!   2xx answers, plus at most those whose streamed (chunked) body failed after their head was
//!   forwarded (400 malformed, 408 stalled, or 502 when the backend answered without reading the body
//!   and closed: see `check_case`);
//! - no more requests reach the backend than were written (nothing smuggled past a short
//!   `Content-Length`);
//! - what reached the backend has a normalised path (no `//`, no dot segments, no escaped unreserved
//!   character, no backslash), one Host, and one framing.
//!
//! 256 cases by default, `PROPTEST_CASES` for more. The pure routing property (a request routes as
//! its normalised path does, whatever the spelling of its Host) is at the end; `path.rs` holds the
//! properties of normalisation itself.

use crate::tests::Harness;
use duet_testbed::{config::DuetConfig, Backend, BackendOptions, Recorded};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use std::{
    fmt,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        OnceLock,
    },
    thread::ThreadId,
    time::Duration,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request as bytes; whether it is a HEAD (whose response has no body) and HTTP/1.0 (whose
/// response may say `HTTP/1.0`).
#[derive(Clone)]
struct Wire {
    bytes: Vec<u8>,
    head: bool,
    http10: bool,
}

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.bytes.escape_ascii())
    }
}

/// Requests pipelined in one write on one connection.
#[derive(Debug, Clone)]
struct Case {
    requests: Vec<Wire>,
}

fn pick(options: &'static [&'static str]) -> impl Strategy<Value = &'static str> + Clone {
    proptest::sample::select(options)
}

fn method() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        16 => pick(&["GET", "POST", "PUT", "HEAD", "DELETE", "OPTIONS", "PATCH"]),
        1 => pick(&["get", "CONNECT", "TRACE", "FOO-BAR", "G\0T", "", "GET\t", "\u{e9}"]),
    ]
}

/// Path segments: mostly ones the proxy normalises (escapes, dots, empty), some it refuses, a few
/// hyper refuses before the proxy sees them.
fn segment() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        24 => pick(&[
            "a", "admin", "v1", "%61dmin", "%2e", "%2E%2e", ".", "..", "", "a;x", "%7e", "~user",
            "%252e", "a%20b", "%3B", "%c3%a9", "%41%42", ".%2e", "...",
        ]),
        3 => pick(&["%2f", "%2F", "%5c", "%00", "%C0%AE", "%zz", "%", ";", "..;", "a;x/"]),
        1 => pick(&["\\", "\u{e9}", "a\tb", "a b"]),
    ]
}

fn path() -> impl Strategy<Value = String> {
    let query = pick(&["", "", "", "?", "?a=%2e/../&b", "?x=1", "?%zz", "#frag"]);
    (
        proptest::collection::vec(segment(), 0..6),
        any::<bool>(),
        query,
    )
        .prop_map(|(segments, trailing, query)| {
            let mut path = format!("/{}", segments.join("/"));
            if trailing {
                path.push('/');
            }
            path + query
        })
}

fn target() -> impl Strategy<Value = String> {
    let absolute = pick(&[
        "http://test",
        "http://TEST.:80",
        "HTTP://test",
        "https://test",
        "http://evil@test",
        "http://other",
        "http://[::1]",
        "/",
    ]);
    prop_oneof![
        8 => path(),
        3 => (absolute, path()).prop_map(|(authority, path)| authority.to_owned() + &path),
        1 => pick(&["*", "test:80", "", "http://test", "//test/a", "/a b"]).prop_map(str::to_owned),
    ]
}

fn version() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        24 => Just("HTTP/1.1"),
        1 => pick(&["HTTP/1.0", "HTTP/2.0", "http/1.1", "HTTP/1.1 ", "HTTP/1.10", "HTTP/0.9"]),
    ]
}

/// The Host fields: usually one valid `test` in some spelling, sometimes none, two, or an invalid one.
fn host() -> impl Strategy<Value = Vec<String>> {
    let value = pick(&[
        "test",
        "TEST",
        "test.",
        "Test.:80",
        "test:80",
        "test:",
        "[::1]",
        "127.0.0.1:8080",
    ]);
    let hostile = pick(&[
        "test:99999",
        "evil@test",
        "",
        "a b",
        "test,test",
        "other",
        "test\t",
        "\ttest",
        "t\u{e9}st",
        "test/x",
        "[::1",
    ]);
    let name = pick(&["Host", "host", "HOST", "Host ", " Host", "Ho st"]);
    prop_oneof![
        20 => value.clone().prop_map(|v| vec![format!("Host: {v}")]),
        2 => (name, value.clone()).prop_map(|(n, v)| vec![format!("{n}: {v}")]),
        2 => hostile.prop_map(|v| vec![format!("Host: {v}")]),
        1 => (value.clone(), value).prop_map(|(a, b)| vec![format!("Host: {a}"), format!("Host: {b}")]),
        1 => Just(Vec::new()),
    ]
}

/// Fields beyond Host and framing, some with bytes no field may hold.
fn extra_field() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        12 => pick(&[
            "X-A: b",
            "X-V: caf\u{e9}",
            "Connection: keep-alive",
            "Connection: close, x-a",
            "Connection: content-length",
            "Connection: host",
            "Connection: upgrade\r\nUpgrade: h2c",
            "Connection: upgrade\r\nUpgrade: websocket",
            "Keep-Alive: 5",
            "Proxy-Connection: keep-alive",
            "TE: trailers",
            "Trailer: X-T",
            "Expect: 100-continue",
            "X-Forwarded-For: 10.0.0.1",
            "X-Forwarded-Host: evil",
            "Content-Type: text/plain",
        ]),
        1 => pick(&[
            "X-V: a\u{7f}b",
            "X\u{1}A: b",
            "X A: b",
            ": empty-name",
            "X-\u{e4}: b",
            "X-V: a\u{1}b",
            "X-V: a\rb",
            "X-Fold: a\r\n b",
        ]),
    ]
}

/// How the body is framed (`Framing::render` writes the fields and the body).
#[derive(Debug, Clone)]
enum Framing {
    None,
    /// `Content-Length` lines as given (exact, short, long, repeated, conflicting, malformed).
    Lengths(Vec<String>),
    /// `Transfer-Encoding` lines as given, a chunked body (with a chunk-size line as given, or the
    /// right one), optional trailers, and optional `Content-Length` lines too.
    Chunked {
        encodings: Vec<&'static str>,
        size: Option<&'static str>,
        trailers: &'static str,
        lengths: Vec<String>,
    },
}

fn framing(body: usize) -> impl Strategy<Value = Framing> {
    let length = prop_oneof![
        12 => Just(body.to_string()),
        1 => Just(body.saturating_sub(2).to_string()),
        1 => Just((body + 2).to_string()),
        1 => pick(&["+5", "-1", "0x5", " 5 ", "5 5", "5, 5", "99999999999999999999", ""]).prop_map(str::to_owned),
    ];
    let encodings = prop_oneof![
        12 => Just(vec!["chunked"]),
        1 => pick(&["Chunked", "chunked, chunked", "gzip, chunked", "identity", " chunked", "chunked\u{b}", "xchunked"]).prop_map(|e| vec![e]),
        1 => Just(vec!["chunked", "chunked"]),
        1 => Just(vec!["gzip", "chunked"]),
    ];
    let size = prop_oneof![
        12 => Just(None),
        1 => pick(&["0x5", "-1", "fffffffffffffffff", "5 ; ext", "5;a=b", "", "z"]).prop_map(Some),
    ];
    let trailers = pick(&[
        "",
        "",
        "X-T: v\r\n",
        "Content-Length: 9\r\n",
        "X\u{1}: v\r\n",
    ]);
    let lengths =
        prop_oneof![6 => Just(Vec::new()), 1 => proptest::collection::vec(length.clone(), 1..2)];
    let repeated = prop_oneof![8 => proptest::collection::vec(length.clone(), 1..2), 1 => proptest::collection::vec(length, 2..3)];
    prop_oneof![
        3 => Just(Framing::None),
        4 => repeated.prop_map(Framing::Lengths),
        3 => (encodings, size, trailers, lengths).prop_map(|(encodings, size, trailers, lengths)| {
            Framing::Chunked { encodings, size, trailers, lengths }
        }),
    ]
}

impl Framing {
    /// The framing fields (each ending in CRLF), and the body as sent after the head.
    fn render(&self, body: &[u8]) -> (String, Vec<u8>) {
        match self {
            Framing::None => (String::new(), Vec::new()),
            Framing::Lengths(lengths) => (lines("Content-Length", lengths), body.to_vec()),
            Framing::Chunked {
                encodings,
                size,
                trailers,
                lengths,
            } => {
                let mut fields = lines("Transfer-Encoding", encodings);
                fields += &lines("Content-Length", lengths);
                let mut chunked = Vec::new();
                if !body.is_empty() {
                    let size = size.map_or_else(|| format!("{:x}", body.len()), str::to_owned);
                    chunked.extend_from_slice(format!("{size}\r\n").as_bytes());
                    chunked.extend_from_slice(body);
                    chunked.extend_from_slice(b"\r\n");
                }
                chunked.extend_from_slice(format!("0\r\n{trailers}\r\n").as_bytes());
                (fields, chunked)
            }
        }
    }
}

fn lines(name: &str, values: &[impl AsRef<str>]) -> String {
    values
        .iter()
        .map(|v| format!("{name}: {}\r\n", v.as_ref()))
        .collect()
}

/// One request: its line, Host, other fields and framing; `close` asks for `Connection: close`, and
/// `bare_lf` ends its head's lines with LF alone.
fn request(close: bool) -> impl Strategy<Value = Wire> {
    let body = proptest::collection::vec(proptest::sample::select(b"ab\r\n0: ".to_vec()), 0..12);
    let fields = proptest::collection::vec(extra_field(), 0..3);
    let head = (method(), target(), version(), host(), fields);
    (head, body, proptest::bool::weighted(0.02))
        .prop_flat_map(|(head, body, bare_lf)| {
            let n = body.len();
            (Just(head), Just(body), Just(bare_lf), framing(n))
        })
        .prop_map(
            move |((method, target, version, host, fields), body, bare_lf, framing)| {
                let mut head = format!("{method} {target} {version}\r\n{CASE_FIELD}\r\n");
                for field in host.iter().map(String::as_str).chain(fields) {
                    head += field;
                    head += "\r\n";
                }
                let (framing_fields, body) = framing.render(&body);
                head += &framing_fields;
                if close {
                    head += "Connection: close\r\n";
                }
                head += "\r\n";
                if bare_lf {
                    head = head.replace("\r\n", "\n");
                }
                let mut bytes = head.into_bytes();
                bytes.extend_from_slice(&body);
                Wire {
                    bytes,
                    head: method == "HEAD",
                    http10: version == "HTTP/1.0",
                }
            },
        )
}

/// One to three requests, the last usually asking the proxy to close once it has answered (so the
/// case ends without waiting for the keep-alive timeout).
fn case() -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(request(false), 0..2),
        request(true),
        request(false),
        proptest::bool::weighted(0.9),
    )
        .prop_map(|(mut requests, closing, open, close)| {
            requests.push(if close { closing } else { open });
            Case { requests }
        })
}

/// Every request names its case in this field (`########` becomes the case's number when it is sent), so
/// that a request reaching the backend late (a streamed one whose client was already answered) is not
/// counted against the next case.
const CASE_FIELD: &str = "X-Case: ########";

/// `request` with its [`CASE_FIELD`] naming case `tag` (eight characters).
fn tagged(request: &[u8], tag: &str) -> Vec<u8> {
    let placeholder = CASE_FIELD.trim_start_matches("X-Case: ").as_bytes();
    match request
        .windows(placeholder.len())
        .position(|w| w == placeholder)
    {
        Some(at) => [
            &request[..at],
            tag.as_bytes(),
            &request[at + placeholder.len()..],
        ]
        .concat(),
        None => request.to_vec(),
    }
}

/// Writes the case's requests (tagged `tag`) in one go on a fresh connection and reads until the proxy
/// closes it (every path closes: `Connection: close`, a refused request, or the short timeouts of the
/// test's config). `None` if it was still open after 5 s.
async fn exchange(address: SocketAddr, case: &Case, tag: &str) -> Option<Vec<u8>> {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let sent: Vec<u8> = case
        .requests
        .iter()
        .flat_map(|r| tagged(&r.bytes, tag))
        .collect();
    // The proxy may refuse and close before reading everything: a failed write is one outcome.
    let _ = stream.write_all(&sent).await;
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return None,
            // A reset after a refusal ends the stream like a close.
            Ok(Ok(0) | Err(_)) => return Some(received),
            Ok(Ok(n)) => received.extend_from_slice(&buffer[..n]),
        }
    }
}

/// The final responses in `bytes` (interim `100`s skipped), status and body, checking each is a
/// well-formed HTTP/1.1 response with a 2xx, 4xx or 5xx status and an unambiguous body length.
fn responses<'b>(mut bytes: &'b [u8], requests: &[Wire]) -> Result<Vec<Answer<'b>>, String> {
    let mut responses = Vec::new();
    while !bytes.is_empty() {
        let end = duet_testbed::raw::head_end(bytes)
            .ok_or_else(|| format!("a response head cut short: \"{}\"", bytes.escape_ascii()))?;
        let head = std::str::from_utf8(&bytes[..end]).map_err(|_| "a head that is not UTF-8")?;
        let request = requests.get(responses.len());
        let status = status_line(head, request.is_some_and(|r| r.http10))?;
        bytes = &bytes[end..];
        if status == 100 {
            continue;
        }
        if !matches!(status, 200..=299 | 400..=599) {
            return Err(format!("status {status}: {head:?}"));
        }
        // The answer to a HEAD has no body, but bytes past a short Content-Length may have become a
        // request of their own, so the n-th response need not answer the n-th request written: a HEAD's
        // is bodiless only if what follows it is the next response.
        let bodiless =
            request.is_some_and(|r| r.head) && (bytes.is_empty() || bytes.starts_with(b"HTTP/1."));
        let length = match framing_of(head)? {
            _ if bodiless || status == 204 || status == 304 => 0,
            Some(ResponseFraming::Length(n)) => n,
            Some(ResponseFraming::Chunked) => chunked_length(bytes)?,
            // Delimited by the close: the rest is its body.
            None => bytes.len(),
        };
        let body = bytes
            .get(..length)
            .ok_or_else(|| format!("a body cut short ({length} announced): {head:?}"))?;
        responses.push(Answer { status, head, body });
        bytes = &bytes[length..];
    }
    Ok(responses)
}

/// The status of `HTTP/1.1 NNN reason` (`HTTP/1.0` to an HTTP/1.0 request), after checking every
/// field line is `name: value`.
fn status_line(head: &str, http10: bool) -> Result<u16, String> {
    let mut lines = head.trim_end_matches("\r\n").split("\r\n");
    let line = lines.next().unwrap_or_default();
    let code = line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| line.strip_prefix("HTTP/1.0 ").filter(|_| http10))
        .and_then(|rest| rest.get(..3))
        .filter(|code| code.bytes().all(|b| b.is_ascii_digit()))
        .filter(|_| line.as_bytes().get(12).is_none_or(|&b| b == b' '))
        .ok_or_else(|| format!("not an HTTP/1.1 status line: {line:?}"))?;
    for field in lines {
        let name = field.split(':').next().unwrap_or_default();
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token || !field.contains(':') {
            return Err(format!("a malformed field line {field:?} in {head:?}"));
        }
    }
    code.parse().map_err(|_| format!("status {code:?}"))
}

/// A response read back: its status, head and body.
struct Answer<'b> {
    status: u16,
    head: &'b str,
    body: &'b [u8],
}

enum ResponseFraming {
    Length(usize),
    Chunked,
}

/// A response's framing: one `Content-Length` or `Transfer-Encoding: chunked`, never both.
fn framing_of(head: &str) -> Result<Option<ResponseFraming>, String> {
    let values = |wanted: &str| -> Vec<&str> {
        head.split("\r\n")
            .filter_map(|line| line.split_once(':'))
            .filter(|(name, _)| name.eq_ignore_ascii_case(wanted))
            .map(|(_, value)| value.trim())
            .collect()
    };
    match (
        &values("content-length")[..],
        &values("transfer-encoding")[..],
    ) {
        ([], []) => Ok(None),
        ([length], []) => length
            .parse()
            .map(|n| Some(ResponseFraming::Length(n)))
            .map_err(|_| format!("Content-Length {length:?}")),
        ([], ["chunked"]) => Ok(Some(ResponseFraming::Chunked)),
        _ => Err(format!("ambiguous response framing: {head:?}")),
    }
}

/// The length of the chunked body at the start of `bytes`, through its last chunk and empty trailers.
fn chunked_length(bytes: &[u8]) -> Result<usize, String> {
    let mut at = 0;
    loop {
        let line_end = bytes[at..]
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk-size line cut short")?;
        let line = std::str::from_utf8(&bytes[at..at + line_end]).map_err(|_| "chunk size")?;
        let size = usize::from_str_radix(line.split(';').next().unwrap_or_default().trim(), 16)
            .map_err(|_| format!("chunk size {line:?}"))?;
        at += line_end + 2;
        if size == 0 {
            return match bytes.get(at..at + 2) {
                Some(b"\r\n") => Ok(at + 2),
                _ => Err("trailers in a response".to_owned()),
            };
        }
        at += size + 2;
        if at > bytes.len() {
            return Err("a chunk cut short".to_owned());
        }
    }
}

/// What a request that reached the backend must look like: a normalised path, one Host, one framing,
/// no hop-by-hop field of the client's.
fn check_forwarded(request: &Recorded) -> Result<(), String> {
    let path = request.uri.split('?').next().unwrap_or_default();
    let normal = path.starts_with('/')
        && !path.contains("//")
        && !path.contains('\\')
        && path[1..].split('/').all(|s| s != "." && s != "..")
        && escapes_are_normal(path);
    if !normal {
        return Err(format!("the backend got path {path:?}: {request:?}"));
    }
    let headers = &request.headers;
    let lengths = headers.get_all(http::header::CONTENT_LENGTH).iter().count();
    let encodings: Vec<_> = headers
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .collect();
    let framing_ok = match (lengths, &encodings[..]) {
        (0, []) => true,
        (1, []) => headers[http::header::CONTENT_LENGTH]
            .to_str()
            .is_ok_and(|v| v.parse::<u64>().is_ok()),
        (0, [chunked]) => chunked.as_bytes() == b"chunked",
        _ => false,
    };
    let hosts = headers.get_all(http::header::HOST).iter().count();
    let hop_by_hop = ["keep-alive", "proxy-connection"]
        .iter()
        .any(|name| headers.contains_key(*name));
    if !framing_ok || hosts != 1 || hop_by_hop || request.version != http::Version::HTTP_11 {
        return Err(format!("the backend got {request:?}"));
    }
    Ok(())
}

/// Every `%` starts an escape of a reserved or non-ASCII byte, in uppercase hex.
fn escapes_are_normal(path: &str) -> bool {
    path.match_indices('%').all(|(at, _)| {
        let hex = path.as_bytes().get(at + 1..at + 3).unwrap_or_default();
        let upper = hex.len() == 2
            && hex
                .iter()
                .all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(b));
        let value = std::str::from_utf8(hex)
            .ok()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        let unreserved = value.is_some_and(|v| v.is_ascii_alphanumeric() || b"-._~".contains(&v));
        upper && !unreserved
    })
}

/// Panics on the fuzzing thread (where the worker's tasks run), counted by a panic hook: tokio would
/// otherwise catch a connection task's panic and the test would only see a closed connection.
static FUZZ_THREAD: OnceLock<ThreadId> = OnceLock::new();
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics_on_this_thread() {
    if FUZZ_THREAD.set(std::thread::current().id()).is_err() {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if FUZZ_THREAD.get() == Some(&std::thread::current().id()) {
            PANICS.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256)
}

/// Runs one case and checks what the client got against what the backend saw.
fn check_case(
    case: &Case,
    tag: &str,
    run: impl FnOnce() -> Option<Vec<u8>>,
    backend: &Backend,
) -> Result<(), TestCaseError> {
    // Counted per case, so that shrinking looks for the input that panics, not any input after it.
    let panics = PANICS.load(Ordering::SeqCst);
    let received = run().ok_or_else(|| TestCaseError::fail("still open after 5 s"))?;
    let responses = responses(&received, &case.requests).map_err(TestCaseError::fail)?;
    let received = received.escape_ascii().to_string();
    let forwarded: Vec<Recorded> = backend
        .recorded()
        .into_iter()
        .filter(|r| r.headers.get("x-case").is_some_and(|v| v == tag))
        .collect();
    // `OPTIONS *` is about duet itself, answered without a backend.
    let answered = responses
        .iter()
        .filter(|a| (200..300).contains(&a.status) && !a.head.contains("\r\nallow: "))
        .count();
    // A chunked body is streamed: its head is on its way to the backend before the body turns out
    // malformed (400) or stalls (408). Every other refusal happens before anything is forwarded. (A
    // backend that answers without reading the body, the testbed's default answer, and closes while
    // duet still writes the body has its answer relayed: backend::early_answer.)
    let cut_short = responses
        .iter()
        .filter(|answer| {
            matches!(
                (answer.status, answer.body),
                (400, b"bad request body\n") | (408, b"request body not received in time\n")
            )
        })
        .count();
    let streamed = forwarded
        .iter()
        .filter(|r| r.headers.contains_key(http::header::TRANSFER_ENCODING))
        .count();
    prop_assert!(
        forwarded.len() >= answered
            && forwarded.len() - answered <= cut_short.min(streamed),
        "{} requests reached the backend, {} got a 2xx, {} had a streamed body cut short; received {}, forwarded {:#?}",
        forwarded.len(),
        answered,
        cut_short,
        received,
        forwarded
    );
    // Bytes past a short Content-Length are read as a request of their own, so responses may outnumber
    // the requests written; requests forwarded may not.
    prop_assert!(
        forwarded.len() <= case.requests.len(),
        "more requests forwarded than written: {:#?}",
        forwarded
    );
    for request in &forwarded {
        check_forwarded(request).map_err(TestCaseError::fail)?;
    }
    prop_assert_eq!(PANICS.load(Ordering::SeqCst), panics, "the worker panicked");
    Ok(())
}

#[test]
fn hostile_requests_get_well_formed_answers_and_only_normalised_ones_reach_the_backend() {
    count_panics_on_this_thread();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    let backend = Backend::start(BackendOptions::named("b")).expect("backend");
    let yaml = DuetConfig::new()
        .route(Some("test"), "/", "app")
        .cluster(duet_testbed::config::Cluster::new("app").backend(backend.address()))
        .section(
            "limits",
            "{ header_read_timeout: 500ms, body_read_timeout: 100ms, keepalive_timeout: 100ms }",
        )
        .to_yaml();
    let harness = local.block_on(&runtime, Harness::start(&yaml));
    let config = Config {
        cases: cases(),
        failure_persistence: None,
        max_shrink_time: 20_000,
        ..Config::default()
    };
    let number = std::cell::Cell::new(0u32);
    let outcome = TestRunner::new(config).run(&case(), |case| {
        number.set(number.get() + 1);
        let tag = format!("{:08}", number.get());
        let run = || local.block_on(&runtime, exchange(harness.address, &case, &tag));
        check_case(&case, &tag, run, &backend)
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    let (status, served_by, body) = local.block_on(&runtime, harness.get("/after"));
    assert_eq!(
        (status, served_by.as_str()),
        (200, "b"),
        "the worker still serves"
    );
    assert_eq!(body.as_deref(), Some(&b"b"[..]));
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "the worker panicked");
    // Streamed requests that arrived after their case was checked are held to the same form.
    for request in backend.recorded() {
        assert_eq!(check_forwarded(&request), Ok(()));
    }
}

mod routing {
    //! The routing table against a plain reference: a request routes as its normalised path does,
    //! whatever the spelling of its host (case, trailing dot, port, absolute-form target).

    use super::pick;
    use crate::{error::ErrorKind, path, stage::route::route};
    use proptest::prelude::*;

    const HOSTS: [&str; 3] = ["api.test", "www.test", "other.org"];

    /// Route index by (host pattern, path prefix), first match wins: `None` is any host.
    const TABLE: [(Option<&str>, &str); 4] = [
        (Some("api.test"), "/admin/"),
        (Some("*.test"), "/admin"),
        (None, "/public/"),
        (Some("api.test"), "/"),
    ];

    static ROUTES: std::sync::LazyLock<Vec<duet_config::Route>> = std::sync::LazyLock::new(routes);

    fn routes() -> Vec<duet_config::Route> {
        let mut yaml = String::from("listeners: [ { address: 127.0.0.1:0 } ]\nroutes:\n");
        for (host, prefix) in TABLE {
            let host = host.map_or_else(String::new, |h| format!("host: '{h}', "));
            yaml += &format!("  - {{ match: {{ {host}path_prefix: {prefix} }}, cluster: c }}\n");
        }
        yaml += "clusters:\n  - { name: c, backends: [ { address: 127.0.0.1:1 } ] }\n";
        duet_config::parse(&yaml, "routing.yaml")
            .expect("valid")
            .routes
    }

    /// The first route of `TABLE` for `host` (as listed in `HOSTS`) and a normalised `path`.
    fn reference(host: &str, path: &str) -> Option<usize> {
        TABLE.iter().position(|(pattern, prefix)| {
            let host_ok = match pattern {
                None => true,
                Some(wildcard) if wildcard.starts_with('*') => host.ends_with(&wildcard[1..]),
                Some(exact) => host == *exact,
            };
            host_ok && path.starts_with(prefix)
        })
    }

    fn segment() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            8 => pick(&["admin", "public", "a", "%61dmin", "%70ublic", "ADMIN", "admin;x"]),
            6 => pick(&[".", "..", "", "%2e", "%2E%2e", ".%2e", "%7e", "%c3%a9", "%252e"]),
            1 => pick(&["%2f", "%5c", "%00", "%zz", ";", "..;", "%C0%AE"]),
        ]
    }

    /// A host in `HOSTS` spelled as a client may: any case, a trailing dot, a port.
    fn spelling() -> impl Strategy<Value = (&'static str, String)> {
        (pick(&HOSTS), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(host, upper, dot, port)| {
                let mut spelled = if upper {
                    host.to_ascii_uppercase()
                } else {
                    host.to_owned()
                };
                if dot {
                    spelled.push('.');
                }
                if port {
                    spelled.push_str(":8080");
                }
                (host, spelled)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn a_request_routes_as_its_normalised_path_does(
            segments in proptest::collection::vec(segment(), 0..6),
            trailing in any::<bool>(),
            (host, spelled) in spelling(),
            absolute in any::<bool>(),
        ) {
            let path = format!("/{}{}", segments.join("/"), if trailing { "/" } else { "" });
            let target = if absolute { format!("http://{spelled}{path}?q=/admin/") } else { path.clone() };
            let header = if absolute { "elsewhere.org" } else { spelled.as_str() };
            let mut request = http::Request::get(target.as_str())
                .header(http::header::HOST, header)
                .body(())
                .expect("a valid request");
            let routed = route(&ROUTES, &crate::stage::route_index::RouteIndex::new(&ROUTES), 0, 8192, &mut request).map(|r| r.index).map_err(|e| e.kind());
            let expected = match path::normalise(&path) {
                Ok(normalised) => reference(host, &normalised).ok_or(ErrorKind::NoRoute),
                Err(kind) => Err(kind),
            };
            prop_assert_eq!(routed, expected, "{} (Host {})", target, header);
            if let Ok(normalised) = path::normalise(&path) {
                prop_assert_eq!(request.uri().path(), &*normalised, "the backend gets the path routed on");
            }
        }
    }
}
