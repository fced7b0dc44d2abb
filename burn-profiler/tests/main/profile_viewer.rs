//! The profile viewer: one self-contained HTML file with the profile's data embedded, written
//! from a real profiled run and from profiles built by hand; bad paths are reported.
//!
//! The browser check (the page draws, in time) is `cargo xtask profile-viewer`; the test
//! here that runs Chromium is ignored, since CI has no browser.

use std::path::Path;
use std::process::Command;

use burn::backend::{Autodiff, NdArray};
use burn::tensor::{Distribution, Tensor};
use burn_memory::MemoryUsage;
use burn_profiler::ProfileError;
use burn_profiler::{
    AllocAction, AllocEvent, OpEvent, Profile, Profiled, Profiler, ProfilerConfig, scope,
};
use serde_json::Value;

/// The JSON embedded in the page's `profile-data` element, parsed.
fn embedded(html: &str) -> Value {
    let open = r#"<script type="application/json" id="profile-data">"#;
    let start = html.find(open).expect("the page embeds its data") + open.len();
    let end = start
        + html[start..]
            .find("</script>")
            .expect("the data element closes");
    serde_json::from_str(&html[start..end]).expect("the embedded data is JSON")
}

/// No script, style sheet, image or frame comes from elsewhere, and no URL is named at all.
fn assert_self_contained(html: &str) {
    for needle in ["http://", "https://", "src=", "<link", "@import", "url("] {
        assert!(
            !html.contains(needle),
            "the page refers to something outside itself: `{needle}`"
        );
    }
    assert!(html.contains("<canvas id=\"timeline\""));
    assert!(html.contains("<canvas id=\"memory\""));
}

fn op(name: &'static str, start_ns: u64, scopes: Vec<u32>, in_use: u64) -> OpEvent {
    OpEvent {
        name,
        thread: 1,
        start_ns,
        host_ns: 1_000,
        device_ns: None,
        inputs: Vec::new(),
        outputs: Vec::new(),
        scopes,
        memory: Some(MemoryUsage {
            in_use,
            reserved: in_use + 4096,
        }),
    }
}

fn alloc(action: AllocAction, address: u64, size: u64, time_ns: u64) -> AllocEvent {
    AllocEvent {
        action,
        address,
        size,
        time_ns,
        thread: 1,
        op: Some("float_matmul"),
        scope: Some(0),
        in_use: 0,
    }
}

/// A profile built by hand: three operations, two allocations paired with their frees, one
/// free of a block allocated before the profile, one block never freed.
fn handmade() -> Profile {
    Profile {
        ops: vec![
            op("float_matmul", 0, vec![0], 1_000),
            op("float_add", 2_000, vec![0, 1], 5_000),
            op("float_matmul", 4_000, vec![], 2_000),
        ],
        scopes: Vec::new(),
        scope_names: vec!["forward".into(), "</script><!-- & more".into()],
        allocations: vec![
            alloc(AllocAction::Alloc, 0x10, 256, 100),
            alloc(AllocAction::Alloc, 0x20, 1024, 200),
            alloc(AllocAction::Free, 0x10, 256, 2_500),
            alloc(AllocAction::Free, 0x99, 64, 3_000),
            alloc(AllocAction::Alloc, 0x10, 512, 4_100),
            alloc(AllocAction::Free, 0x20, 1024, 4_500),
        ],
        dropped: 0,
    }
}

