//! Fused scaled-dot-product attention on the CPU: `softmax(q·kᵀ·scale + …)·v` without the
//! `[b, h, sq, sk]` score tensor.
//!
//! burn-flex 0.21's attention kernels take one `(batch, head)` after another on one thread,
//! and burn-backend's `attention_fallback` writes the whole score tensor to memory several
//! times between its separate kernels. [`forward`] hands rayon's threads one block of
//! queries of one head each; a block multiplies its queries by a block of keys with
//! [`gemm()`](crate::gemm()) (one thread each, inside the parallel loop), applies the scale,
//! softcap, mask, causal mask and bias and the softmax's exponentials while the scores are in
//! cache, and multiplies them by the block of values into an accumulator. Keys longer than
//! one block are taken block by block with an online softmax (a running maximum and sum per
//! query, flash-attention style), so a thread's scratch is `O(block_q × block_k)` whatever
//! the sequence lengths.
//!
//! The semantics are those of burn-backend 0.21's `attention_fallback`:
//!
//! - `scores = q·kᵀ·scale`, `scale` by default `1/√d`;
//! - softcap `c`: `scores ← c·tanh(scores / c)`, before any masking;
//! - a mask value that is nonzero (Burn's `true`) masks that score (`−∞`);
//! - causal: key `j` is masked for query `i` when `j > i + sk − sq` (the diagonal aligned at
//!   the bottom-right corner, so with `sq > sk` the first `sq − sk` queries see no key);
//! - the bias is added after masking (a masked score stays `−∞`; a `−∞` bias masks too);
//! - a query whose scores are all masked gets an output of zeros (the fallback clamps the
//!   row maximum to `f32::MIN` and the row sum to `f32::MIN_POSITIVE`).
//!
//! A NaN in a query's scores makes its output row NaN, as in the fallback; with `sk = 0` the
//! output is zeros.
//!
//! Mask and bias are 4-D views whose size-1 dimensions broadcast against
//! `[b, h, sq, sk]` (a padding mask is typically `[b, 1, 1, sk]`).
//!
//! [`reference()`] computes the same thing naively in `f64`, for tests.
//!
//! ```
//! use burn_cpu_kernels::attention::{self, Options, View4};
//!
//! // One head, two queries, two keys, d = dv = 1.
//! let (q, k, v) = ([1.0f32, 0.0], [1.0f32, -1.0], [10.0f32, 20.0]);
//! let view = |data| View4::contiguous(data, [1, 1, 2, 1]);
//! let mut out = [0.0f32; 2];
//! let causal = Options { causal: true, ..Options::default() };
//! attention::forward(&mut out, view(&q), view(&k), view(&v), None, None, causal, true);
//! // The first query sees only the first key; the second one weighs both equally.
//! assert_eq!(out, [10.0, 15.0]);
//! ```

use std::cell::RefCell;

use rayon::prelude::*;

use crate::convert::StoredFloat;
use crate::math::{exp_non_positive_f, tanh_f};
use crate::{MatRef, gemm};

/// A strided, read-only 4-D tensor of `T`, in elements: index `[i0, i1, i2, i3]` is at
/// `offset + Σ iₙ·stridesₙ` of `data`. Burn tensors arrive permuted (after `swap_dims` of a
/// `[b, s, h, d]` projection, say); a view reads them in place, without a copy.
#[derive(Clone, Copy, Debug)]
pub struct View4<'a, T> {
    data: &'a [T],
    offset: usize,
    shape: [usize; 4],
    strides: [isize; 4],
}

impl<'a, T: Copy> View4<'a, T> {
    /// A contiguous (row-major) tensor of `shape`.
    ///
    /// # Panics
    /// If `data` does not hold exactly the product of `shape` elements.
    pub fn contiguous(data: &'a [T], shape: [usize; 4]) -> Self {
        let count: usize = shape.iter().product();
        assert_eq!(
            data.len(),
            count,
            "a contiguous {shape:?} tensor needs {count} elements, got {}",
            data.len()
        );
        let [_, s1, s2, s3] = shape;
        let strides = [s1 * s2 * s3, s2 * s3, s3, 1].map(|s| s as isize);
        Self::strided(data, 0, shape, strides)
    }

    /// A tensor through strides (permuted, sliced, broadcast with stride 0, or flipped with
    /// negative strides).
    ///
    /// # Panics
    /// If an element of the view lies outside `data`.
    pub fn strided(data: &'a [T], offset: usize, shape: [usize; 4], strides: [isize; 4]) -> Self {
        if shape.iter().all(|&s| s > 0) {
            let (mut low, mut high) = (offset as isize, offset as isize);
            for (&size, &stride) in shape.iter().zip(&strides) {
                let reach = (size as isize - 1) * stride;
                low += reach.min(0);
                high += reach.max(0);
            }
            assert!(
                low >= 0 && (high as usize) < data.len(),
                "a {shape:?} view with strides {strides:?} at {offset} reaches outside its \
                 buffer of {}",
                data.len()
            );
        }
        Self {
            data,
            offset,
            shape,
            strides,
        }
    }

    /// The same elements with their dimensions reordered: dimension `n` of the result is
    /// dimension `axes[n]` of `self` (`[0, 2, 1, 3]` turns `[b, s, h, d]` into `[b, h, s, d]`).
    ///
    /// # Panics
    /// If `axes` is not a permutation of `0..4`.
    pub fn permute(self, axes: [usize; 4]) -> Self {
        let mut seen = [false; 4];
        for &a in &axes {
            assert!(a < 4 && !seen[a], "{axes:?} is not a permutation of 0..4");
            seen[a] = true;
        }
        Self {
            shape: axes.map(|a| self.shape[a]),
            strides: axes.map(|a| self.strides[a]),
            ..self
        }
    }

    /// `[d0, d1, d2, d3]`.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// The element at `index`.
    ///
    /// # Panics
    /// If `index` is outside the shape.
    pub fn at(&self, index: [usize; 4]) -> T {
        assert!(
            index.iter().zip(&self.shape).all(|(i, s)| i < s),
            "{index:?} is outside {:?}",
            self.shape
        );
        self.data[self.position(index) as usize]
    }

