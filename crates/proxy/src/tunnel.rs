//! A connection upgraded by a `101` (a WebSocket, say): both sides relayed until either closes or the
//! tunnel idles out.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use std::{
    cell::Cell,
    net::SocketAddr,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
    time::Duration,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A `101` relayed to the client: the backend's side of the tunnel, waiting for the client's.
pub(crate) struct PendingTunnel {
    pub(crate) backend: OnUpgrade,
    pub(crate) idle: Duration,
    pub(crate) peer: SocketAddr,
}

/// Relays an upgraded connection (e.g. a WebSocket) both ways until either side closes, or until it
/// has carried nothing either way for `idle` (checked in quarters: closed between 1 and 1¼ × `idle`).
/// `client` is the client connection itself, after the `101`.
pub(crate) async fn tunnel<C: AsyncRead + AsyncWrite + Unpin>(client: C, pending: PendingTunnel) {
    let PendingTunnel {
        backend,
        idle,
        peer,
    } = pending;
    let backend = match backend.await {
        Ok(backend) => backend,
        Err(error) => {
            tracing::debug!(%peer, "upgrade failed: {error}");
            return;
        }
    };
    let activity = Rc::new(Cell::new(0u64));
    let mut client = Counted {
        io: client,
        reads: activity.clone(),
    };
    let mut backend = Counted {
        io: TokioIo::new(backend),
        reads: activity.clone(),
    };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut backend);
    tokio::pin!(copy);
    let quarter = idle / 4;
    let (mut seen, mut quiet) = (0, 0);
    loop {
        tokio::select! {
            result = &mut copy => {
                if let Err(error) = result {
                    tracing::debug!(%peer, "tunnel closed: {error}");
                }
                break;
            }
            () = tokio::time::sleep(quarter) => {
                let now = activity.get();
                quiet = if now == seen { quiet + 1 } else { 0 };
                seen = now;
                if quiet >= 4 {
                    tracing::debug!(%peer, ?idle, "tunnel idle: closing");
                    break;
                }
            }
        }
    }
}

/// An upgraded connection that counts its successful reads, so the tunnel can tell silence from traffic
/// without reading the clock per read.
pub(crate) struct Counted<IO> {
    io: IO,
    reads: Rc<Cell<u64>>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Counted<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.reads.set(this.reads.get() + 1);
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Counted<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
