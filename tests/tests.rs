//! End-to-end tests: the real `duet` binary (or its `Server`) with real backends and real clients, all
//! on loopback. One test binary, one module per subject (ripgrep's layout), sharing `support`.

mod support;

mod access_log;
mod admin;
mod affinity;
mod auth;
mod balancing;
mod browser;
mod body_limits;
mod buffering;
mod cors;
mod cli;
mod client_auth;
mod connection_limits;
mod discovery;
mod docs;
mod edge;
mod edge_limits;
mod failures;
mod framing;
mod full_scan;
mod grpc;
mod h2_attacks;
mod http2;
mod layering;
mod lifecycle;
mod mirror;
mod proxy_protocol;
mod proxy_protocol_out;
mod limits;
mod readme;
mod reload;
mod resilience;
mod route_filters;
mod routing;
mod shaping;
mod sticky;
mod streaming;
mod tls;
mod tls_ocsp;
mod tls_rotation;
mod tls_sni;
mod traces;
mod upstream_tls;
