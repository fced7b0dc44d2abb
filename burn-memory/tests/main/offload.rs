//! Tiered offloading: outputs equal the resident model's on every tier, and the faults the
//! issue lists (unusable cache directory, full disk, damaged files, threads, cleanup). On Flex;
//! `wgpu.rs` runs the shared checks on the GPU path.

use std::fs;
use std::path::{Path, PathBuf};

use burn::backend::Flex;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use burn_memory::offload::{OffloadConfig, OffloadManager, OffloadSelection, OffloadedModel};
use burn_memory::{DeviceMemory, Layers, MemoryError, MemoryTracker};

/// A stack of linear layers with ReLU between them.
#[derive(Module, Debug)]
pub struct Stack<B: Backend> {
    layers: Vec<Linear<B>>,
}

impl<B: Backend> Stack<B> {
    pub fn new(widths: &[usize], device: &B::Device) -> Self {
        let layers = widths
            .windows(2)
            .map(|w| LinearConfig::new(w[0], w[1]).init(device))
            .collect();
        let stack = Self { layers };
        // Draw the lazy parameters once, so that clones share values.
        burn_memory::draw_params(&stack);
        stack
    }

    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        (0..self.layers.len()).fold(x, |x, i| self.forward_layer(i, x))
    }
}

impl<B: Backend> Layers<B> for Stack<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_layer(&self, index: usize, input: Tensor<B, 2>) -> Tensor<B, 2> {
        let y = self.layers[index].forward(input);
        if index + 1 < self.layers.len() {
            relu(y)
        } else {
            y
        }
    }
}

const WIDTHS: [usize; 6] = [48, 96, 80, 96, 64, 16];

fn input<B: Backend>(seed: u64, device: &B::Device) -> Tensor<B, 2> {
    B::seed(device, seed);
    Tensor::random([12, WIDTHS[0]], Distribution::Normal(0.0, 1.0), device)
}

/// The resident stack, an input drawn with `seed` and the stack's output on it.
fn fixture(
    seed: u64,
    device: &burn::tensor::Device<Flex>,
) -> (Stack<Flex>, Tensor<Flex, 2>, burn::tensor::TensorData) {
    let resident = Stack::<Flex>::new(&WIDTHS, device);
    let x = input::<Flex>(seed, device);
    let expected = resident.forward(x.clone()).into_data();
    (resident, x, expected)
}

/// Every module parameter's bytes: (48·96 + 96·80 + 80·96 + 96·64 + 64·16)·4.
fn weight_bytes() -> u64 {
    WIDTHS.windows(2).map(|w| (w[0] * w[1] * 4) as u64).sum()
}

/// A device budget below two modules: the device cache keeps nothing, so every pass loads
/// from the tiers.
fn config(dir: &Path) -> OffloadConfig {
    OffloadConfig::new()
        .with_device_budget_bytes(Some(64 * 1024))
        .with_cache_dir(Some(dir.to_path_buf()))
        .with_check_interval_ms(5)
}

/// The tiers the example compares, as configurations.
fn tier_configs(dir: &Path) -> Vec<(&'static str, OffloadConfig)> {
    let host = config(dir).with_disk_tier(false);
    let disk = config(dir)
        .with_host_tier(false)
        .with_compress_disk_cache(false);
    vec![
        ("host", host.clone().with_prefetch(false)),
        ("host+prefetch", host.clone()),
        ("host, not eager", host.with_eager_offload(false)),
        ("disk", disk.clone().with_prefetch(false)),
        ("disk+prefetch", disk.clone()),
        (
            "disk+prefetch+compressed",
            disk.with_compress_disk_cache(true),
        ),
    ]
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir).map_or_else(
        |_| Vec::new(),
        |entries| entries.map(|e| e.unwrap().path()).collect(),
    )
}

