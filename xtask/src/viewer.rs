//! `cargo xtask profile-viewer`: writes burn-profiler's profile viewer for a real and a synthetic
//! profile, loads each page in headless Chromium and checks what it drew.
//!
//! - `mlp`: one training step of an MLP (784 → 256 → 128 → 10, batch 64, cross-entropy, Adam)
//!   on `Autodiff<Profiled<NdArray>>`, recorded with shapes and memory after each operation,
//!   in scopes `forward`, `loss`, `backward`, `optimizer`. Its allocation events are whatever
//!   the profiler records (the page falls back to the per-operation counters without them).
//! - `synthetic`: a `Profile` built directly, `--events` heap allocations (each freed) over a
//!   quarter as many operations, shaped like a training step: activations kept from the
//!   forward pass to the backward, gradients kept to the optimizer, temporaries freed by the
//!   end of their operation.
//!
//! For each, the page's status element (`--dump-dom` after the scripts ran) must say it is
//! ready, has drawn the timeline (coloured pixels on its canvas), lists every row of
//! `key_averages` and every block, and, for `synthetic`, rendered in under `--max-render-ms`
//! (from the navigation's start to the drawing done, so reading and parsing the page count).
//! The screenshots are `OUT/screenshot.png` (synthetic) and `OUT/screenshot-mlp.png`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Int, Tensor};
use burn_memory::MemoryUsage;
use burn_profiler::{
    AllocAction, AllocEvent, OpEvent, Profile, Profiled, Profiler, ProfilerConfig, scope,
};
use serde_json::Value;

/// Options of `cargo xtask profile-viewer`.
#[derive(Debug, clap::Args)]
pub struct ViewerArgs {
    /// Heap allocations in the synthetic profile.
    #[arg(long, default_value_t = 100_000)]
    pub events: usize,
    /// Where the pages and screenshots go.
    #[arg(long, default_value = "target/profile-viewer")]
    pub out: PathBuf,
    /// The longest the synthetic page may take to render, milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub max_render_ms: u64,
}

/// One line of the report.
struct Check {
    case: &'static str,
    what: &'static str,
    expected: String,
    got: String,
    ok: bool,
}

/// Runs the checks, prints them and fails when one fails.
pub fn run(args: &ViewerArgs) -> Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let browser = Browser::find()?;
    let mut checks = Vec::new();

    let mlp = mlp_profile().context("profiling the MLP step")?;
    check_page(
        &browser,
        "mlp",
        &mlp,
        &args.out.join("mlp.html"),
        &args.out.join("screenshot-mlp.png"),
        None,
        &mut checks,
    )?;
    let started = Instant::now();
    let synthetic = synthetic_profile(args.events);
    eprintln!(
        "synthetic profile: {} allocation events, {} operations, built in {:.2?}",
        synthetic.allocations.len(),
        synthetic.ops.len(),
        started.elapsed()
    );
    check_page(
        &browser,
        "synthetic",
        &synthetic,
        &args.out.join("synthetic.html"),
        &args.out.join("screenshot.png"),
        Some(args.max_render_ms),
        &mut checks,
    )?;

    print_checks(&checks);
    let failed = checks.iter().filter(|check| !check.ok).count();
    if failed > 0 {
        bail!("{failed} of {} checks failed", checks.len());
    }
    eprintln!(
        "all {} checks passed; pages and screenshots in {}",
        checks.len(),
        args.out.display()
    );
    Ok(())
}

