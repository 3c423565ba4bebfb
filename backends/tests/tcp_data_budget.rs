//! The Data byte budgets per address (`StrangerLimits::data_bytes_per_sec_per_address`) and per peer
//! (`StrangerLimits::data_bytes_per_sec_per_peer`): an address, or a peer, that floods Data frames is read at
//! its share and no faster, while another address's (or another peer's) transfer, under its own budget,
//! completes at once beside it.

mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use backends::tcp::TcpConfig;
use backends::tcp::handshake::TOKEN_LEN;
use common::tcp_client::{LIMIT, attack_frames, good_client, server_with, transfer_and_check};
use tokio::io::AsyncWriteExt;

/// The share of one address: 8 MB/s (bursts of 1 MiB).
const SHARE: u64 = 8_000_000;
/// What the flooder sends: 24 MiB of 64 KiB Data frames with a bad payload CRC (each is read whole,
/// charged, nacked and dropped; the lane stays).
const FLOOD_FRAMES: usize = 384;

/// What a flood beside an honest transfer showed.
struct Flooded {
    /// How long the honest client's 1 MiB transfer took.
    honest: Duration,
    /// How long the flooder took to write its flood.
    flooding: Duration,
    stats: backends::tcp::NodeStats,
}

/// Floods a server configured by `budget` with Data from engine 66 on address `from`, and times an honest
/// client (engine 9, on 127.0.0.1) beside it.
async fn flood_beside_an_honest_client(
    budget: impl FnOnce(&mut TcpConfig),
    from: IpAddr,
) -> Flooded {
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        budget(&mut cfg);
        cfg
    })
    .await;
    let addr = server.local_addr().unwrap();
    let (mut s, admitted) =
        common::tcp_client::handshake_from(from, addr, 66, [0; TOKEN_LEN], None).await;
    let (dst, _) = admitted.unwrap();
    let (open, data) = attack_frames(dst, 64 << 10);
    s.write_all(&open).await.unwrap();
    let mut flood = Vec::new();
    for frame in data.iter().cycle().take(FLOOD_FRAMES) {
        let mut bad = frame.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xFF;
        flood.extend_from_slice(&bad);
    }
    let flood_bytes = flood.len() as f64;
    let flooder = tokio::spawn(async move {
        let started = Instant::now();
        s.write_all(&flood).await.unwrap();
        (started.elapsed(), s)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (node, src, dst, peer) = good_client(addr, 9).await;
    let started = Instant::now();
    transfer_and_check(&server, &node, (src, dst), peer).await;
    let honest = started.elapsed();
    let (flooding, s) = tokio::time::timeout(LIMIT, flooder).await.unwrap().unwrap();
    let stats = server.stats();
    println!(
        "honest 1 MiB in {honest:?}; flood of {flood_bytes} bytes written in {flooding:?}; {stats:?}"
    );
    drop(s);
    Flooded {
        honest,
        flooding,
        stats,
    }
}

/// The flood was held to its share (at 8 MB/s, 24 MiB take 3.1 s; a burst of 1 MiB and the sockets'
/// buffers, a few MiB, come off that), and the honest client was not held behind it: its budget is its
/// own, so it does not queue behind the flooder's debt (seconds of it).
fn assert_held_to_its_share(f: &Flooded) {
    let Flooded {
        honest,
        flooding,
        stats,
    } = f;
    assert!(
        *flooding >= Duration::from_millis(1200),
        "the flood was written in {flooding:?}: not held to its share"
    );
    assert!(stats.data_frames_throttled > 0, "{stats:?}");
    assert!(stats.engine.checksum_failures > 0, "{stats:?}");
    assert!(
        *honest < Duration::from_secs(1),
        "the honest client took {honest:?} beside the flood"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_flooding_data_is_read_at_its_share_and_another_address_is_not_held_behind_it() {
    let flooded = flood_beside_an_honest_client(
        |cfg| cfg.limits.data_bytes_per_sec_per_address = SHARE,
        IpAddr::from([127, 0, 0, 2]),
    )
    .await;
    assert_held_to_its_share(&flooded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_flooding_data_is_read_at_its_share_and_another_peer_of_its_address_is_not_held_behind_it()
 {
    let flooded = flood_beside_an_honest_client(
        |cfg| cfg.limits.data_bytes_per_sec_per_peer = SHARE,
        IpAddr::from([127, 0, 0, 1]),
    )
    .await;
    assert_held_to_its_share(&flooded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_data_budget_no_reader_waits() {
    let server = server_with({
        let mut cfg = TcpConfig::with_engine_id(2);
        cfg.serving.serve_bytes = 64 << 20;
        cfg
    })
    .await;
    assert_eq!(
        TcpConfig::default().limits.data_bytes_per_sec_per_address,
        0
    );
    assert_eq!(TcpConfig::default().limits.data_bytes_per_sec_per_peer, 0);
    let addr = server.local_addr().unwrap();
    let (node, src, dst, peer) = good_client(addr, 9).await;
    for _ in 0..8 {
        transfer_and_check(&server, &node, (src, dst), peer).await;
    }
    assert_eq!(server.stats().data_frames_throttled, 0);
}
