//! The access-log record of one request, written once when its response is finished.

use crate::{peer::Client, telemetry::upload::Received};
use http::{header, HeaderValue, Method, Request, StatusCode, Uri, Version};
use std::{
    borrow::Cow,
    cell::RefCell,
    fmt,
    net::{IpAddr, SocketAddr},
    sync::{Arc, OnceLock},
    time::{SystemTime, UNIX_EPOCH},
};
use tokio::time::Instant;

/// One access-log line, written when it is dropped: at the end of the response body (only then are the
/// byte count and the duration known), or when the response is dropped unfinished.
///
/// The fields are those of nginx's `combined` format and Envoy's default line: who (client address,
/// after `trusted_proxies`; user agent), what (method, host, path, protocol, request id), where to
/// (cluster, the backend that answered and every backend tried before it), how it went (status,
/// attempts, which one answered first when a hedge was sent, duration, the backend's response-head
/// time, bytes sent and received, outcome).
pub(crate) struct AccessLog {
    method: Method,
    /// The request's target as received (a shared slice of it: no copy); the log shows its path.
    target: Uri,
    version: Version,
    host: Option<HeaderValue>,
    user_agent: Option<HeaderValue>,
    request_id: HeaderValue,
    client: IpAddr,
    started: Instant,
    pub(crate) status: StatusCode,
    pub(crate) cluster: Option<Arc<str>>,
    pub(crate) backend: Option<SocketAddr>,
    /// Backends whose attempts failed before the last one.
    pub(crate) tried: Vec<SocketAddr>,
    /// Attempts sent to backends (0: none was picked), a hedge included.
    pub(crate) attempts: u32,
    /// Whether a hedge was sent and which attempt's response head came first: `first` or `hedge`
    /// (`-`: no hedge was sent, or neither answered).
    pub(crate) hedged: &'static str,
    /// From the answering attempt's start to its response head.
    pub(crate) upstream_head_ms: Option<f64>,
    pub(crate) bytes: u64,
    /// Request body bytes read from the client.
    pub(crate) received: Received,
    /// How the response ended: `complete`, `upgraded`, `client_gone` until told, `backend_error`,
    /// `backend_read_timeout`, or for a response duet made itself the reason (`no_route`, `timeout`...).
    pub(crate) outcome: &'static str,
    /// A gRPC call's status (its trailers, a trailers-only head, or duet's own error); the field is
    /// written only when there is one.
    pub(crate) grpc_status: Option<u8>,
}

impl AccessLog {
    /// A record for `request` from `client`, if the access log is enabled (target `duet::access` at
    /// info).
    pub(crate) fn start<B>(
        request: &Request<B>,
        started: Instant,
        client: Client,
        request_id: HeaderValue,
    ) -> Option<Box<Self>> {
        if !tracing::enabled!(target: "duet::access", tracing::Level::INFO) {
            return None;
        }
        let headers = request.headers();
        // Boxed: the record travels with the request through every stage and into the response body,
        // and a pointer moves where 336 bytes would be copied at each step.
        Some(Box::new(Self {
            method: request.method().clone(),
            target: request.uri().clone(),
            version: request.version(),
            host: headers.get(header::HOST).cloned(),
            user_agent: headers.get(header::USER_AGENT).cloned(),
            request_id,
            client: original_client(request, client),
            started,
            status: StatusCode::OK,
            cluster: None,
            backend: None,
            tried: Vec::new(),
            attempts: 0,
            hedged: "-",
            upstream_head_ms: None,
            bytes: 0,
            received: Received::Known(0),
            outcome: "client_gone",
            grpc_status: None,
        }))
    }
}

/// The client as the first trusted proxy saw it: the last `X-Forwarded-For` entry when the peer is
/// trusted (nginx's `real_ip_header X-Forwarded-For` without recursion), the peer otherwise.
fn original_client<B>(request: &Request<B>, client: Client) -> IpAddr {
    if !client.trusted {
        return client.address.ip();
    }
    request
        .headers()
        .get_all("x-forwarded-for")
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.rsplit(',').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(client.address.ip())
}