/// Outputs of every tier equal the resident model's, bit for bit, through `run` (the model's
/// own forward) and `forward_layers`, over several passes (the prefetcher needs one to learn
/// the order); the counters show where the parameters came from.
pub fn every_tier_matches_the_resident_model<B: DeviceMemory>(device: &B::Device) {
    let resident = Stack::<B>::new(&WIDTHS, device);
    let inputs: Vec<Tensor<B, 2>> = (0..3).map(|seed| input(seed, device)).collect();
    let expected: Vec<_> = inputs
        .iter()
        .map(|x| resident.forward(x.clone()).into_data())
        .collect();
    let root = tempfile::tempdir().unwrap();
    for (name, config) in tier_configs(root.path()) {
        let dir = root.path().join(name.replace(['+', ',', ' '], "_"));
        let config = config.with_cache_dir(Some(dir.clone()));
        let prefetch = config.prefetch;
        let to_disk = !config.host_tier;
        let manager = OffloadManager::<B>::new(config, device).unwrap();
        let model = manager
            .wrap(resident.clone(), &OffloadSelection::default())
            .unwrap();
        assert_eq!(model.module_count(), WIDTHS.len() - 1, "{name}");
        for pass in 0..3 {
            for (x, expected) in inputs.iter().zip(&expected) {
                let y = model.forward_layers(x.clone()).unwrap();
                assert_eq!(
                    y.into_data(),
                    *expected,
                    "{name}, pass {pass}, layer by layer"
                );
                let y = model.run(|m| m.forward(x.clone())).unwrap();
                assert_eq!(
                    y.into_data(),
                    *expected,
                    "{name}, pass {pass}, whole forward"
                );
            }
        }
        let summary = manager.summary();
        assert_eq!(summary.managed_modules, WIDTHS.len() - 1, "{name}");
        assert_eq!(summary.managed_bytes, weight_bytes(), "{name}");
        let c = summary.counters;
        if to_disk {
            assert_eq!(summary.modules_on_disk, WIDTHS.len() - 1, "{name}");
            assert_eq!(
                files_in(&dir).len(),
                WIDTHS.len() - 1,
                "{name}: one file per module"
            );
            assert!(
                c.loads_from_disk > 0 && c.loads_from_host == 0,
                "{name}: {summary}"
            );
        } else {
            assert_eq!(summary.modules_on_host, WIDTHS.len() - 1, "{name}");
            assert!(
                c.loads_from_host + c.cache_hits > 0 && c.loads_from_disk == 0,
                "{name}"
            );
        }
        assert_eq!(
            c.cache_hits, 0,
            "{name}: the budget leaves no room to cache"
        );
        if prefetch {
            assert!(
                c.prefetch_hits > 0,
                "{name}: the learned order was never used: {summary}"
            );
        } else {
            assert_eq!(c.prefetches, 0, "{name}");
        }
        println!("{name}:\n{summary}");
        manager.cleanup();
        assert!(
            files_in(&dir).is_empty(),
            "{name}: cleanup left {:?}",
            files_in(&dir)
        );
        assert!(
            !dir.exists(),
            "{name}: the directory the manager created is removed"
        );
    }
}

#[test]
fn every_tier_matches_the_resident_model_on_flex() {
    every_tier_matches_the_resident_model::<Flex>(&Default::default());
}

/// NdArray copies shared bytes into its own arrays, where Flex takes them as they are.
#[test]
fn every_tier_matches_the_resident_model_on_ndarray() {
    every_tier_matches_the_resident_model::<burn::backend::NdArray>(&Default::default());
}

#[test]
fn a_cache_directory_that_cannot_be_created_or_written_fails_the_wrap_and_returns_the_model() {
    let device = Default::default();
    let (resident, x, expected) = fixture(1, &device);
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("a-file");
    fs::write(&file, b"not a directory").unwrap();
    let mut cases = vec![file.join("cache")];
    // A directory no one may create files in, root included.
    if cfg!(target_os = "linux") {
        cases.push(PathBuf::from("/proc"));
    }
    for dir in cases {
        let config = config(&dir).with_host_tier(false);
        let manager = OffloadManager::<Flex>::new(config, &device).unwrap();
        let error = manager
            .wrap(resident.clone(), &OffloadSelection::default())
            .unwrap_err();
        assert!(
            matches!(error.error, MemoryError::Io { .. }),
            "{}",
            error.error
        );
        assert_eq!(error.model.forward(x.clone()).into_data(), expected);
        assert_eq!(manager.summary().managed_modules, 0);
    }
}

