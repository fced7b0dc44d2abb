//! The workspace's seeded draws on the host, from SplitMix64 (Steele, Lea and Flood), whose output
//! depends on nothing but the seed: the same seed gives the same sketching operator, fixed
//! sketch or autotuner search on every backend (a backend's own generator differs from one to
//! the next).

use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{Rng, SeedableRng};

/// A seeded stream of draws: uniform, sign, normal and index draws from one seed.
pub struct Draws(SplitMix64);

impl Draws {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64::seed_from_u64(seed))
    }

    /// Uniform in `[0, 1)`, from the top 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `±1` with equal probability.
    pub fn sign(&mut self) -> f64 {
        if self.0.next_u64() >> 63 == 0 {
            1.0
        } else {
            -1.0
        }
    }

    /// A standard normal draw (Box–Muller; one of the pair is used, for a simple stream).
    pub fn normal(&mut self) -> f64 {
        let u = 1.0 - self.unit(); // (0, 1]: the logarithm stays finite.
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Uniform in `0..n` (`n ≥ 1`), by the multiply-shift method (bias below 2⁻⁶⁴·n).
    pub fn below(&mut self, n: u128) -> u128 {
        (u128::from(self.0.next_u64()) * n) >> 64
    }

    /// Uniform in `range` (not empty).
    pub fn within(&mut self, range: &std::ops::RangeInclusive<usize>) -> usize {
        let span = (*range.end() - *range.start()) as u128 + 1;
        range.start() + self.below(span) as usize
    }

    /// `k ≤ n` distinct values of `0..n`, in the order drawn (Floyd's algorithm for small `k`,
    /// a partial shuffle otherwise).
    pub fn choose(&mut self, n: usize, k: usize) -> Vec<usize> {
        debug_assert!(k <= n);
        if k * 4 <= n {
            let mut chosen: Vec<usize> = Vec::with_capacity(k);
            for j in n - k..n {
                let t = self.below((j + 1) as u128) as usize;
                chosen.push(if chosen.contains(&t) { j } else { t });
            }
            chosen
        } else {
            let mut all: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = i + self.below((n - i) as u128) as usize;
                all.swap(i, j);
            }
            all.truncate(k);
            all
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choose_is_distinct_and_in_range() {
        let mut draws = Draws::new(3);
        for (n, k) in [(10, 10), (10, 1), (1000, 7), (64, 40)] {
            let mut chosen = draws.choose(n, k);
            assert_eq!(chosen.len(), k);
            assert!(chosen.iter().all(|&c| c < n));
            chosen.sort_unstable();
            chosen.dedup();
            assert_eq!(chosen.len(), k, "repeats in choose({n}, {k})");
        }
    }

    #[test]
    fn normal_has_unit_variance() {
        let mut draws = Draws::new(11);
        let xs: Vec<f64> = (0..200_000).map(|_| draws.normal()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
    }
}
