//! `PolicyError`: why a rules file was refused, with the line and column to look at.

use std::fmt;

/// A rules file that could not be turned into a [`super::Policy`]. Lines and columns count from
/// 1, in characters, like editors and compilers do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl PolicyError {
    pub fn new(line: usize, column: usize, message: impl Into<String>) -> Self {
        PolicyError {
            line,
            column,
            message: message.into(),
        }
    }

    /// Displays as `FILE:LINE:COLUMN: message`, the form editors jump to.
    pub fn in_file<'a>(&'a self, file: &'a str) -> impl fmt::Display + 'a {
        InFile { error: self, file }
    }

    /// The error in a file, then the offending line of `text` with a caret under the column:
    /// what `floodgate rules check` prints.
    pub fn render(&self, file: &str, text: &str) -> String {
        let mut out = format!("{}\n", self.in_file(file));
        if let Some(source_line) = text.lines().nth(self.line.saturating_sub(1)) {
            let gutter = self.line.to_string();
            let pad = " ".repeat(gutter.len());
            let caret = " ".repeat(self.column.saturating_sub(1));
            out.push_str(&format!(
                "{pad} |\n{gutter} | {source_line}\n{pad} | {caret}^\n"
            ));
        }
        out
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.line, self.column, self.message)
    }
}

impl std::error::Error for PolicyError {}

struct InFile<'a> {
    error: &'a PolicyError,
    file: &'a str,
}

impl fmt::Display for InFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.error)
    }
}
