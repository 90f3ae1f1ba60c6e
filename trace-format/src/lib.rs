//! # remat-trace — the DTR paper's operator traces
//!
//! Kirisame et al. ("Dynamic Tensor Rematerialization", ICLR 2021) logged PyTorch
//! training runs as JSON Lines: one object per line, keyed by `INSTRUCTION`. This
//! crate parses them into typed [`Instruction`]s, resolves names to tensors and
//! tensors to storages, and replays them without a budget.
//!
//! ## The format
//!
//! | line | meaning |
//! |---|---|
//! | `ANNOTATE {ANNOTATION}` | `START` marks the measured iteration (everything before is warm-up); `BACKWARD` the backward pass |
//! | `CONSTANT {NAME}` | a parameter or input, pinned; followed by its `MEMORY` |
//! | `MEMORY {NAME, MEMORY}` | bytes (a decimal string) of the preceding `CONSTANT` or `CALL` result |
//! | `CALL {NAME, ARGS, RESULT, TIME}` | an operator `NAME` (cost `TIME` ns); each result is followed by `MEMORY` and `ALIAS` |
//! | `ALIAS {NAME, ALIAS}` | `-1`: the result has a fresh storage; `k >= 0`: it is a view of `ARGS[k]`'s storage |
//! | `MUTATE {NAME, ARGS, MUTATE, TIME}` | an in-place operator on the arguments at the listed indices |
//! | `COPY {DST, SRC}` | `DST` is a new name for `SRC`'s tensor (one more reference) |
//! | `COPY_FROM {DST, SRC}` | `DST` now names `SRC`'s tensor; its old tensor loses a reference |
//! | `RELEASE {NAME}` | the name is dropped; its tensor loses a reference |
//!
//! A *storage* is the memory a `CONSTANT` or an `ALIAS -1` result brings; views
//! share it. A storage dies when no name refers to any tensor on it. Numbers are
//! written as strings (`"MEMORY":"1728"`); JSON numbers are accepted as well.
//!
//! ```text
//! {"INSTRUCTION":"CONSTANT","NAME":"x0"}
//! {"INSTRUCTION":"MEMORY","MEMORY":"1024","NAME":"x0"}
//! {"ARGS":["x0"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["x1"],"TIME":"50"}
//! {"INSTRUCTION":"MEMORY","MEMORY":"1024","NAME":"x1"}
//! {"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x1"}
//! {"INSTRUCTION":"RELEASE","NAME":"x1"}
//! ```
//!
//! ## Use
//!
//! ```
//! let text = r#"{"INSTRUCTION":"CONSTANT","NAME":"x0"}
//! {"INSTRUCTION":"MEMORY","MEMORY":"1024","NAME":"x0"}
//! {"ARGS":["x0"],"INSTRUCTION":"CALL","NAME":"relu","RESULT":["x1"],"TIME":"50"}
//! {"INSTRUCTION":"MEMORY","MEMORY":"1024","NAME":"x1"}
//! {"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"x1"}
//! {"INSTRUCTION":"RELEASE","NAME":"x1"}
//! "#;
//! let trace = remat_trace::Trace::parse("tiny", text)?;
//! let base = remat_trace::baseline(&trace)?;
//! assert_eq!((base.peak_bytes, base.compute_ns, base.constant_bytes), (2048, 50, 1024));
//! let lives = remat_trace::storage_lifetimes(&trace)?;
//! assert_eq!(lives[1].alloc_at, 4);
//! assert_eq!(lives[1].free_at, Some(5));
//! # Ok::<(), remat_trace::TraceError>(())
//! ```
//!
//! The traces themselves live outside the repository (`../shared/traces/dtr-paper`,
//! or wherever `REMAT_TRACES_DIR` points); [`traces_dir`], [`trace_files`],
//! [`find_trace`] and [`require_traces`] find them. Never copy them into the repo.
//!
//! Malformed input (bad JSON, missing keys, unknown instructions, unknown names,
//! non-numeric sizes, …) is a [`TraceError`] naming the line, never a panic.
//!
//! ## Module layout
//!
//! | module | what it owns |
//! |---|---|
//! | the crate root | [`Trace`]: a parsed trace (its name and instructions); loading, parsing with the replay check or without it, writing back as JSON Lines |
//! | `instruction` | [`Instruction`] and [`Annotation`], one per line, and the line-level JSON parser and writer |
//! | `replay` | resolving names to tensors and tensors to storages without a budget: [`storage_events`], [`storage_lifetimes`] ([`StorageEvent`], [`StorageLifetime`]) and [`baseline`] ([`BaselineFigures`], the DTR paper simulator's exact figures) |
//! | `builder` | [`TraceBuilder`]: a trace written instruction by instruction (synthetic traces for tests, examples and benches), checked like a parsed one |
//! | `locate` | finding the trace files outside the repository: [`traces_dir`] (`REMAT_TRACES_DIR`, [`TRACES_DIR_ENV`]), [`trace_files`], [`find_trace`], [`require_traces`]; the PyTorch-logged traces beside them: [`torch_traces_dir`], [`require_torch_trace`] |
//! | `error` | [`TraceError`] |

