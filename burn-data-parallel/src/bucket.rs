//! Gradients and parameter checksums laid out in one flat tensor, so that a step costs one
//! collective operation whatever the number of parameters (PyTorch's DDP buckets its
//! gradients for the same reason).
//!
//! The layout comes from the module, visited in its declaration order, which every replica
//! shares: a gradient's place in the bucket never depends on which gradients a peer happens to
//! have.

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor};

/// One trained parameter's slot in the gradient bucket.
struct Slot {
    id: ParamId,
    shape: Vec<usize>,
    dtype: DType,
    offset: usize,
    len: usize,
}

/// The trained parameters of a module, in visiting order, and where each sits in the bucket.
pub(crate) struct GradientLayout {
    slots: Vec<Slot>,
    len: usize,
}

impl GradientLayout {
    /// The layout of `module`'s parameters that require a gradient.
    pub(crate) fn of<B: AutodiffBackend, M: Module<B>>(module: &M) -> Self {
        struct Collect {
            slots: Vec<Slot>,
            len: usize,
        }
        impl<B: Backend> ModuleVisitor<B> for Collect {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                if !param.is_require_grad() {
                    return;
                }
                let shape = param.lazy_shape().dims::<D>().to_vec();
                let len = shape.iter().product();
                self.slots.push(Slot {
                    id: param.id,
                    shape,
                    dtype: param.val().dtype(),
                    offset: self.len,
                    len,
                });
                self.len += len;
            }
        }
        let mut collect = Collect {
            slots: Vec::new(),
            len: 0,
        };
        module.visit(&mut collect);
        Self {
            slots: collect.slots,
            len: collect.len,
        }
    }

    /// Takes `grads`' tensors into one f32 vector of the bucket's layout: each gradient
    /// flattened at its offset (zeros where this peer has none), a presence flag per parameter
    /// (1 where it has one), then `extra`.
    pub(crate) fn pack<B: Backend>(
        &self,
        grads: &mut GradientsParams,
        extra: &[f32],
        device: &B::Device,
    ) -> Tensor<B, 1> {
        let mut parts = Vec::with_capacity(self.slots.len() + 1);
        let mut presence = Vec::with_capacity(self.slots.len() + extra.len());
        for slot in &self.slots {
            match take_flat::<B>(grads, slot) {
                Some(flat) => {
                    parts.push(flat);
                    presence.push(1.0);
                }
                None => {
                    parts.push(Tensor::zeros([slot.len], device));
                    presence.push(0.0);
                }
            }
        }
        presence.extend_from_slice(extra);
        parts.push(Tensor::from_floats(presence.as_slice(), device));
        Tensor::cat(parts, 0)
    }

    /// The gradients of a summed bucket, divided by `peers`: a parameter that no peer had a
    /// gradient for stays without one (an optimizer treats a zero gradient differently from
    /// none). Returns them with the summed `extra` values.
    pub(crate) fn unpack<B: Backend>(
        &self,
        summed: Tensor<B, 1>,
        peers: usize,
        extra: usize,
    ) -> (GradientsParams, Vec<f32>) {
        let flags_start = self.len;
        let flags = into_f32(
            summed
                .clone()
                .slice(flags_start..flags_start + self.slots.len() + extra),
        );
        let mut grads = GradientsParams::new();
        // One division for the whole bucket, then a slice per gradient: one new buffer per
        // step rather than one per parameter.
        let mean = summed.slice(0..self.len).div_scalar(peers as f32);
        for (slot, &present) in self.slots.iter().zip(&flags) {
            if present == 0.0 {
                continue;
            }
            let flat = mean.clone().slice(slot.offset..slot.offset + slot.len);
            register::<B>(&mut grads, slot, flat);
        }
        (grads, flags[self.slots.len()..].to_vec())
    }
}

/// A tensor's values as f32 on the host.
pub(crate) fn into_f32<B: Backend>(tensor: Tensor<B, 1>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32")
}

