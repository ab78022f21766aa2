//! `X-Request-Id`: one id per request, forwarded to the backend and written in the access log, so a
//! request can be followed from duet's log into the backend's.
//!
//! A trusted peer's (`trusted_proxies`) id is kept when it is well formed, so a chain of proxies shares
//! one id; anyone else's is replaced. A new id is 32 hex digits: a per-worker random prefix drawn from
//! the operating system once, and the worker's request count. Unique across workers and processes with
//! the odds of a 64-bit collision, and no random draw per request (Envoy draws a UUID v4 each time).
//!
//! Ids are written [`BLOCK`] at a time into one buffer and handed out as slices of it: a slice of a
//! shared buffer costs a reference count, where a value of its own would cost an allocation, and
//! another at its first clone (the access log keeps one).

use bytes::{BufMut, Bytes, BytesMut};
use duet_balance::Draws;
use http::{header::Entry, HeaderMap, HeaderName, HeaderValue};
use std::cell::{Cell, RefCell};

pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest id kept from a trusted peer.
const MAX_LENGTH: usize = 128;

/// Ids written at once (2 KiB). A request that outlives the rest of its block (a tunnel, a long
/// download) keeps the block alive through its id: small enough that this stays a few percent of what
/// a request in flight holds anyway (~55 KiB), large enough that allocations are 1/32 per request.
const BLOCK: usize = 64;
const _: () = assert!(
    BLOCK <= 256 && 256 % BLOCK == 0,
    "a block's ids share all but the last byte"
);

/// Hex digits in an id.
const ID_LENGTH: usize = 32;

/// One worker's source of request ids.
pub(crate) struct RequestIds {
    prefix: u64,
    /// The count of the next block's first id.
    next: Cell<u64>,
    /// The ids of the current block not handed out yet.
    block: RefCell<Bytes>,
}

impl RequestIds {
    pub(crate) fn new() -> Self {
        Self {
            prefix: Draws::from_os().next_draw(),
            next: Cell::new(0),
            block: RefCell::new(Bytes::new()),
        }
    }

    /// The next new id: a slice of the current block, a new block when it is used up.
    fn next_id(&self) -> Bytes {
        let mut block = self.block.borrow_mut();
        if block.is_empty() {
            let first = self.next.get();
            self.next.set(first.wrapping_add(BLOCK as u64));
            let mut ids = BytesMut::with_capacity(BLOCK * ID_LENGTH);
            let mut digits = [0u8; ID_LENGTH];
            hex(self.prefix, &mut digits[..ID_LENGTH / 2]);
            hex(first, &mut digits[ID_LENGTH / 2..]);
            // A block starts at a multiple of BLOCK (≤ 256): its ids differ in the count's last byte
            // alone, so each is the first with its last two digits rewritten.
            let low = first as u8;
            for k in 0..BLOCK as u8 {
                hex(u64::from(low.wrapping_add(k)), &mut digits[ID_LENGTH - 2..]);
                ids.put_slice(&digits);
            }
            *block = ids.freeze();
        }
        block.split_to(ID_LENGTH)
    }

    /// Keeps a trusted peer's well-formed `X-Request-Id`, or sets a new one; returns it.
    pub(crate) fn assign(&self, headers: &mut HeaderMap, trusted: bool) -> HeaderValue {
        if trusted {
            return self.assign_trusted(headers);
        }
        let id = self.new_id();
        headers.insert(X_REQUEST_ID, id.clone());
        id
    }

    /// [`RequestIds::assign`] for a trusted peer: one hashed look-up, whether its id is kept or
    /// replaced. Apart, so that the untrusted path's code stays as lean as before it.
    #[inline(never)]
    fn assign_trusted(&self, headers: &mut HeaderMap) -> HeaderValue {
        match headers.entry(X_REQUEST_ID) {
            Entry::Occupied(theirs) if well_formed(theirs.get()) => theirs.get().clone(),
            Entry::Occupied(mut theirs) => {
                let id = self.new_id();
                theirs.insert(id.clone());
                id
            }
            Entry::Vacant(none) => none.insert(self.new_id()).clone(),
        }
    }

    #[inline]
    fn new_id(&self) -> HeaderValue {
        let digits = self.next_id();
        // SAFETY: an id is hex digits (`hex`), ASCII and visible, so valid UTF-8 and a valid field
        // value: the check from_maybe_shared would make (a pass over its 32 bytes) cannot fail.
        #[allow(unsafe_code)]
        unsafe {
            HeaderValue::from_maybe_shared_unchecked(digits)
        }
    }
}

/// Visible ASCII only (no spaces: it is a token in logs), 1 to 128 bytes.
fn well_formed(id: &HeaderValue) -> bool {
    let bytes = id.as_bytes();
    !bytes.is_empty() && bytes.len() <= MAX_LENGTH && bytes.iter().all(u8::is_ascii_graphic)
}

fn hex(value: u64, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let last = out.len() - 1;
    for (i, byte) in out.iter_mut().enumerate() {
        let shift = 4 * (last - i);
        *byte = DIGITS[((value >> shift) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_are_distinct_and_only_a_trusted_peers_well_formed_id_is_kept() {
        let ids = RequestIds::new();
        let mut headers = HeaderMap::new();
        let first = ids.assign(&mut headers, false);
        let second = ids.assign(&mut HeaderMap::new(), false);
        assert_eq!(first.len(), 32);
        assert_ne!(first, second);
        assert_eq!(headers.get(X_REQUEST_ID), Some(&first), "forwarded");
        assert_eq!(
            &first.as_bytes()[..16],
            &second.as_bytes()[..16],
            "one prefix per worker"
        );

        let theirs = HeaderValue::from_static("abc-123");
        let mut headers = HeaderMap::new();
        headers.insert(X_REQUEST_ID, theirs.clone());
        assert_eq!(
            ids.assign(&mut headers.clone(), true),
            theirs,
            "a trusted peer's id is kept"
        );
        assert_ne!(
            ids.assign(&mut headers, false),
            theirs,
            "anyone else's is replaced"
        );
        for bad in ["has space", ""] {
            let mut headers = HeaderMap::new();
            headers.insert(X_REQUEST_ID, HeaderValue::from_static(bad));
            assert_ne!(ids.assign(&mut headers, true).as_bytes(), bad.as_bytes());
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            X_REQUEST_ID,
            HeaderValue::from_str(&"x".repeat(129)).expect("value"),
        );
        assert_eq!(
            ids.assign(&mut headers, true).len(),
            32,
            "too long: replaced"
        );
    }

    #[test]
    fn ids_stay_distinct_and_sequential_across_blocks() {
        let ids = RequestIds::new();
        let all: Vec<HeaderValue> = (0..3 * BLOCK + 7)
            .map(|_| ids.assign(&mut HeaderMap::new(), false))
            .collect();
        let prefix = &all[0].as_bytes()[..ID_LENGTH / 2];
        for (k, id) in all.iter().enumerate() {
            let text = id.to_str().expect("hex digits are ASCII");
            assert_eq!(text.len(), ID_LENGTH);
            assert_eq!(&id.as_bytes()[..ID_LENGTH / 2], prefix, "one prefix");
            let count = u64::from_str_radix(&text[ID_LENGTH / 2..], 16).expect("hex");
            assert_eq!(count, k as u64, "the worker's request count, in order");
        }
    }
}
