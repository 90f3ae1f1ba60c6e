//! Seed 001 (MegEngine's static memory planner): simulate, then assign offsets.
//!
//! Overwrite trees are resolved to their root: a tree is one chunk of the root's
//! size, alive from the root's start to the last member's end (members sit at
//! fixed offsets inside it). The chunks are then replayed in time order — at each
//! time step the chunks that end are freed before the chunks that start are
//! allocated — over two structures:
//!
//! * an address-ordered list of blocks, each free or held by a chunk, where two
//!   free blocks are never neighbours (a free merges with free neighbours);
//! * a size-ordered set of the free blocks.
//!
//! `alloc(size)`: the smallest free block that fits (split, the remainder stays
//! free after it); if none fits, the largest free block grows to `size`; if
//! there is no free block, a new block is appended at the end.
//!
//! Growing a block in the middle shifts everything after it, so the simulated
//! addresses are not the answer. Instead every allocation records its neighbours:
//! the held block just before it and the held block just after it (MegTaiChi's
//! topology map of relative positions). Each record is a constraint "the right one
//! starts at or after the end of the left one"; the constraints form a DAG (block
//! list order never changes among blocks alive together), and every chunk gets the
//! lowest offset they allow — the longest path to it. Two chunks alive at the same
//! time are linked by a chain of such records, so they never overlap, and free
//! space that the simulation left between chunks collapses.

use std::collections::{BTreeSet, VecDeque};

use super::{offsets_from_roots, unit_events, Forest, PlanError, Request};

const NIL: usize = usize::MAX;

struct Block {
    size: u64,
    /// The chunk holding it, or `NIL` when free.
    owner: usize,
    prev: usize,
    next: usize,
}

struct Sim {
    blocks: Vec<Block>,
    tail: usize,
    /// Free blocks by (size, block id).
    free: BTreeSet<(u64, usize)>,
    /// Constraints `(left chunk, right chunk)`.
    edges: Vec<(usize, usize)>,
}

impl Sim {
    fn new_block(&mut self, size: u64, owner: usize, prev: usize, next: usize) -> usize {
        self.blocks.push(Block {
            size,
            owner,
            prev,
            next,
        });
        let id = self.blocks.len() - 1;
        if prev != NIL {
            self.blocks[prev].next = id;
        }
        if next != NIL {
            self.blocks[next].prev = id;
        } else {
            self.tail = id;
        }
        id
    }

    fn unlink(&mut self, b: usize) {
        let (prev, next) = (self.blocks[b].prev, self.blocks[b].next);
        if prev != NIL {
            self.blocks[prev].next = next;
        }
        if next != NIL {
            self.blocks[next].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn alloc(&mut self, chunk: usize, size: u64) -> usize {
        let b = if let Some(&(bs, b)) = self.free.range((size, 0)..).next() {
            self.free.remove(&(bs, b));
            if bs > size {
                let next = self.blocks[b].next;
                let rest = self.new_block(bs - size, NIL, b, next);
                self.free.insert((bs - size, rest));
            }
            b
        } else if let Some(&(bs, b)) = self.free.last() {
            // Nothing fits: grow the largest free block.
            self.free.remove(&(bs, b));
            b
        } else {
            let tail = self.tail;
            self.new_block(size, NIL, tail, NIL)
        };
        self.blocks[b].size = size;
        self.blocks[b].owner = chunk;
        // Record the held neighbours on both sides.
        let mut l = self.blocks[b].prev;
        while l != NIL && self.blocks[l].owner == NIL {
            l = self.blocks[l].prev;
        }
        if l != NIL {
            self.edges.push((self.blocks[l].owner, chunk));
        }
        let mut r = self.blocks[b].next;
        while r != NIL && self.blocks[r].owner == NIL {
            r = self.blocks[r].next;
        }
        if r != NIL {
            self.edges.push((chunk, self.blocks[r].owner));
        }
        b
    }

    fn release(&mut self, b: usize) {
        self.blocks[b].owner = NIL;
        let prev = self.blocks[b].prev;
        if prev != NIL && self.blocks[prev].owner == NIL {
            self.free.remove(&(self.blocks[prev].size, prev));
            // Saturating: free-block sizes only steer the simulation; offsets come
            // from the neighbour constraints, computed with checked arithmetic.
            self.blocks[b].size = self.blocks[b].size.saturating_add(self.blocks[prev].size);
            self.unlink(prev);
        }
        let next = self.blocks[b].next;
        if next != NIL && self.blocks[next].owner == NIL {
            self.free.remove(&(self.blocks[next].size, next));
            self.blocks[b].size = self.blocks[b].size.saturating_add(self.blocks[next].size);
            self.unlink(next);
        }
        self.free.insert((self.blocks[b].size, b));
    }
}

pub(super) fn plan(requests: &[Request], f: &Forest) -> Result<Vec<u64>, PlanError> {
    let (chunks, events) = unit_events(requests, f);
    let mut sim = Sim {
        blocks: Vec::with_capacity(2 * chunks.len()),
        tail: NIL,
        free: BTreeSet::new(),
        edges: Vec::with_capacity(2 * chunks.len()),
    };
    let mut block_of = vec![NIL; chunks.len()];
    for (_, kind, c) in events {
        if kind == 1 {
            block_of[c] = sim.alloc(c, chunks[c].size);
        } else {
            sim.release(block_of[c]);
        }
    }

    // Lowest offsets the recorded neighbour constraints allow: longest paths.
    let m = chunks.len();
    let mut out_edges: Vec<Vec<usize>> = vec![Vec::new(); m];
    let mut indegree = vec![0usize; m];
    for &(a, b) in &sim.edges {
        out_edges[a].push(b);
        indegree[b] += 1;
    }
    let mut offset = vec![0u64; m];
    let mut queue: VecDeque<usize> = (0..m).filter(|&c| indegree[c] == 0).collect();
    let mut done = 0;
    while let Some(a) = queue.pop_front() {
        done += 1;
        let end = offset[a]
            .checked_add(chunks[a].size)
            .ok_or(PlanError::ArenaOverflow)?;
        for &b in &out_edges[a] {
            offset[b] = offset[b].max(end);
            indegree[b] -= 1;
            if indegree[b] == 0 {
                queue.push_back(b);
            }
        }
    }
    if done < m {
        // Unreachable: the list order of blocks alive together never changes, so
        // the constraints cannot form a cycle. Stay correct regardless.
        return super::greedy::plan(requests, f);
    }
    let mut root_offset = vec![0u64; requests.len()];
    for (c, u) in chunks.iter().enumerate() {
        root_offset[u.root] = offset[c];
    }
    offsets_from_roots(f, &root_offset)
}
