//! Plan-ahead DTR: iterations are recorded, the next one is planned from the
//! last, followed with no divergence when it repeats, left safely when it does
//! not, and reading a value of an earlier iteration that would need a recompute
//! is a typed error.

use std::sync::Arc;

use remat_dtr::{
    BudgetMode, DtrConfig, Error, FnOp, IterationReport, OpError, OpHandle, OutputSpec, Runtime,
    TensorId,
};

fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 31)
}

fn op(name: &str, seed: u64) -> Arc<dyn OpHandle<u64>> {
    Arc::new(FnOp::new(name, move |ins: &[&u64]| {
        Ok::<_, OpError>(vec![ins.iter().fold(seed, |h, v| mix(h, **v))])
    }))
}

/// The optimizer's in-place update: not recomputable.
struct Update;
impl OpHandle<u64> for Update {
    fn name(&self) -> &str {
        "sgd"
    }
    fn compute(&self, ins: &[&u64]) -> Result<Vec<u64>, OpError> {
        Ok(vec![mix(*ins[0], *ins[1])])
    }
    fn recomputable(&self) -> bool {
        false
    }
}

const MIB: u64 = 1 << 20;

/// A small MLP-like step: forward through `layers` activations of `act` bytes,
/// a loss, backward reading every activation in reverse, an in-place update of
/// each weight. `widen`: layer whose activation is twice as large (a changed
/// shape); `skip`: a layer left out. Checks the runtime's invariants after each
/// layer. Returns the loss.
fn step(
    rt: &mut Runtime<u64>,
    weights: &[TensorId],
    it: u64,
    act: u64,
    widen: Option<usize>,
    skip: Option<usize>,
) -> Result<u64, Error> {
    let x = rt.put(mix(it, 7), act)?;
    let mut acts = vec![x];
    for (i, &w) in weights.iter().enumerate() {
        if skip == Some(i) {
            continue;
        }
        let bytes = if widen == Some(i) { 2 * act } else { act };
        let prev = *acts.last().unwrap();
        let h = rt.apply(
            op("fwd", i as u64),
            &[prev, w],
            &[OutputSpec::fresh(bytes)],
            1_000 + 100 * i as u64,
        )?[0];
        acts.push(h);
        // Mid-iteration too: the planned arena's blocks, the lazily kept
        // address map, the resident slots.
        rt.check_invariants()?;
    }
    let loss = rt.apply(
        op("loss", 99),
        &[*acts.last().unwrap()],
        &[OutputSpec::fresh(8)],
        500,
    )?[0];
    let value = *rt.access(loss)?;
    let mut d = rt.apply(op("dloss", 98), &[loss], &[OutputSpec::fresh(act)], 500)?[0];
    let mut k = acts.len() - 1;
    for (i, &w) in weights.iter().enumerate().rev() {
        if skip == Some(i) {
            continue;
        }
        let h_in = acts[k - 1];
        let nd = rt.apply(
            op("bwd", 50 + i as u64),
            &[d, h_in, w],
            &[OutputSpec::fresh(act)],
            2_000,
        )?[0];
        rt.mutate(Arc::new(Update), &[w, nd], &[0], 300)?;
        rt.check_invariants()?;
        rt.release(d)?;
        rt.release(acts[k])?;
        d = nd;
        k -= 1;
    }
    rt.release(d)?;
    rt.release(acts[0])?;
    rt.release(loss)?;
    Ok(value)
}

fn weights(rt: &mut Runtime<u64>, layers: usize) -> Vec<TensorId> {
    (0..layers)
        .map(|i| rt.put(mix(i as u64, 1), MIB).unwrap())
        .collect()
}

/// Losses and final weights of `iters` steps, with `end_iteration` after each;
/// `variant(it)` gives (widen, skip) per iteration.
fn train(
    config: DtrConfig,
    iters: u64,
    variant: impl Fn(u64) -> (Option<usize>, Option<usize>),
) -> (Vec<u64>, Vec<u64>, Vec<IterationReport>, Runtime<u64>) {
    let mut rt: Runtime<u64> = Runtime::new(config).unwrap();
    // Background plans are taken at a fixed boundary, for assertions.
    rt.wait_for_background_plans(true);
    let ws = weights(&mut rt, 8);
    let mut losses = Vec::new();
    let mut reports = Vec::new();
    for it in 0..iters {
        let (widen, skip) = variant(it);
        losses.push(step(&mut rt, &ws, it, 12 * MIB, widen, skip).unwrap());
        rt.check_invariants().unwrap();
        reports.push(rt.end_iteration().unwrap());
    }
    let finals = ws.iter().map(|&w| *rt.access(w).unwrap()).collect();
    (losses, finals, reports, rt)
}

fn unbounded_peak() -> u64 {
    let (_, _, _, rt) = train(DtrConfig::default(), 1, |_| (None, None));
    rt.stats().peak_live_bytes
}

#[test]
fn repeated_iterations_follow_their_plan_bit_identically_in_both_modes() {
    let (ref_losses, ref_weights, _, _) = train(DtrConfig::default(), 5, |_| (None, None));
    let peak = unbounded_peak();
    for mode in [BudgetMode::Physical, BudgetMode::Logical] {
        let budget = peak * 6 / 10;
        let config = DtrConfig::default()
            .with_budget(budget)
            .with_budget_mode(mode);
        let (losses, finals, reports, rt) = train(config, 5, |_| (None, None));
        assert_eq!(losses, ref_losses, "{mode:?}");
        assert_eq!(finals, ref_weights, "{mode:?}");
        // The state at the first boundary differs from the start (the weights'
        // new versions), so the first plan can start at iteration 2 at latest.
        for r in &reports[2..] {
            assert!(r.planned, "{mode:?}: {r:?}");
            assert_eq!(r.divergences, 0, "{mode:?}: {r:?}");
            assert!(
                r.evictions > 0,
                "{mode:?}: the budget should need evictions: {r:?}"
            );
            let plan = r.next_plan.as_ref().expect("a plan for the next iteration");
            assert!(plan.arena_bytes <= budget, "{mode:?}: {plan:?}");
        }
        assert!(reports.iter().all(|r| r.divergences == 0), "{reports:?}");
        assert!(rt.stats().planned_evictions > 0);
        if mode == BudgetMode::Physical {
            assert_eq!(rt.memory().name(), "arena");
            assert!(rt.memory_usage().peak_reserved <= budget);
        }
    }
}

