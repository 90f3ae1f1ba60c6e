//! The physical budget's floor is the working set, not PyTorch's segment sizes:
//! a model of any size trains in the default (physical) mode at its logical
//! floor plus a stated margin (512 B per resident storage: the arena's
//! rounding), and an impossible budget names its true cause.

use remat_dtr::{
    BudgetMode, DtrConfig, Error, ImpossibleCause, OutputSpec, PolicyKind, Runtime, TensorId,
};

mod common;
use common::{mix, op};

/// A small MLP-shaped training step: parameters (never evicted), a forward
/// chain whose activations the backward pass reads in reverse, and gradients.
/// Returns a checksum of every gradient, read back at the end.
fn train_step(rt: &mut Runtime<u64>, sizes: &[u64]) -> Result<u64, Error> {
    let params: Vec<TensorId> = (0..sizes.len() as u64)
        .map(|k| rt.put(k * 31 + 7, 600 + 40 * k))
        .collect::<Result<_, _>>()?;
    let mut acts = vec![rt.put(1, 2000)?];
    for (k, &bytes) in sizes.iter().enumerate() {
        let x = *acts.last().unwrap();
        let y = rt.apply(
            op(k as u64, 1),
            &[x, params[k]],
            &[OutputSpec::fresh(bytes)],
            10,
        )?[0];
        acts.push(y);
    }
    let mut grad = acts.pop().unwrap();
    let mut grads = Vec::new();
    for k in (0..sizes.len()).rev() {
        let a = acts[k];
        // The parameter's gradient and the gradient of the activation.
        let outs = [
            OutputSpec::fresh(600 + 40 * k as u64),
            OutputSpec::fresh(rt.bytes(a)?),
        ];
        let g = rt.apply(op(1000 + k as u64, 2), &[grad, a, params[k]], &outs, 20)?;
        grads.push(g[0]);
        rt.release(grad)?;
        grad = g[1];
    }
    let mut sum = 0u64;
    for g in grads {
        sum = mix(sum, *rt.access(g)?);
    }
    Ok(sum)
}

fn runtime(mode: BudgetMode, budget: Option<u64>) -> Runtime<u64> {
    let mut c = DtrConfig::default()
        .with_budget_mode(mode)
        .with_policy(PolicyKind::Remat)
        .with_sampling(false);
    if let Some(b) = budget {
        c = c.with_budget(b);
    }
    Runtime::new(c).unwrap()
}

fn feasible(mode: BudgetMode, budget: u64, sizes: &[u64], expect: u64) -> bool {
    let mut rt = runtime(mode, Some(budget));
    match train_step(&mut rt, sizes) {
        Ok(sum) => {
            assert_eq!(
                sum, expect,
                "{mode:?} at {budget} B: values stay bit-identical"
            );
            rt.check_invariants().unwrap();
            assert!(rt.memory_usage().peak_reserved <= budget || mode == BudgetMode::Logical);
            true
        }
        Err(Error::ImpossibleBudget(b)) => {
            assert_ne!(b.cause, ImpossibleCause::Fragmentation, "{b}");
            false
        }
        Err(e) => panic!("{mode:?} at {budget} B: {e}"),
    }
}