/// A value, or `-` when there is none: formatted straight into the line, no `String` per request.
struct OrDash<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for OrDash<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(value) => value.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// Addresses joined by commas, or `-` for none.
struct Joined<'a>(&'a [SocketAddr]);

impl fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("-");
        }
        for (i, address) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            address.fmt(f)?;
        }
        Ok(())
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        // Milliseconds with microsecond precision, as numbers (in JSON too).
        let millis = |ms: f64| (ms * 1000.0).round() / 1000.0;
        let duration_ms = millis(self.started.elapsed().as_secs_f64() * 1000.0);
        let upstream_head_ms = self.upstream_head_ms.map_or(-1.0, millis);
        if let Some(sink) = SINK.get() {
            LINE.with(|line| {
                let mut line = line.borrow_mut();
                line.clear();
                self.format(&mut line, sink.json, duration_ms, upstream_head_ms);
                (sink.write)(line.as_bytes());
            });
            return;
        }
        // Without a sink (duet's binary always sets one): client text is quoted as in duet's text
        // line, so tracing's JSON formatter would show those quotes inside its strings.
        tracing::info!(
            target: "duet::access",
            client = %self.client,
            method = %self.method,
            host = %ClientText::bare(self.host.as_ref().map(HeaderValue::as_bytes)),
            path = %ClientText::bare(Some(loggable_path(self.target.path()).as_bytes())),
            protocol = ?self.version,
            status = self.status.as_u16(),
            cluster = %self.cluster.as_deref().unwrap_or("-"),
            backend = %OrDash(self.backend),
            tried = %Joined(&self.tried),
            attempts = self.attempts,
            hedged = %self.hedged,
            duration_ms,
            upstream_head_ms,
            bytes = self.bytes,
            bytes_received = self.received.bytes(),
            outcome = %self.outcome,
            grpc_status = %OrDash(self.grpc_status),
            user_agent = %ClientText::quoted(self.user_agent.as_ref().map(HeaderValue::as_bytes)),
            request_id = %ClientText::bare(Some(self.request_id.as_bytes())),
        );
    }
}

/// Where access-log lines go when duet formats them itself, set once by the binary with
/// [`set_access_log_sink`].
struct Sink {
    json: bool,
    write: WriteLine,
}

type WriteLine = Box<dyn Fn(&[u8]) + Send + Sync>;

static SINK: OnceLock<Sink> = OnceLock::new();

