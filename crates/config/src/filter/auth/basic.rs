//! `auth: { basic: { users, realm, forward_authorization, user_header } }`: users and password
//! hashes from an htpasswd file as Apache's `htpasswd -B`, `-2` or `-5` writes it.

use super::read_file;
use crate::{checker::Checker, field::Field, raw::Scalar};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::path::PathBuf;

/// `basic:`: the route takes requests whose `Authorization: Basic` names a user of the file with
/// the right password; the others get 401 and `WWW-Authenticate: Basic realm="..."`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Basic {
    /// The htpasswd file, as resolved from the config's folder.
    pub file: PathBuf,
    /// Its users, in file order, as read when the config was checked.
    pub users: Vec<User>,
    /// The realm the 401 names (browsers show it, and keep credentials per realm).
    pub realm: String,
    /// The backend gets the client's `Authorization` field too (by default it is removed).
    pub forward_authorization: bool,
    /// The request field the verified user name is sent to the backend in, if any.
    pub user_header: Option<String>,
}

/// One line of an htpasswd file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name.
    pub name: String,
    /// The password hash, as written.
    pub hash: String,
    /// Which scheme the hash is.
    pub kind: HashKind,
}

/// The password hashes duet takes: the ones `htpasswd` calls secure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKind {
    /// `$2y$` (and `$2a$`, `$2b$`): bcrypt, `htpasswd -B`.
    Bcrypt,
    /// `$5$`: SHA-256-crypt, `htpasswd -2`.
    Sha256Crypt,
    /// `$6$`: SHA-512-crypt, `htpasswd -5`.
    Sha512Crypt,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawBasic {
    #[serde(default)]
    users: Option<Spanned<Scalar>>,
    #[serde(default)]
    realm: Option<Spanned<Scalar>>,
    #[serde(default)]
    forward_authorization: Option<Spanned<Scalar>>,
    #[serde(default)]
    user_header: Option<Spanned<Scalar>>,
}

/// The route's basic auth, or `None` after recording why it is refused.
pub(super) fn check(
    checker: &mut Checker,
    raw: &Spanned<RawBasic>,
    field: &Field,
) -> Option<Basic> {
    let written = &raw.value;
    let Some(users) = &written.users else {
        let e = checker.error(raw, field, "no `users`");
        checker.push(e.hint("name an htpasswd file: `users: admin.htpasswd`"));
        return None;
    };
    let errors = checker.errors.len();
    let realm = written.realm.as_ref().map_or("duet", |r| r.value.0.trim());
    if realm.contains(['"', '\\']) || realm.chars().any(char::is_control) {
        let realm_at = written.realm.as_ref()?;
        let message =
            format!("`{realm}` cannot be a realm: no quotes, backslashes or control characters");
        checker.reject(realm_at, field.key("realm"), message);
    }
    let realm = realm.to_owned();
    let forward = field.key("forward_authorization");
    let forward_authorization =
        checker.boolean(written.forward_authorization.as_ref(), &forward, false);
    let user_header = written.user_header.as_ref().and_then(|h| {
        let name = h.value.0.trim().to_ascii_lowercase();
        if crate::checker::token(&name) {
            return Some(name);
        }
        let message = format!("`{name}` is not a header field name");
        checker.reject(h, field.key("user_header"), message);
        None
    });
    let (file, text) = read_file(checker, users, &field.key("users"), "htpasswd file")?;
    let parsed = parse_htpasswd(&text);
    let users = match parsed {
        Ok(users) => users,
        Err((line, message, hint)) => {
            let message = format!("{} line {line}: {message}", file.display());
            let e = checker.error(users, field.key("users"), message);
            checker.push(e.hint(hint));
            return None;
        }
    };
    (checker.errors.len() == errors).then_some(Basic {
        file,
        users,
        realm,
        forward_authorization,
        user_header,
    })
}

