//! Unit and property tests of the planners, the lower bound and the verifier.

use proptest::prelude::*;

use super::*;

fn all_plans(requests: &[Request]) -> Vec<(Algorithm, Plan)> {
    Algorithm::ALL
        .into_iter()
        .map(|a| (a, plan(requests, a).unwrap()))
        .collect()
}

#[test]
fn empty_input() {
    for (_, p) in all_plans(&[]) {
        assert_eq!(
            p,
            Plan {
                offsets: vec![],
                arena_bytes: 0,
                max_live_bytes: 0
            }
        );
        verify(&[], &p).unwrap();
    }
}

#[test]
fn disjoint_lifetimes_share_memory() {
    let r = [
        Request::new(100, 0, 1),
        Request::new(100, 1, 2),
        Request::new(60, 2, 3),
    ];
    for (a, p) in all_plans(&r) {
        verify(&r, &p).unwrap();
        assert_eq!(p.arena_bytes, 100, "{a}");
        assert_eq!(p.max_live_bytes, 100);
    }
}

#[test]
fn compaction_lowers_a_chunk_placed_too_high() {
    // B could share A's bytes (their lifetimes are disjoint) but sits above them.
    let r = [Request::new(100, 0, 2), Request::new(100, 2, 4)];
    let p = Plan {
        offsets: vec![0, 100],
        arena_bytes: 200,
        max_live_bytes: 100,
    };
    verify(&r, &p).unwrap();
    let c = compact(&r, &p).unwrap();
    verify(&r, &c).unwrap();
    assert_eq!(c.offsets, vec![0, 0]);
    assert_eq!(c.arena_bytes, 100);
}

#[test]
fn compaction_returns_a_plan_it_cannot_improve_unchanged() {
    let r = [Request::new(100, 0, 2), Request::new(50, 1, 4)];
    let p = plan(&r, Algorithm::GreedyBySize).unwrap();
    assert_eq!(compact(&r, &p).unwrap(), p);
}

#[test]
fn compaction_refuses_a_plan_of_other_requests() {
    let r = [Request::new(100, 0, 2), Request::new(50, 1, 4)];
    let wrong = Plan {
        offsets: vec![0],
        arena_bytes: 100,
        max_live_bytes: 150,
    };
    let e = compact(&r, &wrong).unwrap_err();
    assert_eq!(
        e,
        PlanError::PlanLengthMismatch {
            offsets: 1,
            requests: 2
        }
    );
    assert!(e.to_string().contains("1 offsets for 2 requests"), "{e}");
    assert_eq!(
        compact_within(&r, &wrong, 50).unwrap_err(),
        PlanError::PlanLengthMismatch {
            offsets: 1,
            requests: 2
        }
    );
}

#[test]
fn compaction_leaves_inputs_past_its_pair_limit_unchanged() {
    // 6 000 requests all alive together: 18 M pairs, past the limit of 2^24.
    // Spread with gaps, they would compact to half the arena.
    let r: Vec<Request> = (0..6000).map(|_| Request::new(512, 0, 1)).collect();
    let p = Plan {
        offsets: (0..6000).map(|i| i * 1024).collect(),
        arena_bytes: 6000 * 1024,
        max_live_bytes: 6000 * 512,
    };
    verify(&r, &p).unwrap();
    assert_eq!(compact(&r, &p).unwrap(), p);
    // Below the limit the same shape compacts.
    let (r, p) = (
        &r[..3000],
        Plan {
            offsets: p.offsets[..3000].to_vec(),
            arena_bytes: 3000 * 1024,
            max_live_bytes: 3000 * 512,
        },
    );
    let c = compact(r, &p).unwrap();
    verify(r, &c).unwrap();
    assert_eq!(c.arena_bytes, 3000 * 512);
}

/// A plateau like an eviction schedule's: long-lived requests near the peak
/// with short ones cutting across them (deterministic pseudo-random sizes and
/// lifetimes). Compaction must lower every constructive planner's arena here.
#[test]
fn compaction_lowers_plateau_plans() {
    let r = plateau(400, 0x9e37_79b9_7f4a_7c15);
    for a in [Algorithm::GreedyBySize, Algorithm::SeedSim] {
        let p = plan(&r, a).unwrap();
        let c = compact(&r, &p).unwrap();
        verify(&r, &c).unwrap();
        assert!(
            c.arena_bytes < p.arena_bytes,
            "{a}: {} not below {}",
            c.arena_bytes,
            p.arena_bytes
        );
        eprintln!(
            "{a}: {:.2} % over max-live, compacted {:.2} %",
            p.over_lower_bound_pct(),
            c.over_lower_bound_pct()
        );
    }
}

