//! Runs one test in a process of its own, for the few tests that need the whole process:
//! shared by the crates' test binaries (`#[path]`-included), so that each crate links one
//! integration-test binary instead of one per such test.

/// Runs `body` in a fresh process of this test binary, alone, and fails if it fails there.
///
/// `test` is the test's path as the harness names it (`module::test_name`). The parent
/// re-runs the binary with `--exact test` and an environment variable; the child sees the
/// variable and runs `body`. Why: some state is per process (Burn's default float type per
/// device, the kernel's resident high-water mark), and other tests' threads would disturb it.
pub fn in_own_process(test: &str, body: impl FnOnce()) {
    const CHILD: &str = "BURN_SKETCH_OWN_PROCESS";
    if std::env::var(CHILD).as_deref() == Ok(test) {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let output = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, test)
        .output()
        .expect("the test binary starts again");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The child must have run exactly this test: a renamed test would otherwise match nothing
    // and "pass" with zero tests run.
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "`{test}` in its own process failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}
