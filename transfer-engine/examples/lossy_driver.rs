//! A driver of the sans-IO engine written by hand: two engines in one process, frames carried between
//! them as encoded bytes, and every seventh data frame dropped on the way. The engines' retransmit
//! timers resend what was lost; time is passed in, so the run is the same every time.
//!
//! `cargo run -p transfer-engine --example lossy_driver`

use std::time::{Duration, Instant};

use transfer_engine::{
    Body, Dtype, Engine, EngineConfig, Event, KvLayout, MemoryRegion, PeerId, Role, TransferMode,
    TransferRequest,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let engine = |id| {
        Engine::new({
            let mut cfg = EngineConfig::default();
            cfg.engine_id = id;
            cfg.rng_seed = u64::from(id);
            cfg
        })
    };
    let (mut prefill, mut decode) = (engine(1), engine(2));
    let layout = KvLayout::new(2, 32, 16 << 10, 16, Dtype::Bf16)?; // 2 layers x 32 blocks x 16 KiB
    let kv: Vec<u8> = (0..layout.total_bytes()).map(|i| (i % 251) as u8).collect();
    let src = prefill.register_kv_region(layout, MemoryRegion::from_vec(kv.clone()))?;
    let pool = MemoryRegion::zeroed(kv.len());
    let dst = decode.register_kv_region(layout, pool.clone())?;

    // Virtual time: the driver moves the clock to the engines' next timer when nothing is in flight.
    // An example is a driver: it reads the clock once and passes it in.
    #[allow(clippy::disallowed_methods)]
    let mut now = Instant::now();
    let req = TransferRequest::whole(PeerId(2), &src, &dst)?
        .with_mode(TransferMode::Packetized { slice_bytes: 4096 });
    let session = prefill.submit(now, req)?;
    let (mut data_frames, mut dropped) = (0u64, 0u64);
    loop {
        let mut moved = false;
        while let Some(mut t) = prefill.poll_transmit(now) {
            moved = true;
            let bytes = prefill.encode_transmit(&mut t)?;
            if matches!(t.body, Body::Payload(_)) {
                data_frames += 1;
                if data_frames % 7 == 0 {
                    dropped += 1;
                    continue; // lost on the wire
                }
            }
            decode.handle_datagram(now, PeerId(1), &bytes)?;
        }
        while let Some(t) = decode.poll_transmit(now) {
            moved = true;
            let payload = match &t.body {
                Body::Control(p) => p.clone(),
                _ => Vec::new(),
            };
            prefill.handle_frame(now, PeerId(2), &t.header, &payload)?;
        }
        while let Some(event) = prefill.poll_event() {
            if let Event::Completed {
                session: s,
                role: Role::Sender,
                stats,
            } = event
                && s == session
            {
                println!(
                    "{data_frames} data frames sent, {dropped} dropped, {} retransmits, {} blocks to recompute",
                    stats.retransmits, stats.recompute_blocks
                );
                assert_eq!(pool.read(0..kv.len())?[..], kv[..], "the KV differs");
                return Ok(());
            }
        }
        if !moved {
            let next = [prefill.poll_timeout(), decode.poll_timeout()]
                .into_iter()
                .flatten()
                .min()
                .ok_or("no timer is armed and nothing is in flight")?;
            now = next.max(now + Duration::from_micros(1));
            prefill.handle_timeout(now);
            decode.handle_timeout(now);
        }
    }
}
