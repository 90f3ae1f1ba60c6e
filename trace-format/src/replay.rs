//! Resolving names to tensors and tensors to storages: the replay-ready view.

use std::rc::Rc;

use ahash::AHashMap;

use crate::{Instruction, Trace, TraceError};

/// One storage's life in a trace: one allocation of `bytes` when it first
/// appears, one free when the last name that refers to any tensor on it goes.
///
/// Times are instruction indices into [`Trace::instructions`] (a monotone event
/// clock; at most one storage event happens per instruction index, except that a
/// `COPY_FROM` frees at most one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct StorageLifetime {
    /// Dense id, in order of creation (0, 1, 2, …).
    pub storage: usize,
    /// Bytes of the storage: the `MEMORY` of the `CONSTANT` or of the `CALL`
    /// result with `ALIAS -1` that created it. May be 0 (the DTR paper's storage
    /// counts leave such storages out).
    pub bytes: u64,
    /// Index of the instruction that allocates it (the `MEMORY` of a `CONSTANT`, the
    /// `ALIAS -1` of a result).
    pub alloc_at: usize,
    /// Index of the instruction (`RELEASE` or `COPY_FROM`) that frees it; `None` if it
    /// is still alive at the end of the trace.
    pub free_at: Option<usize>,
    /// Whether it holds a `CONSTANT` (a parameter or input: pinned, never evictable).
    pub constant: bool,
}

impl StorageLifetime {
    /// The end of its life as a half-open bound: `free_at`, or `trace_len` (the
    /// number of instructions) when it is alive at the end.
    pub fn end_or(&self, trace_len: usize) -> usize {
        self.free_at.unwrap_or(trace_len)
    }
}

/// A storage event of a replay, in trace order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum StorageEvent {
    /// A storage comes to life.
    Alloc {
        /// Instruction index.
        at: usize,
        /// Dense storage id (see [`StorageLifetime::storage`]).
        storage: usize,
        /// Its size in bytes.
        bytes: u64,
        /// Whether it holds a `CONSTANT`.
        constant: bool,
    },
    /// A storage dies: no name refers to any tensor on it any more.
    Free {
        /// Instruction index.
        at: usize,
        /// Dense storage id.
        storage: usize,
    },
}

/// The figures of an unbounded replay (no budget, nothing evicted): the "exact
/// baseline figures" of the DTR paper's simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct BaselineFigures {
    /// Maximum over time of the bytes of live storages, constants included.
    pub peak_bytes: u64,
    /// Sum of `TIME` over `CALL` and `MUTATE`, in nanoseconds.
    pub compute_ns: u64,
    /// Bytes of all `CONSTANT` storages.
    pub constant_bytes: u64,
}

/// A result or constant whose size or alias has not arrived yet.
enum Pending {
    Constant {
        index: usize,
    },
    Result {
        index: usize,
        /// The tensors of the `CALL`'s arguments (for `ALIAS k`).
        args: Rc<[usize]>,
        bytes: Option<u64>,
    },
}

impl Pending {
    fn index(&self) -> usize {
        match self {
            Pending::Constant { index } | Pending::Result { index, .. } => *index,
        }
    }
}

struct StorageState {
    /// Names bound to tensors on this storage.
    refs: usize,
}

/// The state machine behind every replay in this crate.
struct Replayer<'a> {
    line_of: &'a dyn Fn(usize) -> usize,
    names: AHashMap<String, usize>,
    tensor_storage: Vec<usize>,
    storages: Vec<StorageState>,
    pending: AHashMap<String, Pending>,
    compute_ns: u64,
}

