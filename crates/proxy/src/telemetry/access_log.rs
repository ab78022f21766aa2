//! The access-log record of one request, written once when its response is finished.

use crate::{
    peer::{original_client, Client, TlsSession},
    spare::{self, SpareBoxes},
    telemetry::trace::{push_hex, SpanId, TraceId},
    telemetry::upload::Received,
};
use duet_balance::Draws;
use duet_config::{AccessLog as LogSettings, LogField, LogFormat};
use http::{
    header, uri::PathAndQuery, HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, Version,
};
use std::{
    borrow::Cow,
    cell::RefCell,
    fmt,
    mem::MaybeUninit,
    net::{IpAddr, SocketAddr},
    rc::Rc,
    sync::{Arc, OnceLock},
    time::{Duration, SystemTime, UNIX_EPOCH},
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
    target: Target,
    version: Version,
    host: Option<HeaderValue>,
    user_agent: Option<HeaderValue>,
    request_id: HeaderValue,
    client: IpAddr,
    started: Instant,
    pub(crate) status: StatusCode,
    pub(crate) cluster: Option<Arc<str>>,
    /// The route's name, once it picked its cluster.
    pub(crate) route: Option<Arc<str>>,
    pub(crate) backend: Option<SocketAddr>,
    /// Backends whose attempts failed before the last one.
    pub(crate) tried: Vec<SocketAddr>,
    /// Attempts sent to backends (0: none was picked), a hedge included.
    pub(crate) attempts: u32,
    /// Which attempt's response head came first when a filter raced two for the first attempt (the
    /// line's `hedged`: `first` or `hedge`; `-`: one attempt was sent, or neither answered).
    pub(crate) raced: &'static str,
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
    /// The request's trace and duet's span of it, when the request is traced.
    pub(crate) trace: Option<(TraceId, SpanId)>,
    /// The answering attempt's time to open its connection, when it opened one (not pooled).
    pub(crate) connect_ms: Option<f64>,
    /// The `Referer`, when the line has that field.
    referer: Option<HeaderValue>,
    /// The user a route's `auth:` let in, when the line has that field ([`AccessLog::wants_user`]).
    pub(crate) user: Option<HeaderValue>,
    /// What the client's TLS connection negotiated, when the line has a field of it.
    tls: Option<TlsSession>,
    /// The line's fields and sample, as the config in force when the request arrived says.
    layout: Rc<LineFormat>,
    /// Whether [`AccessLog::finish`] wrote the line (otherwise dropping the record writes it).
    written: bool,
}

/// What an access-log line holds, built once per config (`access_log:`): the fields in their order,
/// each written by its own arm of [`AccessLog::write_field`] (no name is looked up per request), what
/// a record must capture for them, and the share of successful requests whose lines are written.
#[derive(Debug)]
pub(crate) struct LineFormat {
    /// `Some(true)` for JSON; `None`: the sink's (`--log-format`).
    json: Option<bool>,
    /// nginx's `combined` line instead of duet's fields ([`AccessLog::write_combined`]).
    combined: bool,
    fields: Box<[LogField]>,
    /// A successful request's line is written when a 32-bit draw is below this; `None`: always.
    keep_below: Option<u64>,
    /// Whether `fields` is the default line ([`AccessLog::write_default_fields`]).
    default_fields: bool,
    wants_referer: bool,
    wants_user: bool,
    wants_tls: bool,
}

impl LineFormat {
    pub(crate) fn new(settings: &LogSettings) -> Self {
        let has = |field| settings.fields.contains(&field);
        let ratio = settings.sample_success.clamp(0.0, 1.0);
        let combined = settings.format == Some(LogFormat::Combined);
        Self {
            json: settings.format.map(|format| format == LogFormat::Json),
            combined,
            fields: settings.fields.clone().into_boxed_slice(),
            keep_below: (ratio < 1.0).then_some((ratio * 4_294_967_296.0) as u64),
            default_fields: settings.fields == LogField::DEFAULT,
            wants_referer: combined || has(LogField::Referer),
            wants_user: combined || has(LogField::User),
            wants_tls: has(LogField::TlsVersion) || has(LogField::Sni),
        }
    }

    /// Whether `record`'s line is written: always for a request that failed, for a successful one
    /// (below 400, ended cleanly, no gRPC error) as `sample_success` says.
    fn keeps(&self, record: &AccessLog) -> bool {
        let Some(below) = self.keep_below else {
            return true;
        };
        if !record.succeeded() {
            return true;
        }
        below > 0 && SAMPLE_DRAWS.with_borrow_mut(|draws| draws.next_draw() >> 32) < below
    }
}

impl Default for LineFormat {
    fn default() -> Self {
        Self::new(&LogSettings::default())
    }
}

thread_local! {
    /// Each worker's draws for `sample_success`.
    static SAMPLE_DRAWS: RefCell<Draws> = RefCell::new(Draws::from_os());
}

/// Writes every field of the `AccessLog` that `$record` (a `*mut AccessLog` to uninitialised memory)
/// points to, each value as soon as it is made: no record assembled on the stack first.
macro_rules! write_fields {
    ($record:ident, $($field:ident: $value:expr),* $(,)?) => {{
        // Every field is written, once: naming one twice or leaving one out fails to compile
        // (`_every_field`'s pattern, of the same names, has no `..`).
        $(
            let value = $value;
            // SAFETY: `$record` points to memory valid for writes of an `AccessLog` and aligned;
            // the field's place is written without reading or dropping what was there.
            #[allow(unsafe_code)]
            unsafe {
                std::ptr::addr_of_mut!((*$record).$field).write(value);
            }
        )*
        #[allow(dead_code)]
        fn _every_field(record: &AccessLog) {
            let AccessLog { $($field: _),* } = record;
        }
    }};
}

impl AccessLog {
    /// A record for `request` from `client` (on a connection that negotiated `tls`, if it is TLS),
    /// its line as `format` says, if the access log is enabled (target `duet::access` at info).
    pub(crate) fn start<B>(
        request: &Request<B>,
        started: Instant,
        client: Client,
        request_id: HeaderValue,
        format: &Rc<LineFormat>,
        tls: Option<&TlsSession>,
    ) -> Option<Box<Self>> {
        let enabled = match SINK.get() {
            Some(sink) => sink.enabled,
            None => tracing::enabled!(target: "duet::access", tracing::Level::INFO),
        };
        if !enabled {
            return None;
        }
        let (host, user_agent) = host_and_user_agent(request.headers());
        let host = routed_host(request.uri()).or_else(|| host.cloned());
        let referer = (format.wants_referer)
            .then(|| request.headers().get(header::REFERER).cloned())
            .flatten();
        let tls = tls.filter(|_| format.wants_tls).cloned();
        // Boxed: the record travels with the request through every stage and into the response body,
        // and a pointer moves where several hundred bytes would be copied at each step. In a box a finished
        // record left behind, when there is one, written field by field: a record made as a value is
        // assembled on the stack and then copied into the box (about 130 instructions).
        let mut slot = spare::slot(&SPARE_RECORDS);
        let record = slot.as_mut_ptr();
        write_fields! {
            record,
            method: request.method().clone(),
            target: Target::of(request.uri()),
            version: request.version(),
            host: host,
            user_agent: user_agent.cloned(),
            request_id: request_id,
            client: original_client(request.headers(), client),
            started: started,
            status: StatusCode::OK,
            cluster: None,
            route: None,
            backend: None,
            tried: Vec::new(),
            attempts: 0,
            raced: "-",
            upstream_head_ms: None,
            bytes: 0,
            received: Received::Known(0),
            outcome: "client_gone",
            grpc_status: None,
            trace: None,
            connect_ms: None,
            referer: referer,
            user: None,
            tls: tls,
            layout: format.clone(),
            written: false,
        }
        // SAFETY: every field of the record was written just above (`_every_field`'s pattern, which
        // names each field once and lists all of them, or it would not compile).
        #[allow(unsafe_code)]
        Some(unsafe { slot.assume_init() })
    }

    /// Whether the line has the `user` field: the auth filters tell the record the user only then.
    pub(crate) fn wants_user(&self) -> bool {
        self.layout.wants_user
    }

    /// Whether the request succeeded, for `sample_success`: a status below 400, a response that ended
    /// cleanly, and no gRPC error.
    fn succeeded(&self) -> bool {
        self.status.as_u16() < 400
            && !matches!(
                self.outcome,
                "client_gone" | "backend_error" | "backend_read_timeout"
            )
            && matches!(self.grpc_status, None | Some(0))
    }
}