#[test]
fn greedy_takes_the_smallest_fitting_gap() {
    let r = [
        Request::new(100, 0, 10), // A at 0
        Request::new(60, 0, 5),   // B at 100
        Request::new(40, 0, 10),  // C at 160
        Request::new(30, 0, 5),   // D at 200
        Request::new(28, 0, 10),  // E at 230
        // From t = 5 the gaps among A, C, E are [100, 160) (60 B) and
        // [200, 230) (30 B): F takes the smaller one.
        Request::new(25, 5, 10),
    ];
    let p = plan(&r, Algorithm::GreedyBySize).unwrap();
    verify(&r, &p).unwrap();
    assert_eq!(p.offsets, vec![0, 100, 160, 200, 230, 200]);
    assert_eq!(p.arena_bytes, 258);
}

#[test]
fn best_fit_is_online() {
    // Best fit puts A at 0 and B at 10; after A frees, C (20 B) does not fit in A's
    // 10-byte hole and goes on top: 40 B, where a planner needs 30.
    let r = [
        Request::new(10, 0, 1),
        Request::new(10, 0, 3),
        Request::new(20, 1, 3),
    ];
    let bf = plan(&r, Algorithm::BestFit).unwrap();
    verify(&r, &bf).unwrap();
    assert_eq!(bf.arena_bytes, 40);
    let g = plan(&r, Algorithm::GreedyBySize).unwrap();
    assert_eq!(g.arena_bytes, 30);
}

#[test]
fn seed_sim_growth_in_the_middle_is_resolved_by_the_topology() {
    // A [0,10) stays; B frees a 10-byte hole after A; C sits after the hole; D (15 B)
    // fits no hole, so the largest free block (B's hole) grows and pushes C up.
    let r = [
        Request::new(10, 0, 10), // A
        Request::new(10, 0, 2),  // B
        Request::new(10, 0, 10), // C
        Request::new(15, 3, 10), // D
    ];
    let p = plan(&r, Algorithm::SeedSim).unwrap();
    verify(&r, &p).unwrap();
    assert_eq!(p.max_live_bytes, 35);
    assert_eq!(p.arena_bytes, 35);
}

#[test]
fn zero_sized_and_never_alive_requests() {
    let r = [
        Request::new(0, 0, 5),
        Request::new(100, 3, 3), // never alive
        Request::new(8, 1, 2),
    ];
    for (a, p) in all_plans(&r) {
        verify(&r, &p).unwrap();
        assert_eq!(p.arena_bytes, 8, "{a}");
        assert_eq!(p.max_live_bytes, 8);
    }
}

#[test]
fn an_overwrite_chain_is_placed_inside_its_root() {
    // x: 100 B during [0, 2); y writes 40 B at offset 0 of x from t = 1 and lives
    // on to t = 6; z writes 10 B at offset 5 of y during [4, 8).
    let r = [
        Request::new(100, 0, 2),
        Request::new(40, 1, 6).overwriting(0, 0),
        Request::new(10, 4, 8).overwriting(1, 5),
        Request::new(60, 2, 8), // fits beside y once x has ended
    ];
    for (a, p) in all_plans(&r) {
        verify(&r, &p).unwrap();
        assert_eq!(p.offsets[1], p.offsets[0], "{a}");
        assert_eq!(p.offsets[2], p.offsets[1] + 5, "{a}");
    }
    assert_eq!(max_live_bytes(&r), 100);
    // Greedy moves the chain as a group and reaches the bound.
    let g = plan(&r, Algorithm::GreedyBySize).unwrap();
    assert_eq!(g.arena_bytes, 100);
}

