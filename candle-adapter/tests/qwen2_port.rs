//! candle-transformers' Qwen2 file, ported by changing its imports
//! (`examples/qwen2_lm/qwen2.rs`), trains bit-identically to the same file in
//! plain candle (`examples/qwen2_lm/models/qwen2.rs`, with the reference swaps
//! for fused kernels that have no backward): unconstrained and at 100 %, 50 % and
//! 30 % of its measured activation peak, in the default (physical) mode and in
//! logical mode. Losses and every parameter are compared bit for bit.

// The reference's `use candle::…` (candle-transformers names candle-core `candle`).
extern crate candle_core as candle;

#[allow(dead_code, clippy::all)]
#[path = "../examples/qwen2_lm/models/mod.rs"]
mod models;
#[allow(dead_code, clippy::all)]
#[path = "../examples/qwen2_lm/qwen2.rs"]
mod qwen2;
#[path = "../examples/shared/setup.rs"]
mod setup;
#[path = "../examples/qwen2_lm/train.rs"]
mod train;
#[path = "../examples/qwen2_lm/utils.rs"]
mod utils;

use remat_candle::{BudgetMode, DtrConfig};
use train::Size;

const SIZE: Size = Size {
    vocab: 64,
    hidden: 32,
    intermediate: 64,
    layers: 2,
    heads: 4,
    kv_heads: 2,
    seq: 16,
    batch: 4,
    steps: 3,
};

fn check(dtr: DtrConfig) {
    let plain = train::train_plain(&SIZE).unwrap();
    assert!(
        plain.losses[SIZE.steps - 1] < plain.losses[0],
        "the reference does not learn: {:?}",
        plain.losses
    );
    let free = train::train_remat(&SIZE, dtr.clone(), None).unwrap();
    assert!(
        free.same_as(&plain),
        "unconstrained: {:?} vs plain {:?}",
        free.losses,
        plain.losses
    );
    assert_eq!(free.evictions, 0);
    let act = free.peak - free.external;
    for pct in [100u64, 50, 30] {
        let budget = free.external + act * pct / 100;
        let r = train::train_remat(&SIZE, dtr.clone(), Some(budget)).unwrap();
        assert!(
            r.same_as(&plain),
            "{pct} %: losses {:?} vs plain {:?} (or parameters differ)",
            r.losses,
            plain.losses
        );
        assert!(
            r.peak <= budget,
            "{pct} %: peak {} > budget {budget}",
            r.peak
        );
        if pct < 100 {
            assert!(r.evictions > 0 && r.remats > 0, "{pct} %: nothing evicted");
        }
    }
}

#[test]
fn qwen2_port_trains_bit_identically_physical() {
    check(DtrConfig::default());
}

#[test]
fn qwen2_port_trains_bit_identically_logical() {
    check(DtrConfig::default().with_budget_mode(BudgetMode::Logical));
}
