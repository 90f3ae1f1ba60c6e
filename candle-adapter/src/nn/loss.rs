//! Losses mirroring `candle_nn::loss`.

use crate::error::{Error, Result};
use crate::tensor::RTensor;

/// Negative log likelihood of `inp: (b, c)` log-probabilities at `target: (b,)`
/// class ids.
pub fn nll(inp: &RTensor, target: &RTensor) -> Result<RTensor> {
    let b_sz = match *target.dims() {
        [b] => b,
        ref d => {
            return Err(Error::Unsupported {
                op: "nll",
                message: format!("target of shape {d:?} (expected one dimension)"),
            }
            .into())
        }
    };
    match *inp.dims() {
        [ib, _] if ib == b_sz => {}
        ref d => {
            return Err(Error::Unsupported {
                op: "nll",
                message: format!("input of shape {d:?} for a batch of {b_sz}"),
            }
            .into())
        }
    }
    inp.gather(&target.unsqueeze(1)?, 1)?
        .sum_all()?
        .affine(-1f64 / b_sz as f64, 0.)
}

/// Cross-entropy of logits `inp: (b, c)` against class ids `target: (b,)`.
pub fn cross_entropy(inp: &RTensor, target: &RTensor) -> Result<RTensor> {
    if inp.rank() != 2 {
        return Err(Error::Unsupported {
            op: "cross_entropy",
            message: format!("input of rank {} (expected 2)", inp.rank()),
        }
        .into());
    }
    nll(&inp.log_softmax(1)?, target)
}

/// Mean squared error.
pub fn mse(inp: &RTensor, target: &RTensor) -> Result<RTensor> {
    (inp - target)?.sqr()?.mean_all()
}