#[test]
fn a_changed_iteration_falls_back_stays_identical_and_is_planned_again() {
    // Iteration 3 widens one activation, iteration 5 leaves a layer out.
    let variant = |it: u64| match it {
        3 => (Some(4), None),
        5 => (None, Some(2)),
        _ => (None, None),
    };
    let (ref_losses, ref_weights, _, _) = train(DtrConfig::default(), 9, variant);
    let budget = unbounded_peak() * 6 / 10;
    let (losses, finals, reports, _) = train(DtrConfig::default().with_budget(budget), 9, variant);
    assert_eq!(losses, ref_losses);
    assert_eq!(finals, ref_weights);
    assert!(
        reports[3].planned && reports[3].divergences == 1,
        "{:?}",
        reports[3]
    );
    assert!(
        reports[5].planned && reports[5].divergences == 1,
        "{:?}",
        reports[5]
    );
    // After a changed iteration the next is planned from what really ran (the
    // changed one), so it diverges in turn; the one after that repeats, though
    // iteration 5 left one weight's update out (its start is numbered by when
    // each tensor was made, not by when its storage was last written).
    for k in [4, 6] {
        assert!(
            reports[k].planned && reports[k].divergences == 1,
            "{k}: {:?}",
            reports[k]
        );
    }
    for k in [7, 8] {
        assert!(reports[k].planned, "{k}: {:?}", reports[k]);
        assert_eq!(reports[k].divergences, 0, "{k}: {:?}", reports[k]);
    }
}

#[test]
fn evicted_values_of_an_ended_iteration_are_stale_and_resident_ones_stay() {
    let config = DtrConfig::default()
        .with_budget(3 * MIB)
        .with_budget_mode(BudgetMode::Logical);
    let mut rt: Runtime<u64> = Runtime::new(config).unwrap();
    let w = rt.put(3, MIB).unwrap();
    let f = op("f", 1);
    let a = rt
        .apply(f.clone(), &[w], &[OutputSpec::fresh(MIB)], 10)
        .unwrap()[0];
    let b = rt
        .apply(f.clone(), &[a], &[OutputSpec::fresh(MIB)], 10)
        .unwrap()[0];
    let expect_b = *rt.access(b).unwrap();
    // Full: `c` evicts `a` (`b` is its input, so pinned).
    let c = rt
        .apply(f.clone(), &[b], &[OutputSpec::fresh(MIB)], 10)
        .unwrap()[0];
    assert!(!rt.is_resident(a).unwrap() && rt.is_resident(b).unwrap());
    rt.release(c).unwrap();
    rt.end_iteration().unwrap();
    // `a` would be recomputed from `w`, which an optimizer may have changed.
    match rt.access(a) {
        Err(Error::StaleValue {
            created_in: 0,
            current: 1,
            ..
        }) => {}
        other => panic!("expected a stale-value error, got {other:?}"),
    }
    // `b` stayed resident: it is never evicted again, whatever needs room.
    for round in 0..4 {
        let t = rt
            .apply(f.clone(), &[w], &[OutputSpec::fresh(MIB)], 10)
            .unwrap()[0];
        rt.release(t).unwrap();
        assert!(rt.is_resident(b).unwrap(), "round {round}");
    }
    assert_eq!(*rt.access(b).unwrap(), expect_b);
    let msg = rt.access(a).unwrap_err().to_string();
    assert!(
        msg.contains("end_iteration") && msg.contains("iteration 0"),
        "{msg}"
    );
}

#[test]
fn plan_ahead_off_records_nothing_and_never_plans() {
    let budget = unbounded_peak() * 6 / 10;
    let config = DtrConfig::default()
        .with_budget(budget)
        .with_plan_ahead(false);
    let (_, _, reports, rt) = train(config, 4, |_| (None, None));
    assert!(reports.iter().all(|r| !r.planned && r.next_plan.is_none()));
    assert_eq!(rt.stats().planned_evictions, 0);
    assert_eq!(rt.stats().iterations, 4);
}

#[test]
fn an_impossible_budget_stays_a_typed_error_across_iterations() {
    let config = DtrConfig::default()
        .with_budget(9 * MIB)
        .with_budget_mode(BudgetMode::Logical);
    let mut rt: Runtime<u64> = Runtime::new(config).unwrap();
    let ws = weights(&mut rt, 8);
    match step(&mut rt, &ws, 0, 12 * MIB, None, None) {
        Err(e) => assert!(e.is_impossible_budget(), "{e}"),
        Ok(_) => panic!("12 MiB activations cannot fit 9 MiB with 8 MiB of weights"),
    }
    let r = rt.end_iteration().unwrap();
    assert!(
        r.next_plan.is_none(),
        "a failed iteration is no program to plan"
    );
}

/// `name` replayed as `iterations` training iterations at `ratio` of its peak,
/// physical budget, the default policy and configuration.
fn replay_trace(name: &str, ratio: f64, iterations: usize) -> remat_dtr::replay::ReplayReport {
    replay_trace_with(name, ratio, iterations, &DtrConfig::default())
}

/// [`replay_trace`] under `config` (the default policy).
fn replay_trace_with(
    name: &str,
    ratio: f64,
    iterations: usize,
    config: &DtrConfig,
) -> remat_dtr::replay::ReplayReport {
    let path = remat_trace::find_trace(name).unwrap_or_else(|| panic!("trace {name} not found"));
    let trace = remat_trace::Trace::load(&path).unwrap();
    remat_dtr::replay::replay_ratio_iterations(
        &trace,
        ratio,
        BudgetMode::Physical,
        remat_dtr::PolicyKind::Remat,
        config,
        iterations,
    )
    .unwrap()
}

/// Every iteration of several that starts without a plan runs online and is
/// judged like the first (stopped only past 20×), not at the thrash limit:
/// transformer at 0.2 costs over 2× online in each of two iterations with
/// plan-ahead off (5.86 and 3.16), and both finish.
#[test]
fn online_iterations_are_judged_like_the_first() {
    use remat_dtr::replay::ReplayStatus;
    use remat_trace::require_traces;
    if require_traces("online_iterations_are_judged_like_the_first").is_none() {
        return;
    }
    let config = DtrConfig::default().with_plan_ahead(false);
    let r = replay_trace_with("transformer", 0.2, 2, &config);
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
    assert_eq!(r.iterations.len(), 2);
    for it in &r.iterations {
        assert!(!it.planned, "{it:?}");
        assert!(
            it.overhead > 2.0 && it.overhead < remat_dtr::replay::FIRST_ITERATION_LIMIT,
            "{it:?}"
        );
    }
}

/// On the DTR paper's traces replayed as three iterations under a physical
/// budget: the last iteration follows its plan with no divergence, costs no more
/// than the first, and its arena fits the budget. treelstm at 0.3 is the cell
/// where the first iteration's caching allocator fragments: it must finish.
#[test]
fn traces_replayed_as_iterations_settle_on_a_plan() {
    use remat_dtr::replay::ReplayStatus;
    use remat_trace::require_traces;
    if require_traces("traces_replayed_as_iterations_settle_on_a_plan").is_none() {
        return;
    }
    for (name, ratio) in [("lstm", 0.4), ("treelstm", 0.3), ("resnet32", 0.5)] {
        let r = replay_trace(name, ratio, 3);
        assert_eq!(r.status, ReplayStatus::Ok, "{name}: {:?}", r.iterations);
        let last = r.iterations.last().unwrap();
        assert!(last.planned, "{name}: {:?}", r.iterations);
        assert_eq!(last.divergences, 0, "{name}: {:?}", r.iterations);
        assert!(
            last.arena_bytes.unwrap() <= r.budget_bytes.unwrap(),
            "{name}"
        );
        assert!(
            last.overhead <= r.iterations[0].overhead,
            "{name}: {:?}",
            r.iterations
        );
        assert_eq!(r.steady_overhead, Some(last.overhead));
    }
}

