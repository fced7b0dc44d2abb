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
//! [`forward_on`] takes the [`Isa`] whose path the softmax pass runs on ([`forward`]: this
//! CPU's); [`reference()`] computes the same thing naively in `f64`, for tests.
//!
//! For training, [`forward_train`] gives the same output (the same code path, bit for bit)
//! and each query's log-sum-exp `lse_i = max_i + ln(sum_i)`; [`backward`] recomputes the
//! probabilities `exp(s − lse)` block by block from it (FlashAttention-2 style) and returns
//! the gradients of `q`, `k` and `v` (none for the bias). Neither forms a head's `[sq, sk]`
//! scores: a thread's scratch in the backward is `O(block_q·block_k + (sq + sk)·(d + dv))`
//! floats (the exact bound in [`backward_on`]'s docs), linear in the sequence lengths.
//! [`Options::dropout`] drops probabilities (after the softmax, the statistics being of the
//! undropped ones) by [`dropout_keep`], a pure function of a seed and the probability's
//! index, so that the backward redraws the forward's mask; [`reference_train`] and
//! [`reference_backward`] are the `f64` references.
//!
//! ```
//! use burn_cpu_kernels::View4;
//! use burn_cpu_kernels::attention::{self, Options};
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
// The view's home is `crate::view`; re-exported here, where attention's callers import it.
use crate::view::View4;
use crate::{Isa, MatRef, gemm};

mod backward;
mod dropout;
mod online;
mod reference;
#[cfg(test)]
mod tests;

pub(crate) use backward::BackStep;
pub use backward::{backward, backward_on};
pub use dropout::{AttentionDropout, dropout_keep, dropout_mask};
use online::{exp_shifted, max_of};
pub use reference::{reference, reference_backward, reference_train};

/// What burn-backend 0.21's `AttentionModuleOptions` says (its `f64`s as `f32`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Options {
    /// The factor of `q·kᵀ`; `None`: `1/√d`.
    pub scale: Option<f32>,
    /// `c` of `c·tanh(scores / c)`, applied before masking; positive.
    pub softcap: Option<f32>,
    /// Mask key `j` for query `i` when `j > i + sk − sq`.
    pub causal: bool,
    /// Dropout on the normalised probabilities ([`AttentionDropout`]); `None` for inference.
    pub dropout: Option<AttentionDropout>,
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
    /// less packing per product; 256 × 512 at `d = dv = 64` keeps a thread's scratch (scores
    /// 512 KiB, keys and values 128 KiB each, queries and accumulator 64 KiB each) within a
    /// 1 MiB L2. Fewer queries per task when the tensor has fewer than 16 tasks, so that
    /// several cores have work; never below 8. Sizes depend on the shape only, so serial and
    /// parallel runs give identical results.
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
/// result does not depend on it. [`forward_on`] with [`Isa::detected`].
///
/// # Panics
/// If `q` is not `[b, h, sq, d]`, `k` `[b, h, sk, d]` and `v` `[b, h, sk, dv]` with `d > 0`;
/// if `out` does not hold `b·h·sq·dv` elements; if `mask` or `bias` does not broadcast to
/// `[b, h, sq, sk]`; if the softcap is not positive; if a dropout probability is not in
/// `[0, 1)`.
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
    forward_on(Isa::detected(), out, q, k, v, mask, bias, options, parallel);
}

/// [`forward`] on the path `isa` picks: the softmax pass (softcap, masks, bias, the
/// exponentials) compiled for AVX-512 with fused multiply-adds where [`Isa::avx512`] holds,
/// portable otherwise; the products are `gemm`'s either way, so the paths differ only in
/// how the polynomials round.
///
/// # Panics
/// As [`forward`].
#[allow(clippy::too_many_arguments)]
pub fn forward_on<E: StoredFloat>(
    isa: Isa,
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
        isa,
        out,
        None,
        Blocks::for_shape(b * h, sq, q.shape[3], problem.dv),
        parallel,
    );
}

/// [`forward_train_on`] with [`Isa::detected`].
///
/// # Panics
/// As [`forward_train_on`].
#[allow(clippy::too_many_arguments)]
pub fn forward_train<E: StoredFloat>(
    out: &mut [E],
    lse: &mut [f32],
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    options: Options,
    parallel: bool,
) {
    forward_train_on(
        Isa::detected(),
        out,
        lse,
        q,
        k,
        v,
        mask,
        bias,
        options,
        parallel,
    );
}

