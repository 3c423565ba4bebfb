//! Any datagram handed to an engine with live sessions is refused or handled, never a panic, and never a
//! write outside a registered region. Inputs are mostly "repaired" (magic, version, length and both
//! checksums made valid) so the fuzzer reaches the engine's logic instead of stopping at the checksums.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use transfer_engine::wire::HEADER_LEN;
use transfer_engine::{crc32c, Dtype, Engine, EngineConfig, KvLayout, MemoryRegion, PeerId, TransferRequest};

fn repair(chunk: &[u8]) -> Vec<u8> {
    let mut bytes = chunk.to_vec();
    if bytes.len() < HEADER_LEN || bytes[6] & 1 == 1 {
        return bytes; // left raw: exercises the decoder's refusals
    }
    bytes[0..2].copy_from_slice(&0x4B56u16.to_le_bytes());
    bytes[2] = 1;
    bytes[3] = 1 + bytes[3] % 8;
    let payload_len = (bytes.len() - HEADER_LEN) as u32;
    bytes[32..36].copy_from_slice(&payload_len.to_le_bytes());
    let crc = crc32c(&bytes[HEADER_LEN..]);
    bytes[40..44].copy_from_slice(&crc.to_le_bytes());
    let hcrc = crc32c(&bytes[..44]);
    bytes[44..48].copy_from_slice(&hcrc.to_le_bytes());
    bytes
}

fuzz_target!(|data: &[u8]| {
    let cfg = |id| EngineConfig { engine_id: id, ..EngineConfig::default() };
    let (mut a, mut b) = (Engine::new(cfg(1)), Engine::new(cfg(2)));
    let layout = KvLayout::new(2, 4, 1024, 16, Dtype::F16).unwrap();
    let zeroed = || MemoryRegion::zeroed(layout.total_bytes() as usize);
    let src = a.register_kv_region(layout, zeroed()).unwrap();
    let dst = b.register_kv_region(layout, zeroed()).unwrap();
    let mut now = Instant::now();
    a.submit(now, TransferRequest::whole(PeerId(2), &src, &dst).unwrap()).unwrap();
    for chunk in data.split(|&b| b == 0xFF) {
        let bytes = repair(chunk);
        let _ = b.handle_datagram(now, PeerId(1), &bytes);
        let _ = a.handle_datagram(now, PeerId(2), &bytes);
        while a.poll_transmit(now).is_some() {}
        while b.poll_transmit(now).is_some() {}
        now += Duration::from_millis(7);
        a.handle_timeout(now);
        b.handle_timeout(now);
        while a.poll_event().is_some() || b.poll_event().is_some() {}
    }
});
