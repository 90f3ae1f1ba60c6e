//! The host tier (issue 33): swapping instead of recomputing, chosen by cost;
//! parameters that leave the device between uses; copies that fail without
//! losing anything; the host budget; the config's typed errors.

use std::sync::{Arc, Mutex};

use remat_dtr::{
    BudgetMode, DtrConfig, Error, HostBudget, HostTransfer, HostValue, OutputSpec, PolicyKind,
    Runtime, TensorId, TransferError,
};

mod common;
use common::{mix, op};

/// A copy engine for `u64` values that counts its copies and fails on
/// request (the next `fail_out` swap-outs, the next `fail_in` swap-ins).
#[derive(Default)]
struct Faults {
    fail_out: u32,
    fail_in: u32,
    outs: u32,
    ins: u32,
    /// Declare the values immutable behind the runtime's back (clean copies).
    immutable: bool,
    /// Declare copies that run beside compute (copying ahead).
    background: bool,
    /// The values copied to the host, in order.
    copied: Vec<u64>,
}

struct Copier(Arc<Mutex<Faults>>);

impl HostTransfer<u64> for Copier {
    fn to_host(&mut self, value: &u64, bytes: u64) -> Result<HostValue, TransferError> {
        let mut f = self.0.lock().unwrap();
        if f.fail_out > 0 {
            f.fail_out -= 1;
            return Err(TransferError::to_host(bytes, "injected"));
        }
        f.outs += 1;
        f.copied.push(*value);
        Ok(HostValue::new(*value))
    }

    fn to_device(&mut self, host: &HostValue, bytes: u64) -> Result<u64, TransferError> {
        let mut f = self.0.lock().unwrap();
        if f.fail_in > 0 {
            f.fail_in -= 1;
            return Err(TransferError::to_device(bytes, "injected"));
        }
        f.ins += 1;
        host.downcast_ref::<u64>()
            .copied()
            .ok_or_else(|| TransferError::to_device(bytes, "not a u64"))
    }

    fn values_immutable(&self) -> bool {
        self.0.lock().unwrap().immutable
    }

    fn copies_in_background(&self) -> bool {
        self.0.lock().unwrap().background
    }
}

fn config(budget: u64, gbps: Option<f64>) -> DtrConfig {
    DtrConfig::default()
        .with_budget(budget)
        .with_budget_mode(BudgetMode::Logical)
        .with_policy(PolicyKind::DtrEq)
        .with_sampling(false)
        .with_plan_ahead(false)
        .with_swap(gbps)
}

fn runtime(config: DtrConfig) -> (Runtime<u64>, Arc<Mutex<Faults>>) {
    runtime_with(config, false)
}

fn runtime_with(config: DtrConfig, immutable: bool) -> (Runtime<u64>, Arc<Mutex<Faults>>) {
    runtime_copying(config, immutable, false)
}

fn runtime_copying(
    config: DtrConfig,
    immutable: bool,
    background: bool,
) -> (Runtime<u64>, Arc<Mutex<Faults>>) {
    let faults = Arc::new(Mutex::new(Faults {
        immutable,
        background,
        ..Faults::default()
    }));
    let mut rt = Runtime::new(config).unwrap();
    rt.set_host_transfer(Box::new(Copier(Arc::clone(&faults))))
        .unwrap();
    (rt, faults)
}

/// `layers` parameters of `bytes` each and a chain through them: a forward
/// pass whose every step reads one parameter. Returns the output's value.
fn forward(rt: &mut Runtime<u64>, params: &[TensorId], x: TensorId, bytes: u64) -> TensorId {
    forward_costing(rt, params, x, bytes, 1000)
}

/// [`forward`] with ops of `cost_ns` each.
fn forward_costing(
    rt: &mut Runtime<u64>,
    params: &[TensorId],
    x: TensorId,
    bytes: u64,
    cost_ns: u64,
) -> TensorId {
    let mut h = x;
    for (k, &p) in params.iter().enumerate() {
        let next = rt
            .apply(
                op(k as u64 + 7, 1),
                &[h, p],
                &[OutputSpec::fresh(bytes)],
                cost_ns,
            )
            .unwrap()[0];
        rt.check_invariants().unwrap();
        if h != x {
            rt.release(h).unwrap();
        }
        h = next;
    }
    h
}

