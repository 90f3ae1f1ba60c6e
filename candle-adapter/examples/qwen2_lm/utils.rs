//! candle-transformers' `utils` (`crate::utils` in its model files) for both
//! trees of this example: `repeat_kv` over plain candle's `Tensor` (the
//! reference, upstream's code) and over remat-candle's `RTensor` (the port,
//! `remat_candle::transformers::utils::repeat_kv`).
use remat_candle::candle::{Result, Tensor};
use remat_candle::RTensor;

/// A tensor type candle-transformers' helpers run on.
pub trait KvTensor: Sized {
    /// `repeat_kv` for this tensor type.
    fn repeat_kv(self, n_rep: usize) -> Result<Self>;
}

impl KvTensor for Tensor {
    // candle-transformers 0.11.1, src/utils.rs (MIT OR Apache-2.0, the Candle authors).
    fn repeat_kv(self, n_rep: usize) -> Result<Self> {
        let xs = self;
        if n_rep == 1 {
            Ok(xs)
        } else {
            let (b_sz, n_kv_head, seq_len, head_dim) = xs.dims4()?;
            // Using cat is faster than a broadcast as it avoids going through a potentially
            // strided copy.
            // https://github.com/huggingface/candle/pull/2043
            Tensor::cat(&vec![&xs; n_rep], 2)?.reshape((b_sz, n_kv_head * n_rep, seq_len, head_dim))
        }
    }
}

impl KvTensor for RTensor {
    fn repeat_kv(self, n_rep: usize) -> Result<Self> {
        remat_candle::transformers::utils::repeat_kv(self, n_rep)
    }
}

/// candle-transformers' `utils::repeat_kv(xs, n_rep)`: the key/value heads of
/// grouped-query attention, each repeated `n_rep` times.
pub fn repeat_kv<T: KvTensor>(xs: T, n_rep: usize) -> Result<T> {
    xs.repeat_kv(n_rep)
}
