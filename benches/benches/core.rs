//! Criterion benches of the core mechanisms, one group each: frame codec, CRC-32C, the session state
//! machine per slice (no payload bytes), and loopback end to end.

use std::time::{Duration, Instant};

use backends::loopback::{CONSUMER, LoopbackPair};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use transfer_engine::wire::{FrameKind, Header, decode_frame, encode_frame};
use transfer_engine::{
    Body, Dtype, Engine, EngineConfig, KvLayout, MemoryRegion, PeerId, Placement, ShapingConfig,
    TokenBucket, TrafficClass, TransferMode, TransferRequest,
};

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame_codec");
    g.throughput(Throughput::Elements(1));
    let mut h = Header::new(FrameKind::Data, 0x1234_5678);
    h.layer = 3;
    h.block = 77;
    h.offset = 65536;
    h.length = 65536;
    h.sequence = 1000;
    g.bench_function("encode_header", |b| {
        b.iter(|| std::hint::black_box(h).encode())
    });
    let bytes = h.encode();
    g.bench_function("decode_header", |b| {
        b.iter(|| Header::decode(std::hint::black_box(&bytes)))
    });
    let frame = encode_frame(&Header::new(FrameKind::Ack, 9), &[0u8; 64]);
    g.bench_function("decode_control_frame", |b| {
        b.iter(|| decode_frame(std::hint::black_box(&frame)))
    });
    g.finish();
}

fn crc(c: &mut Criterion) {
    let mut g = c.benchmark_group("crc32c");
    for size in [4usize << 10, 64 << 10, 4 << 20] {
        let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let mut dst = vec![0u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("checksum", size), &src, |b, s| {
            b.iter(|| transfer_engine::crc32c(s))
        });
        g.bench_with_input(BenchmarkId::new("copy_and_checksum", size), &src, |b, s| {
            b.iter(|| transfer_engine::copy_and_crc32c(&mut dst, s))
        });
        g.bench_with_input(BenchmarkId::new("copy_only", size), &src, |b, s| {
            b.iter(|| dst.copy_from_slice(s))
        });
        // What a copy that checksums block by block adds per block to combine the CRCs.
        g.bench_with_input(BenchmarkId::new("combine", size), &size, |b, &n| {
            b.iter(|| transfer_engine::crc32c_combine(0x1234_5678, 0x9ABC_DEF0, n))
        });
    }
    g.finish();
}

/// Moves every slice of one transfer through both engines' state machines: sender poll, receiver
/// placement and verification (the CRC is taken as given: no payload bytes exist), acks back. With
/// `reverse`, each window of slices reaches the receiver in reverse order (out-of-order reassembly).
fn run_state_machines(slices: u32, reverse: bool) -> u64 {
    let block_bytes = 65536u64;
    let layout = KvLayout::new(1, slices, block_bytes, 16, Dtype::F16).unwrap();
    let cfg = |id| {
        let mut cfg = EngineConfig::default();
        cfg.engine_id = id;
        cfg.window_bytes = u64::MAX;
        cfg
    };
    let (mut a, mut b) = (Engine::new(cfg(1)), Engine::new(cfg(2)));
    let src = a.register_kv_region(layout, zeroed(layout)).unwrap();
    let dst = b.register_kv_region(layout, zeroed(layout)).unwrap();
    let now = Instant::now();
    let req = TransferRequest::whole(PeerId(2), &src, &dst)
        .unwrap()
        .with_mode(TransferMode::Exclusive);
    a.submit(now, req).unwrap();
    let mut moved = 0;
    loop {
        let mut progress = false;
        let mut batch = Vec::new();
        while let Some(t) = a.poll_transmit(now) {
            batch.push(t);
        }
        if reverse {
            batch.reverse();
        }
        for t in batch {
            progress = true;
            match t.body {
                Body::Payload(_) => {
                    moved += 1;
                    if let Ok(Placement::Write { .. }) = b.placement(PeerId(1), &t.header) {
                        let _ = b.handle_data(now, PeerId(1), &t.header, t.header.crc);
                    }
                }
                Body::Control(p) => drop(b.handle_frame(now, PeerId(1), &t.header, &p)),
                Body::Empty => drop(b.handle_frame(now, PeerId(1), &t.header, &[])),
            }
        }
        while let Some(t) = b.poll_transmit(now) {
            progress = true;
            let payload = match t.body {
                Body::Control(p) => p,
                _ => Vec::new(),
            };
            let _ = a.handle_frame(now, PeerId(2), &t.header, &payload);
        }
        while a.poll_event().is_some() || b.poll_event().is_some() {}
        if !progress {
            return moved;
        }
    }
}

