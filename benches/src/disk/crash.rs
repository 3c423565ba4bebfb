//! `te-bench disk --crash-test`: a child process writes blocks into a disk tier and is killed (`SIGKILL`)
//! at a random moment; the tier is reopened and every block it recovered is read and compared with what
//! was written. Repeated on the same directory, so later children start on what earlier ones left.
//!
//! The child prints `written <key>` once a record's write has returned, and `removed <key>` before it
//! evicts one. Every key written and not removed must be served with its bytes (`missing` counts those
//! that are not); no block may be served with other bytes (`corrupt_served`, must be 0). Blocks whose
//! record a kill tore are caught by their CRC (`torn_caught`).

use std::collections::{HashSet, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use connector::ScopedKey;
use connector::disk::{BlockFormat, DiskConfig, DiskTier, Got, Put};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use transfer_engine::{Dtype, MemoryRegion, NamespaceId};

use crate::report::print_rows;

const FORMAT: BlockFormat = BlockFormat {
    layers: 4,
    layer_bytes: 64 << 10,
    tokens_per_block: 16,
    dtype: Dtype::Bf16,
};
const CAPACITY_BLOCKS: u64 = 96;
const BATCH: usize = 8;

/// Columns of the human table.
const COLUMNS: &[&str] = &[
    "crashes",
    "blocks_written",
    "blocks_recovered",
    "torn_caught",
    "missing",
    "corrupt_served",
    "recovery_ms",
    "seed",
];

#[derive(Debug, Serialize)]
struct Row {
    crashes: u32,
    /// Blocks the children reported written, over every run.
    blocks_written: usize,
    /// Blocks served intact after the reopens, summed over every reopen.
    blocks_recovered: usize,
    /// Recovered records whose CRC failed on read (torn by a kill): not served.
    torn_caught: usize,
    /// Blocks reported written (and not removed) that a reopened tier did not serve.
    missing: usize,
    /// Blocks served with bytes other than those written. Must be 0.
    corrupt_served: usize,
    /// The longest reopen (header scan and index rebuild), in milliseconds.
    recovery_ms: f64,
    seed: u64,
}

fn config(dir: &Path) -> DiskConfig {
    let mut cfg = DiskConfig::new(dir, CAPACITY_BLOCKS * FORMAT.record_bytes());
    cfg.queue_blocks = 16;
    cfg
}

fn key(run: u64, i: u64) -> ScopedKey {
    let mut hash = [0u8; 32];
    hash[..8].copy_from_slice(&run.to_le_bytes());
    hash[8..16].copy_from_slice(&i.to_le_bytes());
    ScopedKey {
        ns: NamespaceId(7),
        hash: connector::BlockHash(hash),
    }
}

/// The bytes written for `key`.
fn pattern(key: &ScopedKey, out: &mut [u8]) {
    let h = &key.hash.0;
    let s = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"))
        ^ u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")).rotate_left(29);
    for (i, b) in out.iter_mut().enumerate() {
        *b = (s >> ((i % 8) * 8)) as u8 ^ i as u8 ^ (i >> 9) as u8;
    }
}

/// The writing child: writes batches of blocks until killed, evicting the oldest when the tier is full.
pub(super) fn child(dir: &Path, run: u64) -> anyhow::Result<()> {
    let mut tier = DiskTier::open(config(dir), FORMAT)?;
    let mut held: VecDeque<ScopedKey> = tier.take_recovered().into_iter().map(|(k, _)| k).collect();
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {}", held.len())?;
    out.flush()?;
    let len = FORMAT.block_bytes() as usize;
    let src = MemoryRegion::zeroed(len);
    let mut bytes = vec![0; len];
    for i in 0.. {
        let batch: Vec<ScopedKey> = (0..BATCH as u64)
            .map(|b| key(run, i * BATCH as u64 + b))
            .collect();
        for k in &batch {
            pattern(k, &mut bytes);
            src.copy_from(0, &bytes)?;
            loop {
                match tier.put(*k, None, &src, &[(0, len)])? {
                    Put::Queued | Put::AlreadyStored => break,
                    Put::QueueFull => std::thread::sleep(Duration::from_micros(100)),
                    Put::NoSlot => {
                        for _ in 0..BATCH {
                            let Some(old) = held.pop_front() else { break };
                            writeln!(out, "removed {}", old.hash.to_hex())?;
                            out.flush()?;
                            tier.remove(&old);
                        }
                    }
                }
            }
            held.push_back(*k);
        }
        tier.flush();
        for k in &batch {
            writeln!(out, "written {}", k.hash.to_hex())?;
        }
        out.flush()?;
    }
    Ok(())
}

pub(super) fn main(dir: &Path, crashes: u32, seed: u64, json: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let exe = std::env::current_exe()?;
    let mut expected: HashSet<String> = HashSet::new();
    let mut row = Row {
        crashes: 0,
        blocks_written: 0,
        blocks_recovered: 0,
        torn_caught: 0,
        missing: 0,
        corrupt_served: 0,
        recovery_ms: 0.0,
        seed,
    };
    for crash in 0..crashes {
        let run = seed.wrapping_mul(1_000_003).wrapping_add(u64::from(crash));
        let mut child = Command::new(&exe)
            .args(["disk", "--crash-child"])
            .arg(dir)
            .args(["--seed", &run.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let ready = lines.next().transpose()?.unwrap_or_default();
        anyhow::ensure!(
            ready.starts_with("ready"),
            "crash {crash} (seed {seed}): the child did not start: {ready:?}"
        );
        std::thread::sleep(Duration::from_micros(rng.random_range(0..60_000)));
        child.kill()?;
        child.wait()?;
        for line in lines {
            let line = line?;
            if let Some(k) = line.strip_prefix("written ") {
                row.blocks_written += 1;
                expected.insert(k.to_owned());
            } else if let Some(k) = line.strip_prefix("removed ") {
                expected.remove(k);
            }
        }
        row.crashes += 1;
        check(dir, &mut expected, &mut row)?;
    }
    print_rows(&[&row], json, COLUMNS)?;
    anyhow::ensure!(
        row.corrupt_served == 0 && row.missing == 0,
        "the crash test failed (seed {seed}): {} blocks served with wrong bytes, {} written blocks missing",
        row.corrupt_served,
        row.missing
    );
    Ok(())
}

/// Reopens the tier, reads every block it recovered, and checks them against `expected`.
fn check(dir: &Path, expected: &mut HashSet<String>, row: &mut Row) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut tier = DiskTier::open(config(dir), FORMAT)?;
    row.recovery_ms = row.recovery_ms.max(started.elapsed().as_secs_f64() * 1e3);
    let len = FORMAT.block_bytes() as usize;
    let dst = MemoryRegion::zeroed(len);
    let mut want = vec![0; len];
    let mut served = HashSet::new();
    for (k, _) in tier.take_recovered() {
        match tier.get(&k, &dst, &[(0, len)])? {
            Got::Served => {
                pattern(&k, &mut want);
                if dst.read(0..len)?[..] == want[..] {
                    row.blocks_recovered += 1;
                } else {
                    row.corrupt_served += 1;
                }
                served.insert(k.hash.to_hex());
            }
            Got::Corrupt => row.torn_caught += 1,
            Got::Missing => {}
        }
    }
    let missing: Vec<&String> = expected.difference(&served).collect();
    row.missing += missing.len();
    // What is missing once is not looked for again.
    let missing: Vec<String> = missing.into_iter().cloned().collect();
    for k in missing {
        expected.remove(&k);
    }
    Ok(())
}
