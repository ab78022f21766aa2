//! One cluster as one worker sees it: its balancer, its client, its outlier view and its retry budget.
//!
//! Eligibility lives in one place: the balancer's flag for each endpoint (which metrics read through
//! [`EndpointLoad::is_eligible`](duet_balance::EndpointLoad::is_eligible)). It is derived, whenever either
//! input changes, from the two things that decide it: the control plane's health view and this worker's
//! outlier ejections.

use crate::{
    backend::client_body::BodyPace,
    backend::connect::Connector,
    backend::h2_pool::{h2_client, h2_client_over, H2Client},
    backend::outlier::Outliers,
    backend::pool::{upstream_client, upstream_client_over, UpstreamClient},
    backend::sticky::{Session, StickyCookies},
    backend::tls,
    backend::transport::Transport,
    telemetry::metrics::{BackendCell, BackendStats, ClusterCells, ClusterCounters},
    view::{Endpoint, HealthView, ResolvedNames},
};
use duet_balance::{Affinity, Balancer, LoadGuard, NoEligibleEndpoint, StatusSet, Strategy, Walk};
use duet_config::{
    HashAlgorithm, HashKey, HashPolicy, HashWalk, Policy, Timeouts, UpstreamProtocol,
};
use http::{uri::Authority, StatusCode};
use rustc_hash::FxBuildHasher;
use std::{
    cell::RefCell, collections::HashMap, net::SocketAddr, pin::Pin, rc::Rc, sync::Arc,
    time::Duration,
};
use tokio::time::{Instant, Sleep};
use tower::retry::budget::{Budget, TpsBudget};

/// The cluster's client: the previous one (its pooled connections, its TLS session cache) when the
/// timeouts (and an h2 cluster's windows) are the same and so is the TLS, files' contents included, else a new one. The files are
/// read again here on every reload, so a rotated CA or client certificate is picked up.
fn client(
    config: &duet_config::Cluster,
    previous: Option<&Cluster>,
    counters: &Arc<ClusterCounters>,
) -> Transport {
    let kept = previous
        .filter(|p| p.timeouts == config.timeouts)
        .map(|p| &p.client);
    match config.protocol {
        UpstreamProtocol::H2 => {
            let kept = kept.and_then(|client| match client {
                Transport::H2(client) if client.windows() == config.http2 => Some(client),
                _ => None,
            });
            let kept_connector = kept.map(H2Client::connector);
            Transport::H2(match (kept, connector(config, kept_connector, counters)) {
                (_, Some(connector)) => h2_client_over(&config.timeouts, config.http2, connector),
                (Some(client), None) => client.clone(),
                (None, None) => h2_client(&config.timeouts, config.http2),
            })
        }
        UpstreamProtocol::Http1 => {
            let kept = kept.and_then(|client| match client {
                Transport::Http1(client) => Some(client),
                Transport::H2(_) => None,
            });
            let kept_connector = kept.map(UpstreamClient::connector);
            Transport::Http1(match (kept, connector(config, kept_connector, counters)) {
                (_, Some(connector)) => upstream_client_over(&config.timeouts, connector),
                (Some(client), None) => client.clone(),
                (None, None) => upstream_client(&config.timeouts),
            })
        }
    }
}

/// A new connector, plain or TLS per the cluster's `tls`; `None` when `kept` (the previous client's)
/// already is the right one: plain for a plain cluster, TLS from the same settings and file contents.
fn connector(
    config: &duet_config::Cluster,
    kept: Option<&Connector>,
    counters: &Arc<ClusterCounters>,
) -> Option<Connector> {
    let sends = config.send_proxy_protocol;
    let kept = kept.filter(|connector| connector.proxy_protocol() == sends);
    let Some(settings) = &config.tls else {
        return match kept {
            Some(connector) if !connector.is_tls() => None,
            _ => Some(Connector::default().sending_proxy_protocol(sends)),
        };
    };
    let loaded = tls::load(settings).map(Arc::new).map_err(|e| e.to_string());
    if let (Some(connector), Ok(new)) = (kept, &loaded) {
        if connector.loaded().is_some_and(|old| old.same_as(new)) {
            return None;
        }
    }
    if let Err(why) = &loaded {
        // Checked before the reload reached the workers: only a file changed since then gets here.
        tracing::error!(cluster = %config.name, "backend TLS not set up, every connection fails: {why}");
    }
    Some(Connector::tls(loaded, counters.clone()).sending_proxy_protocol(sends))
}

