//! The offload manager's figures as burn-train metrics, on the learner's dashboard.

use std::sync::Arc;

use burn::train::metric::{
    Metric, MetricAttributes, MetricMetadata, MetricName, Numeric, NumericAttributes, NumericEntry,
    SerializedEntry,
};

use super::{OffloadCounters, OffloadManager, OffloadSummary};
use crate::{Bytes, DeviceMemory};

/// Which figure an [`OffloadMetric`] shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadQuantity {
    /// Parameter bytes held in the host tier now, in MB.
    HostBytes,
    /// Bytes in the disk cache now, in MB.
    DiskBytes,
    /// Parameter bytes loaded onto the device since the epoch started, in MB.
    BytesLoaded,
    /// Loads the prefetcher had read ahead, as a percentage of the loads since the epoch
    /// started (device-cache hits excluded).
    PrefetchHitRate,
}

/// An [`OffloadManager`]'s tiers and traffic as a numeric metric: register it with
/// `SupervisedTraining::metric_train_numeric` (or `metric_valid_numeric`) to plot it beside the
/// loss.
#[derive(Clone)]
pub struct OffloadMetric<B: DeviceMemory> {
    manager: OffloadManager<B>,
    quantity: OffloadQuantity,
    name: MetricName,
    /// The counters when the epoch started.
    start: OffloadCounters,
    value: f64,
}

impl<B: DeviceMemory> OffloadMetric<B> {
    /// A metric of `quantity` on `manager`.
    pub fn new(manager: &OffloadManager<B>, quantity: OffloadQuantity) -> Self {
        let name = match quantity {
            OffloadQuantity::HostBytes => "Offload host tier",
            OffloadQuantity::DiskBytes => "Offload disk cache",
            OffloadQuantity::BytesLoaded => "Offload loaded (epoch)",
            OffloadQuantity::PrefetchHitRate => "Offload prefetch hits",
        };
        Self {
            start: manager.summary().counters,
            manager: manager.clone(),
            quantity,
            name: Arc::new(name.to_string()),
            value: 0.0,
        }
    }

    fn read(&self, summary: &OffloadSummary) -> f64 {
        let (now, start) = (&summary.counters, &self.start);
        match self.quantity {
            OffloadQuantity::HostBytes => summary.host.bytes as f64 / 1e6,
            OffloadQuantity::DiskBytes => summary.disk.bytes as f64 / 1e6,
            OffloadQuantity::BytesLoaded => {
                let loaded = now.bytes_from_host + now.bytes_from_disk;
                (loaded - start.bytes_from_host - start.bytes_from_disk) as f64 / 1e6
            }
            OffloadQuantity::PrefetchHitRate => {
                let loads = now.loads_from_host + now.loads_from_disk
                    - start.loads_from_host
                    - start.loads_from_disk;
                let hits = now.prefetch_hits - start.prefetch_hits;
                100.0 * hits as f64 / loads.max(1) as f64
            }
        }
    }
}

impl<B: DeviceMemory> Metric for OffloadMetric<B> {
    type Input = ();

    fn update(&mut self, _item: &(), _metadata: &MetricMetadata) -> SerializedEntry {
        self.value = self.read(&self.manager.summary());
        let formatted = match self.quantity {
            OffloadQuantity::PrefetchHitRate => format!("{:.1} %", self.value),
            _ => Bytes((self.value * 1e6) as u64).to_string(),
        };
        SerializedEntry::new(formatted, self.value.to_string())
    }

    fn clear(&mut self) {
        self.start = self.manager.summary().counters;
        self.value = 0.0;
    }

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        let (unit, higher_is_better) = match self.quantity {
            OffloadQuantity::PrefetchHitRate => ("%", true),
            _ => ("MB", false),
        };
        NumericAttributes {
            unit: Some(unit.to_string()),
            higher_is_better,
        }
        .into()
    }
}

impl<B: DeviceMemory> Numeric for OffloadMetric<B> {
    fn value(&self) -> NumericEntry {
        NumericEntry::Value(self.value)
    }

    fn running_value(&self) -> NumericEntry {
        self.value()
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::backend::Flex;
    use burn::nn::{Linear, LinearConfig};

    use super::*;
    use crate::offload::{OffloadConfig, OffloadSelection};

    #[test]
    fn the_metrics_read_the_managers_tiers_and_traffic() {
        let device = Default::default();
        let model: Linear<Flex> = LinearConfig::new(64, 32).init(&device);
        let config = OffloadConfig::new()
            .with_device_budget_bytes(Some(1024))
            .with_disk_tier(false);
        let manager = OffloadManager::<Flex>::new(config, &device).unwrap();
        let model = manager.wrap(model, &OffloadSelection::default()).unwrap();
        let progress = || burn::data::dataloader::Progress {
            items_processed: 1,
            items_total: 1,
        };
        let metadata = MetricMetadata {
            progress: progress(),
            global_progress: progress(),
            iteration: Some(1),
            lr: None,
        };
        let mut host = OffloadMetric::new(&manager, OffloadQuantity::HostBytes);
        let mut loaded = OffloadMetric::new(&manager, OffloadQuantity::BytesLoaded);
        host.update(&(), &metadata);
        assert_eq!(host.value, 64.0 * 32.0 * 4.0 / 1e6);
        let x = burn::tensor::Tensor::<Flex, 2>::ones([2, 64], &device);
        for _ in 0..3 {
            model.run(|m| m.forward(x.clone())).unwrap();
        }
        loaded.update(&(), &metadata);
        assert_eq!(loaded.value, 3.0 * 64.0 * 32.0 * 4.0 / 1e6);
        loaded.clear();
        loaded.update(&(), &metadata);
        assert_eq!(loaded.value, 0.0, "a new epoch starts from zero");
    }
}
