//! A copy of a request's header fields, kept while its header map itself travels with an attempt, for
//! the attempts after it (a retry, a resend after the keep-alive close race, a hedge).
//!
//! hyper consumes an attempt's request: once written, its header map is gone. Cloning the map for every
//! attempt that might be followed by another (any GET: a pooled connection may meet the close race)
//! cost two allocations, two frees and a copy of the hash index per request, about 1,000 instructions
//! with the original's drop (#30). The fields alone, in a vector a worker reuses, cost neither; the rare
//! attempt after the first rebuilds a map from them.

use http::{HeaderMap, HeaderName, HeaderValue};
use std::cell::RefCell;

type Fields = Vec<(HeaderName, HeaderValue)>;

/// Vectors given back, for this thread's next copies.
const KEPT: usize = 64;

/// A vector with room for more fields than this (a request with very many) is freed rather than kept.
const KEPT_CAPACITY: usize = 64;

thread_local! {
    static SPARE: RefCell<Vec<Fields>> = const { RefCell::new(Vec::new()) };
}

/// Every field of a header map, in the order the map iterates them (each name's values together, as
/// hyper writes them).
pub(crate) struct HeaderCopy {
    fields: Fields,
}

impl HeaderCopy {
    /// A copy of `headers`' fields: the values are shared, not copied (a reference count each).
    pub(crate) fn of(headers: &HeaderMap) -> Self {
        let mut fields = SPARE
            .try_with(|spare| spare.try_borrow_mut().ok()?.pop())
            .ok()
            .flatten()
            .unwrap_or_default();
        fields.reserve(headers.len());
        fields.extend(
            headers
                .iter()
                .map(|(name, value)| (name.clone(), value.clone())),
        );
        Self { fields }
    }

    /// A header map with the copied fields, in their order.
    pub(crate) fn to_map(&self) -> HeaderMap {
        // Sized for the fields but never failing: a name repeated past the index's limit (an HTTP/2
        // head may carry tens of thousands of values) is legal, and a map grows for it as it goes.
        let mut headers = HeaderMap::try_with_capacity(self.fields.len()).unwrap_or_default();
        for (name, value) in &self.fields {
            headers.append(name.clone(), value.clone());
        }
        headers
    }
}

impl Drop for HeaderCopy {
    fn drop(&mut self) {
        let mut fields = std::mem::take(&mut self.fields);
        if fields.capacity() == 0 || fields.capacity() > KEPT_CAPACITY {
            return;
        }
        fields.clear();
        let _ = SPARE.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut() {
                if spare.len() < KEPT {
                    spare.push(fields);
                }
            }
        });
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn map(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for &(name, value) in fields {
            headers.append(name, HeaderValue::from_static(value));
        }
        headers
    }

    /// The fields of `headers` as text, in the order hyper writes them.
    pub(crate) fn wire(headers: &HeaderMap) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or("?").to_owned()))
            .collect()
    }

    #[test]
    fn a_rebuilt_map_writes_every_field_in_the_original_order() {
        let original = map(&[
            ("host", "example.com"),
            ("x-forwarded-for", "10.0.0.1"),
            ("cookie", "a=1"),
            ("accept", "*/*"),
            ("cookie", "b=2"),
        ]);
        let copy = HeaderCopy::of(&original);
        let rebuilt = copy.to_map();
        assert_eq!(wire(&rebuilt), wire(&original));
        assert_eq!(rebuilt.get_all("cookie").iter().count(), 2);
        // Rebuilt again for a third attempt: the copy is left whole.
        assert_eq!(wire(&copy.to_map()), wire(&original));
    }

    #[test]
    fn a_name_repeated_past_the_index_limit_is_rebuilt_whole() {
        // More values than `HeaderMap::with_capacity` accepts (it panics past 24,576): legal for one
        // name, whose repeats take no index slot.
        let mut original = HeaderMap::new();
        for _ in 0..30_000 {
            original.append("x-many", HeaderValue::from_static("1"));
        }
        let rebuilt = HeaderCopy::of(&original).to_map();
        assert_eq!(rebuilt.get_all("x-many").iter().count(), 30_000);
    }

    #[test]
    fn a_dropped_copy_gives_its_vector_to_the_next_one() {
        let original = map(&[("host", "a"), ("accept", "*/*")]);
        let first = HeaderCopy::of(&original);
        let address = first.fields.as_ptr();
        drop(first);
        let second = HeaderCopy::of(&original);
        assert_eq!(second.fields.as_ptr(), address, "the same allocation");
        assert_eq!(second.fields.len(), 2, "and only this copy's fields");
    }
}