impl AccessLog {
    /// The request's route picked `cluster`: the line names both.
    pub(crate) fn routed(&mut self, cluster: &Arc<str>, route: &Arc<str>) {
        self.cluster = Some(cluster.clone());
        self.route = Some(route.clone());
    }
}

thread_local! {
    /// The boxes of finished records, for this thread's next requests (more than a worker has
    /// requests in flight at once, mostly).
    static SPARE_RECORDS: SpareBoxes<AccessLog> = const { SpareBoxes::new(64) };
}

/// The first `Host` and `User-Agent` values, as `HeaderMap::get` finds them: in one walk over a short
/// head (a client of an API sends a handful of fields), cheaper than two hashed look-ups. Borrowed:
/// two pointers come back in registers, where two values came back through memory, and each is
/// cloned straight into the record.
fn host_and_user_agent(headers: &HeaderMap) -> (Option<&HeaderValue>, Option<&HeaderValue>) {
    if headers.len() > 8 {
        return (headers.get(header::HOST), headers.get(header::USER_AGENT));
    }
    let (mut host, mut user_agent) = (None, None);
    for (name, value) in headers {
        if host.is_none() && name == header::HOST {
            host = Some(value);
        } else if user_agent.is_none() && name == header::USER_AGENT {
            user_agent = Some(value);
        }
    }
    (host, user_agent)
}

/// The host routing goes by when the target names one (an absolute-form target, HTTP/2's
/// `:authority`): the Host field beside it is not what the request was routed on, and HTTP/2 often
/// sends none.
fn routed_host(target: &Uri) -> Option<HeaderValue> {
    HeaderValue::from_str(target.authority()?.as_str()).ok()
}

/// A request's target, kept for its line: of an origin-form target (`/path?query`, what HTTP/1.1
/// clients send) its path and query alone, one shared slice to clone and drop instead of a whole
/// `Uri`'s three parts; any other as it came.
enum Target {
    /// A target of no scheme and no authority, with a path.
    Origin(PathAndQuery),
    Other(Uri),
}

impl Target {
    fn of(target: &Uri) -> Self {
        match target.path_and_query() {
            Some(origin) if target.scheme().is_none() && target.authority().is_none() => {
                Self::Origin(origin.clone())
            }
            _ => Self::Other(target.clone()),
        }
    }

    /// `Uri::path`'s: of an origin-form target, that of its path and query (`Uri::path` takes it from
    /// there when it has one).
    #[inline]
    fn path(&self) -> &str {
        match self {
            Self::Origin(origin) => origin.path(),
            Self::Other(target) => target.path(),
        }
    }

    fn query(&self) -> Option<&str> {
        match self {
            Self::Origin(origin) => origin.query(),
            Self::Other(target) => target.query(),
        }
    }
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
        if !self.written {
            self.write(self.started.elapsed(), None);
        }
    }
}

impl AccessLog {
    /// Writes the line now, at the end of the attempt that answered: `duration` is the request's,
    /// measured by the caller from the same clock reading its latency histogram took (one reading
    /// serves both), and `backend_text` is [`AccessLog::backend`] already formatted.
    pub(crate) fn finish(mut self: Box<Self>, duration: Duration, backend_text: &str) {
        self.write(duration, Some(backend_text));
        self.written = true;
        spare::recycle(&SPARE_RECORDS, self);
    }

    fn write(&self, duration: Duration, backend_text: Option<&str>) {
        if !self.layout.keeps(self) {
            return;
        }
        // Milliseconds with microsecond precision, as numbers (in JSON too).
        let millis = |ms: f64| round(ms * 1000.0) / 1000.0;
        let duration_ms = millis(duration.as_secs_f64() * 1000.0);
        // No backend answered: no wait for a head to write (absent in text, `null` in JSON).
        let upstream_head_ms = self.upstream_head_ms.map(millis);
        if let Some(sink) = SINK.get() {
            (sink.write)(&mut |line| {
                let now = since_epoch();
                if self.layout.combined {
                    return self.write_combined(line, now);
                }
                self.format(
                    line,
                    self.layout.json.unwrap_or(sink.json),
                    (now, duration_ms, upstream_head_ms, backend_text),
                )
            });
            return;
        }
        if self.layout.combined {
            let now = since_epoch();
            let mut line = Vec::new();
            self.write_combined(&mut line, now);
            let line = String::from_utf8_lossy(&line);
            tracing::info!(target: "duet::access", "{}", line.trim_end());
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
            route = self.route.as_deref(),
            backend = %OrDash(self.backend),
            tried = %Joined(&self.tried),
            attempts = self.attempts,
            "hedged" = %self.raced,
            duration_ms,
            upstream_head_ms,
            bytes = self.bytes,
            bytes_received = self.received.bytes(),
            outcome = %self.outcome,
            grpc_status = %OrDash(self.grpc_status),
            user_agent = %ClientText::quoted(self.user_agent.as_ref().map(HeaderValue::as_bytes)),
            request_id = %ClientText::bare(Some(self.request_id.as_bytes())),
            trace_id = self.trace.map(|(t, s)| trace_ids(&t, &s)[..32].to_owned()),
            span_id = self.trace.map(|(t, s)| trace_ids(&t, &s)[32..].to_owned()),
        );
    }
}

/// The time of day, since the Unix epoch (none before it): the line's timestamp.
#[cfg(target_os = "linux")]
fn since_epoch() -> Duration {
    let mut now = MaybeUninit::<libc::timespec>::uninit();
    // SAFETY: `clock_gettime` writes the `timespec` it is given, and only reads its clock id.
    // `SystemTime::now()` reads the same clock; its `duration_since(UNIX_EPOCH)`, the general
    // subtraction of two times, cost about 40 instructions more per line than this.
    #[allow(unsafe_code)]
    let now = unsafe {
        if libc::clock_gettime(libc::CLOCK_REALTIME, now.as_mut_ptr()) != 0 {
            return since_epoch_std();
        }
        now.assume_init()
    };
    match (u64::try_from(now.tv_sec), u32::try_from(now.tv_nsec)) {
        (Ok(seconds), Ok(nanos)) if nanos < 1_000_000_000 => Duration::new(seconds, nanos),
        _ => since_epoch_std(),
    }
}

#[cfg(not(target_os = "linux"))]
fn since_epoch() -> Duration {
    since_epoch_std()
}

/// [`since_epoch`] as the standard library reads it.
#[cold]
fn since_epoch_std() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Where access-log lines go when duet formats them itself, set once by the binary with
/// [`set_access_log_sink`].
struct Sink {
    json: bool,
    /// Whether the `duet::access` target is enabled at info, asked of `tracing` once, when the sink was
    /// set (the filter is fixed at start-up): a line per request makes even the subscriber's check
    /// (about a hundred instructions) worth saving.
    enabled: bool,
    write: WriteLine,
}

type WriteLine = Box<dyn Fn(&mut dyn FnMut(&mut Vec<u8>)) + Send + Sync>;

static SINK: OnceLock<Sink> = OnceLock::new();

thread_local! {
    /// The formatted date and time of the current second, reused for every line within it.
    static SECOND: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Formats access-log lines in duet itself, each appended (one line, ending in `\n`) to the buffer
/// `write` passes to the function it is given, instead of going through `tracing`'s formatter: the same line, byte for byte (text: tracing-subscriber's
/// default format without colours; `json`: its flattened JSON), at a fraction of the cost (a line is
/// written per request). Whether the access log is on is still decided by the `duet::access` target's
/// level (`RUST_LOG`), asked of `tracing` here, once: set the sink after the subscriber. Returns false
/// if a sink was already set.
pub fn set_access_log_sink(
    json: bool,
    write: impl Fn(&mut dyn FnMut(&mut Vec<u8>)) + Send + Sync + 'static,
) -> bool {
    SINK.set(Sink {
        json,
        enabled: tracing::enabled!(target: "duet::access", tracing::Level::INFO),
        write: Box::new(write),
    })
    .is_ok()
}

/// The default line (most logs' line) as one call per field with the field a constant, each inlined
/// to its own writer: no dispatch per field, as when the line's fields were fixed. The order is
/// `LogField::DEFAULT`'s (a test holds them equal).
macro_rules! default_fields {
    ($($field:ident),* $(,)?) => {
        /// The fields of the default line, in the order [`AccessLog::write_default_fields`] writes them.
        #[cfg_attr(
            not(test),
            expect(dead_code, reason = "a test holds it equal to `LogField::DEFAULT`")
        )]
        const DEFAULT_FIELDS: &'static [LogField] = &[$(LogField::$field),*];

        /// Inlined into [`AccessLog::format`], as [`AccessLog::write_line`] is.
        #[inline(always)]
        fn write_default_fields<const JSON: bool, O: Out>(
            &self,
            fields: &mut Fields<'_, JSON, O>,
            values: LineValues<'_>,
        ) {
            $(self.write_field(fields, LogField::$field, values);)*
        }
    };
}

