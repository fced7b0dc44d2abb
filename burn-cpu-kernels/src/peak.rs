//! This CPU's measured peak for each kind of product, so that a benchmark can state each
//! row's fraction of it: independent chains of the kernels' own multiply-add instructions on
//! every thread of a pool, timed.
//!
//! | precision | instruction | operations per instruction |
//! |---|---|---|
//! | `f32` | `vfmadd231ps` (AVX-512) | 32 (16 multiplies, 16 adds) |
//! | `bf16` | `vdpbf16ps` (AVX512-BF16) | 64 |
//! | `int8` | `vpdpbusd` (AVX512-VNNI) | 128 |

use std::time::Instant;

use crate::Isa;

/// A precision whose peak [`measure`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    /// `f32` fused multiply-adds.
    F32,
    /// `bf16` pair dot products into `f32`.
    Bf16,
    /// `u8 × i8` quad dot products into `i32`.
    Int8,
}

impl Arithmetic {
    /// `"f32"`, `"bf16"`, `"int8"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

/// Operations (a multiply and an add count two) per second on `threads` threads (the best of
/// nine rounds of about 5 ms), or `None` where this CPU lacks the instruction.
///
/// Why short rounds, many of them: on a machine shared with other work a long round is
/// almost never free of interruptions, and interruptions can only slow a round down, so the
/// fastest of many short rounds is the closest to the hardware's rate.
pub fn measure(precision: Arithmetic, threads: usize) -> Option<f64> {
    let f = Isa::detected();
    let available = match precision {
        Arithmetic::F32 => f.avx512(),
        Arithmetic::Bf16 => f.avx512_bf16(),
        Arithmetic::Int8 => f.avx512_vnni(),
    };
    if !available {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        const ITERATIONS: u64 = 2_500_000;
        // On rayon's own threads (the ones the products use), so that no other thread of
        // this process competes; the best of nine rounds, since a shared machine's
        // neighbours can only slow a round down.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build()
            .ok()?;
        let round = || {
            let start = Instant::now();
            pool.broadcast(|_| {
                // SAFETY: the instruction's features were detected above.
                unsafe { kernels::chains(precision, ITERATIONS) }
            });
            start.elapsed().as_secs_f64()
        };
        round(); // warm the clocks
        let seconds = (0..9).map(|_| round()).fold(f64::INFINITY, f64::min);
        let threads = pool.current_num_threads();
        let per_instruction = match precision {
            Arithmetic::F32 => 32.0,
            Arithmetic::Bf16 => 64.0,
            Arithmetic::Int8 => 128.0,
        };
        let instructions = (ITERATIONS * kernels::CHAINS as u64 * threads as u64) as f64;
        Some(instructions * per_instruction / seconds)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod kernels {
    use std::arch::x86_64::*;

    use super::Arithmetic;

    /// Independent accumulators. Zen 5 issues two 512-bit multiply-adds a cycle, with a
    /// latency of 4 cycles (`vfmadd231ps`) and more for `vdpbf16ps`, so at least 8 chains
    /// (`f32`) to 12 or more (`bf16`) must be in flight: on one Zen 5 core, with the nine
    /// short rounds of [`super::measure`], 12 and 16 chains both measured 258 to 262 GFLOP/s
    /// in `f32` (2 × 32 × 4.1 GHz), but 469 to 487 against 520 to 526 GOP/s in `bf16`.
    /// Sixteen accumulators and the two operands still fit the 32 registers.
    pub(super) const CHAINS: usize = 16;

    /// Runs `iterations` rounds of [`CHAINS`] independent multiply-adds of `precision`.
    ///
    /// # Safety
    /// The CPU has the precision's instruction (see [`super::measure`]).
    pub(super) unsafe fn chains(precision: Arithmetic, iterations: u64) -> f32 {
        // SAFETY: the caller checked the instruction's feature.
        let sink = unsafe {
            match precision {
                Arithmetic::F32 => f32_chains(iterations),
                Arithmetic::Bf16 => bf16_chains(iterations),
                Arithmetic::Int8 => int8_chains(iterations),
            }
        };
        std::hint::black_box(sink)
    }

    #[target_feature(enable = "avx512f")]
    fn f32_chains(iterations: u64) -> f32 {
        let (a, b) = (_mm512_set1_ps(1.000_001), _mm512_set1_ps(0.999_999));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..iterations {
            for c in &mut acc {
                *c = _mm512_fmadd_ps(a, b, *c);
            }
        }
        acc.iter().map(|&c| _mm512_reduce_add_ps(c)).sum()
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    fn bf16_chains(iterations: u64) -> f32 {
        let a: __m512bh = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5), _mm512_set1_ps(0.25));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..iterations {
            for c in &mut acc {
                *c = _mm512_dpbf16_ps(*c, a, a);
            }
        }
        acc.iter().map(|&c| _mm512_reduce_add_ps(c)).sum()
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    fn int8_chains(iterations: u64) -> f32 {
        let (a, b) = (_mm512_set1_epi8(1), _mm512_set1_epi8(-1));
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        for _ in 0..iterations {
            for c in &mut acc {
                *c = _mm512_dpbusd_epi32(*c, a, b);
            }
        }
        acc.iter().map(|&c| _mm512_reduce_add_epi32(c) as f32).sum()
    }
}
