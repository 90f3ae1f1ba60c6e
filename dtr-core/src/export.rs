//! A recorded iteration as a trace in the DTR paper's format: what
//! [`Recording::to_trace`] writes, so that `remat replay`, `remat plan` and
//! `remat advise` run on a user's own model and the file can go with a bug
//! report. Framework-independent: the adapters (remat-candle's
//! `Remat::export_trace`, remat-burn's) take the runtime's
//! [`Runtime::last_recording`](crate::Runtime::last_recording) and write it.
//!
//! | recording | trace |
//! |---|---|
//! | each storage live at the start, resident or in the host tier ([`crate::Boundary::storages`]) | `CONSTANT s{k}` + `MEMORY` (a parameter, an input or a value held across steps); the tensors on it share that name, one `COPY` per further handle |
//! | a tensor at the start whose storage is not resident | `CONSTANT` of 0 bytes (it cannot be read) |
//! | [`Event::Put`] | `CONSTANT c{n}` + `MEMORY` |
//! | [`Event::Apply`] | `CALL` with the op's name and measured cost (`TIME`), then `MEMORY` and `ALIAS` per output (`-1` fresh, `k` a view of argument `k`, sized as its storage) |
//! | [`Event::Mutate`] | `MUTATE` |
//! | [`Event::Retain`] | `COPY` to a new name |
//! | [`Event::Release`] | `RELEASE` of one of the tensor's names |
//! | [`Event::Access`]; [`Event::Pin`]s in a row | a read: `CALL` [`READ`] of the tensors, no result, `TIME` 0 (a framework's backward reads its saved activations this way: Candle pins them) |
//! | `Unpin`, `Evict`, `MakeRoot(s)` | nothing: the format has no such lines |
//!
//! Replayed without a budget the trace gives the iteration's peak of live
//! bytes and its compute (Σ of the recorded costs) exactly. What the format
//! cannot say: how long a pin lasts (a read is a moment), and ops that may
//! not be replayed (every `CALL` is replayable in a trace).

use std::collections::HashMap;
use std::path::Path;

use remat_trace::{Annotation, Instruction, Trace};

use crate::error::{Error, Result};
use crate::op::OutputSpec;
use crate::record::{Event, Recording, Ref};

/// What the recording says of one tensor while it is converted.
struct Tensor {
    /// Its live names in the trace, one per handle (released last first).
    names: Vec<String>,
    /// Bytes of its storage (the `MEMORY` of a view of it).
    bytes: u64,
}

