//! `auth: { basic: ... }`: `Authorization: Basic` checked against an htpasswd file's users.
//!
//! bcrypt costs milliseconds by design, so a verified credential is remembered per worker for
//! [`TTL`]: under a keyed hash (SipHash with the worker's own random key) of the user's stored hash
//! and the password, never the password itself; at most [`CACHE_SIZE`] entries. A password changed
//! in the file changes the stored hash, so its old entry is never found again. Only successes are
//! remembered: a wrong password costs a full check every time.
//!
//! A user the file lacks costs what a known user with a wrong password costs: the password is
//! hashed against a stand-in, the costliest hash of the file, and refused whatever the result, so
//! the time of a 401 does not tell which names exist. (A file mixing costs, bcrypt 5 and 12 say,
//! still tells the cheap users from the rest; `htpasswd -B` writes one cost for all.) The hashes
//! themselves are compared in constant time by the `bcrypt` and `sha-crypt` crates (`subtle`).

use super::credentials;
use base64::Engine;
use duet_config::filter::auth::{Basic, HashKind, User};
use http::{header, HeaderMap, HeaderName, HeaderValue};
use sha_crypt::{PasswordVerifier, ShaCrypt};
use std::{
    cell::RefCell,
    collections::HashMap,
    hash::{BuildHasher, RandomState},
    time::{Duration, Instant},
};

/// How long a verified credential is taken without hashing it again.
pub(super) const TTL: Duration = Duration::from_secs(30);
/// The most credentials a worker remembers.
pub(super) const CACHE_SIZE: usize = 1024;

/// A route's users, looked up by name.
pub(crate) struct BasicAuth {
    users: HashMap<String, (String, HashKind)>,
    /// What an unknown user's password is hashed against ([`costliest`]).
    stand_in: Option<(String, HashKind)>,
    challenge: HeaderValue,
    forward_authorization: bool,
    user_header: Option<HeaderName>,
}

/// A worker's verified credentials: keyed hash → when it was verified.
struct Verified {
    key: RandomState,
    at: HashMap<u64, Instant>,
}

thread_local! {
    static VERIFIED: RefCell<Verified> = RefCell::new(Verified {
        key: RandomState::new(),
        at: HashMap::new(),
    });
}

impl BasicAuth {
    pub(super) fn new(basic: &Basic) -> Self {
        let users = (basic.users.iter())
            .map(|u| (u.name.clone(), (u.hash.clone(), u.kind)))
            .collect();
        let stand_in = costliest(&basic.users);
        let challenge = format!("Basic realm=\"{}\", charset=\"UTF-8\"", basic.realm);
        Self {
            users,
            stand_in,
            challenge: HeaderValue::from_str(&challenge)
                .unwrap_or_else(|_| HeaderValue::from_static("Basic realm=\"duet\"")),
            forward_authorization: basic.forward_authorization,
            user_header: (basic.user_header.as_ref())
                .and_then(|name| HeaderName::from_bytes(name.as_bytes()).ok()),
        }
    }

    /// A check no request passes.
    pub(super) fn nobody() -> Self {
        Self {
            users: HashMap::new(),
            stand_in: None,
            challenge: HeaderValue::from_static("Basic realm=\"duet\""),
            forward_authorization: false,
            user_header: None,
        }
    }

    /// Lets a request with a known user's right password through (its fields edited: the
    /// `Authorization` removed unless forwarded, the user set), and says who it is; refuses anyone
    /// else with the challenge.
    pub(super) fn admit(
        &self,
        headers: &mut HeaderMap,
    ) -> Result<Option<HeaderValue>, HeaderValue> {
        let user = self.verify(headers).ok_or_else(|| self.challenge.clone())?;
        let user = HeaderValue::from_str(user).ok();
        if !self.forward_authorization {
            headers.remove(header::AUTHORIZATION);
        }
        if let (Some(name), Some(user)) = (&self.user_header, &user) {
            headers.insert(name.clone(), user.clone());
        }
        Ok(user)
    }

    /// The user whose credentials the request carries, if they are right.
    fn verify(&self, headers: &HeaderMap) -> Option<&str> {
        let encoded = credentials(headers, "basic")?;
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let text = std::str::from_utf8(&decoded).ok()?;
        let (user, password) = text.split_once(':')?;
        let Some((name, (hash, kind))) = self.users.get_key_value(user) else {
            if let Some((hash, kind)) = &self.stand_in {
                hashed(hash, *kind, password);
            }
            return None;
        };
        check(hash, *kind, password).then_some(name.as_str())
    }
}

