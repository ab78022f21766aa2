//! What every section check shares: the errors found so far, and the readers of single values
//! (durations, sizes, counts, percentages...) that record a located error and fall back to the
//! default, so checking goes on past a bad value.

use crate::{
    error::{did_you_mean, ConfigError},
    field::{Field, Location},
    raw::Scalar,
    units,
};
use serde_saphyr::Spanned;
use std::{path::PathBuf, time::Duration};

pub(crate) struct Checker {
    pub(crate) errors: Vec<ConfigError>,
    /// The config file's folder, for relative paths.
    base: PathBuf,
    /// The heap the regexes checked so far hold together, held to [`Pattern::TOTAL_LIMIT`].
    ///
    /// [`Pattern::TOTAL_LIMIT`]: crate::model::Pattern::TOTAL_LIMIT
    pub(crate) regex_memory: usize,
}

impl Checker {
    pub(crate) fn new(base: PathBuf) -> Self {
        Self {
            errors: Vec::new(),
            base,
            regex_memory: 0,
        }
    }

    /// An error at `spanned`'s place in the file, for the caller to add a hint to and push.
    pub(crate) fn error<T>(
        &self,
        spanned: &Spanned<T>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::new(field, message).at(spanned.referenced.line(), spanned.referenced.column())
    }

    pub(crate) fn push(&mut self, error: ConfigError) {
        self.errors.push(error);
    }

    /// Records an error at `spanned`'s place in the file.
    pub(crate) fn reject<T>(
        &mut self,
        spanned: &Spanned<T>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) {
        let error = self.error(spanned, field, message);
        self.push(error);
    }

    pub(crate) fn duration(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &Field,
        default: Duration,
    ) -> Duration {
        let Some(value) = value else { return default };
        match units::parse_duration(&value.value.0) {
            Ok(d) => d,
            Err(message) => {
                self.reject(value, field, message);
                default
            }
        }
    }

    /// A duration that must be above 0: for these fields 0 would not mean "no limit" but "at once".
    /// `would` says what 0 would do; `instead`, when there is one, the setting that does what the
    /// writer probably meant.
    pub(crate) fn timeout(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &Field,
        default: Duration,
        would: &str,
        instead: Option<&str>,
    ) -> Duration {
        let duration = self.duration(value, field, default);
        match value {
            Some(value) if duration.is_zero() => {
                let text = value.value.0.trim();
                let message = format!("`{text}` would {would}: expected a duration above 0");
                let such_as = format!(
                    "write a duration such as `{}` (the default)",
                    units::format_duration(default)
                );
                let hint = match instead {
                    Some(instead) => format!("{instead}; otherwise {such_as}"),
                    None => such_as,
                };
                let error = self.error(value, field, message).hint(hint);
                self.push(error);
                default
            }
            _ => duration,
        }
    }

    pub(crate) fn size(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &Field,
        default: usize,
        min: usize,
    ) -> usize {
        let Some(value) = value else { return default };
        match units::parse_size(&value.value.0).map(|s| usize::try_from(s).unwrap_or(usize::MAX)) {
            Ok(s) if s >= min => s,
            Ok(s) => {
                let message = format!("{s} bytes is too small: the minimum is {min}");
                self.reject(value, field, message);
                default
            }
            Err(message) => {
                self.reject(value, field, message);
                default
            }
        }
    }

    /// A size within `min..=max` bytes (as [`Checker::size`], with an upper bound and `why` it holds).
    pub(crate) fn size_within(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &Field,
        default: u32,
        (min, max): (u32, u32),
        why: &str,
    ) -> u32 {
        let Some(value) = value else { return default };
        match units::parse_size(&value.value.0) {
            Ok(s) if (u64::from(min)..=u64::from(max)).contains(&s) => {
                u32::try_from(s).unwrap_or(max)
            }
            Ok(s) => {
                let message = format!("{s} bytes is out of range: expected {min} to {max} ({why})");
                self.reject(value, field, message);
                default
            }
            Err(message) => {
                self.reject(value, field, message);
                default
            }
        }
    }

    /// `true` or `false`.
    pub(crate) fn boolean(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &Field,
        default: bool,
    ) -> bool {
        let Some(value) = value else { return default };
        match value.value.0.trim() {
            "true" => true,
            "false" => false,
            other => {
                let message = format!("`{other}` is not a boolean: expected true or false");
                self.reject(value, field, message);
                default
            }
        }
    }

    /// Bytes per second, written `1KiB/s`; `0` is off.
    pub(crate) fn rate(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &Field,
        default: u64,
    ) -> u64 {
        let Some(value) = value else { return default };
        match units::parse_rate(&value.value.0) {
            Ok(rate) => rate,
            Err(message) => {
                self.reject(value, field, message);
                default
            }
        }
    }

