//! Running `te-bench` from the tests.

use std::process::Command;

/// Runs `te-bench args` from the repository root, checks that it succeeded (showing what it printed if
/// not), and returns the JSON object on its last line of output.
pub(crate) fn te_bench_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("running te-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "te-bench {} failed: {}\n{stdout}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"))
}