/// The smallest logical budget in `[lo, hi]` that trains (bisection).
fn logical_floor(sizes: &[u64], expect: u64) -> u64 {
    let (mut lo, mut hi) = (1u64, 64 << 20);
    assert!(feasible(BudgetMode::Logical, hi, sizes, expect));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if feasible(BudgetMode::Logical, mid, sizes, expect) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

#[test]
fn small_models_train_physically_at_their_logical_floor_plus_the_margin() {
    // Activation sizes that are not multiples of 512 B, from 1.5 KiB to 3 MiB:
    // the 1–10 MiB ones need a 20 MiB segment under PyTorch's rules, and the
    // small ones 2 MiB segments, whatever the budget.
    let models: [&[u64]; 4] = [
        &[1_500, 2_900, 700, 3_100],
        &[300_000, 1_500_000, 2_900_000, 800_000, 3_000_000],
        &[24, 24, 24, 24, 24, 24],
        &[5_000, 1_100_000, 70_000, 2_100_000, 9_000, 1_048_577],
    ];
    for sizes in models {
        let expect = train_step(&mut runtime(BudgetMode::Logical, None), sizes).unwrap();
        let floor = logical_floor(sizes, expect);
        // Every storage the step can hold at once, rounded up to 512 B.
        let storages = 4 * sizes.len() as u64 + 2;
        let margin = 512 * storages;
        assert!(
            feasible(BudgetMode::Physical, floor + margin, sizes, expect),
            "{sizes:?}: logical floor {floor} B, physical at floor + {margin} B must train"
        );
    }
}

#[test]
fn a_tiny_op_fits_a_tiny_physical_budget() {
    // Under PyTorch's rules a 24-byte op needs a 2 MiB segment; the budget here
    // is 4 KiB, and the working set is a few hundred bytes.
    let mut rt = runtime(BudgetMode::Physical, Some(4 << 10));
    let mut t = rt.put(1, 24).unwrap();
    for k in 0..50 {
        t = rt
            .apply(op(k, 1), &[t], &[OutputSpec::fresh(24)], 1)
            .unwrap()[0];
    }
    // Each op's one output is `mix(mix(seed, input), 0)` (see `common::op`).
    let mut expect = 1;
    for k in 0..50 {
        expect = mix(mix(k, expect), 0);
    }
    assert_eq!(*rt.access(t).unwrap(), expect);
    assert_eq!(rt.stats().arena_fallbacks, 1);
    assert!(rt.memory_usage().peak_reserved <= 4 << 10);
    rt.check_invariants().unwrap();
}

#[test]
fn an_impossible_budget_names_its_true_cause() {
    // The request alone.
    let mut rt = runtime(BudgetMode::Physical, Some(1 << 20));
    let x = rt.put(1, 100).unwrap();
    match rt.apply(op(1, 1), &[x], &[OutputSpec::fresh(2 << 20)], 1) {
        Err(Error::ImpossibleBudget(b)) => {
            assert_eq!(b.cause, ImpossibleCause::RequestExceedsBudget, "{b}");
            assert!(b
                .to_string()
                .contains("the request alone exceeds the budget"));
        }
        other => panic!("{other:?}"),
    }
    // Parameters that fill the budget: the working set, not fragmentation,
    // although nothing but them is resident.
    let mut rt = runtime(BudgetMode::Physical, Some(1 << 20));
    let p = rt.put(1, 900 << 10).unwrap();
    let x = rt.put(2, 10 << 10).unwrap();
    match rt.apply(op(1, 1), &[x], &[OutputSpec::fresh(200 << 10)], 1) {
        Err(Error::ImpossibleBudget(b)) => {
            assert_eq!(b.cause, ImpossibleCause::WorkingSetExceedsBudget, "{b}");
            assert_eq!(b.not_recomputable, 910 << 10);
            assert_eq!(b.op, None, "the op's own 210 KiB fit");
        }
        other => panic!("{other:?}"),
    }
    // The op reads the parameter: its own inputs and outputs exceed the
    // budget, and the error names it.
    match rt.apply(op(1, 1), &[p], &[OutputSpec::fresh(200 << 10)], 1) {
        Err(Error::ImpossibleBudget(b)) => {
            assert_eq!(b.cause, ImpossibleCause::OpWorkingSetExceedsBudget, "{b}");
            let w = b.op.as_ref().expect("the op named");
            assert_eq!(
                (w.name.as_str(), w.input_bytes, w.output_bytes),
                ("op1", 900 << 10, 200 << 10)
            );
            assert!(
                b.to_string().contains("op `op1` alone needs 1126400 B"),
                "{b}"
            );
        }
        other => panic!("{other:?}"),
    }
    // 3 500 B of inputs and a 550 B request fit 4 KiB as requested, but not in
    // 512 B blocks (3 584 + 1 024 B): the rounding is named.
    let mut small = runtime(BudgetMode::Physical, Some(4 << 10));
    let ins: Vec<_> = (0..7).map(|k| small.put(k, 500).unwrap()).collect();
    match small.apply(op(3, 1), &ins, &[OutputSpec::fresh(550)], 1) {
        Err(Error::ImpossibleBudget(b)) => {
            assert_eq!(b.cause, ImpossibleCause::Rounding, "{b}");
            assert!(b.to_string().contains("rounded"), "{b}");
        }
        other => panic!("{other:?}"),
    }
    // The device stays usable after the failure.
    let y = rt.apply(op(2, 1), &[p], &[OutputSpec::fresh(100 << 10)], 1);
    assert!(y.is_ok(), "{y:?}");
    rt.check_invariants().unwrap();
}

#[test]
fn an_in_place_op_whose_copy_on_write_cannot_fit_is_named_even_when_its_inputs_fail() {
    // `g` (evicted, from the evicted `c`) and the parameter `p` are the
    // inputs of an in-place update of `p`. `p` has a reader, so the update
    // copies on write: p, g and the copy (1 200 KiB) must be resident at once
    // under a 1 MiB budget. The failure comes first while regenerating `g`
    // (p held, c and g placed), and it must still name the update, whose own
    // working set no lever can fit, with the copy counted as its output.
    let mut rt = runtime(BudgetMode::Physical, Some(1 << 20));
    let x = rt.put(1, 1 << 10).unwrap();
    let c = rt
        .apply(op(1, 1), &[x], &[OutputSpec::fresh(400 << 10)], 1)
        .unwrap()[0];
    let g = rt
        .apply(op(2, 1), &[c], &[OutputSpec::fresh(400 << 10)], 1)
        .unwrap()[0];
    assert!(rt.evict(g).unwrap() && rt.evict(c).unwrap());
    let p = rt.put(2, 400 << 10).unwrap();
    let reader = rt
        .apply(op(3, 1), &[p], &[OutputSpec::fresh(4 << 10)], 1)
        .unwrap()[0];
    match rt.mutate(op(4, 1), &[p, g], &[0], 1) {
        Err(Error::ImpossibleBudget(b)) => {
            assert_eq!(b.cause, ImpossibleCause::OpWorkingSetExceedsBudget, "{b}");
            let w = b.op.as_ref().expect("the update named");
            assert_eq!(
                (w.name.as_str(), w.input_bytes, w.output_bytes),
                ("op4", 800 << 10, 400 << 10)
            );
        }
        other => panic!("{other:?}"),
    }
    // Nothing was lost: with the parameter and its reader released, `g`
    // regenerates bit-identically.
    rt.release(reader).unwrap();
    rt.release(p).unwrap();
    let expect = mix(mix(2, mix(mix(1, 1), 0)), 0);
    assert_eq!(*rt.access(g).unwrap(), expect);
    rt.check_invariants().unwrap();
}

/// A 4 KiB physical budget (so the runtime lays its storages out in a
/// compacting arena) holding `x` and four 512 B outputs with 512 B holes
/// between them, each op costing `cost_ns`; then an op asks for 1 KiB.
fn fragmented(move_bandwidth: Option<f64>, cost_ns: u64) -> (Runtime<u64>, TensorId, TensorId) {
    let config = DtrConfig::default()
        .with_budget(4 << 10)
        .with_budget_mode(BudgetMode::Physical)
        .with_policy(PolicyKind::Remat)
        .with_sampling(false)
        .with_move_bandwidth(move_bandwidth);
    let mut rt = Runtime::new(config).unwrap();
    let x = rt.put(1, 512).unwrap();
    let ys: Vec<TensorId> = (0..6)
        .map(|k| {
            rt.apply(op(10 + k, 1), &[x], &[OutputSpec::fresh(512)], cost_ns)
                .unwrap()[0]
        })
        .collect();
    assert_eq!(rt.stats().arena_fallbacks, 1, "{:?}", rt.stats());
    for k in [0, 2, 4] {
        rt.release(ys[k]).unwrap();
    }
    let big = rt
        .apply(op(20, 1), &[x], &[OutputSpec::fresh(1024)], cost_ns)
        .unwrap()[0];
    (rt, ys[5], big)
}

#[test]
fn defragmenting_moves_are_charged_and_taken_only_where_cheaper_than_evicting() {
    let y5 = mix(mix(15, 1), 0);
    // Free moves (the adapters' arenas are placement models): one 512 B
    // block slides down, nothing is evicted, nothing is charged.
    let (mut rt, y, big) = fragmented(None, 1_000_000);
    let s = rt.stats().clone();
    assert_eq!((s.defrag_bytes, s.evictions), (512, 0), "{s:?}");
    assert_eq!(s.defrag_ns, 0.0);
    assert_eq!(*rt.access(y).unwrap(), y5);
    assert_eq!(*rt.access(big).unwrap(), mix(mix(20, 1), 0));
    // At 1 GB/s (1 B/ns) the move costs 2 × 512 ns, far below recomputing a
    // 1 ms op: taken, and charged in the time model.
    let (mut rt, y, _) = fragmented(Some(1.0), 1_000_000);
    let s = rt.stats().clone();
    assert_eq!((s.defrag_bytes, s.evictions), (512, 0), "{s:?}");
    assert_eq!(s.defrag_ns, 1024.0);
    assert_eq!(s.wall_ns(), s.compute_ns + s.remat_ns + 1024.0);
    assert_eq!(*rt.access(y).unwrap(), y5);
    // With 1 ns ops, evicting is cheaper than the 1 024 ns move: nothing
    // moves, and the value evicted comes back bit-identical.
    let (mut rt, y, _) = fragmented(Some(1.0), 1);
    let s = rt.stats().clone();
    assert_eq!(s.defrag_bytes, 0, "{s:?}");
    assert!(s.evictions > 0, "{s:?}");
    assert_eq!(*rt.access(y).unwrap(), y5);
    rt.check_invariants().unwrap();
}
