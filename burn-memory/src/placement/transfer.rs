//! Moving tensors between two devices of one backend, on every backend burn-memory supports.
//!
//! Why not `Tensor::to_device`: Burn 0.21's CubeCL backends move a tensor to another device
//! through CubeCL's collective `send`/`recv`, which only CUDA (with NCCL) implements; on `Wgpu`
//! the device threads panic ("not implemented") and the moved tensor is unreadable. The same
//! goes for `Module::fork`, which moves each parameter with `to_device`. Here a move between
//! two CubeCL devices (fused or not) goes through host memory: the tensor is read from its
//! device and written to the other, one read that waits for the source device. The CPU
//! backends keep Burn's own move, and `Autodiff` records the move so that the backward pass
//! brings the gradient back the same way.

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::module::{ModuleMapper, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData, TensorPrimitive};
use burn_backend::ExecutionError;
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor};

/// A backend whose tensors burn-memory can move from one of its devices to another (see the
/// module's documentation for why Burn's own `to_device` is not enough): implemented for
/// NdArray, Flex, every CubeCL backend (`Wgpu`, `Cuda`), their fusion wrappers, `Autodiff`
/// over any of them, and burn-profiler's `Profiled<B>`.
///
/// Each method returns the tensor unchanged when it is already on `device`.
pub trait DeviceTransfer: Backend {
    /// Whether the tensors are host memory that every thread may share (the CPU backends).
    /// The others' tensors live on a device, or behind a fusion stream of one thread.
    const HOST_MEMORY: bool;
    /// Moves a float tensor; on `Autodiff`, the backward pass moves its gradient back.
    fn transfer_float(tensor: FloatTensor<Self>, device: &Self::Device) -> FloatTensor<Self>;
    /// Moves an int tensor.
    fn transfer_int(tensor: IntTensor<Self>, device: &Self::Device) -> IntTensor<Self>;
    /// Moves a bool tensor.
    fn transfer_bool(tensor: BoolTensor<Self>, device: &Self::Device) -> BoolTensor<Self>;
}

/// Burn's own move: right on backends with one kind of device and no collective path.
#[allow(unused_macros)] // Unused without the CPU backends' features.
macro_rules! native_transfer {
    () => {
        const HOST_MEMORY: bool = true;
        fn transfer_float(tensor: FloatTensor<Self>, device: &Self::Device) -> FloatTensor<Self> {
            <Self as burn_backend::ops::FloatTensorOps<Self>>::float_to_device(tensor, device)
        }
        fn transfer_int(tensor: IntTensor<Self>, device: &Self::Device) -> IntTensor<Self> {
            <Self as burn_backend::ops::IntTensorOps<Self>>::int_to_device(tensor, device)
        }
        fn transfer_bool(tensor: BoolTensor<Self>, device: &Self::Device) -> BoolTensor<Self> {
            <Self as burn_backend::ops::BoolTensorOps<Self>>::bool_to_device(tensor, device)
        }
    };
}

/// Through host memory: read on the source device, written on the destination.
#[allow(unused_macros)] // Unused without the CubeCL and fusion features.
macro_rules! host_transfer {
    () => {
        const HOST_MEMORY: bool = false;
        fn transfer_float(tensor: FloatTensor<Self>, device: &Self::Device) -> FloatTensor<Self> {
            use burn_backend::ops::FloatTensorOps;
            if Self::float_device(&tensor) == *device {
                return tensor;
            }
            Self::float_from_data(read(Self::float_into_data(tensor)), device)
        }
        fn transfer_int(tensor: IntTensor<Self>, device: &Self::Device) -> IntTensor<Self> {
            use burn_backend::ops::IntTensorOps;
            if Self::int_device(&tensor) == *device {
                return tensor;
            }
            Self::int_from_data(read(Self::int_into_data(tensor)), device)
        }
        fn transfer_bool(tensor: BoolTensor<Self>, device: &Self::Device) -> BoolTensor<Self> {
            use burn_backend::ops::BoolTensorOps;
            if Self::bool_device(&tensor) == *device {
                return tensor;
            }
            Self::bool_from_data(read(Self::bool_into_data(tensor)), device)
        }
    };
}

/// Waits for a tensor's data. A failed read is a failed device, which Burn's own reads report
/// by panicking too: a layer's forward pass has no error to return.
#[allow(dead_code)] // Unused when no host-staged backend is enabled.
fn read(data: impl Future<Output = Result<TensorData, ExecutionError>>) -> TensorData {
    burn_backend::try_read_sync(data)
        .expect("a native backend reads tensors synchronously")
        .unwrap_or_else(|err| panic!("reading a tensor to move it to another device: {err}"))
}

#[cfg(feature = "ndarray")]
impl<E, I, Q> DeviceTransfer for burn_ndarray::NdArray<E, I, Q>
where
    burn_ndarray::NdArrayTensor:
        From<burn_ndarray::SharedArray<E>> + From<burn_ndarray::SharedArray<I>>,
    Self: Backend,
{
    native_transfer!();
}

#[cfg(feature = "flex")]
impl DeviceTransfer for burn::backend::Flex {
    native_transfer!();
}

