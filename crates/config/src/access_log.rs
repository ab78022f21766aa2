//! `access_log:`: which fields each access-log line holds, in which order and format, and how many of
//! the successful requests' lines are written.

/// `access_log: { format, fields, sample_success }`, for the whole process: the log is one stream
/// (stderr or `--access-log`'s file) that one tool reads, so one format and one field list serve it.
#[derive(Debug, Clone, PartialEq)]
pub struct AccessLog {
    /// `text`, `json` or `combined`; `None`: as `duet run --log-format` says.
    pub format: Option<LogFormat>,
    /// The fields of each line, in the order written (`combined` has its own, fixed).
    pub fields: Vec<LogField>,
    /// The share of successful requests (below 400, ended cleanly) whose lines are written, from 0
    /// to 1; every other request's line always is.
    pub sample_success: f64,
}

impl Default for AccessLog {
    fn default() -> Self {
        Self {
            format: None,
            fields: LogField::DEFAULT.to_vec(),
            sample_success: 1.0,
        }
    }
}

/// How access-log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `2026-12-01T05:00:59.625376Z  INFO duet::access: client=127.0.0.1 method=GET ...`: the
    /// `tracing` text line, its fields `name=value` (logfmt).
    Text,
    /// One flat JSON object per line, numbers as numbers, absent values `null`.
    Json,
    /// nginx's `combined` line, exactly (`$remote_addr - $remote_user [$time_local] "$request"
    /// $status $body_bytes_sent "$http_referer" "$http_user_agent"`): what log tools (GoAccess,
    /// AWStats, most SIEM parsers) read without configuration. Its fields are fixed.
    Combined,
}

impl LogFormat {
    /// The format's name in the file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
            Self::Combined => "combined",
        }
    }
}

macro_rules! log_fields {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// A field of an access-log line (`access_log.fields`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum LogField {
            $($(#[$doc])* $variant,)*
        }

        impl LogField {
            /// Every field, in the order of the reference.
            pub const ALL: &'static [LogField] = &[$(LogField::$variant,)*];

            /// The field's name, in the file and on the line.
            pub fn name(self) -> &'static str {
                match self {
                    $(LogField::$variant => $name,)*
                }
            }
        }
    };
}

log_fields! {
    /// The client's address, after `trusted_proxies`.
    Client = "client",
    /// The request method.
    Method = "method",
    /// The host the request was routed by.
    Host = "host",
    /// The request path, without its query.
    Path = "path",
    /// The raw query string (off by default: it may hold secrets).
    Query = "query",
    /// `HTTP/1.1`, `HTTP/2.0`...
    Protocol = "protocol",
    /// The status sent to the client.
    Status = "status",
    /// The cluster routed to.
    Cluster = "cluster",
    /// The route's name.
    Route = "route",
    /// The backend that answered.
    Backend = "backend",
    /// Backends tried before it.
    Tried = "tried",
    /// Attempts sent to backends.
    Attempts = "attempts",
    /// Which attempt answered when a hedge was sent.
    Hedged = "hedged",
    /// Arrival to the end of the response, in milliseconds.
    DurationMs = "duration_ms",
    /// The answering attempt's wait for its response head, in milliseconds.
    UpstreamHeadMs = "upstream_head_ms",
    /// The time to connect to the backend when the answering attempt opened a connection.
    ConnectMs = "connect_ms",
    /// Response body bytes sent.
    Bytes = "bytes",
    /// Request body bytes read.
    BytesReceived = "bytes_received",
    /// How the request ended.
    Outcome = "outcome",
    /// A gRPC call's status.
    GrpcStatus = "grpc_status",
    /// The `User-Agent`.
    UserAgent = "user_agent",
    /// The `Referer`.
    Referer = "referer",
    /// The `X-Request-Id` forwarded.
    RequestId = "request_id",
    /// The user a route's `auth:` let in.
    User = "user",
    /// The TLS version of the client's connection.
    TlsVersion = "tls_version",
    /// The server name the client asked for in its TLS handshake.
    Sni = "sni",
}

impl LogField {
    /// The fields of a line when `access_log.fields` is not set: those written before the list could
    /// be chosen, in their order.
    pub const DEFAULT: &'static [LogField] = &[
        Self::Client,
        Self::Method,
        Self::Host,
        Self::Path,
        Self::Protocol,
        Self::Status,
        Self::Cluster,
        Self::Route,
        Self::Backend,
        Self::Tried,
        Self::Attempts,
        Self::Hedged,
        Self::DurationMs,
        Self::UpstreamHeadMs,
        Self::Bytes,
        Self::BytesReceived,
        Self::Outcome,
        Self::GrpcStatus,
        Self::UserAgent,
        Self::RequestId,
    ];

    /// The field named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|field| field.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_is_found_by_its_name_and_names_are_distinct() {
        for field in LogField::ALL {
            assert_eq!(LogField::from_name(field.name()), Some(*field));
        }
        let mut names: Vec<_> = LogField::ALL.iter().map(|f| f.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), LogField::ALL.len());
        assert_eq!(LogField::from_name("referrer"), None);
    }
}
