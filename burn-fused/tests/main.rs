//! burn-fused's tests: every fused operation's forward and gradients against the
//! decomposed computation Burn's autodiff differentiates, on NdArray, Flex and FastFlex.

mod main {
    mod attention;
    pub mod common;
    mod optim;
    mod rows;
    mod training;
}