fn expected(params: &[u64], x: u64) -> u64 {
    let mut h = x;
    for (k, &p) in params.iter().enumerate() {
        h = mix(mix(mix(k as u64 + 7, h), p), 0);
    }
    h
}

#[test]
fn parameters_leave_the_device_between_uses_and_come_back_bit_identical() {
    // Ten 100-byte parameters and a 100-byte activation under a 400-byte
    // budget: without swap the parameters alone (1 000 B, not recomputable)
    // do not fit.
    let values: Vec<u64> = (0..10).map(|k| mix(k, 99)).collect();
    let mut plain = Runtime::new(config(400, None)).unwrap();
    let mut failed = None;
    for &v in &values {
        if let Err(e) = plain.put(v, 100) {
            failed = Some(e);
            break;
        }
    }
    assert!(
        matches!(failed, Some(Error::ImpossibleBudget(_))),
        "without swap: {failed:?}"
    );

    let (mut rt, faults) = runtime(config(400, Some(24.0)));
    let params: Vec<TensorId> = values.iter().map(|&v| rt.put(v, 100).unwrap()).collect();
    let x = rt.put(5, 100).unwrap();
    for step in 0..3 {
        let y = forward(&mut rt, &params, x, 100);
        assert_eq!(*rt.access(y).unwrap(), expected(&values, 5), "step {step}");
        rt.release(y).unwrap();
    }
    let s = rt.stats();
    assert!(s.swap_outs >= 10 && s.swap_ins >= 10, "{s:?}");
    assert!(s.stall_ns > 0.0);
    assert!(s.peak_live_bytes <= 400);
    assert_eq!(s.swap_failures, 0);
    let f = faults.lock().unwrap();
    assert_eq!(
        (f.outs as u64, f.ins as u64),
        (s.swap_outs, s.swap_ins),
        "every swap is one copy"
    );
    drop(f);
    // Every parameter reads back its own value.
    for (&p, &v) in params.iter().zip(&values) {
        assert_eq!(*rt.access(p).unwrap(), v);
    }
    rt.check_invariants().unwrap();
}

#[test]
fn a_swap_does_not_cascade() {
    // A chain whose every link is expensive to recompute and cheap to copy:
    // reading its first link back after the chain ran costs one copy, no
    // replay.
    let (mut rt, _) = runtime(config(300, Some(1000.0)));
    let x = rt.put(1, 100).unwrap();
    let mut chain = vec![x];
    for k in 0..6 {
        let prev = *chain.last().unwrap();
        let t = rt
            .apply(op(k, 1), &[prev], &[OutputSpec::fresh(100)], 1_000_000)
            .unwrap()[0];
        chain.push(t);
        rt.check_invariants().unwrap();
    }
    let before = rt.stats().clone();
    let first = *rt.access(chain[1]).unwrap();
    let s = rt.stats();
    assert_eq!(s.rematerializations, before.rematerializations, "{s:?}");
    assert!(s.swap_ins > before.swap_ins);
    assert_eq!(first, mix(mix(0, 1), 0));
    assert_eq!(
        rt.stats().evictions,
        0,
        "recomputing costs 1 ms, a copy 0.2 µs"
    );
}

#[test]
fn cheap_ops_are_recomputed_not_swapped() {
    // A copy at 0.001 GB/s costs 200 000 ns for 100 bytes: recomputing a
    // 1 ns op is cheaper, so nothing recomputable is swapped.
    let (mut rt, _) = runtime(config(300, Some(0.001)));
    let x = rt.put(1, 100).unwrap();
    let mut prev = x;
    for k in 0..8 {
        prev = rt
            .apply(op(k, 1), &[prev], &[OutputSpec::fresh(100)], 1)
            .unwrap()[0];
    }
    rt.access(prev).unwrap();
    let s = rt.stats();
    assert!(s.evictions > 0, "{s:?}");
    assert_eq!(s.swap_outs, 0, "{s:?}");
}

