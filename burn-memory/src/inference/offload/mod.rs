//! Tiered parameter offloading: the parameters of chosen modules live on the host or in a disk
//! cache and come to the device when the model's `forward` reads them, so that a model larger
//! than the device runs, with its own code unchanged.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::nn::{Linear, LinearConfig};
//! use burn::tensor::{Distribution, Tensor};
//! use burn_memory::offload::{OffloadConfig, OffloadManager, OffloadSelection};
//!
//! let device = Default::default();
//! let model: Linear<Flex> = LinearConfig::new(64, 32).init(&device);
//! let x = Tensor::<Flex, 2>::random([8, 64], Distribution::Default, &device);
//! let expected = model.forward(x.clone());
//!
//! let config = OffloadConfig::new().with_device_budget_bytes(Some(64 << 20));
//! let manager = OffloadManager::<Flex>::new(config, &device).unwrap();
//! let model = manager.wrap(model, &OffloadSelection::default()).unwrap();
//! let y = model.run(|model| model.forward(x.clone())).unwrap();
//! y.into_data().assert_eq(&expected.into_data(), true);
//! println!("{}", manager.summary());
//! manager.cleanup();
//! ```

mod cache;
mod config;
mod host;
mod manager;
#[cfg(feature = "train")]
mod metric;
mod summary;
mod wrap;

pub use config::OffloadConfig;
pub use manager::OffloadManager;
#[cfg(feature = "train")]
pub use metric::{OffloadMetric, OffloadQuantity};
pub use summary::{OffloadCounters, OffloadSummary, TierUsage};
pub use wrap::{OffloadSelection, OffloadedModel, WrapError};
