//! `cargo xtask overhead`: what one call of `SkLinear` costs a CubeCL device besides its
//! arithmetic, counted rather than timed: kernel launches, buffer reservations from the memory
//! pools with their bytes, and new device buffers (pool misses), per forward and per training
//! step, against dense `nn::Linear`.
//!
//! The counts come from CubeCL's own instrumentation: with its `tracing` feature (on through
//! burn-fusion's defaults), every launch goes through `ComputeClient::launch_inner` and every
//! buffer reservation through the memory manager's `reserve`, and every new wgpu buffer through
//! the storage's `alloc`, each a `trace` span. A
//! process-wide subscriber counts those spans; nothing else is recorded. Counts taken on wgpu
//! over lavapipe hold on a GPU (the same CubeCL code runs); times would not, so none are shown.
//!
//! Host syncs are not counted: `Backend::sync` has no span, and only a wrapper around CubeCL's
//! compute server could see them.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Result;
use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
use burn::backend::{Autodiff, Wgpu};
use burn::module::AutodiffModule;
use burn::nn::LinearConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use burn_sketch::backend::KernelStrategy;
use burn_sketch::{SkLinearConfig, SketchBackend};
use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata};

/// Options of `cargo xtask overhead`.
#[derive(Debug, clap::Args)]
pub struct OverheadArgs {
    /// Input and output width of the layer.
    #[arg(long, default_value_t = 1024)]
    pub width: usize,
    /// Rows of the input.
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Rank of each sketched term.
    #[arg(long, default_value_t = 16)]
    pub low_rank: usize,
    /// Write the rows as JSON to this file too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// What one call cost, after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Kernel launches.
    pub launches: u64,
    /// Buffer reservations from CubeCL's memory pools (outputs included).
    pub reservations: u64,
    /// Bytes of those reservations.
    pub reserved_bytes: u64,
    /// New device buffers (reservations the pools could not serve from pages they hold).
    pub new_buffers: u64,
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `plain` (the CubeCL backend) or `fusion` (`Wgpu` with Burn's fusion).
    pub backend: &'static str,
    /// `dense`, or the sketched layer's kernel strategy.
    pub layer: String,
    /// `forward` or `training step` (forward, backward, gradients of every parameter).
    pub call: &'static str,
    /// The counts of one call.
    pub counts: Counts,
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static RESERVATIONS: AtomicU64 = AtomicU64::new(0);
static RESERVED_BYTES: AtomicU64 = AtomicU64::new(0);
static NEW_BUFFERS: AtomicU64 = AtomicU64::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Counts CubeCL's `launch_inner`, `reserve` and wgpu storage `alloc` spans; takes no interest
/// in anything else.
struct SpanCounter;

fn counted(metadata: &Metadata<'_>) -> bool {
    let target = metadata.target();
    (target.starts_with("cubecl_runtime") && matches!(metadata.name(), "launch_inner" | "reserve"))
        || (target.starts_with("cubecl_wgpu") && metadata.name() == "alloc")
}

/// Reads the `size` field of a `reserve` span.
struct Size(Option<u64>);

impl Visit for Size {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "size" {
            self.0 = Some(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "size" && self.0.is_none() {
            self.0 = format!("{value:?}").parse().ok();
        }
    }
}

impl tracing::Subscriber for SpanCounter {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if counted(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        counted(metadata)
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        match span.metadata().name() {
            "launch_inner" => {
                LAUNCHES.fetch_add(1, Ordering::Relaxed);
            }
            "alloc" => {
                NEW_BUFFERS.fetch_add(1, Ordering::Relaxed);
            }
            "reserve" => {
                let mut size = Size(None);
                span.record(&mut size);
                RESERVATIONS.fetch_add(1, Ordering::Relaxed);
                RESERVED_BYTES.fetch_add(size.0.unwrap_or(0), Ordering::Relaxed);
            }
            _ => {}
        }
        Id::from_u64(NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Installs the counter as the process's subscriber (once; later calls do nothing).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(SpanCounter)
            .expect("no other tracing subscriber is installed in xtask");
    });
}

fn snapshot() -> Counts {
    Counts {
        launches: LAUNCHES.load(Ordering::Relaxed),
        reservations: RESERVATIONS.load(Ordering::Relaxed),
        reserved_bytes: RESERVED_BYTES.load(Ordering::Relaxed),
        new_buffers: NEW_BUFFERS.load(Ordering::Relaxed),
    }
}

/// The counts of `call`'s second run: the first compiles kernels and fills the memory pools.
/// The device is synced around the counted run, and its output lives until after the sync: a
/// lazy backend (Fusion) drops the work of an output nobody holds.
pub fn count<B: Backend, T>(device: &B::Device, mut call: impl FnMut() -> T) -> Counts {
    install();
    let warm_up = call();
    B::sync(device).expect("the device syncs");
    drop(warm_up);
    B::sync(device).expect("the device syncs");
    let before = snapshot();
    let output = call();
    B::sync(device).expect("the device syncs");
    let after = snapshot();
    drop(output);
    Counts {
        launches: after.launches - before.launches,
        reservations: after.reservations - before.reservations,
        reserved_bytes: after.reserved_bytes - before.reserved_bytes,
        new_buffers: after.new_buffers - before.new_buffers,
    }
}

/// The forward and the training step of `SkLinear` with `strategy`, or of a dense layer.
pub fn layer_rows<B: AutodiffBackend + SketchBackend>(
    backend: &'static str,
    args: &OverheadArgs,
    device: &B::Device,
) -> Vec<Row>
where
    B::InnerBackend: SketchBackend,
{
    let (d, n) = (args.width, args.batch);
    let x = Tensor::<B, 2>::random([n, d], Distribution::Default, device);
    let mut rows = Vec::new();
    let mut push = |layer: String, call: &'static str, counts: Counts| {
        rows.push(Row {
            backend,
            layer,
            call,
            counts,
        })
    };

    let dense = LinearConfig::new(d, d).init::<B>(device);
    let inner = dense.valid();
    let xi = x.clone().inner();
    push(
        "dense".into(),
        "forward",
        count::<B, _>(device, || inner.forward(xi.clone())),
    );
    push(
        "dense".into(),
        "training step",
        count::<B, _>(device, || dense.forward(x.clone()).sum().backward()),
    );

    for strategy in [
        KernelStrategy::Kernels,
        KernelStrategy::TensorOps,
        KernelStrategy::Autotune,
    ] {
        let layer = SkLinearConfig::new(d, d, 1, args.low_rank)
            .with_strategy(strategy)
            .init::<B>(device);
        let inner = layer.valid();
        let name = format!("sketched ({strategy:?})");
        push(
            name.clone(),
            "forward",
            count::<B, _>(device, || inner.forward(xi.clone())),
        );
        push(
            name,
            "training step",
            count::<B, _>(device, || layer.forward(x.clone()).sum().backward()),
        );
    }
    rows
}

/// Every row: plain CubeCL backend and `Wgpu` with fusion.
pub fn run(args: &OverheadArgs) -> Result<Vec<Row>> {
    burn_memory::wgpu_adapter()?;
    let device = WgpuDevice::default();
    let mut rows =
        layer_rows::<Autodiff<CubeBackend<WgpuRuntime, f32, i32, u32>>>("plain", args, &device);
    rows.extend(layer_rows::<Autodiff<Wgpu>>("fusion", args, &device));
    println!(
        "Per call after warm-up, {n}×{d} input, {d}→{d} layer, T = 1, k = {k} (wgpu):\n",
        n = args.batch,
        d = args.width,
        k = args.low_rank
    );
    println!("| backend | layer | call | launches | reservations | reserved bytes | new buffers |");
    println!("|---|---|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.backend,
            row.layer,
            row.call,
            row.counts.launches,
            row.counts.reservations,
            row.counts.reserved_bytes,
            row.counts.new_buffers
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts of the 1024² point on `Wgpu` with fusion. In a process of its own: the
    /// counters are process-wide, and other tests' launches would land in them.
    #[test]
    fn launches_and_pool_misses_per_call_on_wgpu() {
        crate::own_process::in_own_process(
            "overhead::tests::launches_and_pool_misses_per_call_on_wgpu",
            counts_on_wgpu,
        );
    }

    fn counts_on_wgpu() {
        burn_memory::wgpu_adapter().expect("a wgpu adapter (Mesa's lavapipe in CI)");
        let args = OverheadArgs {
            width: 1024,
            batch: 256,
            low_rank: 16,
            json: None,
        };
        let rows = layer_rows::<Autodiff<Wgpu>>("fusion", &args, &WgpuDevice::default());
        let counts = |layer: &str, call: &str| {
            rows.iter()
                .find(|row| row.layer == layer && row.call == call)
                .unwrap_or_else(|| panic!("no row {layer} {call}"))
                .counts
        };
        // The counter sees known work exactly: a dense forward is a matmul and a bias add, and
        // the warm-ups made device buffers (so the `alloc` span is seen, and the zeros below
        // are pool hits, not blindness).
        assert_eq!(counts("dense", "forward").launches, 2);
        assert!(NEW_BUFFERS.load(Ordering::Relaxed) > 0);
        for row in &rows {
            assert_eq!(
                row.counts.new_buffers, 0,
                "{row:?} made new buffers after warm-up"
            );
            assert!(row.counts.launches > 0, "{row:?} launched nothing");
        }
        // The kernels' counts when this test was written (2026-11-25): a regression fails
        // here; issue 29's targets (≤ 2 and ≤ 6) are lower.
        assert!(counts("sketched (Kernels)", "forward").launches <= 3);
        assert!(counts("sketched (Kernels)", "training step").launches <= 15);
    }
}
