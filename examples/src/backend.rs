//! The `--backend` option the examples share, and the dispatch from it to a Burn backend type.

/// A backend the examples run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// CPU, through Flex (Burn's pure-Rust CPU backend; f32, f16 and bf16).
    Flex,
    /// CPU, through FastFlex (Flex with this project's kernels for the operations models
    /// spend their time in: `linear`, activations, normalisation, attention).
    Fast,
    /// CPU, through ndarray (f32 and f64).
    Ndarray,
    /// GPU (or a CPU Vulkan driver), through wgpu.
    Wgpu,
    /// NVIDIA GPU, through CUDA (a build with `--features cuda`).
    Cuda,
}

impl BackendKind {
    /// What a build without this backend's feature (of the same name) says when a run asks
    /// for it. Flex is always built.
    pub fn not_compiled(self) -> NotCompiled {
        let (what, feature) = match self {
            Self::Flex => ("`--backend flex`", "flex"),
            Self::Fast => ("`--backend fast`", "flex"),
            Self::Ndarray => ("`--backend ndarray`", "ndarray"),
            Self::Wgpu => ("`--backend wgpu`", "wgpu"),
            Self::Cuda => ("`--backend cuda`", "cuda"),
        };
        NotCompiled { what, feature }
    }

    /// The lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::Fast => "fast",
            Self::Ndarray => "ndarray",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }
}

/// Checks that the `Wgpu` backend has an adapter here, before CubeCL looks for one on its
/// device thread (where a missing driver is a panic the caller sees only as a `RecvError`);
/// logs the adapter it found.
#[cfg(feature = "wgpu")]
pub fn require_wgpu() -> Result<(), burn_memory::MemoryError> {
    let adapter = burn_memory::wgpu_adapter()?;
    tracing::info!("wgpu adapter: {adapter}");
    Ok(())
}

/// A part of the examples that this build left out, and the cargo feature that adds it.
#[derive(Debug, thiserror::Error)]
#[error("{what} needs a build with it: add `--features {feature}` to the cargo command")]
pub struct NotCompiled {
    /// What was asked for (`--backend wgpu`).
    pub what: &'static str,
    /// The examples crate's feature that builds it.
    pub feature: &'static str,
}

/// Runs `$body` with `$b` the Burn backend type of `$kind` (`Flex`, `FastFlex`, `NdArray`, `Wgpu`, `Cuda`); in a
/// build without a backend's feature (`ndarray`, `wgpu`, `cuda`), asking for it makes the enclosing
/// function return [`NotCompiled`], and `--backend wgpu` without a Vulkan (or Metal) driver
/// returns the error of `require_wgpu` (both converted with `?`'s `From`).
#[macro_export]
macro_rules! with_backend {
    ($kind:expr, |$b:ident| $body:expr) => {
        match $kind {
            $crate::backend::BackendKind::Flex => {
                type $b = burn::backend::Flex;
                $body
            }
            $crate::backend::BackendKind::Fast => {
                type $b = burn_fast_cpu::FastFlex;
                $body
            }
            #[cfg(feature = "ndarray")]
            $crate::backend::BackendKind::Ndarray => {
                type $b = burn::backend::NdArray;
                $body
            }
            #[cfg(not(feature = "ndarray"))]
            $crate::backend::BackendKind::Ndarray => {
                return Err($crate::backend::BackendKind::Ndarray.not_compiled().into());
            }
            #[cfg(feature = "wgpu")]
            $crate::backend::BackendKind::Wgpu => {
                $crate::backend::require_wgpu()?;
                type $b = burn::backend::Wgpu;
                $body
            }
            #[cfg(not(feature = "wgpu"))]
            $crate::backend::BackendKind::Wgpu => {
                return Err($crate::backend::BackendKind::Wgpu.not_compiled().into());
            }
            #[cfg(feature = "cuda")]
            $crate::backend::BackendKind::Cuda => {
                type $b = burn::backend::Cuda;
                $body
            }
            #[cfg(not(feature = "cuda"))]
            $crate::backend::BackendKind::Cuda => {
                return Err($crate::backend::BackendKind::Cuda.not_compiled().into());
            }
        }
    };
}

/// The backend a model's `bf16`/`f16` compute runs on: on Flex,
/// [`FastFlex`](burn_fast_cpu::FastFlex) (Flex with half-precision operations on the CPU's
/// vector units, where Flex's own compute one value at a time); every other backend is its
/// own. Mixed-precision runs (`--amp`, the language model's `bf16` extra) take this backend.
pub trait HalfCompute: burn::tensor::backend::Backend {
    /// The backend of half-precision compute, on the same device.
    type Half: burn::tensor::backend::Backend<Device = Self::Device>;
}

impl HalfCompute for burn::backend::Flex {
    type Half = burn_fast_cpu::FastFlex;
}

impl HalfCompute for burn_fast_cpu::FastFlex {
    type Half = Self;
}

#[cfg(feature = "ndarray")]
impl HalfCompute for burn::backend::NdArray {
    type Half = Self;
}

#[cfg(feature = "wgpu")]
impl HalfCompute for burn::backend::Wgpu {
    type Half = Self;
}

#[cfg(feature = "cuda")]
impl HalfCompute for burn::backend::Cuda {
    type Half = Self;
}

impl<B: HalfCompute> HalfCompute for burn::backend::Autodiff<B> {
    type Half = burn::backend::Autodiff<B::Half>;
}
