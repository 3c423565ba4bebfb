//! The lanes' staged path (how GPU regions travel over TCP) run over host memory: with
//! `stage_host_memory`, every payload is copied into a lane's staging buffer and checksummed there before
//! it is sent, and received into one and copied to its region after, exactly as GPU bytes are through
//! pinned buffers. The GPU's own copies are tested by `tests/cuda.rs` on a machine with a GPU.

mod common;

use std::time::Duration;

use backends::tcp::{TcpConfig, TcpNode};
use common::pattern;
use tokio::time::timeout;
use transfer_engine::{Dtype, KvLayout, MemoryRegion, RegionHandle, TransferMode, TransferRequest};

const LIMIT: Duration = Duration::from_secs(60);

fn config(id: u32, staged: bool, stage_bytes: usize) -> TcpConfig {
    let mut cfg = TcpConfig::with_engine_id(id);
    cfg.buffers.stage_host_memory = staged;
    cfg.buffers.stage_bytes = stage_bytes;
    cfg
}

/// A sender and a receiver with a filled source region and an empty destination of `layout`, connected.
async fn pair(
    sender: TcpConfig,
    receiver: TcpConfig,
    layout: KvLayout,
) -> (TcpNode, TcpNode, RegionHandle, RegionHandle, Vec<u8>) {
    let tx = TcpNode::start(sender).await.unwrap();
    let rx = TcpNode::start(receiver).await.unwrap();
    let len = layout.total_bytes() as usize;
    let data = pattern(len, 0x5eed);
    let src = tx
        .register_kv_region(layout, MemoryRegion::from_vec(data.clone()))
        .unwrap();
    let dst = rx.kv_region(layout).unwrap();
    rx.publish_segment("kv", dst).unwrap();
    tx.connect(rx.local_addr().unwrap(), None).await.unwrap();
    (tx, rx, src, dst, data)
}

async fn transfer_and_check(
    tx: &TcpNode,
    rx: &TcpNode,
    src: &RegionHandle,
    dst: &RegionHandle,
    data: &[u8],
    mode: TransferMode,
) {
    rx.memory(dst.id)
        .unwrap()
        .fill_with(|_, b| b.fill(0))
        .unwrap();
    let peer = transfer_engine::PeerId(rx.engine_id().into());
    let req = TransferRequest::whole(peer, src, dst)
        .unwrap()
        .with_mode(mode);
    let out = timeout(LIMIT, tx.transfer(req, LIMIT))
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.recompute.is_empty(),
        "{mode:?}: {out:?}\nsender: {:?}\nreceiver: {:?}",
        tx.log(),
        rx.log()
    );
    let got = rx.memory(dst.id).unwrap().to_vec().unwrap();
    assert!(
        got == data,
        "{mode:?}: the destination differs from the source"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_lanes_move_every_mode_byte_identical_and_count_what_they_staged() {
    // 4 MiB blocks with 1 MiB staging buffers: exclusive units are larger than a buffer (staged a buffer
    // at a time, twice), packetized slices and auto's 1 MiB units fit one (pipelined).
    let layout = KvLayout::new(2, 4, 4 << 20, 16, Dtype::Bf16).unwrap();
    let total = layout.total_bytes();
    let (tx, rx, src, dst, data) =
        pair(config(1, true, 1 << 20), config(2, true, 1 << 20), layout).await;
    let modes = [
        TransferMode::packetized(),
        TransferMode::Packetized {
            slice_bytes: 1 << 20,
        },
        TransferMode::Exclusive,
        TransferMode::auto(),
    ];
    for mode in modes {
        transfer_and_check(&tx, &rx, &src, &dst, &data, mode).await;
    }
    let (sent, received) = (tx.stats(), rx.stats());
    assert!(sent.staging_bytes_held >= 2 << 20 && received.staging_bytes_held >= 2 << 20);
    // Idle lanes let their buffers go.
    let since = std::time::Instant::now();
    while tx.stats().staging_bytes_held + rx.stats().staging_bytes_held > 0 {
        assert!(
            since.elapsed() < LIMIT,
            "idle lanes kept their staging buffers"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Read again once the lanes are idle: a resend queued as the last ack arrived has been written.
    let (sent, received) = (tx.stats(), rx.stats());
    // Every payload byte was staged, and a unit sent again under load (a resend after a late ack)
    // is staged again: the sender's staged bytes are the engine's payload bytes, resends included.
    let moved = total * modes.len() as u64;
    assert_eq!(
        sent.engine.bytes_sent,
        moved + sent.engine.retransmit_bytes,
        "{:?}",
        sent.engine
    );
    assert_eq!(
        sent.staged_bytes_sent, sent.engine.bytes_sent,
        "every payload byte sent was staged"
    );
    // The receiver stages what arrives: every byte once, and a resent unit again if it came.
    assert!(
        (moved..=sent.engine.bytes_sent).contains(&received.staged_bytes_received),
        "received {} staged, {moved} moved, {} sent",
        received.staged_bytes_received,
        sent.engine.bytes_sent
    );
    assert_eq!(received.engine.frames_refused, 0, "{:?}", rx.log());
    assert_eq!(
        sent.lanes_closed_for_bad_frames + received.lanes_closed_for_bad_frames,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_end_and_an_in_place_end_understand_each_other() {
    let layout = KvLayout::new(2, 8, 256 << 10, 16, Dtype::Bf16).unwrap();
    let total = layout.total_bytes();
    for (tx_staged, rx_staged) in [(true, false), (false, true)] {
        let (tx, rx, src, dst, data) = pair(
            config(1, tx_staged, 512 << 10),
            config(2, rx_staged, 512 << 10),
            layout,
        )
        .await;
        for mode in [TransferMode::packetized(), TransferMode::Exclusive] {
            transfer_and_check(&tx, &rx, &src, &dst, &data, mode).await;
        }
        let staged = if tx_staged {
            tx.stats().staged_bytes_sent
        } else {
            rx.stats().staged_bytes_received
        };
        // Every byte once, and again for a unit resent under load.
        let moved = 2 * total;
        let resent = tx.stats().engine.retransmit_bytes;
        assert!(
            (moved..=moved + resent).contains(&staged),
            "sender staged {tx_staged}: {staged} staged, {moved} moved, {resent} resent"
        );
        assert_eq!(
            tx.stats().staged_bytes_received + rx.stats().staged_bytes_sent,
            0
        );
        let unstaged = if tx_staged {
            rx.stats().staged_bytes_received
        } else {
            tx.stats().staged_bytes_sent
        };
        assert_eq!(unstaged, 0, "the other end used its memory in place");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_staging_buffer_is_refused() {
    let err = TcpNode::start(config(1, true, 0)).await.err().unwrap();
    assert!(err.to_string().contains("stage_bytes"), "{err}");
}