thread_local! {
    /// The line being formatted, reused: no allocation per request once it has grown.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
    /// The formatted date and time of the current second, reused for every line within it.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Formats access-log lines in duet itself and hands each to `write` (one line, ending in `\n`),
/// instead of going through `tracing`'s formatter: the same line, byte for byte (text: tracing-subscriber's
/// default format without colours; `json`: its flattened JSON), at a fraction of the cost (a line is
/// written per request). Whether the access log is on is still decided by the `duet::access` target's
/// level (`RUST_LOG`). Returns false if a sink was already set.
pub fn set_access_log_sink(json: bool, write: impl Fn(&[u8]) + Send + Sync + 'static) -> bool {
    SINK.set(Sink {
        json,
        write: Box::new(write),
    })
    .is_ok()
}

impl AccessLog {
    /// The line, written field by field without the formatting machinery (a line per request is the
    /// default, and `write!` per field cost more than the rest of the request's handling in duet).
    fn format(&self, line: &mut String, json: bool, duration_ms: f64, upstream_head_ms: f64) {
        // One copy of the writer per format, so that each literal it pushes has a length known when
        // compiling: copied inline, not through a `memcpy` call per push.
        if json {
            self.write_line::<true>(line, duration_ms, upstream_head_ms);
        } else {
            self.write_line::<false>(line, duration_ms, upstream_head_ms);
        }
    }

    fn write_line<const JSON: bool>(
        &self,
        line: &mut String,
        duration_ms: f64,
        upstream_head_ms: f64,
    ) {
        push_timestamp::<JSON>(line);
        let mut fields = Fields::<JSON> { line };
        fields.address(name!("client"), |line| push_ip(line, self.client));
        fields.text(name!("method"), self.method.as_str());
        fields.client_text(name!("host"), self.host.as_ref(), ClientText::bare);
        let path = loggable_path(self.target.path());
        fields.client_text(name!("path"), Some(&*path), ClientText::bare);
        fields.text(name!("protocol"), protocol(self.version));
        fields.number(name!("status"), u64::from(self.status.as_u16()));
        fields.text(name!("cluster"), self.cluster.as_deref().unwrap_or("-"));
        match self.backend {
            Some(backend) => fields.address(name!("backend"), |line| push_socket(line, backend)),
            None => fields.text(name!("backend"), "-"),
        }
        if self.tried.is_empty() {
            fields.text(name!("tried"), "-");
        } else {
            fields.address(name!("tried"), |line| {
                for (i, backend) in self.tried.iter().enumerate() {
                    if i > 0 {
                        line.push(',');
                    }
                    push_socket(line, *backend);
                }
            });
        }
        fields.number(name!("attempts"), u64::from(self.attempts));
        fields.text(name!("hedged"), self.hedged);
        fields.millis(name!("duration_ms"), duration_ms);
        fields.millis(name!("upstream_head_ms"), upstream_head_ms);
        fields.number(name!("bytes"), self.bytes);
        fields.number(name!("bytes_received"), self.received.bytes());
        fields.text(name!("outcome"), self.outcome);
        if let Some(code) = self.grpc_status {
            fields.number(name!("grpc_status"), u64::from(code));
        }
        fields.client_text(
            name!("user_agent"),
            self.user_agent.as_ref(),
            ClientText::quoted,
        );
        fields.client_text(
            name!("request_id"),
            Some(&self.request_id),
            ClientText::bare,
        );
        if JSON {
            line.push_str(",\"target\":\"duet::access\"}");
        }
        line.push('\n');
    }
}

/// The line's start: its UTC time to the microsecond (the date and time of day formatted once per
/// second), and its level and target.
fn push_timestamp<const JSON: bool>(line: &mut String) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    SECOND.with(|second| {
        let mut second = second.borrow_mut();
        if second.0 != now.as_secs() {
            use fmt::Write as _;
            let (date, time) = civil(now.as_secs());
            second.1.clear();
            let _ = write!(
                second.1,
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                date.0, date.1, date.2, time.0, time.1, time.2
            );
            second.0 = now.as_secs();
        }
        if JSON {
            line.push_str("{\"timestamp\":\"");
        }
        line.push_str(&second.1);
        line.push('.');
        push_padded(line, u64::from(now.subsec_micros()), 6);
        line.push_str(if JSON {
            "Z\",\"level\":\"INFO\""
        } else {
            "Z  INFO duet::access:"
        });
    });
}

/// Fields appended to a line: ` name=value` in text, `,"name":value` in JSON.
struct Fields<'a, const JSON: bool> {
    line: &'a mut String,
}

/// A field's name as each format writes it before the value, spelt out at compile time: one push per
/// field instead of three.
#[derive(Clone, Copy)]
struct Name {
    /// ` name=`
    text: &'static str,
    /// `,"name":`
    json: &'static str,
}

macro_rules! name {
    ($name:literal) => {
        Name {
            text: concat!(" ", $name, "="),
            json: concat!(",\"", $name, "\":"),
        }
    };
}
use name;