fn check_page(
    browser: &Browser,
    case: &'static str,
    profile: &Profile,
    page: &Path,
    screenshot: &Path,
    max_render_ms: Option<u64>,
    checks: &mut Vec<Check>,
) -> Result<()> {
    let started = Instant::now();
    profile
        .write_viewer(page)
        .with_context(|| format!("writing {}", page.display()))?;
    let bytes = std::fs::metadata(page)?.len();
    eprintln!(
        "{case}: wrote {} ({:.1} MB) in {:.2?}",
        page.display(),
        crate::stats::mb(bytes),
        started.elapsed()
    );
    let started = Instant::now();
    let status = browser.status(page)?;
    let browser_time = started.elapsed();
    eprintln!("{case}: the browser ran for {browser_time:.2?}; status {status}");

    let mut add = |what, expected: String, got: String, ok| {
        checks.push(Check {
            case,
            what,
            expected,
            got,
            ok,
        })
    };
    let number = |key: &str| status[key].as_u64().unwrap_or(0);
    add(
        "page ready, no script error",
        "true".into(),
        format!("{} {}", status["ready"], status["error"]),
        status["ready"] == true && status["error"].is_null(),
    );
    let rows = profile.key_averages().rows.len() as u64;
    add(
        "table rows (key_averages)",
        rows.to_string(),
        number("rows").to_string(),
        number("rows") == rows,
    );
    add(
        "operations read",
        profile.ops.len().to_string(),
        number("ops").to_string(),
        number("ops") == profile.ops.len() as u64,
    );
    let blocks = block_count(profile) as u64;
    add(
        "heap blocks read",
        blocks.to_string(),
        number("blocks").to_string(),
        number("blocks") == blocks,
    );
    let mode = if blocks > 0 { "blocks" } else { "counters" };
    add(
        "timeline drawn as",
        mode.into(),
        status["mode"].as_str().unwrap_or("").into(),
        status["mode"] == mode,
    );
    add(
        "coloured pixels on the timeline",
        "> 5000".into(),
        number("drawnPixels").to_string(),
        number("drawnPixels") > 5_000,
    );
    let sampled = profile.ops.iter().any(|op| op.memory.is_some());
    add(
        "peak marked",
        if sampled || blocks > 0 {
            "> 0 B"
        } else {
            "none"
        }
        .into(),
        format!("{} B", number("peakBytes")),
        (number("peakBytes") > 0) == (sampled || blocks > 0),
    );
    let render_ms = number("renderMs");
    add(
        "render time (navigation to drawn)",
        max_render_ms.map_or("-".into(), |limit| format!("< {limit} ms")),
        format!(
            "{render_ms} ms (script {} ms, drawing {} ms)",
            number("scriptMs"),
            number("drawMs")
        ),
        max_render_ms.is_none_or(|limit| render_ms < limit),
    );
    browser.screenshot(page, screenshot)?;
    add(
        "screenshot",
        "a PNG".into(),
        screenshot.display().to_string(),
        screenshot.is_file(),
    );
    Ok(())
}

fn print_checks(checks: &[Check]) {
    let width = |f: fn(&Check) -> usize, title: &str| {
        checks
            .iter()
            .map(f)
            .max()
            .unwrap_or(0)
            .max(title.chars().count())
    };
    let case = width(|c| c.case.len(), "case");
    let what = width(|c| c.what.chars().count(), "check");
    let expected = width(|c| c.expected.chars().count(), "expected");
    let got = width(|c| c.got.chars().count(), "got");
    println!(
        "{:<case$}  {:<what$}  {:<expected$}  {:<got$}  ok",
        "case", "check", "expected", "got"
    );
    println!("{}", "-".repeat(case + what + expected + got + 10));
    for check in checks {
        println!(
            "{:<case$}  {:<what$}  {:<expected$}  {:<got$}  {}",
            check.case,
            check.what,
            check.expected,
            check.got,
            if check.ok { "yes" } else { "NO" }
        );
    }
}

/// The blocks the page pairs from the allocation events: one per allocation, plus one per
/// free of a block allocated before the profile.
fn block_count(profile: &Profile) -> usize {
    let mut live: HashSet<u64> = HashSet::new();
    let mut blocks = 0;
    for event in &profile.allocations {
        match event.action {
            AllocAction::Alloc => {
                live.insert(event.address);
                blocks += 1;
            }
            AllocAction::Free => {
                if !live.remove(&event.address) {
                    blocks += 1;
                }
            }
        }
    }
    blocks
}

/// Headless Chromium, found on the path.
struct Browser {
    program: &'static str,
}

impl Browser {
    const HEADLESS: [&'static str; 4] = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
    ];

    fn find() -> Result<Self> {
        let program = ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .find(|name| Command::new(name).arg("--version").output().is_ok())
            .context("no Chromium found: on Debian, `apt-get install chromium`")?;
        Ok(Self { program })
    }

    fn url(page: &Path) -> Result<String> {
        let page = page
            .canonicalize()
            .with_context(|| format!("no page at {}", page.display()))?;
        Ok(format!("file://{}", page.display()))
    }

