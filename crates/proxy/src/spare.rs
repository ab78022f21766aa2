//! Heap slots a thread keeps for values boxed once per request, so that a box given back is taken by a
//! later request: neither a malloc nor a free per request (about 140 instructions together with
//! glibc), and no allocation more per request for a value boxed to be cheap to move.
//!
//! Each user declares its thread's [`SpareBoxes`] in a `thread_local!` and goes through [`boxed`] and
//! [`recycle`], which do nothing on a thread being torn down (a new box, a freed one).

use std::{cell::RefCell, mem::MaybeUninit, thread::LocalKey};

/// A thread's spare boxes for `T`, at most `kept` of them.
pub(crate) struct SpareBoxes<T> {
    boxes: RefCell<Vec<Box<MaybeUninit<T>>>>,
    kept: usize,
}

impl<T> SpareBoxes<T> {
    /// None yet; `kept` at most once given back.
    pub(crate) const fn new(kept: usize) -> Self {
        Self {
            boxes: RefCell::new(Vec::new()),
            kept,
        }
    }

    fn take(&self) -> Option<Box<MaybeUninit<T>>> {
        self.boxes.try_borrow_mut().ok()?.pop()
    }

    /// Whether one more box may be kept (room made for it, so that keeping it cannot allocate).
    fn has_room(&self) -> bool {
        let Ok(mut boxes) = self.boxes.try_borrow_mut() else {
            return false;
        };
        if boxes.len() >= self.kept {
            return false;
        }
        let room = self.kept - boxes.len();
        boxes.reserve(room);
        true
    }

    fn keep(&self, spare: Box<MaybeUninit<T>>) {
        if let Ok(mut boxes) = self.boxes.try_borrow_mut() {
            boxes.push(spare);
        }
    }

    /// How many boxes are kept now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.boxes.borrow().len()
    }
}

/// What `make` makes, in one of the thread's spare boxes or in a new one. Made once the box is at
/// hand, so that a value of many fields can be written into the box field by field rather than
/// assembled on the stack and then copied (a few hundred bytes, a `memcpy` call).
#[inline(always)]
pub(crate) fn boxed<T: 'static>(
    spare: &'static LocalKey<SpareBoxes<T>>,
    make: impl FnOnce() -> T,
) -> Box<T> {
    Box::write(slot(spare), make())
}

/// One of the thread's spare boxes, or a new one, uninitialised: for a value written into it field
/// by field ([`boxed`] when the compiler copies the value made rather than writing it in place).
#[inline(always)]
pub(crate) fn slot<T: 'static>(spare: &'static LocalKey<SpareBoxes<T>>) -> Box<MaybeUninit<T>> {
    (spare.try_with(SpareBoxes::take).ok().flatten()).unwrap_or_else(Box::new_uninit)
}

/// Drops `boxed`'s value in place now, and keeps its box for a later [`boxed`] unless the thread
/// keeps enough (then the box is freed).
pub(crate) fn recycle<T: 'static>(spare: &'static LocalKey<SpareBoxes<T>>, boxed: Box<T>) {
    if spare.try_with(SpareBoxes::has_room) != Ok(true) {
        return;
    }
    let raw = Box::into_raw(boxed);
    // SAFETY: `raw` is the pointer of a live value's box, which owned it: the value is dropped in
    // place once, and its allocation (a `MaybeUninit<T>`'s layout is a `T`'s) is owned again by a box
    // whose contents are never read before `Box::write` fills them. No borrow of the spare boxes is
    // held while the value drops, so its `Drop` may box and recycle values of its own.
    #[allow(unsafe_code)]
    let emptied = unsafe {
        std::ptr::drop_in_place(raw);
        Box::from_raw(raw.cast::<MaybeUninit<T>>())
    };
    let _ = spare.try_with(|boxes| boxes.keep(emptied));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{cell::Cell, rc::Rc};

    /// Counts its drops.
    struct Counted(Rc<Cell<u32>>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    thread_local! {
        static SPARE: SpareBoxes<Counted> = const { SpareBoxes::new(2) };
    }

    #[test]
    fn a_recycled_box_drops_its_value_once_and_is_the_next_one_taken() {
        let drops = Rc::new(Cell::new(0));
        let first = boxed(&SPARE, || Counted(drops.clone()));
        let address = std::ptr::from_ref(&*first);
        recycle(&SPARE, first);
        assert_eq!(drops.get(), 1, "dropped when given back");
        assert_eq!(SPARE.with(SpareBoxes::len), 1);
        let second = boxed(&SPARE, || Counted(drops.clone()));
        assert_eq!(std::ptr::from_ref(&*second), address, "the same allocation");
        assert_eq!(SPARE.with(SpareBoxes::len), 0);
        drop(second);
        assert_eq!(drops.get(), 2, "a box dropped as usual drops its value");

        // No more than `kept` are kept; every value is dropped once either way.
        for _ in 0..5 {
            recycle(&SPARE, Box::new(Counted(drops.clone())));
        }
        assert_eq!(SPARE.with(SpareBoxes::len), 2);
        assert_eq!(drops.get(), 7);
    }
}
