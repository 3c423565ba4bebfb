//! The RDMA backend between two processes, on libfabric's `tcp` (through `ofi_rxm`) and `shm` providers:
//! 1 GiB byte-identical in each mode, and the receiving process killed mid-transfer (the sender reports
//! recompute within its deadline, no hang).
//!
//! The receiving process is this test binary again, run with `RDMA_CHILD` set (see `child_role`).
#![cfg(feature = "rdma")]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use backends::rdma::{Provider, RdmaConfig, RdmaNode};
use transfer_engine::{
    Dtype, KvLayout, MemoryRegion, PeerId, RegionHandle, TransferMode, TransferRequest,
};

const PROVIDERS: [(&str, &str); 2] = [("tcp", "lo"), ("shm", "")];

/// The killed-receiver test's session deadline: the sender must find the peer dead well before it.
const DEADLINE_S: u64 = 20;

/// The longest either side waits for the other's next step (a report line, a session): a hang fails the
/// test with what it was waiting for, rather than stalling the whole run.
const STEP_LIMIT: Duration = Duration::from_secs(90);

/// The longest a whole test may take; past it the watchdog names the step it is stuck on and ends the
/// process (a hang inside a provider call cannot be interrupted any other way).
const TEST_LIMIT: Duration = Duration::from_secs(300);

/// 8 layers x 32 blocks x 4 MiB: 1 GiB.
fn layout() -> KvLayout {
    KvLayout::new(8, 32, 4 << 20, 16, Dtype::Bf16).unwrap()
}

fn config(id: u32, provider: &str, domain: &str) -> RdmaConfig {
    let mut cfg = RdmaConfig::new(id, Provider::Named(provider.into()));
    cfg.domain = (!domain.is_empty()).then(|| domain.to_owned());
    cfg
}

fn fill(region: &MemoryRegion, seed: u8) {
    region
        .fill_with(|at, bytes| {
            for (i, b) in bytes.iter_mut().enumerate() {
                let i = at + i;
                *b = (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 12) as u8;
            }
        })
        .unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The receiving process's part: runs only when this binary is started with `RDMA_CHILD` set (by the
/// tests below); under a plain `cargo test` it returns at once.
#[test]
fn child_role() {
    let Ok(spec) = std::env::var("RDMA_CHILD") else {
        return;
    };
    let (provider, domain) = spec.split_once(',').unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let node = RdmaNode::start(config(2, provider, domain)).unwrap();
    let pool = MemoryRegion::zeroed(layout().total_bytes() as usize);
    let dst = node.register_kv_region(layout(), pool.clone()).unwrap();
    node.publish_segment("kv", dst).unwrap();
    let expected = MemoryRegion::zeroed(pool.len());
    fill(&expected, 3);
    println!("ADDR {}", hex(node.address()));
    loop {
        let incoming = within(&rt, "an incoming session", node.next_incoming()).unwrap();
        let first = incoming.layers.start;
        within(
            &rt,
            "the first layer",
            node.wait_layer(incoming.session, first),
        )
        .unwrap();
        println!("LAYER {first}");
        let received = within(
            &rt,
            "the session's end",
            node.wait_received(incoming.session),
        )
        .unwrap();
        let same = (0..pool.len()).step_by(16 << 20).all(|at| {
            let end = (at + (16 << 20)).min(pool.len());
            pool.read(at..end).unwrap()[..] == expected.read(at..end).unwrap()[..]
        });
        // Cleared before reporting, so the next transfer (started on the report) lands in zeroes.
        pool.fill_with(|_, b| b.fill(0)).unwrap();
        println!(
            "RECEIVED {} {}",
            if same && received.recompute.is_empty() {
                "identical"
            } else {
                "different"
            },
            received.recompute.len()
        );
    }
}

/// Runs `fut` on `rt` for at most [`STEP_LIMIT`]; a longer wait fails the test naming `what` it waited for.
fn within<T>(rt: &tokio::runtime::Runtime, what: &str, fut: impl Future<Output = T>) -> T {
    rt.block_on(async { tokio::time::timeout(STEP_LIMIT, fut).await })
        .unwrap_or_else(|_| panic!("waited {STEP_LIMIT:?} for {what}"))
}

/// Names the step a test is on; if the test is still running after [`TEST_LIMIT`], prints that step
/// (straight to stderr, past the test harness's capture) and ends the process with a failure. Dropped
/// last (it is made first), so a hang while the test's nodes shut down is caught too.
struct Watchdog {
    step: Arc<Mutex<String>>,
    _running: mpsc::Sender<()>,
}

impl Watchdog {
    fn start(test: &'static str) -> Self {
        let step = Arc::new(Mutex::new("starting".to_owned()));
        let watched = Arc::clone(&step);
        let (running, ended) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if ended.recv_timeout(TEST_LIMIT) != Err(RecvTimeoutError::Timeout) {
                return;
            }
            let step = watched
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let _ = writeln!(
                std::io::stderr(),
                "{test}: still running after {TEST_LIMIT:?}, at: {step}; ending the process"
            );
            std::process::exit(101);
        });
        Self {
            step,
            _running: running,
        }
    }

    fn at(&self, step: impl Into<String>) {
        *self.step.lock().unwrap_or_else(PoisonError::into_inner) = step.into();
    }
}

struct Peer {
    child: Child,
    lines: Receiver<String>,
}

impl Peer {
    fn spawn(provider: &str, domain: &str) -> (Self, Vec<u8>) {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_role",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("RDMA_CHILD", format!("{provider},{domain}"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Read on a thread of its own, so that waiting for a line can time out.
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut peer = Self { child, lines };
        let addr = unhex(&peer.expect("ADDR "));
        (peer, addr)
    }

