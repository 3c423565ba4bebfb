//! The same-host backend between two processes: 1 GiB byte-identical in each mode from shared memory (one
//! plain copy out of the granted memfd) and from private memory (cross-memory attach); a receiving process
//! killed mid-transfer noticed at once by its closed socket; and strangers: a process of a user the rule
//! does not allow, garbage instead of a hello, a second node claiming a connected engine id. The
//! receiving process is this test binary again, run with `SHM_CHILD` set (see `child_role`).
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use backends::shm::{CopyPath, CredentialRule, ShmConfig, ShmNode};
use transfer_engine::{Dtype, KvLayout, MemoryRegion, TransferMode, TransferRequest};

/// The longest either side waits for the other's next step: a hang fails with what it waited for.
const STEP_LIMIT: Duration = Duration::from_secs(90);

/// 8 layers x 32 blocks x 4 MiB: 1 GiB.
fn layout() -> KvLayout {
    KvLayout::new(8, 32, 4 << 20, 16, Dtype::Bf16).unwrap()
}

fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("te-shm-test-{}-{tag}.sock", std::process::id()))
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

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn within<T>(rt: &tokio::runtime::Runtime, what: &str, fut: impl Future<Output = T>) -> T {
    rt.block_on(async { tokio::time::timeout(STEP_LIMIT, fut).await })
        .unwrap_or_else(|_| panic!("waited {STEP_LIMIT:?} for {what}"))
}

/// The receiving process's part: runs only when this binary is started with `SHM_CHILD` (a socket path)
/// set; under a plain `cargo test` it returns at once. Per session it prints `LAYER` once the first layer
/// is in, then `RECEIVED identical|different <blocks to recompute> <units copied by cross-memory attach
/// so far>`.
#[test]
fn child_role() {
    let Ok(path) = std::env::var("SHM_CHILD") else {
        return;
    };
    let rt = runtime();
    // The mapping is kept for granted memory, so the count of units by cross-memory attach says which
    // source the sender used.
    let mut cfg = ShmConfig::new(2, Some(path.into()));
    cfg.copy_path = CopyPath::Mapping;
    let node = ShmNode::start(cfg).unwrap();
    let pool = MemoryRegion::zeroed(layout().total_bytes() as usize);
    let dst = node.register_kv_region(layout(), pool.clone()).unwrap();
    node.publish_segment("kv", dst).unwrap();
    let expected = MemoryRegion::zeroed(pool.len());
    fill(&expected, 3);
    println!("LISTENING");
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
        let received = within(&rt, "the end", node.wait_received(incoming.session)).unwrap();
        let same = pool.to_vec().unwrap() == expected.to_vec().unwrap();
        pool.fill_with(|_, b| b.fill(0)).unwrap();
        println!(
            "RECEIVED {} {} {}",
            if same && received.recompute.is_empty() {
                "identical"
            } else {
                "different"
            },
            received.recompute.len(),
            node.stats().units_by_cma
        );
    }
}

struct Peer {
    child: Child,
    lines: Receiver<String>,
    path: PathBuf,
}

impl Peer {
    fn spawn(tag: &str) -> Self {
        let path = socket(tag);
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_role",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("SHM_CHILD", &path)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut peer = Self { child, lines, path };
        peer.expect("LISTENING");
        peer
    }

