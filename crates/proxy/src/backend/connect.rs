//! The seam between a TCP connection to a backend and the HTTP client on it: plain, or TLS when the
//! cluster has `tls:` (the ALPN list is the caller's, so an HTTP/2 client can ask for `h2` over the same
//! configuration). A TLS cluster never falls back to plain text: a handshake that fails fails the
//! attempt, blamed on the backend. With `send_proxy_protocol:` the connection starts with a PROXY
//! header naming its client, before TLS.

use crate::{
    backend::{proxy_header, tls::LoadedTls},
    telemetry::metrics::ClusterCounters,
    view::ResolvedNames,
};
use duet_config::{BackendAddress, SendProxyProtocol};
use rustc_hash::FxBuildHasher;
use rustls::pki_types::ServerName;
use std::{
    cell::RefCell,
    collections::HashMap,
    io,
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    sync::{atomic::Ordering::Relaxed, Arc},
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf},
    net::TcpStream,
    time::Instant,
};
use tokio_rustls::{client::TlsStream, TlsConnector};

/// ALPN for HTTP/1.1 connections.
pub(crate) const HTTP_1_1: &[&[u8]] = &[b"http/1.1"];

/// ALPN for HTTP/2 connections: a TLS backend must choose it (RFC 9113 §3.2), since sending the h2
/// preface to a server that chose HTTP/1.1, or nothing, only fails later and less clearly.
pub(crate) const H2: &[&[u8]] = &[b"h2"];

/// How a cluster's connections are made: plain (the default), or TLS; with or without a PROXY header
/// first. Cheap to clone; the pool and its cluster share one.
#[derive(Clone, Default)]
pub(crate) struct Connector {
    tls: Option<Rc<TlsTarget>>,
    proxy_protocol: Option<SendProxyProtocol>,
}

struct TlsTarget {
    /// The files as this worker read them; `Err` when they failed to load here (every connection
    /// then fails, with this reason).
    loaded: Result<Arc<LoadedTls>, String>,
    /// The name to verify for each backend address given by host name, when `server_name` is unset.
    names: RefCell<HashMap<SocketAddr, ServerName<'static>, FxBuildHasher>>,
    counters: Arc<ClusterCounters>,
}

impl Connector {
    /// A TLS connector for a cluster's `tls:`, its outcome counted in `counters`.
    pub(crate) fn tls(
        loaded: Result<Arc<LoadedTls>, String>,
        counters: Arc<ClusterCounters>,
    ) -> Self {
        Self {
            tls: Some(Rc::new(TlsTarget {
                loaded,
                names: RefCell::default(),
                counters,
            })),
            proxy_protocol: None,
        }
    }

    /// This connector, sending `version`'s PROXY header first on every connection (`None`: none).
    pub(crate) fn sending_proxy_protocol(self, version: Option<SendProxyProtocol>) -> Self {
        Self {
            proxy_protocol: version,
            ..self
        }
    }

    /// The PROXY header its connections start with, if any.
    pub(crate) fn proxy_protocol(&self) -> Option<SendProxyProtocol> {
        self.proxy_protocol
    }

    /// Whether connections are TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// What this connector was built from (to keep it across a reload that reads the same files).
    pub(crate) fn loaded(&self) -> Option<&Arc<LoadedTls>> {
        self.tls.as_ref().and_then(|t| t.loaded.as_ref().ok())
    }

    /// Records which host name each resolved address of `cluster` came from: the name its
    /// certificate is verified against when the cluster has no `server_name`.
    pub(crate) fn name_backends(&self, cluster: &duet_config::Cluster, resolved: &ResolvedNames) {
        let Some(tls) = &self.tls else { return };
        let mut names = tls.names.borrow_mut();
        names.clear();
        for backend in &cluster.backends {
            let BackendAddress::Name { host, port } = &backend.address else {
                continue;
            };
            let Ok(name) = ServerName::try_from(host.clone()) else {
                continue;
            };
            for address in resolved.get(host, *port).unwrap_or_default() {
                names.entry(*address).or_insert_with(|| name.clone());
            }
        }
    }

    /// Starts `stream` to `backend` with the PROXY header naming `client`, if the cluster sends one,
    /// within `limit`.
    pub(crate) async fn introduce(
        &self,
        stream: &mut TcpStream,
        backend: SocketAddr,
        client: Option<SocketAddr>,
        limit: Duration,
    ) -> io::Result<()> {
        let Some(version) = self.proxy_protocol else {
            return Ok(());
        };
        let header = proxy_header::header(version, client, backend);
        tokio::time::timeout(limit, stream.write_all(&header))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("PROXY header not sent within {limit:?}"),
                )
            })?
    }

    /// `stream` to `backend` as the cluster speaks to it: as it is, or after a TLS handshake offering
    /// `alpn`, bounded by `limit`.
    pub(crate) async fn connect(
        &self,
        stream: TcpStream,
        backend: SocketAddr,
        alpn: &[&[u8]],
        limit: Duration,
    ) -> io::Result<UpstreamIo> {
        let Some(target) = &self.tls else {
            return Ok(UpstreamIo::Plain(stream));
        };
        let started = Instant::now();
        let result = target.handshake(stream, backend, alpn, limit).await;
        let counters = &target.counters;
        match &result {
            Ok(_) => {
                counters.tls_handshakes.fetch_add(1, Relaxed);
                let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                counters.tls_handshake_micros.fetch_add(micros, Relaxed);
            }
            Err(_) => {
                counters.tls_handshake_failures.fetch_add(1, Relaxed);
            }
        }
        result
    }
}

impl TlsTarget {
    async fn handshake(
        &self,
        stream: TcpStream,
        backend: SocketAddr,
        alpn: &[&[u8]],
        limit: Duration,
    ) -> io::Result<UpstreamIo> {
        let loaded = self.loaded.as_ref().map_err(|why| {
            io::Error::new(io::ErrorKind::InvalidData, format!("TLS not set up: {why}"))
        })?;
        let name = loaded
            .server_name
            .clone()
            .or_else(|| self.names.borrow().get(&backend).cloned())
            // An IP backend without `server_name` passed the config check only with `verify: false`.
            .unwrap_or_else(|| ServerName::IpAddress(backend.ip().into()));
        let connector = TlsConnector::from(loaded.config.clone());
        let offered = alpn.iter().map(|p| p.to_vec()).collect();
        let handshake = connector.with_alpn(offered).connect(name, stream);
        match tokio::time::timeout(limit, handshake).await {
            Ok(Ok(tls)) if alpn == H2 && tls.get_ref().1.alpn_protocol() != Some(b"h2") => {
                Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the backend did not choose h2 by ALPN",
                ))
            }
            Ok(Ok(tls)) => Ok(UpstreamIo::Tls(Box::new(tls))),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no TLS handshake within {limit:?}"),
            )),
        }
    }
}

/// A connection to a backend, plain or TLS.
pub(crate) enum UpstreamIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(stream) => stream.is_write_vectored(),
            Self::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Self::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}