impl<const JSON: bool> Fields<'_, JSON> {
    #[inline(always)]
    fn name(&mut self, name: Name) {
        self.line.push_str(if JSON { name.json } else { name.text });
    }

    /// A string: quoted and escaped in JSON.
    #[inline(always)]
    fn text(&mut self, name: Name, value: &str) {
        self.name(name);
        if !JSON {
            self.line.push_str(value);
        } else if value.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            use fmt::Write as _;
            self.line.push('"');
            let _ = JsonEscaped(&mut *self.line).write_str(value);
            self.line.push('"');
        } else {
            self.line.push('"');
            self.line.push_str(value);
            self.line.push('"');
        }
    }

    /// What a client sent: in JSON a string as [`Fields::text`] writes it (`-` when absent or not
    /// visible ASCII), in text as `form` writes it.
    #[inline(always)]
    fn client_text<'v, V: ClientValue + ?Sized + 'v>(
        &mut self,
        name: Name,
        value: Option<&'v V>,
        form: fn(Option<&'v [u8]>) -> ClientText<'v>,
    ) {
        if JSON {
            self.text(name, value.and_then(ClientValue::as_text).unwrap_or("-"));
        } else {
            self.name(name);
            let _ = form(value.map(ClientValue::as_bytes)).write(&mut *self.line);
        }
    }

    /// Text that never needs escaping (addresses), written by `write`: quoted in JSON.
    #[inline(always)]
    fn address(&mut self, name: Name, write: impl FnOnce(&mut String)) {
        self.name(name);
        if JSON {
            self.line.push('"');
        }
        write(self.line);
        if JSON {
            self.line.push('"');
        }
    }

    #[inline(always)]
    fn number(&mut self, name: Name, value: u64) {
        self.name(name);
        self.line.push_str(itoa::Buffer::new().format(value));
    }

    /// Milliseconds rounded to the microsecond, written as `{:?}` writes them (`2.0`, `1.25`, `-1.0`).
    #[inline(always)]
    fn millis(&mut self, name: Name, ms: f64) {
        self.name(name);
        let micros = (ms * 1000.0).round();
        if !micros.is_finite() || micros.abs() >= 1e15 {
            use fmt::Write as _;
            let _ = write!(self.line, "{ms:?}");
            return;
        }
        let micros = micros as i64;
        if micros < 0 {
            self.line.push('-');
        }
        let micros = micros.unsigned_abs();
        self.line
            .push_str(itoa::Buffer::new().format(micros / 1000));
        self.line.push('.');
        let mut fraction = micros % 1000;
        if fraction == 0 {
            self.line.push('0');
            return;
        }
        let mut width = 3;
        while fraction.is_multiple_of(10) {
            fraction /= 10;
            width -= 1;
        }
        push_padded(self.line, fraction, width);
    }
}

/// `value` in decimal, left-padded with zeros to `width` digits.
fn push_padded(line: &mut String, value: u64, width: usize) {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(value);
    for _ in digits.len()..width {
        line.push('0');
    }
    line.push_str(digits);
}

fn push_ip(line: &mut String, ip: IpAddr) {
    match ip {
        IpAddr::V4(ip) => {
            let mut text = Short::default();
            text.ipv4(ip);
            line.push_str(text.as_str());
        }
        IpAddr::V6(ip) => {
            use fmt::Write as _;
            let _ = write!(line, "{ip}");
        }
    }
}

fn push_socket(line: &mut String, address: SocketAddr) {
    match address {
        SocketAddr::V4(address) => {
            let mut text = Short::default();
            text.ipv4(*address.ip());
            text.push(b':');
            text.decimal(address.port());
            line.push_str(text.as_str());
        }
        SocketAddr::V6(address) => {
            use fmt::Write as _;
            let _ = write!(line, "{address}");
        }
    }
}

/// An IPv4 address and port (at most 21 bytes), assembled on the stack and pushed onto the line at
/// once: a push per octet and separator cost more than the digits.
#[derive(Default)]
struct Short {
    bytes: [u8; 21],
    len: usize,
}

