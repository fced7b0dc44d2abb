//! burn-serve's integration tests: one binary (each test binary links all of Burn again).

mod batcher;
mod common;
mod http;
mod protocol;
mod text;