    /// The position of the cluster named `wanted` among `names` (the config's clusters in order),
    /// or `None` after recording that there is none, with the nearest name or the defined ones.
    pub(crate) fn cluster(
        &mut self,
        wanted: &Spanned<Scalar>,
        field: &Field,
        names: &[String],
    ) -> Option<usize> {
        let text = &wanted.value.0;
        let found = names.iter().position(|n| n == text);
        if found.is_none() {
            let e = self.error(wanted, field, format!("no cluster is named `{text}`"));
            let e = match did_you_mean(text, names.iter().map(String::as_str)) {
                Some(hint) => e.hint(hint),
                None if names.is_empty() => e.hint("define it under `clusters:`"),
                None => e.hint(format!("defined clusters: {}", names.join(", "))),
            };
            self.push(e);
        }
        found
    }

    /// Method names, upper-cased; `field` is the list's.
    pub(crate) fn methods(&mut self, raw: &[Spanned<Scalar>], field: &Field) -> Vec<String> {
        let mut methods = Vec::new();
        for (mi, m) in raw.iter().enumerate() {
            let method = m.value.0.trim().to_ascii_uppercase();
            if !method.is_empty() && method.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-') {
                methods.push(method);
            } else {
                let message = format!("`{}` is not an HTTP method", m.value.0);
                self.reject(m, field.index(mi), message);
            }
        }
        methods
    }

    /// `50%` or `50`: a percentage from 0 to 100, returned as a fraction.
    pub(crate) fn percent(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &Field,
        default: f64,
    ) -> f64 {
        let Some(value) = value else { return default };
        let text = value.value.0.trim();
        match text.trim_end_matches('%').trim().parse::<f64>() {
            Ok(p) if (0.0..=100.0).contains(&p) => p / 100.0,
            _ => {
                let message = format!(
                    "`{text}` is not a percentage: expected a number from 0 to 100, such as `50%`"
                );
                self.reject(value, field, message);
                default
            }
        }
    }

    pub(crate) fn count(
        &mut self,
        value: Option<&Spanned<Scalar>>,
        field: &Field,
        default: u32,
        (min, max): (u32, u32),
    ) -> u32 {
        let Some(value) = value else { return default };
        let text = value.value.0.trim();
        match text.parse::<u32>() {
            Ok(count) if (min..=max).contains(&count) => count,
            Ok(_) => {
                let message = format!("{text} is out of range: expected {min} to {max}");
                self.reject(value, field, message);
                default
            }
            Err(_) => {
                let message = format!("`{text}` is not a whole number: expected {min} to {max}");
                self.reject(value, field, message);
                default
            }
        }
    }

    /// Status codes and inclusive ranges (`503`, `200-399`).
    pub(crate) fn statuses(
        &mut self,
        values: &[Spanned<Scalar>],
        field: &Field,
    ) -> Vec<(u16, u16)> {
        let mut out = Vec::new();
        for (i, value) in values.iter().enumerate() {
            let text = value.value.0.trim();
            let parsed = match text.split_once('-') {
                Some((low, high)) => low
                    .trim()
                    .parse::<u16>()
                    .ok()
                    .zip(high.trim().parse::<u16>().ok()),
                None => text.parse::<u16>().ok().map(|code| (code, code)),
            };
            match parsed {
                Some((low, high))
                    if (100..=599).contains(&low) && (100..=599).contains(&high) && low <= high =>
                {
                    out.push((low, high))
                }
                _ => {
                    let message = format!(
                        "`{text}` is not a status or range: expected a code from 100 to 599, \
                         or a range such as `200-399`"
                    );
                    self.reject(value, field.index(i), message);
                }
            }
        }
        out
    }

    /// The bytes of the file at `value` (relative to the config file's folder), at most `max`: a page
    /// a route answers with, read with the config so that a reload reads it again and a missing file
    /// is an error of the config, located, rather than a failure at the first request.
    pub(crate) fn file(
        &mut self,
        value: &Spanned<Scalar>,
        field: &Field,
        max: u64,
    ) -> Option<(PathBuf, Vec<u8>)> {
        let (path, _) = self.path(value);
        match read_small_file(&path, max) {
            Ok(bytes) => Some((path, bytes)),
            Err(why) => {
                let e = self.error(
                    value,
                    field,
                    format!("cannot read `{}`: {why}", path.display()),
                );
                self.push(e.hint(format!(
                    "name a regular file of at most {max} bytes; a relative path starts from the \
                     config file's folder"
                )));
                None
            }
        }
    }

    /// A path relative to the config file's folder (read when duet starts, not here).
    pub(crate) fn path(&self, value: &Spanned<Scalar>) -> (PathBuf, Location) {
        let at = Location {
            line: value.referenced.line(),
            column: value.referenced.column(),
        };
        (self.base.join(&value.value.0), at)
    }
}

/// RFC 9110 §5.6.2's token, which header names and methods are.
pub(crate) fn token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A regular file's bytes, at most `max`: never a FIFO or a device, which could block or never end.
fn read_small_file(path: &std::path::Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    // Looked at before opening: opening a FIFO blocks until something writes to it.
    if !std::fs::metadata(path)
        .map_err(|e| e.to_string())?
        .is_file()
    {
        return Err("not a regular file".to_owned());
    }
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    // Again once open: the path may have been replaced in between.
    let metadata = file.metadata().map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err("not a regular file".to_owned());
    }
    let mut bytes = Vec::new();
    // One byte past the cap tells a file that is too large.
    (file.take(max + 1).read_to_end(&mut bytes)).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    Ok(bytes)
}