/// The dry run names each victim's lever, as the runtime would choose it,
/// and changes nothing: a chain of 1 µs ops of 100 bytes, candidates all,
/// is recomputed at 0.001 GB/s (a copy costs 200 µs) and swapped at
/// 1 000 GB/s (0.2 ns); with swap off, every victim is recomputed.
#[test]
fn the_dry_run_names_each_victims_lever() {
    let levers = |gbps: Option<f64>| {
        let mut rt: Runtime<u64> = Runtime::new(config(10_000, gbps)).unwrap();
        if gbps.is_some() {
            rt.set_host_transfer(Box::new(Copier(Arc::default())))
                .unwrap();
        }
        let mut prev = rt.put(1, 100).unwrap();
        for k in 0..8 {
            prev = rt
                .apply(op(k, 1), &[prev], &[OutputSpec::fresh(100)], 1_000)
                .unwrap()[0];
        }
        let before = rt.stats().clone();
        let levers = rt.decide_levers(100);
        assert!(!levers.is_empty());
        let after = rt.stats();
        assert_eq!(
            (after.evictions, after.swap_outs),
            (before.evictions, before.swap_outs)
        );
        levers.into_iter().map(|(_, swap)| swap).collect::<Vec<_>>()
    };
    assert!(levers(None).iter().all(|&swap| !swap));
    assert!(levers(Some(0.001)).iter().all(|&swap| !swap));
    assert!(levers(Some(1000.0)).iter().all(|&swap| swap));
}

#[test]
fn a_failed_swap_out_leaves_the_value_resident_and_the_run_goes_on() {
    let (mut rt, faults) = runtime(config(400, Some(24.0)));
    let values: Vec<u64> = (0..6).map(|k| mix(k, 3)).collect();
    let params: Vec<TensorId> = values.iter().map(|&v| rt.put(v, 100).unwrap()).collect();
    let x = rt.put(9, 100).unwrap();
    faults.lock().unwrap().fail_out = 3;
    let y = forward(&mut rt, &params, x, 100);
    assert_eq!(*rt.access(y).unwrap(), expected(&values, 9));
    let s = rt.stats();
    assert_eq!(s.swap_failures, 3, "{s:?}");
    for (&p, &v) in params.iter().zip(&values) {
        assert_eq!(*rt.access(p).unwrap(), v);
    }
    rt.check_invariants().unwrap();
}

#[test]
fn a_failed_swap_in_is_a_typed_error_that_loses_nothing() {
    let (mut rt, faults) = runtime(config(300, Some(24.0)));
    let a = rt.put(11, 100).unwrap();
    let b = rt.put(22, 100).unwrap();
    let c = rt.put(33, 100).unwrap();
    // A fourth cannot fit without swapping one of the three out.
    let d = rt.put(44, 100).unwrap();
    let swapped: Vec<TensorId> = [a, b, c]
        .into_iter()
        .filter(|&t| rt.is_swapped(t).unwrap())
        .collect();
    assert_eq!(swapped.len(), 1);
    let t = swapped[0];
    faults.lock().unwrap().fail_in = 1;
    match rt.access(t) {
        Err(Error::Transfer(e)) => assert_eq!(e.direction, "host-to-device"),
        other => panic!("expected a transfer error, got {other:?}"),
    }
    rt.check_invariants().unwrap();
    assert!(rt.is_swapped(t).unwrap(), "the host copy stays");
    // The device is usable and the value intact: the next read succeeds.
    let want = [(a, 11), (b, 22), (c, 33), (d, 44)];
    for (t, v) in want {
        assert_eq!(*rt.access(t).unwrap(), v);
    }
    rt.check_invariants().unwrap();
}

#[test]
fn the_host_budget_is_kept_and_a_full_host_tier_is_an_impossible_budget() {
    let c = config(300, Some(24.0)).with_host_budget(Some(HostBudget::Bytes(200)));
    let (mut rt, _) = runtime(c);
    let ts: Vec<TensorId> = (0..5).map(|k| rt.put(k, 100).unwrap()).collect();
    assert_eq!(rt.stats().host_bytes, 200);
    // A sixth: 300 B on the device, 200 B on the host, nothing recomputable.
    match rt.put(5, 100) {
        Err(Error::ImpossibleBudget(_)) => {}
        other => panic!("expected an impossible budget, got {other:?}"),
    }
    assert!(rt.stats().swap_refusals > 0);
    rt.check_invariants().unwrap();
    // Both tiers are full: reading a swapped one back needs device room, which
    // a swap-out would make only with host room. Typed, not a hang.
    let swapped = *ts.iter().find(|&&t| rt.is_swapped(t).unwrap()).unwrap();
    assert!(matches!(
        rt.access(swapped),
        Err(Error::ImpossibleBudget(_))
    ));
    rt.check_invariants().unwrap();
    // Drop one resident tensor: then every other reads back, each read that
    // swaps in making host room for the next swap-out.
    let resident = *ts.iter().find(|&&t| !rt.is_swapped(t).unwrap()).unwrap();
    rt.release(resident).unwrap();
    for (k, &t) in ts.iter().enumerate().filter(|&(_, &t)| t != resident) {
        assert_eq!(*rt.access(t).unwrap(), k as u64);
        rt.check_invariants().unwrap();
    }
    assert!(rt.stats().peak_host_bytes <= 200);
}

