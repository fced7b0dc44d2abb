//! Device memory as burn-train metrics, shown on the learner's dashboard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::train::metric::{
    Metric, MetricAttributes, MetricMetadata, MetricName, Numeric, NumericAttributes, NumericEntry,
    SerializedEntry,
};

use crate::{Bytes, DeviceMemory, MemoryTracker};

/// Which figure a [`DeviceMemoryMetric`] shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryQuantity {
    /// Bytes held by live tensors now.
    InUse,
    /// Bytes the allocator holds now.
    Reserved,
    /// The peak since the start of the epoch (see [`MemoryTracker`] for how it is obtained).
    Peak,
}

/// A device's memory as a numeric metric, in MB: register it with
/// `SupervisedTraining::metric_train_numeric` and it is plotted on the dashboard like the loss.
/// The peak metric starts over at each epoch.
///
/// ```no_run
/// # use burn::backend::NdArray;
/// use burn_memory::DeviceMemoryMetric;
/// let device = Default::default();
/// let in_use = DeviceMemoryMetric::<NdArray>::in_use(&device);
/// let peak = DeviceMemoryMetric::<NdArray>::peak(&device);
/// // SupervisedTraining::new(...).metric_train_numeric(in_use).metric_train_numeric(peak)
/// ```
#[derive(Clone)]
pub struct DeviceMemoryMetric<B: DeviceMemory> {
    tracker: MemoryTracker<B>,
    quantity: MemoryQuantity,
    name: MetricName,
    bytes: u64,
    last_read: Option<Instant>,
}

/// Reading the device costs a round trip to its server: at most five times a second.
const REFRESH: Duration = Duration::from_millis(200);

impl<B: DeviceMemory> DeviceMemoryMetric<B> {
    /// Bytes in use on `device`.
    pub fn in_use(device: &B::Device) -> Self {
        Self::new(device, MemoryQuantity::InUse)
    }

    /// Bytes reserved on `device`.
    pub fn reserved(device: &B::Device) -> Self {
        Self::new(device, MemoryQuantity::Reserved)
    }

    /// Peak memory of `device` in the current epoch.
    pub fn peak(device: &B::Device) -> Self {
        Self::new(device, MemoryQuantity::Peak)
    }

    /// A metric of `quantity` on `device`.
    pub fn new(device: &B::Device, quantity: MemoryQuantity) -> Self {
        let name = match quantity {
            MemoryQuantity::InUse => "Memory in use",
            MemoryQuantity::Reserved => "Memory reserved",
            MemoryQuantity::Peak => "Memory peak (epoch)",
        };
        Self {
            tracker: MemoryTracker::new(device),
            quantity,
            name: Arc::new(name.to_string()),
            bytes: 0,
            last_read: None,
        }
    }

    fn read(&mut self) {
        if self.last_read.is_some_and(|at| at.elapsed() < REFRESH) {
            return;
        }
        self.last_read = Some(Instant::now());
        match self.tracker.sample() {
            Ok(usage) => {
                self.bytes = match self.quantity {
                    MemoryQuantity::InUse => usage.in_use,
                    MemoryQuantity::Reserved => usage.reserved,
                    MemoryQuantity::Peak => self.tracker.current_peak(),
                }
            }
            Err(error) => tracing::warn!("memory metric: {error}"),
        }
    }
}

impl<B: DeviceMemory> Metric for DeviceMemoryMetric<B> {
    type Input = ();

    fn update(&mut self, _item: &(), _metadata: &MetricMetadata) -> SerializedEntry {
        self.read();
        let mb = self.bytes as f64 / 1e6;
        SerializedEntry::new(Bytes(self.bytes).to_string(), mb.to_string())
    }

    fn clear(&mut self) {
        if self.quantity == MemoryQuantity::Peak
            && let Err(error) = self.tracker.reset_peak()
        {
            tracing::warn!("memory metric: {error}");
        }
        self.last_read = None;
    }

    fn name(&self) -> MetricName {
        self.name.clone()
    }

    fn attributes(&self) -> MetricAttributes {
        NumericAttributes {
            unit: Some("MB".to_string()),
            higher_is_better: false,
        }
        .into()
    }
}

impl<B: DeviceMemory> Numeric for DeviceMemoryMetric<B> {
    fn value(&self) -> NumericEntry {
        NumericEntry::Value(self.bytes as f64 / 1e6)
    }

    fn running_value(&self) -> NumericEntry {
        self.value()
    }
}
