//! `te-bench run --layout`: the physical KV layouts a run moves between (the same logical blocks placed
//! as serving engines place them), and the block-for-block check of what arrived.

use anyhow::bail;
use clap::ValueEnum;
use transfer_engine::{BlockId, BlockPlacement, ChunkSplit, KvLayout, MemoryRegion};

/// Where the blocks of a run lie on each side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LayoutArg {
    /// Both sides layer-major: layer 0's blocks, then layer 1's (vLLM 0.33's LBNHC), each block one run.
    LayerMajor,
    /// Both sides block-major: a block's pages of every layer together (vLLM 0.33's BLNHC), so blocks of
    /// one layer are a layer count of pages apart.
    BlockMajor,
    /// Both sides K and V apart: per layer, every block's K, then every block's V (older vLLM
    /// FlashAttention), so each (layer, block) is two chunks.
    KvApart,
    /// A layer-major source into a block-major destination (a prefill and a decode laid out differently).
    LayerToBlock,
}

impl LayoutArg {
    /// The name in result rows.
    pub(crate) fn name(self) -> &'static str {
        match self {
            LayoutArg::LayerMajor => "layer-major",
            LayoutArg::BlockMajor => "block-major",
            LayoutArg::KvApart => "kv-apart",
            LayoutArg::LayerToBlock => "layer-to-block",
        }
    }

    /// The source and destination layouts of the blocks of the layer-major `layout`.
    pub(crate) fn place(self, layout: KvLayout) -> anyhow::Result<(KvLayout, KvLayout)> {
        Ok(match self {
            LayoutArg::LayerMajor => (layout, layout),
            LayoutArg::BlockMajor => {
                let b = block_major(layout)?;
                (b, b)
            }
            LayoutArg::KvApart => {
                let a = kv_apart(layout)?;
                (a, a)
            }
            LayoutArg::LayerToBlock => (layout, block_major(layout)?),
        })
    }
}

fn replaced(layout: KvLayout, placement: BlockPlacement) -> anyhow::Result<KvLayout> {
    let l = layout;
    Ok(KvLayout::placed(
        l.layers,
        l.blocks_per_layer,
        l.block_bytes,
        l.tokens_per_block,
        l.dtype,
        l.heads,
        placement,
    )?)
}

fn block_major(layout: KvLayout) -> anyhow::Result<KvLayout> {
    replaced(
        layout,
        BlockPlacement {
            base: 0,
            layer_stride: layout.block_bytes,
            block_stride: layout.block_bytes * u64::from(layout.layers),
            split: None,
        },
    )
}

fn kv_apart(layout: KvLayout) -> anyhow::Result<KvLayout> {
    let half = layout.block_bytes / 2;
    if half == 0 || !half.is_multiple_of(layout.dtype.size()) {
        bail!(
            "--layout kv-apart needs blocks of two whole halves, not {} bytes",
            layout.block_bytes
        );
    }
    let layer = layout.block_bytes * u64::from(layout.blocks_per_layer);
    replaced(
        layout,
        BlockPlacement {
            base: 0,
            layer_stride: layer,
            block_stride: half,
            split: Some(ChunkSplit {
                first_len: half,
                second_offset: layer / 2,
            }),
        },
    )
}

/// Checks that every (layer, block) of `dst` holds the logical bytes of the same (layer, block) of
/// `src`; the error names the first that does not.
pub(crate) fn check_blocks(
    src: &MemoryRegion,
    src_layout: &KvLayout,
    dst: &MemoryRegion,
    dst_layout: &KvLayout,
) -> anyhow::Result<()> {
    for layer in 0..src_layout.layers {
        for block in 0..src_layout.blocks_per_layer {
            let id = BlockId::new(layer, block);
            for (s, d, len) in src_layout.copies_to(id, dst_layout, id) {
                let (s, d, len) = (s as usize, d as usize, len as usize);
                if *src.read(s..s + len)? != *dst.read(d..d + len)? {
                    bail!(
                        "destination differs from source in layer {layer}, block {block}: this is a \
                         bug, please report it"
                    );
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::Dtype;

    #[test]
    fn every_placement_holds_the_same_blocks_in_the_same_bytes() {
        let l = KvLayout::new(4, 8, 4096, 16, Dtype::Bf16).unwrap();
        for arg in LayoutArg::value_variants() {
            let (src, dst) = arg.place(l).unwrap();
            assert_eq!(src.total_bytes(), l.total_bytes(), "{}", arg.name());
            assert_eq!(dst.total_bytes(), l.total_bytes(), "{}", arg.name());
        }
        let a = kv_apart(l).unwrap();
        assert_eq!(
            a.chunks(BlockId::new(1, 2)),
            vec![(32768 + 4096, 2048), (32768 + 16384 + 4096, 2048)]
        );
        assert_eq!(
            block_major(l).unwrap().block_offset(BlockId::new(1, 2)),
            2 * 4 * 4096 + 4096
        );
    }
}
