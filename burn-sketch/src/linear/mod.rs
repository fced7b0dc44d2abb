//! The sketched linear layer, a drop-in for `burn::nn::Linear`.

mod config;
mod init;
mod module;

pub use config::SkLinearConfig;
pub use module::{ParamCounts, SkLinear};

pub use init::SketchInit;
pub(crate) use init::sign_sketch;
