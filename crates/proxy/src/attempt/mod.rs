//! One attempt's life after its backend answered: the response body relayed, and the one hook that
//! settles the attempt (load, latency, outlier verdict, access log) exactly once.

pub(crate) mod body;

pub(crate) mod completion;