#[test]
fn a_full_disk_cache_keeps_modules_on_the_host_or_fails_the_wrap() {
    let device = Default::default();
    let (resident, x, expected) = fixture(2, &device);
    let root = tempfile::tempdir().unwrap();
    let largest = (96 * 80 * 4) as u64;

    // A host budget the modules overflow at once: they go to disk until it is full.
    let spill = config(&root.path().join("spill"))
        .with_host_budget_bytes(Some(1024))
        .with_compress_disk_cache(false)
        .with_max_disk_bytes(largest + 4096);
    let manager = OffloadManager::<Flex>::new(spill, &device).unwrap();
    let model = manager
        .wrap(resident.clone(), &OffloadSelection::default())
        .unwrap();
    let summary = manager.summary();
    // 18 + 31 KB do not fit 35 KB: some modules stay on the host, none is lost.
    assert!(summary.modules_on_disk >= 1, "{summary}");
    assert!(summary.modules_on_host >= 1, "{summary}");
    assert_eq!(
        summary.modules_on_disk + summary.modules_on_host,
        WIDTHS.len() - 1
    );
    assert!(summary.disk.bytes <= largest + 4096);
    assert_eq!(
        summary.counters.disk_full, summary.modules_on_host as u64,
        "{summary}"
    );
    for _ in 0..2 {
        let y = model.forward_layers(x.clone()).unwrap();
        assert_eq!(y.into_data(), expected, "no parameter lost");
    }

    // The host tier off: nowhere to go, a typed error and the model back.
    let full = config(&root.path().join("full"))
        .with_host_tier(false)
        .with_max_disk_bytes(largest + 4096);
    let manager = OffloadManager::<Flex>::new(full, &device).unwrap();
    let error = manager
        .wrap(resident.clone(), &OffloadSelection::default())
        .unwrap_err();
    assert!(
        matches!(error.error, MemoryError::OffloadDiskFull { .. }),
        "{}",
        error.error
    );
    assert_eq!(error.model.forward(x).into_data(), expected);
    assert!(
        files_in(&root.path().join("full")).is_empty(),
        "the failed wrap's files are removed"
    );
}

/// Damages one cache file after a first good pass, and checks that every call then fails with
/// an `OffloadCache` error, with or without the prefetcher reading the file first.
#[test]
fn damaged_or_deleted_cache_files_are_errors_never_outputs() {
    let device = Default::default();
    let (resident, x, expected) = fixture(3, &device);
    let root = tempfile::tempdir().unwrap();
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 3] = [
        ("corrupted", |path| {
            let mut bytes = fs::read(path).unwrap();
            let at = bytes.len() - 7;
            bytes[at] ^= 0x10;
            fs::write(path, bytes).unwrap();
        }),
        ("truncated", |path| {
            let bytes = fs::read(path).unwrap();
            fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
        }),
        ("deleted", |path| fs::remove_file(path).unwrap()),
    ];
    for (damage, apply) in damages {
        for prefetch in [false, true] {
            for compress in [false, true] {
                let case = format!("{damage}, prefetch {prefetch}, compressed {compress}");
                let dir = root.path().join(case.replace([',', ' '], "_"));
                let config = config(&dir)
                    .with_host_tier(false)
                    .with_prefetch(prefetch)
                    .with_compress_disk_cache(compress);
                let manager = OffloadManager::<Flex>::new(config, &device).unwrap();
                let model = manager
                    .wrap(resident.clone(), &OffloadSelection::default())
                    .unwrap();
                assert_eq!(
                    model.forward_layers(x.clone()).unwrap().into_data(),
                    expected
                );
                let mut files = files_in(&dir);
                files.sort();
                apply(&files[2]);
                for _ in 0..2 {
                    let error = model.forward_layers(x.clone()).unwrap_err();
                    assert!(
                        matches!(error, MemoryError::OffloadCache { .. }),
                        "{case}: {error}"
                    );
                    let error = model.run(|m| m.forward(x.clone())).unwrap_err();
                    assert!(
                        matches!(error, MemoryError::OffloadCache { .. }),
                        "{case}: {error}"
                    );
                }
            }
        }
    }
}

