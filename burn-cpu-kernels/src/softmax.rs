//! Softmax, log-softmax and their backward over contiguous rows of `f32`, each row in as
//! few passes as the arithmetic allows, vectorised, rows shared among rayon's threads.
//!
//! Burn's `softmax` is a composition of tensor operations (a max, a subtraction, an `exp`,
//! a sum, a division), each a pass over the whole tensor through memory; burn-flex runs its
//! `exp` one `libm` call at a time. Here a row (an attention row of 128 scores is half a
//! kilobyte) is read from memory once and then stays in L1: one pass for the maximum, one
//! for `exp(x − max)` (stored) and its sum, one to scale (a mask adds one pass, setting the
//! masked scores to `−∞` before the maximum). `exp` is [`crate::math`]'s, within an ulp, so
//! a probability is within 4 ulp of the `f64` softmax (tested).
//!
//! Masks follow Burn's (and PyTorch's) `mask_fill(mask, −∞)` then `softmax`: `true` marks a
//! position masked out, which gets probability `0` (log-probability `−∞`), and a row with
//! every position masked gets `NaN` everywhere, as `exp(−∞ − (−∞))` gives in both. A `NaN`
//! or `+∞` score makes its whole row `NaN`, also as in both.
//!
//! [`forward_rows_on`] and [`backward_rows_on`], which the named functions call, take an
//! [`Isa`] that tests and benchmarks use to force the portable path;
//! `BURN_SKETCH_PORTABLE=1` forces it for all.

use crate::Isa;
use crate::math::{PARALLEL_MIN, exp_f, mul_add};

/// Lanes of the per-row accumulators: one AVX-512 register of `f32`.
const LANES: usize = 16;

/// Elements per rayon task: whole rows adding up to about 32 KiB.
const TASK: usize = 1 << 13;

/// Which rows of a boolean mask go with which rows of the scores: row `r` of the scores
/// uses mask row `(r / repeat) % mask_rows`, where `mask_rows = mask.len() / n`. That covers
/// a mask per row (`repeat = 1`, as many mask rows as rows), one mask for all (a single
/// mask row), a key-padding mask `[batch, 1, 1, keys]` over scores `[batch, heads, queries,
/// keys]` (`repeat = heads · queries`) and a causal mask `[queries, keys]` repeated over
/// batch and heads (`repeat = 1`, `queries` mask rows); other broadcasts must be expanded.
/// `true` masks a position out.
#[derive(Clone, Copy, Debug)]
pub struct RowMask<'a> {
    bits: &'a [bool],
    repeat: usize,
}

impl<'a> RowMask<'a> {
    /// Mask row `r % mask_rows` for row `r`: one mask row per score row, or a mask cycled
    /// over the rows.
    pub fn new(bits: &'a [bool]) -> Self {
        Self { bits, repeat: 1 }
    }

    /// Mask row `(r / repeat) % mask_rows` for row `r`: each mask row serves `repeat`
    /// consecutive score rows.
    ///
    /// # Panics
    /// If `repeat` is 0.
    pub fn repeated(bits: &'a [bool], repeat: usize) -> Self {
        assert!(repeat > 0, "a mask row serves at least one row");
        Self { bits, repeat }
    }

    /// The mask row for score row `row`.
    #[cfg(test)]
    fn row(&self, row: usize, n: usize) -> &'a [bool] {
        let mask_rows = self.bits.len() / n;
        let r = (row / self.repeat) % mask_rows;
        &self.bits[r * n..][..n]
    }

    fn check(&self, n: usize) {
        assert!(
            !self.bits.is_empty() && self.bits.len().is_multiple_of(n),
            "a mask of {} values is not whole rows of {n}",
            self.bits.len()
        );
    }
}

/// The forward operation of a call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Forward {
    Softmax,
    LogSoftmax,
}

/// The backward operation of a call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Backward {
    Softmax,
    LogSoftmax,
}