impl Short {
    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.bytes.get_mut(self.len) {
            *slot = byte;
            self.len += 1;
        }
    }

    fn decimal(&mut self, value: u16) {
        let start = self.len;
        let mut rest = value;
        loop {
            self.push(b'0' + (rest % 10) as u8);
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        self.bytes[start..self.len].reverse();
    }

    fn ipv4(&mut self, ip: std::net::Ipv4Addr) {
        for (i, octet) in ip.octets().into_iter().enumerate() {
            if i > 0 {
                self.push(b'.');
            }
            if octet >= 100 {
                self.push(b'0' + octet / 100);
            }
            if octet >= 10 {
                self.push(b'0' + octet / 10 % 10);
            }
            self.push(b'0' + octet % 10);
        }
    }

    fn as_str(&self) -> &str {
        // Digits and separators only: ASCII.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

/// The protocol as `{:?}` of [`Version`] writes it.
fn protocol(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "-",
    }
}

/// A value [`Fields::client_text`] writes: a field's value or a path.
trait ClientValue {
    fn as_bytes(&self) -> &[u8];
    /// The value as JSON logs it, if it is visible ASCII.
    fn as_text(&self) -> Option<&str>;
}

impl ClientValue for HeaderValue {
    fn as_bytes(&self) -> &[u8] {
        HeaderValue::as_bytes(self)
    }

    fn as_text(&self) -> Option<&str> {
        self.to_str().ok()
    }
}

impl ClientValue for str {
    fn as_bytes(&self) -> &[u8] {
        str::as_bytes(self)
    }

    fn as_text(&self) -> Option<&str> {
        Some(self)
    }
}

/// A value a client chose, in the text format: a plain token (visible ASCII but `"` and `\`) is
/// written bare, anything else quoted, with `"`, `\`, control and non-ASCII bytes escaped as `\xHH` as
/// nginx escapes its quoted fields; so a value cannot forge another field or break the line. Free text
/// (the user agent) is always quoted, as in nginx's `combined` format. `-` when there is none.
struct ClientText<'a> {
    value: Option<&'a [u8]>,
    always_quoted: bool,
}

impl<'a> ClientText<'a> {
    /// Quoted only when it is not a plain token.
    fn bare(value: Option<&'a [u8]>) -> Self {
        Self {
            value,
            always_quoted: false,
        }
    }

    /// Always quoted.
    fn quoted(value: Option<&'a [u8]>) -> Self {
        Self {
            value,
            always_quoted: true,
        }
    }

    /// Writes the value: straight into the line for duet's formatter, or through `Display` for
    /// tracing's, the same bytes either way.
    fn write(&self, out: &mut impl fmt::Write) -> fmt::Result {
        let value = self.value.unwrap_or(b"-");
        let plain = |b: &u8| b.is_ascii_graphic() && *b != b'"' && *b != b'\\';
        if !self.always_quoted && !value.is_empty() && value.iter().all(plain) {
            // Visible ASCII: valid UTF-8, so this never falls back.
            return out.write_str(std::str::from_utf8(value).unwrap_or("-"));
        }
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        out.write_char('"')?;
        let mut rest = value;
        while !rest.is_empty() {
            let run = rest
                .iter()
                .position(|b| !(*b == b' ' || plain(b)))
                .unwrap_or(rest.len());
            // Printable ASCII: valid UTF-8.
            out.write_str(std::str::from_utf8(&rest[..run]).unwrap_or_default())?;
            if let Some(&byte) = rest.get(run) {
                out.write_str("\\x")?;
                out.write_char(char::from(HEX[usize::from(byte >> 4)]))?;
                out.write_char(char::from(HEX[usize::from(byte & 0xf)]))?;
                rest = &rest[run + 1..];
            } else {
                rest = &[];
            }
        }
        out.write_char('"')
    }
}

impl fmt::Display for ClientText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f)
    }
}

/// Writes into a JSON string literal: quotes, backslashes and control characters escaped.
struct JsonEscaped<'a>(&'a mut String);

impl fmt::Write for JsonEscaped<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        for c in text.chars() {
            match c {
                '"' => self.0.push_str("\\\""),
                '\\' => self.0.push_str("\\\\"),
                '\n' => self.0.push_str("\\n"),
                '\r' => self.0.push_str("\\r"),
                '\t' => self.0.push_str("\\t"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.0, "\\u{:04x}", c as u32);
                }
                c => self.0.push(c),
            }
        }
        Ok(())
    }
}

/// The UTC date and time of `seconds` since the Unix epoch: ((year, month, day), (hour, minute,
/// second)), by Howard Hinnant's `civil_from_days`.
fn civil(seconds: u64) -> ((i64, u32, u32), (u64, u64, u64)) {
    let days = (seconds / 86_400) as i64;
    let of_day = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        (year, month, day),
        (of_day / 3_600, of_day % 3_600 / 60, of_day % 60),
    )
}

