//! What `duet check` says of a listener's certificates that is not an error (duet serves them as
//! written): a name two of them cover (the first listed gets it), one with no DNS name (served only as
//! the default), one expired, one expiring within [`EXPIRY_WARNING`], and a stapled OCSP response
//! past its `nextUpdate`.

use super::certificate::Loaded;
use std::{path::Path, time::Duration};

/// How close to its expiry a certificate gets a warning (cert-manager renews 30 days ahead, so one
/// this close has missed its renewal).
pub(crate) const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// What a warning is about: a certificate's leaf as read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts<'a> {
    pub(crate) cert: &'a Path,
    pub(crate) names: &'a [String],
    /// Seconds since the Unix epoch.
    pub(crate) not_after: i64,
    /// The stapled OCSP response's file and its `nextUpdate` (seconds since the Unix epoch).
    pub(crate) ocsp: Option<(&'a Path, i64)>,
}

/// Each warning with the index of the certificate it is about, at `now` (seconds since the epoch).
pub(crate) fn warnings(loaded: &[Loaded], now: i64) -> Vec<(usize, String)> {
    let facts: Vec<Facts<'_>> = loaded
        .iter()
        .map(|l| Facts {
            cert: &l.files.cert,
            names: &l.names,
            not_after: l.not_after,
            ocsp: l
                .files
                .ocsp
                .as_ref()
                .zip(l.ocsp_next_update)
                .map(|((path, _), next)| (path.as_path(), next)),
        })
        .collect();
    of_facts(&facts, now)
}

fn of_facts(facts: &[Facts<'_>], now: i64) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let soon = i64::try_from(EXPIRY_WARNING.as_secs()).unwrap_or(i64::MAX);
    for (i, certificate) in facts.iter().enumerate() {
        let file = certificate.cert.display();
        for name in certificate.names {
            let first = facts[..i]
                .iter()
                .position(|earlier| earlier.names.contains(name));
            if let Some(first) = first {
                let other = facts[first].cert.display();
                found.push((
                    i,
                    format!("{file}: `{name}` is covered by {other} too, which is listed first and gets it"),
                ));
            }
        }
        if certificate.names.is_empty() {
            found.push((
                i,
                format!("{file}: no DNS name in the certificate: served only as the default"),
            ));
        }
        if let Some((ocsp, next_update)) = certificate.ocsp.filter(|&(_, next)| next <= now) {
            let hours = now.saturating_sub(next_update) / 3_600;
            found.push((
                i,
                format!(
                    "{}: the OCSP response went stale {hours} hours ago (its nextUpdate): clients \
                     that check it refuse the certificate; whatever refreshes the file has stopped",
                    ocsp.display()
                ),
            ));
        }
        let left = certificate.not_after.saturating_sub(now);
        if left <= 0 {
            let ago = -left / 86_400;
            found.push((
                i,
                format!("{file}: expired {ago} days ago: clients refuse it"),
            ));
        } else if left <= soon {
            let days = left / 86_400;
            found.push((
                i,
                format!(
                    "{file}: expires in {days} days: renew it (duet reads the new file on reload)"
                ),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const DAY: i64 = 86_400;

    #[test]
    fn names_twice_no_names_expired_expiring_and_stale_ocsp_are_each_said_once() {
        let (a, b, c) = (
            PathBuf::from("a.pem"),
            PathBuf::from("b.pem"),
            PathBuf::from("c.pem"),
        );
        let ocsp = PathBuf::from("a.ocsp.der");
        let a_names = ["shop.test".to_owned(), "*.apps.test".to_owned()];
        let b_names = ["*.apps.test".to_owned(), "api.test".to_owned()];
        let now = 1_000 * DAY;
        let facts = [
            Facts {
                cert: &a,
                names: &a_names,
                not_after: now + 90 * DAY,
                ocsp: Some((&ocsp, now - 3 * 3_600)),
            },
            Facts {
                cert: &b,
                names: &b_names,
                not_after: now - 3 * DAY,
                ocsp: Some((&ocsp, now + DAY)),
            },
            Facts {
                cert: &c,
                names: &[],
                not_after: now + 5 * DAY,
                ocsp: None,
            },
        ];
        let found = of_facts(&facts, now);
        assert_eq!(
            found,
            [
                (0, "a.ocsp.der: the OCSP response went stale 3 hours ago (its nextUpdate): clients that check it refuse the certificate; whatever refreshes the file has stopped".to_owned()),
                (1, "b.pem: `*.apps.test` is covered by a.pem too, which is listed first and gets it".to_owned()),
                (1, "b.pem: expired 3 days ago: clients refuse it".to_owned()),
                (2, "c.pem: no DNS name in the certificate: served only as the default".to_owned()),
                (2, "c.pem: expires in 5 days: renew it (duet reads the new file on reload)".to_owned()),
            ]
        );
    }

    #[test]
    fn fifteen_days_left_and_a_fresh_ocsp_response_are_no_warning() {
        let (a, ocsp) = (PathBuf::from("a.pem"), PathBuf::from("a.ocsp.der"));
        let names = ["a.test".to_owned()];
        let now = 1_000 * DAY;
        let facts = [Facts {
            cert: &a,
            names: &names,
            not_after: now + 15 * DAY,
            ocsp: Some((&ocsp, now + 1)),
        }];
        assert!(of_facts(&facts, now).is_empty());
    }
}
