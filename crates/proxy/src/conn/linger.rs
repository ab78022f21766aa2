//! Lingering close: after duet has sent its last response and its FIN, what the client is still sending
//! is read and dropped before the socket closes.
//!
//! A socket closed with unread bytes in its receive buffer, or that receives more after it closed,
//! answers with a reset (RFC 9293 §3.6.1 and RFC 1122's note on it). A client still sending a request
//! body that duet refused (a `413`) or that a backend answered early meets that reset on its next write,
//! and most clients then report the broken write and never read the response that is already waiting
//! for them. nginx closes this way (`lingering_close`, `lingering_time` 30 s, `lingering_timeout` 5 s);
//! so does duet, with nginx's bounds, and only when the client is found sending: a client that has
//! sent everything sees the FIN and closes, and nothing waits for it.

use std::time::Duration;
use tokio::{
    io::{AsyncRead, AsyncReadExt},
    sync::watch,
    time::Instant,
};

/// At most this long in all (nginx's `lingering_time`).
const LINGER_TIME: Duration = Duration::from_secs(30);

/// Closed when the client sends nothing for this long (nginx's `lingering_timeout`).
const LINGER_PAUSE: Duration = Duration::from_secs(5);

/// At most this long once duet drains (shutdown): a lingering connection is not one the drain should
/// wait for, or count as cut.
const LINGER_WHILE_DRAINING: Duration = Duration::from_secs(1);

/// How long a client not known to be sending is given to show it is: one still writing a body has
/// bytes on the way, one that is done closes on duet's FIN (its close ends the wait at once).
const FIRST_LOOK: Duration = Duration::from_millis(50);

/// Read at a time while lingering (nginx reads into 4 KiB too).
const CHUNK: usize = 4 * 1024;

/// Reads and drops what the client sends after duet's FIN, while it is sending: until it closes, pauses
/// [`LINGER_PAUSE`], or [`LINGER_TIME`] has passed ([`LINGER_WHILE_DRAINING`] once `draining` says
/// true). `sending` says bytes of it were already seen unread (in hyper's read buffer); otherwise it
/// has [`FIRST_LOOK`] to send one. Returns the bytes dropped.
pub(crate) async fn linger<IO: AsyncRead + Unpin>(
    io: &mut IO,
    sending: bool,
    draining: &mut watch::Receiver<bool>,
) -> u64 {
    let drain_limit = || Instant::now() + LINGER_WHILE_DRAINING;
    let mut deadline = Instant::now() + LINGER_TIME;
    let mut watching = !*draining.borrow_and_update();
    if !watching {
        deadline = drain_limit();
    }
    let mut dropped = 0;
    if !sending {
        // A socket's readiness is only learnt when the worker next polls for events: a read that
        // found nothing a moment ago says nothing about now, so this waits rather than peeks.
        let mut first = [0u8; 64];
        match tokio::time::timeout(FIRST_LOOK, io.read(&mut first)).await {
            Ok(Ok(n)) if n > 0 => dropped += n as u64,
            _ => return 0,
        }
    }
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return dropped;
        }
        let pause = (deadline - now).min(LINGER_PAUSE);
        tokio::select! {
            read = tokio::time::timeout(pause, io.read(&mut chunk)) => match read {
                Ok(Ok(n)) if n > 0 => dropped += n as u64,
                // The client closed, the connection failed, or the client paused too long.
                _ => return dropped,
            },
            // The drain began (or the worker is going away): what is left of the linger is short.
            _ = draining.changed(), if watching => {
                watching = false;
                deadline = deadline.min(drain_limit());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A drain signal that has not fired, and its sender.
    fn not_draining() -> (watch::Sender<bool>, watch::Receiver<bool>) {
        watch::channel(false)
    }

    #[tokio::test]
    async fn a_client_still_sending_is_read_to_its_end() {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            for _ in 0..64 {
                client.write_all(&[b'x'; 4096]).await.expect("write");
            }
            client.shutdown().await.expect("shutdown");
            client
        });
        let (_drain, mut draining) = not_draining();
        assert_eq!(linger(&mut server, false, &mut draining).await, 64 * 4096);
        drop(writer.await.expect("writer"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_is_done_is_given_a_moment_and_one_that_pauses_the_linger_timeout() {
        let (_drain, mut draining) = not_draining();
        // Done and closed: no wait at all.
        let (client, mut server) = tokio::io::duplex(1024);
        drop(client);
        let started = Instant::now();
        assert_eq!(linger(&mut server, false, &mut draining).await, 0);
        assert_eq!(started.elapsed(), Duration::ZERO);

        // Done but silent, its side still open: the first look, and no more.
        let (_open, mut server) = tokio::io::duplex(1024);
        let started = Instant::now();
        assert_eq!(linger(&mut server, false, &mut draining).await, 0);
        assert_eq!(started.elapsed(), FIRST_LOOK);

        // Sending, then silent with its side open: closed after the linger timeout.
        let (mut client, mut server) = tokio::io::duplex(1024);
        client.write_all(b"partial body").await.expect("write");
        let started = Instant::now();
        assert_eq!(linger(&mut server, false, &mut draining).await, 12);
        assert_eq!(started.elapsed(), LINGER_PAUSE);

        // A client that never stops: cut at the linger time.
        let (mut client, mut server) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            while client.write_all(b"more").await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let started = Instant::now();
        linger(&mut server, true, &mut draining).await;
        assert_eq!(started.elapsed(), LINGER_TIME);
        drop(server);
        writer.await.expect("writer");
    }

    #[tokio::test(start_paused = true)]
    async fn the_drain_cuts_a_linger_short() {
        let (mut client, mut server) = tokio::io::duplex(1024);
        let writer = tokio::spawn(async move {
            while client.write_all(b"more").await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let (drain, mut draining) = not_draining();
        let started = Instant::now();
        let drains = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = drain.send(true);
            drain
        });
        linger(&mut server, true, &mut draining).await;
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(3) + LINGER_WHILE_DRAINING
        );

        // Already draining: a second at most.
        let started = Instant::now();
        linger(&mut server, true, &mut draining).await;
        assert_eq!(started.elapsed(), LINGER_WHILE_DRAINING);
        drop(server);
        drop(drains.await.expect("drain"));
        writer.await.expect("writer");
    }
}
