//! candle-transformers' `models` module for the plain-candle reference, laid out
//! as upstream so that `models/qwen2.rs` keeps its `crate::models::with_tracing`
//! import: `qwen2.rs` is candle-transformers' file with the reference swaps of
//! docs/candle.md ("Reference losses": `rope_slow` for `rope`, `softmax` for
//! `softmax_last_dim`, whose fused kernels have no backward in plain candle).
pub mod qwen2;
pub mod with_tracing;