#[test]
fn swap_on_without_a_bandwidth_names_the_key() {
    let mut c = config(300, None);
    c.swap.enabled = true;
    let mut rt: Runtime<u64> = Runtime::new(c).unwrap();
    let e = rt
        .set_host_transfer(Box::new(Copier(Arc::default())))
        .unwrap_err();
    assert!(e.to_string().contains("swap_bandwidth"), "{e}");
    assert!(!rt.swap_enabled());
    // Swap off in the config: the transfer is kept unused.
    let mut rt: Runtime<u64> = Runtime::new(config(300, None)).unwrap();
    rt.set_host_transfer(Box::new(Copier(Arc::default())))
        .unwrap();
    assert!(!rt.swap_enabled());
}

#[test]
fn training_steps_swap_across_boundaries_bit_identically() {
    // Parameters updated in place each step (a new version by `mutate`),
    // under a budget smaller than the parameters: three steps with swap equal
    // three steps without a budget.
    let run = |budget: Option<u64>| -> Vec<u64> {
        let mut c = config(budget.unwrap_or(u64::MAX), Some(24.0)).with_plan_ahead(true);
        c.budget = budget;
        let (mut rt, _) = runtime(c);
        let params: Vec<TensorId> = (0..8).map(|k| rt.put(mix(k, 1), 100).unwrap()).collect();
        let mut losses = Vec::new();
        for step in 0..3u64 {
            let x = rt.put(step, 100).unwrap();
            let y = forward(&mut rt, &params, x, 100);
            losses.push(*rt.access(y).unwrap());
            rt.release(y).unwrap();
            rt.release(x).unwrap();
            for &p in &params {
                rt.mutate(op(100 + step, 1), &[p], &[0], 10).unwrap();
            }
            rt.end_iteration().unwrap();
            rt.check_invariants().unwrap();
        }
        for &p in &params {
            losses.push(*rt.access(p).unwrap());
        }
        losses
    };
    assert_eq!(run(Some(400)), run(None));
}

#[test]
fn clean_host_copies_make_a_second_swap_out_free_and_a_pin_drops_them() {
    let values: Vec<u64> = (0..10).map(|k| mix(k, 5)).collect();
    let (mut rt, faults) = runtime_with(config(400, Some(24.0)), true);
    let params: Vec<TensorId> = values.iter().map(|&v| rt.put(v, 100).unwrap()).collect();
    let x = rt.put(5, 100).unwrap();
    let mut stalls = Vec::new();
    for _ in 0..3 {
        let before = rt.stats().stall_ns;
        let y = forward(&mut rt, &params, x, 100);
        assert_eq!(*rt.access(y).unwrap(), expected(&values, 5));
        rt.release(y).unwrap();
        stalls.push(rt.stats().stall_ns - before);
    }
    let s = rt.stats().clone();
    assert!(s.clean_swap_outs > 0, "{s:?}");
    // Every copy the engine made is a swap-out that was not clean.
    let f = faults.lock().unwrap();
    assert_eq!(f.outs as u64, s.swap_outs - s.clean_swap_outs);
    drop(f);
    // The second pass copies back in but not out again: it stalls less.
    assert!(stalls[1] < stalls[0], "{stalls:?}");
    rt.check_invariants().unwrap();
    // A pin hands the value out: its clean copy goes, and the next swap-out
    // copies again.
    let p = params[0];
    rt.pin(p).unwrap();
    assert_eq!(*rt.access(p).unwrap(), values[0]);
    rt.check_invariants().unwrap();
    rt.unpin(p).unwrap();
    for (&p, &v) in params.iter().zip(&values) {
        assert_eq!(*rt.access(p).unwrap(), v);
    }
    rt.check_invariants().unwrap();
}