impl Replayer<'_> {
    fn unknown(&self, i: usize, kind: &str, name: &str) -> TraceError {
        TraceError::UnknownName {
            line: (self.line_of)(i),
            instruction: kind.to_string(),
            name: name.to_string(),
        }
    }

    fn invalid(&self, i: usize, message: String) -> TraceError {
        TraceError::Invalid {
            line: (self.line_of)(i),
            message,
        }
    }

    fn tensor(&self, i: usize, kind: &str, name: &str) -> Result<usize, TraceError> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| self.unknown(i, kind, name))
    }

    fn check_fresh(&self, i: usize, name: &str) -> Result<(), TraceError> {
        if self.names.contains_key(name) || self.pending.contains_key(name) {
            Err(self.invalid(i, format!("name {name:?} is bound twice")))
        } else {
            Ok(())
        }
    }

    fn new_storage(
        &mut self,
        i: usize,
        bytes: u64,
        constant: bool,
        sink: &mut dyn FnMut(StorageEvent),
    ) -> usize {
        let storage = self.storages.len();
        self.storages.push(StorageState { refs: 0 });
        sink(StorageEvent::Alloc {
            at: i,
            storage,
            bytes,
            constant,
        });
        storage
    }

    fn bind(&mut self, name: String, tensor: usize) {
        self.storages[self.tensor_storage[tensor]].refs += 1;
        self.names.insert(name, tensor);
    }

    fn new_tensor(&mut self, storage: usize) -> usize {
        self.tensor_storage.push(storage);
        self.tensor_storage.len() - 1
    }

    fn unref(&mut self, i: usize, tensor: usize, sink: &mut dyn FnMut(StorageEvent)) {
        let storage = self.tensor_storage[tensor];
        let st = &mut self.storages[storage];
        st.refs -= 1;
        if st.refs == 0 {
            sink(StorageEvent::Free { at: i, storage });
        }
    }

    fn step(
        &mut self,
        i: usize,
        ins: &Instruction,
        sink: &mut dyn FnMut(StorageEvent),
    ) -> Result<(), TraceError> {
        let kind = ins.kind();
        match ins {
            Instruction::Annotate(_) => {}
            Instruction::Constant { name } => {
                self.check_fresh(i, name)?;
                self.pending
                    .insert(name.clone(), Pending::Constant { index: i });
            }
            Instruction::Memory { name, bytes } => match self.pending.get_mut(name) {
                Some(Pending::Constant { .. }) => {
                    self.pending.remove(name);
                    let storage = self.new_storage(i, *bytes, true, sink);
                    let tensor = self.new_tensor(storage);
                    self.bind(name.clone(), tensor);
                }
                Some(Pending::Result {
                    bytes: slot @ None, ..
                }) => *slot = Some(*bytes),
                Some(Pending::Result { .. }) => {
                    let message = format!("second MEMORY for result {name:?}");
                    return Err(self.invalid(i, message));
                }
                None => {
                    let message = format!(
                        "MEMORY for {name:?}, which is not a pending CONSTANT or CALL result"
                    );
                    return Err(self.invalid(i, message));
                }
            },
            Instruction::Call {
                args,
                results,
                time_ns,
                ..
            } => {
                let arg_tensors = args
                    .iter()
                    .map(|a| self.tensor(i, kind, a))
                    .collect::<Result<Vec<_>, _>>()?;
                let arg_tensors: Rc<[usize]> = arg_tensors.into();
                for r in results {
                    self.check_fresh(i, r)?;
                    self.pending.insert(
                        r.clone(),
                        Pending::Result {
                            index: i,
                            args: Rc::clone(&arg_tensors),
                            bytes: None,
                        },
                    );
                }
                self.compute_ns = self.compute_ns.saturating_add(*time_ns);
            }
            Instruction::Alias { name, alias } => {
                let (args, bytes) = match self.pending.get(name) {
                    Some(Pending::Result {
                        args,
                        bytes: Some(b),
                        ..
                    }) => (Rc::clone(args), *b),
                    Some(Pending::Result { bytes: None, .. }) => {
                        return Err(self.invalid(i, format!("ALIAS for {name:?} before its MEMORY")))
                    }
                    _ => {
                        return Err(self.invalid(
                            i,
                            format!("ALIAS for {name:?}, which is not a pending CALL result"),
                        ))
                    }
                };
                let storage = if *alias == -1 {
                    self.new_storage(i, bytes, false, sink)
                } else {
                    let arg = usize::try_from(*alias)
                        .ok()
                        .and_then(|k| args.get(k).copied())
                        .ok_or_else(|| {
                            self.invalid(
                                i,
                                format!(
                                    "ALIAS {alias} for {name:?}: expected -1 or an argument index below {}",
                                    args.len()
                                ),
                            )
                        })?;
                    let storage = self.tensor_storage[arg];
                    if self.storages[storage].refs == 0 {
                        return Err(self.invalid(
                            i,
                            format!("ALIAS {alias} for {name:?}: that argument's storage is already freed"),
                        ));
                    }
                    storage
                };
                self.pending.remove(name);
                let tensor = self.new_tensor(storage);
                self.bind(name.clone(), tensor);
            }
            Instruction::Mutate {
                args,
                mutate,
                time_ns,
                ..
            } => {
                for a in args {
                    self.tensor(i, kind, a)?;
                }
                if let Some(&bad) = mutate.iter().find(|&&k| k >= args.len()) {
                    return Err(self.invalid(
                        i,
                        format!(
                            "MUTATE index {bad} out of range for {} arguments",
                            args.len()
                        ),
                    ));
                }
                self.compute_ns = self.compute_ns.saturating_add(*time_ns);
            }
            Instruction::Copy { dst, src } => {
                let t = self.tensor(i, kind, src)?;
                self.check_fresh(i, dst)?;
                self.bind(dst.clone(), t);
            }
            Instruction::CopyFrom { dst, src } => {
                let t = self.tensor(i, kind, src)?;
                let old = self.tensor(i, kind, dst)?;
                // Take the new reference first so that rebinding a name to a tensor
                // on the same storage never frees it.
                self.bind(dst.clone(), t);
                self.unref(i, old, sink);
            }
            Instruction::Release { name } => {
                let t = self
                    .names
                    .remove(name)
                    .ok_or_else(|| self.unknown(i, kind, name))?;
                self.unref(i, t, sink);
            }
        }
        Ok(())
    }
}