    /// The page's status element after its scripts ran.
    fn status(&self, page: &Path) -> Result<Value> {
        let output = Command::new(self.program)
            .args(Self::HEADLESS)
            .args(["--window-size=1280,1100", "--virtual-time-budget=20000"])
            .arg("--dump-dom")
            .arg(Self::url(page)?)
            .output()
            .context("could not run the browser")?;
        let dom = String::from_utf8_lossy(&output.stdout);
        let open = r#"<script type="application/json" id="viewer-status">"#;
        let Some(start) = dom.find(open).map(|at| at + open.len()) else {
            bail!(
                "the browser's DOM has no status element ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let end = start + dom[start..].find("</script>").context("unclosed status")?;
        serde_json::from_str(&dom[start..end]).context("the status is not JSON")
    }

    fn screenshot(&self, page: &Path, png: &Path) -> Result<()> {
        let _ = std::fs::remove_file(png);
        let png_arg = format!(
            "--screenshot={}",
            std::path::absolute(png)
                .unwrap_or_else(|_| png.to_path_buf())
                .display()
        );
        let status = Command::new(self.program)
            .args(Self::HEADLESS)
            .args([
                png_arg.as_str(),
                "--window-size=1280,1100",
                "--virtual-time-budget=20000",
            ])
            .arg(Self::url(page)?)
            .output()
            .context("could not run the browser")?
            .status;
        if !status.success() || !png.is_file() {
            bail!(
                "the browser made no screenshot of {} ({status})",
                page.display()
            );
        }
        Ok(())
    }
}

// ---- the real profile -------------------------------------------------------------------------

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    layers: Vec<Linear<B>>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        let widths = [784, 256, 128, 10];
        Self {
            layers: widths
                .windows(2)
                .map(|pair| LinearConfig::new(pair[0], pair[1]).init(device))
                .collect(),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        let last = self.layers.len() - 1;
        for (index, layer) in self.layers.iter().enumerate() {
            let _layer = scope(&format!("layer{index}"));
            x = layer.forward(x);
            if index < last {
                x = relu(x);
            }
        }
        x
    }
}

/// One profiled training step of the MLP (after one unprofiled, so Adam has its state).
fn mlp_profile() -> Result<Profile> {
    type B = Autodiff<Profiled<NdArray>>;
    let device = Default::default();
    let mut model = Mlp::<B>::new(&device);
    let mut optimizer = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);
    let mut step = |model: Mlp<B>| {
        let x = Tensor::<B, 2>::random([64, 784], Distribution::Default, &device);
        let labels = Tensor::<B, 1, Int>::random([64], Distribution::Uniform(0.0, 10.0), &device);
        let logits = {
            let _forward = scope("forward");
            model.forward(x)
        };
        let loss = {
            let _loss = scope("loss");
            loss_fn.forward(logits, labels)
        };
        let grads = {
            let _backward = scope("backward");
            GradientsParams::from_grads(loss.backward(), &model)
        };
        let _optimizer = scope("optimizer");
        optimizer.step(1e-3, model, grads)
    };
    model = step(model);
    let profiler = Profiler::start_with_memory::<NdArray>(
        ProfilerConfig::new().with_record_shapes(true),
        &device,
    )?;
    model = step(model);
    let profile = profiler.stop();
    drop(model);
    eprintln!(
        "mlp: {} operations, {} scopes, {} allocation events recorded",
        profile.ops.len(),
        profile.scopes.len(),
        profile.allocations.len()
    );
    Ok(profile)
}

// ---- the synthetic profile --------------------------------------------------------------------

/// A small deterministic generator (xorshift), so the synthetic profile is the same each run.
struct Rng(rand_xoshiro::SplitMix64);

impl Rng {
    /// Uniform in `low..high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        use rand_xoshiro::rand_core::Rng as _;
        low + self.0.next_u64() % (high - low).max(1)
    }
}