#[test]
fn copying_ahead_frees_the_same_victims_sooner() {
    // Ten parameters through a 400-byte budget, three passes, copy-ahead on
    // and off (and on, with a transfer that cannot copy in the background).
    // Ops of 100 ns against copies of 100 B at 1 GB/s: a copy takes as long
    // as an op, so the engine is idle between the swap-outs a pass needs.
    let values: Vec<u64> = (0..10).map(|k| mix(k, 11)).collect();
    let run = |ahead: bool, background: bool| {
        let mut c = config(400, Some(1.0));
        c.swap.copy_ahead = ahead;
        let (mut rt, faults) = runtime_copying(c, true, background);
        let params: Vec<TensorId> = values.iter().map(|&v| rt.put(v, 100).unwrap()).collect();
        let x = rt.put(5, 100).unwrap();
        for _ in 0..3 {
            let y = forward_costing(&mut rt, &params, x, 100, 100);
            assert_eq!(*rt.access(y).unwrap(), expected(&values, 5));
            rt.release(y).unwrap();
            rt.check_invariants().unwrap();
        }
        for (&p, &v) in params.iter().zip(&values) {
            assert_eq!(*rt.access(p).unwrap(), v);
        }
        let copies = faults.lock().unwrap().outs;
        (rt.stats().clone(), copies)
    };
    let (off, off_copies) = run(false, true);
    let (on, on_copies) = run(true, true);
    let (sync, sync_copies) = run(true, false);
    // The same victims, taken the same way.
    assert_eq!(
        (on.swap_outs, on.evictions, on.swap_ins),
        (off.swap_outs, off.evictions, off.swap_ins)
    );
    // Copied ahead: more swap-outs find their copy made, and the passes
    // wait less for copies out.
    assert!(on.clean_swap_outs > off.clean_swap_outs, "{on:?}\n{off:?}");
    assert!(
        on.stall_ns < off.stall_ns,
        "{} vs {}",
        on.stall_ns,
        off.stall_ns
    );
    assert!(on_copies >= off_copies);
    // A transfer whose copies take the caller's time copies nothing ahead.
    assert_eq!((sync.stall_ns, sync_copies), (off.stall_ns, off_copies));
}

#[test]
fn a_copy_ahead_passes_over_what_would_be_recomputed() {
    // A parameter read by an op whose 100 B output costs 1 ns to replay,
    // against a round trip of 200 ns at 1 GB/s: were the output the victim,
    // it would be evicted for recomputation, and a copy of it wasted. The
    // output is as old as the parameter (the same op), and comes first in
    // last-use order; the copy ahead takes the parameter.
    let (mut rt, faults) = runtime_copying(config(1000, Some(1.0)), true, true);
    let p = rt.put(41, 100).unwrap();
    let a = rt
        .apply(op(3, 1), &[p], &[OutputSpec::fresh(100)], 1)
        .unwrap()[0];
    assert_eq!(rt.stats().copies_ahead, 1);
    assert_eq!(faults.lock().unwrap().copied, vec![41]);
    // With nothing left that would be swapped, the oldest is copied: it may
    // be swapped later, once its neighbourhood is evicted. (A view of the
    // output, made once the engine is idle again: no new storage.)
    let v = rt.apply(op(4, 0), &[a], &[OutputSpec::View { input: 0 }], 1000);
    let v = v.unwrap()[0];
    assert_eq!(rt.stats().copies_ahead, 2);
    let a_value = *rt.access(a).unwrap();
    assert_eq!(a_value, mix(mix(3, 41), 0));
    assert_eq!(faults.lock().unwrap().copied, vec![41, a_value]);
    assert_eq!(*rt.access(v).unwrap(), a_value);
    rt.check_invariants().unwrap();
}

#[test]
fn a_long_op_keeps_the_engine_copying_ahead_through_it() {
    // Three parameters of 100 B at 1 GB/s (100 ns a copy) read by one op of
    // 250 ns: the engine is kept busy for as long again as the op took, so
    // all three are copied ahead at its end (the last issued 200 ns in), not
    // one. The op's 600 B output costs less to replay (250 ns) than to swap
    // (1 200 ns): passed over.
    let (mut rt, faults) = runtime_copying(config(1000, Some(1.0)), true, true);
    let ps: Vec<TensorId> = (0..3).map(|k| rt.put(40 + k, 100).unwrap()).collect();
    let y = rt
        .apply(op(5, 1), &ps, &[OutputSpec::fresh(600)], 250)
        .unwrap()[0];
    assert_eq!(rt.stats().copies_ahead, 3);
    assert_eq!(faults.lock().unwrap().copied, vec![40, 41, 42]);
    let expected = mix(mix(mix(mix(5, 40), 41), 42), 0);
    assert_eq!(*rt.access(y).unwrap(), expected);
    rt.check_invariants().unwrap();
}

