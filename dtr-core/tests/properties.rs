//! Bit-identical rematerialization: on random DAGs where every value is a
//! deterministic function of its op and inputs, under random budgets, every value
//! read equals the value first computed — for every policy, in both budget modes.
//! Invariants are checked after every step.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use remat_dtr::{
    BudgetMode, DtrConfig, Error, FnOp, OpError, OpHandle, OutputSpec, PolicyKind, Runtime,
    TensorId,
};

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.rotate_left(23) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn op(seed: u64, outs: usize) -> Arc<dyn OpHandle<u64>> {
    Arc::new(FnOp::new(format!("op{seed}"), move |ins: &[&u64]| {
        let h = ins.iter().fold(seed, |h, v| mix(h, **v));
        Ok::<_, OpError>((0..outs as u64).map(|k| mix(h, k)).collect())
    }))
}

#[derive(Debug, Clone)]
enum Step {
    /// Op over `args` (indices into live tensors, modulo), `outs` fresh sizes, maybe a view.
    Apply {
        args: Vec<usize>,
        outs: Vec<u64>,
        view: bool,
        cost: u64,
    },
    Access(usize),
    Release(usize),
    Mutate(usize, usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (
            prop::collection::vec(any::<usize>(), 1..4),
            prop::collection::vec(prop_oneof![1u64..4096, 4096u64..(3 << 20)], 1..3),
            any::<bool>(),
            1u64..1000
        )
            .prop_map(|(args, outs, view, cost)| Step::Apply { args, outs, view, cost }),
        3 => any::<usize>().prop_map(Step::Access),
        2 => any::<usize>().prop_map(Step::Release),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Step::Mutate(a, b)),
    ]
}

/// Run `steps`; returns how many values were checked.
fn run(
    policy: PolicyKind,
    mode: BudgetMode,
    budget: u64,
    sampling: bool,
    steps: &[Step],
) -> (usize, u64) {
    let config = DtrConfig::default()
        .with_budget(budget)
        .with_budget_mode(mode)
        .with_policy(policy)
        .with_sampling(sampling)
        .with_seed(budget);
    let mut rt: Runtime<u64> = Runtime::new(config).unwrap();
    let mut live: Vec<TensorId> = Vec::new();
    let mut expect: HashMap<TensorId, u64> = HashMap::new();
    let mut checked = 0;
    for seed in 0..3u64 {
        let t = rt.put(seed * 77, 4096).unwrap();
        expect.insert(t, seed * 77);
        live.push(t);
    }
    for (n, s) in steps.iter().enumerate() {
        let res: Result<(), Error> = (|| {
            match s {
                Step::Apply {
                    args,
                    outs,
                    view,
                    cost,
                } => {
                    if live.is_empty() {
                        return Ok(());
                    }
                    let inputs: Vec<TensorId> = args.iter().map(|a| live[a % live.len()]).collect();
                    let mut specs: Vec<OutputSpec> =
                        outs.iter().map(|b| OutputSpec::fresh(*b)).collect();
                    if *view {
                        specs.push(OutputSpec::view(0));
                    }
                    let f = op(n as u64, outs.len());
                    let ts = rt.apply(f, &inputs, &specs, *cost)?;
                    for t in ts {
                        let v = *rt.peek(t)?.expect("fresh output is resident");
                        expect.insert(t, v);
                        live.push(t);
                    }
                }
                Step::Access(i) => {
                    if live.is_empty() {
                        return Ok(());
                    }
                    let t = live[i % live.len()];
                    let v = *rt.access(t)?;
                    assert_eq!(
                        v, expect[&t],
                        "value of {t:?} changed after rematerialization"
                    );
                    checked += 1;
                }
                Step::Release(i) => {
                    if live.len() > 3 {
                        let t = live.swap_remove(3 + i % (live.len() - 3));
                        rt.release(t)?;
                    }
                }
                Step::Mutate(a, b) => {
                    if live.len() < 4 {
                        return Ok(());
                    }
                    let target = live[3 + a % (live.len() - 3)];
                    let other = live[b % live.len()];
                    rt.mutate(op(1000 + n as u64, 1), &[target, other], &[0], 5)?;
                    // Every tensor on the mutated storage sees the new value.
                    let s = rt.storage_of(target)?;
                    let v = *rt.peek(target)?.expect("mutated storage resident");
                    for t in &live {
                        if rt.storage_of(*t)? == s {
                            expect.insert(*t, v);
                        }
                    }
                }
            }
            Ok(())
        })();
        match res {
            Ok(()) => {}
            Err(Error::ImpossibleBudget(_)) => {}
            Err(e) => panic!("step {n} {s:?}: {e}"),
        }
        rt.check_invariants().unwrap();
    }
    // Read everything at the end.
    for t in live.clone() {
        match rt.access(t) {
            Ok(v) => {
                assert_eq!(*v, expect[&t]);
                checked += 1;
            }
            Err(Error::ImpossibleBudget(_)) => {}
            Err(e) => panic!("final access: {e}"),
        }
    }
    rt.check_invariants().unwrap();
    (checked, rt.stats().rematerializations)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn rematerialized_values_are_bit_identical(
        steps in prop::collection::vec(step(), 10..120),
        budget_mib in 4u64..40,
        sampling in any::<bool>(),
    ) {
        for policy in PolicyKind::ALL {
            for mode in [BudgetMode::Logical, BudgetMode::Physical] {
                run(policy, mode, budget_mib << 20, sampling, &steps);
            }
        }
    }
}

#[test]
fn tight_budgets_force_rematerialization_for_every_policy() {
    // A deterministic long run where rematerialization surely happens.
    let steps: Vec<Step> = (0..300)
        .map(|i| match i % 5 {
            0..=2 => Step::Apply {
                args: vec![i * 7, i * 13 + 1],
                outs: vec![(1 << 20) + (i as u64 % 7) * 4096],
                view: i % 11 == 0,
                cost: 10 + i as u64,
            },
            3 => Step::Access(i * 31),
            _ => Step::Release(i * 17),
        })
        .collect();
    for policy in PolicyKind::ALL {
        for mode in [BudgetMode::Logical, BudgetMode::Physical] {
            let (checked, remats) = run(policy, mode, 24 << 20, true, &steps);
            assert!(checked > 50, "{policy} {mode}: {checked}");
            assert!(
                remats > 10,
                "{policy} {mode}: only {remats} rematerializations"
            );
        }
    }
}
