//! The recorder: what one training iteration did, framework-agnostically.
//!
//! Between two [`crate::Runtime::end_iteration`] calls the runtime appends one
//! [`Event`] per public call (put, apply/record, mutate, access, pin, unpin,
//! retain, release, evict, make_root). Tensors are named by [`Ref`]: the tensors
//! alive at the iteration's start by their position in the [`Boundary`], the ones
//! made during the iteration by creation order. Storages made during the iteration
//! carry a *sequence number* (creation order, mutate versions included), so the
//! same op sequence under the same decisions numbers them identically; that is
//! how a plan names what to evict.
//!
//! A [`Recording`] is all the planner needs to replay the iteration offline (its
//! ops, sizes, views, costs, releases and reads), and all the executor needs to
//! check that the next iteration is the same program (its [`Event`]s without the
//! costs).

use crate::ids::TensorId;
use crate::op::OutputSpec;

/// A tensor as an iteration names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ref {
    /// The `k`-th live tensor at the iteration's start (see [`Boundary::tensors`]).
    Prefix(u32),
    /// The `n`-th tensor created during the iteration.
    New(u32),
}

/// One public runtime call of an iteration. Equality ignores nothing: the
/// executor compares [`Event::same_program`] instead, which ignores costs.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// External data of `bytes` bytes (creates one tensor).
    Put {
        /// Bytes.
        bytes: u64,
    },
    /// An op through `apply` or `record` (creates one tensor per output).
    Apply {
        /// The op handle's name.
        name: String,
        /// Inputs in argument order.
        inputs: Vec<Ref>,
        /// Fresh outputs and views.
        outputs: Vec<OutputSpec>,
        /// Whether the op may be replayed.
        recomputable: bool,
        /// Measured (or given) cost in ns.
        cost_ns: u64,
    },
    /// An in-place op.
    Mutate {
        /// The op handle's name.
        name: String,
        /// Inputs in argument order.
        inputs: Vec<Ref>,
        /// Positions of the mutated inputs.
        mutated: Vec<usize>,
        /// Whether the op may be replayed.
        recomputable: bool,
        /// Cost in ns.
        cost_ns: u64,
    },
    /// A read of the tensor's value.
    Access(Ref),
    /// A pin (kept resident until the matching unpin).
    Pin(Ref),
    /// An unpin.
    Unpin(Ref),
    /// One more handle on the tensor.
    Retain(Ref),
    /// One handle dropped.
    Release(Ref),
    /// An explicit eviction request.
    Evict(Ref),
    /// The tensor's storage was cut from its history.
    MakeRoot(Ref),
    /// Several tensors cut from their history in one call
    /// ([`crate::Runtime::make_roots`]), in the caller's order.
    MakeRoots(Vec<Ref>),
}

impl Event {
    /// Whether `self` and `other` are the same call on the same tensors with the
    /// same shapes (costs are measured and may differ).
    pub fn same_program(&self, other: &Event) -> bool {
        match (self, other) {
            (
                Event::Apply {
                    name: a,
                    inputs: ai,
                    outputs: ao,
                    recomputable: ar,
                    ..
                },
                Event::Apply {
                    name: b,
                    inputs: bi,
                    outputs: bo,
                    recomputable: br,
                    ..
                },
            ) => a == b && ai == bi && ao == bo && ar == br,
            (
                Event::Mutate {
                    name: a,
                    inputs: ai,
                    mutated: am,
                    recomputable: ar,
                    ..
                },
                Event::Mutate {
                    name: b,
                    inputs: bi,
                    mutated: bm,
                    recomputable: br,
                    ..
                },
            ) => a == b && ai == bi && am == bm && ar == br,
            _ => self == other,
        }
    }

    /// Cost of the event's first computation (0 for non-ops).
    pub fn cost_ns(&self) -> u64 {
        match self {
            Event::Apply { cost_ns, .. } | Event::Mutate { cost_ns, .. } => *cost_ns,
            _ => 0,
        }
    }
}

