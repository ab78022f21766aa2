//! A backend may answer before it has read the whole request (RFC 9110 §15.5.14's `413`, an early
//! `401`, or a `200` from a server that ignores the body, RFC 9112 §9.6), then close the connection with
//! the body still arriving. Its kernel answers the next bytes duet sends with a reset, and the write of
//! the request body fails while the complete response is already in duet's receive buffer.
//!
//! hyper's HTTP/1.1 client treats any write error as the end of the connection: the response it has
//! not parsed yet is lost and the attempt fails (a `502`), or the body of one it has parsed is cut short.
//! nginx and HAProxy read the response anyway. [`EarlyAnswerIo`] lets hyper do the same: a write that
//! fails because the backend reset or shut the connection never completes, so hyper goes on reading
//! what the backend sent before the reset, and the read side says how the exchange ended (a response,
//! or the reset as a read error: a `502` as before when nothing was answered).

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection to a backend whose write side, once the backend has reset it, stops instead of failing.
pub(crate) struct EarlyAnswerIo<T> {
    inner: T,
    /// A write failed with a reset or a broken pipe: nothing more can be sent.
    write_closed: bool,
}

// === impl EarlyAnswerIo ===

impl<T> EarlyAnswerIo<T> {
    pub(crate) fn new(inner: T) -> Self {
        Self {
            inner,
            write_closed: false,
        }
    }

    /// `result` of a write, with a reset turned into a write that never completes. No waker is kept on
    /// purpose: the write can never complete, and a reset socket is readable at once (what was received
    /// before the reset, then the reset itself), so the read side, which hyper polls first on every
    /// turn, wakes the connection and ends it.
    fn write_result<R>(&mut self, result: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match result {
            Poll::Ready(Err(error)) if reset(&error) => {
                tracing::trace!(
                    "backend connection reset while writing; reading its answer: {error}"
                );
                self.write_closed = true;
                Poll::Pending
            }
            other => other,
        }
    }
}

/// Whether a write failed because the backend closed the connection (RST received), not because of
/// something that reading could not show.
fn reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
    )
}

impl<T: AsyncRead + Unpin> AsyncRead for EarlyAnswerIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for EarlyAnswerIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.write_closed {
            return Poll::Pending;
        }
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.write_result(result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.write_closed {
            return Poll::Pending;
        }
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.write_result(result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.write_closed {
            return Poll::Pending;
        }
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.write_result(result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.write_closed {
            // Nothing left to shut: the backend reset the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection the backend has reset after answering: the answer is still to be read, every write
    /// fails with `kind`.
    struct Reset {
        answer: &'static [u8],
        kind: io::ErrorKind,
    }

    impl AsyncRead for Reset {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let answer = std::mem::take(&mut self.answer);
            if answer.is_empty() {
                return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
            }
            buf.put_slice(answer);
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Reset {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Err(self.kind.into()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Err(self.kind.into()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Err(io::ErrorKind::NotConnected.into()))
        }
    }

    #[test]
    fn a_reset_stops_the_writes_and_leaves_the_answer_to_be_read() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for kind in [io::ErrorKind::ConnectionReset, io::ErrorKind::BrokenPipe] {
            let mut io = EarlyAnswerIo::new(Reset {
                answer: b"HTTP/1.1 413",
                kind,
            });
            assert!(Pin::new(&mut io).poll_write(&mut cx, b"body").is_pending());
            assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
            let mut bytes = [0u8; 32];
            let mut buf = ReadBuf::new(&mut bytes);
            assert!(matches!(
                Pin::new(&mut io).poll_read(&mut cx, &mut buf),
                Poll::Ready(Ok(()))
            ));
            assert_eq!(buf.filled(), b"HTTP/1.1 413");
            // Then the reset itself, for hyper to end the connection on.
            let mut buf = ReadBuf::new(&mut bytes);
            assert!(matches!(
                Pin::new(&mut io).poll_read(&mut cx, &mut buf),
                Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset
            ));
            assert!(matches!(
                Pin::new(&mut io).poll_shutdown(&mut cx),
                Poll::Ready(Ok(()))
            ));
        }
        // Any other write error is hyper's to see.
        let mut io = EarlyAnswerIo::new(Reset {
            answer: b"",
            kind: io::ErrorKind::TimedOut,
        });
        assert!(matches!(
            Pin::new(&mut io).poll_write(&mut cx, b"body"),
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::TimedOut
        ));
    }
}
