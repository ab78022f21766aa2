//! Access-log lines gathered per worker and handed to the access log's writer thread in chunks.
//!
//! Handing each line to the writer thread costs a channel send and, when that thread is asleep (most of
//! the time: it keeps up), a futex wake and a context switch, then a write syscall per line: a tenth of
//! duet's throughput under a closed-loop benchmark. A worker instead appends its access-log lines to a
//! buffer of its own and hands the buffer over when it passes [`CHUNK`] bytes, and at least every
//! [`FLUSH_EVERY`] (so a line reaches the log within a fraction of a second, as nginx's `access_log ...
//! buffer= flush=` does). The writer thread then writes a chunk with one syscall. Other threads write
//! through at once; every other log line goes through `tracing` as usual.
//!
//! The chunk itself moves to the writer thread, which hands the emptied buffer back for reuse: a
//! general-purpose writer (`tracing-appender`'s, which this replaced) copies what it is given into a new
//! allocation, and copying 32 KiB cost about 300 instructions per line (#30). Its behaviour is kept:
//! lines are never dropped (past [`QUEUED`] queued chunks the workers wait), and what is queued is
//! written when the [`Guard`] drops, waiting at most [`SHUTDOWN_WAIT`] for it.

use std::{
    cell::RefCell,
    io::{self, Write},
    sync::{mpsc, Arc, Mutex, OnceLock},
    thread,
    time::{Duration, Instant},
};

/// A worker hands its buffer over past this many bytes.
pub(crate) const CHUNK: usize = 32 * 1024;

/// ... and at least this often.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// Chunks queued for the writer thread before writers wait: `tracing-appender`'s limit.
const QUEUED: usize = 128_000;

/// Emptied buffers the writer thread keeps for the workers to reuse (one or two per worker in use).
const SPARE: usize = 16;

/// How long dropping the [`Guard`] waits for what is queued to be written (`tracing-appender`'s wait).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);

enum Message {
    Chunk(Vec<u8>),
    /// Written everything before: answer and stop.
    Shutdown(mpsc::Sender<()>),
}

/// The writer thread's queue and its emptied buffers.
struct Sink {
    queue: mpsc::SyncSender<Message>,
    spare: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// Where buffered access-log lines go: the access log's writer thread.
static ACCESS_SINK: OnceLock<Sink> = OnceLock::new();

thread_local! {
    /// This thread's buffered lines; `None` on threads that do not buffer.
    static BUFFER: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Makes the calling thread (a worker) buffer its access-log lines from now on.
pub(crate) fn buffer_this_thread() {
    BUFFER.with(|buffer| {
        buffer.borrow_mut().get_or_insert_with(new_buffer);
    });
}

fn new_buffer() -> Vec<u8> {
    Vec::with_capacity(CHUNK + 1024)
}

/// Hands the calling thread's buffered lines to the writer thread.
pub(crate) fn flush() {
    BUFFER.with(|buffer| {
        if let Some(lines) = buffer.borrow_mut().as_mut() {
            hand_over(lines);
        }
    });
}

/// Writes access-log bytes: into this thread's buffer if it has one, else straight to the writer thread.
pub(crate) fn write_access(bytes: &[u8]) {
    append_access(&mut |lines| lines.extend_from_slice(bytes));
}

/// Lets `append` write access-log lines at the end of this thread's buffer if it has one (duet's
/// formatter writes there directly, rather than into a line of its own then copied), else of a new
/// buffer sent straight to the writer thread.
pub(crate) fn append_access(append: &mut dyn FnMut(&mut Vec<u8>)) {
    BUFFER.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        match buffer.as_mut() {
            Some(lines) => {
                append(lines);
                if lines.len() >= CHUNK {
                    hand_over(lines);
                }
            }
            None => {
                if let Some(sink) = ACCESS_SINK.get() {
                    let mut lines = Vec::new();
                    append(&mut lines);
                    let _ = sink.queue.send(Message::Chunk(lines));
                }
            }
        }
    });
}

/// Sends the buffer's lines to the writer thread, leaving an empty buffer (a spare one when there is).
fn hand_over(lines: &mut Vec<u8>) {
    if lines.is_empty() {
        return;
    }
    let Some(sink) = ACCESS_SINK.get() else {
        lines.clear();
        return;
    };
    let spare = sink
        .spare
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .pop();
    let full = std::mem::replace(lines, spare.unwrap_or_else(new_buffer));
    // Waits while the queue is full; fails only once the writer thread has stopped.
    let _ = sink.queue.send(Message::Chunk(full));
}