/// The balancer of one cluster in one worker, keyed by backend address.
pub type ClusterBalance = Balancer<SocketAddr, Upstream>;

/// What the balancer holds for each backend: its address as the request target's authority, built
/// once rather than per request, and this worker's metric cells for it, so a pick finds them without
/// a lookup.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub(crate) authority: Authority,
    pub(crate) stats: Arc<BackendStats>,
}

/// The worker's current health view, shared by its clusters (replaced whole by the control plane).
pub(crate) type SharedHealth = Rc<RefCell<Arc<HealthView>>>;

/// One cluster in one worker.
pub(crate) struct Cluster {
    pub(crate) name: Arc<str>,
    policy: Policy,
    /// `policy: hash`'s settings.
    hash: Option<HashPolicy>,
    /// `sticky:`'s cookies.
    sticky: Option<StickyCookies>,
    timeouts: Timeouts,
    client: Transport,
    balance: RefCell<ClusterBalance>,
    health: SharedHealth,
    health_checked: bool,
    outliers: RefCell<Outliers>,
    pub(crate) budget: TpsBudget,
    pub(crate) attempts: u32,
    pub(crate) replay_body_limit: usize,
    /// How request bodies are read: `limits.body_read_timeout` and `limits.min_upload_rate`.
    pub(crate) body_pace: BodyPace,
    pub(crate) penalised: StatusSet,
    pub(crate) counters: Arc<ClusterCounters>,
    /// What this worker saw of each backend, by address (kept for the backends in the balancer).
    backend_stats: RefCell<HashMap<SocketAddr, Arc<BackendStats>, FxBuildHasher>>,
    /// Response-head timers kept for this cluster's next attempts.
    pub(crate) spare_timers: SpareTimers,
}

/// Timers kept for reuse by the attempts of one cluster in one worker (its runtime's timers). One handed
/// back stays in tokio's wheel: moving its deadline later, as the next attempt does (the cluster's
/// limit from a later now), is an atomic store, where a new timer costs an insert into the wheel and a
/// removal per request. A spare left unused fires once at its old deadline: a spurious wake-up of the
/// task that used it last.
#[derive(Default)]
pub(crate) struct SpareTimers(RefCell<Vec<Pin<Box<Sleep>>>>);

impl SpareTimers {
    /// Enough for the attempts a worker has waiting on one cluster at once, in the common case.
    const MAX: usize = 64;

