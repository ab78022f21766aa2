//! `access_log:`: its format, its field names (each known, none twice) and its success sample.

use crate::{
    access_log::{AccessLog, LogField, LogFormat},
    checker::Checker,
    error::did_you_mean,
    field::Field,
    raw::{RawAccessLog, Scalar},
};
use serde_saphyr::Spanned;

pub(super) fn access_log(checker: &mut Checker, raw: Option<&RawAccessLog>) -> AccessLog {
    let mut log = AccessLog::default();
    let Some(raw) = raw else { return log };
    let field = Field::root("access_log");
    if let Some(format) = &raw.format {
        log.format = match format.value.0.trim() {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            "combined" => Some(LogFormat::Combined),
            other => {
                let message =
                    format!("unknown format `{other}`: expected `text`, `json` or `combined`");
                checker.reject(format, field.key("format"), message);
                None
            }
        };
    }
    if let Some(fields) = &raw.fields {
        if log.format == Some(LogFormat::Combined) {
            // nginx's line is fixed: a list here would be silently ignored.
            let message = "`fields` does not apply to `format: combined`, whose fields are \
                           nginx's, fixed: leave `fields` out, or choose `text` or `json`";
            checker.reject(fields, field.key("fields"), message);
        }
        log.fields = fields_of(checker, fields, &field.key("fields"));
    }
    log.sample_success = checker.percent(
        raw.sample_success.as_ref(),
        &field.key("sample_success"),
        1.0,
    );
    log
}

/// The fields listed, each a known one and none twice; at least one.
fn fields_of(
    checker: &mut Checker,
    fields: &Spanned<Vec<Spanned<Scalar>>>,
    at: &Field,
) -> Vec<LogField> {
    if fields.value.is_empty() {
        let message = "no fields: list at least one (or leave `fields` out for the default line)";
        checker.reject(fields, at, message);
        return LogField::DEFAULT.to_vec();
    }
    let mut chosen = Vec::with_capacity(fields.value.len());
    for (i, name) in fields.value.iter().enumerate() {
        let text = name.value.0.trim();
        match LogField::from_name(text) {
            Some(field) if chosen.contains(&field) => {
                checker.reject(name, at.index(i), format!("`{text}` is listed twice"));
            }
            Some(field) => chosen.push(field),
            None => {
                let known: Vec<&str> = LogField::ALL.iter().map(|f| f.name()).collect();
                let message = format!(
                    "unknown access-log field `{text}`, expected one of {}",
                    known.join(", ")
                );
                let mut error = checker.error(name, at.index(i), message);
                if let Some(hint) = did_you_mean(text, known.iter().copied()) {
                    error = error.hint(hint);
                }
                checker.push(error);
            }
        }
    }
    chosen
}
