//! Running `te-bench` from the tests.

use std::process::Command;

/// Runs `te-bench args` from the repository root, checks that it succeeded (showing what it printed if
/// not), and returns the JSON object on its last line of output.
pub(crate) fn te_bench_json(args: &[&str]) -> serde_json::Value {
    let stdout = te_bench_stdout(args);
    let last = stdout.lines().last().unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"))
}

/// Runs te-bench with `args` (which must include `--json`) and parses every line it prints as one JSON
/// object.
#[allow(dead_code)]
pub(crate) fn te_bench_json_rows(args: &[&str]) -> Vec<serde_json::Value> {
    let stdout = te_bench_stdout(args);
    stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n{stdout}"))
        })
        .collect()
}

/// Runs te-bench with `args` from the repository root, checks that it succeeded, and returns what it
/// printed.
fn te_bench_stdout(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("running te-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "te-bench {} failed: {}\n{stdout}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
