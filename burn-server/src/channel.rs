//! [`DtrChannel`] (the router channel of a DTR device) and [`DtrBridge`] (moving
//! tensors between DTR devices).

use std::marker::PhantomData;

use burn_backend::{DType, Shape};
use burn_ir::{BackendIr, TensorHandle as IrTensorHandle, TensorIr};
use burn_router::{MultiBackendBridge, RouterChannel, RouterTensor, TensorHandle};

use crate::client::DtrClient;
use crate::device::DtrDevice;

/// The router channel that puts a remat-dtr runtime between Burn and the inner
/// backend `B`. [`Dtr<B>`](crate::Dtr) is `BackendRouter<DtrChannel<B>>`.
pub struct DtrChannel<B: BackendIr> {
    _b: PhantomData<fn() -> B>,
}

impl<B: BackendIr> Clone for DtrChannel<B> {
    fn clone(&self) -> Self {
        Self { _b: PhantomData }
    }
}

/// Moves inner handles between DTR devices (through the inner backend's
/// `to_device`).
pub struct DtrBridge<B: BackendIr> {
    _b: PhantomData<fn() -> B>,
}

impl<B: BackendIr> MultiBackendBridge for DtrBridge<B> {
    type TensorHandle = B::Handle;
    type Device = DtrDevice<B>;

    fn change_backend_float(
        tensor: Self::TensorHandle,
        shape: Shape,
        target_device: &Self::Device,
    ) -> Self::TensorHandle {
        let t = B::float_tensor(IrTensorHandle {
            handle: tensor,
            shape,
        });
        B::float_tensor_handle(B::float_to_device(t, target_device.inner()))
    }

    fn change_backend_int(
        tensor: Self::TensorHandle,
        shape: Shape,
        target_device: &Self::Device,
    ) -> Self::TensorHandle {
        let t = B::int_tensor(IrTensorHandle {
            handle: tensor,
            shape,
        });
        B::int_tensor_handle(B::int_to_device(t, target_device.inner()))
    }

    fn change_backend_bool(
        tensor: Self::TensorHandle,
        shape: Shape,
        target_device: &Self::Device,
    ) -> Self::TensorHandle {
        let t = B::bool_tensor(IrTensorHandle {
            handle: tensor,
            shape,
        });
        B::bool_tensor_handle(B::bool_to_device(t, target_device.inner()))
    }
}

impl<B: BackendIr> RouterChannel for DtrChannel<B> {
    type Device = DtrDevice<B>;
    type Bridge = DtrBridge<B>;
    type Client = DtrClient<B>;

    fn name(device: &Self::Device) -> String {
        format!("dtr<{}>", B::name(device.inner()))
    }

    fn init_client(device: &Self::Device) -> Self::Client {
        DtrClient::new(device)
    }

    /// The inner handle of `tensor` (moving it to another device). When it
    /// cannot be produced (it was not computed, or the budget cannot hold it)
    /// burn gives no way to fail here: the client keeps the error, which the
    /// next sync and `take_error` report, and a zero-filled handle of the same
    /// shape stands in.
    fn get_tensor_handle(tensor: &TensorIr, client: &Self::Client) -> TensorHandle<Self::Bridge> {
        match client.handle(tensor) {
            Ok(h) => h,
            Err(e) => {
                client.report(e);
                let device = client.device_ref().inner();
                let shape = tensor.shape.clone();
                if tensor.dtype.is_int() {
                    B::int_tensor_handle(B::int_zeros(shape, device, tensor.dtype.into()))
                } else if tensor.dtype.is_bool() {
                    B::bool_tensor_handle(B::bool_zeros(shape, device, tensor.dtype.into()))
                } else {
                    B::float_tensor_handle(B::float_zeros(shape, device, tensor.dtype.into()))
                }
            }
        }
    }

    fn register_tensor(
        client: &Self::Client,
        handle: TensorHandle<Self::Bridge>,
        shape: Shape,
        dtype: DType,
    ) -> RouterTensor<Self::Client> {
        client.register_handle(handle, shape, dtype)
    }
}
