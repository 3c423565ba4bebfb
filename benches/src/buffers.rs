//! Host buffers for the benches: filling a source, a region's length in memory, and the plain memcpy
//! limit a loopback or shm run is measured against.

use std::time::Instant;

use anyhow::Context;
use transfer_engine::{BlockId, KvLayout};

use crate::report::quantile;

/// GB/s of a plain memcpy of every block of `layouts.0` in `src` to the same block of `layouts.1`, chunk
/// by chunk as they lie, between two warmed buffers (median of `iterations`): the limit of the same
/// copies a transfer between those placements makes.
pub(crate) fn placed_memcpy_limit(
    src: &[u8],
    layouts: (KvLayout, KvLayout),
    iterations: usize,
) -> f64 {
    let (from, to) = layouts;
    let mut dst = vec![0u8; to.total_bytes() as usize];
    let copies: Vec<(usize, usize, usize)> = (0..from.layers)
        .flat_map(|layer| (0..from.blocks_per_layer).map(move |b| BlockId::new(layer, b)))
        .flat_map(|id| from.copies_to(id, &to, id))
        .map(|(s, d, len)| (s as usize, d as usize, len as usize))
        .collect();
    let mut seconds = Vec::new();
    for i in 0..=iterations {
        let start = Instant::now();
        for &(s, d, len) in &copies {
            dst[d..d + len].copy_from_slice(&src[s..s + len]);
        }
        std::hint::black_box(&mut dst);
        if i > 0 {
            seconds.push(start.elapsed().as_secs_f64());
        }
    }
    from.kv_bytes() as f64 / quantile(&mut seconds, 0.5) / 1e9
}

/// Bytes of a region of `layout`, as a length in memory.
pub(crate) fn kv_len(layout: KvLayout) -> anyhow::Result<usize> {
    usize::try_from(layout.total_bytes()).context("the layout does not fit in memory")
}

pub(crate) fn fill(bytes: &mut [u8]) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for chunk in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}