/// Ops (applies and mutates) among `events`.
pub fn op_count(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::Apply { .. } | Event::Mutate { .. }))
        .count()
}

/// A public call as the runtime sees it, borrowing its arguments: compared
/// with a plan's [`Event`] without building one (the planned path allocates
/// nothing per call), turned into an [`Event`] when recorded.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call<'a> {
    Put {
        bytes: u64,
    },
    Apply {
        name: &'a str,
        inputs: &'a [TensorId],
        outputs: &'a [OutputSpec],
        recomputable: bool,
        cost_ns: u64,
    },
    Mutate {
        name: &'a str,
        inputs: &'a [TensorId],
        mutated: &'a [usize],
        recomputable: bool,
        cost_ns: u64,
    },
    Access(TensorId),
    Pin(TensorId),
    Unpin(TensorId),
    Retain(TensorId),
    Release(TensorId),
    Evict(TensorId),
    MakeRoot(TensorId),
    MakeRoots(&'a [TensorId]),
}

impl Call<'_> {
    /// The event this call records, naming tensors with `name`.
    pub(crate) fn to_event(self, name_of: impl Fn(TensorId) -> Ref) -> Event {
        match self {
            Call::Put { bytes } => Event::Put { bytes },
            Call::Apply {
                name,
                inputs,
                outputs,
                recomputable,
                cost_ns,
            } => Event::Apply {
                name: name.to_string(),
                inputs: inputs.iter().map(|&t| name_of(t)).collect(),
                outputs: outputs.to_vec(),
                recomputable,
                cost_ns,
            },
            Call::Mutate {
                name,
                inputs,
                mutated,
                recomputable,
                cost_ns,
            } => Event::Mutate {
                name: name.to_string(),
                inputs: inputs.iter().map(|&t| name_of(t)).collect(),
                mutated: mutated.to_vec(),
                recomputable,
                cost_ns,
            },
            Call::Access(t) => Event::Access(name_of(t)),
            Call::Pin(t) => Event::Pin(name_of(t)),
            Call::Unpin(t) => Event::Unpin(name_of(t)),
            Call::Retain(t) => Event::Retain(name_of(t)),
            Call::Release(t) => Event::Release(name_of(t)),
            Call::Evict(t) => Event::Evict(name_of(t)),
            Call::MakeRoot(t) => Event::MakeRoot(name_of(t)),
            Call::MakeRoots(ts) => Event::MakeRoots(ts.iter().map(|&t| name_of(t)).collect()),
        }
    }

    /// [`Event::same_program`] between this call and `e`, without building an
    /// event.
    pub(crate) fn same_program(&self, e: &Event, name_of: impl Fn(TensorId) -> Ref) -> bool {
        let same_refs = |ts: &[TensorId], rs: &[Ref]| {
            ts.len() == rs.len() && ts.iter().zip(rs).all(|(&t, &r)| name_of(t) == r)
        };
        match (*self, e) {
            (Call::Put { bytes }, Event::Put { bytes: b }) => bytes == *b,
            (
                Call::Apply {
                    name,
                    inputs,
                    outputs,
                    recomputable,
                    ..
                },
                Event::Apply {
                    name: n,
                    inputs: i,
                    outputs: o,
                    recomputable: r,
                    ..
                },
            ) => name == n && recomputable == *r && outputs == o.as_slice() && same_refs(inputs, i),
            (
                Call::Mutate {
                    name,
                    inputs,
                    mutated,
                    recomputable,
                    ..
                },
                Event::Mutate {
                    name: n,
                    inputs: i,
                    mutated: m,
                    recomputable: r,
                    ..
                },
            ) => name == n && recomputable == *r && mutated == m.as_slice() && same_refs(inputs, i),
            (Call::Access(t), Event::Access(r))
            | (Call::Pin(t), Event::Pin(r))
            | (Call::Unpin(t), Event::Unpin(r))
            | (Call::Retain(t), Event::Retain(r))
            | (Call::Release(t), Event::Release(r))
            | (Call::Evict(t), Event::Evict(r))
            | (Call::MakeRoot(t), Event::MakeRoot(r)) => name_of(t) == *r,
            (Call::MakeRoots(ts), Event::MakeRoots(rs)) => same_refs(ts, rs),
            _ => false,
        }
    }
}

