//! The `data-flood` attacker: a lane under its own engine id that asks for a served region as an honest
//! client would, opens a packetized session into it, and then writes Data frames for that session as fast
//! as the server reads them, each with a payload CRC that fails (so every frame is read whole, checked,
//! refused and dropped, and the session never completes). It never reads what the server answers; a lane
//! the server closes is replaced at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use backends::tcp::Namespace;
use backends::tcp::handshake::{self, Hello};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::timeout;
use transfer_engine::wire::{FrameKind, Header};
use transfer_engine::{
    Body, Engine, EngineConfig, KvLayout, MemoryRegion, PeerId, RegionHandle, TransferMode,
    TransferRequest,
};

use super::attacker::{LIMIT, Tally, connect};

/// The attacker's engine id.
const ENGINE: u32 = 67;
/// Payload of each forged Data frame.
const SLICE: u32 = 64 << 10;

/// The region the attacker asks the server for: 4 MiB, which `te-bench load` adds to the server's
/// `--serve-bytes` when this attacker runs, so no honest client goes without its region.
pub(crate) fn region_layout() -> KvLayout {
    KvLayout::new(4, 4, 256 << 10, 16, transfer_engine::Dtype::Bf16).expect("a valid layout")
}

/// The Open frame and the Data frames (payload CRCs broken) of a session into the server's region `dst`.
fn forge(dst: RegionHandle) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let mut cfg = EngineConfig::default();
    cfg.engine_id = ENGINE;
    let mut engine = Engine::new(cfg);
    let layout = region_layout();
    let src =
        engine.register_kv_region(layout, MemoryRegion::zeroed(layout.total_bytes() as usize))?;
    let now = Instant::now();
    let request = TransferRequest::whole(PeerId(2), &src, &dst)?
        .with_mode(TransferMode::Packetized { slice_bytes: SLICE });
    let session = engine.submit(now, request)?;
    let mut open = Vec::new();
    if let Some(t) = engine.poll_transmit(now)
        && let Body::Control(payload) = &t.body
    {
        open = transfer_engine::wire::encode_frame(&t.header, payload);
    }
    // As if the server had accepted the session: the engine then sends its slices.
    let mut ack = Header::new(FrameKind::OpenAck, session.0);
    ack.crc = transfer_engine::crc32c(&[]);
    engine.handle_frame(now, PeerId(2), &ack, &[])?;
    let mut data = Vec::new();
    while let Some(mut t) = engine.poll_transmit(now) {
        if matches!(t.body, Body::Payload(_)) {
            let mut frame = engine.encode_transmit(&mut t)?;
            let last = frame.len() - 1;
            frame[last] ^= 0xFF;
            data.extend_from_slice(&frame);
        }
    }
    anyhow::ensure!(!open.is_empty() && !data.is_empty(), "no frames to forge");
    Ok((open, data))
}

/// A lane under [`ENGINE`] that was served a region, with the frames to flood it with.
async fn armed_lane(server: SocketAddr) -> anyhow::Result<(TcpStream, Vec<u8>, Vec<u8>)> {
    let mut stream = connect(server).await?;
    let mut hello = Hello::new(ENGINE, Namespace::default())?;
    hello.want = Some(region_layout());
    let accepted = handshake::dial(&mut stream, &hello, None, None, LIMIT).await?;
    let dst = accepted
        .segments
        .first()
        .map(|s| s.handle)
        .ok_or_else(|| anyhow::anyhow!("the server offered no region"))?;
    let (open, data) = forge(dst)?;
    Ok((stream, open, data))
}

/// Floods until `stop`, counting frames written and lanes the server closed.
pub(crate) async fn data_flood(server: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let frames_per_pass = u64::from(region_layout().total_bytes() as u32 / SLICE);
    while !stop.load(Ordering::Relaxed) {
        let (mut stream, open, data) = match armed_lane(server).await {
            Ok(armed) => armed,
            Err(e) => {
                tally.refuse(e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        tally.admitted.fetch_add(1, Ordering::Relaxed);
        if stream.write_all(&open).await.is_err() {
            continue;
        }
        while !stop.load(Ordering::Relaxed) {
            match timeout(Duration::from_millis(200), stream.write_all(&data)).await {
                Ok(Ok(())) => drop(tally.frames.fetch_add(frames_per_pass, Ordering::Relaxed)),
                Ok(Err(_)) => {
                    tally.closed.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                // The server is not reading (a budget is spent, or it is busy): keep pressing.
                Err(_) => {}
            }
        }
    }
}