#[test]
fn bad_requests_are_typed_errors() {
    let e = |r: &[Request]| plan(r, Algorithm::GreedyBySize).unwrap_err();
    assert!(matches!(
        e(&[Request::new(1, 5, 4)]),
        PlanError::EndBeforeStart {
            request: 0,
            start: 5,
            end: 4
        }
    ));
    assert!(matches!(
        e(&[Request::new(1, 0, 4).overwriting(3, 0)]),
        PlanError::OverwriteOutOfRange {
            request: 0,
            of: 3,
            len: 1
        }
    ));
    assert!(matches!(
        e(&[
            Request::new(10, 0, 2),
            Request::new(5, 2, 4).overwriting(0, 0)
        ]),
        PlanError::OverwriteNotOverlapping {
            request: 1,
            of: 0,
            ..
        }
    ));
    assert!(matches!(
        e(&[
            Request::new(10, 1, 3),
            Request::new(5, 0, 4).overwriting(0, 0)
        ]),
        PlanError::OverwriteNotOverlapping {
            request: 1,
            of: 0,
            ..
        }
    ));
    assert!(matches!(
        e(&[
            Request::new(10, 0, 3),
            Request::new(5, 1, 4).overwriting(0, 6)
        ]),
        PlanError::OverwriteExceedsBounds {
            request: 1,
            of: 0,
            offset: 6,
            size: 5,
            of_size: 10
        }
    ));
    assert!(matches!(
        e(&[
            Request::new(10, 0, 3),
            Request::new(5, 1, 4).overwriting(0, u64::MAX)
        ]),
        PlanError::OverwriteExceedsBounds { .. }
    ));
    assert!(matches!(
        e(&[Request::new(10, 0, 3).overwriting(0, 0)]),
        PlanError::OverwriteCycle { request: 0 }
    ));
    assert!(matches!(
        e(&[
            Request::new(10, 0, 3).overwriting(2, 0),
            Request::new(10, 0, 3).overwriting(0, 0),
            Request::new(10, 0, 3).overwriting(1, 0),
        ]),
        PlanError::OverwriteCycle { .. }
    ));
    assert!(matches!(
        e(&[
            Request::new(10, 0, 3),
            Request::new(6, 1, 4).overwriting(0, 0),
            Request::new(6, 1, 4).overwriting(0, 4),
        ]),
        PlanError::ConflictingOverwrites { a: 1, b: 2 }
    ));
    // Siblings that do not overlap in address are fine.
    let ok = [
        Request::new(10, 0, 3),
        Request::new(5, 1, 4).overwriting(0, 0),
        Request::new(5, 1, 4).overwriting(0, 5),
    ];
    for (_, p) in all_plans(&ok) {
        verify(&ok, &p).unwrap();
    }
    // Huge sizes overflow the arena instead of wrapping.
    let huge = [Request::new(u64::MAX, 0, 2), Request::new(u64::MAX, 0, 2)];
    for a in Algorithm::ALL {
        assert_eq!(plan(&huge, a), Err(PlanError::ArenaOverflow), "{a}");
    }
}

#[test]
fn the_verifier_catches_broken_plans() {
    let r = [
        Request::new(10, 0, 3),
        Request::new(10, 1, 4),
        Request::new(4, 2, 4).overwriting(1, 2),
    ];
    let good = plan(&r, Algorithm::GreedyBySize).unwrap();
    verify(&r, &good).unwrap();

    let mut p = good.clone();
    p.offsets[1] = p.offsets[0] + 5;
    p.offsets[2] = p.offsets[1] + 2;
    p.arena_bytes = p.arena_bytes.max(p.offsets[1] + 10);
    assert!(matches!(
        verify(&r, &p),
        Err(PlanViolation::Overlap { a: 0, b: 1, .. })
    ));

    let mut p = good.clone();
    p.arena_bytes -= 1;
    assert!(matches!(
        verify(&r, &p),
        Err(PlanViolation::OutsideArena { .. })
    ));

    let mut p = good.clone();
    p.offsets[2] += 1;
    assert!(matches!(
        verify(&r, &p),
        Err(PlanViolation::OverwriteMisplaced { request: 2, .. })
    ));

    let mut p = good.clone();
    p.offsets.pop();
    assert!(matches!(
        verify(&r, &p),
        Err(PlanViolation::LengthMismatch { .. })
    ));

    let mut p = good.clone();
    p.max_live_bytes += 1;
    assert!(matches!(
        verify(&r, &p),
        Err(PlanViolation::WrongLowerBound { .. })
    ));

    let bad = [Request::new(1, 2, 1)];
    let p = Plan {
        offsets: vec![0],
        arena_bytes: 1,
        max_live_bytes: 0,
    };
    assert!(matches!(
        verify(&bad, &p),
        Err(PlanViolation::InvalidRequests(_))
    ));
}

#[test]
fn algorithm_names_round_trip() {
    for a in Algorithm::ALL {
        assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
        assert_eq!(a.to_string(), a.name());
    }
    assert!("first-fit".parse::<Algorithm>().is_err());
}

