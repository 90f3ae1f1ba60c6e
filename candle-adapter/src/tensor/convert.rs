//! candle-core's conversions (`convert.rs`) for [`RTensor`]: a scalar, a slice
//! or a vector into a tensor (`Tensor::try_from(f32::MIN)?`, as bert writes its
//! attention mask's constant), and a tensor into a scalar or nested vectors.
//!
//! candle builds the tensor on `Device::Cpu`; so does this, as an input of the
//! thread's current context ([`Remat::current`](crate::Remat::current)), so the
//! conversion fails with a typed error naming the fix when the thread has none.
//! candle has only `TryFrom` for these, no `From` (a tensor allocation can
//! fail), and so has this. candle's `Vec<Vec<T>>` and `Vec<Vec<Vec<T>>>`
//! conversions from a tensor are not here: outside candle-core, Rust's
//! coherence rules cannot tell them from `Vec<T>`'s (`WithDType` is a foreign
//! trait); use [`RTensor::to_vec2`] / [`RTensor::to_vec3`].

use candle_core::{Device, Tensor, WithDType};
use half::{bf16, f16};

use super::RTensor;
use crate::context::Remat;

impl<T: WithDType> TryFrom<&RTensor> for Vec<T> {
    type Error = candle_core::Error;
    fn try_from(tensor: &RTensor) -> Result<Self, Self::Error> {
        tensor.to_vec1::<T>()
    }
}

impl<T: WithDType> TryFrom<RTensor> for Vec<T> {
    type Error = candle_core::Error;
    fn try_from(tensor: RTensor) -> Result<Self, Self::Error> {
        Vec::<T>::try_from(&tensor)
    }
}

impl<T: WithDType> TryFrom<&[T]> for RTensor {
    type Error = candle_core::Error;
    /// candle's `Tensor::try_from(&[T])`: rank 1 on the CPU, in the current context.
    fn try_from(v: &[T]) -> Result<Self, Self::Error> {
        Remat::current()?.input(&Tensor::try_from(v)?)
    }
}

impl<T: WithDType> TryFrom<Vec<T>> for RTensor {
    type Error = candle_core::Error;
    /// candle's `Tensor::try_from(Vec<T>)`: rank 1 on the CPU, in the current context.
    fn try_from(v: Vec<T>) -> Result<Self, Self::Error> {
        Remat::current()?.input(&Tensor::try_from(v)?)
    }
}

macro_rules! from_scalar {
    ($typ:ident) => {
        impl TryFrom<&RTensor> for $typ {
            type Error = candle_core::Error;
            fn try_from(tensor: &RTensor) -> Result<Self, Self::Error> {
                tensor.to_scalar::<$typ>()
            }
        }

        impl TryFrom<RTensor> for $typ {
            type Error = candle_core::Error;
            fn try_from(tensor: RTensor) -> Result<Self, Self::Error> {
                $typ::try_from(&tensor)
            }
        }

        impl TryFrom<$typ> for RTensor {
            type Error = candle_core::Error;
            /// candle's `Tensor::try_from(v)`: rank 0 on the CPU, in the
            /// current context.
            fn try_from(v: $typ) -> Result<Self, Self::Error> {
                Remat::current()?.input(&Tensor::new(v, &Device::Cpu)?)
            }
        }
    };
}

from_scalar!(f64);
from_scalar!(f32);
from_scalar!(f16);
from_scalar!(bf16);
from_scalar!(i64);
from_scalar!(i32);
from_scalar!(i16);
from_scalar!(u32);
from_scalar!(u8);