/// The live state at an iteration boundary, as sizes only: what the next
/// iteration starts with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Boundary {
    /// Bytes of each storage whose value is live at the boundary: the
    /// resident ones first, then the last [`Boundary::swapped`] ones, which
    /// are in the host tier; each group in the order its oldest live tensor
    /// was made (a mutation, which renews a storage's version, does not move
    /// it), storages without a live tensor last.
    pub storages: Vec<u64>,
    /// Each live tensor, in its storage's order (tensors whose storage is not
    /// resident last), then in the order the tensors were made: the position
    /// of its storage in [`Boundary::storages`] (`None`: its storage is
    /// evicted, so its value is stale) and its handle count.
    pub tensors: Vec<(Option<u32>, u32)>,
    /// How many of [`Boundary::storages`], at its end, are swapped to the
    /// host tier (0 with swap off).
    pub swapped: u32,
}

impl Boundary {
    /// The resident storages (the first of [`Boundary::storages`]).
    pub fn resident(&self) -> &[u64] {
        let n = self.storages.len().saturating_sub(self.swapped as usize);
        &self.storages[..n]
    }

    /// Bytes resident at the boundary.
    pub fn resident_bytes(&self) -> u64 {
        self.resident().iter().sum()
    }
}

/// One recorded iteration.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    /// The state the iteration started from.
    pub start: Boundary,
    /// The calls, in order.
    pub events: Vec<Event>,
    /// For each event, the sequence numbers of the storages it reads directly
    /// (op inputs, accessed and pinned tensors); storages that predate the
    /// iteration have none and are not listed.
    pub reads: Vec<Vec<u32>>,
}

impl Recording {
    /// The same starting state and the same program (calls, names, sizes),
    /// whatever the measured costs.
    pub fn same_program(&self, other: &Recording) -> bool {
        self.start == other.start
            && self.events.len() == other.events.len()
            && self
                .events
                .iter()
                .zip(&other.events)
                .all(|(a, b)| a.same_program(b))
    }

    /// Σ of the events' first-computation costs (ns).
    pub fn compute_ns(&self) -> u64 {
        self.events.iter().map(Event::cost_ns).sum()
    }

    /// Ops (applies and mutates) in the recording.
    pub fn op_count(&self) -> usize {
        op_count(&self.events)
    }
}

/// Why a recording cannot be carried to a boundary
/// ([`Recording::carried_to`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CarryRefusal {
    /// The boundary names a different number of live tensors than were given
    /// names.
    NamesMismatch,
    /// A tensor an op of the iteration made is still live at the boundary:
    /// the next iteration would make it again, so its program differs.
    OpOutputLive,
    /// The iteration read a tensor of its own start that did not live to the
    /// boundary: the next iteration cannot read it.
    StartTensorGone,
    /// A name the recording uses was never made (a malformed recording).
    UnknownName,
}

impl CarryRefusal {
    /// What the refusal means, for reports.
    pub fn reason(self) -> &'static str {
        match self {
            CarryRefusal::NamesMismatch => {
                "the boundary's live tensors and their names differ in number"
            }
            CarryRefusal::OpOutputLive => {
                "an op's output made by the iteration is live at the boundary"
            }
            CarryRefusal::StartTensorGone => {
                "the iteration read a tensor of its start that did not live to the boundary"
            }
            CarryRefusal::UnknownName => "the recording names a tensor it never made",
        }
    }
}

