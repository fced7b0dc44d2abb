//! Which implementation of the sketched product a call runs.

/// How a backend with more than one implementation of the sketched product picks one, per
/// call: a field of [`SkLinear`](crate::SkLinear) (set with
/// [`SkLinearConfig::with_strategy`](crate::SkLinearConfig::with_strategy)), passed down
/// through every wrapper (`Autodiff`, `Fusion`) to the backend.
///
/// Only CubeCL backends have a choice (the `burn-sketch-kernels` kernels or Burn's own tuned
/// matmuls through the tensor-op path). Other backends have one path and ignore it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum KernelStrategy {
    /// Time both on first use of each shape class on each device, then use the faster: CubeCL's
    /// own autotuner, as Burn's matmul and reduce use (the default).
    ///
    /// Why tune rather than always run the kernels: their speed against Burn's tuned matmuls
    /// depends on the device and the shape. On a GPU the kernels save launches and a round trip
    /// of `P`; on a CPU Vulkan driver such as lavapipe CubeCL's matmul kernels are faster.
    #[default]
    Autotune,
    /// Always the `burn-sketch-kernels` kernels (tests and benchmarks of the kernels).
    Kernels,
    /// Always the tensor-op path.
    TensorOps,
}
