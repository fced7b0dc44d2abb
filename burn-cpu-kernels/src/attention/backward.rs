//! The backward of [`forward_train`](super::forward_train), FlashAttention-2 style: the
//! probabilities of a block of queries by a block of keys are recomputed from the saved
//! log-sum-exp, used for the three gradient products, and dropped; the `[sq, sk]` score
//! matrix of a head is never formed.

use std::cell::RefCell;

use rayon::prelude::*;

use super::{Blocks, Problem, View4};
use crate::convert::StoredFloat;
use crate::math::{exp_non_positive_f, tanh_f};
use crate::{Isa, MatRef, gemm};

/// [`backward_on`] with [`Isa::detected`].
///
/// # Panics
/// As [`backward_on`].
#[allow(clippy::too_many_arguments)]
pub fn backward<E: StoredFloat>(
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    out: View4<'_, E>,
    lse: &[f32],
    grad_out: View4<'_, E>,
    options: super::Options,
    dq: &mut [E],
    dk: &mut [E],
    dv: &mut [E],
    parallel: bool,
) {
    backward_on(
        Isa::detected(),
        q,
        k,
        v,
        mask,
        bias,
        out,
        lse,
        grad_out,
        options,
        dq,
        dk,
        dv,
        parallel,
    );
}

/// The gradients of [`forward_train_on`](super::forward_train_on) with respect to `q`, `k`
/// and `v`, from the same inputs and options, the forward's output `out` (`[b, h, sq, dv]`,
/// any strides), its log-sum-exp `lse` (contiguous `[b, h, sq]`) and the output's gradient
/// `grad_out` (`[b, h, sq, dv]`, any strides), into the contiguous `dq` `[b, h, sq, d]`, `dk`
/// `[b, h, sk, d]` and `dv` `[b, h, sk, dv]`, accumulated in `f32`.
///
/// Per head: `D_i = Σ_c dO_ic·O_ic`; then for each block of keys, for each block of queries
/// that sees one of them, `S = q·kᵀ·scale` recomputed (softcap, masks and bias as the
/// forward), `P = exp(S − lse)`, `Z` the dropout keep mask scaled by `1/(1 − p)` (the same
/// [`dropout_keep`](super::dropout_keep) decisions as the forward), `dV += (P∘Z)ᵀ·dO`,
/// `dP = (dO·vᵀ)∘Z`, `dS = P∘(dP − D)` (times `1 − tanh²` of the softcap), `dQ += dS·k·scale`,
/// `dK += dSᵀ·q·scale`. With `causal`, a key block is taken only with the queries that see
/// one of its keys (from `k0 − (sk − sq)` on): blocks wholly past the causal boundary are
/// never computed. There is no gradient for the bias (nor the mask): a caller training a
/// bias needs another path. `D` is computed from the stored `out`, so with `bf16` storage it
/// carries the output's rounding (`2⁻⁹` relative).
///
/// Memory: a thread's scratch is at most `2·bq·bk + bk` floats for one block of scores and
/// its gradient (`bq, bk ≤ 128`, the block sizes), `sq·d + bk·(d + dv) + sq` for the head's
/// `dQ`, one key block's `dK` and `dV`, and `D`; with `bf16` storage also the head's
/// operands widened to `f32`, `(sq + sk)·d + sk·dv + sq·dv`: `O(bq·bk + (sq + sk)·(d + dv))`,
/// linear in the sequence lengths. Rayon's threads share the `b·h` heads with `parallel`; the
/// result does not depend on it.
///
/// A query whose keys are all masked (`lse = +∞`) contributes nothing; with `sq`, `sk` or
/// `dv` zero every gradient is 0.
///
/// # Panics
/// As [`forward`](super::forward) for the inputs; if `out` or `grad_out` is not
/// `[b, h, sq, dv]`, `lse` does not hold `b·h·sq` elements, or `dq`, `dk`, `dv` do not hold
/// `b·h·sq·d`, `b·h·sk·d`, `b·h·sk·dv` elements.
#[allow(clippy::too_many_arguments)]
pub fn backward_on<E: StoredFloat>(
    isa: Isa,
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    out: View4<'_, E>,
    lse: &[f32],
    grad_out: View4<'_, E>,
    options: super::Options,
    dq: &mut [E],
    dk: &mut [E],
    dv: &mut [E],
    parallel: bool,
) {
    let problem = Problem::new(q, k, v, mask, bias, options);
    let blocks = Blocks::for_backward(q.shape[2], k.shape[2]);
    problem.backward(
        isa,
        Gradients { out, lse, grad_out },
        [dq, dk, dv],
        blocks,
        parallel,
    );
}