    fn position(&self, index: [usize; 4]) -> isize {
        let mut at = self.offset as isize;
        for (&i, &stride) in index.iter().zip(&self.strides) {
            at += i as isize * stride;
        }
        at
    }

    /// The view read as `target`: each dimension equal to the target's, or 1 (read with
    /// stride 0).
    ///
    /// # Panics
    /// If a dimension is neither.
    fn broadcast(self, target: [usize; 4], name: &str) -> Self {
        let mut strides = self.strides;
        for n in 0..4 {
            if self.shape[n] != target[n] {
                assert!(
                    self.shape[n] == 1,
                    "attention: the {name} of shape {:?} does not broadcast to {target:?}",
                    self.shape
                );
                strides[n] = 0;
            }
        }
        Self {
            shape: target,
            strides,
            ..self
        }
    }

    /// The matrix of the last two dimensions at `[i0, i1]`.
    fn matrix(&self, i0: usize, i1: usize) -> MatRef<'a, T> {
        MatRef::strided(
            self.data,
            self.position([i0, i1, 0, 0]) as usize,
            [self.shape[2], self.shape[3]],
            [self.strides[2], self.strides[3]],
        )
    }

    /// Elements `start..start + len` of the last dimension at `[i0, i1, i2]`, in the form
    /// the fastest loop over them can take.
    fn line(&self, [i0, i1, i2]: [usize; 3], start: usize, len: usize) -> Line<'a, T> {
        let first = self.position([i0, i1, i2, start]);
        match self.strides[3] {
            0 => Line::Splat(self.data[first as usize]),
            1 => Line::Slice(&self.data[first as usize..first as usize + len]),
            stride => Line::Strided {
                data: self.data,
                first,
                stride,
            },
        }
    }
}

/// A run of a view's last dimension.
enum Line<'a, T> {
    /// Contiguous elements.
    Slice(&'a [T]),
    /// One element, broadcast.
    Splat(T),
    /// Element `n` at `first + n·stride`.
    Strided {
        data: &'a [T],
        first: isize,
        stride: isize,
    },
}

impl<T: Copy> Line<'_, T> {
    /// `f(&mut values[n], element n)` for every `n`.
    #[inline(always)]
    fn zip_with(&self, values: &mut [f32], mut f: impl FnMut(&mut f32, T)) {
        match *self {
            Line::Slice(s) => values.iter_mut().zip(s).for_each(|(v, &e)| f(v, e)),
            Line::Splat(e) => values.iter_mut().for_each(|v| f(v, e)),
            Line::Strided {
                data,
                first,
                stride,
            } => {
                for (n, v) in values.iter_mut().enumerate() {
                    f(v, data[(first + n as isize * stride) as usize]);
                }
            }
        }
    }
}

/// What burn-backend 0.21's `AttentionModuleOptions` says (its `f64`s as `f32`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Options {
    /// The factor of `q·kᵀ`; `None`: `1/√d`.
    pub scale: Option<f32>,
    /// `c` of `c·tanh(scores / c)`, applied before masking; positive.
    pub softcap: Option<f32>,
    /// Mask key `j` for query `i` when `j > i + sk − sq`.
    pub causal: bool,
}

/// Block sizes: queries per task, keys per step of the online softmax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blocks {
    q: usize,
    k: usize,
}

impl Blocks {
    /// Up to 256 queries by 512 keys (256 keys when `d + dv > 128`). `gemm` packs a block of
    /// keys and of values for each task that reads it, so the more queries share a block the
    /// less packing per product: on this Zen 5 (1 MiB L2 per core) 256 × 512 at
    /// `d = dv = 64` (scratch about 0.9 MiB: scores 512 KiB, keys and values 128 KiB each,
    /// queries and accumulator 64 KiB each) took 18.1 ms of CPU time on `b = 1, h = 12,
    /// s = 1024` where 128 × 512 took 19.3 ms and 64 × 256 took 22.5 ms, one thread. Fewer
    /// queries per task when the tensor has fewer than 16 tasks, so that both cores (and
    /// more) have work; never below 8. Sizes depend on the shape only, so serial and parallel
    /// runs give identical results.
    fn for_shape(heads: usize, sq: usize, d: usize, dv: usize) -> Self {
        let mut q = 256;
        while q > 8 && heads * sq.div_ceil(q) < 16 {
            q /= 2;
        }
        let k = if d + dv <= 128 { 512 } else { 256 };
        Self { q, k }
    }
}

/// Scaled-dot-product attention, `softmax(q·kᵀ·scale …)·v`, into the contiguous
/// `[b, h, sq, dv]` tensor `out`, with the semantics of burn-backend 0.21's
/// `attention_fallback` (the [module docs](self) list them): `mask` (nonzero = masked) and
/// `bias` broadcast from any shape whose dimensions are those of `[b, h, sq, sk]` or 1.
/// With `parallel`, rayon's threads share the `(batch, head, block of queries)` tasks; the
/// result does not depend on it.
///
/// # Panics
/// If `q` is not `[b, h, sq, d]`, `k` `[b, h, sk, d]` and `v` `[b, h, sk, dv]` with `d > 0`;
/// if `out` does not hold `b·h·sq·dv` elements; if `mask` or `bias` does not broadcast to
/// `[b, h, sq, sk]`; if the softcap is not positive.
#[allow(clippy::too_many_arguments)]
pub fn forward<E: StoredFloat>(
    out: &mut [E],
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    options: Options,
    parallel: bool,
) {
    let problem = Problem::new(q, k, v, mask, bias, options);
    let [b, h, sq, _] = q.shape;
    assert_eq!(
        out.len(),
        b * h * sq * problem.dv,
        "the output of [{b}, {h}, {sq}, {}] has {} elements",
        problem.dv,
        out.len()
    );
    problem.run(
        out,
        Blocks::for_shape(b * h, sq, q.shape[3], problem.dv),
        parallel,
    );
}

/// The checked inputs of one call.
struct Problem<'a, E> {
    q: View4<'a, E>,
    k: View4<'a, E>,
    v: View4<'a, E>,
    mask: Option<View4<'a, u8>>,
    bias: Option<View4<'a, E>>,
    scale: f32,
    softcap: Option<f32>,
    /// `sk − sq` when causal.
    causal_offset: Option<isize>,
    dv: usize,
}

