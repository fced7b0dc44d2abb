//! Shared pieces of the burn-sketch examples: the MNIST data and the MLP they train.

pub mod backend;
#[cfg(doctest)]
pub mod book;
pub mod checkpoint;
pub mod data;
pub mod lm;
pub mod mlp;
pub mod mnist;
pub mod parallel;
pub mod profile_args;
pub mod progress;
pub mod serve;
pub mod training;