mod builder;
mod error;
mod instruction;
mod locate;
mod replay;

use std::path::Path;

pub use builder::TraceBuilder;
pub use error::TraceError;
pub use instruction::{Annotation, Instruction};
pub use locate::{
    find_trace, require_torch_trace, require_traces, torch_traces_dir, trace_files, traces_dir,
    TRACES_DIR_ENV,
};
pub use replay::{
    baseline, storage_events, storage_lifetimes, BaselineFigures, StorageEvent, StorageLifetime,
};

/// A parsed trace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    /// A short name: for a file, its name up to the first `-`
    /// (`"resnet32"` for `resnet32-56-9000000000.0-….log`).
    pub name: String,
    /// The instructions, in order (blank lines skipped).
    pub instructions: Vec<Instruction>,
}

impl Trace {
    /// Reads and parses a trace file; the trace's name is the file name up to the
    /// first `-` (see [`Trace::name_of`]).
    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Trace::parse(&Trace::name_of(path), &text)
    }

    /// The short name of a trace file: its file name up to the first `-`, or up
    /// to the extension when there is no `-` (`"lstm"` for `lstm-128-….log`).
    pub fn name_of(path: &Path) -> String {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        match stem.split_once('-') {
            Some((prefix, _)) => prefix.to_string(),
            None => stem,
        }
    }

    /// Parses the text of a trace and checks that it replays: every name used is
    /// bound, every `CONSTANT` and result gets its `MEMORY` (and `ALIAS`), every
    /// `ALIAS` index is in range. Blank lines are skipped; errors name the 1-based
    /// line of `text`.
    pub fn parse(name: &str, text: &str) -> Result<Trace, TraceError> {
        let (trace, lines) = Trace::parse_lines(name, text)?;
        replay::replay(&trace.instructions, &|i| lines[i], &mut |_| {})?;
        Ok(trace)
    }

    /// Parses the text of a trace line by line without checking that it replays
    /// (for fragments of traces). [`storage_lifetimes`] and [`baseline`] still
    /// reject such a trace if it does not replay, naming the instruction position.
    pub fn parse_unchecked(name: &str, text: &str) -> Result<Trace, TraceError> {
        Trace::parse_lines(name, text).map(|(t, _)| t)
    }

    fn parse_lines(name: &str, text: &str) -> Result<(Trace, Vec<usize>), TraceError> {
        let mut instructions = Vec::new();
        let mut lines = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            instructions.push(Instruction::parse_line(i + 1, line)?);
            lines.push(i + 1);
        }
        let trace = Trace {
            name: name.to_string(),
            instructions,
        };
        Ok((trace, lines))
    }

    /// The trace in its file format (JSON Lines, one instruction per line, each
    /// line ending in `\n`). [`Trace::parse`] reads it back unchanged.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::new();
        for ins in &self.instructions {
            out.push_str(&ins.to_json().to_string());
            out.push('\n');
        }
        out
    }

    /// The index of the first `ANNOTATE START`, if any (the measured iteration
    /// begins there; everything before it is warm-up).
    pub fn start_index(&self) -> Option<usize> {
        self.instructions
            .iter()
            .position(|i| matches!(i, Instruction::Annotate(Annotation::Start)))
    }

    /// Shorthand for [`storage_lifetimes`]`(self)`.
    pub fn storage_lifetimes(&self) -> Result<Vec<StorageLifetime>, TraceError> {
        storage_lifetimes(self)
    }

    /// Shorthand for [`baseline`]`(self)`.
    pub fn baseline(&self) -> Result<BaselineFigures, TraceError> {
        baseline(self)
    }
}
