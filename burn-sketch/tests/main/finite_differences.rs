//! Autodiff's gradients of `SkLinear` against central finite differences, in f64.
//!
//! In a process of its own: Burn 0.21 keeps one default float type per device, so `NdArray<f64>`
//! used in a process that already ran `NdArray<f32>` on the same device computes in f32.

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use burn_sketch::{SkLinear, SkLinearConfig};

const DEVICE: NdArrayDevice = NdArrayDevice::Cpu;

/// Central finite differences of `L = Σ y ⊙ g` in f64 agree with autodiff's gradients for
/// every trained tensor and the input.
#[test]
fn gradients_match_finite_differences() {
    crate::own_process::in_own_process(
        "finite_differences::gradients_match_finite_differences",
        check_against_finite_differences,
    );
}

fn check_against_finite_differences() {
    type F = Autodiff<NdArray<f64>>;
    F::seed(&DEVICE, 99);
    let (n, d_in, d_out, t, k) = (3, 5, 4, 2, 2);
    let layer = SkLinearConfig::new(d_in, d_out, t, k).init::<F>(&DEVICE);
    let x = Tensor::<F, 2>::random([n, d_in], Distribution::Default, &DEVICE).require_grad();
    let g = Tensor::<F, 2>::random([n, d_out], Distribution::Default, &DEVICE);
    let loss = |layer: &SkLinear<F>, x: Tensor<F, 2>| -> f64 {
        (layer.forward(x) * g.clone()).sum().into_scalar()
    };
    let grads = (layer.forward(x.clone()) * g.clone()).sum().backward();
    let h = 1e-4;

    let check = |name: &str, analytic: Vec<f64>, numeric: &dyn Fn(usize) -> f64| {
        for (i, a) in analytic.iter().enumerate() {
            let fd = numeric(i);
            assert!(
                (a - fd).abs() <= 1e-6 * (1.0 + fd.abs()),
                "{name}[{i}]: autodiff {a}, finite difference {fd}"
            );
        }
    };
    let bump = |t: &Tensor<F, 3>, i: usize, delta: f64| {
        let mut values = t.to_data().to_vec::<f64>().unwrap();
        values[i] += delta;
        Tensor::<F, 3>::from_data(
            burn::tensor::TensorData::new(values, t.dims().to_vec()),
            &DEVICE,
        )
    };

    let grad_s1 = layer
        .s1s
        .grad(&grads)
        .unwrap()
        .into_data()
        .to_vec::<f64>()
        .unwrap();
    check("S1s", grad_s1, &|i| {
        let at = |delta| {
            let mut l = layer.clone();
            l.s1s = Param::from_tensor(bump(&layer.s1s.val(), i, delta));
            loss(&l, x.clone())
        };
        (at(h) - at(-h)) / (2.0 * h)
    });
    let grad_s2 = layer
        .s2s
        .grad(&grads)
        .unwrap()
        .into_data()
        .to_vec::<f64>()
        .unwrap();
    check("S2s", grad_s2, &|i| {
        let at = |delta| {
            let mut l = layer.clone();
            l.s2s = Param::from_tensor(bump(&layer.s2s.val(), i, delta));
            loss(&l, x.clone())
        };
        (at(h) - at(-h)) / (2.0 * h)
    });
    let grad_x = x.grad(&grads).unwrap().into_data().to_vec::<f64>().unwrap();
    check("x", grad_x, &|i| {
        let at = |delta| {
            let bumped = bump(&x.clone().unsqueeze_dim(0), i, delta).reshape([n, d_in]);
            loss(&layer, bumped)
        };
        (at(h) - at(-h)) / (2.0 * h)
    });
}