/// Removes `slot`'s gradient from `grads`, flattened to f32.
fn take_flat<B: Backend>(grads: &mut GradientsParams, slot: &Slot) -> Option<Tensor<B, 1>> {
    macro_rules! take {
        ($($d:literal),*) => {
            match slot.shape.len() {
                $($d => grads
                    .remove::<B, $d>(slot.id)
                    .map(|grad| grad.cast(DType::F32).reshape([slot.len])),)*
                rank => panic!("a parameter of rank {rank}: gradients up to rank 6 are reduced"),
            }
        };
    }
    take!(1, 2, 3, 4, 5, 6)
}

/// Registers `flat` as `slot`'s gradient, in the parameter's shape and type.
fn register<B: Backend>(grads: &mut GradientsParams, slot: &Slot, flat: Tensor<B, 1>) {
    let flat = flat.cast(slot.dtype);
    macro_rules! put {
        ($($d:literal),*) => {
            match slot.shape.len() {
                $($d => {
                    let shape: [usize; $d] = slot.shape.clone().try_into().expect("rank checked");
                    grads.register::<B, $d>(slot.id, flat.reshape(shape));
                })*
                rank => panic!("a parameter of rank {rank}: gradients up to rank 6 are reduced"),
            }
        };
    }
    put!(1, 2, 3, 4, 5, 6)
}

/// A checksum per parameter of a module (trained or fixed), with its module path.
pub(crate) struct Checksums {
    /// The module path of each parameter, `layers.0.u1s`.
    pub(crate) names: Vec<String>,
    /// CRC-32 of each parameter's bytes.
    pub(crate) sums: Vec<u32>,
}

impl Checksums {
    /// The checksums of every float parameter of `module`.
    pub(crate) fn of<B: Backend, M: Module<B>>(module: &M) -> Self {
        struct Collect {
            path: Vec<String>,
            names: Vec<String>,
            sums: Vec<u32>,
        }
        impl<B: Backend> ModuleVisitor<B> for Collect {
            fn enter_module(&mut self, name: &str, _container_type: &str) {
                self.path.push(name.to_string());
            }
            fn exit_module(&mut self, _name: &str, _container_type: &str) {
                self.path.pop();
            }
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let data = param.val().into_data();
                self.sums.push(crc32fast::hash(data.as_bytes()));
                let name = if self.path.is_empty() {
                    format!("parameter {}", self.names.len())
                } else {
                    self.path.join(".")
                };
                self.names.push(name);
            }
        }
        let mut collect = Collect {
            path: Vec::new(),
            names: Vec::new(),
            sums: Vec::new(),
        };
        module.visit(&mut collect);
        Self {
            names: collect.names,
            sums: collect.sums,
        }
    }

    /// The values whose sum over the peers tells whether they all agree: each checksum's four
    /// bytes and their squares. By Cauchy–Schwarz, `n·Σb² = (Σb)²` exactly when every peer has
    /// the same byte; bytes below 256 keep both sums exact in f32 for up to 256 peers.
    pub(crate) fn agreement_values(&self) -> Vec<f32> {
        self.sums
            .iter()
            .flat_map(|sum| {
                let bytes = sum.to_le_bytes().map(f32::from);
                [bytes, bytes.map(|b| b * b)].concat()
            })
            .collect()
    }

    /// The names of the parameters on which `summed` (the peers' summed
    /// [`agreement_values`](Self::agreement_values)) shows a disagreement.
    pub(crate) fn disagreements(&self, summed: &[f32], peers: usize) -> Vec<String> {
        let n = peers as f64;
        self.names
            .iter()
            .zip(summed.chunks(8))
            .filter(|(_, values)| {
                (0..4).any(|byte| {
                    let (sum, squares) = (f64::from(values[byte]), f64::from(values[4 + byte]));
                    n * squares != sum * sum
                })
            })
            .map(|(name, _)| name.clone())
            .collect()
    }
}