#[test]
fn two_threads_at_once_get_the_outputs_of_one() {
    let device = Default::default();
    let resident = Stack::<Flex>::new(&WIDTHS, &device);
    let inputs: Vec<_> = (10..14).map(|seed| input::<Flex>(seed, &device)).collect();
    let expected: Vec<_> = inputs
        .iter()
        .map(|x| resident.forward(x.clone()).into_data())
        .collect();
    let root = tempfile::tempdir().unwrap();
    for (name, config) in tier_configs(root.path()) {
        let config =
            config.with_cache_dir(Some(root.path().join(name.replace(['+', ',', ' '], "_"))));
        let manager = OffloadManager::<Flex>::new(config, &device).unwrap();
        let model: OffloadedModel<Flex, Stack<Flex>> = manager
            .wrap(resident.clone(), &OffloadSelection::default())
            .unwrap();
        std::thread::scope(|scope| {
            for thread in 0..2 {
                let (model, inputs, expected) = (&model, &inputs, &expected);
                scope.spawn(move || {
                    for round in 0..6 {
                        let i = (thread + round) % inputs.len();
                        let y = if round % 2 == 0 {
                            model.forward_layers(inputs[i].clone()).unwrap()
                        } else {
                            model.run(|m| m.forward(inputs[i].clone())).unwrap()
                        };
                        assert_eq!(y.into_data(), expected[i], "{name}, thread {thread}");
                    }
                });
            }
        });
    }
}

#[test]
fn selections_pick_types_one_module_or_paths() {
    let device = Default::default();
    let (resident, x, expected) = fixture(4, &device);
    let root = tempfile::tempdir().unwrap();
    let cases = [
        (OffloadSelection::default(), 5, weight_bytes()),
        (OffloadSelection::types(["Conv2d"]), 0, 0),
        (
            OffloadSelection::module("layers.1"),
            1,
            (96 * 80 * 4) as u64,
        ),
        (
            OffloadSelection::predicate(|path| path.ends_with('3') || path.ends_with('4')),
            2,
            ((96 * 64 + 64 * 16) * 4) as u64,
        ),
    ];
    for (selection, modules, bytes) in cases {
        let manager = OffloadManager::<Flex>::new(config(&root.path().join("s")), &device).unwrap();
        let model = manager.wrap(resident.clone(), &selection).unwrap();
        let summary = manager.summary();
        assert_eq!(summary.managed_modules, modules, "{selection:?}");
        assert_eq!(
            summary.managed_bytes, bytes,
            "{selection:?}: weights only, biases stay"
        );
        assert_eq!(
            model.run(|m| m.forward(x.clone())).unwrap().into_data(),
            expected
        );
    }
    // 1-D parameters too, on request.
    let config = config(&root.path().join("1d")).with_offload_1d_parameters(true);
    let manager = OffloadManager::<Flex>::new(config, &device).unwrap();
    let model = manager
        .wrap(resident.clone(), &OffloadSelection::default())
        .unwrap();
    let biases: u64 = WIDTHS[1..].iter().map(|&w| (w * 4) as u64).sum();
    assert_eq!(manager.summary().managed_bytes, weight_bytes() + biases);
    assert_eq!(model.forward_layers(x).unwrap().into_data(), expected);
}

#[test]
fn manual_offload_and_load_move_modules_in_and_out_of_the_device_cache() {
    let device = Default::default();
    let (resident, x, expected) = fixture(5, &device);
    let root = tempfile::tempdir().unwrap();
    // A monitor that never fires within the test: the budget is far above this process's heap.
    let config = config(root.path()).with_check_interval_ms(60_000);
    let manager = OffloadManager::<Flex>::new(config, &device).unwrap();
    let model = manager
        .wrap(resident, &OffloadSelection::default())
        .unwrap();
    assert_eq!(manager.summary().modules_on_device, 0, "eager offload");
    model.load_all().unwrap();
    assert_eq!(manager.summary().modules_on_device, 5);
    let loads = manager.summary().bytes_loaded();
    assert_eq!(
        model.forward_layers(x.clone()).unwrap().into_data(),
        expected
    );
    let summary = manager.summary();
    assert_eq!(
        summary.bytes_loaded(),
        loads,
        "all from the device cache: {summary}"
    );
    assert_eq!(summary.counters.cache_hits, 5);
    model.offload_all();
    assert_eq!(manager.summary().modules_on_device, 0);
    manager.load_module("layers.2").unwrap();
    assert_eq!(manager.summary().modules_on_device, 1);
    manager.offload_module("layers.2").unwrap();
    assert_eq!(manager.summary().modules_on_device, 0);
    assert!(matches!(
        manager.load_module("layers.9"),
        Err(MemoryError::Invalid { .. })
    ));
    assert_eq!(model.forward_layers(x).unwrap().into_data(), expected);
}

