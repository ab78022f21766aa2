//! Access-log lines gathered per worker and handed to the log-writer thread in chunks.
//!
//! Handing each line to the writer thread costs a channel send and, when that thread is asleep (most of
//! the time: it keeps up), a futex wake and a context switch, then a write syscall per line: a tenth of
//! duet's throughput under a closed-loop benchmark. A worker instead appends its access-log lines to a
//! buffer of its own and hands the buffer over when it passes [`CHUNK`] bytes, and at least every
//! [`FLUSH_EVERY`] (so a line reaches the log within a fraction of a second, as nginx's `access_log ...
//! buffer= flush=` does). The writer thread then writes a chunk with one syscall. Other threads, and
//! every other log line, write through at once.

use std::{
    cell::RefCell,
    io::{self, Write},
    sync::OnceLock,
    time::Duration,
};
use tracing_appender::non_blocking::NonBlocking;
use tracing_subscriber::fmt::MakeWriter;

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

/// The log's writer: access-log lines (target `duet::access`) to `access`, buffered on threads that
/// asked for it; everything else to `rest`, at once.
#[derive(Clone)]
pub(crate) struct AccessLogWriter<R> {
    access: NonBlocking,
    rest: R,
}

impl<R> AccessLogWriter<R> {
    pub(crate) fn new(access: NonBlocking, rest: R) -> Self {
        let _ = ACCESS_SINK.set(access.clone());
        Self { access, rest }
    }
}

/// One event's writer.
pub(crate) enum EventWriter<W> {
    /// Appends to this thread's buffer.
    Buffered,
    Direct(W),
}

impl<W: Write> Write for EventWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Self::Direct(writer) => writer.write(bytes),
            Self::Buffered => {
                write_access(bytes);
                Ok(bytes.len())
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Direct(writer) => writer.flush(),
            Self::Buffered => Ok(()),
        }
    }
}

impl<'a, R> MakeWriter<'a> for AccessLogWriter<R>
where
    R: MakeWriter<'a>,
{
    type Writer = EventWriter<EitherWriter<NonBlocking, R::Writer>>;

    fn make_writer(&'a self) -> Self::Writer {
        EventWriter::Direct(EitherWriter::Rest(self.rest.make_writer()))
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        if meta.target() != "duet::access" {
            return EventWriter::Direct(EitherWriter::Rest(self.rest.make_writer_for(meta)));
        }
        let buffering = BUFFER.with(|buffer| buffer.borrow().is_some());
        if buffering {
            EventWriter::Buffered
        } else {
            EventWriter::Direct(EitherWriter::Access(self.access.clone()))
        }
    }
}

/// The access log's writer or the rest's.
pub(crate) enum EitherWriter<A, B> {
    Access(A),
    Rest(B),
}

impl<A: Write, B: Write> Write for EitherWriter<A, B> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            Self::Access(writer) => writer.write(bytes),
            Self::Rest(writer) => writer.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Access(writer) => writer.flush(),
            Self::Rest(writer) => writer.flush(),
        }
    }
}
