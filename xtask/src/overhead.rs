//! `cargo xtask overhead`: what one call of `SkLinear` costs a CubeCL device besides its
//! arithmetic, counted rather than timed: kernel launches, buffer reservations from the memory
//! pools with their bytes, new device buffers (pool misses), host reads, waits for the device
//! and queue submissions, per forward and per training step, against dense `nn::Linear`.
//!
//! The counts come from the libraries' own instrumentation, nothing is guessed:
//! - CubeCL, with its `tracing` feature (on through burn-fusion's defaults): every launch goes
//!   through `ComputeClient::launch_inner`, every buffer reservation through the memory
//!   manager's `reserve`, and every new wgpu buffer through the storage's `alloc`, each a
//!   `trace` span. A process-wide `tracing` subscriber counts those spans.
//! - wgpu-core's API log (`log` records at trace level): `Buffer::map_async` is a host read,
//!   `Device::poll` with a wait is the host waiting for the device (a sync), `Queue::submit`
//!   a submission. A `log` logger counts those records.
//!
//! Nothing else is recorded. Counts taken on wgpu over lavapipe hold on a GPU (the same CubeCL
//! code runs; CUDA's reads and syncs are the same calls of CubeCL's client); times would not,
//! so none are shown.

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
    /// Buffers mapped for reading by the host.
    pub host_reads: u64,
    /// Times the host waited for the device.
    pub waits: u64,
    /// Command buffers submitted to the device's queue.
    pub submissions: u64,
}