    /// A timer due at `deadline`: a spare one if there is one.
    pub(crate) fn take(&self, deadline: Instant) -> Pin<Box<Sleep>> {
        match self.0.borrow_mut().pop() {
            Some(mut timer) => {
                timer.as_mut().reset(deadline);
                timer
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        }
    }

    pub(crate) fn give_back(&self, timer: Pin<Box<Sleep>>) {
        let mut spare = self.0.borrow_mut();
        if spare.len() < Self::MAX {
            spare.push(timer);
        }
    }
}

impl Cluster {
    /// A cluster's worker state over `endpoints`. `previous` is the cluster of the same name before a
    /// reload: with the same policy its balancer (load and latency of every address that remains) and
    /// outlier view carry over; with the same timeouts its client and pooled connections do.
    pub(crate) fn new(
        config: &duet_config::Cluster,
        previous: Option<&Cluster>,
        endpoints: &[Endpoint],
        health: SharedHealth,
        body_pace: BodyPace,
    ) -> Self {
        let penalised: StatusSet = config
            .penalty_statuses
            .iter()
            .filter_map(|&code| StatusCode::from_u16(code).ok())
            .collect();
        // A reload keeps a cluster's counters and histograms: its series never reset.
        let counters = previous.map_or_else(Arc::default, |p| p.counters.clone());
        let client = client(config, previous, &counters);
        let same = |p: &&Cluster| p.policy == config.policy && p.hash == config.hash;
        let (balance, outliers) = match previous.filter(same) {
            Some(previous) => previous.take_state(),
            None => (
                new_balance(config.policy, config.hash.as_ref()),
                Outliers::default(),
            ),
        };
        let balance = balance
            .with_panic_threshold(config.panic_threshold)
            .with_slow_start(config.slow_start);
        let retries = config.retries;
        let cluster = Self {
            name: Arc::from(config.name.as_str()),
            policy: config.policy,
            hash: config.hash.clone(),
            sticky: (config.sticky.as_ref()).map(|s| StickyCookies::new(&config.name, s)),
            timeouts: config.timeouts,
            client,
            balance: RefCell::new(balance),
            health,
            health_checked: config.health_check.is_some(),
            outliers: RefCell::new(outliers.configured(config.outlier_detection)),
            budget: TpsBudget::new(
                Duration::from_secs(10),
                retries.min_retries_per_second,
                retries.budget_fraction as f32,
            ),
            attempts: retries.attempts.max(1),
            replay_body_limit: retries.replay_body_limit,
            body_pace,
            penalised,
            counters,
            backend_stats: RefCell::new(
                previous.map_or_else(HashMap::default, |p| p.backend_stats.borrow().clone()),
            ),
            spare_timers: SpareTimers::default(),
        };
        cluster.set_endpoints(endpoints);
        cluster
    }

    /// Tells the TLS connector which host name each resolved address came from (the name its
    /// certificate is verified against when the cluster has no `server_name`).
    pub(crate) fn name_backends(&self, config: &duet_config::Cluster, names: &ResolvedNames) {
        let connector = match &self.client {
            Transport::Http1(client) => client.connector(),
            Transport::H2(client) => client.connector(),
        };
        connector.name_backends(config, names);
    }

    /// Moves the balancer and outlier view out (for the cluster that replaces this one after a
    /// reload), leaving empty ones for the requests still finishing here.
    fn take_state(&self) -> (ClusterBalance, Outliers) {
        let empty = new_balance(self.policy, self.hash.as_ref());
        let balance = std::mem::replace(&mut *self.balance.borrow_mut(), empty);
        let outliers = std::mem::take(&mut *self.outliers.borrow_mut());
        (balance, outliers)
    }

    /// Makes `endpoints` the balancer's membership: new addresses join (as a new endpoint would: PeakEWMA
    /// at the pool median), gone ones leave, the rest keep their state and take their new weight. No
    /// client, pool or connection is rebuilt.
    pub(crate) fn set_endpoints(&self, endpoints: &[Endpoint]) {
        let mut added = Vec::new();
        {
            let mut balance = self.balance.borrow_mut();
            balance.retain(|address| endpoints.iter().any(|e| e.address == *address));
            for endpoint in endpoints {
                if !balance.set_weight(&endpoint.address, endpoint.weight) {
                    let authority = Authority::try_from(endpoint.address.to_string().as_str())
                        .unwrap_or_else(|_| Authority::from_static("invalid"));
                    let stats = self.backend_stats(endpoint.address);
                    balance.insert(
                        endpoint.address,
                        endpoint.weight,
                        Upstream { authority, stats },
                    );
                    added.push(endpoint.address);
                }
            }
        }
        if let Some(sticky) = &self.sticky {
            sticky.set_backends(endpoints.iter().map(|e| e.address));
        }
        self.outliers.borrow_mut().retain(
            |address| endpoints.iter().any(|e| e.address == *address),
            endpoints.len(),
        );
        let now = Instant::now();
        for address in added {
            self.refresh(address, now);
        }
    }

