//! `te-bench run|serve|connect --backend shm` move KV between two processes on this host and print the
//! same keys as the other backends; the server checks the client's bytes.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

const SIZE: [&str; 4] = ["--block-bytes", "256KiB", "--total-bytes", "8MiB"];

fn te_bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_te-bench"))
}

/// Runs `te-bench` with `args` and parses its one JSON line per row.
fn json_rows(args: &[&str]) -> Vec<serde_json::Value> {
    let out = te_bench().args(args).output().expect("running te-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[test]
fn run_reports_throughput_beside_memcpy_and_each_end_s_cpu_time() {
    let mut args = vec!["run", "--backend", "shm", "--iterations", "1", "--json"];
    args.extend(SIZE);
    for private in [false, true] {
        let mut args = args.clone();
        if private {
            args.push("--private");
        }
        let rows = json_rows(&args);
        assert_eq!(rows.len(), 3, "one row per mode: {rows:?}");
        for v in rows {
            assert_eq!(v["backend"], if private { "shm-cma" } else { "shm" }, "{v}");
            assert_eq!(v["recompute_blocks"], 0, "{v}");
            assert_eq!(v["checksum"], true, "{v}");
            for key in ["gbps", "limit_gbps", "ratio", "receiver_cpu_s_per_gib"] {
                assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
            }
            assert!(v["sender_cpu_s_per_gib"].as_f64().is_some(), "{v}");
        }
    }
}

#[test]
fn connect_pushes_kv_to_a_serve_process_from_shared_and_private_memory() {
    let socket = std::env::temp_dir().join(format!("te-bench-test-{}.sock", std::process::id()));
    let socket = socket.to_str().unwrap();
    let mut serve = te_bench()
        .args(["serve", "--backend", "shm", "--socket", socket])
        .args(SIZE)
        .args(["--seconds", "6", "--verify"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting te-bench serve");
    let mut out = BufReader::new(serve.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.contains("on shm"), "{first}");
    for (engine, private) in [("1", false), ("3", true)] {
        let mut args = vec!["connect", "--backend", "shm", "--socket", socket];
        args.extend(SIZE);
        args.extend(["--engine-id", engine, "--mode", "exclusive"]);
        args.extend(["--iterations", "1", "--json", "--no-limit"]);
        if private {
            args.push("--private");
        }
        let rows = json_rows(&args);
        let v = &rows[0];
        assert_eq!(v["backend"], if private { "shm-cma" } else { "shm" }, "{v}");
        assert_eq!(v["recompute_blocks"], 0, "{v}");
        assert!(v["gbps"].as_f64().unwrap() > 0.0, "{v}");
    }
    // The server stops by itself after its 6 s; everything it printed is in by then.
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(serve.wait().unwrap().success());
    // Each client's warm-up and measured transfer, each checked against that client's pattern.
    for engine in [1, 3] {
        let verified = format!("verified (engine {engine}'s pattern)");
        assert_eq!(rest.matches(&verified).count(), 2, "{first}{rest}");
    }
    assert!(!rest.contains("MISMATCH"), "{rest}");
}

#[test]
fn serve_refuses_the_tcp_servers_flags_over_shm_naming_them() {
    let out = te_bench()
        .args([
            "serve",
            "--backend",
            "shm",
            "--stall-ms",
            "5",
            "--lanes",
            "3",
        ])
        .args(["--seconds", "1"])
        .output()
        .expect("running te-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the flags were ignored: {stderr}");
    assert!(
        stderr.contains("--lanes, --stall-ms apply to `te-bench serve --backend tcp` only"),
        "{stderr}"
    );
}