/// lstm at 0.25 of its peak: remat's first iteration cascades (past 20×, the
/// replayer's first-iteration limit, before the rescues): one regeneration
/// regenerates the same lineages again for each consumer. Once replays pass
/// the computations, that regeneration keeps what it regenerated and the
/// iteration goes on under the lineage-priced policy; it finishes, and the
/// second iteration follows a plan.
#[test]
fn a_thrashing_first_iteration_is_rescued_and_the_next_one_is_planned() {
    use remat_dtr::replay::ReplayStatus;
    use remat_trace::require_traces;
    if require_traces("a_thrashing_first_iteration_is_rescued_and_the_next_one_is_planned")
        .is_none()
    {
        return;
    }
    let r = replay_trace("lstm", 0.25, 2);
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
    assert_eq!(
        r.iterations[0].status,
        ReplayStatus::Ok,
        "{:?}",
        r.iterations
    );
    assert!(r.iterations[0].rescued, "{:?}", r.iterations);
    assert!(r.iterations[0].overhead > 2.0, "{:?}", r.iterations);
    let last = &r.iterations[1];
    assert!(last.planned && last.divergences == 0, "{:?}", r.iterations);
    assert!(last.overhead < 2.0, "{:?}", r.iterations);
    assert!(last.arena_bytes.unwrap() <= r.budget_bytes.unwrap());
}

/// treelstm at 0.25 of its peak: the first iteration finishes only by moving
/// into a defragmenting arena, so its cost is no figure the next online one
/// repeats (before: 1.263, 1.262, then a thrash). Its plan costs a little more
/// than that iteration did but is exact: it is taken, and the iterations after
/// it follow it.
#[test]
fn a_rescued_iteration_is_followed_by_its_plan() {
    use remat_dtr::replay::ReplayStatus;
    use remat_trace::require_traces;
    if require_traces("a_rescued_iteration_is_followed_by_its_plan").is_none() {
        return;
    }
    let r = replay_trace("treelstm", 0.25, 3);
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
    assert!(!r.iterations[0].planned, "{:?}", r.iterations);
    assert!(r.iterations[0].rescued, "{:?}", r.iterations);
    for it in &r.iterations[1..] {
        assert!(it.planned && it.divergences == 0, "{:?}", r.iterations);
        assert!(it.overhead < 2.0, "{:?}", r.iterations);
        assert!(it.arena_bytes.unwrap() <= r.budget_bytes.unwrap());
    }
    assert_eq!(r.iterations[1].overhead, r.iterations[2].overhead);
}

#[test]
fn a_value_evicted_at_the_boundary_can_be_dropped_in_a_planned_step() {
    // Each step leaves one value evicted at its end and drops its handle in
    // the next step. The boundary holds that tensor without memory; the
    // plan's simulations must take the drop, not fail on it (they did: every
    // simulation failed and no step was ever planned).
    let (ref_losses, ref_weights, _, _) = train(DtrConfig::default(), 5, |_| (None, None));
    let config = DtrConfig::default()
        .with_budget(unbounded_peak() * 6 / 10)
        .with_budget_mode(BudgetMode::Logical);
    let mut rt: Runtime<u64> = Runtime::new(config).unwrap();
    let ws = weights(&mut rt, 8);
    let (mut losses, mut reports, mut carried) = (Vec::new(), Vec::new(), None);
    for it in 0..5 {
        if let Some(c) = carried.take() {
            rt.release(c).unwrap();
        }
        losses.push(step(&mut rt, &ws, it, 12 * MIB, None, None).unwrap());
        let c = rt
            .apply(op("carry", 7), &[ws[0]], &[OutputSpec::fresh(MIB)], 100)
            .unwrap()[0];
        assert!(rt.evict(c).unwrap());
        carried = Some(c);
        reports.push(rt.end_iteration().unwrap());
        rt.check_invariants().unwrap();
    }
    assert_eq!(losses, ref_losses);
    let finals: Vec<u64> = ws.iter().map(|&w| *rt.access(w).unwrap()).collect();
    assert_eq!(finals, ref_weights);
    for r in &reports[3..] {
        assert!(r.planned && r.divergences == 0, "{r:?}");
    }
}

#[test]
fn background_planning_follows_the_plan_one_iteration_later() {
    use remat_dtr::PlanStatus;
    let (ref_losses, ref_weights, _, _) = train(DtrConfig::default(), 7, |_| (None, None));
    let budget = unbounded_peak() * 6 / 10;
    let sync = DtrConfig::default().with_budget(budget);
    let (_, _, sync_reports, _) = train(sync.clone(), 7, |_| (None, None));
    let (losses, finals, reports, _) = train(sync.with_plan_background(true), 7, |_| (None, None));
    assert_eq!(losses, ref_losses);
    assert_eq!(finals, ref_weights);
    let status: Vec<PlanStatus> = reports.iter().map(|r| r.planning).collect();
    // Boundary 0: the weights iteration 0 put are live, so iteration 0's
    // recording, carried to the boundary without their puts, goes to a
    // thread, and iteration 1 runs online. Boundary 1: the same program ended
    // again: its plan is taken, and iteration 2 follows it.
    assert_eq!(status[0], PlanStatus::Planning, "{reports:?}");
    let diff = reports[0].start_diff.as_ref().expect("the start differed");
    assert_eq!(
        (diff.recorded_storages, diff.made_storages),
        (0, 8),
        "{diff}"
    );
    assert_eq!(diff.not_carried, None, "{diff}");
    assert!(!reports[1].planned, "{:?}", reports[1]);
    assert_eq!(status[1], PlanStatus::Planned, "{reports:?}");
    // Synchronously, the carried recording is planned at boundary 0 and
    // iteration 1 follows it whole.
    assert_eq!(
        sync_reports[0].planning,
        PlanStatus::Planned,
        "{sync_reports:?}"
    );
    assert!(
        sync_reports[1].planned && sync_reports[1].divergences == 0,
        "{sync_reports:?}"
    );
    for (r, s) in reports[2..].iter().zip(&sync_reports[2..]) {
        assert!(r.planned && r.divergences == 0, "{r:?}");
        assert_eq!(r.planning.name(), "kept");
        // The plan is the one the boundary would have made synchronously
        // from the same recording.
        assert_eq!(r.evictions, s.evictions, "{r:?} vs {s:?}");
        assert_eq!(r.remat_ns, s.remat_ns, "{r:?} vs {s:?}");
    }
}

