use crate::{
    error::{BoxError, NotReady},
    guard::LoadGuard,
};
use pin_project_lite::pin_project;
use std::{
    future::Future,
    pin::Pin,
    task::{ready, Context, Poll},
};
use tower::load::TrackCompletion;

pin_project! {
    /// The future of [`Balancer::call`](crate::Balancer): the inner service's response with its load
    /// tracked by the completion policy `C`.
    ///
    /// Dropping it before it resolves (cancellation) releases the endpoint's load.
    #[derive(Debug)]
    pub struct ResponseFuture<F, C> {
        #[pin]
        state: State<F>,
        guard: Option<LoadGuard>,
        completion: C,
    }
}

pin_project! {
    #[project = StateProj]
    #[derive(Debug)]
    enum State<F> {
        Called { #[pin] future: F },
        Failed { error: Option<BoxError> },
    }
}

impl<F, C> ResponseFuture<F, C> {
    pub(crate) fn called(future: F, guard: LoadGuard, completion: C) -> Self {
        Self {
            state: State::Called { future },
            guard: Some(guard),
            completion,
        }
    }

    pub(crate) fn failed(error: BoxError, completion: C) -> Self {
        Self {
            state: State::Failed { error: Some(error) },
            guard: None,
            completion,
        }
    }
}

impl<F, C, T, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
    C: TrackCompletion<LoadGuard, T>,
{
    type Output = Result<C::Output, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Called { future } => match ready!(future.poll(cx)) {
                Ok(response) => match this.guard.take() {
                    Some(guard) => {
                        Poll::Ready(Ok(this.completion.track_completion(guard, response)))
                    }
                    None => Poll::Ready(Err(NotReady.into())),
                },
                Err(error) => {
                    if let Some(mut guard) = this.guard.take() {
                        guard.on_failure();
                    }
                    Poll::Ready(Err(error.into()))
                }
            },
            StateProj::Failed { error } => {
                Poll::Ready(Err(error.take().unwrap_or_else(|| NotReady.into())))
            }
        }
    }
}