#[test]
fn over_lower_bound_pct() {
    let p = Plan {
        offsets: vec![],
        arena_bytes: 1001,
        max_live_bytes: 1000,
    };
    assert!((p.over_lower_bound_pct() - 0.1).abs() < 1e-9);
    let p = Plan {
        offsets: vec![],
        arena_bytes: 0,
        max_live_bytes: 0,
    };
    assert_eq!(p.over_lower_bound_pct(), 0.0);
}

// ---------------------------------------------------------------- properties

/// Brute force on a byte grid: at every time step, the bytes each overwrite tree
/// covers (distinct, relative to its root), summed over trees.
fn brute_max_live(requests: &[Request]) -> u64 {
    let f = forest(requests).unwrap();
    let t_max = requests.iter().map(|r| r.end).max().unwrap_or(0);
    let mut best = 0;
    for t in 0..t_max {
        let mut total = 0u64;
        for root in 0..requests.len() {
            let mut covered = std::collections::BTreeSet::new();
            for &i in &f.members[root] {
                let r = &requests[i];
                if r.start <= t && t < r.end {
                    covered.extend(f.rel[i]..f.rel[i] + r.size);
                }
            }
            total += covered.len() as u64;
        }
        best = best.max(total);
    }
    best
}

/// Brute-force verifier on a byte grid: no byte is held at one time by two
/// requests unless one is an overwrite ancestor of the other.
fn brute_ok(requests: &[Request], p: &Plan) -> bool {
    let t_max = requests.iter().map(|r| r.end).max().unwrap_or(0);
    for t in 0..t_max {
        let mut owner: std::collections::BTreeMap<u64, Vec<usize>> = Default::default();
        for (i, r) in requests.iter().enumerate() {
            if r.start <= t && t < r.end {
                if p.offsets[i] + r.size > p.arena_bytes {
                    return false;
                }
                for b in p.offsets[i]..p.offsets[i] + r.size {
                    owner.entry(b).or_default().push(i);
                }
            }
        }
        for holders in owner.values() {
            for (k, &a) in holders.iter().enumerate() {
                for &b in &holders[k + 1..] {
                    if !Forest::is_ancestor(requests, a, b) && !Forest::is_ancestor(requests, b, a)
                    {
                        return false;
                    }
                }
            }
        }
    }
    requests.iter().enumerate().all(|(i, r)| match r.overwrite {
        Some(o) => p.offsets[i] == p.offsets[o.of] + o.offset,
        None => true,
    })
}

/// Random intervals without overwrites.
fn plain_requests(max_len: usize) -> impl Strategy<Value = Vec<Request>> {
    prop::collection::vec((0u64..64, 0usize..40, 0usize..12), 0..max_len).prop_map(|v| {
        v.into_iter()
            .map(|(size, start, len)| Request::new(size, start, start + len))
            .collect()
    })
}