#[test]
fn bad_settings_fail_the_manager_with_typed_errors() {
    let device = Default::default();
    for config in [
        OffloadConfig::new().with_device_offload_threshold(1.2),
        OffloadConfig::new().with_device_reload_threshold(0.9),
        OffloadConfig::new().with_device_budget_bytes(Some(0)),
        OffloadConfig::new().with_host_budget_bytes(Some(0)),
    ] {
        let error = OffloadManager::<Flex>::new(config, &device).unwrap_err();
        assert!(matches!(error, MemoryError::Invalid { .. }), "{error}");
    }
}

/// After `cleanup` nothing is left on disk, and the heap is back to where it was before the
/// wrap once the model is taken back: in its own process, so other tests' allocations do not
/// count.
#[test]
fn cleanup_leaves_nothing_and_memory_returns_to_its_level_before_wrapping() {
    crate::own_process::in_own_process(
        "offload::cleanup_leaves_nothing_and_memory_returns_to_its_level_before_wrapping",
        cleanup_in_own_process,
    );
}

fn cleanup_in_own_process() {
    cleanup_returns_memory::<Flex>(&Default::default(), 64 * 1024);
}

/// Wraps a model, runs it, takes it back and cleans up; the memory in use must come back to
/// its level before the wrap within `tolerance` bytes.
pub fn cleanup_returns_memory<B: DeviceMemory>(device: &B::Device, tolerance: u64) {
    let tracker = MemoryTracker::<B>::new(device);
    let resident = Stack::<B>::new(&[256, 512, 512, 512, 256], device);
    let x = Tensor::<B, 2>::ones([4, 256], device);
    let expected = resident.forward(x.clone()).into_data();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cache");
    let before = tracker.usage().unwrap().in_use;
    let config = config(&dir).with_host_budget_bytes(Some(1 << 20));
    let manager = OffloadManager::<B>::new(config, device).unwrap();
    let model = manager
        .wrap(resident, &OffloadSelection::default())
        .unwrap();
    let wrapped = tracker.usage().unwrap().in_use;
    assert!(
        !files_in(&dir).is_empty(),
        "the host budget sends modules to disk"
    );
    assert_eq!(
        model.forward_layers(x.clone()).unwrap().into_data(),
        expected
    );
    let model = model.into_inner().unwrap();
    manager.cleanup();
    drop(manager);
    assert!(
        !dir.exists(),
        "cleanup removes the cache directory it created"
    );
    assert_eq!(
        model.forward(x).into_data(),
        expected,
        "the model taken back still works"
    );
    let after = tracker.usage().unwrap().in_use;
    println!("in use before wrap {before} B, wrapped {wrapped} B, after cleanup {after} B");
    assert!(wrapped < before, "the eager offload freed device memory");
    assert!(
        after <= before + tolerance,
        "in use before the wrap {before} B, after cleanup {after} B"
    );
}

/// A stack whose initialisers panic: whatever loads it must never run them.
fn stack_that_must_not_initialise(device: &burn::tensor::Device<Flex>) -> Stack<Flex> {
    use burn::module::{Param, ParamId};
    let layers = WIDTHS
        .windows(2)
        .map(|w| Linear {
            weight: Param::uninitialized(
                ParamId::new(),
                |_, _| panic!("a weight's initialiser ran"),
                *device,
                false,
                [w[0], w[1]].into(),
            ),
            bias: Some(Param::uninitialized(
                ParamId::new(),
                |_, _| panic!("a bias's initialiser ran"),
                *device,
                false,
                [w[1]].into(),
            )),
        })
        .collect();
    Stack { layers }
}

