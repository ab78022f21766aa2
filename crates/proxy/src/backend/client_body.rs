//! The client's request body as duet reads it: every wait bounded by `limits.body_read_timeout`, and
//! the whole upload by `limits.min_upload_rate`, whether it is streamed to a backend or read in full
//! first (`buffer_request`).

use bytes::Bytes;
use http_body::{Body, Frame};
use hyper::body::Incoming;
use std::{
    fmt,
    future::{poll_fn, Future},
    num::NonZeroU64,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::{Instant, Sleep};

/// How a route's request bodies are read: the limits of `limits` that apply to a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyPace {
    /// Longest wait for the next piece (`limits.body_read_timeout`).
    pub(crate) idle_timeout: Duration,
    /// The slowest a body may arrive, if there is a floor (`limits.min_upload_rate`).
    pub(crate) floor: Option<UploadFloor>,
}

impl BodyPace {
    pub(crate) fn new(limits: &duet_config::Limits) -> Self {
        Self {
            idle_timeout: limits.body_read_timeout,
            floor: NonZeroU64::new(limits.min_upload_rate).map(|bytes_per_second| UploadFloor {
                bytes_per_second,
                grace: limits.upload_rate_grace,
            }),
        }
    }
}

/// `limits.min_upload_rate` and its grace: after the grace, each byte received buys the client
/// `1 / bytes_per_second` more seconds (Apache's `mod_reqtimeout` `MinRate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UploadFloor {
    pub(crate) bytes_per_second: NonZeroU64,
    pub(crate) grace: Duration,
}

impl UploadFloor {
    /// The time `received` bytes have earned: the grace, plus what they are worth at the floor.
    fn allowance(&self, received: u64) -> Duration {
        let rate = self.bytes_per_second.get();
        let nanos = u128::from(received % rate) * 1_000_000_000 / u128::from(rate);
        // `nanos` is below 10^9: the fraction of a second that the remainder is worth.
        let earned = Duration::new(received / rate, nanos as u32);
        self.grace.saturating_add(earned)
    }
}

/// Where a body stands against its floor. Only time spent waiting on the client counts: a streamed
/// body that waits on a slow backend is not read, and that is not the client's fault.
#[derive(Debug)]
struct Pace {
    floor: UploadFloor,
    received: u64,
    /// The waits on the client that have ended, added up.
    waited: Duration,
    /// When the wait going on now began.
    waiting_since: Option<Instant>,
}

impl Pace {
    /// When the current wait (begun at `now` if none is going on) puts the client under the floor;
    /// `None` if that is too far off to name.
    fn deadline(&mut self, now: Instant) -> Option<Instant> {
        let since = *self.waiting_since.get_or_insert(now);
        let left = self
            .floor
            .allowance(self.received)
            .saturating_sub(self.waited);
        since.checked_add(left)
    }

    /// `bytes` arrived: a wait going on ends.
    fn arrived(&mut self, bytes: u64) {
        if let Some(since) = self.waiting_since.take() {
            self.waited += since.elapsed();
        }
        self.received = self.received.saturating_add(bytes);
    }
}

/// How reading the client's body failed.
#[derive(Debug)]
pub(crate) enum BodyError {
    /// Malformed chunking, or the client went away mid-body.
    Broken(hyper::Error),
    /// Nothing arrived for `limits.body_read_timeout`.
    Stalled,
    /// The body fell behind `limits.min_upload_rate`.
    TooSlow,
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Broken(error) => error.fmt(f),
            Self::Stalled => f.write_str("the client stopped sending its request body"),
            Self::TooSlow => f.write_str("the client sent its request body below the upload floor"),
        }
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Broken(error) => Some(error),
            _ => None,
        }
    }
}

/// Why a body could not be read in full.
#[derive(Debug)]
pub(crate) enum BufferError {
    /// It is larger than the limit it was read under.
    TooLarge,
    /// Holding more of it was not admitted (the worker's budget for bodies read in full is spent).
    NotAdmitted,
    /// The client's side failed.
    Client(BodyError),
}

/// The client's body with the limits it is read under.
#[derive(Debug)]
pub(crate) struct ClientBody {
    body: Incoming,
    idle_timeout: Duration,
    pace: Option<Pace>,
    /// When the current wait gives up, and the failure that will be.
    deadline: Option<(Pin<Box<Sleep>>, BodyTimer)>,
}

/// Which limit a wait runs into first.
#[derive(Debug, Clone, Copy)]
enum BodyTimer {
    Idle,
    Floor,
}

impl ClientBody {
    /// `body`, from now on read under `pace`.
    pub(crate) fn new(body: Incoming, pace: BodyPace) -> Self {
        Self {
            body,
            idle_timeout: pace.idle_timeout,
            pace: pace.floor.map(|floor| Pace {
                floor,
                received: 0,
                waited: Duration::ZERO,
                waiting_since: None,
            }),
            deadline: None,
        }
    }

