//! The evict/restore mechanism itself: memory really leaves, views share storage,
//! escapes, pins, impossible budgets, configuration, no leaks.

mod common;

use candle_core::{DType, Device, Storage, Tensor, Var};
use common::{bits, rand};
use remat_candle::{Budget, CandleErrorExt, Remat, RematConfig};
use remat_dtr::{BudgetMode, DtrConfig};

/// Elements actually held by the storage behind `t` (0 when evicted).
fn held_elems(t: &Tensor) -> usize {
    let (s, _) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(c) => c.as_slice::<f32>().map(|v| v.len()).unwrap_or(usize::MAX),
        _ => usize::MAX,
    }
}

#[test]
fn eviction_frees_the_storage_and_restores_it_bit_identically() {
    let remat = Remat::unbounded().unwrap();
    let x = remat.input(&rand(1, &[16, 16], -1.0, 1.0)).unwrap();
    let y = x.matmul(&x).unwrap().tanh().unwrap();
    let before = bits(&y.to_candle().unwrap());
    assert_eq!(held_elems(y.attached()), 256);
    assert!(y.evict().unwrap());
    assert!(!y.is_resident().unwrap());
    assert_eq!(
        held_elems(y.attached()),
        0,
        "evicted storage still holds data"
    );
    assert_eq!(remat.stats().unwrap().evictions, 1);
    let after = bits(&y.to_candle().unwrap());
    assert_eq!(before, after);
    assert_eq!(held_elems(y.attached()), 256);
    assert_eq!(y.recompute_count().unwrap(), 1);
    // Inputs are external: never evicted.
    assert!(!x.evict().unwrap());
}

#[test]
fn chains_rematerialize_through_evicted_ancestors() {
    let remat = Remat::unbounded().unwrap();
    let x = remat.input(&rand(2, &[64], -1.0, 1.0)).unwrap();
    let mut chain = vec![x.exp().unwrap()];
    for _ in 0..20 {
        let next = chain.last().unwrap().tanh().unwrap();
        chain.push(next);
    }
    let want = bits(&chain[20].to_candle().unwrap());
    for t in &chain {
        assert!(t.evict().unwrap());
    }
    assert_eq!(bits(&chain[20].to_candle().unwrap()), want);
    assert_eq!(remat.stats().unwrap().rematerializations, 21);
}

#[test]
fn views_share_storage_and_are_restored_together() {
    let remat = Remat::unbounded().unwrap();
    let x = remat.input(&rand(3, &[4, 6], -1.0, 1.0)).unwrap();
    let base = x.exp().unwrap();
    let t = base.t().unwrap();
    let n = base.narrow(1, 1, 3).unwrap();
    let r = base.reshape((2, 12)).unwrap();
    let sid = base.storage_id().unwrap();
    for v in [&t, &n, &r] {
        assert_eq!(v.storage_id().unwrap(), sid, "a view got its own storage");
    }
    let want_t = bits(&t.to_candle().unwrap());
    let want_n = bits(&n.to_candle().unwrap());
    assert!(
        n.evict().unwrap(),
        "evicting a view evicts the shared storage"
    );
    assert!(!base.is_resident().unwrap());
    assert_eq!(bits(&t.to_candle().unwrap()), want_t);
    assert!(base.is_resident().unwrap());
    assert_eq!(bits(&n.to_candle().unwrap()), want_n);
    assert_eq!(base.recompute_count().unwrap(), 1);
    // Views add no bytes.
    let s = remat.stats().unwrap();
    assert_eq!(s.live_bytes, 2 * 24 * 4);
}

#[test]
fn escapes_copy_and_keep_gradients_flowing() {
    let v = Var::from_tensor(&rand(4, &[3, 5], -1.0, 1.0)).unwrap();
    // Plain reference: exp then a plain candle tail.
    let pl = v
        .as_tensor()
        .exp()
        .unwrap()
        .sin()
        .unwrap()
        .sum_all()
        .unwrap();
    let pg = pl.backward().unwrap();

    let remat = Remat::unbounded().unwrap();
    let p = remat.param(&v).unwrap();
    let e = p.exp().unwrap();
    let esc = e.to_candle().unwrap();
    assert!(e.evict().unwrap(), "an escaped copy does not pin");
    let loss = esc.sin().unwrap().sum_all().unwrap();
    let g = loss.backward().unwrap();
    assert_eq!(bits(&loss), bits(&pl));
    assert_eq!(
        bits(g.get(v.as_tensor()).unwrap()),
        bits(pg.get(v.as_tensor()).unwrap())
    );
    // The escaped copy outlives the adapter tensor.
    drop(e);
    assert_eq!(esc.dims(), &[3, 5]);
    let _ = esc.sum_all().unwrap().to_scalar::<f32>().unwrap();
}

