//! `te-bench serve --backend rdma` and `te-bench connect --backend rdma` move KV between two processes over
//! libfabric's shm provider; the server checks the client's bytes (feature `rdma`).
#![cfg(feature = "rdma")]

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

#[test]
fn connect_pushes_kv_to_a_serve_process_over_shm() {
    let size = ["--block-bytes", "256KiB", "--total-bytes", "8MiB"];
    let mut serve = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args(["serve", "--backend", "rdma", "--provider", "shm"])
        .args(size)
        .args(["--seconds", "4", "--verify"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting te-bench serve");
    let mut out = BufReader::new(serve.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let address = first
        .split_whitespace()
        .skip_while(|w| *w != "address")
        .nth(1)
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    let connect = Command::new(env!("CARGO_BIN_EXE_te-bench"))
        .args(["connect", "--backend", "rdma", "--provider", "shm"])
        .args(["--peer-address", &address])
        .args(size)
        .args([
            "--mode",
            "exclusive",
            "--iterations",
            "1",
            "--json",
            "--no-limit",
        ])
        .output()
        .expect("running te-bench connect");
    let stdout = String::from_utf8_lossy(&connect.stdout);
    assert!(
        connect.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&connect.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["backend"], "rdma");
    assert_eq!(v["recompute_blocks"], 0);
    assert!(v["gbps"].as_f64().unwrap() > 0.0, "{v}");
    // The server stops by itself after its 4 s; everything it printed is in by then.
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(serve.wait().unwrap().success());
    let verified = rest.lines().filter(|l| l.contains("verified")).count();
    // One warm-up and one measured transfer, each checked against the client's pattern.
    assert_eq!(verified, 2, "{first}{rest}");
    assert!(!rest.contains("MISMATCH"), "{rest}");
}