impl<'a, E: StoredFloat> Problem<'a, E> {
    fn new(
        q: View4<'a, E>,
        k: View4<'a, E>,
        v: View4<'a, E>,
        mask: Option<View4<'a, u8>>,
        bias: Option<View4<'a, E>>,
        options: Options,
    ) -> Self {
        let [b, h, sq, d] = q.shape;
        let [.., sk, dv] = v.shape;
        assert!(
            k.shape == [b, h, sk, d] && v.shape[..3] == [b, h, sk],
            "attention: q {:?}, k {:?} and v {:?} are not [b, h, sq, d], [b, h, sk, d] and \
             [b, h, sk, dv]",
            q.shape,
            k.shape,
            v.shape
        );
        assert!(d > 0, "attention: the head dimension d is 0");
        if let Some(softcap) = options.softcap {
            assert!(softcap > 0.0, "softcap must be positive, got {softcap}");
        }
        let target = [b, h, sq, sk];
        Self {
            q,
            k,
            v,
            mask: mask.map(|m| m.broadcast(target, "mask")),
            bias: bias.map(|m| m.broadcast(target, "bias")),
            scale: options
                .scale
                .unwrap_or_else(|| (1.0 / (d as f64).sqrt()) as f32),
            softcap: options.softcap,
            causal_offset: options.causal.then_some(sk as isize - sq as isize),
            dv,
        }
    }

    /// Every task, each writing its own rows of `out`.
    fn run(&self, out: &mut [E], blocks: Blocks, parallel: bool) {
        let [_, heads, sq, _] = self.q.shape;
        if out.is_empty() {
            return;
        }
        let (head_len, block_len) = (sq * self.dv, blocks.q * self.dv);
        let task = |bh: usize, block: usize, dst: &mut [E]| {
            self.block(bh / heads, bh % heads, block * blocks.q, dst, blocks.k)
        };
        // Below about a million multiply-adds (`b=1, h=12, s=16, d=64` has 0.4 M) waking the
        // pool costs more than the second thread saves.
        let [_, _, _, sk] = self.mask.map_or([0, 0, 0, self.k.shape[2]], |m| m.shape);
        let work = out.len() / self.dv * sk * (self.q.shape[3] + self.dv);
        if parallel && work >= 1 << 20 {
            out.par_chunks_mut(head_len)
                .enumerate()
                .for_each(|(bh, head)| {
                    head.par_chunks_mut(block_len)
                        .enumerate()
                        .for_each(|(block, dst)| task(bh, block, dst))
                });
        } else {
            for (bh, head) in out.chunks_mut(head_len).enumerate() {
                for (block, dst) in head.chunks_mut(block_len).enumerate() {
                    task(bh, block, dst);
                }
            }
        }
    }

    /// The output rows `q0..q0 + dst.len()/dv` of head `(bi, hi)`, keys `block_k` at a time.
    fn block(&self, bi: usize, hi: usize, q0: usize, dst: &mut [E], block_k: usize) {
        let (dv, sk) = (self.dv, self.k.shape[2]);
        let nq = dst.len() / dv;
        // Keys past the causal boundary of the block's last query are masked for all of
        // its queries: not read at all.
        let key_end = match self.causal_offset {
            Some(offset) => ((q0 + nq) as isize + offset).clamp(0, sk as isize) as usize,
            None => sk,
        };
        if key_end == 0 {
            dst.fill(E::from_f32(0.0));
            return;
        }
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.block_in(bi, hi, q0, dst, block_k, key_end, &mut scratch),
            // Only if a task ever ran inside another on one thread.
            Err(_) => self.block_in(bi, hi, q0, dst, block_k, key_end, &mut Scratch::default()),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn block_in(
        &self,
        bi: usize,
        hi: usize,
        q0: usize,
        dst: &mut [E],
        block_k: usize,
        key_end: usize,
        scratch: &mut Scratch,
    ) {
        let dv = self.dv;
        let nq = dst.len() / dv;
        let Scratch {
            q_wide,
            k_wide,
            v_wide,
            scores,
            acc,
            maxes,
            sums,
        } = scratch;
        let queries = E::widen(self.q.matrix(bi, hi).rows(q0, nq), q_wide);
        maxes.clear();
        maxes.resize(nq, f32::MIN);
        sums.clear();
        sums.resize(nq, 0.0);
        acc.resize(nq * dv, 0.0);
        scores.resize(nq * block_k.min(key_end), 0.0);
        for k0 in (0..key_end).step_by(block_k) {
            let nk = block_k.min(key_end - k0);
            let keys = E::widen(self.k.matrix(bi, hi).rows(k0, nk), k_wide);
            let scores = &mut scores[..nq * nk];
            gemm(
                scores,
                nk,
                queries,
                keys.t(),
                self.scale,
                false,
                gemm::Parallelism::None,
            );
            let step = Step {
                problem: self,
                bi,
                hi,
                q0,
                k0,
                nk,
                first: k0 == 0,
            };
            step.softmax(scores, &mut acc[..nq * dv], maxes, sums);
            let values = E::widen(self.v.matrix(bi, hi).rows(k0, nk), v_wide);
            gemm(
                &mut acc[..nq * dv],
                dv,
                MatRef::row_major(scores, nq, nk),
                values,
                1.0,
                k0 > 0,
                gemm::Parallelism::None,
            );
        }
        for ((out, acc), &sum) in dst
            .chunks_exact_mut(dv)
            .zip(acc.chunks_exact(dv))
            .zip(&*sums)
        {
            // The fallback's clamp: a fully masked query has sum 0 and accumulator 0.
            let inv = 1.0 / sum.max(f32::MIN_POSITIVE);
            for (o, &a) in out.iter_mut().zip(acc) {
                *o = E::from_f32(a * inv);
            }
        }
    }
}

/// One thread's buffers, kept between tasks.
#[derive(Default)]
struct Scratch {
    q_wide: Vec<f32>,
    k_wide: Vec<f32>,
    v_wide: Vec<f32>,
    scores: Vec<f32>,
    acc: Vec<f32>,
    maxes: Vec<f32>,
    sums: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// One block of keys of one task, between its two products.
struct Step<'p, 'a, E> {
    problem: &'p Problem<'a, E>,
    bi: usize,
    hi: usize,
    q0: usize,
    k0: usize,
    nk: usize,
    first: bool,
}

impl<E: StoredFloat> Step<'_, '_, E> {
    /// Turns the block's raw scores into `exp(score − running max)`, updating each query's
    /// running maximum and sum and rescaling its accumulator when the maximum grows.
    fn softmax(&self, scores: &mut [f32], acc: &mut [f32], maxes: &mut [f32], sums: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::Isa::detected().avx512() {
            // SAFETY: AVX-512F and FMA were detected (and `BURN_SKETCH_PORTABLE` is not set).
            unsafe { self.softmax_avx512(scores, acc, maxes, sums) };
            return;
        }
        self.softmax_rows::<false>(scores, acc, maxes, sums);
    }

