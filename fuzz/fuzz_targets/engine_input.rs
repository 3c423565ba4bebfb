//! Any datagram handed to an engine with a live receiving session is refused or handled, never a panic,
//! and never a write outside a registered region.
#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use transfer_engine::{Dtype, Engine, EngineConfig, HostMemory, KvLayout, PeerId};

fuzz_target!(|data: &[u8]| {
    let mut engine = Engine::new(EngineConfig::default());
    let mut memory = HostMemory::default();
    let layout = KvLayout::new(2, 4, 1024, 16, Dtype::F16).unwrap();
    let region = engine.register_kv_region(layout).unwrap();
    memory.alloc(&region).unwrap();
    let now = Instant::now();
    for chunk in data.split(|&b| b == 0xFF) {
        let _ = engine.handle_datagram(now, PeerId(1), chunk, &mut memory);
        while engine.poll_transmit(now).is_some() {}
        engine.handle_timeout(now);
    }
});