/// The path for the access log, cut at 512 bytes so an oversized target cannot flood the log.
fn loggable_path(path: &str) -> Cow<'_, str> {
    const MAX: usize = 512;
    if path.len() <= MAX {
        return Cow::Borrowed(path);
    }
    let mut end = MAX;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}...", &path[..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_path_is_cut_at_512_bytes_on_a_character_boundary() {
        assert!(matches!(loggable_path("/short"), Cow::Borrowed("/short")));
        let long = format!("/{}", "a".repeat(700));
        assert_eq!(loggable_path(&long), format!("{}...", &long[..512]));
        // 'é' is two bytes; one straddling byte 512 is left out whole.
        let straddling = format!("/{}{}", "a".repeat(510), "é".repeat(10));
        assert_eq!(
            loggable_path(&straddling),
            format!("{}...", &straddling[..511])
        );
    }

    #[test]
    fn numbers_and_addresses_are_written_as_the_formatting_machinery_writes_them() {
        let millis = |ms: f64| {
            let mut line = String::new();
            Fields::<false> { line: &mut line }.millis(name!("m"), ms);
            line
        };
        for ms in [
            0.0, 2.0, 1.25, 0.001, 1.23, 17.5, 999.999, 1234.5, -1.0, 60_000.0,
        ] {
            let rounded = (ms * 1000.0f64).round() / 1000.0;
            assert_eq!(millis(rounded), format!(" m={rounded:?}"), "{ms}");
        }
        for address in [
            "127.0.0.1:8080",
            "10.0.0.255:1",
            "255.255.255.255:65535",
            "0.0.0.0:0",
            "[::1]:443",
            "[2001:db8::7]:80",
        ] {
            let address: SocketAddr = address.parse().expect("address");
            let mut line = String::new();
            push_socket(&mut line, address);
            assert_eq!(line, address.to_string());
            let mut line = String::new();
            push_ip(&mut line, address.ip());
            assert_eq!(line, address.ip().to_string());
        }
        let mut line = String::new();
        push_padded(&mut line, 42, 6);
        assert_eq!(line, "000042");
        for version in [
            Version::HTTP_09,
            Version::HTTP_10,
            Version::HTTP_11,
            Version::HTTP_2,
        ] {
            assert_eq!(protocol(version), format!("{version:?}"));
        }
    }

    #[test]
    fn civil_dates_match_the_calendar() {
        assert_eq!(civil(0), ((1970, 1, 1), (0, 0, 0)));
        assert_eq!(civil(1_764_547_200), ((2025, 12, 1), (0, 0, 0)));
        assert_eq!(civil(951_782_400), ((2000, 2, 29), (0, 0, 0)));
        assert_eq!(civil(4_107_542_399), ((2100, 2, 28), (23, 59, 59)));
    }

    #[test]
    fn client_text_is_bare_only_when_it_is_a_plain_token() {
        let written = |text: ClientText<'_>| {
            let mut line = String::new();
            text.write(&mut line).expect("a String takes any text");
            assert_eq!(line, text.to_string(), "tracing's line is the same");
            line
        };
        assert_eq!(written(ClientText::bare(Some(b"/a=b?c"))), "/a=b?c");
        assert_eq!(written(ClientText::bare(None)), "-");
        assert_eq!(written(ClientText::bare(Some(b""))), "\"\"");
        assert_eq!(written(ClientText::bare(Some(b"a b"))), "\"a b\"");
        assert_eq!(written(ClientText::bare(Some(b"a\"b"))), r#""a\x22b""#);
        assert_eq!(written(ClientText::quoted(Some(b"curl/8"))), "\"curl/8\"");
        assert_eq!(written(ClientText::quoted(None)), "\"-\"");
        assert_eq!(
            written(ClientText::quoted(Some(
                b"x \"q\" \\ \t\x7f\xe2\x80\xa8\xc3\xa9 y=1"
            ))),
            r#""x \x22q\x22 \x5C \x09\x7F\xE2\x80\xA8\xC3\xA9 y=1""#
        );
    }

    #[test]
    fn json_strings_are_escaped() {
        use fmt::Write as _;
        let mut out = String::new();
        let _ = write!(JsonEscaped(&mut out), "a\"b\\c\nd\u{1}");
        assert_eq!(out, "a\\\"b\\\\c\\nd\\u0001");
    }
}