#[test]
fn pins_keep_storages_resident() {
    let remat = Remat::unbounded().unwrap();
    let x = remat.input(&rand(5, &[8], -1.0, 1.0)).unwrap();
    let y = x.exp().unwrap();
    {
        let p = y.pinned().unwrap();
        assert!(!y.evict().unwrap(), "a pinned tensor was evicted");
        // Plain candle may read it while pinned.
        assert_eq!(p.dims(), &[8]);
        let _ = p.sum_all().unwrap().to_scalar::<f32>().unwrap();
    }
    remat.flush().unwrap();
    assert!(y.evict().unwrap());
}

#[test]
fn impossible_budget_is_a_typed_error_with_figures() {
    let budget = 1_000u64;
    let remat = Remat::new(
        RematConfig::new()
            .with_budget_bytes(budget)
            .with_dtr(DtrConfig::default().with_budget_mode(BudgetMode::Logical)),
    )
    .unwrap();
    let x = remat.input(&rand(6, &[100], -1.0, 1.0)).unwrap(); // 400 B
    let y = x.exp().unwrap(); // 400 B: fits
                              // A (100, 100) outer product needs 40 000 B.
    let outer = y
        .reshape((100, 1))
        .unwrap()
        .matmul(&y.reshape((1, 100)).unwrap());
    let e = outer.expect_err("a 40 kB output fit a 1 kB budget");
    assert!(e.is_impossible_budget(), "{e}");
    let b = e.impossible_budget().unwrap();
    assert_eq!(b.needed, 100 * 100 * 4);
    assert_eq!(b.budget, budget);
    let msg = e.to_string();
    assert!(msg.contains("40000") && msg.contains("1000"), "{msg}");
    // The runtime is still consistent and usable.
    remat.check_invariants().unwrap();
    assert!(y.sum_all().is_ok());
}

#[test]
fn budgets_evict_automatically_and_results_match() {
    // 256 x 256 f32 = 256 KiB per tensor; 40 of them kept alive.
    let x0 = rand(7, &[256, 256], -0.05, 0.05);
    let run = |remat: &Remat| {
        let x = remat.input(&x0).unwrap();
        let mut h = x.clone();
        let mut keep = Vec::new();
        for _ in 0..20 {
            h = h.matmul(&x).unwrap().tanh().unwrap();
            keep.push(h.clone());
        }
        let s = keep
            .iter()
            .fold(keep[0].clone(), |acc, t| (&acc + t).unwrap());
        bits(&s.to_candle().unwrap())
    };
    for mode in [BudgetMode::Logical, BudgetMode::Physical] {
        let free = Remat::new(
            RematConfig::new()
                .with_budget_bytes(1 << 40)
                .with_dtr(DtrConfig::default().with_budget_mode(mode)),
        )
        .unwrap();
        let want = run(&free);
        assert_eq!(free.stats().unwrap().evictions, 0);
        let peak = free.memory_usage().unwrap().peak_allocated;
        let tight = Remat::new(
            RematConfig::new()
                .with_budget_fraction(0.4, peak)
                .with_dtr(DtrConfig::default().with_budget_mode(mode)),
        )
        .unwrap();
        assert_eq!(run(&tight), want, "{mode}: results differ under the budget");
        let s = tight.stats().unwrap();
        assert!(s.evictions > 0 && s.rematerializations > 0, "{mode}: {s}");
        let u = tight.memory_usage().unwrap();
        assert!(u.peak_reserved <= tight.budget().unwrap(), "{mode}: {u:?}");
        tight.check_invariants().unwrap();
    }
}

#[test]
fn config_parses_bytes_fractions_and_rejects_bad_values() {
    let c = RematConfig::parse("budget:40%,policy:lru").unwrap();
    assert_eq!(
        c.budget,
        Budget::Fraction {
            fraction: 0.4,
            of: 0
        }
    );
    assert_eq!(c.dtr.policy, remat_dtr::PolicyKind::Lru);
    let c = c.with_reference_bytes(1000);
    assert_eq!(c.budget.bytes(), Some(400));
    assert_eq!(
        RematConfig::parse("budget:0.25").unwrap().budget,
        Budget::Fraction {
            fraction: 0.25,
            of: 0
        }
    );
    assert_eq!(
        RematConfig::parse("budget:2MiB").unwrap().budget,
        Budget::Bytes(2 << 20)
    );
    assert!(RematConfig::parse("budget:-3%").is_err());
    assert!(RematConfig::parse("bogus:1").is_err());
    // A fraction without a reference cannot build a context.
    assert!(Remat::new(RematConfig::parse("budget:50%").unwrap()).is_err());
}

