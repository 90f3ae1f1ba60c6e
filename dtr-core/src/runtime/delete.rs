//! Deleting: fake deletes (free the data, keep the record while a compute
//! path may replay it), real deletes that cascade to inputs nothing reads any
//! more, detaching readers, and cutting storages from their history
//! ([`Runtime::make_root`]).

use super::Runtime;
use crate::error::{Error, Result};
use crate::ids::{OpId, StorageId, TensorId};
use crate::record::Call;

impl<V> Runtime<V> {
    /// A released storage with no pins: delete it when nothing reads it, else
    /// (when `eager`) fake-delete it.
    pub(super) fn settle_released(&mut self, s: StorageId, eager: bool) -> Result<()> {
        let r = self.graph.st(s);
        if eager && !r.users.is_empty() && !r.recomputable && self.unbounded() {
            // Nothing is ever evicted without a budget: readers need not be
            // replayable, so detach them and free the data now.
            self.detach_users(s)?;
        }
        let Some(r) = self.graph.storages.get(s.0) else {
            return Ok(()); // deleted by the cascade of a detached reader
        };
        if r.users.is_empty() {
            self.delete_cascade(s)
        } else if eager && r.is_resident() && r.recomputable {
            self.evict_storage(s, true)
        } else {
            self.graph.offer(s);
            Ok(())
        }
    }

    /// MegEngine's `detach_users`, without regenerating dead records: every compute
    /// path reading `s` stops reading it; its outputs become non-recomputable. A
    /// live output that is evicted is regenerated first; an evicted output nobody
    /// holds (a fake-deleted record) is detached in turn (work list) and deleted.
    pub(super) fn detach_users(&mut self, s: StorageId) -> Result<()> {
        let mut work = vec![s];
        let mut dead = Vec::new();
        while let Some(x) = work.pop() {
            let Some(xr) = self.graph.storages.get_mut(x.0) else {
                continue;
            };
            let users = std::mem::take(&mut xr.users);
            for op in users {
                let outs: Vec<StorageId> = self.graph.ops[op.0]
                    .outputs
                    .iter()
                    .flatten()
                    .copied()
                    .collect();
                for o in outs {
                    let r = self.graph.st(o);
                    if !r.is_resident() {
                        if r.released {
                            work.push(o);
                            dead.push(o);
                        } else {
                            self.hold(&[o])?;
                            self.unpin_storage(o, true);
                        }
                    }
                    self.graph.withdraw(o);
                    self.graph.st_mut(o).recomputable = false;
                    self.graph.offer(o);
                }
                // The op stays as its outputs' producer record but reads nothing.
                let inputs = std::mem::take(&mut self.graph.ops[op.0].unique_inputs);
                self.graph.ops[op.0].inputs.clear();
                for i in inputs {
                    let Some(ir) = self.graph.storages.get_mut(i.0) else {
                        continue;
                    };
                    ir.forget_user(op);
                    if i != s && ir.deletable() {
                        dead.push(i);
                    }
                }
            }
        }
        for d in dead {
            if d != s {
                self.delete_cascade(d)?;
            }
        }
        Ok(())
    }

    /// Real delete of released storages nothing reads, cascading to inputs.
    pub(super) fn delete_cascade(&mut self, first: StorageId) -> Result<()> {
        let mut work = vec![first];
        while let Some(s) = work.pop() {
            let Some(r) = self.graph.storages.get(s.0) else {
                continue;
            };
            if !r.deletable() {
                continue;
            }
            self.graph.withdraw(s);
            let dead_at = if self.times_frees() {
                self.dead_since(s)
            } else {
                0.0
            };
            let r = self
                .graph
                .storages
                .remove(s.0)
                .ok_or_else(|| Error::Internal("vanished".into()))?;
            self.values[s.0 as usize] = None;
            self.drop_host_copy(s, r.bytes);
            if let Some(slot) = r.slot {
                self.stats.live_bytes -= r.bytes;
                if self.memory.has_addresses() {
                    self.unmap_ptr(&slot);
                }
                self.release_slot(slot, dead_at)?;
            }
            if let Some(op) = r.producer {
                self.drop_output(op, r.output_index, &mut work)?;
            }
        }
        Ok(())
    }