/// What the backward reads besides the forward's inputs.
#[derive(Clone, Copy)]
pub(super) struct Gradients<'a, E> {
    pub(super) out: View4<'a, E>,
    pub(super) lse: &'a [f32],
    pub(super) grad_out: View4<'a, E>,
}

impl Blocks {
    /// Up to 128 queries by 128 keys: two blocks of scores (the probabilities and their
    /// gradient) of 64 KiB each stay in L2 beside the key block's `dK` and `dV`.
    pub(super) fn for_backward(sq: usize, sk: usize) -> Self {
        Self {
            q: sq.clamp(1, 128),
            k: sk.clamp(1, 128),
        }
    }
}

/// One thread's buffers for the backward, kept between heads.
#[derive(Default)]
struct BackScratch {
    q_wide: Vec<f32>,
    k_wide: Vec<f32>,
    v_wide: Vec<f32>,
    do_wide: Vec<f32>,
    delta: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    scores: Vec<f32>,
    grads: Vec<f32>,
    cap_grad: Vec<f32>,
}

thread_local! {
    static BACK_SCRATCH: RefCell<BackScratch> = RefCell::new(BackScratch::default());
}

impl<E: StoredFloat> Problem<'_, E> {
    /// Every head's gradients, each head a task writing its own rows of `dq`, `dk`, `dv`.
    pub(super) fn backward(
        &self,
        isa: Isa,
        g: Gradients<'_, E>,
        [dq, dk, dv]: [&mut [E]; 3],
        blocks: Blocks,
        parallel: bool,
    ) {
        let ([b, h, sq, d], sk, dvn) = (self.q.shape, self.k.shape[2], self.dv);
        let expected = [b, h, sq, dvn];
        assert!(
            g.out.shape == expected && g.grad_out.shape == expected,
            "attention backward: the output {:?} and its gradient {:?} are not {expected:?}",
            g.out.shape,
            g.grad_out.shape
        );
        assert_eq!(
            g.lse.len(),
            b * h * sq,
            "attention backward: the log-sum-exp of [{b}, {h}, {sq}] has {} elements",
            g.lse.len()
        );
        for (name, len, want) in [
            ("dq", dq.len(), b * h * sq * d),
            ("dk", dk.len(), b * h * sk * d),
            ("dv", dv.len(), b * h * sk * dvn),
        ] {
            assert_eq!(
                len, want,
                "attention backward: {name} has {len} elements, not {want}"
            );
        }
        let zero = E::from_f32(0.0);
        if b * h == 0 || sq == 0 || sk == 0 || dvn == 0 {
            // No product reaches a gradient: all of them are 0.
            for x in [dq, dk, dv] {
                x.fill(zero);
            }
            return;
        }
        let task = |bh: usize, (dq, (dk, dv)): (&mut [E], (&mut [E], &mut [E]))| {
            BACK_SCRATCH.with(|cell| match cell.try_borrow_mut() {
                Ok(mut scratch) => {
                    self.head(isa, bh / h, bh % h, g, [dq, dk, dv], blocks, &mut scratch)
                }
                // Only if a task ever ran inside another on one thread.
                Err(_) => self.head(
                    isa,
                    bh / h,
                    bh % h,
                    g,
                    [dq, dk, dv],
                    blocks,
                    &mut BackScratch::default(),
                ),
            })
        };
        let work = b * h * sq * sk * (d + dvn);
        let (dq_rows, dk_rows, dv_rows) = (sq * d, sk * d, sk * dvn);
        if parallel && work >= 1 << 20 {
            dq.par_chunks_mut(dq_rows)
                .zip(dk.par_chunks_mut(dk_rows).zip(dv.par_chunks_mut(dv_rows)))
                .enumerate()
                .for_each(|(bh, heads)| task(bh, heads));
        } else {
            dq.chunks_mut(dq_rows)
                .zip(dk.chunks_mut(dk_rows).zip(dv.chunks_mut(dv_rows)))
                .enumerate()
                .for_each(|(bh, heads)| task(bh, heads));
        }
    }

    /// The gradients of head `(bi, hi)`.
    #[allow(clippy::too_many_arguments)]
    fn head(
        &self,
        isa: Isa,
        bi: usize,
        hi: usize,
        g: Gradients<'_, E>,
        [dq, dk, dv]: [&mut [E]; 3],
        blocks: Blocks,
        scratch: &mut BackScratch,
    ) {
        let ([_, h, sq, d], sk, dvn) = (self.q.shape, self.k.shape[2], self.dv);
        let BackScratch {
            q_wide,
            k_wide,
            v_wide,
            do_wide,
            delta,
            dq: dq_acc,
            dk: dk_acc,
            dv: dv_acc,
            scores,
            grads,
            cap_grad,
        } = scratch;
        let queries = E::widen(self.q.matrix(bi, hi), q_wide);
        let keys = E::widen(self.k.matrix(bi, hi), k_wide);
        let values = E::widen(self.v.matrix(bi, hi), v_wide);
        let d_out = E::widen(g.grad_out.matrix(bi, hi), do_wide);
        let out = g.out.matrix(bi, hi);
        let lse = &g.lse[(bi * h + hi) * sq..][..sq];
        // D_i = Σ dO_i·O_i = Σ_j P_ij·dP_ij (dropout included: O = (P∘Z)·v).
        delta.clear();
        delta.extend((0..sq).map(|i| {
            (0..dvn)
                .map(|c| d_out.at(i, c) * out.at(i, c).to_f32())
                .sum::<f32>()
        }));
        dq_acc.clear();
        dq_acc.resize(sq * d, 0.0);
        let zero = E::from_f32(0.0);
        dk.fill(zero);
        dv.fill(zero);
        // Keys from `key_end` on are after the causal boundary of the last query.
        let key_end = match self.causal_offset {
            Some(offset) => (sq as isize + offset).clamp(0, sk as isize) as usize,
            None => sk,
        };
        let (bq, bk) = (blocks.q, blocks.k);
        scores.resize(bq.min(sq) * bk.min(sk), 0.0);
        grads.resize(bq.min(sq) * bk.min(sk), 0.0);
        cap_grad.resize(bk.min(sk), 0.0);
        for k0 in (0..key_end).step_by(bk) {
            let nk = bk.min(key_end - k0);
            let (kb, vb) = (keys.rows(k0, nk), values.rows(k0, nk));
            dk_acc.clear();
            dk_acc.resize(nk * d, 0.0);
            dv_acc.clear();
            dv_acc.resize(nk * dvn, 0.0);
            // The first query that sees key k0 (`k0 ≤ i + offset`); `< sq` as `k0 < key_end`.
            let q_start = match self.causal_offset {
                Some(offset) => (k0 as isize - offset).max(0) as usize,
                None => 0,
            };
            for q0 in (q_start..sq).step_by(bq) {
                let nq = bq.min(sq - q0);
                let (qb, gb) = (queries.rows(q0, nq), d_out.rows(q0, nq));
                let s = &mut scores[..nq * nk];
                let dp = &mut grads[..nq * nk];
                let single = gemm::Parallelism::None;
                gemm(s, nk, qb, kb.t(), self.scale, false, single);
                gemm(dp, nk, gb, vb.t(), 1.0, false, single);
                let step = BackStep {
                    problem: self,
                    bi,
                    hi,
                    q0,
                    k0,
                    nk,
                    lse: &lse[q0..q0 + nq],
                    delta: &delta[q0..q0 + nq],
                };
                step.grad(isa, s, dp, &mut cap_grad[..nk]);
                // s = P∘Z, dp = dS.
                let pz = MatRef::row_major(s, nq, nk);
                let ds = MatRef::row_major(dp, nq, nk);
                gemm(dv_acc, dvn, pz.t(), gb, 1.0, true, single);
                gemm(
                    &mut dq_acc[q0 * d..(q0 + nq) * d],
                    d,
                    ds,
                    kb,
                    self.scale,
                    true,
                    single,
                );
                gemm(dk_acc, d, ds.t(), qb, self.scale, true, single);
            }
            store(&mut dk[k0 * d..(k0 + nk) * d], dk_acc);
            store(&mut dv[k0 * dvn..(k0 + nk) * dvn], dv_acc);
        }
        store(dq, dq_acc);
    }
}

