use std::{error::Error, fmt};

/// A type-erased error, as tower uses: the inner service's error, or one of this crate's.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// The balancer had no endpoint it could send the request to.
///
/// Every endpoint is either removed, marked ineligible (unhealthy, ejected, draining) or has weight 0.
/// A proxy should answer `503 Service Unavailable`; retrying later, after health checks re-admit an
/// endpoint, can succeed.
///
/// ```
/// use duet_balance::{Balancer, NoEligibleEndpoint, Strategy};
///
/// let mut balance: Balancer<&str, ()> = Balancer::new(Strategy::P2cInflight);
/// assert_eq!(balance.pick().err(), Some(NoEligibleEndpoint));
/// balance.insert("a", 0, ()); // weight 0: out of rotation
/// assert_eq!(balance.pick().err(), Some(NoEligibleEndpoint));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoEligibleEndpoint;

impl fmt::Display for NoEligibleEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("no eligible endpoint: every endpoint is removed, ineligible or has weight 0")
    }
}

impl Error for NoEligibleEndpoint {}

/// `call` was invoked without a successful `poll_ready` before it.
///
/// This is a bug in the caller: tower requires `poll_ready` to return `Ready(Ok(()))` before each `call`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct NotReady;

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Balancer::call without a successful poll_ready first; drive readiness with ServiceExt::ready")
    }
}

impl Error for NotReady {}