#[test]
fn a_full_host_budget_drops_clean_copies_before_refusing() {
    let c = config(300, Some(24.0)).with_host_budget(Some(HostBudget::Bytes(300)));
    let (mut rt, _) = runtime_with(c, true);
    let ts: Vec<TensorId> = (0..5).map(|k| rt.put(k, 100).unwrap()).collect();
    // Read everything back twice: swap-ins keep clean copies, which fill the
    // host tier; later swap-outs of other storages must make room by dropping
    // them, never by refusing while clean copies remain.
    for _ in 0..2 {
        for (k, &t) in ts.iter().enumerate() {
            assert_eq!(*rt.access(t).unwrap(), k as u64);
            rt.check_invariants().unwrap();
        }
    }
    let s = rt.stats();
    assert!(s.peak_host_bytes <= 300, "{s:?}");
    assert_eq!(s.swap_refusals, 0, "{s:?}");
}

#[test]
fn plans_swap_parameters_and_are_followed_without_divergence() {
    // Ten parameters that do not fit beside the activations: every step
    // must swap. From the third step on, a plan (made from the step before,
    // swaps included) is followed to the end, and the values are those of
    // an unbounded run.
    let run = |budget: Option<u64>| -> (Vec<u64>, Vec<(bool, u32, u64)>) {
        let mut c = config(budget.unwrap_or(u64::MAX), Some(24.0)).with_plan_ahead(true);
        c.budget = budget;
        let (mut rt, _) = runtime_with(c, true);
        let params: Vec<TensorId> = (0..10).map(|k| rt.put(mix(k, 2), 100).unwrap()).collect();
        let mut out = Vec::new();
        let mut followed = Vec::new();
        for step in 0..5u64 {
            let swaps = rt.stats().swap_outs;
            let x = rt.put(step, 100).unwrap();
            let y = forward(&mut rt, &params, x, 100);
            out.push(*rt.access(y).unwrap());
            rt.release(y).unwrap();
            rt.release(x).unwrap();
            let swaps = rt.stats().swap_outs - swaps;
            let report = rt.end_iteration().unwrap();
            followed.push((report.planned, report.divergences, swaps));
            rt.check_invariants().unwrap();
        }
        for &p in &params {
            out.push(*rt.access(p).unwrap());
        }
        (out, followed)
    };
    let (plain, _) = run(None);
    let (swapped, followed) = run(Some(500));
    assert_eq!(swapped, plain);
    assert!(
        followed[2..]
            .iter()
            .all(|&(p, d, swaps)| p && d == 0 && swaps > 0),
        "steps 3 to 5 follow their plans, which swap: {followed:?}"
    );
}

#[test]
fn replaying_an_op_leaves_its_swapped_sibling_in_the_host_tier() {
    // A two-output op: one output swapped, the other evicted; reading the
    // evicted one replays the op, and the swapped one stays swapped (its host
    // copy is not orphaned by a refill).
    let (mut rt, _) = runtime(config(300, Some(1000.0)));
    let x = rt.put(1, 100).unwrap();
    let ab = rt
        .apply(
            op(1, 2),
            &[x],
            &[OutputSpec::fresh(100), OutputSpec::fresh(100)],
            1_000_000,
        )
        .unwrap();
    let (a, b) = (ab[0], ab[1]);
    let mut k = 2;
    while !rt.is_swapped(b).unwrap() {
        assert!(k < 50, "b was never swapped");
        rt.put(k, 100).unwrap();
        rt.access(x).unwrap();
        k += 1;
    }
    assert!(rt.evict(a).unwrap());
    let host = rt.stats().host_bytes;
    assert_eq!(*rt.access(a).unwrap(), mix(mix(1, 1), 0));
    rt.check_invariants().unwrap();
    assert!(rt.is_swapped(b).unwrap());
    assert_eq!(rt.stats().host_bytes, host);
    assert_eq!(*rt.access(b).unwrap(), mix(mix(1, 1), 1));
    rt.check_invariants().unwrap();
}

