use std::fmt;

/// One problem in a configuration file, located for a person to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or other origin) the text came from.
    pub origin: String,
    /// 1-based line; 0 when the problem has no single place (e.g. "no listeners").
    pub line: u64,
    /// 1-based column; 0 when unknown.
    pub column: u64,
    /// Path of the field, like `clusters[0].backends[1].address`; empty when unknown.
    pub field: String,
    /// What is wrong and what was expected.
    pub message: String,
    /// A suggestion, such as "did you mean `weight`?".
    pub hint: Option<String>,
    /// The offending source line, for display.
    pub(crate) source_line: Option<String>,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            origin: String::new(),
            line: 0,
            column: 0,
            field: field.into(),
            message: message.into(),
            hint: None,
            source_line: None,
        }
    }

    pub(crate) fn at(mut self, line: u64, column: u64) -> Self {
        self.line = line;
        self.column = column;
        self
    }

    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.origin)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        f.write_str(": ")?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)?;
        if let Some(line) = &self.source_line {
            let number = self.line.to_string();
            let pad = " ".repeat(number.len());
            let caret = " ".repeat(self.column.saturating_sub(1) as usize);
            write!(f, "\n{pad} |\n{number} | {line}\n{pad} | {caret}^")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in a configuration file. Loading reports them all at once, so one edit can fix
/// them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    /// The problems, in file order where known.
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    pub(crate) fn single(error: ConfigError) -> Self {
        Self {
            errors: vec![error],
        }
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "error: {error}")?;
        }
        let n = self.errors.len();
        write!(
            f,
            "\n{n} error{} in configuration",
            if n == 1 { "" } else { "s" }
        )
    }
}

impl std::error::Error for ConfigErrors {}

/// Levenshtein distance, for "did you mean" hints over short names.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = if ca == cb {
                previous
            } else {
                1 + previous.min(row[j]).min(row[j + 1])
            };
            previous = current;
        }
    }
    row[b.len()]
}

/// The closest candidate to `word`, if it is close enough to be a likely typo, or if `word` is a
/// singular or a stem of it (`retry` for `retries`).
pub(crate) fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let word = word.to_ascii_lowercase();
    let stem = word.get(..word.len().saturating_sub(1)).unwrap_or_default();
    candidates
        .into_iter()
        .map(|c| {
            let distance = edit_distance(&word, c);
            let stem_of = stem.len() >= 4 && c.starts_with(stem);
            (if stem_of { distance.min(2) } else { distance }, c)
        })
        .filter(|&(d, c)| d <= 2.max(c.len() / 3))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| format!("did you mean `{c}`?"))
}