    /// [`softmax_rows`](Self::softmax_rows) compiled for AVX-512: sixteen scores per
    /// instruction, the polynomials in fused multiply-adds.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    fn softmax_avx512(
        &self,
        scores: &mut [f32],
        acc: &mut [f32],
        maxes: &mut [f32],
        sums: &mut [f32],
    ) {
        self.softmax_rows::<true>(scores, acc, maxes, sums);
    }

    /// The fallback's order: softcap, mask, causal mask, bias; then the online softmax.
    /// `FMA`: the polynomials of [`exp_non_positive_f`] and [`tanh_f`] in fused
    /// multiply-adds (a call to `fmaf` each without the instruction).
    #[inline(always)]
    fn softmax_rows<const FMA: bool>(
        &self,
        scores: &mut [f32],
        acc: &mut [f32],
        maxes: &mut [f32],
        sums: &mut [f32],
    ) {
        let p = self.problem;
        let (nk, dv) = (self.nk, p.dv);
        let rows = scores
            .chunks_exact_mut(nk)
            .zip(acc.chunks_exact_mut(dv))
            .zip(maxes.iter_mut().zip(sums.iter_mut()));
        for (r, ((row, acc), (max, sum))) in rows.enumerate() {
            let i = self.q0 + r;
            if let Some(cap) = p.softcap {
                // A product by `1/c` rather than a division per score: half a rounding more
                // (`tanh_f` is within 1.1 ulp), a tenth less time for this pass.
                let inverse = 1.0 / cap;
                row.iter_mut()
                    .for_each(|s| *s = cap * tanh_f::<FMA>(*s * inverse));
            }
            // Keys `limit..` are after the causal boundary.
            let limit = match p.causal_offset {
                Some(offset) => {
                    (i as isize + offset + 1 - self.k0 as isize).clamp(0, nk as isize) as usize
                }
                None => nk,
            };
            row[limit..].fill(f32::NEG_INFINITY);
            let row_open = &mut row[..limit];
            if let Some(mask) = &p.mask {
                mask.line([self.bi, self.hi, i], self.k0, limit)
                    .zip_with(row_open, |s, m| {
                        if m != 0 {
                            *s = f32::NEG_INFINITY
                        }
                    });
            }
            if let Some(bias) = &p.bias {
                bias.line([self.bi, self.hi, i], self.k0, limit)
                    .zip_with(row_open, |s, b| *s += b.to_f32());
            }
            // The fallback clamps the maximum to `f32::MIN`: a masked row stays at `−∞ − MIN
            // = −∞` and its exponentials at 0.
            let new_max = max_of(row).max(*max);
            let block_sum = exp_shifted::<FMA>(row, new_max);
            if self.first {
                *sum = block_sum;
            } else {
                let factor = exp_non_positive_f::<FMA>(*max - new_max);
                *sum = *sum * factor + block_sum;
                if factor != 1.0 {
                    acc.iter_mut().for_each(|a| *a *= factor);
                }
            }
            *max = new_max;
        }
    }
}

/// The largest value (`−∞` for none), sixteen lanes at a time. A comparison rather than
/// `f32::max`, whose NaN rule costs two more instructions per vector: a NaN is skipped here,
/// and turns the row's exponentials into NaN in [`exp_shifted`].
#[inline(always)]
fn max_of(values: &[f32]) -> f32 {
    let bigger = |m: f32, v: f32| if v > m { v } else { m };
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = values.chunks_exact(16);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (l, &v) in lanes.iter_mut().zip(chunk) {
            *l = bigger(*l, v);
        }
    }
    rest.iter()
        .fold(reduce(lanes, bigger), |m, &v| bigger(m, v))
}

/// `lanes` folded by `f` pairwise, halves at a time: four dependent steps (shuffles of one
/// register) rather than fifteen; rows are short (128 keys: eight vectors), so a serial
/// fold per row would cost as much as the vectors.
#[inline(always)]
fn reduce(mut lanes: [f32; 16], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = 8;
    while width > 0 {
        for i in 0..width {
            lanes[i] = f(lanes[i], lanes[i + width]);
        }
        width /= 2;
    }
    lanes[0]
}

/// `v ← exp(v − max)` for each value, and their sum, sixteen lanes at a time.
#[inline(always)]
fn exp_shifted<const FMA: bool>(values: &mut [f32], max: f32) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = values.chunks_exact_mut(16);
    for chunk in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *v = exp_non_positive_f::<FMA>(*v - max);
            *l += *v;
        }
    }
    let mut rest = 0.0;
    for v in chunks.into_remainder() {
        *v = exp_non_positive_f::<FMA>(*v - max);
        rest += *v;
    }
    reduce(lanes, |a, b| a + b) + rest
}