#[test]
fn background_planning_drops_the_plan_of_a_program_that_changed() {
    use remat_dtr::PlanStatus;
    // Iteration 2 leaves a layer out while iteration 1's recording is planned.
    let variant = |it: u64| {
        if it == 2 {
            (None, Some(3))
        } else {
            (None, None)
        }
    };
    let (ref_losses, ref_weights, _, _) = train(DtrConfig::default(), 7, variant);
    let budget = unbounded_peak() * 6 / 10;
    let config = DtrConfig::default()
        .with_budget(budget)
        .with_plan_background(true);
    let (losses, finals, reports, _) = train(config, 7, variant);
    assert_eq!(losses, ref_losses);
    assert_eq!(finals, ref_weights);
    let status: Vec<PlanStatus> = reports.iter().map(|r| r.planning).collect();
    // Boundary 0: iteration 0's recording, carried past the weights it put,
    // goes to a thread. Boundary 1: iteration 1 repeated it: its plan is
    // taken. Iteration 2 is another program: it leaves the plan, and its
    // recording goes to a thread. Boundary 3: iteration 3 is not iteration 2's
    // program: dropped, planned anew. Boundary 4: iteration 4 repeated
    // iteration 3 from a start numbered the same (by when each tensor was
    // made, though iteration 2 left one weight's update out): iteration 3's
    // plan is taken, and iterations 5 and 6 follow it.
    assert_eq!(
        status,
        [
            PlanStatus::Planning,
            PlanStatus::Planned,
            PlanStatus::Planning,
            PlanStatus::Planning,
            PlanStatus::Planned,
            PlanStatus::Kept,
            PlanStatus::Kept,
        ],
        "{reports:?}"
    );
    assert!(
        reports[2].planned && reports[2].divergences == 1,
        "{reports:?}"
    );
    assert!(
        [0, 1, 3, 4].iter().all(|&i| !reports[i].planned),
        "{reports:?}"
    );
    for r in &reports[5..] {
        assert!(r.planned && r.divergences == 0, "{r:?}");
    }
}