    /// Whether the client's body has ended.
    pub(crate) fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    /// The next frame of the body, or why there will be none.
    pub(crate) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Pending => {
                let (sleep, timer) = self.deadline.get_or_insert_with(|| {
                    let idle = tokio::time::sleep(self.idle_timeout);
                    let floor = self.pace.as_mut().and_then(|p| p.deadline(Instant::now()));
                    match floor {
                        Some(at) if at < idle.deadline() => {
                            (Box::pin(tokio::time::sleep_until(at)), BodyTimer::Floor)
                        }
                        _ => (Box::pin(idle), BodyTimer::Idle),
                    }
                });
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                Poll::Ready(Some(Err(match timer {
                    BodyTimer::Idle => BodyError::Stalled,
                    BodyTimer::Floor => BodyError::TooSlow,
                })))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(BodyError::Broken(error)))),
            Poll::Ready(frame) => {
                // A frame (or the end) arrived: the next wait starts afresh.
                self.deadline = None;
                if let Some(pace) = &mut self.pace {
                    let length = frame
                        .as_ref()
                        .and_then(|f| f.as_ref().ok()?.data_ref().map(Bytes::len));
                    pace.arrived(length.unwrap_or(0) as u64);
                }
                Poll::Ready(frame.map(|f| f.map_err(BodyError::Broken)))
            }
        }
    }

    /// Reads the whole body, refusing it once it passes `limit` bytes, or once `admit` refuses to let
    /// it hold as many as it has read (asked before each frame is kept). Trailers are dropped: the
    /// body goes on with a `Content-Length`.
    pub(crate) async fn read_all(
        mut self,
        limit: usize,
        mut admit: impl FnMut(usize) -> bool,
    ) -> Result<Bytes, BufferError> {
        // Most bodies come in one frame: that frame is the body, not copied.
        let mut first: Option<Bytes> = None;
        let mut joined = Vec::new();
        while let Some(frame) = poll_fn(|cx| self.poll_frame(cx)).await {
            let data = match frame.map_err(BufferError::Client)?.into_data() {
                Ok(data) if !data.is_empty() => data,
                _ => continue,
            };
            let length = first.as_ref().map_or(joined.len(), Bytes::len) + data.len();
            if length > limit {
                return Err(BufferError::TooLarge);
            }
            if !admit(length) {
                return Err(BufferError::NotAdmitted);
            }
            let expected = self.body.size_hint().lower() as usize;
            match first.take() {
                None if joined.is_empty() => first = Some(data),
                earlier => {
                    let earlier = earlier.unwrap_or_default();
                    append(&mut joined, &earlier, length + expected, limit);
                    append(&mut joined, &data, length + expected, limit);
                }
            }
        }
        Ok(first.unwrap_or_else(|| Bytes::from(joined)))
    }
}

/// Appends `data`, growing `joined` by doubling toward `wanted` but never past `limit`: what a buffered
/// body holds is what `max_connections` × `buffer_request` bounds, not twice that.
fn append(joined: &mut Vec<u8>, data: &[u8], wanted: usize, limit: usize) {
    let needed = joined.len() + data.len();
    if needed > joined.capacity() {
        let capacity = (joined.capacity() * 2).max(wanted).min(limit).max(needed);
        joined.reserve_exact(capacity - joined.len());
    }
    joined.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floor(bytes_per_second: u64, grace_ms: u64) -> UploadFloor {
        UploadFloor {
            bytes_per_second: NonZeroU64::new(bytes_per_second).expect("above 0"),
            grace: Duration::from_millis(grace_ms),
        }
    }

    #[test]
    fn each_byte_buys_its_share_of_a_second_after_the_grace() {
        let kilobyte = floor(1000, 200);
        assert_eq!(kilobyte.allowance(0), Duration::from_millis(200));
        assert_eq!(kilobyte.allowance(500), Duration::from_millis(700));
        assert_eq!(kilobyte.allowance(2001), Duration::from_micros(2_201_000));
        let fastest = floor(u64::MAX, 0);
        assert_eq!(fastest.allowance(1), Duration::from_nanos(0));
        assert_eq!(
            floor(1, 2000).allowance(u64::MAX),
            Duration::MAX,
            "saturates, never panics"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn only_waits_on_the_client_count_against_the_floor() {
        let mut pace = Pace {
            floor: floor(100, 500),
            received: 0,
            waited: Duration::ZERO,
            waiting_since: None,
        };
        let start = Instant::now();
        assert_eq!(
            pace.deadline(start),
            Some(start + Duration::from_millis(500))
        );
        tokio::time::advance(Duration::from_millis(300)).await;
        // 10 bytes after 300 ms of waiting: 100 ms more earned, 300 ms spent.
        pace.arrived(10);
        // Then 1 s when duet did not read (a backend slow to take the body): not counted.
        tokio::time::advance(Duration::from_secs(1)).await;
        let now = Instant::now();
        assert_eq!(pace.deadline(now), Some(now + Duration::from_millis(300)));
        // A second look during the same wait names the same deadline.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(
            pace.deadline(Instant::now()),
            Some(now + Duration::from_millis(300))
        );
        tokio::time::advance(Duration::from_millis(400)).await;
        pace.arrived(0);
        let late = Instant::now();
        assert_eq!(pace.deadline(late), Some(late), "behind the floor: at once");
    }

    #[test]
    fn a_buffer_grows_by_doubling_but_never_past_its_limit() {
        let mut joined = Vec::new();
        append(&mut joined, &[1; 100], 100, 1000);
        assert_eq!(joined.capacity(), 100, "what the length announces");
        append(&mut joined, &[2; 10], 110, 1000);
        assert_eq!(joined.capacity(), 200, "doubled");
        append(&mut joined, &[3; 200], 310, 1000);
        assert_eq!(joined.capacity(), 400);
        append(&mut joined, &[4; 200], 510, 600);
        assert_eq!(joined.capacity(), 600, "the limit, not 800");
        assert_eq!(joined.len(), 510);
        assert_eq!(&joined[98..102], &[1, 1, 2, 2]);
    }
}