    /// Takes over from the cluster this one replaced: eligibility is derived afresh from the health
    /// view and the outlier view carried over, and the ejections still running are timed from here
    /// (the old cluster's timers act on the old, emptied balancer).
    pub(crate) fn resume(self: &Rc<Self>) {
        let now = Instant::now();
        self.refresh_all(now);
        let ejected: Vec<(SocketAddr, Instant)> = self.outliers.borrow().ejected(now).collect();
        for (backend, until) in ejected {
            self.readmit_at(backend, until);
        }
    }

    /// Re-derives every endpoint's eligibility (after the health view changed).
    pub(crate) fn refresh_all(&self, now: Instant) {
        let addresses: Vec<SocketAddr> =
            self.balance.borrow().endpoints().map(|e| *e.key).collect();
        for address in addresses {
            self.refresh(address, now);
        }
    }

    /// Eligible = healthy (per the control plane; clusters without checks are always healthy) and not
    /// ejected by this worker.
    fn refresh(&self, backend: SocketAddr, now: Instant) {
        let healthy = self
            .health
            .borrow()
            .healthy(&self.name, backend)
            .unwrap_or(!self.health_checked);
        let ejected = self.outliers.borrow().is_ejected(backend, now);
        let eligible = healthy && !ejected;
        let mut balance = self.balance.borrow_mut();
        if balance.set_eligible(&backend, eligible) == Some(!eligible) {
            tracing::debug!(cluster = %self.name, %backend, eligible, healthy, ejected, panicking = balance.is_panicking(), "eligibility changed");
            let stats = self.backend_stats(backend);
            let cell = if eligible {
                &stats.admitted
            } else {
                &stats.removed
            };
            cell.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Picks a backend for one attempt among those not `tried` yet, and counts it as load until the
    /// returned guard is dropped: the backend the request's sticky `session` is bound to while it is
    /// eligible, else by the request's affinity `key` under `policy: hash` (its next candidate on a
    /// retry), else by the policy.
    pub(crate) fn pick(
        &self,
        tried: &[SocketAddr],
        (key, session): (Option<u64>, Session),
    ) -> Result<(SocketAddr, Upstream, LoadGuard), NoEligibleEndpoint> {
        let mut balance = self.balance.borrow_mut();
        let prefer = session.backend();
        let (address, upstream, guard) =
            balance.pick_and_claim_preferring(prefer.as_ref(), key, tried)?;
        Ok((*address, upstream.clone(), guard))
    }

    /// The request's sticky session: [`Session::Off`] unless the cluster has `sticky:`.
    pub(crate) fn session(&self, headers: &http::HeaderMap) -> Session {
        (self.sticky.as_ref()).map_or(Session::Off, |sticky| sticky.session(headers))
    }

    /// The `Set-Cookie` for `backend`'s answer to a request in `session` (`secure`: over TLS), if it
    /// needs one.
    pub(crate) fn sticky_cookie(
        &self,
        session: &Session,
        backend: SocketAddr,
        secure: bool,
    ) -> Option<http::HeaderValue> {
        (self.sticky.as_ref())?.set_cookie(*session, backend, secure)
    }

    /// What `policy: hash` keys requests by, if it is the policy.
    pub(crate) fn hash_key(&self) -> Option<&HashKey> {
        self.hash.as_ref().map(|hash| &hash.key)
    }

    /// The worker's client toward this cluster's backends.
    pub(crate) fn client(&self) -> &Transport {
        &self.client
    }

    /// Whether its connections start with a PROXY header, so each belongs to one client.
    pub(crate) fn sends_proxy_protocol(&self) -> bool {
        match &self.client {
            Transport::Http1(client) => client.connector().proxy_protocol().is_some(),
            Transport::H2(_) => false,
        }
    }

    /// How long an attempt may wait for its response head, once its request is sent.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.timeouts.response_headers
    }

    /// How long a response body may send nothing.
    pub(crate) fn read_timeout(&self) -> Duration {
        self.timeouts.read
    }

    /// How long a tunnel may carry nothing either way.
    pub(crate) fn tunnel_idle(&self) -> Duration {
        self.timeouts.tunnel_idle
    }

    pub(crate) fn record_success(&self, backend: SocketAddr, now: Instant) {
        self.outliers.borrow_mut().record_success(backend, now);
    }

    /// A failure of the backend's own making (connect, timeout, reset, garbage).
    pub(crate) fn record_failure(self: &Rc<Self>, backend: SocketAddr, now: Instant) {
        let ejected = self.outliers.borrow_mut().record_failure(backend, now);
        if let Some(time) = ejected {
            self.ejected(backend, time);
        }
    }

    /// A 5xx response: ejects only when the cluster sets `outlier_detection.consecutive_5xx`.
    pub(crate) fn record_server_error(self: &Rc<Self>, backend: SocketAddr, now: Instant) {
        let ejected = self.outliers.borrow_mut().record_server_error(backend, now);
        if let Some(time) = ejected {
            self.ejected(backend, time);
        }
    }

    /// Takes `backend` out of this worker's rotation for `time`, then re-admits it (if still healthy).
    fn ejected(self: &Rc<Self>, backend: SocketAddr, time: Duration) {
        self.counters
            .ejections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.backend_stats(backend)
            .ejections
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::warn!(cluster = %self.name, %backend, seconds = time.as_secs_f64(), "ejecting backend");
        let now = Instant::now();
        self.refresh(backend, now);
        self.readmit_at(backend, now + time);
    }

    /// Re-derives `backend`'s eligibility when its ejection ends.
    fn readmit_at(self: &Rc<Self>, backend: SocketAddr, until: Instant) {
        let cluster = self.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep_until(until).await;
            cluster.refresh(backend, Instant::now());
            tracing::info!(cluster = %cluster.name, %backend, "ejection over");
        });
    }