#[test]
fn background_planning_without_waiting_stays_identical_and_ends_planned() {
    // Boundaries do not wait: the plan is taken at the first boundary after
    // its thread finished, whenever that is; values never depend on it.
    let budget = unbounded_peak() * 6 / 10;
    let config = DtrConfig::default()
        .with_budget(budget)
        .with_plan_background(true);
    let mut rt: Runtime<u64> = Runtime::new(config).unwrap();
    let ws = weights(&mut rt, 8);
    let mut reports: Vec<IterationReport> = Vec::new();
    let mut losses = Vec::new();
    // Until an iteration runs planned (at most 200 iterations, ~4 s of
    // sleeps: this checks that a finished plan is taken, not its speed).
    for it in 0..200 {
        losses.push(step(&mut rt, &ws, it, 12 * MIB, None, None).unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
        reports.push(rt.end_iteration().unwrap());
        rt.check_invariants().unwrap();
        if reports[it as usize].planned {
            break;
        }
    }
    let n = reports.len() as u64;
    let finals: Vec<u64> = ws.iter().map(|&w| *rt.access(w).unwrap()).collect();
    let (ref_losses, ref_weights, _, _) = train(DtrConfig::default(), n, |_| (None, None));
    assert_eq!(losses, ref_losses);
    assert_eq!(finals, ref_weights);
    assert!(
        reports[n as usize - 1].planned,
        "never planned: {reports:?}"
    );
    assert!(reports.iter().all(|r| r.divergences == 0), "{reports:?}");
}

/// A budget of six links of [`chain_of_links`], full scans.
fn chain_config(mode: BudgetMode) -> DtrConfig {
    DtrConfig::default()
        .with_budget(6 * MIB)
        .with_budget_mode(mode)
        .with_sampling(false)
}

/// A chain of 40 links of 1 MiB each (1 µs per link) from an input made
/// for step `it`, and the value each should hold.
fn chain_of_links(rt: &mut Runtime<u64>, it: u64) -> (Vec<TensorId>, Vec<u64>) {
    let x = rt.put(mix(it, 3), MIB).unwrap();
    let mut chain = vec![x];
    let mut expected = vec![mix(it, 3)];
    for i in 0..40u64 {
        let prev = *chain.last().unwrap();
        let t = rt
            .apply(op("link", i), &[prev], &[OutputSpec::fresh(MIB)], 1_000)
            .unwrap()[0];
        chain.push(t);
        expected.push(mix(i, *expected.last().unwrap()));
    }
    (chain, expected)
}

/// A step that reads a long chain back in reverse under a budget of a few of
/// its values replays more than it computes: the runtime finishes it under
/// MSPS, reports it rescued at the boundary, and starts the next step under
/// the configured policy again. Every value read is the one first computed.
#[test]
fn a_losing_step_finishes_under_msps_and_the_boundary_restores_the_policy() {
    let config = chain_config(BudgetMode::Logical);
    let mut rt: Runtime<u64> = Runtime::new(config.clone()).unwrap();
    let configured = rt.policy_name();
    for it in 0..2u64 {
        let (chain, expected) = chain_of_links(&mut rt, it);
        let before = rt.stats().clone();
        for (&t, &want) in chain.iter().zip(&expected).rev() {
            assert_eq!(*rt.access(t).unwrap(), want, "step {it}");
        }
        let rescues = rt.stats().policy_rescues - before.policy_rescues;
        if it == 0 {
            // Replays past the computations: switched, once.
            assert!(rt.stats().remat_ns > rt.stats().compute_ns, "not losing");
            assert_eq!(rescues, 1);
            assert_eq!(rt.active_policy_name(), "msps");
            // Reports still name the configured policy.
            assert_eq!(rt.policy_name(), configured);
        } else {
            // The step repeats: it follows the plan made from the rescued one
            // (cheaper than it was), and a planned step is never rescued.
            assert!(rt.current_plan().is_some());
            assert_eq!(rescues, 0);
        }
        for t in chain {
            rt.release(t).unwrap();
        }
        let report = rt.end_iteration().unwrap();
        assert_eq!(report.rescued, it == 0, "{report:?}");
        assert_eq!(report.divergences, 0, "{report:?}");
        assert_eq!(rt.active_policy_name(), configured);
        rt.check_invariants().unwrap();
    }
    // Turned off, the configured policy decides every eviction.
    let mut rt: Runtime<u64> = Runtime::new(config.with_thrash_rescue(false)).unwrap();
    let mut last = rt.put(1, MIB).unwrap();
    let mut chain = vec![last];
    for i in 0..40u64 {
        last = rt
            .apply(op("link", i), &[last], &[OutputSpec::fresh(MIB)], 1_000)
            .unwrap()[0];
        chain.push(last);
    }
    for &t in chain.iter().rev() {
        rt.access(t).unwrap();
    }
    assert!(rt.stats().remat_ns > rt.stats().compute_ns, "not losing");
    assert_eq!(rt.stats().policy_rescues, 0);
    assert_eq!(rt.policy_name(), configured);
    assert!(!rt.end_iteration().unwrap().rescued);
}

/// Under a physical budget a losing step moves into the compacting arena
/// before it changes policy, and changes it only if it loses again there.
/// The chain of the test above, read back in reverse under a physical
/// budget, loses to its price (each read regenerates the chain below it),
/// not to its layout: it is in the arena when it switches, and switches
/// once. (Before, the switch came first, on a read, in the caching
/// allocator.)
#[test]
fn a_losing_step_moves_into_the_arena_before_it_switches_policy() {
    let mut rt: Runtime<u64> = Runtime::new(chain_config(BudgetMode::Physical)).unwrap();
    let (chain, expected) = chain_of_links(&mut rt, 0);
    let mut moved_at_switch = None;
    for (&t, &want) in chain.iter().zip(&expected).rev() {
        assert_eq!(*rt.access(t).unwrap(), want);
        if moved_at_switch.is_none() && rt.active_policy_name() == "msps" {
            moved_at_switch = Some(rt.stats().defragmentations);
        }
    }
    assert!(rt.stats().remat_ns > rt.stats().compute_ns, "not losing");
    assert_eq!(rt.stats().policy_rescues, 1);
    let moved = moved_at_switch.expect("switched");
    assert!(moved >= 1, "switched before moving into the arena");
    for t in chain {
        rt.release(t).unwrap();
    }
    let report = rt.end_iteration().unwrap();
    assert!(report.rescued, "{report:?}");
    rt.check_invariants().unwrap();
}

/// Sizes (bytes) and costs (ns) of the steps [`shaped_step`] writes.
struct StepShape {
    weight: u64,
    activation: u64,
    forward_ns: u64,
    backward_ns: u64,
    weight_grad_ns: u64,
}

/// Weights of 64 KiB, activations of 512 KiB: [`step_trace`]'s.
const SMALL_STEP: StepShape = StepShape {
    weight: 64 << 10,
    activation: 512 << 10,
    forward_ns: 1_000,
    backward_ns: 2_000,
    weight_grad_ns: 1_500,
};

/// A training step written as a trace: `layers` weights of 64 KiB (constants,
/// updated in place after the backward), forward activations of 512 KiB, a
/// backward reading each in reverse. `widen`: a layer whose activation is twice
/// as large; `skip`: a layer left out (its ops dropped).
fn step_trace(layers: usize, widen: Option<usize>, skip: Option<usize>) -> remat_trace::Trace {
    shaped_step(&SMALL_STEP, layers, widen, skip)
}

/// [`step_trace`] with the weights, activations (the input's size too) and
/// op costs of `shape`; each gradient is the size of what it differentiates.
fn shaped_step(
    shape: &StepShape,
    layers: usize,
    widen: Option<usize>,
    skip: Option<usize>,
) -> remat_trace::Trace {
    const KIB: u64 = 1 << 10;
    let act = shape.activation;
    let mut t = remat_trace::TraceBuilder::new("step").constant("x", act);
    for i in 0..layers {
        t = t.constant(&format!("w{i}"), shape.weight);
    }
    let kept: Vec<usize> = (0..layers).filter(|&i| skip != Some(i)).collect();
    let mut prev = "x".to_string();
    for &i in &kept {
        let bytes = if widen == Some(i) { 2 * act } else { act };
        let a = format!("a{i}");
        t = t.call(
            "fwd",
            &[&prev, &format!("w{i}")],
            &a,
            bytes,
            shape.forward_ns,
        );
        prev = a;
    }
    t = t.call("loss", &[&prev], "loss", KIB, 100).backward();
    let mut grad = "loss".to_string();
    for (k, &i) in kept.iter().enumerate().rev() {
        let (a, w) = (format!("a{i}"), format!("w{i}"));
        let input = if k == 0 {
            "x".to_string()
        } else {
            format!("a{}", kept[k - 1])
        };
        let (g, dw) = (format!("g{i}"), format!("dw{i}"));
        t = t
            .call("bwd", &[&grad, &a, &w], &g, act, shape.backward_ns)
            .call(
                "dw",
                &[&grad, &input],
                &dw,
                shape.weight,
                shape.weight_grad_ns,
            )
            .release(&grad)
            .release(&a)
            .mutate("sgd", &[&w, &dw], &[0], 100)
            .release(&dw);
        grad = g;
    }
    t.release(&grad).build().expect("the step replays")
}

/// The replayer's divergence test: nine iterations of a training step under
/// a budget of 70 % of its peak, iteration 3 with a widened activation and
/// iteration 6 with a layer's ops dropped. Each changed iteration leaves its
/// plan at the first op that differs and finishes online; the one after it
/// is planned from what really ran (the changed step), so it diverges in turn;
/// the next follows its plan again with no divergence. (The replayer carries
/// no values; `a_changed_iteration_falls_back_stays_identical_and_is_planned_again`
/// checks the same fall-back bit for bit on the runtime.)
#[test]
fn a_replayed_iteration_that_changes_falls_back_and_the_run_is_planned_again() {
    use remat_dtr::replay::{replay_sequence, ReplayOptions, ReplayStatus};
    let (plain, widened, dropped) = (
        step_trace(12, None, None),
        step_trace(12, Some(5), None),
        step_trace(12, None, Some(7)),
    );
    let fig = |t: &remat_trace::Trace| {
        let b = remat_trace::baseline(t).unwrap();
        (b.peak_bytes, b.compute_ns)
    };
    let (peak, _) = fig(&plain);
    let budget = peak * 7 / 10;
    let seq: Vec<(&remat_trace::Trace, u64)> = (0..9)
        .map(|k| match k {
            3 => &widened,
            6 => &dropped,
            _ => &plain,
        })
        .map(|t| (t, fig(t).1))
        .collect();
    for mode in [BudgetMode::Logical, BudgetMode::Physical] {
        let mut opts = ReplayOptions::budget(budget, mode, remat_dtr::PolicyKind::Remat);
        opts.iterations = seq.len();
        let r = replay_sequence(&seq, &opts).unwrap();
        let its = &r.iterations;
        assert_eq!(its.len(), 9, "{mode:?}: {its:?}");
        assert!(
            its.iter().all(|it| it.status == ReplayStatus::Ok),
            "{mode:?}: {its:?}"
        );
        assert!(
            its.iter().any(|it| it.evictions > 0),
            "{mode:?}: no pressure"
        );
        for k in [2, 5, 8] {
            assert!(its[k].planned, "{mode:?} {k}: {:?}", its[k]);
            assert_eq!(its[k].divergences, 0, "{mode:?} {k}: {:?}", its[k]);
            assert!(its[k].arena_bytes.unwrap() <= budget, "{mode:?} {k}");
        }
        for k in [3, 4, 6, 7] {
            assert!(
                its[k].planned && its[k].divergences == 1,
                "{mode:?} {k}: {:?}",
                its[k]
            );
        }
        assert_eq!(r.steady_overhead, Some(its[8].overhead));
    }
    // A sequence must match the options and cannot take an oracle.
    let opts = ReplayOptions::budget(budget, BudgetMode::Logical, remat_dtr::PolicyKind::Remat);
    let e = replay_sequence(&seq, &opts).unwrap_err().to_string();
    assert!(e.contains("1 iterations") && e.contains("9 traces"), "{e}");
    let e = replay_sequence(&[], &opts).unwrap_err().to_string();
    assert!(e.contains("at least one trace"), "{e}");
    let mut oracle = opts.clone();
    oracle.oracle = Some(remat_dtr::replay::oracle::OracleKind::NextUse);
    let e = replay_sequence(&seq[..1], &oracle).unwrap_err().to_string();
    assert!(e.contains("oracle"), "{e}");
}

/// Charged moves stand outside the host tier's copy clock. resnet32 at 0.1
/// with swap at 24 GB/s defragments in its online first step (1.4 GB moved)
/// and its plan then prefetches swap-ins: the planned steps' stalls and cost
/// are the same whether the first step's moves are charged or free. (When
/// the charge ran on the copies' clock too, every planned copy looked
/// started that much earlier, and gpt2 0.2's stalls of 0.77× its compute
/// vanished.)
#[test]
fn charged_moves_do_not_shift_a_plans_copy_timeline() {
    use remat_dtr::replay::ReplayStatus;
    use remat_trace::require_traces;
    if require_traces("charged_moves_do_not_shift_a_plans_copy_timeline").is_none() {
        return;
    }
    let run = |moves: Option<f64>| {
        let config = DtrConfig::default()
            .with_swap(Some(24.0))
            .with_move_bandwidth(moves);
        replay_trace_with("resnet32", 0.1, 3, &config)
    };
    let (free, charged) = (run(None), run(Some(1500.0)));
    for r in [&free, &charged] {
        assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
        assert!(r.iterations[0].defrag_bytes > 0, "{:?}", r.iterations[0]);
        assert!(r.iterations[2].planned && r.iterations[2].stall_ns > 0);
    }
    assert_eq!(free.iterations[0].defrag_ns, 0);
    assert!(charged.iterations[0].defrag_ns > 0);
    for k in 1..3 {
        let (f, c) = (&free.iterations[k], &charged.iterations[k]);
        assert_eq!(f.stall_ns, c.stall_ns, "step {k}");
        // The same sums, taken from a wall clock offset by the charge.
        assert!(
            (f.overhead - c.overhead).abs() < 1e-9,
            "step {k}: {f:?} {c:?}"
        );
    }
}

/// With swap on, the planner's second pass (swapping too) is held to the
/// recompute-only plan by what its simulations cost *without* their stalls:
/// a simulation times each swap-in at its read, and the plan prefetches
/// them. Cut off by their stalled cost, the swapping simulations on resnet32
/// at 0.2 and 64 GB/s all stopped above the recompute-only plan (1.248),
/// which was taken; the swapping plan costs 1.190 once prefetched.
#[test]
fn a_swapping_plan_is_held_to_the_recompute_plan_without_its_stalls() {
    use remat_trace::require_traces;
    if require_traces("a_swapping_plan_is_held_to_the_recompute_plan_without_its_stalls").is_none()
    {
        return;
    }
    let recompute = replay_trace("resnet32", 0.2, 3);
    let swapping = replay_trace_with(
        "resnet32",
        0.2,
        3,
        &DtrConfig::default().with_swap(Some(64.0)),
    );
    a_swapping_plan_wins(&recompute, &swapping);
}

/// Both runs finish, their third steps follow a plan without a divergence,
/// and `swapping`'s plan swaps and costs less than `recompute`'s, which
/// does not swap.
fn a_swapping_plan_wins(
    recompute: &remat_dtr::replay::ReplayReport,
    swapping: &remat_dtr::replay::ReplayReport,
) {
    for r in [recompute, swapping] {
        assert_eq!(
            r.status,
            remat_dtr::replay::ReplayStatus::Ok,
            "{:?}",
            r.iterations
        );
        let last = &r.iterations[2];
        assert!(last.planned && last.divergences == 0, "{last:?}");
    }
    let (r, s) = (&recompute.iterations[2], &swapping.iterations[2]);
    assert_eq!(r.swapped_out_bytes, 0);
    assert!(s.swapped_out_bytes > 0, "the plan swaps: {s:?}");
    assert!(
        s.overhead < r.overhead,
        "swapping plan {} against recompute-only {}",
        s.overhead,
        r.overhead
    );
}

/// A plan may swap a storage whose round trip costs more than its replay,
/// where both copies fit before its next read (Capuchin's test). Each
/// forward activation (4 MiB) is made from the input in 100 µs and read
/// once, by its backward op, after a 50 ms op; at 24 GB/s a copy takes
/// 175 µs each way, so the online rule (swap only where the round trip,
/// 350 µs, costs less than the replay) recomputes every one, and so did
/// every plan before the swapping pass's winner was simulated once more
/// with each swap priced by the stall it leaves once prefetched. The
/// backward ops (400 µs) leave the link time to bring each copy back.
#[test]
fn a_plan_swaps_what_its_copies_can_hide_before_the_next_read() {
    const MIB: u64 = 1 << 20;
    let layers = 24;
    let mut t = remat_trace::TraceBuilder::new("hidden").constant("x", MIB);
    for i in 0..layers {
        t = t.call("fwd", &["x"], &format!("a{i}"), 4 * MIB, 100_000);
    }
    t = t.call("mid", &["x"], "m", 1024, 50_000_000).backward();
    let mut grad = "m".to_string();
    for i in (0..layers).rev() {
        let (a, g) = (format!("a{i}"), format!("g{i}"));
        t = t
            .call("bwd", &[&grad, &a], &g, 1024, 400_000)
            .release(&grad)
            .release(&a);
        grad = g;
    }
    let trace = t.release(&grad).build().expect("the step replays");
    let recompute = replay_as_the_cli(&trace, 0.3, DtrConfig::default(), 3);
    let swapping = replay_as_the_cli(&trace, 0.3, DtrConfig::default().with_swap(Some(24.0)), 3);
    a_swapping_plan_wins(&recompute, &swapping);
}

/// Weights as heavy as the activations (1 MiB each), ops of 30–60 µs.
const WEIGHT_HEAVY: StepShape = StepShape {
    weight: 1 << 20,
    activation: 1 << 20,
    forward_ns: 30_000,
    backward_ns: 60_000,
    weight_grad_ns: 60_000,
};

/// A plan starts from a boundary whose resident storages all fit at once.
/// Twenty-four 1 MiB weights updated in place and 1 MiB activations at 40 %
/// of the peak with swap at 24 GB/s: the first step ends with 20 weights
/// resident, and a simulation under a budget below their sum swapped the
/// first out while putting the last, then logged both at offset 0, so the
/// runtime, placing every resident storage of the plan's start at once,
/// failed with an internal error ("arena layout does not fit"). Such a
/// simulation now starts from no state the runtime holds and is not a plan.
#[test]
fn a_plans_start_places_every_resident_storage_at_once() {
    use remat_dtr::replay::ReplayStatus;
    let trace = shaped_step(&WEIGHT_HEAVY, 24, None, None);
    let r = replay_as_the_cli(&trace, 0.4, DtrConfig::default().with_swap(Some(24.0)), 3);
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
    for it in &r.iterations[1..] {
        assert!(it.planned && it.divergences == 0, "{it:?}");
        assert!(it.swapped_out_bytes > 0, "the plan swaps: {it:?}");
    }
}

/// Weights and activations of 4 MiB, memory-bound ops of 20–40 µs: one copy
/// of a weight over 24 GB/s takes 175 µs, nine forward ops.
const SHORT_OPS: StepShape = StepShape {
    weight: 4 << 20,
    activation: 4 << 20,
    forward_ns: 20_000,
    backward_ns: 40_000,
    weight_grad_ns: 40_000,
};

/// Open (issue 33): a link-bound step whose replays wait on copies back.
/// Sixteen 4 MiB weights and activations at 40 % of the peak (the weights
/// alone pass the budget) with swap at 24 GB/s: activations priced at their
/// replays (20 µs a link) are evicted, and each regeneration of a chain of
/// them copies back the swapped weight of every link it replays; the first
/// step copies back 591 MB (its plan, had it one, 155 MB) and passes 20×,
/// the replayer's stop (without it: 27.97×, then planned at 5.21×). Every
/// rule measured that makes it finish under the stop raises first steps of
/// the ten traces (`docs/dtr-results.md`, *Regenerations priced by what
/// they took*), so it stays open. Run it with `-- --ignored`.
#[test]
#[ignore = "open: the first step passes the replayer's 20x stop (issue 33, docs/dtr-results.md)"]
fn a_regeneration_that_waits_on_copies_back_is_not_repeated() {
    use remat_dtr::replay::ReplayStatus;
    let trace = shaped_step(&SHORT_OPS, 16, None, None);
    let r = replay_as_the_cli(&trace, 0.4, DtrConfig::default().with_swap(Some(24.0)), 2);
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
    let (first, second) = (&r.iterations[0], &r.iterations[1]);
    assert!(second.planned && second.divergences == 0, "{second:?}");
    assert!(second.overhead < first.overhead, "{first:?} {second:?}");
}

/// No plan lost to a boundary: a plan followed whole whose start differs
/// from the next boundary only in which storages are in the host tier
/// stands, those storages copied out again. T5-small at 20 % of its peak
/// with swap at 24 GB/s: the second step's plan ends with the storages it
/// swapped in resident; planned again from there, the third step cost
/// 1.468× against the second's 1.392×.
#[test]
fn a_plan_whose_start_differs_only_in_tiers_stands() {
    use remat_dtr::{replay::ReplayStatus, PlanStatus};
    let Some(path) = remat_trace::require_torch_trace(
        "a_plan_whose_start_differs_only_in_tiers_stands",
        "t5_small",
    ) else {
        return;
    };
    let trace = remat_trace::Trace::load(&path).unwrap();
    let r = replay_as_the_cli(&trace, 0.2, DtrConfig::default().with_swap(Some(24.0)), 3);
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
    let (second, third) = (&r.iterations[1], &r.iterations[2]);
    assert_eq!(second.planning, Some(PlanStatus::Kept), "{second:?}");
    assert!(third.planned && third.divergences == 0, "{third:?}");
    // The same plan from the same start: the same cost, the copies that
    // restored its start included.
    assert!(
        (third.overhead - second.overhead).abs() < 1e-9,
        "{second:?} {third:?}"
    );
}

/// `iterations` steps of `trace` at `ratio` of its peak under a physical
/// budget, remat's default policy, `config` otherwise, and moves charged as
/// `remat replay` charges them (1 500 GB/s, the roofline's HBM).
fn replay_as_the_cli(
    trace: &remat_trace::Trace,
    ratio: f64,
    config: DtrConfig,
    iterations: usize,
) -> remat_dtr::replay::ReplayReport {
    remat_dtr::replay::replay_ratio_iterations(
        trace,
        ratio,
        BudgetMode::Physical,
        remat_dtr::PolicyKind::Remat,
        &config.with_move_bandwidth(Some(1500.0)),
        iterations,
    )
    .unwrap()
}

/// With `keep_read_again`, a regeneration that makes its step lose keeps
/// only what it reads again. T5-small at 0.4 of its peak (a PyTorch-logged
/// trace), without the ordered pass (`ordered_regen:off`, which otherwise
/// takes these regenerations first): the first step's losing regenerations
/// replay the forward for gradients read late. Kept whole to their end,
/// every replayed activation stays held though nothing in the regeneration
/// reads it again, and its room pushes the step's live gradients out, each
/// then regenerated in turn: 4.84× (past the goal of 3× at 0.4). Kept while
/// read again, the first step costs 2.53×; the steps after it follow the
/// same plan either way.
#[test]
fn a_kept_regeneration_can_hold_only_what_it_reads_again() {
    use remat_dtr::replay::ReplayStatus;
    let Some(path) = remat_trace::require_torch_trace(
        "a_kept_regeneration_can_hold_only_what_it_reads_again",
        "t5_small",
    ) else {
        return;
    };
    let trace = remat_trace::Trace::load(&path).unwrap();
    let run = |keep_read_again: bool| {
        replay_as_the_cli(
            &trace,
            0.4,
            DtrConfig::default()
                .with_ordered_regen(false)
                .with_keep_read_again(keep_read_again),
            2,
        )
    };
    let (all, read_again) = (run(false), run(true));
    for r in [&all, &read_again] {
        assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
        assert!(r.iterations[0].rescued, "{:?}", r.iterations);
        assert!(r.iterations[1].planned, "{:?}", r.iterations);
    }
    let (all, read_again) = (&all.iterations[0], &read_again.iterations[0]);
    assert!(read_again.overhead < 3.0, "{read_again:?}");
    assert!(read_again.overhead < all.overhead, "{read_again:?} {all:?}");
}

/// A regeneration that runs away replays what is left of its region once,
/// in order, where that pass fits (the default, `ordered_regen`). GPT-2 at
/// 0.5 of its peak (a PyTorch-logged trace): the first step's runaway
/// regeneration has 64 storages left to make when it starts to lose, one
/// pass of a few ms whose values peak far below the budget. Kept to its end
/// instead (`ordered_regen:off`), the work list replays it over and over
/// while its kept values push the step's own out: 3.83×, past the goal of
/// 3× at 0.5; ordered, 2.55×. The steps after it follow the same plan.
#[test]
fn a_runaway_regeneration_replays_its_region_once_where_it_fits() {
    use remat_dtr::replay::ReplayStatus;
    let Some(path) = remat_trace::require_torch_trace(
        "a_runaway_regeneration_replays_its_region_once_where_it_fits",
        "gpt2",
    ) else {
        return;
    };
    let trace = remat_trace::Trace::load(&path).unwrap();
    let run = |ordered: bool| {
        replay_as_the_cli(
            &trace,
            0.5,
            DtrConfig::default().with_ordered_regen(ordered),
            2,
        )
    };
    let (kept, ordered) = (run(false), run(true));
    for r in [&kept, &ordered] {
        assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
        assert!(r.iterations[0].rescued, "{:?}", r.iterations);
        assert!(r.iterations[1].planned, "{:?}", r.iterations);
    }
    let (kept, ordered) = (&kept.iterations[0], &ordered.iterations[0]);
    assert!(ordered.overhead < 3.0, "{ordered:?}");
    assert!(ordered.overhead < kept.overhead, "{ordered:?} {kept:?}");
}

/// Where the ordered pass over a region does not fit, `ordered_recompute`
/// drops values inside it and replays their ops again before their next
/// read until it fits. ResNet-50 at 0.3 of its peak (a PyTorch-logged
/// trace; the DTR authors' simulator finishes at 1.448): the later regions
/// of its first step peak at up to 1.5× what the budget leaves them and,
/// kept instead, the step costs 19.8×, just under the replayer's stop; with
/// the drops, 12.3×. Debug builds check each drop's price against the pass
/// it makes. Both plan the next step.
#[test]
fn a_pass_that_does_not_fit_recomputes_inside_it_on_resnet50_at_0_3() {
    use remat_dtr::replay::ReplayStatus;
    let Some(path) = remat_trace::require_torch_trace(
        "a_pass_that_does_not_fit_recomputes_inside_it_on_resnet50_at_0_3",
        "resnet50",
    ) else {
        return;
    };
    let trace = remat_trace::Trace::load(&path).unwrap();
    let run = |recompute: bool| {
        let config = DtrConfig::default().with_ordered_recompute(recompute);
        replay_as_the_cli(&trace, 0.3, config, 2)
    };
    let (kept, dropped) = (run(false), run(true));
    for r in [&kept, &dropped] {
        assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
        assert!(r.iterations[1].planned, "{:?}", r.iterations);
    }
    let (kept, dropped) = (&kept.iterations[0], &dropped.iterations[0]);
    assert!(dropped.overhead < kept.overhead, "{dropped:?} {kept:?}");
}

/// In an online step that is already losing, every regeneration replays
/// what is left of its region once, in order, where that fits, before its
/// first replay. treelstm at 0.2 of its peak (reference: the DTR authors'
/// simulator, 1.530): its backward makes a dozen regenerations of 1 000–2 400
/// storages sharing most of their regions, each replayed op by op pushing
/// out what the next needs, and its first step passed 20× (with the pass
/// only for runaways too). With it, the first step finishes and the second
/// follows a plan below the reference.
#[test]
fn a_losing_step_replays_each_region_once_and_treelstm_finishes_at_0_2() {
    use remat_dtr::replay::ReplayStatus;
    use remat_trace::require_traces;
    if require_traces("a_losing_step_replays_each_region_once_and_treelstm_finishes_at_0_2")
        .is_none()
    {
        return;
    }
    let path = remat_trace::find_trace("treelstm").expect("treelstm");
    let trace = remat_trace::Trace::load(&path).unwrap();
    let r = replay_as_the_cli(&trace, 0.2, DtrConfig::default(), 2);
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
    let (first, second) = (&r.iterations[0], &r.iterations[1]);
    assert!(first.rescued && first.overhead < 20.0, "{first:?}");
    assert!(second.planned && second.divergences == 0, "{second:?}");
    assert!(second.overhead < 1.530, "{second:?}");
}

/// Where no plan placed without moves fits, a plan moves blocks, and a
/// boundary without a plan says why. MobileNetV3 at 25 % of its peak,
/// physical budget: its `threshold_backward` holds 1.85 of the 2.14 GB, the
/// planner's schedules cost as little as 1.29× its computations, but their
/// static placements need 20–40 % over the budget, and shrinking the
/// simulated budget to make them fit reaches that op's working set. With
/// `plan_moves:off` every step runs online (2.10×) and the report names the
/// cheapest schedule and the arena it needed; by default the schedule is
/// simulated in a compacting arena and the plan repeats its compactions: the
/// steps after the first follow it, at its simulated cost, without a
/// divergence.
#[test]
fn where_no_placement_fits_a_plan_moves_blocks_or_says_why() {
    use remat_dtr::PlanStatus;
    let Some(path) = remat_trace::require_torch_trace(
        "where_no_placement_fits_a_plan_moves_blocks_or_says_why",
        "mobilenet_v3_large",
    ) else {
        return;
    };
    let trace = remat_trace::Trace::load(&path).unwrap();
    let budget = (remat_trace::baseline(&trace).unwrap().peak_bytes as f64 * 0.25) as u64;
    let run = |plan_moves: bool| {
        replay_as_the_cli(
            &trace,
            0.25,
            DtrConfig::default().with_plan_moves(plan_moves),
            3,
        )
    };
    let fixed = run(false);
    let first = &fixed.iterations[0];
    assert_eq!(first.planning, Some(PlanStatus::NoPlan), "{first:?}");
    let why = first.no_plan.expect("a no-plan boundary says why");
    assert!(why.over_budget > 0 && why.impossible > 0, "{why}");
    let (ns, arena) = why.cheapest_unplaced.expect("some schedule ran to the end");
    assert!(arena > budget && why.budget.abs_diff(budget) <= 1, "{why}");
    assert!(ns < why.bound_ns, "{why}");
    assert!(why.to_string().contains("needed a"), "{why}");
    assert!(fixed.iterations[1..].iter().all(|it| !it.planned));

    let moving = run(true);
    assert_eq!(moving.iterations[0].overhead, first.overhead);
    let plan = moving.iterations[0]
        .next_plan
        .as_ref()
        .expect("a plan that moves");
    assert!(plan.policy.ends_with("/moving"), "{}", plan.policy);
    for it in &moving.iterations[1..] {
        assert!(it.planned && it.divergences == 0, "{it:?}");
        assert!(it.defrag_ns > 0, "the moves are charged: {it:?}");
        assert!(
            (it.overhead - plan.overhead).abs() < 1e-9,
            "{it:?} {plan:?}"
        );
        assert!(it.overhead < 1.5 && it.overhead < first.overhead, "{it:?}");
    }
}

/// Where a fixed plan fits, an entry other than the winner may plan cheaper
/// with moves. transformer at 25 % of its peak, moves charged as the CLI
/// charges them: the cheapest fixed plan is a perturbed copy of
/// `learned:dead` placed under a shrunk budget (1.1434×); `learned:dead`'s own
/// schedule at the full budget cost less but its fixed placement passed the
/// budget. Simulated in the compacting arena at the full budget, it plans
/// 1.1353×, below the fixed plan and the reference (1.137); the step after
/// the first follows it at that cost, without a divergence.
#[test]
fn an_entry_whose_schedule_did_not_place_may_plan_cheaper_with_moves() {
    use remat_dtr::replay::ReplayStatus;
    use remat_trace::require_traces;
    if require_traces("an_entry_whose_schedule_did_not_place_may_plan_cheaper_with_moves").is_none()
    {
        return;
    }
    let path = remat_trace::find_trace("transformer").expect("transformer");
    let trace = remat_trace::Trace::load(&path).unwrap();
    let run = |plan_moves: bool| {
        replay_as_the_cli(
            &trace,
            0.25,
            DtrConfig::default().with_plan_moves(plan_moves),
            2,
        )
    };
    let (fixed, moving) = (run(false), run(true));
    for r in [&fixed, &moving] {
        assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.iterations);
        assert!(r.iterations[1].planned, "{:?}", r.iterations);
        assert_eq!(r.iterations[1].divergences, 0, "{:?}", r.iterations);
    }
    let plan = moving.iterations[0].next_plan.as_ref().expect("a plan");
    assert!(plan.policy.ends_with("/moving"), "{}", plan.policy);
    let (f, m) = (&fixed.iterations[1], &moving.iterations[1]);
    assert!((m.overhead - plan.overhead).abs() < 1e-9, "{m:?} {plan:?}");
    assert!(m.defrag_ns > 0, "the moves are charged: {m:?}");
    assert!(m.overhead < f.overhead, "{m:?} {f:?}");
}
