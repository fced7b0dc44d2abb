//! Shared pieces of the burn-sketch examples: the MNIST data and the MLP they train.

pub mod mlp;
pub mod mnist;
