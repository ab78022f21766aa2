//! Reading HTTP/1.1 responses off a raw socket, for tests that write their requests byte for byte (what
//! a hyper client would refuse to send, or a connection whose bytes after the head matter).

use std::{
    io::{self, Read},
    time::{Duration, Instant},
};

/// A response read by [`read_response`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawResponse {
    /// The head as sent, status line to the blank line included.
    pub head: String,
    /// The body, `Content-Length` bytes of it.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The status code, 0 if the status line has none.
    pub fn status(&self) -> u16 {
        status(&self.head)
    }
}

/// The status code of a response head, 0 if its status line has none.
pub fn status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0)
}

/// Where the first complete head in `bytes` ends: just past its blank line.
pub fn head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// The `Content-Length` a head announces (the field name in any case), if any.
pub fn content_length(head: &str) -> Option<usize> {
    head.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}

/// Reads one head, through its blank line, a byte at a time so that nothing after it is taken from
/// the stream (the first bytes of a tunnel after a `101`, the next response). An error if the stream
/// ends (`UnexpectedEof`) or times out first.
pub fn read_head(stream: &mut impl Read) -> io::Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte)?;
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Reads one whole response framed by its `Content-Length` (none: no body). `pending` holds what was
/// read past the previous response on this stream and keeps what is read past this one, so a client
/// can read responses back to back with large reads. An error if the stream ends or times out first.
pub fn read_response(stream: &mut impl Read, pending: &mut Vec<u8>) -> io::Result<RawResponse> {
    let mut buffer = [0u8; 4096];
    loop {
        if let Some(response) = take_response(pending) {
            return Ok(response);
        }
        let n = stream.read(&mut buffer)?;
        if n == 0 {
            return Err(cut_short(pending));
        }
        pending.extend_from_slice(&buffer[..n]);
    }
}

/// [`read_response`] on a tokio stream, for tests inside a runtime; bound it with
/// `tokio::time::timeout`.
pub async fn read_response_async(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    pending: &mut Vec<u8>,
) -> io::Result<RawResponse> {
    use tokio::io::AsyncReadExt;
    let mut buffer = [0u8; 4096];
    loop {
        if let Some(response) = take_response(pending) {
            return Ok(response);
        }
        let n = stream.read(&mut buffer).await?;
        if n == 0 {
            return Err(cut_short(pending));
        }
        pending.extend_from_slice(&buffer[..n]);
    }
}

/// The first response in `pending`, taken out of it, once it is all there.
fn take_response(pending: &mut Vec<u8>) -> Option<RawResponse> {
    let end = head_end(pending)?;
    let head = String::from_utf8_lossy(&pending[..end]).into_owned();
    let length = content_length(&head).unwrap_or(0);
    if pending.len() < end + length {
        return None;
    }
    let body = pending[end..end + length].to_vec();
    pending.drain(..end + length);
    Some(RawResponse { head, body })
}

fn cut_short(pending: &[u8]) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!(
            "closed after {} bytes of a response: {:?}",
            pending.len(),
            String::from_utf8_lossy(pending)
        ),
    )
}

/// Reads until the peer closes the connection or `limit` passes; what arrived, and whether the peer
/// closed (a reset counts as closed). Sets a short read timeout on `stream` to see the deadline.
pub fn read_until_closed(stream: &mut std::net::TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + limit;
    let mut out = Vec::new();
    let mut buffer = [0u8; 65536];
    while Instant::now() < deadline {
        let slice = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(1), Duration::from_millis(50));
        if stream.set_read_timeout(Some(slice)).is_err() {
            return (out, true);
        }
        match stream.read(&mut buffer) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buffer[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (out, true),
        }
    }
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_read_without_what_follows() {
        let mut stream: &[u8] = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\ntunnel";
        let head = read_head(&mut stream).expect("a head");
        assert_eq!(
            head,
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"
        );
        assert_eq!(status(&head), 101);
        assert_eq!(stream, b"tunnel");
    }

    #[test]
    fn responses_back_to_back_are_split_by_their_length() {
        let mut stream: &[u8] =
            b"HTTP/1.1 200 OK\r\ncontent-LENGTH: 2\r\n\r\nokHTTP/1.1 503 No\r\n\r\nHTTP/1.1 204";
        let mut pending = Vec::new();
        let first = read_response(&mut stream, &mut pending).expect("first");
        assert_eq!((first.status(), first.body.as_slice()), (200, &b"ok"[..]));
        let second = read_response(&mut stream, &mut pending).expect("second");
        assert_eq!((second.status(), second.body.len()), (503, 0));
        let cut = read_response(&mut stream, &mut pending).expect_err("cut");
        assert_eq!(cut.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(content_length("HTTP/1.1 200 OK\r\n\r\n"), None);
    }

    #[tokio::test]
    async fn the_async_reader_splits_the_same_way() {
        let mut stream: &[u8] =
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 404 x\r\n\r\n";
        let mut pending = Vec::new();
        let first = read_response_async(&mut stream, &mut pending)
            .await
            .expect("first");
        assert_eq!((first.status(), first.body.as_slice()), (200, &b"abc"[..]));
        let second = read_response_async(&mut stream, &mut pending)
            .await
            .expect("second");
        assert_eq!(second.status(), 404);
        assert!(pending.is_empty());
    }
}