#[test]
fn the_page_is_self_contained_and_embeds_the_profile() {
    let profile = handmade();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("viewer.html");
    profile.write_viewer(&path).unwrap();
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_self_contained(&html);
    // The template's marks are all filled.
    assert!(!html.contains("{{"), "an unfilled mark in the page");

    let data = embedded(&html);
    assert_eq!(
        data["ops"]["name"].as_array().unwrap().len(),
        profile.ops.len()
    );
    let table = profile.key_averages();
    let rows = data["table"].as_array().unwrap();
    assert_eq!(rows.len(), table.rows.len());
    for (row, expected) in rows.iter().zip(&table.rows) {
        assert_eq!(row["name"], expected.name.as_str());
        assert_eq!(row["calls"], expected.calls);
        assert_eq!(row["total_ns"], expected.total_ns);
        assert_eq!(row["average_ns"], expected.average_ns());
    }
    // A scope name that would close the script element survives, escaped.
    assert_eq!(data["scope_names"][1], "</script><!-- & more");
    assert_eq!(
        html.matches("</script>").count(),
        3,
        "status, data and code"
    );
    // Memory counters per operation.
    let in_use: Vec<i64> = data["ops"]["in_use"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(in_use, vec![1_000, 5_000, 2_000]);
}

#[test]
fn allocations_are_paired_into_blocks() {
    let data = embedded(&handmade().viewer_html());
    let blocks = &data["blocks"];
    let column = |name: &str| -> Vec<i64> {
        blocks[name]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    };
    // In allocation order; the free of a block allocated before the profile is a block live
    // from the start; the address reused after its free is a new block, live at the end.
    assert_eq!(column("start_ns"), vec![100, 200, 0, 4_100]);
    assert_eq!(column("end_ns"), vec![2_500, 4_500, 3_000, -1]);
    assert_eq!(column("size"), vec![256, 1024, 64, 512]);
    assert_eq!(data["allocation_events"], 6);
    assert_eq!(data["end_ns"], 5_000);
}

#[test]
fn an_empty_profile_still_makes_a_page() {
    let html = Profile::default().viewer_html();
    assert_self_contained(&html);
    let data = embedded(&html);
    assert!(data["ops"]["name"].as_array().unwrap().is_empty());
    assert!(data["table"].as_array().unwrap().is_empty());
}

#[test]
fn a_bad_path_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no such directory").join("viewer.html");
    match handmade().write_viewer(&path) {
        Err(ProfileError::Io { path: reported, .. }) => assert_eq!(reported, path),
        other => panic!("expected an Io error, got {other:?}"),
    }
}

/// A profiled NdArray training step, recorded with memory, in a process of its own (one
/// profiler per process, and other tests' allocations would move the heap).
#[test]
fn a_profiled_training_step_makes_a_page() {
    crate::own_process::in_own_process(
        "profile_viewer::a_profiled_training_step_makes_a_page",
        || {
            let profile = training_step();
            let html = profile.viewer_html();
            assert_self_contained(&html);
            let data = embedded(&html);
            assert_eq!(
                data["ops"]["name"].as_array().unwrap().len(),
                profile.ops.len()
            );
            assert_eq!(
                data["table"].as_array().unwrap().len(),
                profile.key_averages().rows.len()
            );
            let sampled = data["ops"]["in_use"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|v| v.as_i64().unwrap() > 0)
                .count();
            assert_eq!(sampled, profile.ops.len(), "every op carries its memory");
        },
    );
}

fn training_step() -> Profile {
    type B = Autodiff<Profiled<NdArray>>;
    let device = Default::default();
    let profiler = Profiler::start_with_memory::<NdArray>(
        ProfilerConfig::new().with_record_shapes(true),
        &device,
    )
    .unwrap();
    let x = Tensor::<B, 2>::random([64, 32], Distribution::Default, &device);
    let w = Tensor::<B, 2>::random([32, 16], Distribution::Default, &device).require_grad();
    {
        let _forward = scope("forward");
        let loss = x.matmul(w.clone()).tanh().sum();
        let _backward = scope("backward");
        let _grads = loss.backward();
    }
    profiler.stop()
}

/// The page loads and draws in headless Chromium. `cargo xtask profile-viewer` is the real
/// check (with a 100 000-allocation profile and a time limit).
#[test]
#[ignore = "needs Chromium; run cargo xtask profile-viewer"]
fn the_page_draws_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("viewer.html");
    handmade().write_viewer(&path).unwrap();
    let status = chromium_status(&path);
    assert_eq!(status["ready"], true, "{status}");
    assert_eq!(status["mode"], "blocks", "{status}");
    assert_eq!(status["blocks"], 4, "{status}");
    assert_eq!(
        status["rows"],
        handmade().key_averages().rows.len(),
        "{status}"
    );
    assert!(status["drawnPixels"].as_u64().unwrap() > 1_000, "{status}");
}

fn chromium_status(path: &Path) -> Value {
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=10000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", path.display()))
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&output.stdout);
    let open = r#"<script type="application/json" id="viewer-status">"#;
    let start = dom.find(open).expect("the status element") + open.len();
    let end = start + dom[start..].find("</script>").unwrap();
    serde_json::from_str(&dom[start..end]).expect("the status is JSON")
}
