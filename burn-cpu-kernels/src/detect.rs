//! Which of the reduced-precision instructions this CPU has, detected once.

use std::sync::OnceLock;

/// The instruction-set extensions the products can use, as detected at run time (and after
/// `BURN_SKETCH_PORTABLE=1`, which turns every one off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Features {
    /// AVX-512 F, BW, VL and DQ: the `f32` kernels `gemm` runs with its `x86-v4` feature.
    pub avx512: bool,
    /// AVX512-BF16 (`vdpbf16ps`): the `bf16` kernel.
    pub avx512_bf16: bool,
    /// AVX512-VNNI (`vpdpbusd`): the `int8` kernel.
    pub avx512_vnni: bool,
    /// AMX tiles with `bf16` and `int8` (CPUID), reported only: no kernel uses them.
    pub amx: bool,
    /// The portable paths were forced by `BURN_SKETCH_PORTABLE`.
    pub forced_portable: bool,
}

/// This CPU's [`Features`], detected at the first call.
pub fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let forced = std::env::var("BURN_SKETCH_PORTABLE").is_ok_and(|v| !v.is_empty() && v != "0");
        let detected = detect();
        if forced {
            tracing::info!(
                "BURN_SKETCH_PORTABLE is set: reduced-precision products take the portable path"
            );
            Features {
                forced_portable: true,
                amx: detected.amx,
                ..Features::default()
            }
        } else {
            detected
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    let avx512 = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq");
    Features {
        avx512,
        avx512_bf16: avx512 && std::arch::is_x86_feature_detected!("avx512bf16"),
        avx512_vnni: avx512 && std::arch::is_x86_feature_detected!("avx512vnni"),
        amx: amx_in_cpuid(),
        forced_portable: false,
    }
}

/// AMX-TILE, AMX-BF16 and AMX-INT8 (CPUID leaf 7, EDX bits 24, 22, 25). The standard
/// library's detection of them is unstable.
#[cfg(target_arch = "x86_64")]
fn amx_in_cpuid() -> bool {
    // Leaf 0 gives the highest leaf.
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    if max_leaf < 7 {
        return false;
    }
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    [22, 24, 25].iter().all(|bit| edx & (1 << bit) != 0)
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features::default()
}
