//! Online best fit: the baseline a planner must beat.
//!
//! The sequence is served as it comes, with no knowledge of the future, from one
//! growing arena: the smallest free block that fits (lowest address among equal
//! sizes), split from its front; when nothing fits, a free block at the top of the
//! arena is extended, or the request goes on top. Frees merge with free
//! neighbours. Overwrite trees are one chunk of the root's size, alive from the
//! root's start to the last member's end.

use std::collections::{BTreeMap, BTreeSet};

use super::{offsets_from_roots, unit_events, Forest, PlanError, Request};

pub(super) fn plan(requests: &[Request], f: &Forest) -> Result<Vec<u64>, PlanError> {
    let (chunks, events) = unit_events(requests, f);
    let mut by_addr: BTreeMap<u64, u64> = BTreeMap::new();
    let mut by_size: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut top: u64 = 0;
    let mut root_offset = vec![0u64; requests.len()];
    for (_, kind, c) in events {
        let size = chunks[c].size;
        let root = chunks[c].root;
        if kind == 1 {
            let addr = if let Some(&(bs, a)) = by_size.range((size, 0)..).next() {
                by_size.remove(&(bs, a));
                by_addr.remove(&a);
                if bs > size {
                    by_addr.insert(a + size, bs - size);
                    by_size.insert((bs - size, a + size));
                }
                a
            } else if let Some((&a, &bs)) =
                by_addr.last_key_value().filter(|(&a, &bs)| a + bs == top)
            {
                // Extend the free block at the top of the arena.
                by_addr.remove(&a);
                by_size.remove(&(bs, a));
                top = a.checked_add(size).ok_or(PlanError::ArenaOverflow)?;
                a
            } else {
                let a = top;
                top = top.checked_add(size).ok_or(PlanError::ArenaOverflow)?;
                a
            };
            root_offset[root] = addr;
        } else {
            let (mut a, mut s) = (root_offset[root], size);
            if let Some((&pa, &ps)) = by_addr.range(..a).next_back() {
                if pa + ps == a {
                    by_addr.remove(&pa);
                    by_size.remove(&(ps, pa));
                    (a, s) = (pa, ps + s);
                }
            }
            if let Some(&ns) = by_addr.get(&(a + s)) {
                by_addr.remove(&(a + s));
                by_size.remove(&(ns, a + s));
                s += ns;
            }
            by_addr.insert(a, s);
            by_size.insert((s, a));
        }
    }
    offsets_from_roots(f, &root_offset)
}