/// A bad line of an htpasswd file: its number, what is wrong, and a hint.
type BadLine = (usize, String, &'static str);

/// The users of an htpasswd file (`user:hash` lines; blank lines and `#` comments skipped).
pub(super) fn parse_htpasswd(text: &str) -> Result<Vec<User>, BadLine> {
    const REWRITE: &str = "write the password again with `htpasswd -B FILE USER` (bcrypt)";
    let mut users: Vec<User> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((name, hash)) = line.split_once(':') else {
            let message = "expected `user:hash`".to_owned();
            return Err((
                number,
                message,
                "each line is a user, a colon and a hash, as `htpasswd` writes them",
            ));
        };
        if name.is_empty() {
            return Err((number, "an empty user name".to_owned(), REWRITE));
        }
        if users.iter().any(|u| u.name == name) {
            let message = format!("user `{name}` is listed twice");
            return Err((number, message, "keep one line per user"));
        }
        let kind = hash_kind(hash).map_err(|what| {
            (
                number,
                format!("user `{name}` has {what}, which duet does not take"),
                REWRITE,
            )
        })?;
        users.push(User {
            name: name.to_owned(),
            hash: hash.to_owned(),
            kind,
        });
    }
    if users.is_empty() {
        return Err((
            0,
            "no users".to_owned(),
            "add one with `htpasswd -B FILE USER`",
        ));
    }
    Ok(users)
}

/// The scheme of a hash, or what it is instead.
fn hash_kind(hash: &str) -> Result<HashKind, &'static str> {
    let crypt_chars = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'/')
    };
    if let Some(rest) = ["$2y$", "$2a$", "$2b$"]
        .iter()
        .find_map(|p| hash.strip_prefix(p))
    {
        let cost_ok = rest
            .get(..2)
            .and_then(|c| c.parse::<u32>().ok())
            .is_some_and(|c| (4..=31).contains(&c));
        let body_ok = rest.get(2..3) == Some("$") && rest.len() == 56 && crypt_chars(&rest[3..]);
        return if cost_ok && body_ok {
            Ok(HashKind::Bcrypt)
        } else {
            Err("a malformed bcrypt hash")
        };
    }
    for (prefix, kind) in [
        ("$5$", HashKind::Sha256Crypt),
        ("$6$", HashKind::Sha512Crypt),
    ] {
        if let Some(rest) = hash.strip_prefix(prefix) {
            let parts: Vec<&str> = rest.split('$').collect();
            let (salt, digest) = match parts.as_slice() {
                [rounds, salt, digest] if rounds.starts_with("rounds=") => (*salt, *digest),
                [salt, digest] => (*salt, *digest),
                _ => return Err("a malformed SHA-crypt hash"),
            };
            let long = if kind == HashKind::Sha256Crypt {
                43
            } else {
                86
            };
            return if salt.len() <= 16 && digest.len() == long && crypt_chars(digest) {
                Ok(kind)
            } else {
                Err("a malformed SHA-crypt hash")
            };
        }
    }
    Err(if hash.starts_with("$apr1$") || hash.starts_with("$1$") {
        "an MD5 hash (htpasswd's default, weak)"
    } else if hash.starts_with("{SHA}") {
        "an unsalted SHA-1 hash"
    } else {
        "a hash that is not bcrypt or SHA-crypt (plain text or DES crypt?)"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcrypt_and_sha_crypt_lines_are_read_and_weak_or_bad_lines_named_by_number() {
        let text = "# users\n\nann:$2y$05$2N5M7N11ybMXZj2oRlDacuBAy3mkS7eUAIRELs7TYTDtCHNqV94O2\n\
            bob:$6$bkeDQlmXJ/cdykPq$cJafC4nfH0whNtkblFnhg5DccL1mWgWX8ualMau9x9BxhenUIGsbNSak92gSPr/EvUhO3O/MkYY80R2Co/AmR1\n";
        let users = parse_htpasswd(text).expect("users");
        assert_eq!(users.len(), 2);
        assert_eq!(
            (users[0].name.as_str(), users[0].kind),
            ("ann", HashKind::Bcrypt)
        );
        assert_eq!(
            (users[1].name.as_str(), users[1].kind),
            ("bob", HashKind::Sha512Crypt)
        );
        let md5 = format!("{text}cy:$apr1$abc$defghijklmnopqrstuvwxy\n");
        let (line, message, _) = parse_htpasswd(&md5).expect_err("md5");
        assert_eq!(line, 5);
        assert!(message.contains("user `cy` has an MD5 hash"), "{message}");
        let (line, message, _) = parse_htpasswd("x\n").expect_err("no colon");
        assert_eq!((line, message.as_str()), (1, "expected `user:hash`"));
    }
}
