//! `.i(..)` indexing on [`RTensor`], candle's `IndexOp` under the same name:
//! integers select (and drop the dimension), ranges narrow, a 1-D integer
//! candle `Tensor` selects rows. Selections and ranges are views (no bytes, no
//! graph node beyond candle's own); tensor indices are an `index_select`.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use remat_candle::{IndexOp, Remat};
//! # fn main() -> remat_candle::Result<()> {
//! let remat = Remat::unbounded()?;
//! let a = remat.input(&Tensor::new(&[[0f32, 1., 2.], [3., 4., 5.]], &Device::Cpu)?)?;
//! assert_eq!(a.i((1, 2))?.to_vec0::<f32>()?, 5.);
//! assert_eq!(a.i((.., 1..))?.to_vec2::<f32>()?, [[1., 2.], [4., 5.]]);
//! # Ok(()) }
//! ```

use std::ops::Bound;

pub use candle_core::TensorIndexer;

use crate::error::Result;
use crate::tensor::RTensor;

/// One index: an integer, a range (`a..b`, `a..`, `..b`, `..`, `a..=b`, `..=b`)
/// or a 1-D integer candle `Tensor` (owned or borrowed).
pub trait Indexer {
    /// candle's form of the index.
    fn indexer(self) -> TensorIndexer;
}

macro_rules! indexer {
    ($($t:ty),+) => {
        $(impl Indexer for $t {
            fn indexer(self) -> TensorIndexer {
                self.into()
            }
        })+
    };
}

indexer!(
    usize,
    std::ops::Range<usize>,
    std::ops::RangeFrom<usize>,
    std::ops::RangeTo<usize>,
    std::ops::RangeFull,
    std::ops::RangeInclusive<usize>,
    std::ops::RangeToInclusive<usize>,
    &candle_core::Tensor
);

impl Indexer for candle_core::Tensor {
    fn indexer(self) -> TensorIndexer {
        TensorIndexer::IndexSelect(self)
    }
}

/// `.i(index)`: candle's `IndexOp` for [`RTensor`] (an [`Indexer`] or a tuple of
/// up to seven, one per leading dimension).
pub trait IndexOp<T> {
    /// Index the tensor (see the module doc).
    fn i(&self, index: T) -> Result<RTensor>;
}

impl RTensor {
    /// candle's `Tensor::index`, step for step.
    fn index(&self, indexers: &[TensorIndexer]) -> Result<RTensor> {
        let mut x = self.clone();
        let dims = self.dims().to_vec();
        let mut current_dim = 0;
        for (i, indexer) in indexers.iter().enumerate() {
            x = match indexer {
                TensorIndexer::Select(n) => x.narrow(current_dim, *n, 1)?.squeeze(current_dim)?,
                TensorIndexer::Narrow(left, right) => {
                    let start = match left {
                        Bound::Included(n) => *n,
                        Bound::Excluded(n) => *n + 1,
                        Bound::Unbounded => 0,
                    };
                    let dim = dims.get(i).copied().ok_or_else(|| {
                        crate::Error::unsupported(
                            "i",
                            format!(
                                "{} indices for a tensor of rank {}",
                                indexers.len(),
                                dims.len()
                            ),
                        )
                    })?;
                    let stop = match right {
                        Bound::Included(n) => *n + 1,
                        Bound::Excluded(n) => *n,
                        Bound::Unbounded => dim,
                    };
                    let out = x.narrow(current_dim, start, stop.saturating_sub(start))?;
                    current_dim += 1;
                    out
                }
                TensorIndexer::IndexSelect(ids) => {
                    if ids.rank() != 1 {
                        candle_core::bail!("multi-dimensional tensor indexing is not supported")
                    }
                    let ids = self.remat().input(&ids.to_device(x.device())?)?;
                    let out = x.index_select(&ids, current_dim)?;
                    current_dim += 1;
                    out
                }
                TensorIndexer::Err(e) => candle_core::bail!("indexing error {e:?}"),
            };
        }
        Ok(x)
    }
}

impl<T: Indexer> IndexOp<T> for RTensor {
    fn i(&self, index: T) -> Result<RTensor> {
        self.index(&[index.indexer()])
    }
}

macro_rules! index_op_tuple {
    ($($t:ident),+) => {
        #[allow(non_snake_case)]
        impl<$($t),*> IndexOp<($($t,)*)> for RTensor
        where
            $($t: Indexer,)*
        {
            fn i(&self, ($($t,)*): ($($t,)*)) -> Result<RTensor> {
                self.index(&[$($t.indexer(),)*])
            }
        }
    };
}

index_op_tuple!(A);
index_op_tuple!(A, B);
index_op_tuple!(A, B, C);
index_op_tuple!(A, B, C, D);
index_op_tuple!(A, B, C, D, E);
index_op_tuple!(A, B, C, D, E, F);
index_op_tuple!(A, B, C, D, E, F, G);