    /// Output `index` of compute path `op` is gone (deleted or made a root). When
    /// it was the last, the path goes too: it stops reading its inputs, and inputs
    /// that are released and read by nothing else are pushed on `dead`.
    pub(super) fn drop_output(
        &mut self,
        op: OpId,
        index: u32,
        dead: &mut Vec<StorageId>,
    ) -> Result<()> {
        let o = &mut self.graph.ops[op.0];
        o.outputs[index as usize] = None;
        o.live_outputs -= 1;
        if o.live_outputs > 0 {
            return Ok(());
        }
        let o = self
            .graph
            .ops
            .remove(op.0)
            .ok_or_else(|| Error::Internal("op vanished".into()))?;
        self.handles[op.0 as usize] = None;
        for i in o.unique_inputs {
            let ir = self.graph.st_mut(i);
            ir.forget_user(op);
            if ir.deletable() {
                dead.push(i);
            }
        }
        Ok(())
    }

    /// Cut `t`'s storage from its history: make it resident (regenerating it if
    /// evicted) and turn it into external data, like a [`Runtime::put`] — never
    /// evicted again. Its compute path forgets it; a path left without outputs is
    /// deleted, and released storages that only it still read are freed (the real
    /// delete cascade). Returns `false` when the storage was external already.
    ///
    /// For tensors that outlive a training step (parameters, optimizer state):
    /// without it their lineage, and the evicted records it keeps, grows with
    /// every step.
    pub fn make_root(&mut self, t: TensorId) -> Result<bool> {
        let s = self.tensor(t)?.storage;
        self.note(Call::MakeRoot(t), &[]);
        self.root_storage(s)
    }

    /// [`Runtime::make_root`] for every tensor of `ts` in one call (a training
    /// step's seal: parameters and optimizer state). Resident storages go first
    /// (rooting them needs no memory and frees the lineage only they kept, which
    /// leaves room to regenerate the rest), then the evicted ones, each group in
    /// the caller's order. One call whatever the residency, so a step's seal
    /// repeats exactly and a plan can be followed through it. Returns how many
    /// storages were cut (not external already).
    pub fn make_roots(&mut self, ts: &[TensorId]) -> Result<usize> {
        let mut storages = Vec::with_capacity(ts.len());
        for &t in ts {
            storages.push(self.tensor(t)?.storage);
        }
        self.note(Call::MakeRoots(ts), &[]);
        let mut order: Vec<(bool, StorageId)> = storages
            .into_iter()
            .map(|s| (!self.graph.st(s).is_resident(), s))
            .collect();
        // Stable: the caller's order within each group.
        order.sort_by_key(|&(evicted, _)| evicted);
        let mut cut = 0;
        for (_, s) in order {
            // A storage named twice is external after its first cut.
            if self.root_storage(s)? {
                cut += 1;
            }
        }
        Ok(cut)
    }

    pub(super) fn root_storage(&mut self, s: StorageId) -> Result<bool> {
        let Some(op) = self.graph.st(s).producer else {
            return Ok(false);
        };
        let held = self.hold(&[s]);
        self.track(held)?;
        let r = self.graph.st_mut(s);
        r.holds -= 1;
        r.pins -= 1;
        r.producer = None;
        r.recomputable = false;
        r.cost = 0.0;
        let index = r.output_index;
        self.graph.withdraw(s);
        // With swap on, a root is a candidate for the host tier (a no-op while
        // it is held by the caller).
        self.graph.offer(s);
        let mut dead = Vec::new();
        self.drop_output(op, index, &mut dead)?;
        for d in dead {
            self.delete_cascade(d)?;
        }
        tracing::trace!(target: "remat_dtr::root", storage = s.0, "make_root");
        Ok(true)
    }
}