/// Replays `instructions`, reporting storage events to `sink`; returns the total
/// compute time. `line_of` maps an instruction index to the line used in errors.
pub(crate) fn replay(
    instructions: &[Instruction],
    line_of: &dyn Fn(usize) -> usize,
    sink: &mut dyn FnMut(StorageEvent),
) -> Result<u64, TraceError> {
    let mut r = Replayer {
        line_of,
        names: AHashMap::new(),
        tensor_storage: Vec::new(),
        storages: Vec::new(),
        pending: AHashMap::new(),
        compute_ns: 0,
    };
    for (i, ins) in instructions.iter().enumerate() {
        r.step(i, ins, sink)?;
    }
    if let Some((name, p)) = r.pending.iter().min_by_key(|(_, p)| p.index()) {
        let what = match p {
            Pending::Constant { .. } => "CONSTANT",
            Pending::Result { .. } => "CALL result",
        };
        let message = format!("{what} {name:?} never got its MEMORY and ALIAS");
        return Err(r.invalid(p.index(), message));
    }
    Ok(r.compute_ns)
}

fn position(i: usize) -> usize {
    i + 1
}

/// Every storage event of `trace`, in order: the raw material for replaying it
/// through an allocator (one `malloc` per [`StorageEvent::Alloc`], one `free` per
/// [`StorageEvent::Free`]).
pub fn storage_events(trace: &Trace) -> Result<Vec<StorageEvent>, TraceError> {
    let mut events = Vec::new();
    replay(&trace.instructions, &position, &mut |e| events.push(e))?;
    Ok(events)
}

/// The lifetime of every storage of `trace`, sorted by `alloc_at` (which is also
/// the order of the dense storage ids).
///
/// Each storage is one allocation of its `MEMORY` bytes at its first appearance
/// (a `CONSTANT`'s `MEMORY`, or a result's `ALIAS -1`); views (`ALIAS k >= 0`)
/// allocate nothing. It is freed at the `RELEASE` or `COPY_FROM` that drops the
/// last name referring to any tensor on it. The whole file is replayed: in the
/// five DTR-paper traces `ANNOTATE START` is the first line.
pub fn storage_lifetimes(trace: &Trace) -> Result<Vec<StorageLifetime>, TraceError> {
    let mut out: Vec<StorageLifetime> = Vec::new();
    replay(&trace.instructions, &position, &mut |e| match e {
        StorageEvent::Alloc {
            at,
            storage,
            bytes,
            constant,
        } => out.push(StorageLifetime {
            storage,
            bytes,
            alloc_at: at,
            free_at: None,
            constant,
        }),
        StorageEvent::Free { at, storage } => out[storage].free_at = Some(at),
    })?;
    Ok(out)
}

