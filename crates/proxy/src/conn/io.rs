//! Wrappers around a client connection's IO: bytes already read put back in front, and a bound on how
//! long a write may make no progress.

use crate::{conn::head_timer::HeadClock, peer::TlsSession, stall::Stall};
use bytes::Bytes;
use http::HeaderValue;
use std::{
    io,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};

/// A client connection's transport, and whether it can wait for its next request outside its task.
///
/// A plain TCP socket can: between requests it leaves its task for the worker's parking lot (about 80
/// bytes a connection). A TLS session cannot (its state lives in the stream), so it parks in its task.
pub trait ClientIo: AsyncRead + AsyncWrite + Send + Unpin + Sized + 'static {
    /// The bare socket, for the parking lot; `Err(self)` when this transport parks in its task.
    fn into_parkable(self) -> Result<io::Result<std::net::TcpStream>, Self> {
        Err(self)
    }

    /// `X-Forwarded-Client-Cert` for the certificate the client showed (TLS with `client_auth`).
    fn client_certificate(&self) -> Option<HeaderValue> {
        None
    }

    /// What the TLS handshake negotiated; `None` over plain TCP.
    fn tls_session(&self) -> Option<TlsSession> {
        None
    }
}

impl ClientIo for TcpStream {
    fn into_parkable(self) -> Result<io::Result<std::net::TcpStream>, Self> {
        Ok(self.into_std())
    }
}

impl<IO: AsyncRead + AsyncWrite + Send + Unpin + 'static> ClientIo
    for tokio_rustls::server::TlsStream<IO>
{
    fn client_certificate(&self) -> Option<HeaderValue> {
        let leaf = self.get_ref().1.peer_certificates()?.first()?;
        crate::client_cert::value(leaf)
    }

    fn tls_session(&self) -> Option<TlsSession> {
        use tokio_rustls::rustls::ProtocolVersion;
        let session = self.get_ref().1;
        let version = match session.protocol_version()? {
            ProtocolVersion::TLSv1_3 => "TLSv1.3",
            ProtocolVersion::TLSv1_2 => "TLSv1.2",
            // rustls negotiates nothing older.
            _ => "TLS",
        };
        Some(TlsSession {
            version,
            sni: session.server_name().map(std::sync::Arc::from),
        })
    }
}

/// A connection with bytes already read from it in front.
pub(crate) struct Prefixed<IO> {
    pub(crate) prefix: Bytes,
    pub(crate) io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A client connection whose writes may make no progress for at most `limits.send_timeout`: a client
/// that stops reading would otherwise hold its connection, and the backend's (counted as load), forever.
/// Over HTTP/1.1, each write that makes progress, and each that finds the client's window full, also
/// tells the connection's [`HeadClock`], which does not time the next head while the last response is
/// still going out or waiting for the client to read it.
pub(crate) struct SendTimeout<IO> {
    pub(crate) io: IO,
    pub(crate) stall: Stall,
    pub(crate) head: Option<Rc<HeadClock>>,
}

impl<IO> SendTimeout<IO> {
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending if self.stall.expired(cx) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {:?}", self.stall.limit()),
            ))),
            Poll::Pending => Poll::Pending,
            ready => {
                self.stall.progressed();
                ready
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for SendTimeout<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for SendTimeout<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        match (&polled, &this.head) {
            (Poll::Ready(Ok(1..)), Some(head)) => head.wrote(),
            (Poll::Pending, Some(head)) => head.write_blocked(),
            _ => {}
        }
        this.check(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.check(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
