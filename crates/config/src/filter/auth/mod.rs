//! `auth:`: who may take a route. One of three ways per route: `basic` (an htpasswd file),
//! `jwt` (a bearer token checked against a JWKS file) or `forward` (a subrequest to an auth
//! service, a cluster like any other).
//!
//! The files a route names (the htpasswd file, the JWKS) are read here, when the config is checked,
//! so that a missing file or a bad line is refused with the config's line and column and the file's
//! own line, by `duet check` as by a reload; a reload reads them again, and so does the running
//! duet whenever their content changes ([`Auth::watched_file`], [`Auth::with_file_text`]).

mod basic;
mod jwt;

mod forward;

use super::{RouteContext, Section};
use crate::{
    checker::Checker,
    field::Field,
    raw::{leaf, Scalar, Shape},
};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::{
    fmt,
    path::{Path, PathBuf},
};

pub use basic::{Basic, HashKind, User};
pub use forward::{Forward, ForwardMethod, OnError};
pub use jwt::{algorithm as jwk_algorithm, Jwks, JwksSource, Jwt, TokenSource};

/// `auth:` on a route: how its requests prove who sent them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// `basic:`: a user and password from an htpasswd file.
    Basic(Basic),
    /// `jwt:`: a bearer token signed by a key of a JWKS.
    Jwt(Jwt),
    /// `forward:`: an auth service decides.
    Forward(Forward),
}

impl Auth {
    /// The request fields the filter sets: a client's own values of them are removed first.
    pub fn identity_fields(&self) -> Vec<&str> {
        match self {
            Self::Basic(basic) => basic.user_header.iter().map(String::as_str).collect(),
            Self::Jwt(jwt) => (jwt.claims_to_headers.iter())
                .map(|(_, header)| header.as_str())
                .collect(),
            Self::Forward(forward) => forward
                .response_headers
                .iter()
                .map(String::as_str)
                .collect(),
        }
    }
}

impl Auth {
    /// The file the route's users or keys are read from, if any: the running duet reads it again
    /// whenever its content changes.
    pub fn watched_file(&self) -> Option<&Path> {
        match self {
            Self::Basic(basic) => Some(&basic.file),
            Self::Jwt(jwt) => match &jwt.jwks {
                Jwks::File { path, .. } => Some(path),
                Jwks::Fetched(_) => None,
            },
            Self::Forward(_) => None,
        }
    }

    /// These settings with the users or keys of `text`, the watched file's new content; or what is
    /// wrong with it (with the file's own line), the settings in use staying.
    pub fn with_file_text(&self, text: &str) -> Result<Self, String> {
        let mut changed = self.clone();
        match &mut changed {
            Self::Basic(basic) => {
                basic.users = basic::parse_htpasswd(text).map_err(|(line, message, hint)| {
                    format!("{} line {line}: {message} ({hint})", basic.file.display())
                })?;
            }
            Self::Jwt(jwt) => {
                if let Jwks::File {
                    path,
                    text: held,
                    key_count,
                } = &mut jwt.jwks
                {
                    *key_count = jwt::keys(text)
                        .map_err(|message| format!("{}: {message}", path.display()))?;
                    text.clone_into(held);
                }
            }
            Self::Forward(_) => {}
        }
        Ok(changed)
    }
}

impl fmt::Display for Auth {
    /// As `duet check` shows it: `basic admin.htpasswd (3 users) realm "admin"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Basic(b) => write!(
                f,
                "basic {} ({} users) realm {:?}",
                b.file.display(),
                b.users.len(),
                b.realm
            ),
            Self::Jwt(j) => match &j.jwks {
                Jwks::File {
                    path, key_count, ..
                } => write!(f, "jwt {} ({key_count} keys)", path.display()),
                Jwks::Fetched(source) => write!(
                    f,
                    "jwt {}{} every {:?}",
                    source.cluster_name, source.path, source.refresh
                ),
            },
            Self::Forward(fw) => write!(f, "forward {}{}", fw.cluster_name, fw.path),
        }
    }
}

/// `auth: { basic | jwt | forward }`: exactly one.
#[derive(Debug, Deserialize)]
struct RawAuth {
    #[serde(default)]
    basic: Option<Spanned<basic::RawBasic>>,
    #[serde(default)]
    jwt: Option<Spanned<jwt::RawJwt>>,
    #[serde(default)]
    forward: Option<Spanned<forward::RawForward>>,
}

