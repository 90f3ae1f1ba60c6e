//! A training-like step on a value-free `Runtime<()>`, shared by the
//! `plan_ahead` bench and the `planned_path` example: a forward chain of
//! `LAYERS` activations (each reads the one before and a weight), a backward
//! pass that reads them in reverse, an in-place update of each weight, then
//! `end_iteration`.

use std::sync::Arc;

use remat_dtr::{DtrConfig, FnOp, OpError, OpHandle, OutputSpec, Runtime, TensorId};

/// Layers of the step.
pub const LAYERS: usize = 400;
/// Bytes of each activation.
pub const ACT: u64 = 4 << 20;

/// The in-place weight update (not recomputable).
pub struct Update;
impl OpHandle<()> for Update {
    fn name(&self) -> &str {
        "update"
    }
    fn compute(&self, _: &[&()]) -> Result<Vec<()>, OpError> {
        Ok(vec![()])
    }
    fn recomputable(&self) -> bool {
        false
    }
}

/// One step; returns the number of runtime calls it made.
pub fn step(rt: &mut Runtime<()>, weights: &[TensorId], ops: &Ops) -> u64 {
    let [fwd, bwd, upd] = ops;
    let mut calls = 0u64;
    let x = rt.put((), ACT).expect("put");
    let mut acts = vec![x];
    for (i, &w) in weights.iter().enumerate() {
        let prev = acts[acts.len() - 1];
        let cost = 10_000 + (i as u64 % 7) * 1_000;
        acts.push(
            rt.apply(fwd.clone(), &[prev, w], &[OutputSpec::fresh(ACT)], cost)
                .expect("fwd")[0],
        );
    }
    calls += 1 + weights.len() as u64;
    let mut d = rt
        .apply(
            bwd.clone(),
            &[acts[acts.len() - 1]],
            &[OutputSpec::fresh(ACT)],
            5_000,
        )
        .expect("loss")[0];
    calls += 1;
    for (i, &w) in weights.iter().enumerate().rev() {
        let nd = rt
            .apply(
                bwd.clone(),
                &[d, acts[i], w],
                &[OutputSpec::fresh(ACT)],
                20_000,
            )
            .expect("bwd")[0];
        rt.mutate(upd.clone(), &[w, nd], &[0], 3_000)
            .expect("update");
        rt.release(d).expect("release");
        rt.release(acts[i + 1]).expect("release");
        d = nd;
        calls += 4;
    }
    rt.release(d).expect("release");
    rt.release(acts[0]).expect("release");
    calls += 2;
    rt.end_iteration().expect("end_iteration");
    calls
}

/// The forward, backward and update ops of a step.
pub type Ops = [Arc<dyn OpHandle<()>>; 3];

pub fn runtime(config: DtrConfig) -> (Runtime<()>, Vec<TensorId>, Ops) {
    let mut rt: Runtime<()> = Runtime::new(config).expect("runtime");
    let weights = (0..LAYERS)
        .map(|_| rt.put((), 64 << 10).expect("weight"))
        .collect();
    let f = |name: &'static str| -> Arc<dyn OpHandle<()>> {
        Arc::new(FnOp::new(name, |_: &[&()]| Ok::<_, OpError>(vec![()])))
    };
    (rt, weights, [f("fwd"), f("bwd"), Arc::new(Update)])
}
