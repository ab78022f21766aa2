//! Idle keep-alive client connections, parked outside of any task.
//!
//! An ingress holds many more idle keep-alive connections than busy ones. A connection that has been
//! idle for a moment leaves its task: its socket moves into the worker's [`ParkingLot`], an epoll set
//! of its own (nested in the worker's reactor as one descriptor), and what remains of it is one slot
//! of about 80 bytes: the socket, the client, its request count and its place under
//! `limits.max_connections`. No task, no reactor registration, no timer each: one task-free wait and
//! one deadline heap for all of them. The next request's first byte takes the connection out again,
//! into a new task (`Connections::resume`); a client that closes, or stays quiet past
//! `limits.keepalive_timeout`, is closed from here. A connection that has sent nothing yet waits here
//! for its first byte the same way (clients open connections ahead of their requests), and its first
//! bytes tell its protocol when it resumes. At `limits.max_connections` the longest idle are closed to make
//! room for new connections (`close_oldest`).
//!
//! Only plain TCP connections are parked here: a TLS connection's session state cannot leave its
//! task, so TLS connections park in their own task (`serve.rs`).

use crate::conn::place::Place;
use crate::{
    conn::{active::Active, io::Prefixed},
    peer::Client,
    telemetry::metrics::WorkerCounters,
};
use bytes::Bytes;
use mio::{net::TcpStream as MioStream, Events, Interest, Poll, Token};
use std::{
    cell::{Cell, RefCell},
    cmp::Reverse,
    collections::{BinaryHeap, VecDeque},
    io::{self, Read},
    os::fd::{AsRawFd, RawFd},
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};
use tokio::{io::unix::AsyncFd, net::TcpStream, sync::Notify, time::Instant};

/// What a parked connection keeps besides its socket, handed back with it when it resumes.
pub(crate) struct Parked {
    pub(crate) client: Client,
    /// Requests carried so far (for `limits.keepalive_requests`).
    pub(crate) requests: u64,
    /// Counts it as an open connection while it is parked.
    pub(crate) active: Active,
    /// Its place under `limits.max_connections`.
    pub(crate) permit: Place,
}

/// A parked connection whose next request has started to arrive: its socket, the request's first
/// byte, and what it had when it parked. Serve it with
/// [`Connections::resume`](crate::Connections::resume).
pub struct Resumed {
    pub(crate) stream: std::net::TcpStream,
    pub(crate) first_byte: u8,
    pub(crate) parked: Parked,
}

impl Resumed {
    /// The connection, its first byte put back in front, and what it kept while parked.
    pub(crate) fn into_parts(self) -> (io::Result<Prefixed<TcpStream>>, Parked) {
        let Resumed {
            stream,
            first_byte,
            parked,
        } = self;
        let io = TcpStream::from_std(stream).map(|io| Prefixed {
            prefix: Bytes::copy_from_slice(&[first_byte]),
            io,
        });
        (io, parked)
    }
}

/// One worker's parked connections.
pub(crate) struct ParkingLot {
    epoll: AsyncFd<Epoll>,
    lot: RefCell<Lot>,
    /// Wakes [`next`](Self::next) when a connection parks with a deadline earlier than any before it.
    earlier: Notify,
    counters: Arc<WorkerCounters>,
    /// Set at the drain: nothing parks any more.
    closed: Cell<bool>,
}

/// The lot's own epoll set, registered with the worker's reactor as one descriptor.
struct Epoll {
    fd: RawFd,
    poll: RefCell<(Poll, Events)>,
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

struct Lot {
    /// Indexed by the `Token` each socket is registered with.
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// When each parked connection's keep-alive wait ends: (deadline, slot, the slot's generation).
    /// An entry whose slot has since been emptied or reused is stale and skipped.
    deadlines: BinaryHeap<Reverse<(Instant, usize, u32)>>,
    stale: usize,
    /// Connections whose next request has started, not yet taken by `next`.
    ready: VecDeque<Resumed>,
}

struct Slot {
    generation: u32,
    parked: Option<(MioStream, Parked)>,
}

/// How many readiness events are read from the lot's epoll set at once.
const EVENTS: usize = 256;

impl ParkingLot {
    /// A lot for the current worker; needs the worker's runtime (its reactor).
    pub(crate) fn new(counters: Arc<WorkerCounters>) -> io::Result<Self> {
        let poll = Poll::new()?;
        let fd = poll.as_raw_fd();
        let epoll = Epoll {
            fd,
            poll: RefCell::new((poll, Events::with_capacity(EVENTS))),
        };
        // SAFETY: `fd` is the epoll descriptor of the `Poll` owned by this very `Epoll`, which the
        // `AsyncFd` owns in turn. Nothing ever replaces that `Poll` (its cell is only borrowed to
        // poll and to register), and a `Poll` closes its descriptor only when dropped, which happens
        // when the `AsyncFd` drops its inner value after deregistering it. So the descriptor stays
        // open and the same, and `as_raw_fd` returns that one value, for the whole registration.
        #[allow(unsafe_code)]
        let epoll =
            unsafe { AsyncFd::register_with_interest(epoll, tokio::io::Interest::READABLE) }
                .map_err(io::Error::from)?;
        Ok(Self {
            epoll,
            lot: RefCell::new(Lot {
                slots: Vec::new(),
                free: Vec::new(),
                deadlines: BinaryHeap::new(),
                stale: 0,
                ready: VecDeque::new(),
            }),
            earlier: Notify::new(),
            counters,
            closed: Cell::new(false),
        })
    }

