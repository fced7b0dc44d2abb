//! Roofline bounds: the least time a layer can take on a device, from its FLOPs and the bytes
//! it must move, so that a row can show the speedup possible next to the one achieved.
//!
//! A product of `flops` floating-point operations over `bytes` of operands can finish no sooner
//! than `max(flops / peak_flops, bytes / bandwidth)`. Thin products (the sketched layer's
//! `x·A` with `r = 2Tk` columns) sit on the bandwidth side of that max; dense layers of large
//! batch sit on the compute side. The FLOP ratio alone overstates what sketching can gain
//! wherever the sketched layer is bandwidth-bound.

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::Dtype;
use super::grid::Point;

/// Devices whose datasheet peaks the suite knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceModel {
    /// NVIDIA H100 SXM5 80 GB.
    H100Sxm,
    /// NVIDIA H100 PCIe 80 GB.
    H100Pcie,
    /// NVIDIA H200 SXM 141 GB.
    H200,
    /// NVIDIA A100 SXM 80 GB.
    A100,
}

/// Peak rates of one device, from its datasheet (dense, no sparsity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceSpec {
    /// The device's name.
    pub name: &'static str,
    /// FP32 FLOP/s without tensor cores, in TFLOP/s: what an f32 product is held to when it
    /// does not use TF32 tensor cores (CubeCL's f32 matmul does not).
    pub f32_tflops: f64,
    /// FP16/BF16 tensor-core FLOP/s (f32 accumulation), in TFLOP/s.
    pub half_tflops: f64,
    /// Memory bandwidth, in GB/s.
    pub bandwidth_gbs: f64,
}

impl DeviceModel {
    /// The datasheet figures.
    pub fn spec(self) -> DeviceSpec {
        match self {
            Self::H100Sxm => DeviceSpec {
                name: "H100 SXM",
                f32_tflops: 67.0,
                half_tflops: 989.4,
                bandwidth_gbs: 3350.0,
            },
            Self::H100Pcie => DeviceSpec {
                name: "H100 PCIe",
                f32_tflops: 51.2,
                half_tflops: 756.0,
                bandwidth_gbs: 2000.0,
            },
            Self::H200 => DeviceSpec {
                name: "H200 SXM",
                f32_tflops: 67.0,
                half_tflops: 989.4,
                bandwidth_gbs: 4800.0,
            },
            Self::A100 => DeviceSpec {
                name: "A100 SXM",
                f32_tflops: 19.5,
                half_tflops: 312.0,
                bandwidth_gbs: 2039.0,
            },
        }
    }
}

/// The roofline of one point on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// The device the bounds are for.
    pub device: String,
    /// Least time of the sketched forward, in milliseconds.
    pub sketch_forward_ms: f64,
    /// Least time of the dense forward, in milliseconds.
    pub dense_forward_ms: f64,
    /// Whether the sketched forward's bound is set by memory traffic rather than compute.
    pub sketch_bandwidth_bound: bool,
}

impl Roofline {
    /// Bounds of `point` in `dtype` on `spec`.
    pub fn new(point: Point, dtype: Dtype, spec: DeviceSpec) -> Self {
        let peak = match dtype {
            Dtype::F32 => spec.f32_tflops,
            Dtype::F16 | Dtype::Bf16 => spec.half_tflops,
            // The datasheets' int8 rates are not in `DeviceSpec`; int8 runs on the CPU only.
            Dtype::Int8 => spec.half_tflops,
        } * 1e12;
        let bandwidth = spec.bandwidth_gbs * 1e9;
        let bound = |flops: f64, bytes: f64| {
            let (compute, traffic) = (flops / peak, bytes / bandwidth);
            (compute.max(traffic) * 1e3, traffic >= compute)
        };
        let elem = dtype.size() as f64;
        let (sketch_forward_ms, sketch_bandwidth_bound) = bound(
            point.sketch_forward_flops(),
            point.sketch_forward_elements() as f64 * elem,
        );
        let (dense_forward_ms, _) = bound(
            point.dense_forward_flops(),
            point.dense_forward_elements() as f64 * elem,
        );
        Self {
            device: spec.name.to_string(),
            sketch_forward_ms,
            dense_forward_ms,
            sketch_bandwidth_bound,
        }
    }

    /// Dense bound over sketched bound: the forward speedup this device allows.
    pub fn possible_speedup(&self) -> f64 {
        self.dense_forward_ms / self.sketch_forward_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thin_sketch_is_bandwidth_bound_and_dense_compute_bound_on_h100() {
        let point = Point {
            d_input: 8192,
            d_output: 8192,
            num_terms: 1,
            low_rank: 16,
            batch: 256,
        };
        let roof = Roofline::new(point, Dtype::F32, DeviceModel::H100Sxm.spec());
        assert!(roof.sketch_bandwidth_bound);
        // Dense: 2·256·8192² FLOP at 67 TFLOP/s = 0.513 ms; its 268 MB of weight at
        // 3.35 TB/s take 0.080 ms, so compute sets the bound.
        let dense = 2.0 * 256.0 * 8192.0 * 8192.0 / 67e12 * 1e3;
        assert!((roof.dense_forward_ms - dense).abs() < 1e-9);
        // Sketched: x and y (2·256·8192), A and B (2·32·8192) and the bias, 4 bytes each.
        let bytes = 4.0 * (2.0 * 256.0 * 8192.0 + 2.0 * 32.0 * 8192.0 + 8192.0);
        assert!((roof.sketch_forward_ms - bytes / 3350e9 * 1e3).abs() < 1e-12);
        // So the device allows less than the FLOP ratio's 128×: about 91×.
        let possible = roof.possible_speedup();
        assert!(
            possible < 1.0 / point.flop_ratio() && possible > 90.0,
            "{possible}"
        );
    }
}
