//! candle-transformers' shared helpers over [`RTensor`](crate::RTensor), under their names: its
//! model files call `crate::utils::repeat_kv(..)` and import
//! `crate::models::with_tracing::{..}`. A crate that copies such a file gives it
//! `mod utils { pub use remat_candle::transformers::utils::*; }` (or imports from
//! here), and `remat_candle::nn::with_tracing` (also
//! [`models::with_tracing`]) for the layers.

/// candle-transformers' `utils` (0.11.1): the same code over [`RTensor`](crate::RTensor).
pub mod utils {
    use candle_core::Device;

    use crate::error::Result;
    use crate::tensor::RTensor;

    /// Repeat each key/value head `n_rep` times (grouped-query attention):
    /// `(b, n_kv, t, d)` to `(b, n_kv · n_rep, t, d)`, as candle-transformers does
    /// it: one `cat` along the sequence axis, then a reshape.
    pub fn repeat_kv(xs: RTensor, n_rep: usize) -> Result<RTensor> {
        if n_rep == 1 {
            Ok(xs)
        } else {
            let (b_sz, n_kv_head, seq_len, head_dim) = xs.dims4()?;
            RTensor::cat(&vec![&xs; n_rep], 2)?.reshape((
                b_sz,
                n_kv_head * n_rep,
                seq_len,
                head_dim,
            ))
        }
    }

    /// A causal mask `(seq_len, index_pos + seq_len)` of `u8`, 1 where query `i`
    /// must not attend to key `j` (`j > index_pos + i`), as an input of the
    /// thread's current context ([`crate::Remat::current`]).
    pub fn build_causal_mask(seq_len: usize, index_pos: usize, device: &Device) -> Result<RTensor> {
        let kv_len = index_pos + seq_len;
        let mask: Vec<u8> = (0..seq_len)
            .flat_map(|i| (0..kv_len).map(move |j| u8::from(j > index_pos + i)))
            .collect();
        RTensor::from_slice(&mask, (seq_len, kv_len), device)
    }
}

/// candle-transformers' `models` helpers.
pub mod models {
    pub use crate::nn::with_tracing;
}
