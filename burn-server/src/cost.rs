//! How the cost of an op (its compute time, the "c" of the DTR heuristics) is
//! taken.
//!
//! On synchronous backends (Flex, NdArray) the op has finished when the runner returns,
//! so the wall-clock time around it is its cost. On asynchronous backends (CUDA)
//! that time is only the launch: use [`CostModel::Analytic`], an estimate from the
//! IR — bytes moved × `ns_per_byte` plus, for matrix products and convolutions,
//! multiply-adds × `ns_per_flop`.

use burn_ir::{FloatOperationIr, ModuleOperationIr, OperationIr, TensorIr};

/// How op costs are measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CostModel {
    /// Wall-clock time around the op (right for synchronous backends).
    WallClock,
    /// An estimate from the IR: op class × shapes.
    Analytic {
        /// Nanoseconds per byte read or written (1 / bandwidth).
        ns_per_byte: f64,
        /// Nanoseconds per floating-point operation of matmul / convolution.
        ns_per_flop: f64,
    },
}

impl Default for CostModel {
    /// [`CostModel::WallClock`].
    fn default() -> Self {
        CostModel::WallClock
    }
}

impl CostModel {
    /// An analytic model for a GPU of about 1 TB/s and 20 TFLOP/s.
    pub fn gpu() -> Self {
        CostModel::Analytic {
            ns_per_byte: 1e-3,
            ns_per_flop: 5e-5,
        }
    }

    /// The estimated cost of `op` in ns under an analytic model (at least 1).
    pub fn estimate(ns_per_byte: f64, ns_per_flop: f64, op: &OperationIr) -> u64 {
        let bytes: usize = op.inputs().chain(op.outputs()).map(tensor_bytes).sum();
        let flops = flops(op);
        ((bytes as f64) * ns_per_byte + flops * ns_per_flop).max(1.0) as u64
    }
}

/// Bytes of a tensor described by `t`.
pub(crate) fn tensor_bytes(t: &TensorIr) -> usize {
    t.shape.num_elements() * t.dtype.size()
}

/// Floating-point operations of matmuls and convolutions (0 for other ops).
fn flops(op: &OperationIr) -> f64 {
    match op {
        OperationIr::Float(_, FloatOperationIr::Matmul(m)) => {
            // out = [.., m, n], lhs = [.., m, k]
            let k = m.lhs.shape.last().copied().unwrap_or(1);
            2.0 * m.out.shape.num_elements() as f64 * k as f64
        }
        OperationIr::Module(ModuleOperationIr::Conv1d(c)) => conv_flops(&c.x, &c.weight, &c.out),
        OperationIr::Module(ModuleOperationIr::Conv2d(c)) => conv_flops(&c.x, &c.weight, &c.out),
        OperationIr::Module(ModuleOperationIr::Conv3d(c)) => conv_flops(&c.x, &c.weight, &c.out),
        _ => 0.0,
    }
}

fn conv_flops(_x: &TensorIr, weight: &TensorIr, out: &TensorIr) -> f64 {
    // Each output element takes weight.numel / out_channels multiply-adds.
    let out_channels = weight.shape.first().copied().unwrap_or(1).max(1);
    2.0 * out.shape.num_elements() as f64 * (weight.shape.num_elements() / out_channels) as f64
}
