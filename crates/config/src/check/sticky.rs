//! `sticky:` of a cluster: the cookie that binds a session to a backend, and the key it is signed
//! with.

use crate::{
    checker::{token, Checker},
    field::{Field, Location},
    model::{Sticky, StickySecret},
    raw::RawSticky,
};
use serde_saphyr::Spanned;
use std::time::Duration;

/// A shared key shorter than this is refused: HMAC-SHA256's key should be as long as its output
/// (RFC 2104 §3), and 16 bytes is the least that is not guessable.
const MIN_SECRET_BYTES: usize = 16;
/// A `secret_file:` longer than this is not a key.
const MAX_SECRET_FILE_BYTES: u64 = 4096;

/// The cluster's `sticky:`.
pub(super) fn sticky(checker: &mut Checker, raw: &Spanned<RawSticky>, field: &Field) -> Sticky {
    let at = Location {
        line: raw.referenced.line(),
        column: raw.referenced.column(),
    };
    let sticky = &raw.value;
    let name = sticky.cookie.value.0.trim();
    if !token(name) {
        let message = format!(
            "`{name}` is not a cookie name: expected a token (letters, digits and \
             !#$%&'*+-.^_`|~), such as `duet_backend`"
        );
        checker.reject(&sticky.cookie, field.key("cookie"), message);
    }
    let default_ttl = Duration::from_secs(3600);
    Sticky {
        cookie: name.to_owned(),
        ttl: checker.duration(sticky.ttl.as_ref(), &field.key("ttl"), default_ttl),
        secret: secret(checker, sticky, field),
        at,
    }
}

/// The shared key `secret:` or `secret_file:` gives (not both), else a random one per process.
fn secret(checker: &mut Checker, sticky: &RawSticky, field: &Field) -> StickySecret {
    let bytes = match (&sticky.secret, &sticky.secret_file) {
        (None, None) => return StickySecret::Random,
        (Some(_), Some(file)) => {
            let message = "give the key once: `secret:` or `secret_file:`, not both";
            checker.reject(file, field.key("secret_file"), message);
            return StickySecret::Random;
        }
        (Some(text), None) => (text, text.value.0.trim().as_bytes().to_vec()),
        (None, Some(file)) => {
            let field = field.key("secret_file");
            let Some((_, bytes)) = checker.file(file, &field, MAX_SECRET_FILE_BYTES) else {
                return StickySecret::Random;
            };
            // A file written by `echo` or an editor ends in a newline that is not part of the key.
            (file, bytes.trim_ascii().to_vec())
        }
    };
    let (value, bytes) = bytes;
    if bytes.len() < MIN_SECRET_BYTES {
        let key = if sticky.secret.is_some() {
            "secret"
        } else {
            "secret_file"
        };
        let message = format!(
            "a sticky key of {} bytes is too short: expected at least {MIN_SECRET_BYTES} \
             (32 random bytes, such as `openssl rand -base64 32`)",
            bytes.len()
        );
        checker.reject(value, field.key(key), message);
    }
    StickySecret::Shared(bytes)
}

/// `sticky:` without `secret`/`secret_file` is valid, but its key is drawn per process: its cookies
/// then hold neither across a restart nor on another instance, which `duet check` warns of.
pub(super) fn random_key_warnings(
    config: &crate::Config,
) -> impl Iterator<Item = super::Warning> + '_ {
    (config.clusters.iter().enumerate()).filter_map(|(i, cluster)| {
        let sticky = (cluster.sticky.as_ref()).filter(|s| s.secret == StickySecret::Random)?;
        Some(super::Warning {
            at: sticky.at,
            message: format!(
                "clusters[{i}].sticky: cluster `{}` signs its cookies with a random key drawn per \
                 process: they do not survive a restart, nor reach another duet instance behind the \
                 same balancer; set `secret_file:` (or `secret:`) to the same key on every instance",
                cluster.name
            ),
        })
    })
}