/// [`forward_on`] for training: the same output, bit for bit (the same code path), and each
/// query's log-sum-exp, what [`backward_on`] recomputes the probabilities from without
/// storing them: `lse[(bi·h + hi)·sq + i] = max_i + ln(sum_i)` (natural logarithm) over the
/// query's scaled, softcapped, masked and biased scores `s_ij`, so that
/// `P_ij = exp(s_ij − lse_i)` (before dropout). A query whose keys are all masked (`sk = 0`
/// included) gets `+∞`, so that its recomputed probabilities are 0. `lse` is contiguous
/// `[b, h, sq]`. With `dv = 0` the output is empty and `lse` is left as it is (no gradient
/// depends on it then).
///
/// # Panics
/// As [`forward`], and if `lse` does not hold `b·h·sq` elements.
#[allow(clippy::too_many_arguments)]
pub fn forward_train_on<E: StoredFloat>(
    isa: Isa,
    out: &mut [E],
    lse: &mut [f32],
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
    assert_eq!(
        lse.len(),
        b * h * sq,
        "the log-sum-exp of [{b}, {h}, {sq}] has {} elements",
        lse.len()
    );
    problem.run(
        isa,
        out,
        Some(lse),
        Blocks::for_shape(b * h, sq, q.shape[3], problem.dv),
        parallel,
    );
}

