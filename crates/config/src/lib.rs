//! duet's configuration: the YAML schema, its validation, and errors written for people.
//!
//! ```
//! let yaml = "
//! listeners:
//!   - address: 127.0.0.1:8080
//! routes:
//!   - match: { path_prefix: / }
//!     cluster: web
//! clusters:
//!   - name: web
//!     backends:
//!       - address: 127.0.0.1:9001
//! ";
//! let config = duet_config::parse(yaml, "inline.yaml").expect("valid");
//! assert_eq!(config.clusters[0].backends[0].weight, 1);
//!
//! let typo = yaml.replace("cluster: web", "cluster: wbe");
//! let errors = duet_config::parse(&typo, "inline.yaml").unwrap_err();
//! let message = errors.to_string();
//! assert!(message.contains("inline.yaml:6:14"), "{message}");
//! assert!(message.contains("did you mean `web`?"), "{message}");
//! ```
//!
//! Every problem is reported in one run, each with its location: unknown keys, values out of range,
//! references to clusters that do not exist, clashing addresses. Two kinds stop checking at the first
//! one, because nothing after them can be read reliably: a YAML syntax error, and a value of the
//! wrong kind (a list where one value belongs).
//!
//! Parsing is pure: [`load`] reads the one file it is given and [`parse`] reads nothing. Host names stay
//! names ([`BackendAddress::Name`]) for the binary's discovery to resolve, `workers: auto` stays
//! [`Workers::Auto`] for the binary to count cores, and certificate paths are checked when duet reads
//! them. So `duet check` gives the same answer on a laptop as inside the cluster the names live in.

#![warn(missing_docs)]

mod check;
mod diff;
mod model;
mod access_log;
pub mod filter;
mod checker;
mod field;
mod networks;
mod error;
mod raw;
mod units;

pub use access_log::{AccessLog, LogField, LogFormat};
pub use check::shadowing::{shadowed_routes, Shadowed};
pub use check::{warnings, Warning};
pub use diff::{diff, Change};
pub use error::{ConfigError, ConfigErrors};
pub use filter::hedge::{Hedge, HedgeAfter};
pub use model::{
    http_method, Action, Backend, BackendAddress, ClientAuth, ClientLimits, Cluster, Config,
    HashAlgorithm, HashKey, HashPolicy, HashWalk, HeaderEdits, HeaderMatch, HealthCheck,
    HostPattern, Http2Limits, Http2Windows, Limits, Listener, ListenerTls, Location, OtlpEndpoint,
    OutlierDetection, PathMatch, PathRewrite, Pattern, PatternError, Policy, ProxyProtocol,
    Redirect, RedirectPath, Retries, Rewrite, Route, SendProxyProtocol, Shutdown, Sticky,
    StickySecret, Timeouts, TlsFiles, TlsVersion, Tracing, Underscores, UpstreamProtocol,
    UpstreamTls, ValueMatch, WeightedCluster, Workers,
};

use error::did_you_mean;
use raw::RawConfig;
use std::path::Path;

/// Reads and checks the configuration file at `path`: a regular file of at most 16 MiB.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let origin = path.display().to_string();
    let text = read(path).map_err(|(message, hint)| {
        let mut error =
            ConfigError::new("", format!("cannot read the configuration file: {message}"));
        error.origin = origin.clone();
        ConfigErrors::single(error.hint(hint))
    })?;
    parse(&text, &origin)
}

/// The most of a configuration file duet reads: far above any real one (the examples are a few
/// KiB), low enough that a wrong path (a log, a disk image) fails at once instead of filling memory.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// The file's text, or what is wrong and a hint. Only a regular file is opened: opening a FIFO
/// blocks until something writes to it, and a device such as `/dev/zero` never ends.
fn read(path: &Path) -> Result<String, (String, &'static str)> {
    use std::io::Read;
    let existing = "pass an existing YAML file with --config FILE";
    let not_regular = |kind| {
        (
            format!("it is {kind}, not a regular file"),
            "pass the YAML file itself with --config FILE",
        )
    };
    let too_large = (
        format!(
            "it is larger than {} MiB, the most duet reads",
            MAX_FILE_BYTES >> 20
        ),
        "a configuration is a few KiB: check the path",
    );
    let metadata = std::fs::metadata(path).map_err(|e| (e.to_string(), existing))?;
    if let Some(kind) = special_kind(&metadata.file_type()) {
        return Err(not_regular(kind));
    }
    let file = std::fs::File::open(path).map_err(|e| (e.to_string(), existing))?;
    // Looked at again once open: the path may have been replaced in between.
    let metadata = file.metadata().map_err(|e| (e.to_string(), existing))?;
    if let Some(kind) = special_kind(&metadata.file_type()) {
        return Err(not_regular(kind));
    }
    if metadata.len() > MAX_FILE_BYTES {
        return Err(too_large);
    }
    let mut text = String::new();
    // One byte past the cap tells a file that grew since it was measured.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| (e.to_string(), existing))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large);
    }
    Ok(text)
}

