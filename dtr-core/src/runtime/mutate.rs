//! In-place ops ([`Runtime::mutate`]): a mutation makes a new *version* of
//! each mutated storage, which takes over its slot and tensors, while the old
//! version stays as an evicted record its readers can still be replayed from
//! (or, where it cannot be recomputed, the new value is copied on write).

use std::sync::Arc;

use super::Runtime;
use crate::error::{Error, Result};
use crate::graph::{OpRec, Residency};
use crate::ids::{StorageId, TensorId};
use crate::memory::Slot;
use crate::op::OpHandle;
use crate::record::Call;

impl<V> Runtime<V> {
    /// Run an in-place op: `op` computes new values for the inputs listed in
    /// `mutated` (one value each, in that order) from all inputs. Every tensor on a
    /// mutated storage sees the new value.
    ///
    /// The mutated storage keeps its memory (no allocation): the new value becomes a
    /// new *version* record that takes over the slot and the tensors, produced by
    /// `op` from the old version, which stays as an evicted record so readers of
    /// the old value can still be replayed. When the old version cannot be
    /// recomputed (external data, non-recomputable op) and compute paths still read
    /// it, the new value gets a fresh allocation instead (copy on write) — or,
    /// without a budget, those readers are detached.
    pub fn mutate(
        &mut self,
        op: Arc<dyn OpHandle<V>>,
        inputs: &[TensorId],
        mutated: &[usize],
        cost_ns: u64,
    ) -> Result<()> {
        let r = self.mutate_inner(op, inputs, mutated, cost_ns);
        self.track(r)
    }