impl Recording {
    /// This iteration as a trace named `name` (see the [module](crate::export)
    /// doc for the mapping). The trace is checked as a parsed file is: it
    /// replays.
    ///
    /// Errors: [`Error::InvalidArgument`] when an event names a tensor the
    /// recording does not hold at that point (a recording that is not one
    /// whole iteration, or built by hand); [`Error::Trace`] if the result
    /// does not replay (a bug).
    pub fn to_trace(&self, name: &str) -> Result<Trace> {
        let mut out = vec![Instruction::Annotate(Annotation::Start)];
        let mut tensors: HashMap<Ref, Tensor> = HashMap::new();
        let mut fresh = 0u64;
        let mut new_name = |prefix: &str| {
            fresh += 1;
            format!("{prefix}{}", fresh - 1)
        };
        // The starting state: one constant per resident storage, shared by
        // the tensors on it.
        let mut storage_name: Vec<Option<String>> = vec![None; self.start.storages.len()];
        for (k, &(storage, handles)) in self.start.tensors.iter().enumerate() {
            let (first, bytes) = match storage {
                Some(s) => {
                    let s = s as usize;
                    let bytes = *self.start.storages.get(s).ok_or_else(|| {
                        bad_ref(
                            "the start",
                            Ref::Prefix(k as u32),
                            "a storage index within Boundary::storages",
                        )
                    })?;
                    match &storage_name[s] {
                        None => {
                            let n = format!("s{s}");
                            out.push(Instruction::Constant { name: n.clone() });
                            out.push(Instruction::Memory {
                                name: n.clone(),
                                bytes,
                            });
                            storage_name[s] = Some(n.clone());
                            (n, bytes)
                        }
                        // Another tensor on a storage already named: the
                        // same trace tensor under a new name.
                        Some(src) => {
                            let n = new_name("h");
                            out.push(Instruction::Copy {
                                dst: n.clone(),
                                src: src.clone(),
                            });
                            (n, bytes)
                        }
                    }
                }
                None => {
                    let n = new_name("e");
                    out.push(Instruction::Constant { name: n.clone() });
                    out.push(Instruction::Memory {
                        name: n.clone(),
                        bytes: 0,
                    });
                    (n, 0)
                }
            };
            let mut names = vec![first.clone()];
            for _ in 1..handles.max(1) {
                let n = new_name("h");
                out.push(Instruction::Copy {
                    dst: n.clone(),
                    src: first.clone(),
                });
                names.push(n);
            }
            tensors.insert(Ref::Prefix(k as u32), Tensor { names, bytes });
        }
        // The storages no live tensor holds (kept resident by the runtime):
        // constants too, so that the starting bytes match.
        for (s, n) in storage_name.iter_mut().enumerate() {
            if n.is_none() {
                let name = format!("s{s}");
                out.push(Instruction::Constant { name: name.clone() });
                out.push(Instruction::Memory {
                    name: name.clone(),
                    bytes: self.start.storages[s],
                });
                *n = Some(name);
            }
        }
        let mut next_new = 0u32;
        let first_name = |tensors: &HashMap<Ref, Tensor>, at: usize, r: Ref, what| {
            tensors
                .get(&r)
                .and_then(|t| t.names.first().cloned())
                .ok_or_else(|| bad_ref(&format!("event {at} ({what})"), r, LIVE))
        };
        for (at, e) in self.events.iter().enumerate() {
            match e {
                Event::Put { bytes } => {
                    let n = format!("c{next_new}");
                    out.push(Instruction::Constant { name: n.clone() });
                    out.push(Instruction::Memory {
                        name: n.clone(),
                        bytes: *bytes,
                    });
                    tensors.insert(
                        Ref::New(next_new),
                        Tensor {
                            names: vec![n],
                            bytes: *bytes,
                        },
                    );
                    next_new += 1;
                }
                Event::Apply {
                    name,
                    inputs,
                    outputs,
                    cost_ns,
                    ..
                } => {
                    let args = inputs
                        .iter()
                        .map(|&r| first_name(&tensors, at, r, "an op's input"))
                        .collect::<Result<Vec<_>>>()?;
                    let mut results = Vec::with_capacity(outputs.len());
                    let mut sized = Vec::with_capacity(outputs.len());
                    for spec in outputs {
                        let n = format!("t{next_new}");
                        let (bytes, alias) = match *spec {
                            OutputSpec::Fresh { bytes } => (bytes, -1),
                            OutputSpec::View { input } => {
                                let base = inputs.get(input).and_then(|r| tensors.get(r));
                                let base = base.ok_or_else(|| {
                                    bad_ref(
                                        &format!("event {at} (a view's input {input})"),
                                        Ref::New(next_new),
                                        "a view of one of the op's inputs",
                                    )
                                })?;
                                (base.bytes, input as i64)
                            }
                        };
                        results.push(n.clone());
                        sized.push((n, bytes, alias));
                        next_new += 1;
                    }
                    out.push(Instruction::Call {
                        op: name.clone(),
                        args,
                        results,
                        time_ns: *cost_ns,
                    });
                    let first_new = next_new - sized.len() as u32;
                    for (k, (n, bytes, alias)) in sized.into_iter().enumerate() {
                        out.push(Instruction::Memory {
                            name: n.clone(),
                            bytes,
                        });
                        out.push(Instruction::Alias {
                            name: n.clone(),
                            alias,
                        });
                        tensors.insert(
                            Ref::New(first_new + k as u32),
                            Tensor {
                                names: vec![n],
                                bytes,
                            },
                        );
                    }
                }
                Event::Mutate {
                    name,
                    inputs,
                    mutated,
                    cost_ns,
                    ..
                } => {
                    let args = inputs
                        .iter()
                        .map(|&r| first_name(&tensors, at, r, "a mutation's input"))
                        .collect::<Result<Vec<_>>>()?;
                    out.push(Instruction::Mutate {
                        name: name.clone(),
                        args,
                        mutate: mutated.clone(),
                        time_ns: *cost_ns,
                    });
                }
                Event::Retain(r) => {
                    let src = first_name(&tensors, at, *r, "retain")?;
                    let n = new_name("h");
                    out.push(Instruction::Copy {
                        dst: n.clone(),
                        src,
                    });
                    if let Some(t) = tensors.get_mut(r) {
                        t.names.push(n);
                    }
                }
                Event::Release(r) => {
                    let n = tensors
                        .get_mut(r)
                        .and_then(|t| t.names.pop())
                        .ok_or_else(|| bad_ref(&format!("event {at} (release)"), *r, LIVE))?;
                    out.push(Instruction::Release { name: n });
                }
                Event::Access(r) => {
                    let arg = first_name(&tensors, at, *r, "a read")?;
                    out.push(read(vec![arg]));
                }
                Event::Pin(r) => {
                    // Pins in a row (an op's inputs, pinned together for a
                    // computation the runtime does not see): one read of all.
                    let arg = first_name(&tensors, at, *r, "a pin")?;
                    match out.last_mut() {
                        Some(Instruction::Call { op, args, .. })
                            if op == READ
                                && matches!(
                                    self.events.get(at.wrapping_sub(1)),
                                    Some(Event::Pin(_))
                                ) =>
                        {
                            args.push(arg)
                        }
                        _ => out.push(read(vec![arg])),
                    }
                }
                Event::Unpin(_) | Event::Evict(_) | Event::MakeRoot(_) | Event::MakeRoots(_) => {}
            }
        }
        let trace = Trace {
            name: name.to_string(),
            instructions: out,
        };
        // Checked as a parsed file is (every name bound, every result sized).
        Ok(Trace::parse(name, &trace.to_jsonl())?)
    }
}

/// The op name of a read: a `CALL` of no cost and no result, whose
/// arguments must be resident together (a budgeted replay rematerializes
/// them, as the runtime did for an access or a pin).
pub const READ: &str = "remat::read";

fn read(args: Vec<String>) -> Instruction {
    Instruction::Call {
        op: READ.to_string(),
        args,
        results: Vec::new(),
        time_ns: 0,
    }
}

/// What a tensor named by an event must be.
const LIVE: &str = "a tensor live at that point of the iteration";

fn bad_ref(at: &str, r: Ref, expected: &'static str) -> Error {
    Error::InvalidArgument {
        name: "recording",
        value: format!("{at} names {r:?}"),
        expected,
    }
}

/// Write `trace` to `path` as JSON Lines ([`Trace::to_jsonl`]); `remat
/// replay`, `remat plan` and `remat advise` read it back.
///
/// Errors: [`Error::TraceWrite`] naming the path when the file cannot be
/// written.
pub fn write_trace(trace: &Trace, path: &Path) -> Result<()> {
    std::fs::write(path, trace.to_jsonl()).map_err(|source| Error::TraceWrite {
        path: path.to_path_buf(),
        source,
    })
}