impl Counts {
    fn minus(self, other: Self) -> Self {
        Self {
            launches: self.launches - other.launches,
            reservations: self.reservations - other.reservations,
            reserved_bytes: self.reserved_bytes - other.reserved_bytes,
            new_buffers: self.new_buffers - other.new_buffers,
            host_reads: self.host_reads.saturating_sub(other.host_reads),
            waits: self.waits.saturating_sub(other.waits),
            submissions: self.submissions.saturating_sub(other.submissions),
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `plain` (the CubeCL backend) or `fusion` (`Wgpu` with Burn's fusion).
    pub backend: &'static str,
    /// `dense`, or the sketched layer's kernel strategy.
    pub layer: String,
    /// `forward`, `training step` (forward, `sum` as the loss, backward: gradients of every
    /// parameter), or `training step, ∂x too` (the input tracked as well, as for a layer
    /// after the first).
    pub call: &'static str,
    /// The counts of one call.
    pub counts: Counts,
}

static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static RESERVATIONS: AtomicU64 = AtomicU64::new(0);
static RESERVED_BYTES: AtomicU64 = AtomicU64::new(0);
static NEW_BUFFERS: AtomicU64 = AtomicU64::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static HOST_READS: AtomicU64 = AtomicU64::new(0);
static WAITS: AtomicU64 = AtomicU64::new(0);
static SUBMISSIONS: AtomicU64 = AtomicU64::new(0);

/// Counts wgpu-core's API log records of host reads, waits and submissions; takes no
/// interest in any other record.
struct WgpuApiLog;

impl log::Log for WgpuApiLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.target().starts_with("wgpu_core")
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let message = record.args().to_string();
        if message.starts_with("Buffer::map_async") {
            HOST_READS.fetch_add(1, Ordering::Relaxed);
        } else if message.starts_with("Device::poll Wait") {
            WAITS.fetch_add(1, Ordering::Relaxed);
        } else if message == "Queue::submit" {
            SUBMISSIONS.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn flush(&self) {}
}

static WGPU_API_LOG: WgpuApiLog = WgpuApiLog;

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

/// Installs the counters as the process's `tracing` subscriber and `log` logger (once; later
/// calls do nothing).
pub fn install() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::subscriber::set_global_default(SpanCounter)
            .expect("no other tracing subscriber is installed in xtask");
        log::set_logger(&WGPU_API_LOG).expect("no other logger is installed in xtask");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

fn snapshot() -> Counts {
    Counts {
        launches: LAUNCHES.load(Ordering::Relaxed),
        reservations: RESERVATIONS.load(Ordering::Relaxed),
        reserved_bytes: RESERVED_BYTES.load(Ordering::Relaxed),
        new_buffers: NEW_BUFFERS.load(Ordering::Relaxed),
        host_reads: HOST_READS.load(Ordering::Relaxed),
        waits: WAITS.load(Ordering::Relaxed),
        submissions: SUBMISSIONS.load(Ordering::Relaxed),
    }
}

/// The counts of `call`'s second run: the first compiles kernels and fills the memory pools.
/// The device is synced around the counted run, and its output lives until after the sync: a
/// lazy backend (Fusion) drops the work of an output nobody holds. What the closing sync
/// itself costs (its wait, measured on an empty call) is subtracted: it is the measurement's,
/// not the call's. The queue submission of the call's work is the call's, and stays.
pub fn count<B: Backend, T>(device: &B::Device, call: impl FnMut() -> T) -> Counts {
    let sync_only = raw_count::<B, _>(device, || ());
    raw_count::<B, _>(device, call).minus(Counts {
        submissions: 0,
        ..sync_only
    })
}

fn raw_count<B: Backend, T>(device: &B::Device, mut call: impl FnMut() -> T) -> Counts {
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
    after.minus(before)
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
    let tracked = x.clone().require_grad();
    push(
        "dense".into(),
        "training step, ∂x too",
        count::<B, _>(device, || dense.forward(tracked.clone()).sum().backward()),
    );
    // The loss's share of every training step: `sum` and the seeding of its gradient.
    let output = Tensor::<B, 2>::random([n, d], Distribution::Default, device).require_grad();
    push(
        "loss alone".into(),
        "training step",
        count::<B, _>(device, || output.clone().sum().backward()),
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
            name.clone(),
            "training step",
            count::<B, _>(device, || layer.forward(x.clone()).sum().backward()),
        );
        push(
            name,
            "training step, ∂x too",
            count::<B, _>(device, || layer.forward(tracked.clone()).sum().backward()),
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
    println!(
        "| backend | layer | call | launches | reservations | reserved bytes | new buffers | host reads | waits | submissions |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        let c = row.counts;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.backend,
            row.layer,
            row.call,
            c.launches,
            c.reservations,
            c.reserved_bytes,
            c.new_buffers,
            c.host_reads,
            c.waits,
            c.submissions
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
    fn per_call_counts_on_wgpu_meet_the_targets() {
        crate::own_process::in_own_process(
            "overhead::tests::per_call_counts_on_wgpu_meet_the_targets",
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
        // The counters see known work exactly: a dense forward is a matmul and a bias add;
        // the warm-ups made device buffers and every measurement waited for the device (so
        // the `alloc` span and the wait record are seen, and the zeros below are not
        // blindness); one read of a tensor is one host read.
        assert_eq!(counts("dense", "forward").launches, 2);
        assert!(NEW_BUFFERS.load(Ordering::Relaxed) > 0);
        assert!(WAITS.load(Ordering::Relaxed) > 0);
        let device = WgpuDevice::default();
        let read = count::<Autodiff<Wgpu>, _>(&device, || {
            Tensor::<Autodiff<Wgpu>, 1>::ones([4], &device).into_data()
        });
        assert_eq!(read.host_reads, 1, "{read:?}");
        for row in &rows {
            assert_eq!(
                row.counts.new_buffers, 0,
                "{row:?} made new buffers after warm-up"
            );
            assert!(row.counts.launches > 0, "{row:?} launched nothing");
            assert_eq!(row.counts.host_reads, 0, "{row:?} read from the device");
            assert_eq!(row.counts.waits, 0, "{row:?} waited for the device");
        }
        // Issue 29's targets: at most 2 launches per forward and 6 per training step, the
        // layer's own (bias gradient included; the loss's launches are not the layer's).
        let loss = counts("loss alone", "training step").launches;
        assert_eq!(counts("sketched (Kernels)", "forward").launches, 2);
        for call in ["training step", "training step, ∂x too"] {
            let step = counts("sketched (Kernels)", call).launches;
            assert!(
                step - loss <= 6,
                "{call}: {step} launches, {loss} of them the loss's"
            );
        }
    }
}
