//! The error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while reading or replaying a trace.
///
/// Every variant that comes from the content of a trace carries `line`: the
/// 1-based line of the file. For a [`Trace`](crate::Trace) built in code rather
/// than parsed, `line` is the 1-based position of the instruction in
/// [`Trace::instructions`](crate::Trace::instructions) (the same thing for a file
/// without blank lines).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The trace file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The file that was being read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a JSON object.
    #[error("line {line}: invalid JSON: {message}")]
    Json {
        /// 1-based line number.
        line: usize,
        /// What the JSON parser said (or "expected a JSON object").
        message: String,
    },
    /// A required key is absent.
    #[error("line {line}: {instruction} is missing key {key:?}")]
    MissingKey {
        /// 1-based line number.
        line: usize,
        /// The instruction kind (`"CALL"`, …), or `"<line>"` when `INSTRUCTION` itself is missing.
        instruction: String,
        /// The missing key.
        key: &'static str,
    },
    /// The value of `INSTRUCTION` (or of `ANNOTATION`'s parent) is not known.
    #[error("line {line}: unknown instruction {instruction:?}")]
    UnknownInstruction {
        /// 1-based line number.
        line: usize,
        /// The unknown instruction name.
        instruction: String,
    },
    /// A key holds a value of the wrong shape (e.g. a non-numeric `MEMORY`).
    #[error("line {line}: {instruction}.{key}: expected {expected}, found {found}")]
    BadValue {
        /// 1-based line number.
        line: usize,
        /// The instruction kind.
        instruction: String,
        /// The offending key.
        key: &'static str,
        /// What was expected ("a non-negative integer", "an array of names", …).
        expected: &'static str,
        /// The value found, as JSON text.
        found: String,
    },
    /// A name is used that is not bound to a tensor at that point.
    #[error("line {line}: unknown name {name:?} in {instruction}")]
    UnknownName {
        /// 1-based line number.
        line: usize,
        /// The instruction kind.
        instruction: String,
        /// The unknown name.
        name: String,
    },
    /// A structurally valid instruction that breaks the trace's rules: a `MEMORY`
    /// that follows neither `CONSTANT` nor a `CALL` result, an `ALIAS` index out of
    /// range, a name bound twice, a `CONSTANT` that never got its `MEMORY`, …
    #[error("line {line}: {message}")]
    Invalid {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

impl TraceError {
    /// The 1-based line the error refers to, if it refers to one.
    pub fn line(&self) -> Option<usize> {
        match self {
            TraceError::Io { .. } => None,
            TraceError::Json { line, .. }
            | TraceError::MissingKey { line, .. }
            | TraceError::UnknownInstruction { line, .. }
            | TraceError::BadValue { line, .. }
            | TraceError::UnknownName { line, .. }
            | TraceError::Invalid { line, .. } => Some(*line),
        }
    }
}