    /// Deposits this request in the retry budget (when retries are on).
    pub(crate) fn count_request(&self) {
        if self.attempts > 1 {
            self.budget.deposit();
        }
    }

    /// Runs `f` on the balancer (telemetry and tests).
    pub(crate) fn with_balance<T>(&self, f: impl FnOnce(&ClusterBalance) -> T) -> T {
        f(&self.balance.borrow())
    }

    /// This cluster's metric cells, for the registry.
    /// What this worker saw of `backend` (its cells).
    pub(crate) fn backend_stats(&self, backend: SocketAddr) -> Arc<BackendStats> {
        self.backend_stats
            .borrow_mut()
            .entry(backend)
            .or_insert_with(|| Arc::new(BackendStats::new(backend)))
            .clone()
    }

    pub(crate) fn cells(&self) -> ClusterCells {
        let balance = self.balance.borrow();
        let backends = balance
            .endpoints()
            .map(|e| BackendCell {
                address: *e.key,
                weight: e.weight,
                load: e.load.clone(),
                stats: self.backend_stats(*e.key),
            })
            .collect::<Vec<_>>();
        // Backends gone from the balancer take their cells with them.
        self.backend_stats
            .borrow_mut()
            .retain(|address, _| backends.iter().any(|b: &BackendCell| b.address == *address));
        ClusterCells {
            name: self.name.to_string(),
            policy: self.policy.name(),
            counters: self.counters.clone(),
            backends,
            routes: Vec::new(),
            route_counters: Vec::new(),
        }
    }
}

fn new_balance(policy: Policy, hash: Option<&HashPolicy>) -> ClusterBalance {
    let balance = Balancer::new(strategy(policy));
    match hash {
        Some(hash) => balance.with_affinity(affinity(hash)),
        None => balance,
    }
}

/// The balancer's affinity for `policy: hash`.
fn affinity(hash: &HashPolicy) -> Affinity {
    let walk = match hash.walk {
        HashWalk::Next => Walk::Next,
        HashWalk::P2c => Walk::P2c,
    };
    let table = match hash.algorithm {
        HashAlgorithm::Maglev => Affinity::maglev(),
        HashAlgorithm::Ring => Affinity::ring(),
    };
    table.with_bound(hash.bound).with_walk(walk)
}

