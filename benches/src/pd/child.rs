//! The prefill side of `te-bench pd`: the child process (a producer connector that computes, simulated,
//! and saves layer by layer) and the decode's handle on it (one JSON line per command on its stdin, one
//! reply line on its stdout).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, bail};
use connector::{KvRequest, KvRole, RequestExtras};
use serde::{Deserialize, Serialize};
use transfer_engine::MemoryRegion;

use super::{PdArgs, backend, pool_blocks, pool_bytes, sleep_us, stamp};

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum ChildCommand {
    /// Compute and save a prompt; with `announce`, a first reply (`started`) follows layer 0's save.
    Prefill {
        id: String,
        tokens: Vec<u32>,
        announce: bool,
    },
    Weights {
        version: u64,
    },
    Stats,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct ChildReply {
    /// Layer 0 is saved; the rest follows (an announced prefill's first reply).
    pub(super) started: bool,
    /// How long the prefill took in the child, from the command to its last save.
    pub(super) elapsed_us: u64,
    pub(super) computed_blocks: usize,
    pub(super) store_peak_blocks: usize,
    pub(super) saved_blocks: u64,
    pub(super) save_dropped: u64,
    pub(super) streamed_loads: u64,
    pub(super) error: Option<String>,
}

/// The prefill process, driven over its stdin and stdout.
pub(super) struct PrefillChild {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pub(super) control: SocketAddr,
}

impl PrefillChild {
    pub(super) fn spawn(args: &PdArgs) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("finding te-bench's own path")?;
        let mut child = Command::new(exe)
            .args(["pd", "--prefill-child"])
            .args(["--layers", &args.layers.to_string()])
            .args(["--block-tokens", &args.block_tokens.to_string()])
            .args(["--block-bytes", &args.block_bytes.to_string()])
            .args(["--compute-us", &args.compute_us.to_string()])
            .args(["--store-blocks", &args.store_blocks.to_string()])
            .args(["--max-trace-blocks", &args.max_trace_blocks.to_string()])
            .args(args.store_segments.then_some("--store-segments"))
            .args([
                "--backend",
                args.backend.name(),
                "--provider",
                &args.provider,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the prefill process")?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let control = line
            .trim()
            .strip_prefix("prefill control on ")
            .with_context(|| format!("the prefill process said {line:?}"))?
            .parse()?;
        Ok(Self {
            child,
            stdin,
            stdout,
            control,
        })
    }

    pub(super) fn call(&mut self, cmd: &ChildCommand) -> anyhow::Result<ChildReply> {
        self.send(cmd)?;
        self.reply()
    }

    pub(super) fn send(&mut self, cmd: &ChildCommand) -> anyhow::Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .context("the prefill process is closed")?;
        writeln!(stdin, "{}", serde_json::to_string(cmd)?)?;
        stdin.flush()?;
        Ok(())
    }

    pub(super) fn reply(&mut self) -> anyhow::Result<ChildReply> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the prefill process ended");
        }
        let reply: ChildReply = serde_json::from_str(&line)?;
        if let Some(e) = reply.error {
            bail!("prefill: {e}");
        }
        Ok(reply)
    }

    pub(super) fn finish(mut self) {
        self.stdin.take(); // EOF: the child exits
        let _ = self.child.wait();
    }
}

impl Drop for PrefillChild {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The prefill instance: a producer connector; computes (simulated) and saves layer by layer.
pub(super) fn prefill_child(args: &PdArgs) -> anyhow::Result<()> {
    let prefill = backend::connector(args, KvRole::Producer, 1, None)?;
    let pool = MemoryRegion::zeroed(pool_bytes(args) as usize);
    prefill
        .worker
        .register_kv_caches(pool.clone(), pool_blocks(args))?;
    let control = prefill
        .worker
        .control_addr()
        .context("a producer serves control")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "prefill control on {control}")?;
    out.flush()?;
    let bs = args.block_tokens as usize;
    for line in std::io::stdin().lock().lines() {
        let cmd: ChildCommand = serde_json::from_str(&line?)?;
        let reply = match cmd {
            ChildCommand::Weights { version } => {
                prefill.set_weight_version(version);
                ChildReply::default()
            }
            ChildCommand::Stats => ChildReply {
                store_peak_blocks: prefill.worker.store_usage().1,
                saved_blocks: prefill.worker.metrics().snapshot().saved_blocks,
                save_dropped: prefill.worker.metrics().snapshot().save_dropped,
                streamed_loads: prefill.worker.metrics().snapshot().streamed_loads,
                ..ChildReply::default()
            },
            ChildCommand::Prefill {
                id,
                tokens,
                announce,
            } => {
                let started = std::time::Instant::now();
                let extras = RequestExtras::default();
                let req = KvRequest {
                    id: &id,
                    tokens: &tokens,
                    extras: &extras,
                    external_keys: None,
                    transfer_params: None,
                };
                let keys = prefill.scheduler.request_keys(&req);
                let cached = prefill.worker.stored_prefix(&keys);
                let total = tokens.len().div_ceil(bs);
                let blocks: Vec<u32> = (0..total as u32).collect();
                prefill.scheduler.wait_matched_tokens(&req, 0)?;
                prefill
                    .scheduler
                    .update_state_after_alloc(&id, &blocks, 0)?;
                prefill.plan_step()?;
                let version = prefill.worker.namespace().weight_version;
                for layer in 0..args.layers {
                    sleep_us(args.compute_us * (total - cached) as u64);
                    for (b, key) in keys.iter().enumerate() {
                        let at = ((u64::from(layer) * u64::from(pool_blocks(args)) + b as u64)
                            * args.block_bytes) as usize;
                        pool.copy_from(at, &stamp(version, key))?;
                    }
                    prefill.worker.save_kv_layer(layer)?;
                    if layer == 0 && announce {
                        let first = ChildReply {
                            started: true,
                            ..ChildReply::default()
                        };
                        writeln!(out, "{}", serde_json::to_string(&first)?)?;
                        out.flush()?;
                    }
                }
                prefill.worker.wait_for_save()?;
                prefill.worker.clear_connector_metadata();
                prefill.scheduler.request_finished(&id);
                let _ = prefill.worker.get_finished();
                ChildReply {
                    computed_blocks: total - cached,
                    elapsed_us: started.elapsed().as_micros() as u64,
                    ..ChildReply::default()
                }
            }
        };
        writeln!(out, "{}", serde_json::to_string(&reply)?)?;
        out.flush()?;
    }
    Ok(())
}