impl AccessLog {
    /// The line, written field by field without the formatting machinery (a line per request is the
    /// default, and `write!` per field cost more than the rest of the request's handling in duet).
    fn format(&self, line: &mut Vec<u8>, json: bool, values: LineValues<'_>) {
        // Into the room already at the end of the buffer (a worker's has at least a kilobyte to
        // spare): each push a copy and a length check, not the `Vec`'s reload of its length,
        // capacity and pointer and store of its length.
        line.reserve(ROOM);
        let start = line.len();
        let mut room = Room::new(line.spare_capacity_mut());
        // One copy of the writer per format, so that each literal it pushes has a length known when
        // compiling: copied inline, not through a `memcpy` call per push.
        if json {
            self.write_line::<true, _>(&mut room, values);
        } else {
            self.write_line::<false, _>(&mut room, values);
        }
        if let Some(written) = room.written() {
            // SAFETY: `Room::written` is the length of the prefix of the spare capacity its writes
            // initialised (each takes the bytes it writes off the front of what is left, so the
            // written ones are contiguous from the start), at most the spare capacity's length, so
            // `start + written` is within the capacity and every byte up to it is initialised.
            #[allow(unsafe_code)]
            unsafe {
                line.set_len(start + written);
            }
            return;
        }
        self.format_grown(line, json, values);
    }

    /// A line longer than the room (a long path or user agent): written again, growing the buffer.
    #[cold]
    #[inline(never)]
    fn format_grown(&self, line: &mut Vec<u8>, json: bool, values: LineValues<'_>) {
        if json {
            self.write_line::<true, _>(line, values);
        } else {
            self.write_line::<false, _>(line, values);
        }
    }

    /// Inlined into [`AccessLog::format`]: the [`Room`] handed to a function of its own would be
    /// kept in memory, its pointer and length stored and loaded again by every push.
    #[inline(always)]
    fn write_line<const JSON: bool, O: Out>(&self, line: &mut O, values: LineValues<'_>) {
        push_timestamp::<JSON, O>(line, values.0);
        let mut fields = Fields::<JSON, O> { line };
        if self.layout.default_fields {
            self.write_default_fields(&mut fields, values);
        } else {
            for field in &self.layout.fields {
                self.write_field(&mut fields, *field, values);
            }
        }
        // A traced request's ids, whatever the field list: they tie its line to its trace.
        if let Some((trace_id, span_id)) = &self.trace {
            let ids = trace_ids(trace_id, span_id);
            let (trace_id, span_id) = ids.split_at(32);
            fields.text(name!("trace_id"), trace_id);
            fields.text(name!("span_id"), span_id);
        }
        if JSON {
            line.put(b",\"target\":\"duet::access\"}");
        }
        line.byte(b'\n');
    }

    default_fields! {
        Client, Method, Host, Path, Protocol, Status, Cluster, Route, Backend, Tried, Attempts,
        Hedged, DurationMs, UpstreamHeadMs, Bytes, BytesReceived, Outcome, GrpcStatus, UserAgent,
        RequestId,
    }

    /// One field: what the request asked for and who asked (the answer's fields are
    /// [`AccessLog::write_answer_field`]'s).
    #[inline(always)]
    fn write_field<const JSON: bool, O: Out>(
        &self,
        fields: &mut Fields<'_, JSON, O>,
        field: LogField,
        values: LineValues<'_>,
    ) {
        match field {
            LogField::Client => {
                fields.open_address(name!("client"));
                push_ip(fields.line, self.client);
                fields.close_address();
            }
            LogField::Method => fields.text(name!("method"), self.method.as_str()),
            LogField::Host => {
                fields.client_text(name!("host"), self.host.as_ref(), ClientText::bare)
            }
            LogField::Path => {
                let path = loggable_path(self.target.path());
                fields.client_text(name!("path"), Some(&*path), ClientText::bare);
            }
            LogField::Query => {
                let query = self.target.query().map(loggable_path);
                fields.client_text(name!("query"), query.as_deref(), ClientText::bare);
            }
            LogField::Protocol => fields.text(name!("protocol"), protocol(self.version)),
            LogField::UserAgent => {
                let agent = self.user_agent.as_ref();
                fields.client_text(name!("user_agent"), agent, ClientText::quoted);
            }
            LogField::Referer => {
                let referer = self.referer.as_ref();
                fields.client_text(name!("referer"), referer, ClientText::quoted);
            }
            LogField::RequestId => {
                let id = Some(&self.request_id);
                fields.client_text(name!("request_id"), id, ClientText::bare);
            }
            LogField::User => {
                fields.client_text(name!("user"), self.user.as_ref(), ClientText::bare)
            }
            LogField::TlsVersion => {
                let version = self.tls.as_ref().map(|tls| tls.version);
                fields.maybe_text(name!("tls_version"), version);
            }
            LogField::Sni => {
                let sni = self.tls.as_ref().and_then(|tls| tls.sni.as_deref());
                fields.client_text(name!("sni"), sni, ClientText::bare);
            }
            _ => self.write_answer_field(fields, field, values),
        }
    }

    /// One field of where the request went and how it was answered.
    #[inline(always)]
    fn write_answer_field<const JSON: bool, O: Out>(
        &self,
        fields: &mut Fields<'_, JSON, O>,
        field: LogField,
        (_, duration_ms, upstream_head_ms, backend_text): LineValues<'_>,
    ) {
        match field {
            LogField::Status => fields.status(name!("status"), self.status),
            LogField::Cluster => fields.maybe_text(name!("cluster"), self.cluster.as_deref()),
            LogField::Route => match self.route.as_deref() {
                Some(route) => fields.text(name!("route"), route),
                None => fields.null(name!("route")),
            },
            LogField::Backend => match (self.backend, backend_text) {
                (Some(_), Some(text)) => {
                    fields.open_address(name!("backend"));
                    fields.line.put(text.as_bytes());
                    fields.close_address();
                }
                (Some(backend), None) => {
                    fields.open_address(name!("backend"));
                    push_socket(fields.line, backend);
                    fields.close_address();
                }
                (None, _) => fields.maybe_text(name!("backend"), None),
            },
            LogField::Tried => self.write_tried(fields),
            LogField::Attempts => fields.number(name!("attempts"), u64::from(self.attempts)),
            LogField::Hedged => {
                let raced = Some(self.raced).filter(|raced| *raced != "-");
                fields.maybe_text(name!("hedged"), raced);
            }
            LogField::DurationMs => fields.millis(name!("duration_ms"), duration_ms),
            LogField::UpstreamHeadMs => match upstream_head_ms {
                Some(ms) => fields.millis(name!("upstream_head_ms"), ms),
                None => fields.null(name!("upstream_head_ms")),
            },
            LogField::ConnectMs => match self.connect_ms {
                Some(ms) => fields.millis(name!("connect_ms"), ms),
                None => fields.null(name!("connect_ms")),
            },
            LogField::Bytes => fields.number(name!("bytes"), self.bytes),
            LogField::BytesReceived => {
                fields.number(name!("bytes_received"), self.received.bytes())
            }
            LogField::Outcome => fields.text(name!("outcome"), self.outcome),
            LogField::GrpcStatus => {
                if let Some(code) = self.grpc_status {
                    fields.number(name!("grpc_status"), u64::from(code));
                }
            }
            // The request's own fields are `write_field`'s.
            _ => {}
        }
    }

    /// `tried`: the backends tried before the one that answered, comma-separated.
    #[inline(always)]
    fn write_tried<const JSON: bool, O: Out>(&self, fields: &mut Fields<'_, JSON, O>) {
        if self.tried.is_empty() {
            return fields.maybe_text(name!("tried"), None);
        }
        fields.open_address(name!("tried"));
        for (i, backend) in self.tried.iter().enumerate() {
            if i > 0 {
                fields.line.byte(b',');
            }
            push_socket(fields.line, *backend);
        }
        fields.close_address();
    }
}

