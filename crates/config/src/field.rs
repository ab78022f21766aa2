//! The field paths errors name, such as `clusters[2].backends[0].address`.

use std::fmt;

/// Where a value sits in the file, written as errors name it. Built up from the section down, so a
/// path cannot lose its prefix on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Field(String);

impl Field {
    /// A top-level key: `limits`, `clusters`.
    pub(crate) fn root(name: &str) -> Self {
        Self(name.to_owned())
    }

    /// A key under this one: `limits` → `limits.send_timeout`.
    pub(crate) fn key(&self, name: &str) -> Self {
        Self(format!("{}.{name}", self.0))
    }

    /// An item of this list: `clusters` → `clusters[2]`.
    pub(crate) fn index(&self, index: usize) -> Self {
        Self(format!("{}[{index}]", self.0))
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Field> for String {
    fn from(field: Field) -> Self {
        field.0
    }
}

impl From<&Field> for String {
    fn from(field: &Field) -> Self {
        field.0.clone()
    }
}

/// A place in the configuration file (1-based), for errors found after parsing (such as a certificate
/// file that cannot be read when duet starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Location {
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub column: u64,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_read_as_written_in_errors() {
        let backend = Field::root("clusters").index(2).key("backends").index(0);
        assert_eq!(
            backend.key("address").to_string(),
            "clusters[2].backends[0].address"
        );
        assert_eq!(
            String::from(Field::root("limits").key("send_timeout")),
            "limits.send_timeout"
        );
    }
}