/// The costliest hash of the file, by kind (bcrypt over SHA-crypt) then cost or rounds.
fn costliest(users: &[User]) -> Option<(String, HashKind)> {
    let work = |user: &User| match user.kind {
        HashKind::Bcrypt => (
            1,
            user.hash
                .get(4..6)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0),
        ),
        HashKind::Sha256Crypt | HashKind::Sha512Crypt => {
            let rounds = (user.hash.get(3..).and_then(|r| r.strip_prefix("rounds=")))
                .and_then(|r| r.split('$').next()?.parse().ok());
            (0, rounds.unwrap_or(5000))
        }
    };
    let user = users.iter().max_by_key(|user| work(user))?;
    Some((user.hash.clone(), user.kind))
}

/// Whether `password` is the one `hash` was made from: from the worker's cache, or hashed.
pub(super) fn check(hash: &str, kind: HashKind, password: &str) -> bool {
    let now = Instant::now();
    let key = VERIFIED.with_borrow(|v| v.key.hash_one((hash, password)));
    let cached = VERIFIED.with_borrow(|v| v.at.get(&key).is_some_and(|at| now - *at < TTL));
    if cached {
        return true;
    }
    let right = hashed(hash, kind, password);
    if right {
        VERIFIED.with_borrow_mut(|v| {
            if v.at.len() >= CACHE_SIZE {
                v.at.retain(|_, at| now - *at < TTL);
            }
            if v.at.len() >= CACHE_SIZE {
                v.at.clear();
            }
            v.at.insert(key, now);
        });
    }
    right
}

#[cfg(test)]
thread_local! {
    /// How many times this thread ran a verifier: the unit tests' evidence of which path ran.
    static HASHED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Whether `password` hashes to `hash`, always hashing (the slow part, by design).
fn hashed(hash: &str, kind: HashKind, password: &str) -> bool {
    #[cfg(test)]
    HASHED.set(HASHED.get() + 1);
    match kind {
        HashKind::Bcrypt => bcrypt::verify(password, hash).unwrap_or(false),
        HashKind::Sha256Crypt | HashKind::Sha512Crypt => ShaCrypt::default()
            .verify_password(password.as_bytes(), hash)
            .is_ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `htpasswd -nbB ann secret` and `htpasswd -nb5 bob secret` (apache2-utils).
    const ANN: &str = "$2y$05$2N5M7N11ybMXZj2oRlDacuBAy3mkS7eUAIRELs7TYTDtCHNqV94O2";
    const BOB: &str = "$6$bkeDQlmXJ/cdykPq$cJafC4nfH0whNtkblFnhg5DccL1mWgWX8ualMau9x9BxhenUIGsbNSak92gSPr/EvUhO3O/MkYY80R2Co/AmR1";

    #[test]
    fn htpasswd_s_bcrypt_and_sha512_hashes_take_their_password_only() {
        assert!(check(ANN, HashKind::Bcrypt, "p"));
        assert!(check(ANN, HashKind::Bcrypt, "p"), "again, from the cache");
        assert!(!check(ANN, HashKind::Bcrypt, "q"));
        assert!(check(BOB, HashKind::Sha512Crypt, "p"));
        assert!(!check(BOB, HashKind::Sha512Crypt, "P"));
    }

    fn headers(user: &str, password: &str) -> HeaderMap {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&format!("Basic {encoded}")).expect("value");
        headers.insert(header::AUTHORIZATION, value);
        headers
    }

    #[test]
    fn an_unknown_user_is_hashed_against_the_costliest_hash_as_a_wrong_password_is() {
        let user = |name: &str, hash: &str, kind| User {
            name: name.to_owned(),
            hash: hash.to_owned(),
            kind,
        };
        let basic = Basic {
            file: "users".into(),
            users: vec![
                user("bob", BOB, HashKind::Sha512Crypt),
                user("ann", ANN, HashKind::Bcrypt),
            ],
            realm: "r".to_owned(),
            forward_authorization: false,
            user_header: None,
        };
        let auth = BasicAuth::new(&basic);
        assert_eq!(auth.stand_in, Some((ANN.to_owned(), HashKind::Bcrypt)));
        let runs = |user: &str, password: &str| {
            let before = HASHED.get();
            let admitted = auth.admit(&mut headers(user, password)).is_ok();
            (admitted, HASHED.get() - before)
        };
        assert_eq!(runs("eve", "p"), (false, 1), "unknown user, hashed anyway");
        assert_eq!(runs("eve", "p"), (false, 1), "and never from the cache");
        assert_eq!(runs("ann", "q"), (false, 1), "known user, wrong password");
        assert_eq!(runs("ann", "p"), (true, 1));
        assert_eq!(runs("ann", "p"), (true, 0), "cached");
        assert_eq!(runs("", "p"), (false, 1), "an empty name is an unknown one");
        assert_eq!(BasicAuth::nobody().stand_in, None);
    }
}