impl AccessLog {
    /// nginx's `combined` line, byte for byte as nginx writes it (`$remote_addr - $remote_user
    /// [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"`), so
    /// that the tools written for it read it unchanged. `$time_local` is UTC (`+0000`): duet reads
    /// no time zone. `$request` is the request line as nginx rebuilds it: the target as sent, query
    /// included (as nginx logs it), cut at 512 bytes; HTTP/2's the path, as nginx's.
    fn write_combined(&self, line: &mut Vec<u8>, now: Duration) {
        use std::io::Write as _;
        let ((year, month, day), (hour, minute, second)) = civil(now.as_secs());
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        let month = MONTHS[(month as usize).saturating_sub(1) % 12];
        push_ip(line, self.client);
        line.put(b" - ");
        push_nginx_escaped(line, self.user.as_ref().map(HeaderValue::as_bytes));
        let _ = write!(
            line,
            " [{day:02}/{month}/{year:04}:{hour:02}:{minute:02}:{second:02} +0000] \""
        );
        let target = match &self.target {
            Target::Origin(origin) => loggable_path(origin.as_str()),
            Target::Other(target) => match target.path_and_query() {
                Some(origin) if self.version == Version::HTTP_2 || target.scheme().is_none() => {
                    loggable_path(origin.as_str())
                }
                _ => Cow::Owned(loggable_path(&target.to_string()).into_owned()),
            },
        };
        line.put(self.method.as_str().as_bytes());
        line.byte(b' ');
        push_nginx_escaped(line, Some(target.as_bytes()));
        line.byte(b' ');
        line.put(protocol(self.version).as_bytes());
        line.put(b"\" ");
        push_decimal(line, u64::from(self.status.as_u16()));
        line.byte(b' ');
        push_decimal(line, self.bytes);
        line.put(b" \"");
        push_nginx_escaped(line, self.referer.as_ref().map(HeaderValue::as_bytes));
        line.put(b"\" \"");
        push_nginx_escaped(line, self.user_agent.as_ref().map(HeaderValue::as_bytes));
        line.put(b"\"\n");
    }
}

/// A value of nginx's line as nginx's default `escape` writes it: `"`, `\`, control and non-ASCII
/// bytes as `\xHH`, so a client cannot forge a field; `-` when there is none (or it is empty).
fn push_nginx_escaped(line: &mut Vec<u8>, value: Option<&[u8]>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let value = value.filter(|value| !value.is_empty()).unwrap_or(b"-");
    for &byte in value {
        if byte == b'"' || byte == b'\\' || !(0x20..0x7f).contains(&byte) {
            line.extend_from_slice(&[
                b'\\',
                b'x',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 0xf)],
            ]);
        } else {
            line.push(byte);
        }
    }
}

/// A trace's id and a span's, in lowercase hex, one after the other (32 and 16 digits).
fn trace_ids(trace_id: &TraceId, span_id: &SpanId) -> String {
    let mut ids = Vec::with_capacity(48);
    push_hex(&mut ids, trace_id);
    push_hex(&mut ids, span_id);
    String::from_utf8(ids).unwrap_or_default()
}

/// The clock's reading for the line's timestamp (since the Unix epoch), its duration and response-head
/// time in milliseconds, and its backend's address already formatted.
type LineValues<'a> = (Duration, f64, Option<f64>, Option<&'a str>);

/// Spare capacity a line is written into, reserved at the end of the buffer beforehand.
const ROOM: usize = 1024;

/// Where a line's bytes go: the buffer itself, or the [`Room`] at its end.
trait Out {
    fn put(&mut self, bytes: &[u8]);
    fn byte(&mut self, byte: u8);
}

impl Out for Vec<u8> {
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }

    #[inline(always)]
    fn byte(&mut self, byte: u8) {
        self.push(byte);
    }
}

/// A buffer's spare capacity, written from its start: what is left of it is a slice whose pointer and
/// length stay in registers, one comparison per write. A write that does not fit marks it overflowed
/// (the line is then written again into the buffer itself).
struct Room<'a> {
    rest: &'a mut [MaybeUninit<u8>],
    size: usize,
    overflowed: bool,
}

impl<'a> Room<'a> {
    fn new(spare: &'a mut [MaybeUninit<u8>]) -> Self {
        Self {
            size: spare.len(),
            rest: spare,
            overflowed: false,
        }
    }

    /// How many bytes from the start were written, unless a write did not fit.
    fn written(&self) -> Option<usize> {
        (!self.overflowed).then(|| self.size - self.rest.len())
    }
}

impl Out for Room<'_> {
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        if bytes.len() > self.rest.len() {
            self.overflowed = true;
            return;
        }
        let (head, tail) = std::mem::take(&mut self.rest).split_at_mut(bytes.len());
        // (`<[MaybeUninit<u8>]>::write_copy_of_slice`, from Rust 1.93, past the MSRV.)
        // SAFETY: `head` is exactly `bytes.len()` bytes, writable, and cannot overlap `bytes` (it is
        // borrowed mutably while `bytes` is borrowed); `MaybeUninit<u8>` has `u8`'s layout.
        #[allow(unsafe_code)]
        unsafe {
            copy_short(bytes.as_ptr(), head.as_mut_ptr().cast::<u8>(), bytes.len());
        }
        self.rest = tail;
    }

    #[inline(always)]
    fn byte(&mut self, byte: u8) {
        match std::mem::take(&mut self.rest).split_first_mut() {
            Some((head, tail)) => {
                head.write(byte);
                self.rest = tail;
            }
            None => self.overflowed = true,
        }
    }
}

/// Copies `len` bytes from `src` to `dst`: up to 32 as two loads and two stores of a width that fits,
/// overlapping in the middle, inline; longer ones through `copy_nonoverlapping`. Most of a line's
/// values (an address, a path, a request id, a number's digits) are short and of a length known only
/// when running, which `copy_nonoverlapping` copies by a call to `memcpy` (a call and its dispatch on
/// the length, about twice the instructions). A length known when compiling keeps one branch.
///
/// # Safety
///
/// `src` must be valid for reading `len` bytes and `dst` for writing them, and the two must not
/// overlap.
#[inline(always)]
#[allow(unsafe_code)]
unsafe fn copy_short(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY (each arm): `copy_ends`'s width is at most `len`, the caller's promise is `copy_short`'s.
    unsafe {
        if len > 32 {
            std::ptr::copy_nonoverlapping(src, dst, len);
        } else if len >= 16 {
            copy_ends::<u128>(src, dst, len);
        } else if len >= 8 {
            copy_ends::<u64>(src, dst, len);
        } else if len >= 4 {
            copy_ends::<u32>(src, dst, len);
        } else if len >= 2 {
            copy_ends::<u16>(src, dst, len);
        } else if len == 1 {
            *dst = *src;
        }
    }
}

/// Copies the first and the last `size_of::<T>()` of `len` bytes, overlapping in the middle: all of
/// them when `len` is at most twice the width.
///
/// # Safety
///
/// As [`copy_short`], and `size_of::<T>() <= len`.
#[inline(always)]
#[allow(unsafe_code)]
unsafe fn copy_ends<T: Copy>(src: *const u8, dst: *mut u8, len: usize) {
    use std::ptr::{read_unaligned, write_unaligned};
    let width = std::mem::size_of::<T>();
    // SAFETY: both copies are within the first `len` bytes of `src` and of `dst` (they start at 0
    // and at `len - width`, with `width <= len`); unaligned reads and writes of plain integers, with
    // no overlap between `src` and `dst` as the caller promises.
    unsafe {
        let (first, last) = (
            read_unaligned(src.cast::<T>()),
            read_unaligned(src.add(len - width).cast::<T>()),
        );
        write_unaligned(dst.cast::<T>(), first);
        write_unaligned(dst.add(len - width).cast::<T>(), last);
    }
}

/// What goes through the formatting machinery (rare values: IPv6 addresses, huge durations), put on
/// the line at once: the [`Room`] is never handed to a function of its own, so its pointer and length
/// can stay in registers.
#[inline(never)]
fn formatted(value: fmt::Arguments<'_>) -> Formatted {
    use fmt::Write as _;
    let mut text = Formatted {
        bytes: [0; 64],
        len: 0,
        spilled: String::new(),
    };
    let _ = text.write_fmt(value);
    text
}

/// A short text formatted on the stack (an IPv6 address and port is at most 58 bytes, a float's
/// `{:?}` 24), in a `String` past 64 bytes.
struct Formatted {
    bytes: [u8; 64],
    len: usize,
    spilled: String,
}

impl Formatted {
    fn as_bytes(&self) -> &[u8] {
        if self.spilled.is_empty() {
            &self.bytes[..self.len]
        } else {
            self.spilled.as_bytes()
        }
    }
}

impl fmt::Write for Formatted {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        if self.spilled.is_empty() {
            if let Some(slot) = self.bytes.get_mut(self.len..self.len + text.len()) {
                slot.copy_from_slice(text.as_bytes());
                self.len += text.len();
                return Ok(());
            }
            self.spilled
                .push_str(std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default());
        }
        self.spilled.push_str(text);
        Ok(())
    }
}