impl std::fmt::Display for CarryRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl Recording {
    /// This recording as the next iteration would run it from `boundary`, the
    /// state the recorded iteration ended in, when what differs between the
    /// recording's start and `boundary` is only external data the iteration
    /// itself put and left live (parameters and inputs a first step loads,
    /// optimizer state it creates). The next iteration finds that data
    /// already there: the carried recording drops the [`Event::Put`]s that
    /// made it and names those tensors by their place in `boundary`, renumbers
    /// the tensors and storages the iteration still makes, and starts from
    /// `boundary`. Whether the next iteration really repeats it is checked call
    /// by call as it runs, as for any plan.
    ///
    /// `names[j]` is the recorded iteration's name of the `j`-th live tensor of
    /// `boundary` ([`Boundary::tensors`]' order).
    ///
    /// Refused ([`CarryRefusal`]) when a tensor an op made is live at the
    /// boundary (the next iteration would make it again), or the iteration read
    /// a tensor of its start that did not live to the boundary.
    pub fn carried_to(
        &self,
        boundary: &Boundary,
        names: &[Ref],
    ) -> Result<Recording, CarryRefusal> {
        use ahash::AHashMap;
        if names.len() != boundary.tensors.len() {
            return Err(CarryRefusal::NamesMismatch);
        }
        let live: AHashMap<Ref, u32> = names
            .iter()
            .enumerate()
            .map(|(j, &r)| (r, j as u32))
            .collect();
        // Symbolic storages, to count the new versions a mutation makes (one
        // per distinct mutated storage): start storages by position, the
        // iteration's by creation.
        let start_storages = self.start.storages.len() as u64;
        let sym_of_prefix = |i: u32| -> u64 {
            match self.start.tensors.get(i as usize) {
                Some(&(Some(p), _)) => p as u64,
                // A tensor whose storage was not resident: a storage of its own.
                _ => u64::MAX / 2 + i as u64,
            }
        };
        let mut sym_of_new: Vec<u64> = Vec::new();
        let mut next_sym = start_storages;
        // Old name of each tensor the iteration made → its carried name.
        let mut new_names: Vec<Ref> = Vec::new();
        let mut made = 0u32; // tensors the carried iteration makes
        let mut seq_map: Vec<Option<u32>> = Vec::new(); // old seq → carried seq
        let mut seqs = 0u32; // storages the carried iteration makes
        let rename = |r: Ref, new_names: &[Ref]| -> Result<Ref, CarryRefusal> {
            match r {
                Ref::Prefix(_) => live
                    .get(&r)
                    .map(|&j| Ref::Prefix(j))
                    .ok_or(CarryRefusal::StartTensorGone),
                Ref::New(n) => new_names
                    .get(n as usize)
                    .copied()
                    .ok_or(CarryRefusal::UnknownName),
            }
        };
        let sym = |r: Ref, sym_of_new: &[u64]| -> Result<u64, CarryRefusal> {
            match r {
                Ref::Prefix(i) => Ok(sym_of_prefix(i)),
                Ref::New(n) => sym_of_new
                    .get(n as usize)
                    .copied()
                    .ok_or(CarryRefusal::UnknownName),
            }
        };
        let mut events = Vec::with_capacity(self.events.len());
        let mut reads = Vec::with_capacity(self.reads.len());
        for (k, e) in self.events.iter().enumerate() {
            let n = new_names.len() as u32;
            let carried = match e {
                Event::Put { .. } => {
                    sym_of_new.push(next_sym);
                    next_sym += 1;
                    if let Some(&j) = live.get(&Ref::New(n)) {
                        // Already there when the next iteration starts.
                        new_names.push(Ref::Prefix(j));
                        seq_map.push(None);
                        None
                    } else {
                        new_names.push(Ref::New(made));
                        made += 1;
                        seq_map.push(Some(seqs));
                        seqs += 1;
                        Some(e.clone())
                    }
                }
                Event::Apply {
                    name,
                    inputs,
                    outputs,
                    recomputable,
                    cost_ns,
                } => {
                    let renamed = inputs
                        .iter()
                        .map(|&r| rename(r, &new_names))
                        .collect::<Result<Vec<_>, _>>()?;
                    for (o, spec) in outputs.iter().enumerate() {
                        if live.contains_key(&Ref::New(n + o as u32)) {
                            return Err(CarryRefusal::OpOutputLive);
                        }
                        let s = match *spec {
                            OutputSpec::Fresh { .. } => {
                                seq_map.push(Some(seqs));
                                seqs += 1;
                                next_sym += 1;
                                next_sym - 1
                            }
                            OutputSpec::View { input } => {
                                let r = *inputs.get(input).ok_or(CarryRefusal::UnknownName)?;
                                sym(r, &sym_of_new)?
                            }
                        };
                        sym_of_new.push(s);
                        new_names.push(Ref::New(made));
                        made += 1;
                    }
                    Some(Event::Apply {
                        name: name.clone(),
                        inputs: renamed,
                        outputs: outputs.clone(),
                        recomputable: *recomputable,
                        cost_ns: *cost_ns,
                    })
                }
                Event::Mutate {
                    name,
                    inputs,
                    mutated,
                    recomputable,
                    cost_ns,
                } => {
                    let mut distinct: Vec<u64> = Vec::new();
                    for &m in mutated {
                        let r = *inputs.get(m).ok_or(CarryRefusal::UnknownName)?;
                        let s = sym(r, &sym_of_new)?;
                        if !distinct.contains(&s) {
                            distinct.push(s);
                            seq_map.push(Some(seqs));
                            seqs += 1;
                        }
                    }
                    Some(Event::Mutate {
                        name: name.clone(),
                        inputs: inputs
                            .iter()
                            .map(|&r| rename(r, &new_names))
                            .collect::<Result<Vec<_>, _>>()?,
                        mutated: mutated.clone(),
                        recomputable: *recomputable,
                        cost_ns: *cost_ns,
                    })
                }
                Event::Access(r) => Some(Event::Access(rename(*r, &new_names)?)),
                Event::Pin(r) => Some(Event::Pin(rename(*r, &new_names)?)),
                Event::Unpin(r) => Some(Event::Unpin(rename(*r, &new_names)?)),
                Event::Retain(r) => Some(Event::Retain(rename(*r, &new_names)?)),
                Event::Release(r) => Some(Event::Release(rename(*r, &new_names)?)),
                Event::Evict(r) => Some(Event::Evict(rename(*r, &new_names)?)),
                Event::MakeRoot(r) => Some(Event::MakeRoot(rename(*r, &new_names)?)),
                Event::MakeRoots(rs) => Some(Event::MakeRoots(
                    rs.iter()
                        .map(|&r| rename(r, &new_names))
                        .collect::<Result<Vec<_>, _>>()?,
                )),
            };
            if let Some(c) = carried {
                events.push(c);
                let read = self.reads.get(k).map_or(&[][..], Vec::as_slice);
                reads.push(
                    read.iter()
                        .filter_map(|&s| seq_map.get(s as usize).copied().flatten())
                        .collect(),
                );
            }
        }
        Ok(Recording {
            start: boundary.clone(),
            events,
            reads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_program_ignores_costs_only() {
        let a = Event::Apply {
            name: "mm".into(),
            inputs: vec![Ref::Prefix(0), Ref::New(1)],
            outputs: vec![OutputSpec::fresh(64)],
            recomputable: true,
            cost_ns: 10,
        };
        let mut b = a.clone();
        if let Event::Apply { cost_ns, .. } = &mut b {
            *cost_ns = 99;
        }
        assert!(a.same_program(&b));
        let mut c = a.clone();
        if let Event::Apply { outputs, .. } = &mut c {
            outputs[0] = OutputSpec::fresh(128);
        }
        assert!(!a.same_program(&c));
        assert!(!a.same_program(&Event::Access(Ref::New(1))));
        assert!(Event::Release(Ref::New(2)).same_program(&Event::Release(Ref::New(2))));
        assert!(!Event::Release(Ref::New(2)).same_program(&Event::Release(Ref::Prefix(2))));
    }

    fn apply(inputs: Vec<Ref>, outputs: Vec<OutputSpec>) -> Event {
        Event::Apply {
            name: "f".into(),
            inputs,
            outputs,
            recomputable: true,
            cost_ns: 10,
        }
    }

    /// A first step: put a weight (New 0) and an input (New 1), compute
    /// (New 2, a view of it New 3), update the weight in place, release the
    /// input and the activations. The weight alone is live at the end.
    fn first_step() -> Recording {
        Recording {
            start: Boundary::default(),
            events: vec![
                Event::Put { bytes: 64 },
                Event::Put { bytes: 32 },
                apply(
                    vec![Ref::New(0), Ref::New(1)],
                    vec![OutputSpec::fresh(16), OutputSpec::view(0)],
                ),
                Event::Mutate {
                    name: "sgd".into(),
                    inputs: vec![Ref::New(0), Ref::New(2), Ref::New(3)],
                    mutated: vec![0],
                    recomputable: false,
                    cost_ns: 5,
                },
                Event::Release(Ref::New(1)),
                Event::Release(Ref::New(2)),
                Event::Release(Ref::New(3)),
            ],
            // Storages by seq: 0 weight, 1 input, 2 output, 3 weight's new version.
            reads: vec![
                vec![],
                vec![],
                vec![0, 1],
                vec![0, 2],
                vec![],
                vec![],
                vec![],
            ],
        }
    }

    #[test]
    fn a_first_step_carries_to_its_end_without_what_it_put_and_kept() {
        let rec = first_step();
        let boundary = Boundary {
            swapped: 0,
            storages: vec![64],
            tensors: vec![(Some(0), 1)],
        };
        let carried = rec.carried_to(&boundary, &[Ref::New(0)]).unwrap();
        assert_eq!(carried.start, boundary);
        assert_eq!(
            carried.events,
            vec![
                // The weight is there already: its put goes, the input stays.
                Event::Put { bytes: 32 },
                apply(
                    vec![Ref::Prefix(0), Ref::New(0)],
                    vec![OutputSpec::fresh(16), OutputSpec::view(0)],
                ),
                Event::Mutate {
                    name: "sgd".into(),
                    inputs: vec![Ref::Prefix(0), Ref::New(1), Ref::New(2)],
                    mutated: vec![0],
                    recomputable: false,
                    cost_ns: 5,
                },
                Event::Release(Ref::New(0)),
                Event::Release(Ref::New(1)),
                Event::Release(Ref::New(2)),
            ]
        );
        // The weight's storage predates the carried iteration; the others
        // are renumbered in creation order.
        assert_eq!(
            carried.reads,
            vec![vec![], vec![0], vec![1], vec![], vec![], vec![]]
        );
        assert_eq!(carried.compute_ns(), rec.compute_ns());
        // Carried to where it already starts, a recording is itself.
        let again = carried.carried_to(&boundary, &[Ref::Prefix(0)]).unwrap();
        assert_eq!(again, carried);
    }

    #[test]
    fn a_mutation_of_two_views_of_one_storage_makes_one_version() {
        let rec = Recording {
            start: Boundary::default(),
            events: vec![
                Event::Put { bytes: 64 },
                apply(vec![Ref::New(0)], vec![OutputSpec::view(0)]),
                Event::Mutate {
                    name: "fill".into(),
                    inputs: vec![Ref::New(0), Ref::New(1)],
                    mutated: vec![0, 1],
                    recomputable: false,
                    cost_ns: 1,
                },
                Event::Release(Ref::New(1)),
                Event::Put { bytes: 8 },
                Event::Access(Ref::New(2)),
                Event::Release(Ref::New(2)),
            ],
            // seq 0: the put; 1: the one new version; 2: the second put.
            reads: vec![vec![], vec![0], vec![0], vec![], vec![], vec![2], vec![]],
        };
        let boundary = Boundary {
            swapped: 0,
            storages: vec![64],
            tensors: vec![(Some(0), 1)],
        };
        let carried = rec.carried_to(&boundary, &[Ref::New(0)]).unwrap();
        // The second put is the carried iteration's seq 1 (after the version).
        assert_eq!(carried.reads[4], vec![1]);
        assert_eq!(carried.events[4], Event::Access(Ref::New(1)));
    }

    #[test]
    fn start_tensors_are_renamed_by_their_place_at_the_boundary() {
        // Starts with two tensors; drops the first, keeps the second, puts and
        // keeps a third: at the boundary the second is first, the put second.
        let rec = Recording {
            start: Boundary {
                swapped: 0,
                storages: vec![8, 16],
                tensors: vec![(Some(0), 1), (Some(1), 1)],
            },
            events: vec![
                Event::Put { bytes: 32 },
                apply(
                    vec![Ref::Prefix(1), Ref::New(0)],
                    vec![OutputSpec::fresh(4)],
                ),
                Event::Release(Ref::New(1)),
                Event::Release(Ref::Prefix(0)),
            ],
            reads: vec![vec![], vec![0], vec![], vec![]],
        };
        let boundary = Boundary {
            swapped: 0,
            storages: vec![16, 32],
            tensors: vec![(Some(0), 1), (Some(1), 1)],
        };
        // Prefix(0) is gone: the step read it (to release it) and did not keep it.
        assert_eq!(
            rec.carried_to(&boundary, &[Ref::Prefix(1), Ref::New(0)]),
            Err(CarryRefusal::StartTensorGone)
        );
        // Without that release, Prefix(1) → Prefix(0) and the put → Prefix(1).
        let mut kept = rec.clone();
        kept.events.pop();
        kept.reads.pop();
        let carried = kept.carried_to(&boundary, &[Ref::Prefix(1), Ref::New(0)]);
        // Prefix(0) is no longer read (as if dropped outside the recording):
        // the recording carries.
        let carried = carried.unwrap();
        assert_eq!(
            carried.events,
            vec![
                apply(
                    vec![Ref::Prefix(0), Ref::Prefix(1)],
                    vec![OutputSpec::fresh(4)]
                ),
                Event::Release(Ref::New(0)),
            ]
        );
        assert_eq!(carried.reads, vec![Vec::<u32>::new(); 2]);
    }

    #[test]
    fn what_cannot_be_carried_is_refused_with_its_reason() {
        let rec = first_step();
        let boundary = Boundary {
            swapped: 0,
            storages: vec![64, 16],
            tensors: vec![(Some(0), 1), (Some(1), 1)],
        };
        // An op's output kept across the boundary: the next step makes it again.
        assert_eq!(
            rec.carried_to(&boundary, &[Ref::New(0), Ref::New(2)]),
            Err(CarryRefusal::OpOutputLive)
        );
        assert_eq!(
            rec.carried_to(&boundary, &[Ref::New(0)]),
            Err(CarryRefusal::NamesMismatch)
        );
        // A start tensor the step read but did not keep.
        let mut later = rec.clone();
        later.start = Boundary {
            swapped: 0,
            storages: vec![8],
            tensors: vec![(Some(0), 1)],
        };
        later.events.push(Event::Access(Ref::Prefix(0)));
        later.reads.push(vec![]);
        let one = Boundary {
            swapped: 0,
            storages: vec![64],
            tensors: vec![(Some(0), 1)],
        };
        assert_eq!(
            later.carried_to(&one, &[Ref::New(0)]),
            Err(CarryRefusal::StartTensorGone)
        );
        assert!(CarryRefusal::OpOutputLive.to_string().contains("output"));
    }
}
