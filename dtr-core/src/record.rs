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
    /// Bytes of each resident storage, in the order their oldest live tensor
    /// was made (a mutation, which renews a storage's version, does not move
    /// it), storages without a live tensor last.
    pub storages: Vec<u64>,
    /// Each live tensor, in its storage's order (tensors whose storage is not
    /// resident last), then in the order the tensors were made: the position
    /// of its storage in [`Boundary::storages`] (`None`: its storage is not
    /// resident) and its handle count.
    pub tensors: Vec<(Option<u32>, u32)>,
}

impl Boundary {
    /// Bytes resident at the boundary.
    pub fn resident_bytes(&self) -> u64 {
        self.storages.iter().sum()
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
}