/// The line's start: its UTC time to the microsecond (the date and time of day formatted once per
/// second), and its level and target.
fn push_timestamp<const JSON: bool, O: Out>(line: &mut O, now: Duration) {
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
            line.put(b"{\"timestamp\":\"");
        }
        line.put(second.1.as_bytes());
        line.byte(b'.');
        // Six digits, zeros included: two groups of three, no general conversion.
        let micros = u64::from(now.subsec_micros());
        let (high, low) = (three_digits(micros / 1000), three_digits(micros % 1000));
        line.put(&[high[0], high[1], high[2], low[0], low[1], low[2]]);
        line.put(if JSON {
            b"Z\",\"level\":\"INFO\""
        } else {
            b"Z  INFO duet::access:"
        });
    });
}

/// Fields appended to a line: ` name=value` in text, `,"name":value` in JSON.
struct Fields<'a, const JSON: bool, O: Out> {
    line: &'a mut O,
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

impl<const JSON: bool, O: Out> Fields<'_, JSON, O> {
    #[inline(always)]
    fn name(&mut self, name: Name) {
        self.line
            .put(if JSON { name.json } else { name.text }.as_bytes());
    }

    /// A string: quoted and escaped in JSON.
    #[inline(always)]
    fn text(&mut self, name: Name, value: &str) {
        self.name(name);
        if !JSON {
            self.line.put(value.as_bytes());
        } else if value.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            use fmt::Write as _;
            self.line.byte(b'"');
            let mut escaped = String::new();
            let _ = JsonEscaped(&mut escaped).write_str(value);
            self.line.put(escaped.as_bytes());
            self.line.byte(b'"');
        } else {
            self.line.byte(b'"');
            self.line.put(value.as_bytes());
            self.line.byte(b'"');
        }
    }

    /// A string, or when there is none `-` in text and `null` in JSON.
    #[inline(always)]
    fn maybe_text(&mut self, name: Name, value: Option<&str>) {
        match value {
            Some(value) => self.text(name, value),
            None if JSON => {
                self.name(name);
                self.line.put(b"null");
            }
            None => self.text(name, "-"),
        }
    }

    /// What a client sent: in JSON a string as [`Fields::text`] writes it (`-` when not visible
    /// ASCII, `null` when absent), in text as `form` writes it.
    #[inline(always)]
    fn client_text<'v, V: ClientValue + ?Sized + 'v>(
        &mut self,
        name: Name,
        value: Option<&'v V>,
        form: fn(Option<&'v [u8]>) -> ClientText<'v>,
    ) {
        if JSON {
            match value {
                Some(value) => self.text(name, value.as_text().unwrap_or("-")),
                None => self.maybe_text(name, None),
            }
        } else {
            self.name(name);
            form(value.map(ClientValue::as_bytes)).push(self.line);
        }
    }

    /// Opens text that never needs escaping (addresses), written next on [`Fields::line`] and
    /// closed by [`Fields::close_address`]: quoted in JSON. Two calls, not one taking the writing as
    /// a closure: a closure is not always inlined, and the line handed to one cannot stay in
    /// registers.
    #[inline(always)]
    fn open_address(&mut self, name: Name) {
        self.name(name);
        if JSON {
            self.line.byte(b'"');
        }
    }

    #[inline(always)]
    fn close_address(&mut self) {
        if JSON {
            self.line.byte(b'"');
        }
    }

    /// A field with no value: `null` in JSON, left out of a text line (no made-up value such as
    /// `-1.0` for a log tool to average in).
    #[inline(always)]
    fn null(&mut self, name: Name) {
        if JSON {
            self.name(name);
            self.line.put(b"null");
        }
    }

    #[inline(always)]
    fn number(&mut self, name: Name, value: u64) {
        self.name(name);
        push_decimal(self.line, value);
    }

    /// A status code: always three digits, written without the general conversion.
    #[inline(always)]
    fn status(&mut self, name: Name, status: StatusCode) {
        self.name(name);
        let code = status.as_u16();
        if (100..1000).contains(&code) {
            self.line.put(&three_digits(u64::from(code)));
        } else {
            push_decimal(self.line, u64::from(code));
        }
    }

    /// Milliseconds rounded to the microsecond, written as `{:?}` writes them (`2.0`, `1.25`, `-1.0`).
    #[inline(always)]
    fn millis(&mut self, name: Name, ms: f64) {
        self.name(name);
        let micros = round(ms * 1000.0);
        if !micros.is_finite() || micros.abs() >= 1e15 {
            self.line.put(formatted(format_args!("{ms:?}")).as_bytes());
            return;
        }
        let micros = micros as i64;
        if micros < 0 {
            self.line.byte(b'-');
        }
        let micros = micros.unsigned_abs();
        push_decimal(self.line, micros / 1000);
        self.line.byte(b'.');
        // The fraction's three digits without its trailing zeros (one `0` for none), written
        // directly: `itoa` is a call of its own here.
        let fraction = micros % 1000;
        let digits = three_digits(fraction);
        let width = if digits[2] != b'0' {
            3
        } else if digits[1] != b'0' {
            2
        } else {
            1
        };
        self.line.put(&digits[..width]);
    }
}

/// `value` in decimal; a single digit (an attempt count, no bytes received, a millisecond count
/// below ten) without the general conversion.
#[inline(always)]
fn push_decimal<O: Out>(line: &mut O, value: u64) {
    if value < 10 {
        line.byte(b'0' + value as u8);
    } else {
        line.put(itoa::Buffer::new().format(value).as_bytes());
    }
}

/// The three decimal digits of `value`, zeros included: below 1000 (`999` for any more).
#[inline(always)]
fn three_digits(value: u64) -> [u8; 3] {
    THREE_DIGITS[value.min(999) as usize]
}

/// `f64::round` (half away from zero) for the values the log rounds, without its library call (a call
/// to `round` per use on x86-64 without SSE4.1): the same value, but `-0.0` for `0.0` where it matters
/// to no one (the line writes both as `0`).
fn round(x: f64) -> f64 {
    // Past 2^52 every double is an integer; NaN and the infinities are their own rounding.
    if x.is_nan() || x.abs() >= 4_503_599_627_370_496.0 {
        return x;
    }
    let truncated = (x as i64) as f64;
    // The fraction is exact: `x` and its integer part share an exponent range.
    let fraction = x - truncated;
    if fraction >= 0.5 {
        truncated + 1.0
    } else if fraction <= -0.5 {
        truncated - 1.0
    } else {
        truncated
    }
}

#[inline(always)]
fn push_ip<O: Out>(line: &mut O, ip: IpAddr) {
    match ip {
        IpAddr::V4(ip) => {
            let mut text = Short::default();
            text.ipv4(ip);
            line.put(text.as_bytes());
        }
        IpAddr::V6(ip) => {
            line.put(formatted(format_args!("{ip}")).as_bytes());
        }
    }
}

#[inline(always)]
fn push_socket<O: Out>(line: &mut O, address: SocketAddr) {
    match address {
        SocketAddr::V4(address) => {
            let mut text = Short::default();
            text.ipv4(*address.ip());
            text.push(b':');
            text.decimal(address.port());
            line.put(text.as_bytes());
        }
        SocketAddr::V6(address) => {
            line.put(formatted(format_args!("{address}")).as_bytes());
        }
    }
}

/// Each octet's decimal digits (up to three) and a `.` after them, in the low bytes of a word whose top
/// byte is their count, dot included; computed when compiling: an address is four lookups and four
/// word stores, not a division per digit nor a push per byte.
static OCTETS: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut octet = 0;
    while octet < 256 {
        let value = octet as u8;
        let (text, len) = if value >= 100 {
            let text = [
                b'0' + value / 100,
                b'0' + value / 10 % 10,
                b'0' + value % 10,
            ];
            ([text[0], text[1], text[2], b'.'], 4)
        } else if value >= 10 {
            ([b'0' + value / 10, b'0' + value % 10, b'.', 0], 3)
        } else {
            ([b'0' + value, b'.', 0, 0], 2)
        };
        table[octet] = u32::from_le_bytes(text) as u64 | (len as u64) << 56;
        octet += 1;
    }
    table
};

/// The three decimal digits of every number below 1000, zeros included: a lookup, not three
/// divisions.
static THREE_DIGITS: [[u8; 3]; 1000] = {
    let mut table = [[0u8; 3]; 1000];
    let mut value = 0;
    while value < 1000 {
        table[value] = [
            b'0' + (value / 100) as u8,
            b'0' + (value / 10 % 10) as u8,
            b'0' + (value % 10) as u8,
        ];
        value += 1;
    }
    table
};