/// What a file that is not a regular file is, for the error; `None` for a regular file.
fn special_kind(file_type: &std::fs::FileType) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return Some("a FIFO (named pipe)");
        }
        if file_type.is_char_device() {
            return Some("a character device");
        }
        if file_type.is_block_device() {
            return Some("a block device");
        }
        if file_type.is_socket() {
            return Some("a socket");
        }
    }
    if file_type.is_dir() {
        return Some("a directory");
    }
    (!file_type.is_file()).then_some("a special file")
}

/// Every configuration key, as a dotted path from the top of the file (`clusters.timeouts.read`;
/// items of a list add no step), read from the schema's own structs: what the configuration
/// reference must document.
pub fn schema_keys() -> Vec<String> {
    raw::schema_keys(filter::SHAPES)
}

/// Parses and checks configuration text; `origin` names it in errors (usually the file path) and
/// relative paths are taken from its folder. Reads only the files routes answer with (`respond.file`)
/// and asks no resolver.
pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
    let finish = |mut errors: Vec<ConfigError>| {
        let lines: Vec<&str> = text.lines().collect();
        for error in &mut errors {
            error.origin = origin.to_owned();
            if error.line > 0 {
                error.source_line = lines.get(error.line as usize - 1).map(|l| l.to_string());
            }
        }
        errors.sort_by_key(|e| (e.line, e.column));
        ConfigErrors { errors }
    };
    // Syntax errors stop here, at the first one: nothing after it can be read reliably.
    let tree: raw::Node = serde_saphyr::from_str(text).map_err(|e| finish(vec![from_serde(&e)]))?;
    let mut errors: Vec<ConfigError> = raw::unknown_keys(&tree, filter::SHAPES)
        .into_iter()
        .map(|unknown| {
            let word = unknown.key.value.as_str();
            let mut error = ConfigError::new(
                "",
                format!(
                    "unknown field `{word}`, expected one of {}",
                    unknown.expected.join(", ")
                ),
            )
            .at(
                unknown.key.referenced.line(),
                unknown.key.referenced.column(),
            );
            if let Some(hint) = did_you_mean(word, unknown.expected.iter().copied()) {
                error = error.hint(hint);
            }
            error
        })
        .collect();
    // A value of the wrong kind (a list where one value belongs) also stops serde at the first one.
    let raw: RawConfig = match serde_saphyr::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            errors.push(from_serde(&e));
            return Err(finish(errors));
        }
    };
    let filters = match filter::RawFilters::read(text) {
        Ok(filters) => filters,
        Err(e) => {
            errors.push(from_serde(&e));
            return Err(finish(errors));
        }
    };
    let base = Path::new(origin)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let (config, mut found) = check::check(&raw, &filters, base);
    // After the checks' own errors: at one place, theirs come first.
    found.append(&mut errors);
    if found.is_empty() {
        Ok(config)
    } else {
        Err(finish(found))
    }
}

fn from_serde(error: &serde_saphyr::Error) -> ConfigError {
    let rendered = error.to_string();
    let first = rendered.lines().next().unwrap_or_default();
    // "error: line 4 column 5: unknown field ..." → "unknown field ..."
    let message = first
        .strip_prefix("error: ")
        .unwrap_or(first)
        .split_once(": ")
        .filter(|(head, _)| head.starts_with("line "))
        .map_or(first, |(_, rest)| rest);
    // Advice meant for the parser's API users, not for someone editing the file.
    let message = message
        .split(", set DuplicateKeyPolicy")
        .next()
        .unwrap_or(message)
        .replace("duplicate mapping key: ", "duplicate key: ")
        .to_owned();
    let mut out = ConfigError::new("", message.clone());
    if let Some(location) = error.location() {
        out = out.at(location.line(), location.column());
    }
    // "unknown field `wieght`, expected one of address, weight"
    if let Some(rest) = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))
    {
        if let Some((word, expected)) = rest.split_once("`, expected one of ") {
            if let Some(hint) = did_you_mean(word, expected.split(", ").map(str::trim)) {
                out = out.hint(hint);
            }
        } else if let Some((word, expected)) = rest.split_once("`, expected ") {
            if let Some(hint) = did_you_mean(word, [expected.trim_matches('`')]) {
                out = out.hint(hint);
            }
        }
    }
    out
}