/// `dst` = the softmax of each row of `n` values of `src`: `exp(x − max)/Σ exp(x − max)`.
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`.
pub fn softmax_rows(src: &[f32], dst: &mut [f32], n: usize) {
    forward_on(Isa::detected(), Forward::Softmax, Some(src), dst, n, None);
}

/// [`softmax_rows`] in place.
///
/// # Panics
/// If `values` is not whole rows of `n`.
pub fn softmax_rows_in_place(values: &mut [f32], n: usize) {
    forward_on(Isa::detected(), Forward::Softmax, None, values, n, None);
}

/// [`softmax_rows`] with masked positions (`true`) at probability 0, as Burn's
/// `mask_fill(mask, −∞)` then `softmax`; a row with every position masked is all `NaN`, as
/// there (and in PyTorch).
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`, or the mask is not.
pub fn masked_softmax_rows(src: &[f32], mask: RowMask<'_>, dst: &mut [f32], n: usize) {
    forward_on(
        Isa::detected(),
        Forward::Softmax,
        Some(src),
        dst,
        n,
        Some(mask),
    );
}

/// `dst` = the log-softmax of each row: `(x − max) − ln Σ exp(x − max)`, the stable form
/// (`x − ln Σ eˣ` overflows from `x ≈ 89`).
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`.
pub fn log_softmax_rows(src: &[f32], dst: &mut [f32], n: usize) {
    forward_on(
        Isa::detected(),
        Forward::LogSoftmax,
        Some(src),
        dst,
        n,
        None,
    );
}

/// [`log_softmax_rows`] with masked positions at `−∞` (a fully masked row is all `NaN`).
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`, or the mask is not.
pub fn masked_log_softmax_rows(src: &[f32], mask: RowMask<'_>, dst: &mut [f32], n: usize) {
    forward_on(
        Isa::detected(),
        Forward::LogSoftmax,
        Some(src),
        dst,
        n,
        Some(mask),
    );
}

/// The forward operations on the path `isa` picks: the softmax, or the log-softmax with
/// `log`, into `dst` from `src`, or in place in `dst` without `src`, masked with `mask`. What
/// the named functions call; tests and benchmarks call it to compare paths.
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`, or the mask is not.
pub fn forward_rows_on(
    isa: Isa,
    log: bool,
    src: Option<&[f32]>,
    dst: &mut [f32],
    n: usize,
    mask: Option<RowMask<'_>>,
) {
    let op = if log {
        Forward::LogSoftmax
    } else {
        Forward::Softmax
    };
    forward_on(isa, op, src, dst, n, mask);
}

/// `dx = y·(dy − Σ y·dy)` per row: the softmax's backward from its output `y` and the
/// output's gradient `dy`. At masked positions `y = 0`, so `dx = 0` there.
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`.
pub fn softmax_backward_rows(y: &[f32], dy: &[f32], dx: &mut [f32], n: usize) {
    backward_rows_on(Isa::detected(), false, y, Some(dy), dx, n);
}

/// [`softmax_backward_rows`] in place: `grad` holds `dy` and receives `dx`.
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`.
pub fn softmax_backward_rows_in_place(y: &[f32], grad: &mut [f32], n: usize) {
    backward_rows_on(Isa::detected(), false, y, None, grad, n);
}

/// `dx = dy − exp(y)·Σ dy` per row: the log-softmax's backward from its output `y`. At
/// masked positions (`y = −∞`) this gives `dx = dy`, which Burn's `mask_fill` backward then
/// zeroes; a fused caller must zero them itself.
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`.
pub fn log_softmax_backward_rows(y: &[f32], dy: &[f32], dx: &mut [f32], n: usize) {
    backward_rows_on(Isa::detected(), true, y, Some(dy), dx, n);
}

