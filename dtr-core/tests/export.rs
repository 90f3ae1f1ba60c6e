//! A recorded iteration exported as a trace (`Recording::to_trace`): the
//! trace replays without a budget to the recorded step's peak and compute
//! exactly, and trains under a budget over several iterations with plan-ahead.

use remat_dtr::replay::{replay, ReplayOptions, ReplayStatus};
use remat_dtr::{BudgetMode, DtrConfig, Error, OutputSpec, Runtime, TensorId};
use remat_trace::{baseline, Instruction, Trace};

mod common;
use common::op;

const LAYERS: [u64; 5] = [1024, 3072, 2048, 4096, 1536];

/// A training step with what the exporter maps: a label put during the step,
/// a view, a second handle (retain) on an activation, an op with two outputs,
/// in-place parameter updates, releases.
fn step(rt: &mut Runtime<u64>, params: &[TensorId], input: TensorId) -> Result<(), Error> {
    let label = rt.put(3, 128)?;
    let mut acts = vec![input];
    for (k, &bytes) in LAYERS.iter().enumerate() {
        let x = *acts.last().unwrap();
        let y = rt.apply(
            op(k as u64, 1),
            &[x, params[k]],
            &[OutputSpec::fresh(bytes)],
            100 + k as u64,
        )?[0];
        acts.push(y);
    }
    let view = rt.apply(op(50, 0), &[acts[2]], &[OutputSpec::view(0)], 1)?[0];
    rt.retain(acts[1])?;
    let loss = rt.apply(
        op(99, 1),
        &[acts[LAYERS.len()], label],
        &[OutputSpec::fresh(512)],
        10,
    )?[0];
    rt.access(loss)?;
    let mut grad = loss;
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
    rt.release(view)?;
    rt.release(acts[1])?; // the retained handle
    for t in acts.drain(1..) {
        rt.release(t)?;
    }
    rt.release(label)
}

/// An unbudgeted run that records its second step: the runtime, the step's
/// compute (ns) and the run's peak of live bytes.
fn recorded() -> (Runtime<u64>, f64, u64) {
    let mut rt = Runtime::new(DtrConfig::default().with_sampling(false)).unwrap();
    rt.record_iterations();
    let params: Vec<TensorId> = (0..LAYERS.len() as u64)
        .map(|k| rt.put(k + 1, 256).unwrap())
        .collect();
    let input = rt.put(7, 1024).unwrap();
    // A second handle on a parameter across steps (a tied weight).
    rt.retain(params[0]).unwrap();
    rt.end_iteration().unwrap();
    let mut compute = 0.0;
    for _ in 0..2 {
        step(&mut rt, &params, input).unwrap();
        compute = rt.end_iteration().unwrap().compute_ns;
    }
    let peak = rt.stats().peak_live_bytes;
    (rt, compute, peak)
}

#[test]
fn an_exported_step_replays_to_its_peak_and_compute() {
    let (rt, compute, peak) = recorded();
    let trace = rt.export_trace("mlp").unwrap();
    let rec = rt.last_recording().unwrap();
    assert_eq!(rec.compute_ns() as f64, compute);
    // The file format round trip.
    assert_eq!(Trace::parse("mlp", &trace.to_jsonl()).unwrap(), trace);
    let base = baseline(&trace).unwrap();
    assert_eq!(base.peak_bytes, peak, "remat-trace's baseline peak");
    assert_eq!(
        base.compute_ns as f64, compute,
        "remat-trace's baseline compute"
    );
    let r = replay(&trace, &ReplayOptions::unbounded(), base.compute_ns).unwrap();
    assert_eq!(r.status, ReplayStatus::Ok);
    assert_eq!(r.peak_live_bytes, peak, "the replayer's peak");
    assert_eq!(r.total_compute_ns as f64, compute, "the replayer's compute");
    // What the step did is in the file: the ops with their names and costs,
    // the view, the copies for the second handles, the in-place updates.
    let ins = &trace.instructions;
    let calls = ins
        .iter()
        .filter(|i| matches!(i, Instruction::Call { .. }))
        .count();
    let mutates = ins
        .iter()
        .filter(|i| matches!(i, Instruction::Mutate { .. }))
        .count();
    // The ops, and one read (the loss).
    assert_eq!((calls, mutates), (2 * LAYERS.len() + 3, LAYERS.len()));
    assert!(ins
        .iter()
        .any(|i| matches!(i, Instruction::Alias { alias: 0, .. })));
    assert_eq!(
        ins.iter()
            .filter(|i| matches!(i, Instruction::Copy { .. }))
            .count(),
        2
    );
    assert!(ins
        .iter()
        .any(|i| matches!(i, Instruction::Call { op, time_ns: 102, .. } if op == "op2")));
}

#[test]
fn an_exported_step_trains_under_a_budget_over_iterations() {
    let (rt, _, peak) = recorded();
    let trace = rt.export_trace("mlp").unwrap();
    let base = baseline(&trace).unwrap();
    let budget = base.constant_bytes + (peak - base.constant_bytes) * 6 / 10;
    let mut opts = ReplayOptions::unbounded();
    opts.config = DtrConfig::default()
        .with_budget(budget)
        .with_budget_mode(BudgetMode::Logical);
    opts.iterations = 3;
    let r = replay(&trace, &opts, base.compute_ns).unwrap();
    assert_eq!(r.status, ReplayStatus::Ok, "{:?}", r.error);
    assert!(r.peak_live_bytes <= budget);
    assert!(r.evictions > 0);
}

#[test]
fn exporting_before_a_recorded_step_says_what_is_missing() {
    let rt: Runtime<u64> = Runtime::new(DtrConfig::default()).unwrap();
    match rt.export_trace("x") {
        Err(Error::NotRecorded { why }) => assert!(why.contains("record_iterations"), "{why}"),
        other => panic!("expected NotRecorded, got {other:?}"),
    }
    let bad = remat_dtr::Recording {
        events: vec![remat_dtr::Event::Release(remat_dtr::Ref::New(4))],
        ..Default::default()
    };
    let e = bad.to_trace("bad").unwrap_err();
    assert!(e.to_string().contains("event 0 (release)"), "{e}");
}
