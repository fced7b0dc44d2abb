//! Feeds arbitrary bytes to the checkpoint loader: safetensors, `torch.save` zip archives and
//! legacy `torch.save` streams (the first bytes pick the format). Any outcome but a panic, an
//! abort or a sanitizer report is a pass; a layer that loads must hold only finite sizes.
//!
//! Run from `burn-sketch/`: `cargo +nightly fuzz run load_sklinear fuzz/seeds`, with the
//! committed seeds (the test fixtures and a safetensors file) to start from valid files.
#![no_main]

use burn::backend::NdArray;
use burn_sketch::panther::load_sklinear_from_bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let device = Default::default();
    for prefix in ["", "fc."] {
        if let Ok(layer) = load_sklinear_from_bytes::<NdArray>(data, prefix, &device) {
            let x = burn::tensor::Tensor::<NdArray, 2>::ones([1, layer.d_input()], &device);
            let y = layer.forward(x);
            assert_eq!(y.dims(), [1, layer.d_output()]);
        }
    }
});