/// `dst ← src`, rounded to `E`.
fn store<E: StoredFloat>(dst: &mut [E], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = E::from_f32(s);
    }
}

/// One block of queries by one block of keys of the backward, between its products.
pub(crate) struct BackStep<'p, 'a, E> {
    problem: &'p Problem<'a, E>,
    bi: usize,
    hi: usize,
    q0: usize,
    k0: usize,
    nk: usize,
    /// The block's queries' log-sum-exp.
    lse: &'p [f32],
    /// The block's queries' `D_i`.
    delta: &'p [f32],
}

impl<E: StoredFloat> BackStep<'_, '_, E> {
    /// Dispatches [`grad_rows`](Self::grad_rows) on `isa`'s path.
    fn grad(&self, isa: Isa, scores: &mut [f32], grads: &mut [f32], cap_grad: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if isa.avx512() {
            // SAFETY: `isa.avx512()` holds only where AVX-512 (F among them) and FMA were
            // detected.
            unsafe { crate::x86_64::attention::grad_rows(self, scores, grads, cap_grad) };
            return;
        }
        let _ = isa;
        self.grad_rows::<false>(scores, grads, cap_grad);
    }

    /// From the raw scores `q·kᵀ·scale` and `dO·vᵀ` of the block, row-major `nq × nk`:
    /// `scores ← P∘Z` and `grads ← dS = P∘(dP∘Z − D)` (times `1 − tanh²` with a softcap),
    /// `P = exp(s − lse)` with `s` softcapped, masked and biased as the forward does.
    /// `cap_grad` (`nk` floats) holds a row's softcap derivatives. `FMA`: the polynomials in
    /// fused multiply-adds.
    #[inline(always)]
    pub(crate) fn grad_rows<const FMA: bool>(
        &self,
        scores: &mut [f32],
        grads: &mut [f32],
        cap_grad: &mut [f32],
    ) {
        let p = self.problem;
        let nk = self.nk;
        let rows = scores
            .chunks_exact_mut(nk)
            .zip(grads.chunks_exact_mut(nk))
            .zip(self.lse.iter().zip(self.delta));
        for (r, ((row, dp), (&lse, &delta))) in rows.enumerate() {
            let i = self.q0 + r;
            if let Some(cap) = p.softcap {
                let inverse = 1.0 / cap;
                for (s, g) in row.iter_mut().zip(cap_grad.iter_mut()) {
                    let t = tanh_f::<FMA>(*s * inverse);
                    *s = cap * t;
                    *g = 1.0 - t * t;
                }
            }
            p.mask_and_bias(self.bi, self.hi, i, self.k0, row);
            let prob = |s: f32| {
                let x = s - lse;
                // `s ≤ lse` but for the rounding of a product recomputed in other blocks.
                exp_non_positive_f::<FMA>(if x > 0.0 { 0.0 } else { x })
            };
            match p.dropout {
                None => {
                    for (s, dp) in row.iter_mut().zip(dp.iter_mut()) {
                        let pr = prob(*s);
                        *s = pr;
                        *dp = pr * (*dp - delta);
                    }
                }
                Some(dropout) => {
                    let (scale, first) = (
                        dropout.keep_scale(),
                        p.dropout_index(self.bi, self.hi, i, self.k0),
                    );
                    for (j, (s, dp)) in row.iter_mut().zip(dp.iter_mut()).enumerate() {
                        let pr = prob(*s);
                        let z = if super::dropout_keep(dropout, first + j as u64) {
                            scale
                        } else {
                            0.0
                        };
                        *s = pr * z;
                        *dp = pr * (*dp * z - delta);
                    }
                }
            }
            if p.softcap.is_some() {
                dp.iter_mut().zip(&*cap_grad).for_each(|(x, g)| *x *= g);
            }
        }
    }
}
