//! Host buffers for the benches: filling a source, a region's length in memory, and the plain memcpy
//! limit a loopback or shm run is measured against.

use std::time::Instant;

use anyhow::Context;
use transfer_engine::KvLayout;

use crate::report::quantile;

/// GB/s of a plain memcpy of the same blocks between two warmed buffers (median of `iterations`).
pub(crate) fn memcpy_limit(src: &[u8], layout: KvLayout, iterations: usize) -> f64 {
    let mut dst = vec![0u8; src.len()];
    let block = layout.block_bytes as usize;
    let mut seconds = Vec::new();
    for i in 0..=iterations {
        let start = Instant::now();
        for (d, s) in dst.chunks_mut(block).zip(src.chunks(block)) {
            d.copy_from_slice(s);
        }
        std::hint::black_box(&mut dst);
        if i > 0 {
            seconds.push(start.elapsed().as_secs_f64());
        }
    }
    src.len() as f64 / quantile(&mut seconds, 0.5) / 1e9
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
