//! Transfers between physically different layouts of the same logical KV (layer- or block-major, padded,
//! K/V in two chunks), in every mode with and without coalesced frames: each logical block arrives
//! byte-identical, checked against a reference that gathers blocks with plain indexing; nothing outside
//! the destination blocks is written; logical mismatches are refused at submit.

mod common;

use std::time::Duration;

use common::{B, Pair, config};
use proptest::prelude::*;
use transfer_engine::{
    BlockId, BlockPlacement, ChunkSplit, Dtype, EngineConfig, Error, KvHeads, KvKind, KvLayout,
    MemoryRegion, TransferMode, TransferRequest,
};

/// A block's logical bytes, gathered from its chunks.
fn gather(layout: &KvLayout, bytes: &[u8], block: BlockId) -> Vec<u8> {
    let mut out = Vec::new();
    for (at, len) in layout.chunks(block) {
        out.extend_from_slice(&bytes[at as usize..(at + len) as usize]);
    }
    out
}

/// How a generated layout places its blocks.
#[derive(Debug, Clone, Copy)]
enum Shape {
    LayerMajor { base: u64, pad: u64, layer_pad: u64 },
    BlockMajor { base: u64, pad: u64 },
    Apart { base: u64, pad: u64, gap: u64 },
}

fn placed(
    layers: u32,
    blocks: u32,
    heads: KvHeads,
    tokens: u32,
    shape: Shape,
) -> Result<KvLayout, Error> {
    let bb = u64::from(heads.kv_heads) * u64::from(heads.head_size) * u64::from(tokens) * 2;
    let (l, b) = (u64::from(layers), u64::from(blocks));
    let (placement, heads) = match shape {
        Shape::LayerMajor {
            base,
            pad,
            layer_pad,
        } => {
            let block_stride = bb + pad;
            let p = BlockPlacement {
                base,
                layer_stride: b * block_stride + layer_pad,
                block_stride,
                split: None,
            };
            (p, heads)
        }
        Shape::BlockMajor { base, pad } => {
            let layer_stride = bb + pad;
            let p = BlockPlacement {
                base,
                layer_stride,
                block_stride: l * layer_stride,
                split: None,
            };
            (p, heads)
        }
        Shape::Apart { base, pad, gap } => {
            let half = bb / 2;
            let block_stride = half + pad;
            let second_offset = b * block_stride + gap;
            let p = BlockPlacement {
                base,
                layer_stride: second_offset + b * block_stride,
                block_stride,
                split: Some(ChunkSplit {
                    first_len: half,
                    second_offset,
                }),
            };
            let heads = KvHeads {
                kind: if heads.kind == KvKind::Bytes {
                    KvKind::Bytes
                } else {
                    KvKind::KvApart
                },
                ..heads
            };
            (p, heads)
        }
    };
    KvLayout::placed(layers, blocks, bb, tokens, Dtype::F16, heads, placement)
}

fn shape() -> impl Strategy<Value = Shape> {
    let pad = prop_oneof![Just(0u64), Just(32), Just(256)];
    prop_oneof![
        (0..3u64, pad.clone(), pad.clone()).prop_map(|(base, pad, layer_pad)| Shape::LayerMajor {
            base: base * 64,
            pad,
            layer_pad
        }),
        (0..3u64, pad.clone()).prop_map(|(base, pad)| Shape::BlockMajor {
            base: base * 64,
            pad
        }),
        (0..3u64, pad.clone(), pad).prop_map(|(base, pad, gap)| Shape::Apart {
            base: base * 64,
            pad,
            gap
        }),
    ]
}

fn mode() -> impl Strategy<Value = TransferMode> {
    prop_oneof![
        Just(TransferMode::Exclusive),
        prop_oneof![Just(256u32), Just(384), Just(1024)]
            .prop_map(|slice_bytes| TransferMode::Packetized { slice_bytes }),
        (prop_oneof![Just(256u32), Just(640)], 0..4u64).prop_map(|(slice_bytes, min)| {
            TransferMode::Auto {
                slice_bytes,
                exclusive_min_bytes: min * 1024,
            }
        }),
    ]
}

