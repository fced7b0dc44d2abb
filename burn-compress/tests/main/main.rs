//! burn-compress's integration tests: one binary (each test binary links all of Burn again),
//! one module per tool.

#[path = "../../../testing/close.rs"]
mod close;
mod distil;
mod int8;
mod performer;
mod prune;
mod rank_search;
mod transformer;
mod wgpu;