/// The backward operations on the path `isa` picks: the softmax's, or the log-softmax's
/// with `log`, into `dx` from `dy`, or in place in `dx` (holding `dy`) without `dy`.
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`.
pub fn backward_rows_on(
    isa: Isa,
    log: bool,
    y: &[f32],
    dy: Option<&[f32]>,
    dx: &mut [f32],
    n: usize,
) {
    assert_eq!(y.len(), dx.len(), "one gradient per output");
    if let Some(dy) = dy {
        assert_eq!(dy.len(), dx.len(), "one gradient per output");
    }
    check_rows(dx.len(), n);
    let op = if log {
        Backward::LogSoftmax
    } else {
        Backward::Softmax
    };
    let avx512 = isa.avx512();
    for_row_blocks(dx, n, |first, block| {
        let rows = first * n..first * n + block.len();
        let dy = dy.map(|dy| &dy[rows.clone()]);
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: `avx512` is true only where AVX-512F and FMA were detected.
            unsafe { backward_avx512(op, &y[rows], dy, block, n) };
            return;
        }
        let _ = avx512;
        backward_block::<false>(op, &y[rows], dy, block, n);
    });
}

/// Rows of `n` that `len` values must be.
fn check_rows(len: usize, n: usize) {
    assert!(
        n > 0 && len.is_multiple_of(n) || len == 0,
        "{len} values are not whole rows of {n}"
    );
}

fn forward_on(
    isa: Isa,
    op: Forward,
    src: Option<&[f32]>,
    dst: &mut [f32],
    n: usize,
    mask: Option<RowMask<'_>>,
) {
    if let Some(src) = src {
        assert_eq!(src.len(), dst.len(), "one output per input");
    }
    check_rows(dst.len(), n);
    if dst.is_empty() {
        return;
    }
    if let Some(mask) = mask {
        mask.check(n);
    }
    let avx512 = isa.avx512();
    for_row_blocks(dst, n, |first, block| {
        let src = src.map(|src| &src[first * n..first * n + block.len()]);
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: `avx512` is true only where AVX-512F and FMA were detected.
            unsafe { forward_avx512(op, first, src, block, n, mask) };
            return;
        }
        let _ = avx512;
        forward_block::<false>(op, first, src, block, n, mask);
    });
}

/// Calls `f(first_row, rows)` on blocks of whole rows of `n`: one block on this thread for
/// small calls, blocks of about [`TASK`] values shared among rayon's threads for large ones
/// (each row is computed the same way either way: the results are identical).
pub(crate) fn for_row_blocks(values: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if values.len() < PARALLEL_MIN || values.len() <= n || rayon::current_num_threads() == 1 {
        f(0, values);
        return;
    }
    use rayon::prelude::*;
    let rows = (TASK / n).max(1);
    values
        .par_chunks_mut(rows * n)
        .enumerate()
        .for_each(|(i, block)| f(i * rows, block));
}

/// [`forward_block`] compiled for AVX-512 with fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
fn forward_avx512(
    op: Forward,
    first: usize,
    src: Option<&[f32]>,
    block: &mut [f32],
    n: usize,
    mask: Option<RowMask<'_>>,
) {
    forward_block::<true>(op, first, src, block, n, mask);
}

/// The rows of one block, in place after copying each row from `src` (the row is then in
/// L1 for the passes that follow). A mask is applied in the first pass (masked positions
/// set to `−∞` as the maximum is found), so the `exp` passes are the unmasked ones.
#[inline(always)]
fn forward_block<const FMA: bool>(
    op: Forward,
    first: usize,
    src: Option<&[f32]>,
    block: &mut [f32],
    n: usize,
    mask: Option<RowMask<'_>>,
) {
    let mut cursor = mask.map(|mask| MaskCursor::new(mask, first, n));
    for (i, row) in block.chunks_exact_mut(n).enumerate() {
        if let Some(src) = src {
            row.copy_from_slice(&src[i * n..][..n]);
        }
        let max = match cursor.as_mut() {
            Some(cursor) => {
                let max = mask_fill_max(row, cursor.bits());
                cursor.advance();
                max
            }
            None => row_max(row),
        };
        match op {
            Forward::Softmax => softmax_row::<FMA>(row, max),
            Forward::LogSoftmax => log_softmax_row::<FMA>(row, max),
        }
    }
}

/// The mask row of one score row after another, without a division per row.
struct MaskCursor<'a> {
    bits: &'a [bool],
    n: usize,
    repeat: usize,
    mask_rows: usize,
    /// The current mask row, and how many score rows it has served.
    index: usize,
    served: usize,
}

impl<'a> MaskCursor<'a> {
    fn new(mask: RowMask<'a>, first: usize, n: usize) -> Self {
        let mask_rows = mask.bits.len() / n;
        Self {
            bits: mask.bits,
            n,
            repeat: mask.repeat,
            mask_rows,
            index: (first / mask.repeat) % mask_rows,
            served: first % mask.repeat,
        }
    }

    #[inline(always)]
    fn bits(&self) -> &'a [bool] {
        &self.bits[self.index * self.n..][..self.n]
    }

    #[inline(always)]
    fn advance(&mut self) {
        self.served += 1;
        if self.served == self.repeat {
            self.served = 0;
            self.index += 1;
            if self.index == self.mask_rows {
                self.index = 0;
            }
        }
    }
}

/// `max(a, v)` that skips a `NaN` `v` (it surfaces in the `exp` pass).
#[inline(always)]
fn max_of(a: f32, v: f32) -> f32 {
    if v > a { v } else { a }
}

/// The largest value of the row (`NaN`s skipped here: they surface in the `exp` pass).
#[inline(always)]
fn row_max(row: &[f32]) -> f32 {
    let body = row.len() / LANES * LANES;
    let mut acc = [f32::NEG_INFINITY; LANES];
    for c in row[..body].chunks_exact(LANES) {
        acc.iter_mut().zip(c).for_each(|(a, &v)| *a = max_of(*a, v));
    }
    let max = acc.iter().fold(f32::NEG_INFINITY, |m, &v| max_of(m, v));
    row[body..].iter().fold(max, |m, &v| max_of(m, v))
}

/// Sets the masked positions (`true`) of the row to `−∞` (Burn's `mask_fill`) and returns
/// the row's largest value: two loops over the row (in L1), each of which vectorises.
#[inline(always)]
fn mask_fill_max(row: &mut [f32], mask: &[bool]) -> f32 {
    for (v, &m) in row.iter_mut().zip(mask) {
        *v = masked(*v, m);
    }
    row_max(row)
}

/// `−∞` if `m`, else `v`, by bits: a select the compiler could turn into a conditional
/// store (one value at a time) becomes a blend it vectorises.
#[inline(always)]
fn masked(v: f32, m: bool) -> f32 {
    let keep = (m as u32).wrapping_sub(1); // all ones unless masked
    f32::from_bits((v.to_bits() & keep) | (f32::NEG_INFINITY.to_bits() & !keep))
}

/// `Σ values`, by lanes.
#[inline(always)]
fn lane_sum(acc: [f32; LANES]) -> f32 {
    // Pairwise over the lanes.
    let mut width = LANES;
    let mut acc = acc;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

/// One row's softmax in place from its maximum: `exp(x − max)` stored and summed, then
/// scaled.
#[inline(always)]
fn softmax_row<const FMA: bool>(row: &mut [f32], max: f32) {
    let body = row.len() / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for c in row[..body].chunks_exact_mut(LANES) {
        for (v, a) in c.iter_mut().zip(&mut acc) {
            let e = exp_f::<FMA>(*v - max);
            *v = e;
            *a += e;
        }
    }
    let mut sum = lane_sum(acc);
    for v in &mut row[body..] {
        let e = exp_f::<FMA>(*v - max);
        *v = e;
        sum += e;
    }
    let scale = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= scale);
}

/// One row's log-softmax in place from its maximum: `Σ exp(x − max)` (not stored), then
/// `(x − max) − ln Σ`.
#[inline(always)]
fn log_softmax_row<const FMA: bool>(row: &mut [f32], max: f32) {
    let body = row.len() / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for c in row[..body].chunks_exact(LANES) {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += exp_f::<FMA>(v - max);
        }
    }
    let sum = row[body..]
        .iter()
        .fold(lane_sum(acc), |s, &v| s + exp_f::<FMA>(v - max));
    let log_sum = sum.ln();
    row.iter_mut().for_each(|v| *v = (*v - max) - log_sum);
}

/// [`backward_block`] compiled for AVX-512 with fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
fn backward_avx512(op: Backward, y: &[f32], dy: Option<&[f32]>, block: &mut [f32], n: usize) {
    backward_block::<true>(op, y, dy, block, n);
}

/// The rows of one block, in place in `block` (after copying each row of `dy` into it).
#[inline(always)]
fn backward_block<const FMA: bool>(
    op: Backward,
    y: &[f32],
    dy: Option<&[f32]>,
    block: &mut [f32],
    n: usize,
) {
    for (i, (grad, y)) in block.chunks_exact_mut(n).zip(y.chunks_exact(n)).enumerate() {
        if let Some(dy) = dy {
            grad.copy_from_slice(&dy[i * n..][..n]);
        }
        match op {
            Backward::Softmax => {
                let dot = dot::<FMA>(y, grad);
                for (g, &y) in grad.iter_mut().zip(y) {
                    *g = y * (*g - dot);
                }
            }
            Backward::LogSoftmax => {
                let sum = lane_sum_of(grad);
                for (g, &y) in grad.iter_mut().zip(y) {
                    *g = mul_add::<FMA>(-exp_f::<FMA>(y), sum, *g);
                }
            }
        }
    }
}

/// `Σ a·b` by lanes.
#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let body = a.len() / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for (ca, cb) in a[..body]
        .chunks_exact(LANES)
        .zip(b[..body].chunks_exact(LANES))
    {
        for ((s, &x), &y) in acc.iter_mut().zip(ca).zip(cb) {
            *s = mul_add::<FMA>(x, y, *s);
        }
    }
    let mut sum = lane_sum(acc);
    for (&x, &y) in a[body..].iter().zip(&b[body..]) {
        sum = mul_add::<FMA>(x, y, sum);
    }
    sum
}

/// `Σ a` by lanes.
#[inline(always)]
fn lane_sum_of(a: &[f32]) -> f32 {
    let body = a.len() / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for c in a[..body].chunks_exact(LANES) {
        for (s, &x) in acc.iter_mut().zip(c) {
            *s += x;
        }
    }
    a[body..].iter().fold(lane_sum(acc), |s, &x| s + x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reproducible scores in about `[−8, 8]`.
    fn scores(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 16.0
            })
            .collect()
    }

    /// Burn's composition in `f64`: `mask_fill(−∞)`, then `exp(x − max)/Σ`, or its log.
    fn reference(x: &[f32], mask: Option<&[bool]>, log: bool) -> Vec<f64> {
        let v: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                if mask.is_some_and(|m| m[i]) {
                    f64::NEG_INFINITY
                } else {
                    x as f64
                }
            })
            .collect();
        let max = v.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
        let sum: f64 = v.iter().map(|&x| (x - max).exp()).sum();
        v.iter()
            .map(|&x| {
                if log {
                    (x - max) - sum.ln()
                } else {
                    (x - max).exp() / sum
                }
            })
            .collect()
    }

    fn close(got: f32, want: f64, rel: f64, abs: f64) -> bool {
        if want.is_nan() {
            return got.is_nan();
        }
        if want.is_infinite() {
            return got as f64 == want;
        }
        (got as f64 - want).abs() <= rel * want.abs() + abs
    }

    /// Every row length of the brief, with no mask, some masked and all masked, on both paths
    /// and with 3 rows (serial) as with many (parallel).
    #[test]
    fn softmax_and_log_softmax_follow_f64() {
        for n in [1usize, 3, 17, 128, 384, 1000] {
            for rows in [3usize, PARALLEL_MIN / n + 5] {
                let x = scores(rows * n, n as u64);
                let some: Vec<bool> = (0..rows * n).map(|i| (i * 7 + i / n) % 5 == 1).collect();
                let all = vec![true; rows * n];
                // Three mask rows, each serving 7 score rows, cycled: a block of rows on
                // another thread starts inside a mask row's run.
                let cycled = RowMask::repeated(&some[..3 * n], 7);
                for (mask, name) in [
                    (None, "none"),
                    (Some(RowMask::new(&some)), "some"),
                    (Some(RowMask::new(&all)), "all"),
                    (Some(cycled), "cycled"),
                ] {
                    for log in [false, true] {
                        for isa in [Isa::PORTABLE, Isa::detected()] {
                            let mut y = vec![0.0; x.len()];
                            forward_rows_on(isa, log, Some(&x), &mut y, n, mask);
                            let mut again = x.clone();
                            forward_rows_on(isa, log, None, &mut again, n, mask);
                            assert_eq!(
                                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                                again.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                            );
                            for r in 0..rows {
                                let row = r * n..(r + 1) * n;
                                let m = mask_of(mask, r, n);
                                let want = reference(&x[row.clone()], Some(&m), log);
                                for (j, (&g, &w)) in y[row].iter().zip(&want).enumerate() {
                                    // Probabilities: relative 4 ulp; log-probabilities
                                    // absolute, from ln Σ and x − max.
                                    let ok = if log {
                                        close(g, w, 2.4e-7, 2e-6)
                                    } else {
                                        close(g, w, 4.8e-7, 1e-37)
                                    };
                                    assert!(
                                        ok,
                                        "n {n} rows {rows} mask {name} log {log} {isa:?} [{r},{j}]: {g} vs {w}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn mask_of(mask: Option<RowMask<'_>>, r: usize, n: usize) -> Vec<bool> {
        mask.map_or(vec![false; n], |m| m.row(r, n).to_vec())
    }

    /// A fully masked row is `NaN` (Burn's and PyTorch's composition), its neighbours not; a
    /// masked position is exactly 0.
    #[test]
    fn masks_follow_burn_s_mask_fill_then_softmax() {
        let n = 5;
        let x = scores(3 * n, 1);
        let mut bits = vec![false; 3 * n];
        bits[n..2 * n].fill(true);
        bits[2] = true;
        let mut y = vec![0.0; x.len()];
        masked_softmax_rows(&x, RowMask::new(&bits), &mut y, n);
        assert!(y[n..2 * n].iter().all(|v| v.is_nan()));
        assert_eq!(y[2], 0.0);
        assert!((y[..n].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(y[2 * n..].iter().all(|v| v.is_finite() && *v > 0.0));
        masked_log_softmax_rows(&x, RowMask::new(&bits), &mut y, n);
        assert_eq!(y[2], f32::NEG_INFINITY);
        assert!(y[n..2 * n].iter().all(|v| v.is_nan()));
        // A key-padding mask over 2 heads × 2 queries: mask row r / 4.
        let keys = vec![false, false, true, true, false, true];
        let x = scores(8 * 3, 2);
        let mut y = vec![0.0; x.len()];
        masked_softmax_rows(&x, RowMask::repeated(&keys, 4), &mut y, 3);
        for r in 0..8 {
            let m = &keys[(r / 4) * 3..][..3];
            for j in 0..3 {
                assert_eq!(y[r * 3 + j] == 0.0, m[j], "row {r}");
            }
        }
    }

    /// `NaN` or `+∞` in a row makes that row `NaN`; `−∞` is a zero probability.
    #[test]
    fn nan_and_infinities_follow_the_composition() {
        for isa in [Isa::PORTABLE, Isa::detected()] {
            let n = 20;
            let mut x = scores(4 * n, 3);
            x[3] = f32::NAN;
            x[n + 18] = f32::INFINITY;
            x[2 * n + 17] = f32::NEG_INFINITY;
            let mut y = vec![0.0; x.len()];
            forward_rows_on(isa, false, Some(&x), &mut y, n, None);
            assert!(y[..2 * n].iter().all(|v| v.is_nan()), "{isa:?}");
            assert_eq!(y[2 * n + 17], 0.0);
            assert!(y[2 * n..].iter().all(|v| !v.is_nan()));
            // Large scores do not overflow.
            let big = vec![1e30f32, 1e30, 0.0];
            let mut y = vec![0.0; 3];
            forward_rows_on(isa, true, Some(&big), &mut y, 3, None);
            assert!(
                (y[0] + core::f32::consts::LN_2).abs() < 1e-6 && y[2] == -1e30,
                "{y:?}"
            );
        }
    }

    /// The backward against `f64` formulas, on both paths, serial and parallel.
    #[test]
    fn backward_follows_f64() {
        for n in [1usize, 3, 17, 384, 1000] {
            for rows in [3usize, PARALLEL_MIN / n + 5] {
                let x = scores(rows * n, 7 + n as u64);
                let dy = scores(rows * n, 11 + n as u64);
                for log in [false, true] {
                    let mut y = vec![0.0; x.len()];
                    forward_rows_on(Isa::detected(), log, Some(&x), &mut y, n, None);
                    for isa in [Isa::PORTABLE, Isa::detected()] {
                        let mut dx = vec![0.0; x.len()];
                        backward_rows_on(isa, log, &y, Some(&dy), &mut dx, n);
                        let mut again = dy.clone();
                        backward_rows_on(isa, log, &y, None, &mut again, n);
                        assert_eq!(dx, again);
                        for r in 0..rows {
                            let row = r * n..(r + 1) * n;
                            let (y, dy, dx) = (&y[row.clone()], &dy[row.clone()], &dx[row]);
                            let (s, scale) = if log {
                                let s: f64 = dy.iter().map(|&v| v as f64).sum();
                                (s, dy.iter().map(|v| v.abs() as f64).sum::<f64>())
                            } else {
                                let s: f64 =
                                    y.iter().zip(dy).map(|(&a, &b)| a as f64 * b as f64).sum();
                                (s, dy.iter().map(|v| v.abs() as f64).fold(0.0, f64::max))
                            };
                            for j in 0..n {
                                let (yj, g) = (y[j] as f64, dy[j] as f64);
                                let want = if log { g - yj.exp() * s } else { yj * (g - s) };
                                let tol = 1e-6 * (scale + want.abs());
                                assert!(
                                    (dx[j] as f64 - want).abs() <= tol,
                                    "n {n} log {log} {isa:?} [{r},{j}]: {} vs {want}",
                                    dx[j]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// Rows split among threads give exactly what one call per row gives.
    #[test]
    fn parallel_rows_equal_serial_rows() {
        let n = 128;
        let rows = 4 * PARALLEL_MIN / n;
        let x = scores(rows * n, 5);
        let mut all = vec![0.0; x.len()];
        softmax_rows(&x, &mut all, n);
        for (r, want) in all.chunks(n).enumerate() {
            let mut one = vec![0.0; n];
            softmax_rows(&x[r * n..][..n], &mut one, n);
            assert_eq!(one, want, "row {r}");
        }
    }

    #[test]
    #[should_panic(expected = "not whole rows")]
    fn partial_rows_are_refused() {
        softmax_rows(&[0.0; 7], &mut [0.0; 7], 3);
    }
}