    fn mutate_inner(
        &mut self,
        op: Arc<dyn OpHandle<V>>,
        inputs: &[TensorId],
        mutated: &[usize],
        cost_ns: u64,
    ) -> Result<()> {
        let mut in_storages = Vec::with_capacity(inputs.len());
        for &t in inputs {
            in_storages.push(self.tensor(t)?.storage);
        }
        self.note(
            Call::Mutate {
                name: op.name(),
                inputs,
                mutated,
                recomputable: op.recomputable(),
                cost_ns,
            },
            &in_storages,
        );
        let mut targets: Vec<StorageId> = Vec::new();
        for &k in mutated {
            let s = *in_storages.get(k).ok_or(Error::BadViewIndex {
                output: 0,
                input: k,
                inputs: inputs.len(),
            })?;
            if !targets.contains(&s) {
                targets.push(s);
            }
        }
        let mut unique = in_storages.clone();
        self.creation_order(&mut unique);
        if self.unbounded() {
            for &t in &targets {
                if !self.graph.st(t).recomputable && !self.graph.st(t).users.is_empty() {
                    self.detach_users(t)?;
                }
            }
        }
        // Copy on write where the old version must stay readable and resident.
        // Decided before the hold (which changes no storage's recomputability
        // or readers), so that a hold that fails counts the copies in the op's
        // working set: they are resident beside its inputs while it runs.
        let mut cow = Vec::new();
        for &t in &targets {
            let r = self.graph.st(t);
            let need_copy = !r.recomputable && !r.users.is_empty();
            cow.push(need_copy);
        }
        let cow_sizes: Vec<u64> = (targets.iter().zip(&cow))
            .filter(|(_, &c)| c)
            .map(|(&t, _)| self.graph.st(t).bytes)
            .collect();
        self.hold(&unique)
            .map_err(|e| self.name_op_working_set(e, &op, &unique, &cow_sizes))?;
        let mut slots: Vec<Option<Slot>> = Vec::new();
        let mut failed = None;
        match self.place_all(&cow_sizes) {
            Ok(placed) => {
                let mut placed = placed.into_iter();
                slots.extend(cow.iter().map(|&c| if c { placed.next() } else { None }));
            }
            Err(e) => failed = Some(e),
        }
        let values = if failed.is_none() {
            match self.compute_retrying(&op, &in_storages, 0) {
                Ok(v) if v.len() == targets.len() => Some(v),
                Ok(v) => {
                    failed = Some(Error::OutputCount {
                        op: op.name().to_string(),
                        got: v.len(),
                        expected: targets.len(),
                    });
                    None
                }
                Err(e) => {
                    failed = Some(e);
                    None
                }
            }
        } else {
            None
        };
        let now = self.graph.clock + cost_ns as f64;
        let (Some(values), None) = (values, failed.as_ref()) else {
            let e = failed.unwrap_or_else(|| Error::Internal("mutate failed".into()));
            let e = self.name_op_working_set(e, &op, &unique, &cow_sizes);
            self.free_slots(slots.into_iter().flatten().collect());
            for &s in &unique {
                self.unpin_storage(s, true);
            }
            return Err(e);
        };
        self.graph.clock = now;
        self.stats.compute_ns += cost_ns as f64;
        self.graph.note_op_cost(cost_ns as f64, false);
        let recomputable_op = op.recomputable();
        let rec = OpRec {
            inputs: in_storages.clone(),
            unique_inputs: Vec::new(),
            outputs: Vec::with_capacity(targets.len()),
            live_outputs: targets.len() as u32,
            cost: cost_ns as f64,
        };
        let id = self.register_op(rec, op);
        let mut all_recomputable = true;
        for (k, (value, slot)) in values.into_iter().zip(slots).enumerate() {
            let old = targets[k];
            let old_rec = self.graph.st(old);
            let recomputable = recomputable_op && old_rec.recomputable;
            all_recomputable &= recomputable;
            let bytes = old_rec.bytes;
            let slot = match slot {
                Some(slot) => slot,
                None => {
                    // Take over the old version's slot: it becomes an evicted record.
                    self.drop_clean_copy(old);
                    let r = self.graph.st_mut(old);
                    let slot = r
                        .slot
                        .take()
                        .ok_or_else(|| Error::Internal("mutated storage not resident".into()))?;
                    r.residency = Residency::Evicted;
                    self.values[old.0 as usize] = None;
                    self.stats.live_bytes -= bytes;
                    if self.memory.has_addresses() {
                        self.unmap_ptr(&slot);
                    }
                    self.graph.dsu_on_evict(old);
                    slot
                }
            };
            let new = self.new_storage(
                bytes,
                Some(slot),
                Some(id),
                k as u32,
                recomputable,
                cost_ns as f64,
            );
            self.values[new.0 as usize] = Some(value);
            self.graph.ops[id.0].outputs.push(Some(new));
            // Move the tensors (and their handles) to the new version.
            let tensors = std::mem::take(&mut self.graph.st_mut(old).tensors);
            let handles = std::mem::replace(&mut self.graph.st_mut(old).handles, 0);
            for &ti in &tensors {
                self.tensors[ti].storage = new;
            }
            let nr = self.graph.st_mut(new);
            nr.tensors = tensors;
            nr.handles = handles;
            nr.last_used = now;
            self.graph.st_mut(old).released = true;
        }
        if all_recomputable {
            self.graph.ops[id.0].unique_inputs = unique.clone();
            for &s in &unique {
                self.graph.st_mut(s).users.push(id);
            }
        } else {
            // Not replayable: it reads nothing as far as regeneration goes.
            self.graph.ops[id.0].inputs.clear();
        }
        for &s in &unique {
            if self.graph.st(s).is_resident() {
                self.graph.st_mut(s).last_used = now;
            }
            self.unpin_storage(s, true);
        }
        let news: Vec<StorageId> = self.graph.ops[id.0]
            .outputs
            .iter()
            .flatten()
            .copied()
            .collect();
        for s in news {
            self.graph.offer(s);
        }
        // Old versions nobody reads any more go for real.
        for &t in &targets {
            if self.graph.storages.get(t.0).is_some_and(|r| r.deletable()) {
                self.delete_cascade(t)?;
            }
        }
        Ok(())
    }
}