#[test]
fn tensors_of_two_contexts_do_not_mix() {
    let a = Remat::unbounded().unwrap();
    let b = Remat::unbounded().unwrap();
    let x = a
        .input(&Tensor::ones(3, DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    let y = b
        .input(&Tensor::ones(3, DType::F32, &Device::Cpu).unwrap())
        .unwrap();
    let e = x
        .add(&y)
        .expect_err("tensors of two contexts were combined");
    assert!(matches!(
        e.remat_error(),
        Some(remat_candle::Error::ContextMismatch { op: "add" })
    ));
}

#[test]
fn dropping_the_graph_frees_every_record() {
    let remat = Remat::unbounded().unwrap();
    let v = Var::from_tensor(&rand(8, &[8, 8], -1.0, 1.0)).unwrap();
    {
        let p = remat.param(&v).unwrap();
        let x = remat.input(&rand(9, &[4, 8], -1.0, 1.0)).unwrap();
        let h = x.matmul(&p).unwrap().relu().unwrap();
        let loss = h.sqr().unwrap().mean_all().unwrap();
        assert!(h.evict().unwrap());
        let grads = loss.backward().unwrap();
        assert!(grads.get(v.as_tensor()).is_some());
        assert!(remat.storage_count().unwrap() > 0);
    }
    remat.flush().unwrap();
    assert_eq!(remat.storage_count().unwrap(), 0);
    assert_eq!(remat.stats().unwrap().live_bytes, 0);
    remat.check_invariants().unwrap();
}

#[test]
fn contexts_and_tensors_cross_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Remat>();
    assert_send_sync::<remat_candle::RTensor>();
    let remat = Remat::unbounded().unwrap();
    let x = remat.input(&rand(10, &[16], -1.0, 1.0)).unwrap();
    let y = x.exp().unwrap();
    let want = bits(&y.to_candle().unwrap());
    let handle = std::thread::spawn(move || {
        assert!(y.evict().unwrap());
        bits(&y.to_candle().unwrap())
    });
    assert_eq!(handle.join().unwrap(), want);
    remat.flush().unwrap();
    drop(x);
    assert_eq!(remat.storage_count().unwrap(), 0);
}

#[test]
fn an_impossible_budget_during_backward_is_typed_too() {
    let remat = Remat::new(
        RematConfig::new()
            .with_budget_bytes(1_200)
            .with_dtr(DtrConfig::default().with_budget_mode(BudgetMode::Logical)),
    )
    .unwrap();
    let v = Var::from_tensor(&rand(11, &[100], -1.0, 1.0)).unwrap();
    let x = remat.param(&v).unwrap(); // 400 B
    let y = x.exp().unwrap(); // 400 B
    let loss = y.sum_all().unwrap(); // 4 B
    assert!(y.evict().unwrap());
    // 600 B of new external data: regenerating y (400 B) no longer fits.
    let other = remat.input(&rand(12, &[150], -1.0, 1.0)).unwrap();
    let err = loss
        .backward()
        .expect_err("backward fit an impossible budget");
    assert!(err.is_impossible_budget(), "{err}");
    assert_eq!(err.impossible_budget().unwrap().needed, 400);
    // Freeing the extra data makes the same backward possible.
    drop(other);
    remat.flush().unwrap();
    let g = loss.backward().unwrap();
    let want = v.as_tensor().exp().unwrap();
    assert_eq!(bits(g.get(v.as_tensor()).unwrap()), bits(&want));
}

#[test]
fn config_is_read_from_the_environment() {
    // Only this test touches the variable.
    std::env::set_var("REMAT_DTR_CONF", "budget:25%,budget_mode:logical");
    let c = RematConfig::from_env().unwrap().with_reference_bytes(4_000);
    std::env::remove_var("REMAT_DTR_CONF");
    assert_eq!(c.budget.bytes(), Some(1_000));
    assert_eq!(c.dtr.budget_mode, BudgetMode::Logical);
    let remat = Remat::new(c).unwrap();
    assert_eq!(remat.budget(), Some(1_000));
}