/// The figures of an unbounded replay of the whole `trace`: peak live storage
/// bytes (constants included), compute time (sum of `TIME` over `CALL` and
/// `MUTATE`) and constant bytes. Reproduces the DTR paper simulator's baseline to
/// the byte and nanosecond.
pub fn baseline(trace: &Trace) -> Result<BaselineFigures, TraceError> {
    let mut live: u64 = 0;
    let mut peak: u64 = 0;
    let mut constant_bytes: u64 = 0;
    let mut sizes: Vec<u64> = Vec::new();
    let compute_ns = replay(&trace.instructions, &position, &mut |e| match e {
        StorageEvent::Alloc {
            bytes, constant, ..
        } => {
            sizes.push(bytes);
            live = live.saturating_add(bytes);
            peak = peak.max(live);
            if constant {
                constant_bytes = constant_bytes.saturating_add(bytes);
            }
        }
        StorageEvent::Free { storage, .. } => live = live.saturating_sub(sizes[storage]),
    })?;
    Ok(BaselineFigures {
        peak_bytes: peak,
        compute_ns,
        constant_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a trace from compact lines: `C name bytes` (CONSTANT + MEMORY),
    /// `F op args.. -> results..@time` then `R name bytes alias` per result,
    /// `P dst src` (COPY), `X dst src` (COPY_FROM), `D name` (RELEASE),
    /// `M op args.. #idx @time` (MUTATE).
    fn t(src: &str) -> Trace {
        let mut ins = Vec::new();
        for line in src.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let w: Vec<&str> = line.split_whitespace().collect();
            let s = |x: &str| x.to_string();
            match w[0] {
                "C" => {
                    ins.push(Instruction::Constant { name: s(w[1]) });
                    ins.push(Instruction::Memory {
                        name: s(w[1]),
                        bytes: w[2].parse().unwrap(),
                    });
                }
                "F" => {
                    let arrow = w.iter().position(|x| *x == "->").unwrap();
                    let (time, results) = w[arrow + 1..].split_last().unwrap();
                    ins.push(Instruction::Call {
                        op: s(w[1]),
                        args: w[2..arrow].iter().map(|x| s(x)).collect(),
                        results: results.iter().map(|x| s(x)).collect(),
                        time_ns: time.trim_start_matches('@').parse().unwrap(),
                    });
                }
                "R" => {
                    ins.push(Instruction::Memory {
                        name: s(w[1]),
                        bytes: w[2].parse().unwrap(),
                    });
                    ins.push(Instruction::Alias {
                        name: s(w[1]),
                        alias: w[3].parse().unwrap(),
                    });
                }
                "P" => ins.push(Instruction::Copy {
                    dst: s(w[1]),
                    src: s(w[2]),
                }),
                "X" => ins.push(Instruction::CopyFrom {
                    dst: s(w[1]),
                    src: s(w[2]),
                }),
                "D" => ins.push(Instruction::Release { name: s(w[1]) }),
                "M" => {
                    let hash = w.iter().position(|x| x.starts_with('#')).unwrap();
                    ins.push(Instruction::Mutate {
                        name: s(w[1]),
                        args: w[2..hash].iter().map(|x| s(x)).collect(),
                        mutate: vec![w[hash][1..].parse().unwrap()],
                        time_ns: w[hash + 1].trim_start_matches('@').parse().unwrap(),
                    });
                }
                other => panic!("bad test line {other}"),
            }
        }
        Trace {
            name: "t".into(),
            instructions: ins,
        }
    }

    fn lives(src: &str) -> Vec<(u64, usize, Option<usize>, bool)> {
        storage_lifetimes(&t(src))
            .unwrap()
            .into_iter()
            .map(|l| (l.bytes, l.alloc_at, l.free_at, l.constant))
            .collect()
    }

    #[test]
    fn constant_then_call_then_release() {
        // 0,1: C w; 2: CALL; 3,4: R a; 5: D a; 6: D w
        let l = lives("C w 100\nF relu w -> a @5\nR a 40 -1\nD a\nD w");
        assert_eq!(l, vec![(100, 1, Some(6), true), (40, 4, Some(5), false)]);
        let b = baseline(&t("C w 100\nF relu w -> a @5\nR a 40 -1\nD a\nD w")).unwrap();
        assert_eq!(
            b,
            BaselineFigures {
                peak_bytes: 140,
                compute_ns: 5,
                constant_bytes: 100
            }
        );
    }

    #[test]
    fn a_view_keeps_its_storage_alive() {
        // The view v of a shares a's storage; releasing a does not free it.
        let src = "C w 8\nF op w -> a @1\nR a 64 -1\nF view a -> v @1\nR v 32 0\nD a\nD v";
        // indices: 0,1 C; 2 F; 3,4 R a; 5 F; 6,7 R v; 8 D a; 9 D v
        assert_eq!(
            lives(src),
            vec![(8, 1, None, true), (64, 4, Some(9), false)]
        );
        // The view's MEMORY adds no bytes.
        assert_eq!(baseline(&t(src)).unwrap().peak_bytes, 72);
    }

    #[test]
    fn copy_adds_a_reference() {
        let src = "C w 8\nP w2 w\nD w\nD w2";
        // 0,1 C; 2 P; 3 D w; 4 D w2
        assert_eq!(lives(src), vec![(8, 1, Some(4), true)]);
    }

    #[test]
    fn copy_from_rebinds_and_drops_the_old_tensor() {
        // p is a parameter, u an update; p := u frees p's old storage.
        let src = "C p 100\nF op p -> u @1\nR u 100 -1\nX p u\nD u\nD p";
        // 0,1 C; 2 F; 3,4 R u; 5 X; 6 D u; 7 D p
        assert_eq!(
            lives(src),
            vec![(100, 1, Some(5), true), (100, 4, Some(7), false)]
        );
        // Rebinding to a tensor on the same storage frees nothing.
        let src = "C p 100\nP q p\nX q p\nD p\nD q";
        assert_eq!(lives(src), vec![(100, 1, Some(5), true)]);
    }

    #[test]
    fn mutate_allocates_nothing_and_counts_time() {
        let src = "C w 8\nF op w -> a @10\nR a 16 -1\nM add_ a w #0 @7\nD a";
        let b = baseline(&t(src)).unwrap();
        assert_eq!((b.peak_bytes, b.compute_ns), (24, 17));
    }

    #[test]
    fn multiple_results_with_mixed_aliases() {
        let src =
            "C x 30\nF split x -> a b c @2\nR a 10 0\nR b 10 0\nR c 10 -1\nD x\nD a\nD b\nD c";
        // 0,1 C; 2 F; 3,4 a; 5,6 b; 7,8 c; 9 D x; 10 D a; 11 D b; 12 D c
        assert_eq!(
            lives(src),
            vec![(30, 1, Some(11), true), (10, 8, Some(12), false)]
        );
    }

    #[test]
    fn events_are_in_order() {
        let e = storage_events(&t("C w 8\nD w")).unwrap();
        assert_eq!(
            e,
            vec![
                StorageEvent::Alloc {
                    at: 1,
                    storage: 0,
                    bytes: 8,
                    constant: true
                },
                StorageEvent::Free { at: 2, storage: 0 }
            ]
        );
    }

    #[test]
    fn a_view_of_a_dead_storage_is_rejected() {
        let src = "C w 8\nF view w -> v @1\nD w\nR v 8 0";
        assert!(matches!(
            storage_lifetimes(&t(src)),
            Err(TraceError::Invalid { line: 6, .. })
        ));
    }
}
