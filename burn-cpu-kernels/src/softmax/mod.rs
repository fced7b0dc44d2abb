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
//! Every named function is [`forward_rows_on`] or [`backward_rows_on`] with
//! [`Isa::detected`]; those two take the [`Isa`] (the AVX-512 path where [`Isa::avx512`]
//! holds), which tests and benchmarks pass to compare the paths in one process.

use crate::Isa;
use crate::math::{LANES, PARALLEL_MIN, exp_f, lane_sum, mul_add, sum};

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
pub(crate) enum Forward {
    Softmax,
    LogSoftmax,
}

/// The backward operation of a call.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backward {
    Softmax,
    LogSoftmax,
}

/// `dst` = the softmax of each row of `n` values of `src`: `exp(x − max)/Σ exp(x − max)`.
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`.
pub fn softmax_rows(src: &[f32], dst: &mut [f32], n: usize) {
    forward_rows_on(Isa::detected(), false, Some(src), dst, n, None);
}

/// [`softmax_rows`] in place.
///
/// # Panics
/// If `values` is not whole rows of `n`.
pub fn softmax_rows_in_place(values: &mut [f32], n: usize) {
    forward_rows_on(Isa::detected(), false, None, values, n, None);
}

/// [`softmax_rows`] with masked positions (`true`) at probability 0, as Burn's
/// `mask_fill(mask, −∞)` then `softmax`; a row with every position masked is all `NaN`, as
/// there (and in PyTorch).
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`, or the mask is not.
pub fn masked_softmax_rows(src: &[f32], mask: RowMask<'_>, dst: &mut [f32], n: usize) {
    forward_rows_on(Isa::detected(), false, Some(src), dst, n, Some(mask));
}

/// `dst` = the log-softmax of each row: `(x − max) − ln Σ exp(x − max)`, the stable form
/// (`x − ln Σ eˣ` overflows from `x ≈ 89`).
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`.
pub fn log_softmax_rows(src: &[f32], dst: &mut [f32], n: usize) {
    forward_rows_on(Isa::detected(), true, Some(src), dst, n, None);
}

/// [`log_softmax_rows`] with masked positions at `−∞` (a fully masked row is all `NaN`).
///
/// # Panics
/// If the slices differ in length or are not whole rows of `n`, or the mask is not.
pub fn masked_log_softmax_rows(src: &[f32], mask: RowMask<'_>, dst: &mut [f32], n: usize) {
    forward_rows_on(Isa::detected(), true, Some(src), dst, n, Some(mask));
}

/// The forward operations on the path `isa` picks: the softmax, or the log-softmax with
/// `log`, into `dst` from `src`, or in place in `dst` without `src`, masked with `mask`. What
/// the named functions (the masked ones too) call with [`Isa::detected`]; tests and
/// benchmarks call it to compare paths.
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
    let op = if log {
        Forward::LogSoftmax
    } else {
        Forward::Softmax
    };
    let avx512 = isa.avx512();
    for_row_blocks(dst, n, |first, block| {
        let src = src.map(|src| &src[first * n..first * n + block.len()]);
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: `avx512` is `isa.avx512()`, true only where AVX-512 and FMA were
            // detected.
            unsafe { crate::x86_64::rows::softmax_forward_avx512(op, first, src, block, n, mask) };
            return;
        }
        let _ = avx512;
        forward_block::<false>(op, first, src, block, n, mask);
    });
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
/// with `log`, into `dx` from `dy`, or in place in `dx` (holding `dy`) without `dy`. What
/// the named backward functions call with [`Isa::detected`].
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
            // SAFETY: `avx512` is `isa.avx512()`, true only where AVX-512 and FMA were
            // detected.
            unsafe { crate::x86_64::rows::softmax_backward_avx512(op, &y[rows], dy, block, n) };
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

/// The rows of one block, in place after copying each row from `src` (the row is then in
/// L1 for the passes that follow). A mask is applied in the first pass (masked positions
/// set to `−∞` as the maximum is found), so the `exp` passes are the unmasked ones.
/// Compiled twice: here with `FMA = false`, and with `FMA = true` in the AVX-512 wrapper of
/// `x86_64/rows.rs`.
#[inline(always)]
pub(crate) fn forward_block<const FMA: bool>(
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
pub(crate) fn row_max(row: &[f32]) -> f32 {
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

/// The rows of one block, in place in `block` (after copying each row of `dy` into it);
/// compiled twice, as [`forward_block`].
#[inline(always)]
pub(crate) fn backward_block<const FMA: bool>(
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
                let sum = sum(grad);
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

#[cfg(test)]
mod tests;
