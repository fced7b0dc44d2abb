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
/// nine short rounds), or `None` where this CPU lacks the instruction. Always on this CPU's
/// instructions ([`Isa::detected`]): it measures the machine, not a path.
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
                unsafe { crate::x86_64::peak::chains(precision, ITERATIONS) }
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
        let chains = crate::x86_64::peak::CHAINS as u64;
        let instructions = (ITERATIONS * chains * threads as u64) as f64;
        Some(instructions * per_instruction / seconds)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        None
    }
}