/// `allocations` heap allocations, each freed, over a quarter as many operations shaped like a
/// training step of an 8-layer network: one forward operation in 8 keeps an activation until
/// the backward pass reaches it, one backward operation in 8 keeps a gradient until the
/// optimizer, every other block is a temporary freed by the end of its operation.
fn synthetic_profile(allocations: usize) -> Profile {
    const LAYERS: usize = 8;
    // One operation in this many keeps its output (an activation, or a gradient).
    const KEEP_EVERY: usize = 8;
    let per_op = 4;
    let op_count = allocations.div_ceil(per_op).max(3);
    let forward_ops = op_count * 2 / 5;
    let backward_ops = forward_ops;
    let mut scope_names = vec!["forward".to_owned(), "backward".into(), "optimizer".into()];
    scope_names.extend((0..LAYERS).map(|layer| format!("layer{layer}")));
    let layer_scope = |layer: usize| (3 + layer) as u32;

    let mut rng = Rng(rand_xoshiro::rand_core::SeedableRng::seed_from_u64(1));
    let mut ops = Vec::with_capacity(op_count);
    let mut events: Vec<AllocEvent> = Vec::with_capacity(2 * allocations);
    let mut activations: Vec<(u64, u64)> = Vec::new(); // (address, size), forward's kept blocks
    let mut gradients: Vec<(u64, u64)> = Vec::new();
    let mut next_address = 0x1000_u64;
    let mut in_use = 0_u64;
    let mut reserved = 0_u64;
    let mut made = 0;
    let mut time = 0_u64;
    for index in 0..op_count {
        let (phase, layer, names): (u32, Option<usize>, &[&'static str]) = if index < forward_ops {
            let layer = index * LAYERS / forward_ops.max(1);
            (
                0,
                Some(layer),
                &["float_matmul", "float_add", "relu", "float_mul"],
            )
        } else if index < forward_ops + backward_ops {
            let back = index - forward_ops;
            let layer = LAYERS - 1 - back * LAYERS / backward_ops.max(1);
            (
                1,
                Some(layer),
                &["float_matmul", "float_transpose", "float_mul", "float_sum"],
            )
        } else {
            (
                2,
                None,
                &["float_mul_scalar", "float_add", "float_sqrt", "float_div"],
            )
        };
        let name = names[index % names.len()];
        let scopes: Vec<u32> = std::iter::once(phase)
            .chain(layer.map(layer_scope))
            .collect();
        let scope = scopes.last().copied();
        let duration = rng.range(2_000, 30_000);
        let start = time;
        let end = start + duration;
        let mut push = |action, address, size, at: u64, in_use: u64| {
            events.push(AllocEvent {
                action,
                address,
                size,
                time_ns: at,
                thread: 1,
                op: Some(name),
                scope,
                in_use,
            })
        };
        let count = per_op.min(allocations - made);
        let mut temporaries = Vec::new();
        for slot in 0..count {
            let address = next_address;
            next_address += 0x100;
            let at = start + duration * slot as u64 / (count as u64 + 1);
            let kept = slot == 0 && phase < 2 && index % KEEP_EVERY == 0;
            let size = if kept {
                rng.range(256 << 10, 2 << 20)
            } else {
                rng.range(64, 96 << 10)
            };
            in_use += size;
            push(AllocAction::Alloc, address, size, at, in_use);
            if kept && phase == 0 {
                activations.push((address, size));
            } else if kept {
                gradients.push((address, size));
            } else {
                temporaries.push((address, size));
            }
        }
        made += count;
        // The backward pass frees the activation it has used; the optimizer the gradients.
        let mut freed = temporaries;
        if phase == 1 && index % KEEP_EVERY == 0 {
            freed.extend(activations.pop());
        }
        if phase == 2 {
            let share = gradients.len().div_ceil(op_count - index);
            for _ in 0..share {
                freed.extend(gradients.pop());
            }
        }
        if index + 1 == op_count {
            freed.append(&mut activations);
            freed.append(&mut gradients);
        }
        for (address, size) in freed {
            in_use -= size;
            push(AllocAction::Free, address, size, end - 1, in_use);
        }
        reserved = reserved.max(in_use.div_ceil(2 << 20) * (2 << 20));
        ops.push(OpEvent {
            name,
            thread: 1,
            start_ns: start,
            host_ns: duration,
            device_ns: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
            scopes,
            memory: Some(MemoryUsage { in_use, reserved }),
        });
        time = end + rng.range(200, 2_000);
    }
    events.sort_by_key(|event| event.time_ns);
    Profile {
        ops,
        scopes: Vec::new(),
        scope_names,
        allocations: events,
        dropped: 0,
    }
}
