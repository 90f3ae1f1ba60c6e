//! [`TraceBuilder`]: write a trace instruction by instruction (synthetic traces
//! for tests, examples and benches), checked like a parsed one.

use crate::{Annotation, Instruction, Trace, TraceError};

/// Builds a [`Trace`] in order; each method appends the lines one trace event
/// takes (a `CONSTANT` with its `MEMORY`, a `CALL` with its results' `MEMORY` and
/// `ALIAS`, …). [`TraceBuilder::build`] checks that the trace replays.
///
/// ```
/// use remat_trace::TraceBuilder;
///
/// let trace = TraceBuilder::new("tiny")
///     .constant("x0", 1024)
///     .call("relu", &["x0"], "x1", 1024, 50)
///     .view("reshape", &["x1"], "x2", 0, 1024, 1)
///     .release("x1")
///     .release("x2")
///     .build()?;
/// let base = remat_trace::baseline(&trace)?;
/// assert_eq!((base.peak_bytes, base.compute_ns), (2048, 51));
/// # Ok::<(), remat_trace::TraceError>(())
/// ```
#[derive(Debug, Clone)]
pub struct TraceBuilder {
    trace: Trace,
}

impl TraceBuilder {
    /// An empty trace named `name`, starting with `ANNOTATE START`.
    pub fn new(name: &str) -> Self {
        Self {
            trace: Trace {
                name: name.to_string(),
                instructions: vec![Instruction::Annotate(Annotation::Start)],
            },
        }
    }

    fn push(mut self, i: Instruction) -> Self {
        self.trace.instructions.push(i);
        self
    }

    /// `CONSTANT name` of `bytes`.
    pub fn constant(self, name: &str, bytes: u64) -> Self {
        let name = name.to_string();
        self.push(Instruction::Constant { name: name.clone() })
            .push(Instruction::Memory { name, bytes })
    }

    /// `CALL op(args) -> out` costing `time_ns`, with a fresh output of `bytes`.
    pub fn call(self, op: &str, args: &[&str], out: &str, bytes: u64, time_ns: u64) -> Self {
        self.result(op, args, out, bytes, -1, time_ns)
    }

    /// `CALL op(args) -> out` costing `time_ns`, whose output is a view of
    /// `args[input]` (`bytes` is the view's size; it brings no storage).
    pub fn view(
        self,
        op: &str,
        args: &[&str],
        out: &str,
        input: usize,
        bytes: u64,
        time_ns: u64,
    ) -> Self {
        self.result(op, args, out, bytes, input as i64, time_ns)
    }

    fn result(
        self,
        op: &str,
        args: &[&str],
        out: &str,
        bytes: u64,
        alias: i64,
        time_ns: u64,
    ) -> Self {
        let name = out.to_string();
        self.push(Instruction::Call {
            op: op.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            results: vec![name.clone()],
            time_ns,
        })
        .push(Instruction::Memory {
            name: name.clone(),
            bytes,
        })
        .push(Instruction::Alias { name, alias })
    }

    /// `MUTATE op(args)` costing `time_ns`, writing `args[k]` for each `k` of `mutated`.
    pub fn mutate(self, op: &str, args: &[&str], mutated: &[usize], time_ns: u64) -> Self {
        self.push(Instruction::Mutate {
            name: op.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            mutate: mutated.to_vec(),
            time_ns,
        })
    }

    /// `RELEASE name`.
    pub fn release(self, name: &str) -> Self {
        self.push(Instruction::Release {
            name: name.to_string(),
        })
    }

    /// `ANNOTATE BACKWARD`.
    pub fn backward(self) -> Self {
        self.push(Instruction::Annotate(Annotation::Backward))
    }

    /// The trace, checked as [`Trace::parse`] checks a file (every name bound,
    /// every result sized, every view index in range).
    pub fn build(self) -> Result<Trace, TraceError> {
        Trace::parse(&self.trace.name, &self.trace.to_jsonl())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_that_does_not_replay_is_an_error() {
        let e = TraceBuilder::new("bad")
            .call("f", &["nowhere"], "y", 8, 1)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("nowhere"), "{e}");
    }

    #[test]
    fn built_traces_round_trip_through_the_file_format() {
        let t = TraceBuilder::new("t")
            .constant("w", 64)
            .call("f", &["w"], "a", 32, 10)
            .mutate("add_", &["a", "w"], &[0], 5)
            .backward()
            .release("a")
            .build()
            .unwrap();
        assert_eq!(Trace::parse("t", &t.to_jsonl()).unwrap(), t);
        assert_eq!(t.instructions.len(), 9);
    }
}
