//! Union-find over evicted storages (h_DTR^eq's e* approximation, MegEngine's
//! `DsuNode`): each evicted storage gets a node holding its recompute cost; evicting
//! a storage merges its node with the components of its evicted neighbours, so a
//! root's `cost` is the summed cost of an evicted component. Rematerializing a
//! storage subtracts its cost from its component and detaches it (a fresh node is
//! made at its next eviction), since union-find cannot split.

/// The forest. Node indices are `u32`; nodes are never freed (one per eviction).
#[derive(Debug, Default, Clone)]
pub struct UnionFind {
    /// `parent[i] == i` for a root.
    parent: Vec<u32>,
    /// Component size (roots only), for union by size.
    size: Vec<u32>,
    /// Summed cost in ns of the component (roots only); may drift slightly below the
    /// true sum after subtractions, so readers clamp it (as MegEngine does).
    cost: Vec<f64>,
    /// Evicted storages in the component now (roots only): `size` less those
    /// rematerialized since.
    members: Vec<u32>,
}

impl UnionFind {
    /// A singleton node with `cost`.
    pub fn make(&mut self, cost: f64) -> u32 {
        let i = self.parent.len() as u32;
        self.parent.push(i);
        self.size.push(1);
        self.cost.push(cost);
        self.members.push(1);
        i
    }

    /// The root of `x` (path halving; no recursion).
    #[inline]
    pub fn find(&mut self, mut x: u32) -> u32 {
        while self.parent[x as usize] != x {
            let p = self.parent[x as usize];
            let gp = self.parent[p as usize];
            self.parent[x as usize] = gp;
            x = gp;
        }
        x
    }

    /// Merge the components of `a` and `b`; returns the new root.
    pub fn union(&mut self, a: u32, b: u32) -> u32 {
        let (mut ra, mut rb) = (self.find(a), self.find(b));
        if ra == rb {
            return ra;
        }
        if self.size[ra as usize] < self.size[rb as usize] {
            std::mem::swap(&mut ra, &mut rb);
        }
        self.parent[rb as usize] = ra;
        self.size[ra as usize] += self.size[rb as usize];
        self.cost[ra as usize] += self.cost[rb as usize];
        self.members[ra as usize] += self.members[rb as usize];
        ra
    }

    /// The summed cost of `x`'s component and the evicted storages in it now
    /// (an over-count where a member rematerialized in the middle split it:
    /// union-find cannot split).
    #[inline]
    pub fn component(&mut self, x: u32) -> (f64, u32) {
        let r = self.find(x) as usize;
        (self.cost[r], self.members[r])
    }

    /// The summed cost of `x`'s component.
    #[inline]
    pub fn component_cost(&mut self, x: u32) -> f64 {
        let r = self.find(x);
        self.cost[r as usize]
    }

    /// Remove a member of `cost` from `x`'s component (it was rematerialized).
    pub fn subtract(&mut self, x: u32, cost: f64) {
        let r = self.find(x) as usize;
        self.cost[r] = (self.cost[r] - cost).max(0.0);
        self.members[r] = self.members[r].saturating_sub(1);
    }

    /// Number of nodes ever made.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// True when no node was made.
    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_costs_of_components() {
        let mut u = UnionFind::default();
        let a = u.make(1.0);
        let b = u.make(2.0);
        let c = u.make(4.0);
        u.union(a, b);
        assert_eq!(u.component_cost(a), 3.0);
        assert_eq!(u.component_cost(c), 4.0);
        u.union(b, c);
        assert_eq!(u.component_cost(a), 7.0);
        assert_eq!(u.component(a), (7.0, 3));
        u.subtract(b, 2.0);
        assert_eq!(u.component_cost(c), 5.0);
        assert_eq!(u.component(c), (5.0, 2));
        assert_eq!(u.find(a), u.find(c));
    }

    #[test]
    fn long_chains_do_not_recurse() {
        let mut u = UnionFind::default();
        let first = u.make(1.0);
        let mut prev = first;
        for _ in 0..200_000 {
            let n = u.make(1.0);
            // Link the old root under the new node to build a deep tree.
            let r = u.find(prev);
            u.parent[r as usize] = n;
            u.cost[n as usize] += u.cost[r as usize];
            prev = n;
        }
        assert_eq!(u.component_cost(first), 200_001.0);
    }
}
