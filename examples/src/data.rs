//! MNIST as a Burn dataset and batcher, so burn-train's data loaders can shuffle and batch it.

use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::mnist::Mnist;

/// The mean of MNIST pixels scaled to `[0, 1]` ([`DigitBatcher`] subtracts it).
pub const MEAN: f32 = 0.1307;
/// Their standard deviation ([`DigitBatcher`] divides by it).
pub const STD: f32 = 0.3081;

/// One digit: its pixels (row-major bytes) and its label.
#[derive(Debug, Clone)]
pub struct Digit {
    /// `rows × cols` greyscale bytes.
    pub pixels: Vec<u8>,
    /// The digit, 0-9.
    pub label: u8,
}

/// A [`Mnist`] set seen as a [`Dataset`] of [`Digit`]s. Cloning shares the pixels.
#[derive(Debug, Clone)]
pub struct DigitDataset {
    data: Arc<Mnist>,
}

impl DigitDataset {
    /// Wraps a loaded set.
    pub fn new(data: Mnist) -> Self {
        Self {
            data: Arc::new(data),
        }
    }

    /// Pixels per digit.
    pub fn pixels_per_digit(&self) -> usize {
        self.data.rows * self.data.cols
    }
}

impl Dataset<Digit> for DigitDataset {
    fn get(&self, index: usize) -> Option<Digit> {
        let size = self.pixels_per_digit();
        let label = *self.data.labels.get(index)?;
        let pixels = self.data.images[index * size..(index + 1) * size].to_vec();
        Some(Digit { pixels, label })
    }

    fn len(&self) -> usize {
        self.data.len()
    }
}

/// A batch: normalised pixels `[n, rows·cols]` and labels `[n]`.
#[derive(Debug, Clone)]
pub struct DigitBatch<B: Backend> {
    /// Normalised pixels.
    pub images: Tensor<B, 2>,
    /// Labels.
    pub targets: Tensor<B, 1, Int>,
}

/// Turns digits into a [`DigitBatch`], normalising the pixels.
#[derive(Debug, Clone, Default)]
pub struct DigitBatcher;

impl<B: Backend> Batcher<B, Digit, DigitBatch<B>> for DigitBatcher {
    fn batch(&self, items: Vec<Digit>, device: &B::Device) -> DigitBatch<B> {
        let n = items.len();
        let size = items.first().map_or(0, |d| d.pixels.len());
        let pixels: Vec<f32> = items
            .iter()
            .flat_map(|d| d.pixels.iter().map(|&p| (p as f32 / 255.0 - MEAN) / STD))
            .collect();
        let labels: Vec<i64> = items.iter().map(|d| d.label as i64).collect();
        DigitBatch {
            images: Tensor::from_data(TensorData::new(pixels, [n, size]), device),
            targets: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;

    #[test]
    fn batches_are_normalised_and_labelled() {
        let data = Mnist {
            images: vec![0, 255, 0, 0, 0, 0, 0, 255],
            labels: vec![3, 7],
            rows: 2,
            cols: 2,
        };
        let dataset = DigitDataset::new(data);
        assert_eq!(dataset.len(), 2);
        assert!(dataset.get(2).is_none());
        let items = vec![dataset.get(1).unwrap(), dataset.get(0).unwrap()];
        let batch: DigitBatch<Flex> = DigitBatcher.batch(items, &Default::default());
        assert_eq!(batch.images.dims(), [2, 4]);
        let targets: Vec<i64> = batch.targets.into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(targets, vec![7, 3]);
        let pixels: Vec<f32> = batch.images.into_data().to_vec().unwrap();
        let (zero, one) = (-MEAN / STD, (1.0 - MEAN) / STD);
        let expected = [zero, zero, zero, one, zero, one, zero, zero];
        for (p, e) in pixels.iter().zip(expected) {
            assert!((p - e).abs() < 1e-6, "{pixels:?}");
        }
    }
}