fn state_machine(c: &mut Criterion) {
    let mut g = c.benchmark_group("session_state_machine");
    let slices = 16_384;
    g.throughput(Throughput::Elements(u64::from(slices)));
    g.bench_function("slices_through_sender_and_receiver", |b| {
        b.iter(|| assert_eq!(run_state_machines(slices, false), u64::from(slices)))
    });
    g.finish();
    let mut g = c.benchmark_group("reassembly");
    g.throughput(Throughput::Elements(u64::from(slices)));
    g.bench_function("slices_in_reverse_order", |b| {
        b.iter(|| assert_eq!(run_state_machines(slices, true), u64::from(slices)))
    });
    g.finish();
}

fn control(body: &Body) -> Vec<u8> {
    match body {
        Body::Control(p) => p.clone(),
        _ => Vec::new(),
    }
}

fn token_bucket(c: &mut Criterion) {
    let mut g = c.benchmark_group("token_bucket");
    g.throughput(Throughput::Elements(1));
    let mut bucket = TokenBucket::new(25_000_000_000, 16 << 20, 64 << 10).unwrap();
    let mut now = Instant::now();
    g.bench_function("ready_then_charge_64KiB", |b| {
        b.iter(|| {
            if let Some(at) = bucket.ready_at(now) {
                now = at;
            }
            bucket.charge(now, 65536);
        })
    });
    g.finish();
}

/// Eight sessions in three classes under a KV cap: the scheduler picks every slice.
fn scheduler(c: &mut Criterion) {
    let mut g = c.benchmark_group("scheduler");
    let layout = KvLayout::new(1, 256, 65536, 16, Dtype::F16).unwrap();
    let sessions = 8u32;
    g.throughput(Throughput::Elements(u64::from(sessions * 256)));
    g.bench_function("eight_sessions_three_classes_capped", |b| {
        b.iter(|| {
            let mut cfg = EngineConfig::default();
            cfg.engine_id = 1;
            cfg.window_bytes = u64::MAX;
            let mut a = Engine::new(cfg);
            a.set_shaping({
                let mut cfg = ShapingConfig::default();
                cfg.link_bytes_per_sec = Some(25_000_000_000);
                cfg
            })
            .unwrap();
            let mut b = Engine::new({
                let mut cfg = EngineConfig::default();
                cfg.engine_id = 2;
                cfg
            });
            let mut now = Instant::now();
            for i in 0..sessions {
                let src = a.register_kv_region(layout, zeroed(layout)).unwrap();
                let dst = b.register_kv_region(layout, zeroed(layout)).unwrap();
                let class = TrafficClass::ALL[(i % 3) as usize];
                let req = TransferRequest::whole(PeerId(2), &src, &dst)
                    .unwrap()
                    .with_class(class);
                a.submit(now, req.with_mode(TransferMode::packetized()))
                    .unwrap();
            }
            let mut sent = 0;
            while sent < sessions * 256 {
                match a.poll_transmit(now) {
                    Some(t) => {
                        if matches!(t.body, Body::Payload(_)) {
                            sent += 1;
                            if let Ok(Placement::Write { .. }) = b.placement(PeerId(1), &t.header) {
                                let _ = b.handle_data(now, PeerId(1), &t.header, t.header.crc);
                            }
                        } else {
                            let _ = b.handle_frame(now, PeerId(1), &t.header, &control(&t.body));
                        }
                        while let Some(r) = b.poll_transmit(now) {
                            let _ = a.handle_frame(now, PeerId(2), &r.header, &control(&r.body));
                        }
                    }
                    None => {
                        now = a.poll_timeout().map_or(now, |t| t.max(now));
                        a.handle_timeout(now);
                    }
                }
            }
            sent
        })
    });
    g.finish();
}

/// Zeroed host memory for a region of `layout` (allocated lazily by the OS: untouched pages cost nothing).
fn zeroed(layout: KvLayout) -> MemoryRegion {
    MemoryRegion::zeroed(layout.total_bytes() as usize)
}

fn loopback(c: &mut Criterion) {
    let mut g = c.benchmark_group("loopback_end_to_end");
    g.sample_size(10);
    let layout = KvLayout::new(8, 32, 256 << 10, 16, Dtype::Bf16).unwrap();
    let pair = LoopbackPair::with_defaults();
    let src = pair.producer().kv_region(layout).unwrap();
    let dst = pair.consumer().kv_region(layout).unwrap();
    g.throughput(Throughput::Bytes(layout.total_bytes()));
    for mode in [
        TransferMode::Exclusive,
        TransferMode::packetized(),
        TransferMode::auto(),
    ] {
        g.bench_function(mode.name(), |b| {
            b.iter(|| {
                let req = TransferRequest::whole(CONSUMER, &src, &dst)
                    .unwrap()
                    .with_mode(mode);
                pair.transfer(req, Duration::from_secs(60)).unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    codec,
    crc,
    state_machine,
    token_bucket,
    scheduler,
    loopback
);
criterion_main!(benches);