/// The route key `auth:`.
#[derive(Debug, Deserialize)]
pub(crate) struct Keys {
    #[serde(default)]
    auth: Option<Spanned<RawAuth>>,
}

static JWT: Shape = Shape::new(
    crate::raw::fields_of::<jwt::RawJwt>,
    &[("jwks", &leaf::<jwt::RawJwksSource>())],
);

static AUTH: Shape = Shape::new(
    crate::raw::fields_of::<RawAuth>,
    &[
        ("basic", &leaf::<basic::RawBasic>()),
        ("jwt", &JWT),
        ("forward", &leaf::<forward::RawForward>()),
    ],
);

impl Section for Auth {
    type Raw = Keys;
    const SHAPES: &'static [(&'static str, &'static Shape)] = &[("auth", &AUTH)];

    fn check(checker: &mut Checker, keys: &Keys, route: &RouteContext<'_>) -> Option<Self> {
        check(checker, keys.auth.as_ref()?, route)
    }

    fn describe(&self) -> String {
        format!("auth {self}")
    }
}

/// The route's auth, or `None` after recording why it is refused.
fn check(checker: &mut Checker, raw: &Spanned<RawAuth>, route: &RouteContext<'_>) -> Option<Auth> {
    let field = route.field.key("auth");
    if route.redirect_written {
        let e = checker.error(raw, &field, "a redirect route answers every request itself");
        checker.push(e.hint("set `auth` on the route the redirect leads to"));
        return None;
    }
    let written = &raw.value;
    let given = [
        written.basic.is_some(),
        written.jwt.is_some(),
        written.forward.is_some(),
    ];
    if given.iter().filter(|&&g| g).count() != 1 {
        let e = checker.error(
            raw,
            &field,
            "expected exactly one of `basic`, `jwt`, `forward`",
        );
        checker.push(e.hint("a route takes one way of authenticating: write one of the three"));
        return None;
    }
    if let Some(b) = &written.basic {
        return basic::check(checker, b, &field.key("basic")).map(Auth::Basic);
    }
    if let Some(j) = &written.jwt {
        return jwt::check(checker, j, &field.key("jwt"), route.clusters).map(Auth::Jwt);
    }
    let f = written.forward.as_ref()?;
    forward::check(checker, f, &field.key("forward"), route.clusters).map(Auth::Forward)
}

/// The most of an htpasswd or JWKS file duet reads: far past any real one.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// The text of the file `value` names (relative to the config's folder), or `None` after recording
/// why it cannot be read.
fn read_file(
    checker: &mut Checker,
    value: &Spanned<Scalar>,
    field: &Field,
    what: &str,
) -> Option<(PathBuf, String)> {
    use std::io::Read;
    let (path, _) = checker.path(value);
    let opened = std::fs::File::open(&path).and_then(|file| {
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        if metadata.len() > MAX_FILE_BYTES {
            return Err(std::io::Error::other(format!(
                "larger than {} MiB",
                MAX_FILE_BYTES >> 20
            )));
        }
        let mut text = String::new();
        file.take(MAX_FILE_BYTES).read_to_string(&mut text)?;
        Ok(text)
    });
    match opened {
        Ok(text) => Some((path, text)),
        Err(e) => {
            let message = format!("cannot read the {what} `{}`: {e}", path.display());
            let e = checker.error(value, field, message);
            checker.push(e.hint(format!(
                "name an existing {what}; a relative path is taken from the config file's folder"
            )));
            None
        }
    }
}

/// A list of request field names, lowercase; `None` after recording a bad one.
fn field_names(
    checker: &mut Checker,
    raw: Option<&Spanned<Vec<Spanned<Scalar>>>>,
    field: &Field,
) -> Option<Vec<String>> {
    let errors = checker.errors.len();
    let mut names = Vec::new();
    for (i, written) in raw.map_or(&[][..], |r| &r.value[..]).iter().enumerate() {
        let name = written.value.0.trim().to_ascii_lowercase();
        if crate::checker::token(&name) {
            names.push(name);
        } else {
            let message = format!("`{name}` is not a header field name");
            checker.reject(written, field.index(i), message);
        }
    }
    (checker.errors.len() == errors).then_some(names)
}
