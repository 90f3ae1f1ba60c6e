//! `Runtime::min_feasible_budget`: the smallest budget a recorded iteration
//! replays under, checked against a brute-force search over real runs.

use remat_dtr::{BudgetMode, DtrConfig, Error, OutputSpec, Runtime, TensorId};

mod common;
use common::op;

/// Layer widths of the small model (bytes of each activation).
const LAYERS: [u64; 6] = [1024, 3072, 2048, 4096, 1536, 2560];

/// One training step: the forward chain over the parameters, a backward pass
/// that reads every activation in reverse, the parameters updated in place by
/// their gradients (so that the next step starts from the same state).
/// Returns the loss-like value of the step.
fn step(rt: &mut Runtime<u64>, params: &[TensorId], input: TensorId) -> Result<u64, Error> {
    let mut acts = vec![input];
    for (k, &bytes) in LAYERS.iter().enumerate() {
        let x = *acts.last().unwrap();
        let y = rt.apply(
            op(k as u64, 1),
            &[x, params[k]],
            &[OutputSpec::fresh(bytes)],
            100,
        )?[0];
        acts.push(y);
    }
    let loss = *rt.access(*acts.last().unwrap())?;
    let mut grad = rt.apply(
        op(99, 1),
        &[acts[LAYERS.len()]],
        &[OutputSpec::fresh(512)],
        10,
    )?[0];
    for k in (0..LAYERS.len()).rev() {
        let outs = [
            OutputSpec::fresh(256),
            OutputSpec::fresh(rt.bytes(acts[k])?),
        ];
        let g = rt.apply(
            op(1000 + k as u64, 2),
            &[grad, acts[k], params[k]],
            &outs,
            200,
        )?;
        rt.release(grad)?;
        rt.mutate(op(2000 + k as u64, 1), &[params[k], g[0]], &[0], 5)?;
        rt.release(g[0])?;
        grad = g[1];
    }
    rt.release(grad)?;
    for t in acts.drain(1..) {
        rt.release(t)?;
    }
    Ok(loss)
}

fn runtime(mode: BudgetMode, budget: Option<u64>) -> Runtime<u64> {
    let mut c = DtrConfig::default()
        .with_budget_mode(mode)
        .with_sampling(false);
    if let Some(b) = budget {
        c = c.with_budget(b);
    }
    Runtime::new(c).unwrap()
}

fn setup(rt: &mut Runtime<u64>) -> Result<(Vec<TensorId>, TensorId), Error> {
    let params = (0..LAYERS.len() as u64)
        .map(|k| rt.put(k + 1, 256))
        .collect::<Result<_, _>>()?;
    Ok((params, rt.put(7, 1024)?))
}

/// Train `steps` steps; the losses, or `None` if a step failed or the last
/// one cost more than `max_overhead` times its first computations.
fn train(
    mode: BudgetMode,
    budget: Option<u64>,
    steps: usize,
    max_overhead: f64,
) -> Option<Vec<u64>> {
    let mut rt = runtime(mode, budget);
    let (params, input) = setup(&mut rt).ok()?;
    rt.end_iteration().unwrap();
    let mut losses = Vec::new();
    let mut last = None;
    for _ in 0..steps {
        match step(&mut rt, &params, input) {
            Ok(l) => losses.push(l),
            Err(Error::ImpossibleBudget(_)) => return None,
            Err(e) => panic!("{e}"),
        }
        last = Some(rt.end_iteration().unwrap());
    }
    rt.check_invariants().unwrap();
    let r = last?;
    ((r.compute_ns + r.remat_ns) <= max_overhead * r.compute_ns).then_some(losses)
}

/// The query from an unbudgeted run that recorded its second step.
fn query(mode: BudgetMode, max_overhead: f64) -> u64 {
    let mut rt = runtime(mode, None);
    rt.record_iterations();
    let (params, input) = setup(&mut rt).unwrap();
    rt.end_iteration().unwrap();
    for _ in 0..2 {
        step(&mut rt, &params, input).unwrap();
        rt.end_iteration().unwrap();
    }
    rt.min_feasible_budget(max_overhead).unwrap()
}

#[test]
fn the_smallest_logical_budget_matches_a_brute_force_search() {
    let reference = train(BudgetMode::Logical, None, 3, 1.0).unwrap();
    for max_overhead in [1.0, 2.0] {
        let answer = query(BudgetMode::Logical, max_overhead);
        // Brute force: every budget in 64-byte steps (all sizes are multiples
        // of 64), three real steps each with plan-ahead, judged on the last.
        let brute = (64..=64 * 1024)
            .step_by(64)
            .find(|&b| train(BudgetMode::Logical, Some(b), 3, max_overhead).is_some())
            .expect("some budget trains");
        assert_eq!(answer, brute, "max_overhead {max_overhead}");
        let losses = train(BudgetMode::Logical, Some(answer), 3, max_overhead).unwrap();
        assert_eq!(losses, reference, "bit-identical at the answer");
    }
    // Allowing replays lowers the floor of this model.
    assert!(query(BudgetMode::Logical, 2.0) < query(BudgetMode::Logical, 1.0));
}

#[test]
fn the_physical_answer_is_a_budget_the_default_mode_trains_at() {
    let reference = train(BudgetMode::Physical, None, 3, 1.0).unwrap();
    let answer = query(BudgetMode::Physical, 2.0);
    assert_eq!(answer % 512, 0, "arena granularity");
    let losses = train(BudgetMode::Physical, Some(answer), 3, 2.0)
        .unwrap_or_else(|| panic!("physical run at the answer {answer} B"));
    assert_eq!(losses, reference);
    // One 512-byte step below, the planned step does not fit as cheaply.
    assert!(train(BudgetMode::Physical, Some(answer - 512), 3, 2.0).is_none());
}

#[test]
fn the_query_says_what_it_needs() {
    let mut rt = runtime(BudgetMode::Logical, None);
    match rt.min_feasible_budget(2.0) {
        Err(Error::NotRecorded { why }) => assert!(why.contains("record_iterations"), "{why}"),
        other => panic!("{other:?}"),
    }
    rt.record_iterations();
    let (params, input) = setup(&mut rt).unwrap();
    match rt.min_feasible_budget(2.0) {
        Err(Error::NotRecorded { why }) => assert!(why.contains("end_iteration"), "{why}"),
        other => panic!("{other:?}"),
    }
    step(&mut rt, &params, input).unwrap();
    rt.end_iteration().unwrap();
    for bad in [0.5, f64::NAN, f64::INFINITY] {
        match rt.min_feasible_budget(bad) {
            Err(Error::InvalidArgument { name, .. }) => assert_eq!(name, "max_overhead"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(rt.min_feasible_budget(1.5).is_ok());
}
