//! Access-log lines gathered per worker and handed to the log-writer thread in chunks.
//!
//! Handing each line to the writer thread costs a channel send and, when that thread is asleep (most of
//! the time: it keeps up), a futex wake and a context switch, then a write syscall per line: a tenth of
//! duet's throughput under a closed-loop benchmark. A worker instead appends its access-log lines to a
//! buffer of its own and hands the buffer over when it passes [`CHUNK`] bytes, and at least every
//! [`FLUSH_EVERY`] (so a line reaches the log within a fraction of a second, as nginx's `access_log ...
//! buffer= flush=` does). The writer thread then writes a chunk with one syscall. Other threads write
//! through at once; every other log line goes through `tracing` as usual.

use std::{cell::RefCell, io::Write, sync::OnceLock, time::Duration};
use tracing_appender::non_blocking::NonBlocking;

/// A worker hands its buffer over past this many bytes.
pub(crate) const CHUNK: usize = 32 * 1024;

/// ... and at least this often.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(200);

/// Where buffered access-log lines go: the access log's writer thread.
static ACCESS_SINK: OnceLock<NonBlocking> = OnceLock::new();

thread_local! {
    /// This thread's buffered lines; `None` on threads that do not buffer.
    static BUFFER: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Makes the calling thread (a worker) buffer its access-log lines from now on.
pub(crate) fn buffer_this_thread() {
    BUFFER.with(|buffer| {
        buffer
            .borrow_mut()
            .get_or_insert_with(|| Vec::with_capacity(CHUNK + 1024));
    });
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
    BUFFER.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        match buffer.as_mut() {
            Some(lines) => {
                lines.extend_from_slice(bytes);
                if lines.len() >= CHUNK {
                    hand_over(lines);
                }
            }
            None => {
                if let Some(sink) = ACCESS_SINK.get() {
                    let _ = sink.clone().write_all(bytes);
                }
            }
        }
    });
}

fn hand_over(lines: &mut Vec<u8>) {
    if lines.is_empty() {
        return;
    }
    if let Some(sink) = ACCESS_SINK.get() {
        let mut sink = sink.clone();
        // The writer thread copies what it is given into its queue; the buffer is kept for reuse.
        let _ = sink.write_all(lines);
    }
    lines.clear();
}

/// Sends access-log lines (from [`write_access`] and [`flush`]) to `sink`, the access log's writer
/// thread. Set once, before the workers start.
pub(crate) fn set_sink(sink: NonBlocking) {
    let _ = ACCESS_SINK.set(sink);
}