#[cfg(feature = "cubecl")]
impl<R, F, I, BT> DeviceTransfer for burn_cubecl::CubeBackend<R, F, I, BT>
where
    R: burn_cubecl::CubeRuntime,
    F: burn_cubecl::FloatElement,
    I: burn_cubecl::IntElement,
    BT: burn_cubecl::BoolElement,
{
    host_transfer!();
}

#[cfg(feature = "fusion")]
impl<B: burn_fusion::FusionBackend> DeviceTransfer for burn_fusion::Fusion<B> {
    host_transfer!();
}

/// The move as an autodiff operation: its backward moves the gradient to the source device.
#[derive(Debug)]
struct Transfer;

impl<B: DeviceTransfer> Backward<B, 1> for Transfer {
    /// The source device.
    type State = B::Device;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            B::transfer_float(grad, &ops.state)
        });
    }
}

impl<B: DeviceTransfer, C: CheckpointStrategy> DeviceTransfer for Autodiff<B, C> {
    const HOST_MEMORY: bool = B::HOST_MEMORY;
    fn transfer_float(tensor: FloatTensor<Self>, device: &Self::Device) -> FloatTensor<Self> {
        let source = B::float_device(&tensor.primitive);
        if source == *device {
            return tensor;
        }
        // Compute-bound: a checkpointing strategy keeps the moved tensor rather than moving it
        // again in the backward pass.
        match Transfer
            .prepare::<C>([tensor.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                prep.finish(source, B::transfer_float(tensor.primitive, device))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::transfer_float(tensor.primitive, device)),
        }
    }
    fn transfer_int(tensor: IntTensor<Self>, device: &Self::Device) -> IntTensor<Self> {
        B::transfer_int(tensor, device)
    }
    fn transfer_bool(tensor: BoolTensor<Self>, device: &Self::Device) -> BoolTensor<Self> {
        B::transfer_bool(tensor, device)
    }
}

/// What flows between layers moved to another device, part by part, through
/// [`DeviceTransfer`].
///
/// Implemented for float, int and bool tensors and for tuples of two to four states; a struct
/// of the model's own (see [`SegmentState`](crate::SegmentState)) implements it by moving
/// each field.
pub trait ToDevice<B: Backend>: Sized {
    /// The same state on `device`. Float tensors keep their graph: the backward pass moves
    /// their gradient back.
    fn to_device(self, device: &B::Device) -> Self;
}

/// A quantized tensor moves with Burn's own `to_device` (no host-staged path for it).
impl<B: DeviceTransfer, const D: usize> ToDevice<B> for Tensor<B, D> {
    fn to_device(self, device: &B::Device) -> Self {
        Tensor::from_primitive(match self.into_primitive() {
            TensorPrimitive::Float(tensor) => {
                TensorPrimitive::Float(B::transfer_float(tensor, device))
            }
            TensorPrimitive::QFloat(tensor) => {
                TensorPrimitive::QFloat(B::q_to_device(tensor, device))
            }
        })
    }
}

impl<B: DeviceTransfer, const D: usize> ToDevice<B> for Tensor<B, D, Int> {
    fn to_device(self, device: &B::Device) -> Self {
        Tensor::from_primitive(B::transfer_int(self.into_primitive(), device))
    }
}

impl<B: DeviceTransfer, const D: usize> ToDevice<B> for Tensor<B, D, Bool> {
    fn to_device(self, device: &B::Device) -> Self {
        Tensor::from_primitive(B::transfer_bool(self.into_primitive(), device))
    }
}

/// Tuples: each part moved.
macro_rules! tuple_to_device {
    ($($part:ident $index:tt),+) => {
        impl<B: Backend, $($part: ToDevice<B>),+> ToDevice<B> for ($($part,)+) {
            fn to_device(self, device: &B::Device) -> Self {
                ($(self.$index.to_device(device),)+)
            }
        }
    };
}

tuple_to_device!(S0 0, S1 1);
tuple_to_device!(S0 0, S1 1, S2 2);
tuple_to_device!(S0 0, S1 1, S2 2, S3 3);

/// Moves every parameter it maps to `device`, as [`Module::fork`](burn::module::Module::fork)
/// does (a new leaf with the parameter's id and gradient requirement, cut from any graph) or,
/// with `keep_graph`, as [`Module::to_device`](burn::module::Module::to_device) does (the
/// move recorded), through [`DeviceTransfer`].
pub(crate) struct Mover<'a, B: Backend> {
    pub(crate) device: &'a B::Device,
    pub(crate) keep_graph: bool,
}

impl<B: DeviceTransfer> ModuleMapper<B> for Mover<'_, B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let mut moved = ToDevice::to_device(tensor, self.device);
        if !self.keep_graph {
            moved = moved.detach();
            if require_grad {
                moved = moved.require_grad();
            }
        }
        Param::from_mapped_value(id, moved, mapper)
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, ToDevice::to_device(tensor, self.device), mapper)
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Bool>>,
    ) -> Param<Tensor<B, D, Bool>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, ToDevice::to_device(tensor, self.device), mapper)
    }
}
