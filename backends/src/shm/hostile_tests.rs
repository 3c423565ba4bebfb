//! A hostile process on the same host, linked to a node as a peer (a real handshake, then whatever it
//! likes): it floods without reading, sends garbage, lies about addresses and sessions, and claims a
//! linked engine's id. The node drops or refuses it with a reason and keeps serving an honest peer.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use transfer_engine::wire::{FrameKind, Header};
use transfer_engine::{Dtype, KvLayout, TransferMode, TransferRequest};

use super::hello::Hello;
use super::wire::Envelope;
use super::{ShmConfig, ShmNode};

fn layout() -> KvLayout {
    KvLayout::new(4, 16, 1 << 20, 16, Dtype::Bf16).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// A receiving node with a published `kv` region, that drops a peer taking no bytes for 1 s.
fn victim(name: &str) -> (ShmNode, PathBuf) {
    let path = std::env::temp_dir().join(format!("shm-hostile-{name}-{}.sock", std::process::id()));
    let mut cfg = ShmConfig::new(2, Some(path.clone()));
    cfg.liveness.stall_timeout = Duration::from_secs(1);
    let node = ShmNode::start(cfg).unwrap();
    let dst = node.kv_region(layout()).unwrap();
    node.publish_segment("kv", dst).unwrap();
    (node, path)
}

/// An honest peer moves 64 MiB to the victim, three times, each byte checked.
fn honest_transfers(path: &std::path::Path, victim: &ShmNode) {
    let rt = runtime();
    let node = ShmNode::start(ShmConfig::new(1, None)).unwrap();
    let memory = node.shared_memory(layout().total_bytes() as usize).unwrap();
    memory
        .fill_with(|offset, b| {
            b.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (offset + i) as u8 ^ 0x5A)
        })
        .unwrap();
    let src = node.register_kv_region(layout(), memory.clone()).unwrap();
    let peer = rt.block_on(node.connect(path)).unwrap();
    let dst = *peer.segment("kv").unwrap();
    for mode in [
        TransferMode::Exclusive,
        TransferMode::packetized(),
        TransferMode::auto(),
    ] {
        let req = TransferRequest::whole(peer.peer, &src, &dst)
            .unwrap()
            .with_mode(mode);
        let out = rt
            .block_on(node.transfer(req, Duration::from_secs(60)))
            .unwrap();
        assert!(out.recompute.is_empty(), "{}: {out:?}", mode.name());
        let got = victim.memory(dst.id).unwrap();
        assert_eq!(
            got.crc32c(0..got.len()).unwrap(),
            memory.crc32c(0..memory.len()).unwrap(),
            "{}",
            mode.name()
        );
    }
}

/// A hello of engine `engine_id` (no secret, the default namespace) with probe `probe`.
fn hello_of(engine_id: u32, probe: (u64, u64)) -> Hello {
    Hello {
        engine_id,
        checksum: true,
        path: None,
        probe,
        namespace: transfer_engine::Namespace::default(),
        authenticated: false,
        nonce: [1; super::hello::NONCE_LEN],
        segments: Vec::new(),
    }
}

/// Links to the node at `path` as engine `engine_id` with a true hello (its probe word lies in this
/// process) and the handshake's MAC (zeros: no secret), and returns the connection and the node's last
/// answer (`Admitted`, or the refusal).
fn link_as(path: &std::path::Path, engine_id: u32) -> (UnixStream, Envelope) {
    let probe: &'static u64 = Box::leak(Box::new(0xC0FF_EE00 ^ u64::from(engine_id)));
    let hello = hello_of(
        engine_id,
        (std::ptr::from_ref(probe) as usize as u64, *probe),
    );
    let mut stream = UnixStream::connect(path).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    Envelope::Hello(hello.encode())
        .write_to(&mut stream)
        .unwrap();
    let welcome = Envelope::read_from(&mut stream).unwrap();
    assert!(matches!(welcome, Envelope::Welcome(_)), "{welcome:?}");
    let mac = Envelope::read_from(&mut stream).unwrap();
    assert!(matches!(mac, Envelope::Auth(_)), "{mac:?}");
    Envelope::Auth([0; super::wire::MAC_LEN])
        .write_to(&mut stream)
        .unwrap();
    let answer = Envelope::read_from(&mut stream).unwrap();
    (stream, answer)
}