#[test]
fn a_followed_plan_prefetches_its_swap_ins() {
    // Physical budget: a followed plan places every allocation in its arena,
    // so it knows when a swap-in's destination comes free and starts the
    // copy then, not at the read. Twelve 1 MiB parameters under a budget of
    // seven and a half: every step swaps most of them out and back. Each op
    // computes for 100 µs, longer than a 1 MiB copy at 24 GB/s (44 µs), so a
    // prefetched copy can hide behind compute where the plan leaves its
    // destination free early enough (the planner places each swap-in's
    // destination from when its copy must start, and simulates with room
    // for that); online, each swap-in is read at once.
    const MB: u64 = 1 << 20;
    let run = |budget: Option<u64>| {
        let mut c = config(u64::MAX, Some(24.0))
            .with_plan_ahead(true)
            .with_budget_mode(BudgetMode::Physical);
        c.budget = budget;
        let (mut rt, _) = runtime_with(c, true);
        let params: Vec<TensorId> = (0..12).map(|k| rt.put(mix(k, 3), MB).unwrap()).collect();
        let mut out = Vec::new();
        let mut steps = Vec::new();
        for step in 0..4u64 {
            let before = rt.stats().clone();
            let x = rt.put(step, MB).unwrap();
            let y = forward_costing(&mut rt, &params, x, MB, 100_000);
            out.push(*rt.access(y).unwrap());
            rt.release(y).unwrap();
            rt.release(x).unwrap();
            let s = rt.stats();
            let prefetches = s.prefetches - before.prefetches;
            let swap_ins = s.swap_ins - before.swap_ins;
            let report = rt.end_iteration().unwrap();
            steps.push((
                report.planned,
                report.divergences,
                swap_ins,
                prefetches,
                report.stall_ns,
            ));
            rt.check_invariants().unwrap();
        }
        (out, steps)
    };
    let (plain, _) = run(None);
    let (swapped, steps) = run(Some(7 * MB + MB / 2));
    assert_eq!(swapped, plain, "bit-identical to an unbounded run");
    let (planned, divergences, swap_ins, prefetches, stall) = steps[3];
    let online_stall = steps[0].4;
    assert!(
        planned && divergences == 0 && swap_ins > 0 && prefetches == swap_ins,
        "the fourth step follows its plan and prefetches every swap-in: {steps:?}"
    );
    assert!(
        stall < online_stall / 2.0,
        "prefetched copies hide behind compute: {steps:?}"
    );
}

#[test]
fn a_regeneration_out_of_room_swaps_what_it_parked_instead_of_dropping_it() {
    // `z` reads `a` and `b`, each evicted and regenerated from an evicted
    // 100 B input. Regenerating `b` with `a` held needs 300 B under a 250 B
    // budget, so the regeneration's last resort takes back what it parked:
    // `a`. Dropped, `a` would need its own input beside the held `b` (300 B
    // again), and the two would evict each other until the budget was called
    // impossible; swapped, it comes back alone. Recomputing is far cheaper
    // than a copy here (1 ns against 100 µs), so only the last resort swaps.
    let (mut rt, faults) = runtime(config(251, Some(0.001)));
    let x = rt.put(1, 1).unwrap();
    let one = |rt: &mut Runtime<u64>, seed: u64, input: TensorId| {
        rt.apply(op(seed, 1), &[input], &[OutputSpec::fresh(100)], 1)
            .unwrap()[0]
    };
    let ca = one(&mut rt, 1, x);
    let a = one(&mut rt, 2, ca);
    let cb = one(&mut rt, 3, x);
    let b = one(&mut rt, 4, cb);
    for t in [ca, a, cb, b] {
        rt.evict(t).unwrap();
    }
    for t in [ca, cb] {
        rt.release(t).unwrap();
    }
    let z = rt
        .apply(op(5, 1), &[a, b], &[OutputSpec::fresh(10)], 1)
        .unwrap()[0];
    let va = mix(mix(2, mix(mix(1, 1), 0)), 0);
    let vb = mix(mix(4, mix(mix(3, 1), 0)), 0);
    assert_eq!(*rt.access(z).unwrap(), mix(mix(mix(5, va), vb), 0));
    assert!(faults.lock().unwrap().outs >= 1, "{:?}", rt.stats());
    assert!(rt.stats().parked_evictions >= 1, "{:?}", rt.stats());
    rt.check_invariants().unwrap();
}