    /// Parks `stream` until its next request's first byte arrives or `deadline` passes. A socket the
    /// lot cannot watch is closed.
    pub(crate) fn park(&self, stream: std::net::TcpStream, parked: Parked, deadline: Instant) {
        if self.closed.get() {
            return;
        }
        let mut stream = MioStream::from_std(stream);
        let mut lot = self.lot.borrow_mut();
        let index = lot.free.pop().unwrap_or_else(|| {
            lot.slots.push(Slot {
                generation: 0,
                parked: None,
            });
            lot.slots.len() - 1
        });
        let registered = {
            let poll = self.epoll.get_ref().poll.borrow();
            poll.0
                .registry()
                .register(&mut stream, Token(index), Interest::READABLE)
        };
        if let Err(error) = registered {
            lot.free.push(index);
            tracing::debug!(target: "duet::conn", peer = %parked.client.address, "closing instead of parking: {error}");
            return;
        }
        let earliest = lot.deadlines.peek().map(|Reverse((at, _, _))| *at);
        let slot = &mut lot.slots[index];
        slot.parked = Some((stream, parked));
        let generation = slot.generation;
        lot.deadlines.push(Reverse((deadline, index, generation)));
        lot.compact();
        self.counters.parked.fetch_add(1, Relaxed);
        self.counters.parks.fetch_add(1, Relaxed);
        if earliest.is_none_or(|earliest| deadline < earliest) {
            self.earlier.notify_one();
        }
    }

