//! The row reductions of the online softmax: a row's maximum and its exponentials' sum,
//! written as sixteen independent lanes so that the compiler turns each into one vector
//! register (on the AVX-512 path, inlined into its `#[target_feature]` wrapper).

use crate::math::exp_non_positive_f;

/// The largest value (`−∞` for none), sixteen lanes at a time. A comparison rather than
/// `f32::max`, whose NaN rule costs two more instructions per vector: a NaN is skipped here,
/// and turns the row's exponentials into NaN in [`exp_shifted`].
#[inline(always)]
pub(super) fn max_of(values: &[f32]) -> f32 {
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
pub(super) fn exp_shifted<const FMA: bool>(values: &mut [f32], max: f32) -> f32 {
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