/// The fallback's computation in `f64`, naively (the whole `[b, h, sq, sk]` score tensor),
/// on the same views and options as [`forward`]: the contiguous `[b, h, sq, dv]` output.
///
/// # Panics
/// As [`forward`].
pub fn reference<E: StoredFloat>(
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    options: Options,
) -> Vec<f64> {
    let p = Problem::new(q, k, v, mask, bias, options);
    let ([b, h, sq, d], sk, dv) = (q.shape, k.shape[2], p.dv);
    let f = |e: E| e.to_f32() as f64;
    let mut out = vec![0.0f64; b * h * sq * dv];
    let mut scores = vec![0.0f64; sk];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..sq {
                for (j, s) in scores.iter_mut().enumerate() {
                    let dot: f64 = (0..d)
                        .map(|c| f(q.at([bi, hi, i, c])) * f(k.at([bi, hi, j, c])))
                        .sum();
                    *s = dot * p.scale as f64;
                    if let Some(cap) = p.softcap {
                        let cap = cap as f64;
                        *s = cap * (*s / cap).tanh();
                    }
                    if p.mask.is_some_and(|m| m.at([bi, hi, i, j]) != 0) {
                        *s = f64::NEG_INFINITY;
                    }
                    if p.causal_offset.is_some_and(|o| j as isize > i as isize + o) {
                        *s = f64::NEG_INFINITY;
                    }
                    if let Some(bias) = p.bias {
                        *s += f(bias.at([bi, hi, i, j]));
                    }
                }
                let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                let max = max.max(f64::MIN);
                let weights: Vec<f64> = scores.iter().map(|&s| (s - max).exp()).collect();
                let sum = weights.iter().sum::<f64>().max(f64::MIN_POSITIVE);
                let row = ((bi * h + hi) * sq + i) * dv;
                for (c, o) in out[row..row + dv].iter_mut().enumerate() {
                    *o = (0..sk)
                        .map(|j| weights[j] / sum * f(v.at([bi, hi, j, c])))
                        .sum();
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::half::bf16;

    /// A SplitMix64 stream of values in `[-1, 1)`.
    fn values(seed: u64, count: usize) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        (0..count)
            .map(|_| {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Contiguous inputs: `q` `[b, h, sq, d]`, `k` `[b, h, sk, d]`, `v` `[b, h, sk, dv]`,
    /// scaled by `amplitude` (scores of several units: the softmax is far from uniform).
    struct Inputs {
        dims: [usize; 6],
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
    }

    impl Inputs {
        fn new([b, h, sq, sk, d, dv]: [usize; 6], seed: u64, amplitude: f32) -> Self {
            let scaled = |s, n| values(s, n).into_iter().map(|x| x * amplitude).collect();
            Self {
                dims: [b, h, sq, sk, d, dv],
                q: scaled(seed, b * h * sq * d),
                k: scaled(seed + 1, b * h * sk * d),
                v: values(seed + 2, b * h * sk * dv),
            }
        }

        fn views(&self) -> [View4<'_, f32>; 3] {
            let [b, h, sq, sk, d, dv] = self.dims;
            [
                View4::contiguous(&self.q, [b, h, sq, d]),
                View4::contiguous(&self.k, [b, h, sk, d]),
                View4::contiguous(&self.v, [b, h, sk, dv]),
            ]
        }
    }

    /// `forward` with the given blocks (`None`: the shape's own).
    fn run(
        [q, k, v]: [View4<'_, f32>; 3],
        mask: Option<View4<'_, u8>>,
        bias: Option<View4<'_, f32>>,
        options: Options,
        blocks: Option<Blocks>,
        parallel: bool,
    ) -> Vec<f32> {
        let [b, h, sq, _] = q.shape();
        let dv = v.shape()[3];
        let mut out = vec![f32::NAN; b * h * sq * dv];
        match blocks {
            None => forward(&mut out, q, k, v, mask, bias, options, parallel),
            Some(blocks) => {
                Problem::new(q, k, v, mask, bias, options).run(&mut out, blocks, parallel)
            }
        }
        out
    }

    /// The tolerance: each output is a weighted mean of values in `[-1, 1]`, so its error is
    /// stated against that scale, `|got − reference| ≤ 1e-5`.
    const TOLERANCE: f64 = 1e-5;

    fn assert_close(got: &[f32], expected: &[f64], what: &str) {
        assert_eq!(got.len(), expected.len(), "{what}: lengths");
        let worst = got
            .iter()
            .zip(expected)
            .map(|(&g, &e)| (g as f64 - e).abs())
            .fold(
                0.0f64,
                |w, e| if e.is_nan() { f64::INFINITY } else { w.max(e) },
            );
        assert!(worst <= TOLERANCE, "{what}: worst error {worst:e}");
    }

    /// Small blocks, so that several query blocks and several key blocks (the online
    /// softmax's rescaling) occur on small shapes, and the default ones.
    const BLOCKINGS: [Option<Blocks>; 3] = [
        None,
        Some(Blocks { q: 3, k: 5 }),
        Some(Blocks { q: 8, k: 16 }),
    ];

    fn check(dims: [usize; 6], options: Options, what: &str) {
        let inputs = Inputs::new(dims, dims.iter().sum::<usize>() as u64, 3.0);
        let [q, k, v] = inputs.views();
        let expected = reference(q, k, v, None, None, options);
        for blocks in BLOCKINGS {
            let got = run(inputs.views(), None, None, options, blocks, true);
            assert_close(&got, &expected, &format!("{what} {dims:?} {blocks:?}"));
        }
    }

    #[test]
    fn the_reference_is_the_formula() {
        // One query, two keys: scores (1·1, 1·3)·0.5 = (0.5, 1.5); weights e^0.5, e^1.5.
        let (q, k, v) = ([1.0f32], [1.0f32, 3.0], [2.0f32, -4.0]);
        fn view(data: &[f32], s: usize) -> View4<'_, f32> {
            View4::contiguous(data, [1, 1, s, 1])
        }
        let options = Options {
            scale: Some(0.5),
            ..Options::default()
        };
        let (a, b) = (0.5f64.exp(), 1.5f64.exp());
        let expected = (2.0 * a - 4.0 * b) / (a + b);
        let got = reference(view(&q, 1), view(&k, 2), view(&v, 2), None, None, options);
        assert!((got[0] - expected).abs() < 1e-12, "{got:?}");
        let mut out = [0.0f32];
        forward(
            &mut out,
            view(&q, 1),
            view(&k, 2),
            view(&v, 2),
            None,
            None,
            options,
            false,
        );
        assert!((out[0] as f64 - expected).abs() < 1e-6, "{out:?}");
        // The default scale is 1/√d: d = 4 halves the scores.
        let q4 = [0.5f32; 4];
        let k4 = [0.5f32, 0.5, 0.5, 0.5, 1.5, 1.5, 1.5, 1.5];
        let got = reference(
            View4::contiguous(&q4, [1, 1, 1, 4]),
            View4::contiguous(&k4, [1, 1, 2, 4]),
            view(&v, 2),
            None,
            None,
            Options::default(),
        );
        assert!((got[0] - expected).abs() < 1e-12, "{got:?}");
    }

    #[test]
    fn odd_shapes_match_the_reference() {
        let plain = Options::default();
        for dims in [
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 37, 8, 8],
            [2, 3, 17, 1, 4, 5],
            [1, 2, 5, 23, 1, 3],
            [2, 2, 19, 33, 64, 64],
            [1, 1, 7, 9, 16, 3],
            [3, 7, 4, 6, 2, 9],
            [1, 1, 130, 300, 8, 8],
        ] {
            check(dims, plain, "plain");
        }
    }

    #[test]
    fn long_keys_take_several_default_blocks() {
        // 1100 keys: three blocks of 512 with the default sizes; the keys grow with their
        // index so that the running maximum rises from block to block (and falls for `-`).
        for sign in [1.0f32, -1.0] {
            let mut inputs = Inputs::new([1, 2, 70, 1100, 16, 16], 11, 1.0);
            for (j, key) in inputs.k.chunks_exact_mut(16).enumerate() {
                let ramp = sign * ((j % 1100) as f32 / 200.0);
                key.iter_mut().for_each(|x| *x += ramp);
            }
            let [q, k, v] = inputs.views();
            let options = Options::default();
            let expected = reference(q, k, v, None, None, options);
            let got = run(inputs.views(), None, None, options, None, true);
            assert_close(&got, &expected, &format!("ramp {sign}"));
        }
    }

    #[test]
    fn permuted_and_flipped_views_are_read_in_place() {
        // q, k, v stored [b, s, h, d] (a projection before `swap_dims(1, 2)`).
        let [b, h, sq, sk, d, dv] = [2, 3, 11, 13, 8, 6];
        let inputs = Inputs::new([b, h, sq, sk, d, dv], 5, 2.0);
        let q = View4::contiguous(&inputs.q, [b, sq, h, d]).permute([0, 2, 1, 3]);
        let k = View4::contiguous(&inputs.k, [b, sk, h, d]).permute([0, 2, 1, 3]);
        // v stored [b, h, dv, s] and read transposed; and keys flipped with a negative
        // stride along the sequence (the values in the same order, so the result is the
        // same attention over a reordered set of keys).
        let v = View4::contiguous(&inputs.v, [b, h, dv, sk]).permute([0, 1, 3, 2]);
        let expected = reference(q, k, v, None, None, Options::default());
        for blocks in BLOCKINGS {
            let got = run([q, k, v], None, None, Options::default(), blocks, true);
            assert_close(&got, &expected, &format!("permuted {blocks:?}"));
        }
        fn flip(view: View4<'_, f32>) -> View4<'_, f32> {
            let [s0, s1, s2, s3] = view.strides;
            let offset = view.position([0, 0, view.shape[2] - 1, 0]) as usize;
            View4::strided(view.data, offset, view.shape, [s0, s1, -s2, s3])
        }
        let (kf, vf) = (flip(k), flip(v));
        let got = run(
            [q, kf, vf],
            None,
            None,
            Options::default(),
            Some(Blocks { q: 4, k: 5 }),
            true,
        );
        assert_close(&got, &expected, "keys and values flipped");
        // And the reference agrees with itself on a contiguous copy.
        let copy = |view: View4<'_, f32>| -> Vec<f32> {
            let s = view.shape();
            let mut out = Vec::new();
            for i0 in 0..s[0] {
                for i1 in 0..s[1] {
                    for i2 in 0..s[2] {
                        for i3 in 0..s[3] {
                            out.push(view.at([i0, i1, i2, i3]));
                        }
                    }
                }
            }
            out
        };
        let (qc, kc, vc) = (copy(q), copy(k), copy(v));
        let contiguous = run(
            [
                View4::contiguous(&qc, q.shape()),
                View4::contiguous(&kc, k.shape()),
                View4::contiguous(&vc, v.shape()),
            ],
            None,
            None,
            Options::default(),
            None,
            true,
        );
        assert_close(&contiguous, &expected, "contiguous copy");
    }

    #[test]
    fn padding_and_full_masks_mask_where_true() {
        let [b, h, sq, sk, d, dv] = [3, 2, 9, 21, 8, 4];
        let inputs = Inputs::new([b, h, sq, sk, d, dv], 21, 3.0);
        let [q, k, v] = inputs.views();
        // [b, 1, 1, sk]: batch i has 21 − 7i valid keys (batch 2: 7).
        let padding: Vec<u8> = (0..b * sk)
            .map(|n| (n % sk >= sk - 7 * (n / sk)) as u8)
            .collect();
        // [b, h, sq, sk], random, ~1/3 masked.
        let full: Vec<u8> = values(99, b * h * sq * sk)
            .iter()
            .map(|&x| (x < -0.33) as u8)
            .collect();
        let masks = [
            View4::contiguous(&padding, [b, 1, 1, sk]),
            View4::contiguous(&full, [b, h, sq, sk]),
        ];
        for mask in masks {
            let expected = reference(q, k, v, Some(mask), None, Options::default());
            let unmasked = reference(q, k, v, None, None, Options::default());
            assert!(
                expected
                    .iter()
                    .zip(&unmasked)
                    .any(|(a, b)| (a - b).abs() > 1e-3),
                "the mask changes the result"
            );
            for blocks in BLOCKINGS {
                let got = run(
                    inputs.views(),
                    Some(mask),
                    None,
                    Options::default(),
                    blocks,
                    true,
                );
                assert_close(
                    &got,
                    &expected,
                    &format!("mask {:?} {blocks:?}", mask.shape()),
                );
            }
        }
        // Masking the last keys of the padding equals dropping them.
        let valid = 7;
        let k_short: Vec<f32> = inputs
            .k
            .chunks(sk * d)
            .flat_map(|c| &c[..valid * d])
            .copied()
            .collect();
        let v_short: Vec<f32> = inputs
            .v
            .chunks(sk * dv)
            .flat_map(|c| &c[..valid * dv])
            .copied()
            .collect();
        let dropped = run(
            [
                q,
                View4::contiguous(&k_short, [b, h, valid, d]),
                View4::contiguous(&v_short, [b, h, valid, dv]),
            ],
            None,
            None,
            Options::default(),
            None,
            false,
        );
        let masked = run(
            inputs.views(),
            Some(masks[0]),
            None,
            Options::default(),
            None,
            false,
        );
        let last = (b - 1) * h * sq * dv;
        for (x, y) in masked[last..].iter().zip(&dropped[last..]) {
            assert!((x - y).abs() < 1e-6, "{x} vs {y}");
        }
    }

    #[test]
    fn causal_aligns_at_the_bottom_right() {
        for dims in [
            [2, 2, 5, 17, 8, 8], // sq < sk
            [2, 2, 17, 5, 8, 8], // sq > sk: the first 12 queries see no key
            [1, 3, 33, 33, 16, 7],
            [1, 1, 1, 300, 4, 4],
            [1, 1, 300, 300, 4, 4],
        ] {
            check(
                dims,
                Options {
                    causal: true,
                    ..Options::default()
                },
                "causal",
            );
        }
        // With sq > sk the first sq − sk rows are zeros exactly; the next sees key 0 only.
        let inputs = Inputs::new([1, 1, 6, 2, 3, 2], 3, 1.0);
        let causal = Options {
            causal: true,
            ..Options::default()
        };
        let got = run(inputs.views(), None, None, causal, None, true);
        assert_eq!(&got[..8], &[0.0; 8]);
        assert_eq!(&got[8..10], &inputs.v[..2]);
    }

    #[test]
    fn bias_and_softcap_match_the_reference() {
        let [b, h, sq, sk, d, dv] = [2, 3, 10, 37, 16, 8];
        let inputs = Inputs::new([b, h, sq, sk, d, dv], 8, 4.0);
        let [q, k, v] = inputs.views();
        // [1, h, sq, sk], ALiBi-like, with a −∞ that masks too.
        let mut alibi: Vec<f32> = (0..h * sq * sk)
            .map(|n| -((n / (sq * sk) + 1) as f32) * 0.1 * (n % sk) as f32)
            .collect();
        alibi[3] = f32::NEG_INFINITY;
        let bias = View4::contiguous(&alibi, [1, h, sq, sk]);
        let padding: Vec<u8> = (0..b * sk).map(|n| (n % sk > 30) as u8).collect();
        let mask = View4::contiguous(&padding, [b, 1, 1, sk]);
        for options in [
            Options::default(),
            Options {
                softcap: Some(2.0),
                ..Options::default()
            },
            Options {
                softcap: Some(0.7),
                scale: Some(0.3),
                causal: true,
            },
        ] {
            for mask in [None, Some(mask)] {
                let expected = reference(q, k, v, mask, Some(bias), options);
                let plain = reference(q, k, v, mask, None, options);
                assert!(
                    expected
                        .iter()
                        .zip(&plain)
                        .any(|(a, b)| (a - b).abs() > 1e-3)
                );
                for blocks in BLOCKINGS {
                    let got = run(inputs.views(), mask, Some(bias), options, blocks, true);
                    assert_close(&got, &expected, &format!("{options:?} {blocks:?}"));
                }
            }
        }
        // Softcap bounds the scores: with cap 0.01 the weights are nearly uniform.
        let capped = Options {
            softcap: Some(0.01),
            ..Options::default()
        };
        let got = run(inputs.views(), None, None, capped, None, true);
        let mean: Vec<f64> = (0..dv)
            .map(|c| (0..sk).map(|j| inputs.v[j * dv + c] as f64).sum::<f64>() / sk as f64)
            .collect();
        for c in 0..dv {
            assert!(
                (got[c] as f64 - mean[c]).abs() < 0.02,
                "{} vs {}",
                got[c],
                mean[c]
            );
        }
    }

    #[test]
    fn fully_masked_rows_are_zero() {
        // The fallback's clamps give 0 for a query that sees no key: by the mask, by a
        // −∞ bias, or (sq > sk) by the causal mask. Other rows are unaffected.
        let [b, h, sq, sk, d, dv] = [1, 2, 4, 40, 8, 5];
        let inputs = Inputs::new([b, h, sq, sk, d, dv], 4, 3.0);
        let [q, k, v] = inputs.views();
        // Query 1 fully masked, query 2 masked but for key 39 (in the last key block).
        let mut mask = vec![0u8; sq * sk];
        mask[sk..2 * sk].fill(1);
        mask[2 * sk..3 * sk - 1].fill(1);
        let mask = View4::contiguous(&mask, [1, 1, sq, sk]);
        let mut bias = vec![0.0f32; sq * sk];
        bias[3 * sk..].fill(f32::NEG_INFINITY);
        let bias = View4::contiguous(&bias, [1, 1, sq, sk]);
        let expected = reference(q, k, v, Some(mask), Some(bias), Options::default());
        for blocks in BLOCKINGS {
            let got = run(
                inputs.views(),
                Some(mask),
                Some(bias),
                Options::default(),
                blocks,
                true,
            );
            assert_close(&got, &expected, &format!("{blocks:?}"));
            for hi in 0..h {
                let row = |i: usize| &got[(hi * sq + i) * dv..(hi * sq + i + 1) * dv];
                assert_eq!(row(1), &[0.0; 5], "masked by the mask");
                assert_eq!(row(3), &[0.0; 5], "masked by the bias");
                let last_v = &inputs.v[(hi * sk + sk - 1) * dv..(hi * sk + sk) * dv];
                assert_eq!(row(2), last_v, "one key left: its value");
                assert!(row(0).iter().all(|x| x.abs() > 0.0));
            }
        }
    }

    /// The portable softmax (no FMA, whatever the compiler vectorises) against the dispatched
    /// one (AVX-512 here), on one block with every option, after a first block.
    #[test]
    fn the_portable_softmax_matches_the_dispatched_one() {
        let [b, h, sq, sk, d, dv] = [1, 2, 5, 70, 4, 3];
        let inputs = Inputs::new([b, h, sq, sk, d, dv], 12, 1.0);
        let [q, k, v] = inputs.views();
        let mask_data: Vec<u8> = values(5, sq * sk)
            .iter()
            .map(|&x| (x > 0.5) as u8)
            .collect();
        let bias_data = values(6, sq * sk);
        let options = Options {
            scale: Some(3.0),
            softcap: Some(2.5),
            causal: true,
        };
        let problem = Problem::new(
            q,
            k,
            v,
            Some(View4::contiguous(&mask_data, [1, 1, sq, sk])),
            Some(View4::contiguous(&bias_data, [1, 1, sq, sk])),
            options,
        );
        let step = Step {
            problem: &problem,
            bi: 0,
            hi: 1,
            q0: 0,
            k0: 33,
            nk: 37,
            first: false,
        };
        let scores: Vec<f32> = values(7, sq * 37).iter().map(|x| 4.0 * x).collect();
        let acc = values(8, sq * dv);
        let maxes = vec![0.5f32, f32::MIN, 3.0, -2.0, 1.0];
        let sums = vec![2.0f32, 0.0, 1.5, 7.0, 1.0];
        let mut fast = (scores.clone(), acc.clone(), maxes.clone(), sums.clone());
        let mut portable = (scores, acc, maxes, sums);
        step.softmax(&mut fast.0, &mut fast.1, &mut fast.2, &mut fast.3);
        step.softmax_rows::<false>(
            &mut portable.0,
            &mut portable.1,
            &mut portable.2,
            &mut portable.3,
        );
        let pairs = [
            (&fast.0, &portable.0),
            (&fast.1, &portable.1),
            (&fast.2, &portable.2),
            (&fast.3, &portable.3),
        ];
        for (x, y) in pairs {
            for (a, b) in x.iter().zip(y) {
                assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{a} vs {b}");
            }
        }
        assert!(fast.0.contains(&0.0) && fast.0.iter().any(|&x| x > 0.5));
    }

    #[test]
    fn a_nan_query_gives_a_nan_row() {
        // As in the fallback: a NaN score makes its row's softmax NaN; other rows are
        // untouched.
        let mut inputs = Inputs::new([1, 2, 3, 40, 4, 2], 2, 1.0);
        inputs.q[4 + 1] = f32::NAN; // head 0, query 1
        let got = run(
            inputs.views(),
            None,
            None,
            Options::default(),
            Some(Blocks { q: 2, k: 16 }),
            true,
        );
        for (n, x) in got.iter().enumerate() {
            assert_eq!(x.is_nan(), n / 2 == 1, "{n}: {x}");
        }
    }

    #[test]
    fn parallel_and_serial_are_identical() {
        // 700 keys: two default key blocks.
        let inputs = Inputs::new([3, 5, 77, 700, 32, 24], 6, 3.0);
        let padding: Vec<u8> = (0..3 * 700).map(|n| (n % 700 > 650) as u8).collect();
        let mask = View4::contiguous(&padding, [3, 1, 1, 700]);
        for options in [
            Options::default(),
            Options {
                causal: true,
                softcap: Some(5.0),
                scale: None,
            },
        ] {
            let serial = run(inputs.views(), Some(mask), None, options, None, false);
            let parallel = run(inputs.views(), Some(mask), None, options, None, true);
            assert!(serial.iter().all(|x| x.is_finite()));
            assert_eq!(
                serial.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                parallel.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn bf16_is_computed_in_f32() {
        let [b, h, sq, sk, d, dv] = [2, 3, 13, 300, 16, 8];
        let inputs = Inputs::new([b, h, sq, sk, d, dv], 9, 2.0);
        let narrow = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        let (q, k, v) = (narrow(&inputs.q), narrow(&inputs.k), narrow(&inputs.v));
        let q = View4::contiguous(&q, [b, sq, h, d]).permute([0, 2, 1, 3]);
        let k = View4::contiguous(&k, [b, h, sk, d]);
        let v = View4::contiguous(&v, [b, h, sk, dv]);
        let bias_data = narrow(&values(3, sq * sk));
        let bias = View4::contiguous(&bias_data, [1, 1, sq, sk]);
        let options = Options {
            causal: true,
            ..Options::default()
        };
        let expected = reference(q, k, v, None, Some(bias), options);
        let mut out = vec![bf16::ZERO; b * h * sq * dv];
        forward(&mut out, q, k, v, None, Some(bias), options, true);
        // The output's own rounding: half a bf16 ulp, 2^-9 relative.
        for (&got, &e) in out.iter().zip(&expected) {
            let got = got.to_f64();
            assert!((got - e).abs() <= e.abs() / 256.0 + 1e-5, "{got} vs {e}");
        }
    }

    #[test]
    fn blocks_keep_two_cores_busy() {
        assert_eq!(
            Blocks::for_shape(384, 128, 64, 64),
            Blocks { q: 256, k: 512 }
        );
        assert_eq!(Blocks::for_shape(12, 16, 64, 64), Blocks { q: 8, k: 512 });
        assert_eq!(
            Blocks::for_shape(1, 4096, 128, 128),
            Blocks { q: 256, k: 256 }
        );
        assert_eq!(
            Blocks::for_shape(2, 1024, 64, 64),
            Blocks { q: 128, k: 512 }
        );
    }

    #[test]
    #[should_panic(expected = "does not broadcast")]
    fn a_mask_of_the_wrong_shape_is_refused() {
        let inputs = Inputs::new([2, 1, 3, 4, 2, 2], 1, 1.0);
        let mask = [0u8; 3];
        run(
            inputs.views(),
            Some(View4::contiguous(&mask, [1, 1, 1, 3])),
            None,
            Options::default(),
            None,
            true,
        );
    }

    #[test]
    #[should_panic(expected = "are not [b, h, sq, d]")]
    fn mismatched_keys_are_refused() {
        let inputs = Inputs::new([1, 1, 3, 4, 2, 2], 1, 1.0);
        let [q, _, v] = inputs.views();
        let k = View4::contiguous(&inputs.k[..6], [1, 1, 3, 2]);
        run([q, k, v], None, None, Options::default(), None, true);
    }

    #[test]
    #[should_panic(expected = "outside its buffer")]
    fn a_view_past_its_buffer_is_refused() {
        let data = [0.0f32; 8];
        View4::strided(&data, 1, [1, 2, 2, 2], [8, 4, 2, 1]);
    }

    #[test]
    #[should_panic(expected = "softcap must be positive")]
    fn a_negative_softcap_is_refused() {
        let inputs = Inputs::new([1, 1, 2, 2, 2, 2], 1, 1.0);
        let softcap = Options {
            softcap: Some(-1.0),
            ..Options::default()
        };
        run(inputs.views(), None, None, softcap, None, true);
    }
}
