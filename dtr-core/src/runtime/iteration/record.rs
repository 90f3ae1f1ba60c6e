//! The recorder: every public call of an iteration becomes an [`crate::Event`] of its
//! [`Recording`], with the sequence numbers of the storages it reads, and every
//! live tensor has a name ([`Ref`]) the recording uses.
//!
//! While the iteration follows a plan, a call that matches the plan's recording
//! is only counted ([`super::follow`]): the plan's recording stands for it.

use std::sync::Arc;

use super::super::Runtime;
use crate::error::Result;
use crate::graph::NONE;
use crate::ids::{StorageId, TensorId};
use crate::record::{Call, Recording, Ref};

/// Events one recording may hold; a longer iteration is not recorded (and not
/// planned) rather than grow without bound when `end_iteration` is never called.
pub(super) const MAX_EVENTS: usize = 1 << 23;

/// The recorder's state.
#[derive(Default)]
pub(crate) struct Recorder {
    /// The current iteration's recording (`None`: not recording).
    pub recording: Option<Recording>,
    /// Record every iteration, also without a budget
    /// ([`Runtime::record_iterations`]).
    pub record_always: bool,
    /// The last iteration recorded whole (no failed call), for
    /// [`Runtime::min_feasible_budget`].
    pub last_recording: Option<Arc<Recording>>,
    /// Names of the live tensors, while recording or following a plan.
    pub refs: RefTable,
    /// Tensors created this iteration.
    pub new_tensors: u32,
    /// A call failed this iteration: its recording is not a program to repeat.
    pub broken: bool,
}

/// Names of tensors by handle: a table indexed by the tensor's slab index
/// (a hash map's behaviour for the runtime's use: at most one generation of
/// an index is named at a time, since a tensor's name goes when the tensor
/// does), without hashing on the planned path.
#[derive(Debug, Default)]
pub(crate) struct RefTable {
    slots: Vec<Option<(u32, Ref)>>,
    len: usize,
}

impl RefTable {
    /// Name `t` (replacing the name of the same handle).
    pub fn insert(&mut self, t: TensorId, r: Ref) {
        let i = t.index as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, None);
        }
        if self.slots[i].is_none() {
            self.len += 1;
        }
        self.slots[i] = Some((t.generation, r));
    }

    /// The name of `t`, if named (an older handle at the same index is not).
    pub fn get(&self, t: TensorId) -> Option<Ref> {
        match self.slots.get(t.index as usize) {
            Some(&Some((g, r))) if g == t.generation => Some(r),
            _ => None,
        }
    }

    /// Forget the name of `t` (and of nothing else).
    pub fn remove(&mut self, t: TensorId) {
        if let Some(slot) = self.slots.get_mut(t.index as usize) {
            if slot.is_some_and(|(g, _)| g == t.generation) {
                *slot = None;
                self.len -= 1;
            }
        }
    }

    /// Whether no tensor is named.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forget every name.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.len = 0;
    }
}

impl<V> Runtime<V> {
    pub(in crate::runtime) fn with_recording(mut self) -> Self {
        self.iter.enabled = self.config.plan_ahead
            && self.config.budget.is_some()
            && self.config.threshold.is_none();
        if self.iter.enabled {
            self.iter.recorder.recording = Some(Recording::default());
        }
        self
    }

    /// Record every iteration from the next boundary on (from now if nothing
    /// has run yet), also without a budget, so that
    /// [`Runtime::min_feasible_budget`] can answer for a run that measures a
    /// model unbudgeted. With a budget and plan-ahead on, iterations are
    /// recorded anyway.
    pub fn record_iterations(&mut self) {
        self.iter.recorder.record_always = true;
        if self.iter.recorder.recording.is_none() && self.iter.epoch == 0 && self.iter.pos == 0 {
            self.iter.recorder.recording = Some(Recording::default());
        }
    }

    pub(super) fn tracking(&self) -> bool {
        self.iter.recorder.recording.is_some() || self.iter.follower.following
    }

    /// The recording's name for `t`.
    pub(in crate::runtime) fn ref_of(&self, t: TensorId) -> Ref {
        // Every live tensor is named while tracking; `Prefix(MAX)` never matches.
        self.iter
            .recorder
            .refs
            .get(t)
            .unwrap_or(Ref::Prefix(u32::MAX))
    }

    /// A public call starts: record it and check it against the plan. `reads`
    /// are the storages it reads directly.
    pub(in crate::runtime) fn note(&mut self, call: Call<'_>, reads: &[StorageId]) {
        self.graph.pos = self.iter.pos;
        self.iter.pos += 1;
        if !self.tracking() {
            return;
        }
        if self.iter.follower.following {
            let pos = self.graph.pos as usize;
            let same = (self.iter.follower.plan.as_ref())
                .and_then(|p| p.recording.events.get(pos))
                .is_some_and(|e| call.same_program(e, |t| self.ref_of(t)));
            if same {
                // Nothing to record or allocate: the plan's recording holds it.
                self.iter.follower.matched += 1;
                return;
            }
            self.diverge("the call differs from the recorded iteration");
        }
        let ev = call.to_event(|t| self.ref_of(t));
        let epoch = self.iter.epoch;
        let seqs: Vec<u32> = reads
            .iter()
            .filter_map(|&s| self.graph.storages.get(s.0))
            .filter(|r| r.epoch == epoch && r.seq != NONE)
            .map(|r| r.seq)
            .collect();
        if let Some(rec) = &mut self.iter.recorder.recording {
            if rec.events.len() >= MAX_EVENTS {
                self.iter.recorder.recording = None;
            } else {
                rec.events.push(ev);
                rec.reads.push(seqs);
            }
        }
    }

    /// Mark the iteration's recording unusable when a public call failed.
    pub(in crate::runtime) fn track<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.iter.recorder.broken = true;
        }
        r
    }

    pub(in crate::runtime) fn on_new_tensor(&mut self, t: TensorId) {
        if self.tracking() {
            self.iter
                .recorder
                .refs
                .insert(t, Ref::New(self.iter.recorder.new_tensors));
            self.iter.recorder.new_tensors += 1;
        }
    }

    pub(in crate::runtime) fn on_tensor_gone(&mut self, t: TensorId) {
        if !self.iter.recorder.refs.is_empty() {
            self.iter.recorder.refs.remove(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_table_names_handles_like_a_map() {
        let t = |index, generation| TensorId { index, generation };
        let mut refs = RefTable::default();
        assert!(refs.is_empty());
        refs.insert(t(3, 0), Ref::New(0));
        refs.insert(t(0, 1), Ref::Prefix(2));
        assert_eq!(refs.get(t(3, 0)), Some(Ref::New(0)));
        assert_eq!(refs.get(t(0, 1)), Some(Ref::Prefix(2)));
        // Another generation at a named index is not named, and removing it
        // leaves the name of the handle that is.
        assert_eq!(refs.get(t(3, 1)), None);
        refs.remove(t(3, 1));
        assert_eq!(refs.get(t(3, 0)), Some(Ref::New(0)));
        assert_eq!(refs.get(t(9, 0)), None);
        refs.insert(t(3, 0), Ref::New(5));
        assert_eq!(refs.get(t(3, 0)), Some(Ref::New(5)));
        refs.remove(t(3, 0));
        refs.remove(t(3, 0));
        assert_eq!(refs.get(t(3, 0)), None);
        assert!(!refs.is_empty());
        refs.remove(t(0, 1));
        assert!(refs.is_empty());
        refs.insert(t(1, 0), Ref::New(1));
        refs.clear();
        assert!(refs.is_empty());
        assert_eq!(refs.get(t(1, 0)), None);
    }
}