/// The balancing crate's strategy of the same name as the config's policy (a test checks the names).
fn strategy(policy: Policy) -> Strategy {
    match policy {
        Policy::P2cInflight => Strategy::P2cInflight,
        Policy::P2cPeakEwma => Strategy::P2cPeakEwma,
        Policy::P2cMemoryInflight => Strategy::P2cMemoryInflight,
        Policy::P2cMemoryPeakEwma => Strategy::P2cMemoryPeakEwma,
        Policy::LeastInflight => Strategy::LeastInflight,
        Policy::LeastPeakEwma => Strategy::LeastPeakEwma,
        Policy::RoundRobin => Strategy::RoundRobin,
        Policy::Random => Strategy::Random,
        // Requests without the key: P2C on PeakEWMA.
        Policy::Hash => Strategy::P2cPeakEwma,
    }
}

/// A cluster of `backends` (addresses never connected to) from a config written for the test, with
/// `settings` added to the cluster's YAML mapping.
#[cfg(test)]
pub(crate) fn for_tests(backends: &[&str], settings: &str) -> Rc<Cluster> {
    with_policy(backends, "p2c_inflight", settings)
}

/// [`for_tests`] under `policy`.
#[cfg(test)]
fn with_policy(backends: &[&str], policy: &str, settings: &str) -> Rc<Cluster> {
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("{{ address: {b} }}"))
        .collect();
    let yaml = format!(
        "listeners: [{{ address: 127.0.0.1:0 }}]\n\
         routes: [{{ match: {{ path_prefix: / }}, cluster: app }}]\n\
         clusters:\n  - {{ name: app, policy: {policy}, backends: [{}]{settings} }}\n",
        list.join(", ")
    );
    let config = duet_config::parse(&yaml, "test.yaml").expect("valid config");
    let app = &config.clusters[0];
    Rc::new(Cluster::new(
        app,
        None,
        &crate::view::ResolvedNames::new().endpoints(app),
        Default::default(),
        BodyPace::new(&config.limits),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn every_config_policy_is_the_balancing_strategy_of_the_same_name() {
        let all = [
            Policy::P2cInflight,
            Policy::P2cPeakEwma,
            Policy::P2cMemoryInflight,
            Policy::P2cMemoryPeakEwma,
            Policy::LeastInflight,
            Policy::LeastPeakEwma,
            Policy::RoundRobin,
            Policy::Random,
        ];
        // A config policy added later fails to compile here until it is listed above.
        for policy in all {
            match policy {
                Policy::P2cInflight
                | Policy::P2cPeakEwma
                | Policy::P2cMemoryInflight
                | Policy::P2cMemoryPeakEwma
                | Policy::LeastInflight
                | Policy::LeastPeakEwma
                | Policy::RoundRobin
                | Policy::Random => {}
                // Not a strategy of its own: P2C on PeakEWMA with keyed picks (tested below).
                Policy::Hash => {}
            }
            assert_eq!(strategy(policy).name(), policy.name());
        }
        let names: Vec<&str> = all.iter().map(|p| p.name()).collect();
        let strategies: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(
            names, strategies,
            "the crate names a strategy the config has not"
        );
    }

    #[test]
    fn the_memory_policies_build_balancers_with_memory_and_their_metric() {
        for (name, metric) in [
            ("p2c_memory_inflight", "InFlight"),
            ("p2c_memory_peak_ewma", "PeakEwma"),
        ] {
            let cluster = with_policy(&["127.0.0.1:9"], name, "");
            let debug = cluster.with_balance(|b| format!("{b:?}"));
            assert!(debug.contains("policy: P2cMemory"), "{debug}");
            assert!(debug.contains(&format!("metric: {metric}")), "{debug}");
        }
    }

    #[test]
    fn the_full_scan_policies_build_least_loaded_balancers_with_their_metric() {
        for (name, metric) in [
            ("least_inflight", "InFlightThenLatency"),
            ("least_peak_ewma", "PeakEwma"),
        ] {
            let cluster = with_policy(&["127.0.0.1:9"], name, "");
            let debug = cluster.with_balance(|b| format!("{b:?}"));
            assert!(debug.contains("policy: LeastLoaded"), "{debug}");
            assert!(debug.contains(&format!("metric: {metric}")), "{debug}");
        }
    }

    #[test]
    fn a_hash_cluster_sends_a_key_home_and_its_retry_to_the_next_candidate() {
        sends_a_key_home(", hash: { key: 'header:x-user', walk: next }");
        sends_a_key_home(", hash: { key: 'header:x-user', walk: next, algorithm: ring }");
    }

    fn sends_a_key_home(settings: &str) {
        let backends = [
            "127.0.0.1:9",
            "127.0.0.1:10",
            "127.0.0.1:11",
            "127.0.0.1:12",
        ];
        let cluster = with_policy(&backends, "hash", settings);
        let debug = cluster.with_balance(|b| format!("{b:?}"));
        assert!(
            debug.contains("metric: PeakEwma"),
            "keyless requests: {debug}"
        );
        let key = Some(duet_balance::algo::stable_hash(b"u1".as_slice()));
        let (home, _, first) = cluster.pick(&[], (key, Session::Off)).expect("a backend");
        drop(first);
        for _ in 0..5 {
            assert_eq!(
                cluster.pick(&[], (key, Session::Off)).map(|p| p.0),
                Ok(home)
            );
        }
        let (next, _, retry) = cluster
            .pick(&[home], (key, Session::Off))
            .expect("another backend");
        assert_ne!(next, home);
        // Released: held, it would put `next` over the bound (1 in flight of 2, 4 backends).
        drop(retry);
        assert_eq!(
            cluster.pick(&[home], (key, Session::Off)).map(|p| p.0),
            Ok(next)
        );
        // Ejected or unhealthy: the key walks past its home, and returns when it is back.
        cluster.balance.borrow_mut().set_eligible(&home, false);
        assert_eq!(
            cluster.pick(&[], (key, Session::Off)).map(|p| p.0),
            Ok(next)
        );
        cluster.balance.borrow_mut().set_eligible(&home, true);
        assert_eq!(
            cluster.pick(&[], (key, Session::Off)).map(|p| p.0),
            Ok(home)
        );
    }

    #[test]
    fn new_membership_keeps_the_state_of_addresses_that_stay() {
        let cluster = for_tests(&["127.0.0.1:9", "127.0.0.1:10"], "");
        let in_flight = |backend: &str| {
            cluster.with_balance(|b| b.endpoint_load(&addr(backend)).map(|l| l.in_flight()))
        };
        let (picked, _, guard) = cluster.pick(&[], (None, Session::Off)).expect("a backend");
        let other = if picked == addr("127.0.0.1:9") {
            "127.0.0.1:10"
        } else {
            "127.0.0.1:9"
        };
        let picked_text = picked.to_string();
        // The other address leaves, a new one joins; the picked one keeps its request in flight.
        let endpoint = |address| Endpoint { address, weight: 1 };
        cluster.set_endpoints(&[endpoint(picked), endpoint(addr("127.0.0.1:11"))]);
        assert_eq!(in_flight(&picked_text), Some(1));
        assert_eq!(in_flight(other), None, "gone");
        assert_eq!(in_flight("127.0.0.1:11"), Some(0), "new, no load");
        drop(guard);
        assert_eq!(
            in_flight(&picked_text),
            Some(0),
            "released on the kept endpoint"
        );
    }

    #[test]
    fn a_retry_excludes_what_was_tried_and_an_empty_choice_is_an_error() {
        let cluster = for_tests(&["127.0.0.1:9", "127.0.0.1:10"], "");
        let (first, _, _a) = cluster.pick(&[], (None, Session::Off)).expect("a backend");
        let (second, _, _b) = cluster
            .pick(&[first], (None, Session::Off))
            .expect("another backend");
        assert_ne!(first, second);
        assert!(
            cluster
                .pick(&[first, second], (None, Session::Off))
                .is_err(),
            "nothing left"
        );
    }
}
