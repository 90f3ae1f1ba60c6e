//! [`Runtime::check_invariants`]: every record against every counter and
//! index that summarises it.

use ahash::AHashMap;

use super::Runtime;
use crate::error::{Error, Result};
use crate::graph::{Residency, NONE};
use crate::ids::{OpId, StorageId};

impl<V> Runtime<V> {
    /// Walk every record and check the invariants (tests call it after each step).
    pub fn check_invariants(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Internal(m));
        let mut live = 0u64;
        let mut cand_bytes = 0u64;
        let mut host = 0u64;
        for (i, r) in self.graph.storages.iter() {
            let s = StorageId(i);
            let has_value = self.values[i as usize].is_some();
            let has_copy = (self.host.as_ref())
                .and_then(|t| t.copies.get(i as usize))
                .is_some_and(Option::is_some);
            let keep_clean = self.host.as_ref().is_some_and(|t| t.keep_clean);
            let copy_ok = match r.residency {
                Residency::Swapped => has_copy,
                Residency::Resident => !has_copy || keep_clean,
                Residency::Evicted => !has_copy,
            };
            if !copy_ok || r.host_copy != has_copy {
                return bad(format!(
                    "{s:?}: residency {:?}, host copy {has_copy}, flag {}",
                    r.residency, r.host_copy
                ));
            }
            if has_copy {
                host += r.bytes;
            }
            if r.is_resident() != r.slot.is_some() || r.is_resident() != has_value {
                return bad(format!(
                    "{s:?}: residency {:?}, slot {}, value {has_value}",
                    r.residency,
                    r.slot.is_some()
                ));
            }
            if r.is_resident() {
                live += r.bytes;
            }
            if r.holds != 0 {
                return bad(format!("{s:?}: {} holds outside a call", r.holds));
            }
            let should = self.graph.eligible(s);
            if should != (r.cand_pos != NONE) {
                return bad(format!(
                    "{s:?}: eligible {should} but cand_pos {}",
                    r.cand_pos
                ));
            }
            if r.cand_pos != NONE {
                cand_bytes += r.bytes;
                if self.graph.candidates.get(r.cand_pos as usize) != Some(&s) {
                    return bad(format!("{s:?}: candidate position mismatch"));
                }
                let h = self.graph.hot[r.cand_pos as usize];
                let cost = self.graph.price(s, r.cost);
                if h.bytes != r.bytes || h.cost != cost || h.last_used != r.last_used {
                    return bad(format!("{s:?}: stale hot fields {h:?}"));
                }
            }
            if r.released && r.handles != 0 {
                return bad(format!("{s:?}: released with {} handles", r.handles));
            }
            if r.residency == Residency::Evicted && r.dsu == NONE {
                return bad(format!("{s:?}: evicted without a union-find node"));
            }
            for u in &r.users {
                match self.graph.ops.get(u.0) {
                    Some(o) if o.unique_inputs.contains(&s) => {}
                    _ => return bad(format!("{s:?}: user {u:?} does not read it")),
                }
            }
            if let Some(op) = r.producer {
                match self.graph.ops.get(op.0) {
                    Some(o) if o.outputs.get(r.output_index as usize) == Some(&Some(s)) => {}
                    _ => return bad(format!("{s:?}: producer {op:?} does not list it")),
                }
            }
        }
        if live != self.stats.live_bytes {
            return bad(format!(
                "live bytes {live} != counter {}",
                self.stats.live_bytes
            ));
        }
        if host != self.stats.host_bytes {
            return bad(format!(
                "host bytes {host} != counter {}",
                self.stats.host_bytes
            ));
        }
        if cand_bytes != self.graph.candidate_bytes {
            return bad(format!(
                "candidate bytes {cand_bytes} != counter {}",
                self.graph.candidate_bytes
            ));
        }
        let mut handles: AHashMap<u32, u32> = AHashMap::new();
        for (_, t) in self.tensors.iter() {
            *handles.entry(t.storage.0).or_default() += t.refs;
        }
        for (i, r) in self.graph.storages.iter() {
            if handles.get(&i).copied().unwrap_or(0) != r.handles {
                return bad(format!(
                    "storage {i}: handle count {} != recount",
                    r.handles
                ));
            }
        }
        for (i, o) in self.graph.ops.iter() {
            for s in &o.unique_inputs {
                match self.graph.storages.get(s.0) {
                    Some(r) if r.users.contains(&OpId(i)) => {}
                    _ => return bad(format!("op {i}: input {s:?} does not list it as user")),
                }
            }
            if o.outputs.iter().flatten().count() as u32 != o.live_outputs {
                return bad(format!("op {i}: live output count"));
            }
        }
        if !self.by_ptr_stale && self.by_ptr != self.derived_by_ptr() {
            return bad(format!(
                "by_ptr holds {} entries, the resident slots {}",
                self.by_ptr.len(),
                self.derived_by_ptr().len()
            ));
        }
        // Blocks never overlap, whatever the model keeps them in (the arena's
        // map or its planned live flags), nor do the resident storages' slots.
        self.memory.check_blocks().map_err(Error::Internal)?;
        if self.memory.has_addresses() {
            let mut slots: Vec<(u64, u64)> = (self.graph.storages.iter())
                .filter_map(|(_, r)| r.slot.as_ref())
                .filter(|slot| slot.size > 0)
                .map(|slot| (slot.ptr, slot.size))
                .collect();
            slots.sort_unstable();
            if let Some(w) = slots.windows(2).find(|w| w[0].0 + w[0].1 > w[1].0) {
                return bad(format!("slots {:?} and {:?} overlap", w[0], w[1]));
            }
        }
        Ok(())
    }
}
