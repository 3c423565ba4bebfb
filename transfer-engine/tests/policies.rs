//! Mode and class policies decide the requests that name neither (`Engine::with_policies`).

use std::time::Instant;

use transfer_engine::policy::{ClassPolicy, ModePolicy, TransferShape};
use transfer_engine::{
    Body, Channel, Dtype, Engine, EngineConfig, KvLayout, MemoryRegion, PeerId, TrafficClass,
    TransferMode, TransferRequest,
};

/// Exclusive for blocks of 64 KiB and more, packetized below.
struct BySize;

impl ModePolicy for BySize {
    fn choose_mode(&self, shape: &TransferShape) -> TransferMode {
        if shape.block_bytes >= 64 << 10 {
            TransferMode::Exclusive
        } else {
            TransferMode::Packetized { slice_bytes: 4096 }
        }
    }
}

/// Urgent for transfers of one layer, bulk otherwise.
struct ByLayers;

impl ClassPolicy for ByLayers {
    fn choose_class(&self, shape: &TransferShape) -> TrafficClass {
        if shape.layers == 1 {
            TrafficClass::UrgentKv
        } else {
            TrafficClass::BulkKv
        }
    }
}

/// The data transmits of one request from a fresh engine with the policies: (channel, class, payload bytes).
fn data_frames(
    block_bytes: u64,
    layers: std::ops::Range<u32>,
    req_mode: Option<TransferMode>,
) -> Vec<(Channel, TrafficClass, u32)> {
    let now = {
        #[expect(clippy::disallowed_methods, reason = "one real epoch for virtual time")]
        Instant::now()
    };
    let mut engine = Engine::with_policies(
        {
            let mut cfg = EngineConfig::default();
            cfg.engine_id = 1;
            cfg
        },
        Box::new(BySize),
        Box::new(ByLayers),
    );
    let layout = KvLayout::new(2, 4, block_bytes, 16, Dtype::Bf16).unwrap();
    let bytes = layout.total_bytes() as usize;
    let src = engine
        .register_kv_region(layout, MemoryRegion::zeroed(bytes))
        .unwrap();
    // The destination handle as a peer would publish it: same layout, another engine's region.
    let mut other = Engine::new({
        let mut cfg = EngineConfig::default();
        cfg.engine_id = 2;
        cfg
    });
    let dst = other
        .register_kv_region(layout, MemoryRegion::zeroed(bytes))
        .unwrap();
    let mut req = TransferRequest::whole(PeerId(2), &src, &dst).unwrap();
    req.layers = layers;
    req.mode = req_mode;
    engine.submit(now, req).unwrap();
    // Carry frames both ways until both engines are quiet, noting each data frame on its way.
    let mut out = Vec::new();
    loop {
        let mut moved = false;
        while let Some(mut t) = engine.poll_transmit(now) {
            if matches!(t.body, Body::Payload(_)) {
                out.push((t.channel, t.class, t.header.length));
            }
            let bytes = engine.encode_transmit(&mut t).unwrap();
            other.handle_datagram(now, PeerId(1), &bytes).unwrap();
            moved = true;
        }
        while let Some(mut t) = other.poll_transmit(now) {
            let bytes = other.encode_transmit(&mut t).unwrap();
            engine.handle_datagram(now, PeerId(2), &bytes).unwrap();
            moved = true;
        }
        if !moved {
            break;
        }
    }
    out
}

#[test]
fn requests_without_a_mode_or_class_are_decided_by_the_policies() {
    // Large blocks over one layer: exclusive (a unit per block) and urgent.
    let big = data_frames(64 << 10, 0..1, None);
    assert!(!big.is_empty());
    assert!(
        big.iter()
            .all(|&(channel, class, len)| channel == Channel::Exclusive
                && class == TrafficClass::UrgentKv
                && len == 64 << 10),
        "{} frames, first {:?}",
        big.len(),
        big.first()
    );
    // Small blocks over both layers: packetized in 4 KiB slices, bulk.
    let small = data_frames(16 << 10, 0..2, None);
    assert!(!small.is_empty());
    assert!(
        small
            .iter()
            .all(|&(channel, class, len)| channel == Channel::Shared
                && class == TrafficClass::BulkKv
                && len == 4096),
        "{} frames, first {:?}",
        small.len(),
        small.first()
    );
    // A request that names its mode keeps it.
    let named = data_frames(
        64 << 10,
        0..1,
        Some(TransferMode::Packetized { slice_bytes: 8192 }),
    );
    assert!(
        named
            .iter()
            .all(|&(channel, _, len)| channel == Channel::Shared && len == 8192)
    );
}