/// Writes `model`'s parameters as burn-store names them (`layers.0.weight`), leaving out
/// `skip` and giving `reshape` another shape.
fn write_checkpoint(model: &Stack<Flex>, path: &Path, skip: &str, reshape: &str) {
    let mut tensors = Vec::new();
    for (i, layer) in model.layers.iter().enumerate() {
        let weight = layer.weight.val().into_data();
        let bias = layer.bias.as_ref().unwrap().val().into_data();
        tensors.push((format!("layers.{i}.weight"), weight));
        tensors.push((format!("layers.{i}.bias"), bias));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .filter(|(name, _)| name != skip)
        .map(|(name, data)| {
            let mut shape = data.shape.to_vec();
            if name == reshape {
                shape.reverse();
            }
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                shape,
                data.as_bytes(),
            )
            .unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

#[test]
fn a_checkpoint_loads_straight_to_the_tiers_without_running_the_initialisers() {
    let device = Default::default();
    let (resident, x, expected) = fixture(6, &device);
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("model.safetensors");
    write_checkpoint(&resident, &path, "", "");
    for host_tier in [true, false] {
        let dir = root.path().join(format!("cache-{host_tier}"));
        let config = config(&dir).with_host_tier(host_tier);
        let manager = OffloadManager::<Flex>::new(config, &device).unwrap();
        let model = manager
            .wrap_checkpoint(
                stack_that_must_not_initialise(&device),
                &path,
                &OffloadSelection::default(),
            )
            .unwrap();
        let summary = manager.summary();
        assert_eq!(summary.managed_bytes, weight_bytes());
        let (on_host, on_disk) = if host_tier { (5, 0) } else { (0, 5) };
        assert_eq!(
            (summary.modules_on_host, summary.modules_on_disk),
            (on_host, on_disk)
        );
        for _ in 0..2 {
            assert_eq!(
                model.forward_layers(x.clone()).unwrap().into_data(),
                expected
            );
            assert_eq!(
                model.run(|m| m.forward(x.clone())).unwrap().into_data(),
                expected
            );
        }
    }
    // A missing or misshapen tensor: a typed error naming it, the model back untouched.
    for (skip, reshape, named) in [
        ("layers.2.weight", "", "layers.2.weight"),
        ("layers.4.bias", "", "layers.4.bias"),
        ("", "layers.1.weight", "layers.1.weight"),
    ] {
        let bad = root.path().join("bad.safetensors");
        write_checkpoint(&resident, &bad, skip, reshape);
        let manager =
            OffloadManager::<Flex>::new(config(&root.path().join("bad")), &device).unwrap();
        let error = manager
            .wrap_checkpoint(
                stack_that_must_not_initialise(&device),
                &bad,
                &OffloadSelection::default(),
            )
            .unwrap_err();
        assert!(
            matches!(&error.error, MemoryError::OffloadCache { message, .. } if message.contains(named)),
            "{}",
            error.error
        );
    }
    let manager = OffloadManager::<Flex>::new(config(&root.path().join("none")), &device).unwrap();
    let error = manager
        .wrap_checkpoint(
            resident,
            root.path().join("absent.safetensors"),
            &OffloadSelection::default(),
        )
        .unwrap_err();
    assert!(
        matches!(error.error, MemoryError::Io { .. }),
        "{}",
        error.error
    );
}

/// A call that panics must not leave its thread's call open: later calls learn the order and
/// prefetch along it as usual.
#[test]
fn a_panicking_call_leaves_the_next_calls_unaffected() {
    let device = Default::default();
    let (resident, x, expected) = fixture(7, &device);
    let root = tempfile::tempdir().unwrap();
    let manager = OffloadManager::<Flex>::new(config(root.path()), &device).unwrap();
    let model = manager
        .wrap(resident, &OffloadSelection::default())
        .unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        model.run(|m| {
            let _ = m.forward(x.clone());
            panic!("the user's closure fails");
        })
    }));
    assert!(panicked.is_err());
    for _ in 0..3 {
        assert_eq!(
            model.forward_layers(x.clone()).unwrap().into_data(),
            expected
        );
    }
    let summary = manager.summary();
    assert!(summary.counters.prefetch_hits > 0, "{summary}");
}
