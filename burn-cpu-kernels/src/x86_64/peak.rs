//! The chains of multiply-adds [`crate::peak::measure`] times, one function per instruction,
//! each compiled for its feature.

use std::arch::x86_64::*;

use crate::peak::Arithmetic;

/// Independent accumulators. A core keeps its multiply-add units busy only with as many
/// independent chains in flight as its issue rate times the instruction's latency: two
/// 512-bit instructions a cycle at a latency of 4 (`vfmadd231ps`) need 8, and `vdpbf16ps`'s
/// longer latency needs more; 16 covers both (fewer chains leave the `bf16` peak short).
/// Sixteen accumulators and the two operands still fit the 32 registers.
pub(crate) const CHAINS: usize = 16;

/// Runs `iterations` rounds of [`CHAINS`] independent multiply-adds of `precision`.
///
/// # Safety
/// The CPU has the precision's instruction: [`Isa::avx512`](crate::Isa::avx512) for `f32`,
/// [`Isa::avx512_bf16`](crate::Isa::avx512_bf16) for `bf16`,
/// [`Isa::avx512_vnni`](crate::Isa::avx512_vnni) for `int8` (see [`crate::peak::measure`]).
pub(crate) unsafe fn chains(precision: Arithmetic, iterations: u64) -> f32 {
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

/// `vfmadd231ps` chains.
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

/// `vdpbf16ps` chains.
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

/// `vpdpbusd` chains.
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
