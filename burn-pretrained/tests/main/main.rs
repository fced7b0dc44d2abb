//! burn-pretrained's integration tests: one binary (each test binary links all of Burn again),
//! one module per concern. They run on the committed fixture `tests/fixtures/tiny-bert` (a
//! small random BERT in Hugging Face's layout, with transformers' own results, written by
//! `xtask/pytorch/hf_fixture.py`): nothing is downloaded.

#[path = "../../../testing/close.rs"]
mod close;
mod common;
mod convert;
mod distil;
mod errors;
mod load;
mod padding;
mod pooling;
mod tokenize;
