//! A cluster's settings blocks: `timeouts`, `health_check`, `outlier_detection` and `retries`. Each
//! key left out takes its default.

use crate::{
    checker::Checker,
    field::Field,
    model::{HealthCheck, OutlierDetection, Retries, Timeouts},
    raw::{RawHealthCheck, RawOutlierDetection, RawRetries, RawTimeouts},
};

pub(super) fn timeouts(
    checker: &mut Checker,
    raw: Option<&RawTimeouts>,
    cluster: &Field,
) -> Timeouts {
    let field = cluster.key("timeouts");
    let defaults = Timeouts::default();
    Timeouts {
        connect: checker.timeout(
            raw.and_then(|t| t.connect.as_ref()),
            &field.key("connect"),
            defaults.connect,
            "give backends no time to accept a connection",
            None,
        ),
        response_headers: checker.timeout(
            raw.and_then(|t| t.response_headers.as_ref()),
            &field.key("response_headers"),
            defaults.response_headers,
            "give backends no time to answer",
            None,
        ),
        idle: checker.duration(
            raw.and_then(|t| t.idle.as_ref()),
            &field.key("idle"),
            defaults.idle,
        ),
        read: checker.timeout(
            raw.and_then(|t| t.read.as_ref()),
            &field.key("read"),
            defaults.read,
            "cut every response body that pauses",
            None,
        ),
        tunnel_idle: checker.timeout(
            raw.and_then(|t| t.tunnel_idle.as_ref()),
            &field.key("tunnel_idle"),
            defaults.tunnel_idle,
            "close every WebSocket tunnel at once",
            None,
        ),
    }
}

pub(super) fn health_check(
    checker: &mut Checker,
    h: &RawHealthCheck,
    cluster: &Field,
) -> HealthCheck {
    let field = cluster.key("health_check");
    let d = HealthCheck::default();
    let path = match &h.path {
        None => d.path.clone(),
        Some(p) if p.value.0.starts_with('/') => p.value.0.clone(),
        Some(p) => {
            let message = format!("`{}` must start with `/`", p.value.0);
            checker.reject(p, field.key("path"), message);
            d.path.clone()
        }
    };
    HealthCheck {
        path,
        interval: checker.timeout(
            h.interval.as_ref(),
            &field.key("interval"),
            d.interval,
            "check every backend without pause",
            None,
        ),
        timeout: checker.timeout(
            h.timeout.as_ref(),
            &field.key("timeout"),
            d.timeout,
            "fail every check",
            Some("to stop checking, remove `health_check`"),
        ),
        healthy_threshold: checker.count(
            h.healthy_threshold.as_ref(),
            &field.key("healthy_threshold"),
            d.healthy_threshold,
            (1, 100),
        ),
        unhealthy_threshold: checker.count(
            h.unhealthy_threshold.as_ref(),
            &field.key("unhealthy_threshold"),
            d.unhealthy_threshold,
            (1, 100),
        ),
        expected_statuses: match &h.expected_statuses {
            Some(list) => checker.statuses(list, &field.key("expected_statuses")),
            None => d.expected_statuses.clone(),
        },
    }
}

pub(super) fn outlier_detection(
    checker: &mut Checker,
    raw: Option<&RawOutlierDetection>,
    cluster: &Field,
) -> OutlierDetection {
    let field = cluster.key("outlier_detection");
    let d = OutlierDetection::default();
    OutlierDetection {
        consecutive_failures: checker.count(
            raw.and_then(|o| o.consecutive_failures.as_ref()),
            &field.key("consecutive_failures"),
            d.consecutive_failures,
            (0, 1000),
        ),
        consecutive_5xx: checker.count(
            raw.and_then(|o| o.consecutive_5xx.as_ref()),
            &field.key("consecutive_5xx"),
            d.consecutive_5xx,
            (0, 1000),
        ),
        base_ejection_time: checker.timeout(
            raw.and_then(|o| o.base_ejection_time.as_ref()),
            &field.key("base_ejection_time"),
            d.base_ejection_time,
            "eject failing backends for no time at all",
            Some("to turn ejection off, set `consecutive_failures: 0`"),
        ),
        max_ejection_time: checker.duration(
            raw.and_then(|o| o.max_ejection_time.as_ref()),
            &field.key("max_ejection_time"),
            d.max_ejection_time,
        ),
        max_ejection_fraction: checker.percent(
            raw.and_then(|o| o.max_ejection_percent.as_ref()),
            &field.key("max_ejection_percent"),
            d.max_ejection_fraction,
        ),
    }
}

pub(super) fn retries(checker: &mut Checker, raw: Option<&RawRetries>, cluster: &Field) -> Retries {
    let field = cluster.key("retries");
    let d = Retries::default();
    Retries {
        attempts: checker.count(
            raw.and_then(|r| r.attempts.as_ref()),
            &field.key("attempts"),
            d.attempts,
            (1, 10),
        ),
        budget_fraction: checker.percent(
            raw.and_then(|r| r.budget_percent.as_ref()),
            &field.key("budget_percent"),
            d.budget_fraction,
        ),
        min_retries_per_second: checker.count(
            raw.and_then(|r| r.min_retries_per_second.as_ref()),
            &field.key("min_retries_per_second"),
            d.min_retries_per_second,
            (0, 100_000),
        ),
        replay_body_limit: checker.size(
            raw.and_then(|r| r.replay_body_limit.as_ref()),
            &field.key("replay_body_limit"),
            d.replay_body_limit,
            0,
        ),
    }
}
