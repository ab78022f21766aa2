//! Heap slots per hyper connection for the service's futures, reused from request to request.
//!
//! hyper's HTTP/1.1 connection wants the service's future `Unpin` (`poll_without_shutdown`), and
//! `WorkerProxy::handle`'s is not: it has to live on the heap. Boxed per request, that is a malloc and
//! a free of its 2.8 KB (about 500 instructions a request, a size no allocator cache holds), and,
//! built on the stack and then moved into its box, a copy of those kilobytes or more (an HTTP/2
//! stream's future boxed with `Box::pin` cost 9,000 instructions of `memcpy` a request). Here the
//! future is built in a slot a finished request left, and dropped in place when hyper is done with
//! it, its slot kept for the next one. An HTTP/1.1 connection holds one request's future at a time, so
//! one spare slot is all it keeps ([`Recycler::new`]); an HTTP/2 connection holds one per open stream
//! and keeps a few ([`Recycler::keeping`]). The spares go with the connection (an HTTP/1.1
//! connection's when its turn of hyper ends, before it parks).

use std::{
    cell::RefCell,
    future::Future,
    mem::MaybeUninit,
    pin::Pin,
    rc::Rc,
    task::{Context, Poll},
};

/// A connection's spare slots, and the maker of its futures.
pub(crate) struct Recycler<F> {
    spare: Rc<Spares<F>>,
}

/// Slots whose futures are done, at most `keep` of them.
struct Spares<F> {
    slots: RefCell<Vec<Box<MaybeUninit<F>>>>,
    keep: usize,
}

impl<F> Recycler<F> {
    /// For futures made one at a time: one spare slot.
    pub(crate) fn new() -> Self {
        Self::keeping(1)
    }

    /// Keeps at most `keep` spare slots: enough for the futures that end between two new ones, not
    /// so many that an idle connection holds much memory.
    pub(crate) fn keeping(keep: usize) -> Self {
        Self {
            spare: Rc::new(Spares {
                slots: RefCell::new(Vec::new()),
                keep,
            }),
        }
    }

    /// `make`'s future, made into a spare slot (or a new one): made into the slot, not made on the
    /// stack and copied there (kilobytes).
    #[inline(always)]
    pub(crate) fn recycled(&self, make: impl FnOnce() -> F) -> Recycled<F> {
        let spare = self.spare.slots.borrow_mut().pop();
        let mut slot = spare.unwrap_or_else(Box::new_uninit);
        slot.write(make());
        Recycled {
            slot: Some(slot),
            spare: self.spare.clone(),
        }
    }
}

/// A future in a recycled slot: dropped in place at its end, its slot given back to the connection.
pub(crate) struct Recycled<F> {
    /// Always `Some`, initialised, until `drop` takes it.
    slot: Option<Box<MaybeUninit<F>>>,
    spare: Rc<Spares<F>>,
}

impl<F: Future> Future for Recycled<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // `Recycled` is `Unpin` (a box and an `Rc`): the future it points to is what must stay put.
        let Some(slot) = self.get_mut().slot.as_mut() else {
            return Poll::Pending;
        };
        #[allow(unsafe_code)]
        // SAFETY: the slot holds an initialised `F`: `recycled` wrote it, and only `drop` (which
        // consumes `self`) de-initialises it. Pinning: the `F` lives in its heap slot from `recycled`
        // to `drop`, never moved out of it (moving `Recycled` moves the box's pointer, not the `F`),
        // and `drop` drops it in place before the slot is reused or freed, which is what `Pin`
        // promises a pinned value.
        let future = unsafe { Pin::new_unchecked(slot.assume_init_mut()) };
        future.poll(cx)
    }
}

impl<F> Drop for Recycled<F> {
    fn drop(&mut self) {
        if let Some(mut slot) = self.slot.take() {
            #[allow(unsafe_code)]
            // SAFETY: the slot holds an initialised `F` (see `poll`), dropped here in place, once: the
            // slot has been taken out of `self`, and goes back to the spare as uninitialised memory.
            unsafe {
                slot.assume_init_drop()
            };
            let mut spares = self.spare.slots.borrow_mut();
            if spares.len() < self.spare.keep {
                spares.push(slot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// A future that notes its drop, ready at its second poll.
    struct Noted {
        polls: u32,
        log: Rc<RefCell<Vec<&'static str>>>,
        name: &'static str,
    }

    impl Future for Noted {
        type Output = &'static str;
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<&'static str> {
            self.polls += 1;
            if self.polls < 2 {
                Poll::Pending
            } else {
                Poll::Ready(self.name)
            }
        }
    }

    /// The maker of a [`Noted`] named `name`, noting in `log`.
    fn noted(log: &Rc<RefCell<Vec<&'static str>>>, name: &'static str) -> impl FnOnce() -> Noted {
        let log = log.clone();
        move || Noted {
            polls: 0,
            log,
            name,
        }
    }

    impl Drop for Noted {
        fn drop(&mut self) {
            self.log.borrow_mut().push(self.name);
        }
    }

    #[test]
    fn futures_run_and_drop_in_one_reused_slot() {
        let mut cx = Context::from_waker(Waker::noop());
        let log = Rc::new(RefCell::new(Vec::new()));
        let recycler = Recycler::new();
        let make = |name| noted(&log, name);
        let mut first = recycler.recycled(make("first"));
        let address = first.slot.as_deref().map(|slot| slot as *const _);
        assert!(Pin::new(&mut first).poll(&mut cx).is_pending());
        assert_eq!(Pin::new(&mut first).poll(&mut cx), Poll::Ready("first"));
        drop(first);
        assert_eq!(*log.borrow(), ["first"]);
        let mut second = recycler.recycled(make("second"));
        assert_eq!(
            second.slot.as_deref().map(|slot| slot as *const _),
            address,
            "the first future's slot"
        );
        // Two at once: the second has the slot, the third a new one.
        let third = recycler.recycled(make("third"));
        assert!(Pin::new(&mut second).poll(&mut cx).is_pending());
        drop(third);
        drop(second);
        assert_eq!(*log.borrow(), ["first", "third", "second"]);
        assert_eq!(recycler.spare.slots.borrow().len(), 1, "one spare kept");
        drop(recycler);
    }

    #[test]
    fn a_recycler_keeping_several_reuses_each_and_keeps_no_more() {
        let mut cx = Context::from_waker(Waker::noop());
        let log = Rc::new(RefCell::new(Vec::new()));
        let recycler = Recycler::keeping(2);
        let make = |name| noted(&log, name);
        let open: Vec<_> = ["a", "b", "c"]
            .map(|name| recycler.recycled(make(name)))
            .into_iter()
            .collect();
        let addresses: Vec<_> = open
            .iter()
            .map(|f| f.slot.as_deref().map(|slot| slot as *const _))
            .collect();
        drop(open);
        assert_eq!(*log.borrow(), ["a", "b", "c"]);
        assert_eq!(
            recycler.spare.slots.borrow().len(),
            2,
            "two kept, one freed"
        );
        let mut again = [recycler.recycled(make("d")), recycler.recycled(make("e"))];
        for future in &again {
            let address = future.slot.as_deref().map(|slot| slot as *const _);
            assert!(addresses.contains(&address), "made in a kept slot");
        }
        for future in &mut again {
            assert!(Pin::new(future).poll(&mut cx).is_pending());
        }
        drop(again);
        assert_eq!(*log.borrow(), ["a", "b", "c", "d", "e"]);
    }
}
