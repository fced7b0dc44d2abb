//! The one seam between this crate's kernels and the instructions a CPU has: an [`Isa`] value
//! that every kernel's `_on` form takes, and the detection behind [`Isa::detected`].
//!
//! Why a value and not an environment variable or a global: a test compares the two paths
//! of a kernel in one process, a benchmark times both in one run, and a library using the
//! crate never has its paths changed from outside. The default forms (`sgemm::matmul`,
//! `softmax::softmax_rows`, …) call their `_on` form with [`Isa::detected`].
//!
//! Each path is decided by one predicate of [`Isa`], the same for every kernel that takes it:
//! [`Isa::avx512`] for the `f32` kernels, the element-wise functions, the row kernels,
//! attention and the conversions; [`Isa::avx512_bf16`] for the `bf16` product;
//! [`Isa::avx512_vnni`] for the `int8` product.

use std::sync::OnceLock;

/// The instruction-set extensions a kernel may use, as a value: [`Isa::detected`] (what this
/// CPU has) or [`Isa::PORTABLE`] (none: the portable code, on any CPU). A narrower value can
/// be made from a wider one ([`Isa::without_extensions`]), never a wider one than the CPU
/// has, so that no kernel runs an instruction the CPU lacks.
///
/// ```
/// use burn_cpu_kernels::Isa;
///
/// let portable = Isa::PORTABLE;
/// assert!(!portable.avx512() && !portable.avx512_bf16() && !portable.avx512_vnni());
/// // The detected value never claims an extension without the base it builds on.
/// let detected = Isa::detected();
/// assert!(detected.avx512() || !detected.avx512_bf16());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Isa {
    avx512: bool,
    avx512_bf16: bool,
    avx512_vnni: bool,
}

impl Isa {
    /// No extension: every kernel's portable path.
    pub const PORTABLE: Isa = Isa {
        avx512: false,
        avx512_bf16: false,
        avx512_vnni: false,
    };

    /// What this CPU has, detected at the first call and cached (detection only: nothing
    /// outside the process's CPU changes it).
    pub fn detected() -> Isa {
        static DETECTED: OnceLock<Isa> = OnceLock::new();
        *DETECTED.get_or_init(detect)
    }

    /// AVX-512 F, BW, VL and DQ with FMA: the `f32` micro-kernel, the vectorised
    /// element-wise functions and row kernels, attention and the `f32` ↔ half conversions.
    /// FMA is part of it because the polynomials fuse their multiply-adds on this path (one
    /// rule, so that every kernel of a path rounds the same way).
    pub fn avx512(self) -> bool {
        self.avx512
    }

    /// [`avx512`](Self::avx512) and AVX512-BF16 (`vdpbf16ps`): the `bf16` product.
    pub fn avx512_bf16(self) -> bool {
        self.avx512_bf16
    }

    /// [`avx512`](Self::avx512) and AVX512-VNNI (`vpdpbusd`): the `int8` product.
    pub fn avx512_vnni(self) -> bool {
        self.avx512_vnni
    }

    /// `self` with AVX-512 kept but its `bf16` and `int8` extensions off: the `f32` paths of
    /// an AVX-512 CPU with the reduced-precision products on their portable paths.
    pub fn without_extensions(self) -> Isa {
        Isa {
            avx512_bf16: false,
            avx512_vnni: false,
            ..self
        }
    }

    /// A short name for tables and JSON: `"portable"`, `"avx512"`, `"avx512+bf16+vnni"`, ….
    pub fn name(self) -> &'static str {
        match (self.avx512, self.avx512_bf16, self.avx512_vnni) {
            (false, _, _) => "portable",
            (true, false, false) => "avx512",
            (true, true, false) => "avx512+bf16",
            (true, false, true) => "avx512+vnni",
            (true, true, true) => "avx512+bf16+vnni",
        }
    }
}

impl Default for Isa {
    /// [`Isa::detected`].
    fn default() -> Self {
        Isa::detected()
    }
}

/// Whether this CPU reports AMX tiles with `bf16` and `int8` (CPUID leaf 7, EDX bits 22, 24
/// and 25). Reported for benchmarks' machine lines only: no kernel uses AMX, since no machine
/// this project runs on has it and code we cannot run is a claim we cannot test.
pub fn cpu_has_amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 0 gives the highest leaf; the standard library's detection of AMX is unstable.
        let max_leaf = std::arch::x86_64::__cpuid(0).eax;
        if max_leaf < 7 {
            return false;
        }
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        [22, 24, 25].iter().all(|bit| edx & (1 << bit) != 0)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    let avx512 =
        has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq") && has!("fma");
    Isa {
        avx512,
        avx512_bf16: avx512 && has!("avx512bf16"),
        avx512_vnni: avx512 && has!("avx512vnni"),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::PORTABLE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detected_value_is_what_the_cpu_reports() {
        let isa = Isa::detected();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let base = has!("avx512f")
                && has!("avx512bw")
                && has!("avx512vl")
                && has!("avx512dq")
                && has!("fma");
            assert_eq!(isa.avx512(), base);
            assert_eq!(isa.avx512_bf16(), base && has!("avx512bf16"));
            assert_eq!(isa.avx512_vnni(), base && has!("avx512vnni"));
        }
        assert_eq!(isa, Isa::default());
        assert_eq!(isa.without_extensions().avx512(), isa.avx512());
        assert!(!isa.without_extensions().avx512_bf16());
        assert_eq!(Isa::PORTABLE.name(), "portable");
    }
}