    /// Waits until a parked connection's next request starts to arrive, closing on the way those
    /// whose client left or whose keep-alive wait ran out. Cancel-safe: a connection found ready is
    /// kept for the next call.
    pub(crate) async fn next(&self) -> Resumed {
        loop {
            if let Some(resumed) = self.lot.borrow_mut().ready.pop_front() {
                return resumed;
            }
            let earliest = self.lot.borrow().deadlines.peek().map(|r| r.0 .0);
            let expiry = async {
                match earliest {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ready = self.epoll.readable() => match ready {
                    Ok(mut guard) => {
                        self.collect();
                        // Safe against a lost wake-up: tokio clears only the readiness this guard
                        // saw, not an event that arrived since.
                        guard.clear_ready();
                    }
                    Err(error) => {
                        tracing::warn!("parked connections cannot be watched: {error}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                },
                () = expiry => self.expire(Instant::now()),
                () = self.earlier.notified() => {}
            }
        }
    }

    /// At the drain: every connection whose next request has started to arrive is returned, to be
    /// served (its response says `Connection: close`); every other one is closed now.
    pub(crate) fn close_all(&self) -> Vec<Resumed> {
        self.closed.set(true);
        self.collect();
        let mut lot = self.lot.borrow_mut();
        let mut closed = 0;
        for slot in &mut lot.slots {
            if slot.parked.take().is_some() {
                closed += 1;
            }
        }
        lot.free.clear();
        lot.slots.clear();
        lot.deadlines.clear();
        lot.stale = 0;
        self.counters.parked.fetch_sub(closed, Relaxed);
        lot.ready.drain(..).collect()
    }

    /// Reads what the lot's epoll set has to say, until it has nothing more.
    fn collect(&self) {
        let mut poll = self.epoll.get_ref().poll.borrow_mut();
        let (poll, events) = &mut *poll;
        loop {
            if let Err(error) = poll.poll(events, Some(Duration::ZERO)) {
                if error.kind() != io::ErrorKind::Interrupted {
                    tracing::warn!("reading parked connections' readiness failed: {error}");
                    return;
                }
                continue;
            }
            let mut seen = 0;
            for event in events.iter() {
                seen += 1;
                self.wake(poll, event.token().0);
            }
            if seen < EVENTS {
                return;
            }
        }
    }

    /// A parked socket became readable: a request's first byte (resume it), the client's close or an
    /// error (close it), or nothing after all (keep it parked).
    fn wake(&self, poll: &Poll, index: usize) {
        let mut lot = self.lot.borrow_mut();
        let Some(Slot {
            parked: Some((stream, _)),
            ..
        }) = lot.slots.get(index)
        else {
            return;
        };
        let mut byte = [0u8; 1];
        let read = loop {
            match (&*stream).read(&mut byte) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                read => break read,
            }
        };
        match read {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
            read => {
                // Its deadline entry stays behind, stale (unless the lot empties and starts over).
                lot.stale += 1;
                let Some((mut stream, parked)) = lot.take(index) else {
                    return;
                };
                self.counters.parked.fetch_sub(1, Relaxed);
                if let Ok(1) = read {
                    // Leaves this epoll set before the worker's reactor takes it.
                    match poll.registry().deregister(&mut stream) {
                        Ok(()) => lot.ready.push_back(Resumed {
                            stream: stream.into(),
                            first_byte: byte[0],
                            parked,
                        }),
                        Err(error) => {
                            tracing::debug!(target: "duet::conn", peer = %parked.client.address, "closing a parked connection: {error}")
                        }
                    }
                }
                // Otherwise the client closed (or failed): dropping the socket closes it, and
                // closing it removes it from the epoll set.
            }
        }
    }

    /// Closes every parked connection whose keep-alive wait has run out by `now`.
    fn expire(&self, now: Instant) {
        let mut lot = self.lot.borrow_mut();
        let mut closed = 0;
        while let Some(&Reverse((at, index, generation))) = lot.deadlines.peek() {
            if at > now {
                break;
            }
            lot.deadlines.pop();
            let live = lot.slots.get(index).map(|s| s.generation) == Some(generation);
            if live && lot.take(index).is_some() {
                closed += 1;
            } else {
                lot.stale = lot.stale.saturating_sub(1);
            }
        }
        if closed > 0 {
            self.counters.parked.fetch_sub(closed, Relaxed);
            tracing::trace!(target: "duet::conn", closed, "closed idle keep-alive connections");
        }
    }

    /// Closes up to `count` parked connections, those whose wait ends soonest first: the longest idle,
    /// whether kept alive after a request or opened ahead of their first. Connections whose next request has started are kept.
    /// Returns how many were closed; each gives its place under `limits.max_connections` back.
    pub(crate) fn close_oldest(&self, count: u64) -> u64 {
        // A connection whose next request is already in its socket is not idle: take it out first
        // (and wake `next`, which hands it on; the readiness it would have waited for is spent).
        self.collect();
        if !self.lot.borrow().ready.is_empty() {
            self.earlier.notify_one();
        }
        let mut lot = self.lot.borrow_mut();
        let mut closed = 0;
        while closed < count {
            let Some(Reverse((_, index, generation))) = lot.deadlines.pop() else {
                break;
            };
            let live = lot.slots.get(index).map(|s| s.generation) == Some(generation);
            // Dropping the socket closes it (and takes it out of the epoll set); dropping its permit
            // gives its place back.
            if live && lot.take(index).is_some() {
                closed += 1;
            } else {
                lot.stale = lot.stale.saturating_sub(1);
            }
        }
        self.counters.parked.fetch_sub(closed, Relaxed);
        closed
    }

    /// Connections parked now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lot
            .borrow()
            .slots
            .iter()
            .filter(|s| s.parked.is_some())
            .count()
    }
}

impl Lot {
    /// Empties a slot for reuse; its deadline entry becomes stale. The last one out gives back what
    /// a crowd made the lot grow to.
    fn take(&mut self, index: usize) -> Option<(MioStream, Parked)> {
        let slot = self.slots.get_mut(index)?;
        let taken = slot.parked.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        if self.free.len() == self.slots.len() {
            self.slots = Vec::new();
            self.free = Vec::new();
            self.deadlines = BinaryHeap::new();
            self.stale = 0;
        }
        Some(taken)
    }

    /// Drops stale deadline entries once they outnumber the live ones: connections that park and
    /// resume often would otherwise leave one behind each time until its deadline.
    fn compact(&mut self) {
        let live = self.slots.len() - self.free.len();
        if self.stale > 1024 && self.stale > live {
            let slots = &self.slots;
            self.deadlines.retain(|Reverse((_, index, generation))| {
                slots
                    .get(*index)
                    .is_some_and(|s| s.generation == *generation && s.parked.is_some())
            });
            self.stale = 0;
        }
    }
}