/// An IPv4 address and port (at most 21 bytes), assembled on the stack and pushed onto the line at
/// once: a push per octet and separator cost more than the digits. Three bytes of slack let an octet's
/// digits be copied whole.
#[derive(Default)]
struct Short {
    bytes: [u8; 24],
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
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(value).as_bytes();
        if let Some(slot) = self.bytes.get_mut(self.len..self.len + digits.len()) {
            slot.copy_from_slice(digits);
            self.len += digits.len();
        }
    }

    /// The address, from an empty start: each octet's word stored whole where the text is, the next
    /// one over its slack.
    #[inline(always)]
    fn ipv4(&mut self, ip: std::net::Ipv4Addr) {
        let mut len = 0;
        for octet in ip.octets() {
            let word = OCTETS[usize::from(octet)];
            // At most 12 bytes before the last octet (`& 15` is then no change, but tells the
            // compiler the eight bytes are within the 24: no bounds check).
            let at = len & 15;
            self.bytes[at..at + 8].copy_from_slice(&word.to_le_bytes());
            len = at + (word >> 56) as usize;
        }
        // Without the last octet's dot.
        self.len = len - 1;
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
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

    /// Appends the value to duet's line: the bytes [`ClientText::write`] writes, without checking
    /// again that they are UTF-8 and with the common cases (a plain token, text without escapes)
    /// checked eight bytes at a time and copied at once.
    #[inline(always)]
    fn push<O: Out>(&self, line: &mut O) {
        let Some(value) = self.value else {
            // Absent (often the user agent): nothing to check.
            line.put(if self.always_quoted { b"\"-\"" } else { b"-" });
            return;
        };
        if !self.always_quoted && !value.is_empty() && clean(value, 0x21) {
            line.put(value);
            return;
        }
        if clean(value, 0x20) {
            line.byte(b'"');
            line.put(value);
            line.byte(b'"');
            return;
        }
        let mut text = String::new();
        let _ = self.write(&mut text);
        line.put(text.as_bytes());
    }

    /// Writes the value: through `Display` for tracing's formatter, or on the line when it needs
    /// escapes ([`ClientText::push`]), the same bytes either way.
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

/// Whether every byte is visible ASCII (from `low`, `0x21` or `0x20` to take the space in) but `"`
/// and `\`: what a client's text needs to be written as it is. Sixteen bytes per step with SSE2 (in
/// every x86-64 CPU): a handful of instructions where the word-wise tests take a few dozen.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn clean(bytes: &[u8], low: u8) -> bool {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_cmpgt_epi8, _mm_cmplt_epi8, _mm_loadu_si128,
        _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8, _mm_set_epi64x,
    };
    // Signed bytes: those from 0x80 up are negative, below `low` as the control bytes are; only
    // 0x7f is above 0x7e.
    // SAFETY (here and below): SSE2 is enabled (the `cfg`), the intrinsics' only requirement.
    #[allow(unsafe_code)]
    let dirty = |x: __m128i| unsafe {
        let below = _mm_cmplt_epi8(x, _mm_set1_epi8(low as i8));
        let above = _mm_cmpgt_epi8(x, _mm_set1_epi8(0x7e));
        let quote = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8));
        let any = _mm_or_si128(_mm_or_si128(below, above), _mm_or_si128(quote, backslash));
        _mm_movemask_epi8(any) != 0
    };
    let len = bytes.len();
    if len < 16 {
        // A short value as one vector of overlapping picks that cover every byte, filled up with a
        // clean byte (no copy of a variable length, which is a `memcpy` call).
        let word = |at: usize| {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(&bytes[at..at + 8]);
            u64::from_ne_bytes(eight)
        };
        let (low_half, high_half) = match len {
            0 => return true,
            8.. => (word(0), word(len - 8)),
            _ => (short_word(bytes), u64::from_ne_bytes([b'a'; 8])),
        };
        #[allow(unsafe_code)]
        let picks = unsafe { _mm_set_epi64x(high_half as i64, low_half as i64) };
        return !dirty(picks);
    }
    let load = |at: usize| {
        let sixteen = &bytes[at..at + 16];
        // SAFETY: `sixteen` is 16 readable bytes, which `_mm_loadu_si128` reads unaligned.
        #[allow(unsafe_code)]
        unsafe {
            _mm_loadu_si128(sixteen.as_ptr().cast::<__m128i>())
        }
    };
    let mut at = 0;
    while at + 16 <= len {
        if dirty(load(at)) {
            return false;
        }
        at += 16;
    }
    // The last few bytes as the last sixteen, overlapping bytes already checked.
    at == len || !dirty(load(len - 16))
}