fn engine(id: u32, coalesce: bool) -> EngineConfig {
    let mut cfg = config(id);
    cfg.coalesce_bytes = if coalesce { 4096 } else { 0 };
    cfg
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_logical_block_arrives_whatever_either_side_places_it(
        (layers, src_blocks, dst_blocks) in (1..4u32, 2..7u32, 2..7u32),
        (tokens, kv_heads, head_size) in (prop_oneof![Just(4u32), Just(8)], 1..3u32, prop_oneof![Just(16u32), Just(32)]),
        stated in any::<bool>(),
        (src_shape, dst_shape) in (shape(), shape()),
        mode in mode(),
        coalesce in any::<bool>(),
        picks in proptest::collection::vec((0..7u32, 0..7u32), 1..6),
        seed in any::<u64>(),
    ) {
        let heads = KvHeads {
            kv_heads,
            head_size,
            kind: if stated { KvKind::KvTogether } else { KvKind::Bytes },
        };
        let src_layout = placed(layers, src_blocks, heads, tokens, src_shape).unwrap();
        let dst_layout = placed(layers, dst_blocks, heads, tokens, dst_shape).unwrap();
        // Distinct destination blocks, each paired with some source block.
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for (s, d) in picks {
            let (s, d) = (s % src_blocks, d % dst_blocks);
            if !pairs.iter().any(|&(_, other)| other == d) {
                pairs.push((s, d));
            }
        }
        let mut pair = Pair::with_configs(engine(1, coalesce), engine(2, coalesce));
        let mut src_bytes = vec![0; src_layout.total_bytes() as usize];
        common::fill(&mut src_bytes, seed);
        let src = pair.a.register_kv_region(src_layout, MemoryRegion::from_vec(src_bytes.clone())).unwrap();
        let dst = pair.b.register_kv_region(dst_layout, MemoryRegion::zeroed(dst_layout.total_bytes() as usize)).unwrap();
        let req = TransferRequest::blocks(
            B,
            &src,
            pairs.iter().map(|p| p.0).collect(),
            &dst,
            pairs.iter().map(|p| p.1).collect(),
            0..layers,
        )
        .unwrap()
        .with_mode(mode);
        let submitted = pair.a.submit(pair.now, req);
        let apart_vs_together = stated
            && matches!(src_shape, Shape::Apart { .. }) != matches!(dst_shape, Shape::Apart { .. });
        if apart_vs_together {
            let e = submitted.unwrap_err().to_string();
            prop_assert!(e.contains("K/V apart"), "{}", e);
            return Ok(());
        }
        submitted.unwrap();
        pair.run(Duration::from_secs(30));
        prop_assert!(pair.refused_a.is_empty() && pair.refused_b.is_empty(), "{:?} {:?}", pair.refused_a, pair.refused_b);
        let got = pair.bytes_b(dst.id);
        let mut written = vec![false; got.len()];
        for layer in 0..layers {
            for &(s, d) in &pairs {
                let (from, to) = (BlockId::new(layer, s), BlockId::new(layer, d));
                prop_assert_eq!(gather(&src_layout, &src_bytes, from), gather(&dst_layout, &got, to), "layer {} block {} -> {}", layer, s, d);
                for (at, len) in dst_layout.chunks(to) {
                    written[at as usize..(at + len) as usize].fill(true);
                }
            }
        }
        prop_assert!(got.iter().zip(&written).all(|(&b, &w)| w || b == 0), "bytes outside the destination blocks were written");
    }
}

#[test]
fn logical_mismatches_are_refused_at_submit_naming_both_values() {
    let heads = KvHeads {
        kv_heads: 2,
        head_size: 16,
        kind: KvKind::KvTogether,
    };
    let shape = Shape::LayerMajor {
        base: 0,
        pad: 0,
        layer_pad: 0,
    };
    let cases = [
        (
            placed(2, 4, heads, 16, shape),
            placed(2, 4, heads, 32, shape),
            "16",
            "32",
        ),
        (
            placed(2, 4, heads, 16, shape),
            placed(3, 4, heads, 16, shape),
            "2",
            "3",
        ),
        (
            placed(2, 4, heads, 16, shape),
            placed(
                2,
                4,
                KvHeads {
                    kv_heads: 1,
                    head_size: 32,
                    ..heads
                },
                16,
                shape,
            ),
            "2",
            "1",
        ),
    ];
    for (src_layout, dst_layout, local, remote) in cases {
        let (src_layout, dst_layout) = (src_layout.unwrap(), dst_layout.unwrap());
        let mut pair = Pair::new();
        let src = pair
            .a
            .register_kv_region(
                src_layout,
                MemoryRegion::zeroed(src_layout.total_bytes() as usize),
            )
            .unwrap();
        let dst = pair
            .b
            .register_kv_region(
                dst_layout,
                MemoryRegion::zeroed(dst_layout.total_bytes() as usize),
            )
            .unwrap();
        let req = TransferRequest::blocks(B, &src, vec![0], &dst, vec![0], 0..1).unwrap();
        let e = pair.a.submit(pair.now, req).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{local} does not match the peer's {remote}")),
            "{e}"
        );
    }
}