/// Random intervals where some requests overwrite an earlier one that is alive
/// when they begin. With `chains_only`, every request is overwritten at most once
/// (so the trees are chains and always valid); otherwise siblings may conflict.
fn overwrite_requests(max_len: usize, chains_only: bool) -> impl Strategy<Value = Vec<Request>> {
    let raw = (
        1u64..48,
        0usize..30,
        1usize..10,
        any::<bool>(),
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
    );
    prop::collection::vec(raw, 1..max_len).prop_map(move |v| {
        let mut out: Vec<Request> = Vec::new();
        let mut taken: Vec<bool> = Vec::new();
        for (size, start, len, link, pick, off) in v {
            let mut r = Request::new(size, start, start + len);
            if link {
                let candidates: Vec<usize> = (0..out.len())
                    .filter(|&j| {
                        let p = &out[j];
                        p.start <= start && start < p.end && (!chains_only || !taken[j])
                    })
                    .collect();
                if !candidates.is_empty() {
                    let j = candidates[pick.index(candidates.len())];
                    let psize = out[j].size;
                    let size = 1 + size % psize;
                    let offset = off.index((psize - size + 1) as usize) as u64;
                    r = Request::new(size, start, start + len).overwriting(j, offset);
                    taken[j] = true;
                }
            }
            out.push(r);
            taken.push(false);
        }
        out
    })
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=… for more.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn plain_plans_are_valid(r in plain_requests(40)) {
        let lb = max_live_bytes(&r);
        prop_assert_eq!(lb, brute_max_live(&r));
        for (a, p) in all_plans(&r) {
            prop_assert!(verify(&r, &p).is_ok(), "{a}: {:?}", verify(&r, &p));
            prop_assert!(brute_ok(&r, &p), "{a}");
            prop_assert!(p.arena_bytes >= lb);
            prop_assert_eq!(p.max_live_bytes, lb);
        }
    }

    #[test]
    fn chain_plans_are_valid(r in overwrite_requests(30, true)) {
        let lb = max_live_bytes(&r);
        prop_assert_eq!(lb, brute_max_live(&r));
        for (a, p) in all_plans(&r) {
            prop_assert!(verify(&r, &p).is_ok(), "{a}: {:?}", verify(&r, &p));
            prop_assert!(brute_ok(&r, &p), "{a}");
            prop_assert!(p.arena_bytes >= lb);
        }
    }

    #[test]
    fn tree_plans_are_valid_or_rejected_for_a_real_conflict(r in overwrite_requests(30, false)) {
        match plan(&r, Algorithm::GreedyBySize) {
            Ok(_) => {
                prop_assert_eq!(max_live_bytes(&r), brute_max_live(&r));
                for (a, p) in all_plans(&r) {
                    prop_assert!(verify(&r, &p).is_ok(), "{a}: {:?}", verify(&r, &p));
                    prop_assert!(brute_ok(&r, &p), "{a}");
                }
            }
            Err(PlanError::ConflictingOverwrites { a, b }) => {
                // Place everything at its relative offset: the conflict is real.
                let f = forest_unchecked(&r);
                let (ra, rb) = (&r[a], &r[b]);
                prop_assert_eq!(f.0[a], f.0[b]);
                prop_assert!(ra.overlaps_in_time(rb));
                prop_assert!(f.1[a] < f.1[b] + rb.size && f.1[b] < f.1[a] + ra.size);
                prop_assert!(!Forest::is_ancestor(&r, a, b) && !Forest::is_ancestor(&r, b, a));
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// Moving one request of a valid plan: the verifier agrees with brute force.
    #[test]
    fn verifier_agrees_with_brute_force(
        r in overwrite_requests(12, true),
        victim in any::<prop::sample::Index>(),
        to in 0u64..120,
    ) {
        let mut p = plan(&r, Algorithm::GreedyBySize).unwrap();
        let v = victim.index(r.len());
        p.offsets[v] = to;
        p.arena_bytes = p.arena_bytes.max(to + r[v].size);
        prop_assert_eq!(verify(&r, &p).is_ok(), brute_ok(&r, &p));
    }

    /// Compaction keeps every plan valid and never raises its arena.
    #[test]
    fn compacted_plans_are_valid_and_never_larger(
        plain in plain_requests(40),
        chains in overwrite_requests(30, true),
        trees in overwrite_requests(30, false),
    ) {
        for r in [plain, chains, trees] {
            let Ok(plans) = Algorithm::ALL.into_iter().map(|a| plan(&r, a).map(|p| (a, p))).collect::<Result<Vec<_>, _>>() else {
                continue; // a real overwrite conflict: nothing to compact
            };
            for (a, p) in plans {
                let c = compact(&r, &p).unwrap();
                prop_assert!(verify(&r, &c).is_ok(), "{a}: {:?}", verify(&r, &c));
                prop_assert!(brute_ok(&r, &c), "{a}");
                prop_assert!(c.arena_bytes <= p.arena_bytes, "{a}: {} > {}", c.arena_bytes, p.arena_bytes);
                prop_assert_eq!(c.max_live_bytes, p.max_live_bytes);
            }
        }
    }

    /// Arbitrary (possibly invalid) requests never panic.
    #[test]
    fn arbitrary_requests_never_panic(
        v in prop::collection::vec((any::<u64>(), 0usize..20, 0usize..20, prop::option::of((0usize..12, any::<u64>()))), 0..12)
    ) {
        let r: Vec<Request> = v.into_iter().map(|(size, start, end, o)| Request {
            size, start, end, overwrite: o.map(|(of, offset)| Overwrite { of, offset }),
        }).collect();
        let _ = max_live_bytes(&r);
        for a in Algorithm::ALL {
            if let Ok(p) = plan(&r, a) {
                prop_assert!(verify(&r, &p).is_ok());
            }
        }
    }
}

/// Roots and relative offsets without the conflict check.
fn forest_unchecked(r: &[Request]) -> (Vec<usize>, Vec<u64>) {
    let mut root = vec![0; r.len()];
    let mut rel = vec![0; r.len()];
    for i in 0..r.len() {
        let (mut x, mut off) = (i, 0);
        while let Some(o) = r[x].overwrite {
            off += o.offset;
            x = o.of;
        }
        root[i] = x;
        rel[i] = off;
    }
    (root, rel)
}