fn wait_for(node: &ShmNode, what: &str, limit: Duration) -> String {
    let end = Instant::now() + limit;
    loop {
        if let Some(line) = node.log().into_iter().find(|l| l.contains(what)) {
            return line;
        }
        assert!(Instant::now() < end, "no {what:?} in {:#?}", node.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_peer_that_floods_and_never_reads_is_dropped_while_an_honest_one_is_served() {
    let (node, path) = victim("flood");
    let (mut flood, answer) = link_as(&path, 66);
    assert!(matches!(answer, Envelope::Admitted), "{answer:?}");
    // Opens with a garbage description: every one is answered with a Reject the flooder never reads.
    let flooder = std::thread::spawn(move || {
        let mut burst = Vec::new();
        for session in 0..256u64 {
            let payload = vec![0xEE; 48];
            let mut h = Header::new(FrameKind::Open, session);
            h.length = payload.len() as u32;
            h.crc = transfer_engine::crc32c(&payload);
            Envelope::Control(h, payload).write_to(&mut burst).unwrap();
        }
        let started = Instant::now();
        let mut sent = 0u64;
        while started.elapsed() < Duration::from_secs(20) {
            if flood.write_all(&burst).is_err() {
                return (started.elapsed(), sent);
            }
            sent += 256;
        }
        panic!("the node still took the flood after 20 s ({sent} frames)");
    });
    honest_transfers(&path, &node);
    let (after, frames) = flooder.join().unwrap();
    // The reason is logged once, just after the socket closes; the flood's refusals are counted on a
    // line each run of them (broken only by the honest peer's lines), not a line each.
    let line = wait_for(&node, "took no bytes", Duration::from_secs(5));
    println!("flood of {frames} frames cut after {after:?}: {line}");
    assert!(line.contains("engine 66"), "{line}");
    let refusals: Vec<_> = node
        .log()
        .into_iter()
        .filter(|l| l.contains("malformed open payload"))
        .collect();
    assert!(refusals.len() < 64, "{refusals:#?}");
    let stats = node.stats();
    assert!(
        stats.peers_lost >= 1 && stats.frames_dropped > 0,
        "{stats:?}"
    );
    // Still serving: the honest peer again, restarted (a fresh node of the same engine id).
    honest_transfers(&path, &node);
}

#[test]
fn garbage_lies_and_impostors_are_refused_and_an_honest_peer_is_served() {
    let (node, path) = victim("lies");
    // A unit whose bytes lie at an address the peer does not map: refused, the link kept.
    let (mut liar, answer) = link_as(&path, 70);
    assert!(matches!(answer, Envelope::Admitted), "{answer:?}");
    let mut h = Header::new(FrameKind::Data, 12345);
    h.length = 4096;
    Envelope::Data(h, 0x10).write_to(&mut liar).unwrap();
    Envelope::Seal(h).write_to(&mut liar).unwrap();
    // A seal with no unit before it.
    Envelope::Seal(h).write_to(&mut liar).unwrap();
    wait_for(
        &node,
        "a seal without its data unit",
        Duration::from_secs(5),
    );
    // A GPU grant of nothing: refused with the reason, the link kept (a real one is opened only when a
    // unit of a live session lies in it).
    Envelope::GpuGrant(0x7f00_0000_0000, 0, Box::new([9; 64]))
        .write_to(&mut liar)
        .unwrap();
    wait_for(&node, "a GPU grant of 0 bytes", Duration::from_secs(5));
    // Garbage: the link is lost with the reason.
    liar.write_all(&[0x7F, 0, 0, 0, 0]).unwrap();
    let line = wait_for(&node, "malformed", Duration::from_secs(5));
    assert!(line.contains("engine 70"), "{line}");

    // A second claimant of a linked engine id is refused with the reason.
    let (_first, answer) = link_as(&path, 71);
    assert!(matches!(answer, Envelope::Admitted), "{answer:?}");
    let (_second, answer) = link_as(&path, 71);
    match answer {
        Envelope::Refuse(why) => assert!(why.contains("already connected"), "{why}"),
        other => panic!("an impostor got {other:?}"),
    }
    // A hello whose probe word is not what its process holds.
    let mut stream = UnixStream::connect(&path).unwrap();
    let hello = hello_of(72, (std::ptr::from_ref(&node) as usize as u64, 0xDEAD_BEEF));
    Envelope::Hello(hello.encode())
        .write_to(&mut stream)
        .unwrap();
    match Envelope::read_from(&mut stream).unwrap() {
        Envelope::Refuse(why) => assert!(why.contains("probe word"), "{why}"),
        other => panic!("a liar got {other:?}"),
    }
    honest_transfers(&path, &node);
    assert!(node.stats().refused > 0);
}