/// `tracing`'s writer for access-log events it formats itself (none while duet's own formatter is in
/// use): through the same buffers and writer thread as duet's lines.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AccessWriter;

impl Write for AccessWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write_access(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Ends the writer thread when dropped, once it has written what was queued before (waiting at most
/// [`SHUTDOWN_WAIT`]).
#[derive(Debug)]
pub(crate) struct Guard {
    queue: mpsc::SyncSender<Message>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        let (done, written) = mpsc::channel();
        let mut shutdown = Message::Shutdown(done);
        // The queue may be full (a stalled log): try until the deadline rather than wait on it forever.
        loop {
            match self.queue.try_send(shutdown) {
                Ok(()) => break,
                Err(mpsc::TrySendError::Disconnected(_)) => return,
                Err(mpsc::TrySendError::Full(message)) => {
                    if Instant::now() >= deadline {
                        eprintln!(
                            "duet: the access log's writer is stalled: queued lines are lost"
                        );
                        return;
                    }
                    shutdown = message;
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let _ = written.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

/// Starts the access log's writer thread, writing to `out`, and sends access-log lines
/// ([`write_access`], [`flush`]) to it from now on. Once per process: `None` if it was already started
/// (or the thread could not be).
pub(crate) fn start(out: impl Write + Send + 'static) -> io::Result<Option<Guard>> {
    if ACCESS_SINK.get().is_some() {
        return Ok(None);
    }
    let (queue, chunks) = mpsc::sync_channel(QUEUED);
    let spare = Arc::new(Mutex::new(Vec::new()));
    let returned = spare.clone();
    thread::Builder::new()
        .name("duet-access-log".into())
        .spawn(move || write_chunks(&chunks, &returned, out))?;
    let guard = Guard {
        queue: queue.clone(),
    };
    Ok(ACCESS_SINK
        .set(Sink { queue, spare })
        .is_ok()
        .then_some(guard))
}

/// The writer thread: each chunk with one write, its buffer then kept for reuse; until told to stop.
fn write_chunks(
    chunks: &mpsc::Receiver<Message>,
    spare: &Mutex<Vec<Vec<u8>>>,
    mut out: impl Write,
) {
    for message in chunks {
        match message {
            Message::Chunk(mut chunk) => {
                // As `tracing-appender` did, a failed write is not retried: the lines are lost.
                let _ = out.write_all(&chunk);
                chunk.clear();
                if chunk.capacity() >= CHUNK {
                    let mut spare = spare
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    if spare.len() < SPARE {
                        spare.push(chunk);
                    }
                }
            }
            Message::Shutdown(done) => {
                let _ = out.flush();
                let _ = done.send(());
                return;
            }
        }
    }
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer whose bytes the test reads afterwards.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The only test that starts the writer thread (it is once per process).
    #[test]
    fn every_line_is_written_whole_and_in_order_by_the_time_the_guard_drops() {
        let out = Shared::default();
        let guard = start(out.clone())
            .expect("spawn the writer thread")
            .expect("first start");
        assert!(
            start(Shared::default()).expect("no thread").is_none(),
            "once"
        );
        let line =
            |thread: usize, i: usize| format!("thread={thread} line={i} {}\n", "x".repeat(i % 300));
        // Two buffering workers (several chunks each, the last one partial) and a thread writing through.
        let workers: Vec<_> = (0..2)
            .map(|thread| {
                std::thread::spawn(move || {
                    buffer_this_thread();
                    for i in 0..1_000 {
                        write_access(line(thread, i).as_bytes());
                    }
                    flush();
                })
            })
            .collect();
        for i in 0..50 {
            write_access(line(2, i).as_bytes());
        }
        for worker in workers {
            worker.join().expect("worker");
        }
        drop(guard);
        let written = out.0.lock().expect("written").clone();
        let written = String::from_utf8(written).expect("whole lines");
        let mut next = [0usize; 3];
        for text in written.lines() {
            let thread: usize = text["thread=".len()..]
                .split(' ')
                .next()
                .and_then(|t| t.parse().ok())
                .expect("a thread");
            assert_eq!(
                format!("{text}\n"),
                line(thread, next[thread]),
                "whole, in order"
            );
            next[thread] += 1;
        }
        assert_eq!(next, [1_000, 1_000, 50], "every line");
        assert!(written.ends_with('\n'));
        // After the writer has stopped, lines go nowhere, and nothing waits.
        write_access(b"late\n");
    }
}