    /// The rest of the child's next line holding `prefix`.
    fn expect(&mut self, prefix: &str) -> String {
        let until = Instant::now() + STEP_LIMIT;
        loop {
            let line = match self
                .lines
                .recv_timeout(until.saturating_duration_since(Instant::now()))
            {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no {prefix:?} line within {STEP_LIMIT:?}")
                }
                Err(RecvTimeoutError::Disconnected) => panic!("the child exited before {prefix:?}"),
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
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn one_gib_from_shared_and_private_memory_arrives_byte_identical_in_each_mode() {
    let rt = runtime();
    let mut child = Peer::spawn("gib");
    let node = ShmNode::start(ShmConfig::new(1, None)).unwrap();
    let len = layout().total_bytes() as usize;
    let shared = node.shared_memory(len).unwrap();
    let private = MemoryRegion::zeroed(len);
    fill(&shared, 3);
    fill(&private, 3);
    let peer = within(&rt, "the handshake", node.connect(&child.path)).unwrap();
    let dst = *peer.segment("kv").unwrap();
    let mut cma_units = 0u64;
    for (name, memory) in [("shared", shared), ("private", private)] {
        let src = node.register_kv_region(layout(), memory).unwrap();
        for mode in [TransferMode::Exclusive, TransferMode::packetized()] {
            let req = TransferRequest::whole(peer.peer, &src, &dst)
                .unwrap()
                .with_mode(mode);
            let out = within(&rt, "the transfer", node.transfer(req, STEP_LIMIT)).unwrap();
            assert!(out.recompute.is_empty(), "{name} {}: {out:?}", mode.name());
            let report = child.expect("RECEIVED ");
            let words: Vec<&str> = report.split_whitespace().collect();
            assert_eq!(words[..2], ["identical", "0"], "{name} {}", mode.name());
            let by_cma: u64 = words[2].parse().unwrap();
            if name == "shared" {
                assert_eq!(
                    by_cma, 0,
                    "units from shared memory are copied out of its mapping"
                );
            } else {
                assert!(
                    by_cma > cma_units,
                    "units from private memory go by cross-memory attach"
                );
            }
            cma_units = by_cma;
            println!("{name} {}: {:?}", mode.name(), out.elapsed);
        }
        node.unregister_region(src.id).unwrap();
    }
    // A same-host socket loses nothing: a resend is only a timer that fired on an ack made late by a loaded
    // machine (first-touch page faults on the 1 GiB pool), so resends stay a sliver of what moved (CI saw
    // one unit once).
    let engine = node.stats().engine;
    let moved = 4 * len as u64;
    assert!(
        engine.retransmit_bytes * 100 <= moved,
        "{} of {moved} bytes resent: {engine:?}",
        engine.retransmit_bytes
    );
}

#[test]
fn a_killed_receiver_is_noticed_by_its_closed_socket() {
    let rt = runtime();
    let mut child = Peer::spawn("kill");
    let node = ShmNode::start(ShmConfig::new(1, None)).unwrap();
    let memory = node.shared_memory(layout().total_bytes() as usize).unwrap();
    fill(&memory, 3);
    let src = node.register_kv_region(layout(), memory).unwrap();
    let peer = within(&rt, "the handshake", node.connect(&child.path)).unwrap();
    let dst = *peer.segment("kv").unwrap();
    let req = TransferRequest::whole(peer.peer, &src, &dst)
        .unwrap()
        .with_mode(TransferMode::packetized())
        .with_deadline(Duration::from_secs(60))
        .with_layers_written(1);
    let session = node.submit(req).unwrap();
    child.expect("LAYER ");
    child.child.kill().unwrap();
    child.child.wait().unwrap();
    // The session may have ended already (the death noticed at once): then there is nothing to release.
    let _ = node.layers_written(session, layout().layers);
    let out = within(&rt, "the session's end", node.wait(session, STEP_LIMIT)).unwrap();
    let per_layer = layout().blocks_per_layer as usize;
    assert_eq!(
        out.recompute.iter().filter(|b| b.layer > 0).count(),
        7 * per_layer,
        "{out:?}"
    );
    let reason = out.reason.unwrap_or_default();
    // Found by the socket, not by the 60 s deadline.
    assert!(reason.contains("closed its socket"), "{reason}");
    let again = TransferRequest::whole(peer.peer, &src, &dst).unwrap();
    let e = node.submit(again).unwrap_err();
    assert!(matches!(e, backends::TransportError::Unreachable(_)), "{e}");
}

#[test]
fn strangers_are_refused_with_a_reason_and_the_node_keeps_serving() {
    let rt = runtime();
    let path = socket("strangers");
    let receiver = ShmNode::start(ShmConfig::new(2, Some(path.clone()))).unwrap();
    let pool = MemoryRegion::zeroed(1 << 20);
    let layout = KvLayout::new(1, 4, 256 << 10, 16, Dtype::Bf16).unwrap();
    let dst = receiver.register_kv_region(layout, pool.clone()).unwrap();
    receiver.publish_segment("kv", dst).unwrap();

    // Garbage instead of a hello: refused, with the reason, and closed.
    let mut raw = UnixStream::connect(&path).unwrap();
    raw.set_read_timeout(Some(STEP_LIMIT)).unwrap();
    raw.write_all(&[0x7E, 0, 0, 0, 0, 1, 2, 3]).unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).unwrap();
    assert!(String::from_utf8_lossy(&answer).contains("unknown message tag 126"));

    // A node whose rule allows only another user refuses this process at once.
    let mut cfg = ShmConfig::new(3, None);
    cfg.allowed = CredentialRule::Users(vec![nix::unistd::getuid().as_raw() + 1]);
    let picky = ShmNode::start(cfg).unwrap();
    let e = within(&rt, "the handshake", picky.connect(&path)).unwrap_err();
    assert!(e.to_string().contains("not allowed"), "{e}");

    // A node linked, then a second one claiming its engine id: refused, the first keeps its link.
    let first = ShmNode::start(ShmConfig::new(1, None)).unwrap();
    let src = first
        .register_kv_region(layout, MemoryRegion::zeroed(1 << 20))
        .unwrap();
    let peer = within(&rt, "the handshake", first.connect(&path)).unwrap();
    let impostor = ShmNode::start(ShmConfig::new(1, None)).unwrap();
    let e = within(&rt, "the handshake", impostor.connect(&path)).unwrap_err();
    assert!(e.to_string().contains("already connected"), "{e}");

    // Each refusal is in the receiver's log (the garbage's is written just after its reason is sent).
    let until = Instant::now() + STEP_LIMIT;
    let refusals = || {
        receiver
            .log_entries()
            .iter()
            .filter(|e| e.kind == backends::node::LogKind::HandshakeRefused)
            .map(|e| e.times)
            .sum::<u64>()
    };
    while refusals() < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(refusals() >= 2, "{:?}", receiver.log());
    // Every refusal the counter counts is an entry of the log.
    let logged: u64 = receiver
        .log_entries()
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                backends::node::LogKind::HandshakeRefused | backends::node::LogKind::Refused
            )
        })
        .map(|e| e.times)
        .sum();
    assert_eq!(receiver.stats().refused, logged, "{:?}", receiver.log());
    let linked_impostor = receiver.log_entries().iter().any(|e| {
        e.kind == backends::node::LogKind::Connected && e.peer == Some(transfer_engine::PeerId(3))
    });
    assert!(!linked_impostor, "{:?}", receiver.log());
    // The first node's transfers still arrive.
    first
        .memory(src.id)
        .unwrap()
        .fill_with(|_, b| b.fill(5))
        .unwrap();
    let req = TransferRequest::whole(peer.peer, &src, peer.segment("kv").unwrap()).unwrap();
    let out = within(&rt, "the transfer", first.transfer(req, STEP_LIMIT)).unwrap();
    assert!(out.recompute.is_empty(), "{out:?}");
    assert!(pool.to_vec().unwrap().iter().all(|&b| b == 5));
}