    /// The rest of the child's next line that holds `prefix` (libtest may have started the line with
    /// "test child_role ... "); fails the test if the child exits or stays silent for [`STEP_LIMIT`].
    fn expect(&mut self, prefix: &str) -> String {
        let until = Instant::now() + STEP_LIMIT;
        loop {
            let line = match self
                .lines
                .recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("the child printed no {prefix:?} line within {STEP_LIMIT:?}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the child exited before printing a {prefix:?} line")
                }
            };
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim().to_owned();
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sending node with its source region: `None` (a "not run") only where libfabric lists no such
/// provider; a listed one that cannot start a node fails the test.
fn sender(provider: &str, domain: &str) -> Option<(RdmaNode, RegionHandle)> {
    let listed_on = (!domain.is_empty()).then_some(domain);
    let node = common::on_listed_provider(provider, listed_on, || {
        RdmaNode::start(config(1, provider, domain))
    })?;
    let src = MemoryRegion::zeroed(layout().total_bytes() as usize);
    fill(&src, 3);
    let handle = node.register_kv_region(layout(), src).unwrap();
    Some((node, handle))
}

fn request(
    peer: PeerId,
    src: &RegionHandle,
    dst: &RegionHandle,
    mode: TransferMode,
) -> TransferRequest {
    TransferRequest::whole(peer, src, dst)
        .unwrap()
        .with_mode(mode)
}

#[test]
fn one_gib_between_two_processes_arrives_byte_identical_in_each_mode() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let watchdog = Watchdog::start("one_gib_between_two_processes");
    for (provider, domain) in PROVIDERS {
        watchdog.at(format!("{provider}: starting the sender"));
        let Some((node, src)) = sender(provider, domain) else {
            continue;
        };
        watchdog.at(format!("{provider}: starting the child"));
        let (mut child, addr) = Peer::spawn(provider, domain);
        watchdog.at(format!("{provider}: connecting"));
        let peer = rt.block_on(node.connect(&addr)).unwrap();
        let dst = *peer.segment("kv").unwrap();
        for mode in [
            TransferMode::Exclusive,
            TransferMode::packetized(),
            TransferMode::auto(),
        ] {
            let req = request(peer.peer, &src, &dst, mode).with_deadline(Duration::from_secs(60));
            watchdog.at(format!("{provider} {}: transferring", mode.name()));
            let started = Instant::now();
            let out = rt
                .block_on(node.transfer(req, Duration::from_secs(90)))
                .unwrap();
            assert!(
                out.recompute.is_empty(),
                "{provider} {mode:?}: {out:?} {:?}",
                node.log()
            );
            watchdog.at(format!("{provider} {}: awaiting the report", mode.name()));
            let report = child.expect("RECEIVED ");
            assert_eq!(report, "identical 0", "{provider} {mode:?}");
            println!(
                "{provider} {}: 1 GiB across processes in {:?}",
                mode.name(),
                started.elapsed()
            );
        }
        watchdog.at(format!("{provider}: shutting down"));
    }
}

#[test]
fn a_receiver_killed_mid_transfer_leaves_recompute_and_no_hang() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let watchdog = Watchdog::start("a_receiver_killed_mid_transfer");
    for (provider, domain) in PROVIDERS {
        watchdog.at(format!("{provider}: starting the sender"));
        let Some((node, src)) = sender(provider, domain) else {
            continue;
        };
        watchdog.at(format!("{provider}: starting the child"));
        let (mut child, addr) = Peer::spawn(provider, domain);
        watchdog.at(format!("{provider}: connecting"));
        let peer = rt.block_on(node.connect(&addr)).unwrap();
        let dst = *peer.segment("kv").unwrap();
        // Only layer 0 is released at first, so the kill lands mid-transfer; the rest is released after
        // it, so what comes back for recompute is what the dead receiver could not take (with the
        // receiver alive, the whole GiB arrives well within the deadline: see the test above).
        let req = request(peer.peer, &src, &dst, TransferMode::packetized())
            .with_deadline(Duration::from_secs(DEADLINE_S))
            .with_layers_written(1);
        let started = Instant::now();
        let session = node.submit(req).unwrap();
        watchdog.at(format!("{provider}: awaiting the child's first layer"));
        child.expect("LAYER ");
        watchdog.at(format!("{provider}: killing the child"));
        child.child.kill().unwrap();
        child.child.wait().unwrap();
        watchdog.at(format!("{provider}: releasing the other layers"));
        node.layers_written(session, layout().layers).unwrap();
        watchdog.at(format!("{provider}: awaiting the session's end"));
        let out = rt
            .block_on(node.wait(session, Duration::from_secs(30)))
            .expect("the sender ends the session by its deadline");
        let total = layout().layers as usize * layout().blocks_per_layer as usize;
        let per_layer = layout().blocks_per_layer as usize;
        // Every block of layers 1-7 is to be recomputed; a block of layer 0 may be too, when the receiver
        // verified it but died before its ack left.
        assert!(
            (total - per_layer..=total).contains(&out.recompute.len())
                && out.recompute.iter().filter(|b| b.layer > 0).count() == total - per_layer,
            "{provider}: {out:?}"
        );
        // Found dead by its failing writes, not by the session's deadline.
        let reason = out.reason.clone().unwrap_or_default();
        assert!(reason.contains("unreachable"), "{provider}: {reason:?}");
        println!(
            "{provider}: receiver killed; {} of {total} blocks to recompute after {:?}; {} write errors; {reason}",
            out.recompute.len(),
            started.elapsed(),
            node.stats().write_errors
        );
        watchdog.at(format!("{provider}: shutting down"));
    }
}
