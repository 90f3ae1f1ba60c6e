//! The embedding table (candle-nn's `Embedding`).

use super::{Module, VarBuilder};
use crate::error::Result;
use crate::tensor::RTensor;

/// An embedding table (candle-nn's `Embedding`).
#[derive(Debug, Clone)]
pub struct Embedding {
    table: RTensor,
    hidden_size: usize,
}

impl Embedding {
    /// A table `(n, hidden_size)` (candle-nn's `Embedding::new`).
    pub fn new(embeddings: RTensor, hidden_size: usize) -> Self {
        Self {
            table: embeddings,
            hidden_size,
        }
    }
    /// The table, `(n, hidden_size)`: give it to [`Linear::new`](super::Linear::new) to tie an
    /// output layer to it.
    pub fn embeddings(&self) -> &RTensor {
        &self.table
    }
    /// The width of an embedding.
    pub fn hidden_size(&self) -> usize {
        self.hidden_size
    }
}

impl Module for Embedding {
    /// `ids`: an integer tensor of any shape; the output adds a last dimension.
    fn forward(&self, ids: &RTensor) -> Result<RTensor> {
        let mut final_dims = ids.dims().to_vec();
        final_dims.push(self.hidden_size);
        let ids = ids.flatten_all()?;
        let values = self.table.index_select(&ids, 0)?;
        values.reshape(final_dims)
    }
}

/// candle-nn's `embedding` over `vb`.
pub fn embedding(n: usize, hidden: usize, vb: VarBuilder) -> Result<Embedding> {
    let e = candle_nn::embedding(n, hidden, vb.candle().clone())?;
    Ok(Embedding {
        table: vb.remat()?.input(e.embeddings())?,
        hidden_size: hidden,
    })
}