/// Up to seven bytes as one word of overlapping picks that cover every byte, filled up with a clean
/// byte (no copy of a variable length, which is a `memcpy` call): the first and last four, or for up
/// to three the first, middle and last.
fn short_word(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    let mut eight = [b'a'; 8];
    match len {
        0 => {}
        1..=3 => {
            eight[0] = bytes[0];
            eight[1] = bytes[len / 2];
            eight[2] = bytes[len - 1];
        }
        _ => {
            eight[..4].copy_from_slice(&bytes[..4]);
            eight[4..].copy_from_slice(&bytes[len - 4..]);
        }
    }
    u64::from_ne_bytes(eight)
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
use clean_words as clean;

/// [`clean`] eight bytes per step, as a word (the classic has-less/has-more/has-zero tests are exact
/// about whether any byte matches): elsewhere than on x86-64, and in tests against the SSE2 one.
#[cfg(any(test, not(all(target_arch = "x86_64", target_feature = "sse2"))))]
fn clean_words(bytes: &[u8], low: u8) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGHS: u64 = ONES * 0x80;
    // The high bit of a byte is set where a byte is zero (exact as to whether any is).
    let zeros = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    // Every test at once, without a branch per test.
    let dirty = |eight: [u8; 8]| {
        let x = u64::from_ne_bytes(eight);
        let below = x.wrapping_sub(ONES * u64::from(low)) & !x & HIGHS;
        // Bytes above 0x7e: adding 1 carries them past 0x7f, and bytes with the high bit set are kept.
        let above = (x.wrapping_add(ONES) | x) & HIGHS;
        below | above | zeros(x ^ (ONES * 0x22)) | zeros(x ^ (ONES * 0x5c)) != 0
    };
    let len = bytes.len();
    if len < 8 {
        return len == 0 || !dirty(short_word(bytes).to_ne_bytes());
    }
    let words = bytes.chunks_exact(8);
    let tail = words.remainder().len();
    for chunk in words {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(chunk);
        if dirty(eight) {
            return false;
        }
    }
    // The last few bytes as the last eight, overlapping bytes already checked.
    if tail == 0 {
        return true;
    }
    let mut eight = [0u8; 8];
    eight.copy_from_slice(&bytes[len - 8..]);
    !dirty(eight)
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
            let mut line = Vec::new();
            Fields::<false, _> { line: &mut line }.millis(name!("m"), ms);
            String::from_utf8(line).expect("ASCII")
        };
        for ms in [
            0.0, 2.0, 1.25, 0.001, 1.23, 17.5, 999.999, 1234.5, -1.0, 60_000.0, 0.1, 0.01, 0.012,
            0.102, 0.12, 3.003, 1.02, -0.05,
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
            let mut line = Vec::new();
            push_socket(&mut line, address);
            assert_eq!(line, address.to_string().as_bytes());
            let mut line = Vec::new();
            push_ip(&mut line, address.ip());
            assert_eq!(line, address.ip().to_string().as_bytes());
        }
        for octet in 0..=255u8 {
            let ip = std::net::Ipv4Addr::new(octet, 255 - octet, octet / 3, 9);
            let mut line = Vec::new();
            push_ip(&mut line, IpAddr::V4(ip));
            assert_eq!(line, ip.to_string().as_bytes());
        }
        for text in ["", "short", &"a long text ".repeat(10)] {
            let long = formatted(format_args!("{text}{}", "!"));
            assert_eq!(long.as_bytes(), format!("{text}!").as_bytes());
        }
        for (micros, text) in [(42, "000042"), (1_000, "001000"), (999_999, "999999")] {
            let mut line = Vec::new();
            push_timestamp::<false, _>(
                &mut line,
                Duration::from_micros(1_700_000_000_000_000 + micros),
            );
            let expected = format!("2023-11-14T22:13:20.{text}Z  INFO duet::access:");
            assert_eq!(String::from_utf8(line).expect("ASCII"), expected);
        }
        for value in 0..1000 {
            let expected = format!("{value:03}");
            assert_eq!(three_digits(value), expected.as_bytes(), "{value}");
        }
        assert_eq!(&three_digits(1042), b"999");
        for value in [0, 1, 9, 10, 11, 99, 100, 1234, 1_000_000, u64::MAX] {
            let mut line = Vec::new();
            push_decimal(&mut line, value);
            assert_eq!(line, value.to_string().as_bytes());
        }
        for code in [100, 101, 200, 204, 404, 429, 503, 599, 999] {
            let status = StatusCode::from_u16(code).expect("a status");
            let mut line = Vec::new();
            Fields::<false, _> { line: &mut line }.status(name!("status"), status);
            assert_eq!(line, format!(" status={code}").as_bytes());
        }
        for x in [
            0.0,
            0.4,
            0.5,
            0.49999999999999994,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.4,
            1234.5678,
            1e15,
            4.5e15,
            1e300,
            -1e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN_POSITIVE,
        ] {
            assert_eq!(round(x), x.round(), "{x}");
        }
        assert!(round(f64::NAN).is_nan());
        for version in [
            Version::HTTP_09,
            Version::HTTP_10,
            Version::HTTP_11,
            Version::HTTP_2,
        ] {
            assert_eq!(protocol(version), format!("{version:?}"));
        }
    }

    /// A record of a request with a user agent of `agent_length` bytes.
    fn record(agent_length: usize) -> AccessLog {
        AccessLog {
            method: Method::GET,
            target: Target::of(&Uri::from_static("/api/x?q=1")),
            version: Version::HTTP_11,
            host: Some(HeaderValue::from_static("example.com")),
            user_agent: Some(
                HeaderValue::try_from("a \"b\"".repeat(agent_length / 6 + 1)).expect("value"),
            ),
            request_id: HeaderValue::from_static("0123456789abcdef0123456789abcdef"),
            client: IpAddr::V4(std::net::Ipv4Addr::new(10, 1, 2, 3)),
            started: Instant::now(),
            status: StatusCode::NOT_FOUND,
            cluster: Some(Arc::from("api")),
            route: Some(Arc::from("api-v1")),
            backend: Some("127.0.0.1:9001".parse().expect("address")),
            tried: vec!["127.0.0.1:9002".parse().expect("address")],
            attempts: 2,
            raced: "-",
            upstream_head_ms: Some(1.25),
            bytes: 1234,
            received: Received::Known(0),
            outcome: "complete",
            grpc_status: Some(14),
            trace: None,
            connect_ms: None,
            referer: None,
            user: None,
            tls: None,
            layout: Rc::new(LineFormat::default()),
            // Never written on drop.
            written: true,
        }
    }

    #[test]
    fn the_combined_line_is_nginx_s_with_its_escapes_and_dashes() {
        let mut log = record(1);
        let settings = LogSettings {
            format: Some(LogFormat::Combined),
            ..LogSettings::default()
        };
        log.layout = Rc::new(LineFormat::new(&settings));
        assert!(log.layout.wants_referer && log.layout.wants_user);
        log.user_agent = Some(HeaderValue::from_static("curl/8.5.0"));
        log.referer = Some(HeaderValue::from_static("https://shop.example/a b"));
        log.user = Some(HeaderValue::from_static("alice"));
        let at = Duration::from_micros(1_700_000_000_123_456);
        let mut line = Vec::new();
        log.write_combined(&mut line, at);
        assert_eq!(
            String::from_utf8(line).expect("text"),
            "10.1.2.3 - alice [14/Nov/2023:22:13:20 +0000] \"GET /api/x?q=1 HTTP/1.1\" 404 1234 \
             \"https://shop.example/a b\" \"curl/8.5.0\"\n"
        );
        // Nothing sent: dashes; a quote or a control byte from the client escaped as nginx does.
        (log.user, log.referer) = (None, None);
        log.user_agent = Some(HeaderValue::from_bytes(b"x\"y\\z\t\xff").expect("value"));
        (log.version, log.bytes) = (Version::HTTP_2, 0);
        log.target = Target::of(&Uri::from_static("https://shop.example/p?a=%22"));
        let mut line = Vec::new();
        log.write_combined(&mut line, at);
        assert_eq!(
            String::from_utf8(line).expect("text"),
            "10.1.2.3 - - [14/Nov/2023:22:13:20 +0000] \"GET /p?a=%22 HTTP/2.0\" 404 0 \"-\" \
             \"x\\x22y\\x5Cz\\x09\\xFF\"\n"
        );
    }

    #[test]
    fn a_line_written_in_the_room_is_the_line_written_into_the_buffer_long_or_short() {
        let values = (
            Duration::from_micros(1_700_000_000_123_456),
            12.345,
            Some(1.25),
            Some("127.0.0.1:9001"),
        );
        let lengths = (0..40).map(|host_length| (10, host_length));
        for (agent_length, host_length) in [(ROOM, 11), (3 * ROOM, 11)].into_iter().chain(lengths) {
            let mut log = record(agent_length);
            log.host = (host_length > 0)
                .then(|| HeaderValue::try_from("h".repeat(host_length)).expect("value"));
            for json in [false, true] {
                let mut direct = b"an earlier line\n".to_vec();
                if json {
                    log.write_line::<true, _>(&mut direct, values);
                } else {
                    log.write_line::<false, _>(&mut direct, values);
                }
                let mut line = b"an earlier line\n".to_vec();
                log.format(&mut line, json, values);
                assert_eq!(
                    String::from_utf8(line).expect("text"),
                    String::from_utf8(direct).expect("text"),
                    "{agent_length}-byte agent, {host_length}-byte host, json: {json}"
                );
            }
        }
    }

    #[test]
    fn a_request_no_backend_answered_has_no_made_up_head_time_and_no_route_before_one_is_picked() {
        let mut log = record(10);
        log.upstream_head_ms = None;
        log.route = None;
        log.backend = None;
        let values = (Duration::from_secs(1_700_000_000), 2.5, None, None);
        let line = |log: &AccessLog, json: bool| {
            let mut line = Vec::new();
            log.format(&mut line, json, values);
            String::from_utf8(line).expect("text")
        };
        let text = line(&log, false);
        assert!(
            !text.contains("upstream_head_ms") && !text.contains("route="),
            "{text}"
        );
        assert!(text.contains(" duration_ms=2.5 bytes=1234 "), "{text}");
        let json = line(&log, true);
        assert!(
            json.contains(r#""cluster":"api","route":null,"backend":null"#),
            "{json}"
        );
        assert!(
            json.contains(r#""upstream_head_ms":null,"bytes":1234"#),
            "{json}"
        );
        // With both known, both are written.
        let log = record(10);
        let values = (values.0, 2.5, Some(1.25), Some("127.0.0.1:9001"));
        let mut text = Vec::new();
        log.format(&mut text, false, values);
        let text = String::from_utf8(text).expect("text");
        assert!(
            text.contains(" cluster=api route=api-v1 backend=127.0.0.1:9001 "),
            "{text}"
        );
        assert!(text.contains(" upstream_head_ms=1.25 "), "{text}");
    }

    /// `log`'s line with `fields`, in JSON or text, at a fixed time.
    fn line_with(log: &mut AccessLog, fields: &[LogField], json: bool) -> String {
        let settings = LogSettings {
            fields: fields.to_vec(),
            ..LogSettings::default()
        };
        log.layout = Rc::new(LineFormat::new(&settings));
        let values = (
            Duration::from_micros(1_700_000_000_123_456),
            2.5,
            None,
            None,
        );
        let mut line = Vec::new();
        log.format(&mut line, json, values);
        String::from_utf8(line).expect("text")
    }

    #[test]
    fn a_chosen_field_list_is_written_in_its_order_and_absent_values_are_null_in_json() {
        use LogField::*;
        let fields = [
            Status, Query, Referer, User, TlsVersion, Sni, ConnectMs, Hedged, Tried, Host,
        ];
        let mut log = record(10);
        (log.host, log.tried) = (None, Vec::new());
        log.target = Target::of(&Uri::from_static("/api/x"));
        assert_eq!(
            line_with(&mut log, &fields, false),
            "2023-11-14T22:13:20.123456Z  INFO duet::access: status=404 query=- referer=\"-\" \
             user=- tls_version=- sni=- hedged=- tried=- host=-\n"
        );
        assert_eq!(
            line_with(&mut log, &fields, true),
            "{\"timestamp\":\"2023-11-14T22:13:20.123456Z\",\"level\":\"INFO\",\"status\":404,\
             \"query\":null,\"referer\":null,\"user\":null,\"tls_version\":null,\"sni\":null,\
             \"connect_ms\":null,\"hedged\":null,\"tried\":null,\"host\":null,\
             \"target\":\"duet::access\"}\n"
        );
        log.target = Target::of(&Uri::from_static("/api/x?token=a%20b&q=1"));
        log.referer = Some(HeaderValue::from_static("https://shop.example/a b"));
        log.user = Some(HeaderValue::from_static("alice"));
        log.tls = Some(TlsSession {
            version: "TLSv1.3",
            sni: Some(Arc::from("shop.example")),
        });
        (log.connect_ms, log.raced) = (Some(0.4567), "hedge");
        log.tried = vec!["127.0.0.1:9002".parse().expect("address")];
        assert_eq!(
            line_with(&mut log, &fields, false),
            "2023-11-14T22:13:20.123456Z  INFO duet::access: status=404 \
             query=token=a%20b&q=1 referer=\"https://shop.example/a b\" \
             user=alice tls_version=TLSv1.3 sni=shop.example connect_ms=0.457 hedged=hedge \
             tried=127.0.0.1:9002 host=-\n"
        );
        let json = line_with(&mut log, &fields, true);
        let parsed: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
        assert_eq!(parsed["query"], "token=a%20b&q=1");
        assert_eq!(parsed["referer"], "https://shop.example/a b");
        assert_eq!(parsed["connect_ms"], 0.457);
        assert_eq!(parsed["sni"], "shop.example");
    }

    #[test]
    fn the_default_line_s_unrolled_fields_are_the_default_list_and_a_listed_default_is_the_same_line(
    ) {
        assert_eq!(AccessLog::DEFAULT_FIELDS, LogField::DEFAULT);
        let mut log = record(10);
        let default = line_with(&mut log, LogField::DEFAULT, true);
        assert!(log.layout.default_fields);
        // The same list, walked field by field.
        let settings = LogSettings::default();
        let mut walked = LineFormat::new(&settings);
        walked.default_fields = false;
        log.layout = Rc::new(walked);
        let mut line = Vec::new();
        let values = (
            Duration::from_micros(1_700_000_000_123_456),
            2.5,
            None,
            None,
        );
        log.format(&mut line, true, values);
        assert_eq!(String::from_utf8(line).expect("text"), default);
    }

    #[test]
    fn the_default_field_list_is_the_line_written_before_it_could_be_chosen() {
        let mut log = record(10);
        let text = line_with(&mut log, LogField::DEFAULT, false);
        assert_eq!(
            text,
            "2023-11-14T22:13:20.123456Z  INFO duet::access: client=10.1.2.3 method=GET \
             host=example.com path=/api/x protocol=HTTP/1.1 status=404 cluster=api route=api-v1 \
             backend=127.0.0.1:9001 tried=127.0.0.1:9002 attempts=2 hedged=- duration_ms=2.5 \
             bytes=1234 bytes_received=0 outcome=complete grpc_status=14 \
             user_agent=\"a \\x22b\\x22a \\x22b\\x22\" request_id=0123456789abcdef0123456789abcdef\n"
        );
    }

    #[test]
    fn sampling_drops_only_successes_and_keeps_every_error() {
        let format = |percent: f64| {
            LineFormat::new(&LogSettings {
                sample_success: percent / 100.0,
                ..LogSettings::default()
            })
        };
        let mut log = record(10);
        (log.status, log.grpc_status) = (StatusCode::OK, None);
        let kept =
            |format: &LineFormat, log: &AccessLog| (0..1000).filter(|_| format.keeps(log)).count();
        assert_eq!(kept(&format(0.0), &log), 0);
        assert_eq!(kept(&format(100.0), &log), 1000);
        let tenth = kept(&format(10.0), &log);
        assert!((50..=150).contains(&tenth), "{tenth} of 1000 at 10%");
        for (status, outcome, grpc) in [
            (StatusCode::NOT_FOUND, "no_route", None),
            (StatusCode::BAD_GATEWAY, "connect_failed", None),
            (StatusCode::OK, "client_gone", None),
            (StatusCode::OK, "backend_error", None),
            (StatusCode::OK, "complete", Some(14)),
        ] {
            (log.status, log.outcome, log.grpc_status) = (status, outcome, grpc);
            assert_eq!(kept(&format(0.0), &log), 1000, "{status} {outcome}");
        }
    }

    #[test]
    fn a_finished_record_s_box_is_the_next_record_s() {
        let first = spare::boxed(&SPARE_RECORDS, || record(10));
        let address: *const AccessLog = &*first;
        first.finish(Duration::from_millis(1), "127.0.0.1:9");
        let next = spare::boxed(&SPARE_RECORDS, || record(20));
        assert!(std::ptr::eq(&*next, address), "the same allocation");
        assert_eq!(next.user_agent.as_ref().map(HeaderValue::len), Some(20));
    }

    #[test]
    fn host_and_user_agent_are_the_first_values_in_a_short_head_as_in_a_long_one() {
        let mut headers = HeaderMap::new();
        assert_eq!(host_and_user_agent(&headers), (None, None));
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append(header::USER_AGENT, HeaderValue::from_static("ua1"));
        headers.append(header::HOST, HeaderValue::from_static("h1"));
        headers.append(header::USER_AGENT, HeaderValue::from_static("ua2"));
        headers.append(header::HOST, HeaderValue::from_static("h2"));
        let first = |headers: &HeaderMap| {
            (
                headers.get(header::HOST).cloned(),
                headers.get(header::USER_AGENT).cloned(),
            )
        };
        let found = |headers: &HeaderMap| {
            let (host, user_agent) = host_and_user_agent(headers);
            (host.cloned(), user_agent.cloned())
        };
        assert_eq!(found(&headers), first(&headers));
        assert_eq!(
            host_and_user_agent(&headers).0,
            Some(&HeaderValue::from_static("h1"))
        );
        for i in 0..10 {
            headers.append("x-b", HeaderValue::from(i));
        }
        assert_eq!(found(&headers), first(&headers));
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
            let mut line = Vec::new();
            text.push(&mut line);
            let line = String::from_utf8(line).expect("escaped: ASCII");
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
    fn clean_text_is_found_many_bytes_at_a_time_as_byte_by_byte() {
        let plain = |b: u8, low: u8| (low..=0x7e).contains(&b) && b != b'"' && b != b'\\';
        for clean in [clean, clean_words] {
            for low in [0x20, 0x21] {
                for byte in 0..=255u8 {
                    // The byte at every position of a word or vector and of the tail, among clean
                    // bytes.
                    let lens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47];
                    for len in lens {
                        for at in 0..len {
                            let mut text = vec![b'a'; len];
                            text[at] = byte;
                            assert_eq!(
                                clean(&text, low),
                                plain(byte, low),
                                "{byte:#x} at {at} of {len}"
                            );
                        }
                    }
                }
            }
            assert!(clean(b"", 0x21));
            assert!(clean(
                b"Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0",
                0x20
            ));
            assert!(!clean(
                b"Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0",
                0x21
            ));
        }
    }

    #[test]
    fn a_target_kept_for_the_line_has_the_path_and_query_of_the_uri() {
        for text in [
            "/",
            "/api/x",
            "/api/x?q=1&r",
            "/?",
            "*",
            "http://h:1/p?q",
            "http://h",
            "h:443",
        ] {
            let uri: Uri = text.parse().expect("a target");
            let target = Target::of(&uri);
            let origin = uri.scheme().is_none() && uri.authority().is_none();
            assert_eq!(matches!(target, Target::Origin(_)), origin, "{text}");
            assert_eq!(target.path(), uri.path(), "{text}");
            assert_eq!(target.query(), uri.query(), "{text}");
        }
    }

    #[test]
    fn the_line_s_clock_is_the_system_clock() {
        let before = since_epoch_std();
        let now = since_epoch();
        let after = since_epoch_std();
        assert!(
            before <= now && now <= after,
            "{before:?} {now:?} {after:?}"
        );
    }

    #[test]
    fn a_short_copy_copies_every_length_exactly() {
        let source: Vec<u8> = (1..=40).collect();
        for len in 0..=40 {
            let mut target = [0u8; 48];
            // SAFETY: `len` bytes of `source` (40) and of `target` (48), distinct buffers.
            #[allow(unsafe_code)]
            unsafe {
                copy_short(source.as_ptr(), target.as_mut_ptr(), len);
            }
            assert_eq!(&target[..len], &source[..len], "{len}");
            assert!(target[len..].iter().all(|b| *b == 0), "{len}: past the end");
        }
    }

    #[test]
    fn json_strings_are_escaped() {
        use fmt::Write as _;
        let mut out = String::new();
        let _ = write!(JsonEscaped(&mut out), "a\"b\\c\nd\u{1}");
        assert_eq!(out, "a\\\"b\\\\c\\nd\\u0001");
    }
}