/// The checked inputs of one call.
struct Problem<'a, E> {
    q: View4<'a, E>,
    k: View4<'a, E>,
    v: View4<'a, E>,
    /// Broadcast to `[b, h, sq, sk]`.
    mask: Option<View4<'a, u8>>,
    /// Broadcast to `[b, h, sq, sk]`.
    bias: Option<View4<'a, E>>,
    scale: f32,
    softcap: Option<f32>,
    /// `sk − sq` when causal.
    causal_offset: Option<isize>,
    dropout: Option<AttentionDropout>,
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
        if let Some(dropout) = options.dropout {
            dropout.check();
        }
        let target = [b, h, sq, sk];
        Self {
            q,
            k,
            v,
            mask: mask.map(|m| m.broadcast(target, "attention: the mask")),
            bias: bias.map(|m| m.broadcast(target, "attention: the bias")),
            scale: options
                .scale
                .unwrap_or_else(|| (1.0 / (d as f64).sqrt()) as f32),
            softcap: options.softcap,
            causal_offset: options.causal.then_some(sk as isize - sq as isize),
            dropout: options.dropout,
            dv,
        }
    }

    /// The dropout index of query `i`, key `j` of head `(bi, hi)`:
    /// `((bi·h + hi)·sq + i)·sk + j`.
    fn dropout_index(&self, bi: usize, hi: usize, i: usize, j: usize) -> u64 {
        let [_, h, sq, _] = self.q.shape;
        let sk = self.k.shape[2] as u64;
        (((bi * h + hi) * sq + i) as u64) * sk + j as u64
    }

    /// Keys `limit..` of `row` (keys `k0..k0 + row.len()` of query `i`) are after the causal
    /// boundary: `limit`.
    #[inline(always)]
    fn causal_limit(&self, i: usize, k0: usize, nk: usize) -> usize {
        match self.causal_offset {
            Some(offset) => (i as isize + offset + 1 - k0 as isize).clamp(0, nk as isize) as usize,
            None => nk,
        }
    }

    /// The fallback's masks and bias on the softcapped scores `row` of query `i`, keys
    /// `k0..`: the causal mask, the mask (`−∞`), then the bias added.
    #[inline(always)]
    fn mask_and_bias(&self, bi: usize, hi: usize, i: usize, k0: usize, row: &mut [f32]) {
        let limit = self.causal_limit(i, k0, row.len());
        row[limit..].fill(f32::NEG_INFINITY);
        let row_open = &mut row[..limit];
        if let Some(mask) = &self.mask {
            mask.line([bi, hi, i], k0, limit)
                .zip_with(row_open, |s, m| {
                    if m != 0 {
                        *s = f32::NEG_INFINITY
                    }
                });
        }
        if let Some(bias) = &self.bias {
            bias.line([bi, hi, i], k0, limit)
                .zip_with(row_open, |s, b| *s += b.to_f32());
        }
    }

    /// Every task, each writing its own rows of `out` (and of `lse`, for training), its
    /// softmax on `isa`'s path.
    fn run(
        &self,
        isa: Isa,
        out: &mut [E],
        lse: Option<&mut [f32]>,
        blocks: Blocks,
        parallel: bool,
    ) {
        let [_, heads, sq, _] = self.q.shape;
        if out.is_empty() {
            return;
        }
        let (head_len, block_len) = (sq * self.dv, blocks.q * self.dv);
        let task = |bh: usize, block: usize, dst: &mut [E], lse: Option<&mut [f32]>| {
            self.block(
                isa,
                bh / heads,
                bh % heads,
                block * blocks.q,
                dst,
                lse,
                blocks.k,
            )
        };
        // Below about a million multiply-adds (`b=1, h=12, s=16, d=64` has 0.4 M) waking the
        // pool costs more than the second thread saves.
        let [_, _, _, sk] = self.mask.map_or([0, 0, 0, self.k.shape[2]], |m| m.shape);
        let work = out.len() / self.dv * sk * (self.q.shape[3] + self.dv);
        match (parallel && work >= 1 << 20, lse) {
            (true, None) => out
                .par_chunks_mut(head_len)
                .enumerate()
                .for_each(|(bh, head)| {
                    head.par_chunks_mut(block_len)
                        .enumerate()
                        .for_each(|(block, dst)| task(bh, block, dst, None))
                }),
            (true, Some(lse)) => out
                .par_chunks_mut(head_len)
                .zip(lse.par_chunks_mut(sq))
                .enumerate()
                .for_each(|(bh, (head, lse))| {
                    head.par_chunks_mut(block_len)
                        .zip(lse.par_chunks_mut(blocks.q))
                        .enumerate()
                        .for_each(|(block, (dst, lse))| task(bh, block, dst, Some(lse)))
                }),
            (false, None) => {
                for (bh, head) in out.chunks_mut(head_len).enumerate() {
                    for (block, dst) in head.chunks_mut(block_len).enumerate() {
                        task(bh, block, dst, None);
                    }
                }
            }
            (false, Some(lse)) => {
                for (bh, (head, lse)) in
                    out.chunks_mut(head_len).zip(lse.chunks_mut(sq)).enumerate()
                {
                    let rows = head.chunks_mut(block_len).zip(lse.chunks_mut(blocks.q));
                    for (block, (dst, lse)) in rows.enumerate() {
                        task(bh, block, dst, Some(lse));
                    }
                }
            }
        }
    }

    /// The output rows `q0..q0 + dst.len()/dv` of head `(bi, hi)` (and their log-sum-exp
    /// into `lse`, if given), keys `block_k` at a time.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        isa: Isa,
        bi: usize,
        hi: usize,
        q0: usize,
        dst: &mut [E],
        lse: Option<&mut [f32]>,
        block_k: usize,
    ) {
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
            if let Some(lse) = lse {
                lse.fill(f32::INFINITY);
            }
            return;
        }
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => {
                self.block_in(isa, bi, hi, q0, dst, lse, block_k, key_end, &mut scratch)
            }
            // Only if a task ever ran inside another on one thread.
            Err(_) => self.block_in(
                isa,
                bi,
                hi,
                q0,
                dst,
                lse,
                block_k,
                key_end,
                &mut Scratch::default(),
            ),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn block_in(
        &self,
        isa: Isa,
        bi: usize,
        hi: usize,
        q0: usize,
        dst: &mut [E],
        lse: Option<&mut [f32]>,
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
                isa,
                bi,
                hi,
                q0,
                k0,
                nk,
                first: k0 == 0,
            };
            step.softmax(scores, &mut acc[..nq * dv], maxes, sums);
            // Dropout on the weights, after their sums (the statistics are of the undropped
            // probabilities): `out = (P∘Z)·v` once the rows are normalised.
            if let Some(dropout) = self.dropout {
                for (r, row) in scores.chunks_exact_mut(nk).enumerate() {
                    dropout.apply(row, self.dropout_index(bi, hi, q0 + r, k0));
                }
            }
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
        if let Some(lse) = lse {
            for ((l, &max), &sum) in lse.iter_mut().zip(&*maxes).zip(&*sums) {
                // A fully masked query: sum 0, `+∞` so that `exp(s − lse)` is 0.
                *l = if sum == 0.0 {
                    f32::INFINITY
                } else {
                    max + sum.ln()
                };
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
pub(crate) struct Step<'p, 'a, E> {
    problem: &'p Problem<'a, E>,
    /// The softmax's path.
    isa: Isa,
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
        if self.isa.avx512() {
            // SAFETY: `isa.avx512()` holds only where AVX-512 (F among them) and FMA were
            // detected.
            unsafe { crate::x86_64::attention::softmax_rows(self, scores, acc, maxes, sums) };
            return;
        }
        let _ = self.isa;
        self.softmax_rows::<false>(scores, acc, maxes, sums);
    }

    /// The fallback's order: softcap, mask, causal mask, bias; then the online softmax.
    /// `FMA`: the polynomials of [`exp_non_positive_f`] and [`tanh_f`] in fused
    /// multiply-adds (a call to `fmaf` each without the instruction).
    #[inline(always)]
    pub(crate) fn softmax_rows<const FMA: bool>(
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
                // (`tanh_f` is within 1.1 ulp) for a cheaper pass, a division's latency being
                // several multiplications'.
                let inverse = 1.0 / cap;
                row.iter_mut()
                    .for_each(|s| *s = cap * tanh_f::<FMA>(*s * inverse));
            }
            p.mask_and_bias(self.bi, self.hi, i, self.k0, row);
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
