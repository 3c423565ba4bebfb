//! Where a region's KV cache lives: which bytes hold each (layer, block), and what they mean.
//!
//! A [`KvLayout`] has a logical part (layers, blocks, bytes and tokens per block, dtype, heads) that two
//! sides must agree on to exchange KV, and a physical [`BlockPlacement`] that is each side's own business: a
//! base offset, a layer stride, a block stride, and one or two chunks per (layer, block) (K and V side by
//! side, or in separate halves). Serving engines' caches are described from what they report about their
//! tensors (see [`TensorView`]); the layer-major layout of [`KvLayout::new`] is one case.

mod views;

pub use views::TensorView;

use crate::Error;

/// Element type of the KV tensors. Part of the layout: two sides that disagree would misread every byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single precision.
    F32,
    /// 8-bit floating point (E4M3).
    Fp8,
}

impl Dtype {
    /// Bytes per element.
    #[must_use]
    pub fn size(self) -> u64 {
        match self {
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::Fp8 => 1,
        }
    }
}

/// One block of one layer: the unit that is delivered, or handed back for recompute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId {
    /// Layer index.
    pub layer: u32,
    /// Block index within the layer.
    pub block: u32,
}

impl BlockId {
    /// Block `block` of layer `layer`.
    #[must_use]
    pub fn new(layer: u32, block: u32) -> Self {
        Self { layer, block }
    }
}

/// What a block's bytes hold, in which order. Two sides must agree: a byte copy between different
/// orders would scramble the KV (interleaving K and V per head is not something this engine does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvKind {
    /// Not stated: only bytes per block are compared.
    Bytes,
    /// Per token, per KV head, K then V side by side (vLLM 0.33's caches). Each tensor-parallel rank
    /// holds its own heads' shard.
    KvTogether,
    /// Per KV head, per token, K then V side by side (head-major blocks, as vLLM's CPU attention keeps
    /// them): the same values as [`KvKind::KvTogether`] in another order, so the two never pair.
    KvTogetherHeadMajor,
    /// The block's K (per token, per head) in one chunk, its V in another (older vLLM FlashAttention).
    KvApart,
    /// One latent vector per token (multi-head latent attention, as in DeepSeek): the same on every
    /// tensor-parallel rank.
    Mla,
}

impl KvKind {
    /// Wire code (also named in mismatch errors).
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            KvKind::Bytes => 1,
            KvKind::KvTogether => 2,
            KvKind::KvApart => 3,
            KvKind::Mla => 4,
            KvKind::KvTogetherHeadMajor => 5,
        }
    }

    /// The kind of wire code `code`.
    #[must_use]
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => KvKind::Bytes,
            2 => KvKind::KvTogether,
            3 => KvKind::KvApart,
            4 => KvKind::Mla,
            5 => KvKind::KvTogetherHeadMajor,
            _ => return None,
        })
    }
}

/// The heads a block holds, as the serving engine states them ([`KvHeads::UNSTATED`]: not stated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvHeads {
    /// KV heads held here (this rank's shard under tensor parallelism); 0 when not stated.
    pub kv_heads: u32,
    /// Elements per head per token, K and V together (vLLM's `head_size + head_size_v`; the latent
    /// size for MLA).
    pub head_size: u32,
    /// What the block's bytes hold, in which order.
    pub kind: KvKind,
}

impl KvHeads {
    /// Heads not stated (a plain byte layout): only bytes per block are compared.
    pub const UNSTATED: KvHeads = KvHeads {
        kv_heads: 0,
        head_size: 0,
        kind: KvKind::Bytes,
    };
}

/// Where each (layer, block) lives in its region: the block's first chunk starts at
/// `base + layer * layer_stride + block * block_stride`; a second chunk, if any, at `second_offset` past
/// that start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockPlacement {
    /// Offset of layer 0, block 0 in the region.
    pub base: u64,
    /// Bytes from one layer's block to the same block of the next layer.
    pub layer_stride: u64,
    /// Bytes from one block to the next in the same layer.
    pub block_stride: u64,
    /// Two chunks per block (K and V apart): `None` when a block is one contiguous run.
    pub split: Option<ChunkSplit>,
}

/// A block held in two chunks: logical bytes `0..first_len` at the block's start, the rest at
/// `second_offset` past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkSplit {
    /// Bytes of the first chunk (the K half in vLLM's older layout).
    pub first_len: u64,
    /// Where the second chunk starts, from the block's start.
    pub second_offset: u64,
}

/// The KV cache of a region: `layers` x `blocks_per_layer` blocks of `block_bytes` logical bytes each,
/// placed as [`BlockPlacement`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    /// Number of transformer layers.
    pub layers: u32,
    /// Blocks per layer (the size of the block pool, not of one request).
    pub blocks_per_layer: u32,
    /// Bytes of one block of one layer (K and V together, all chunks).
    pub block_bytes: u64,
    /// Tokens per block (vLLM's block size).
    pub tokens_per_block: u32,
    /// Element type.
    pub dtype: Dtype,
    /// The heads a block holds.
    pub heads: KvHeads,
    /// Where each block lives in the region.
    pub placement: BlockPlacement,
}

impl KvLayout {
    /// A layer-major layout, checked: layer 0's blocks, then layer 1's, each `block_bytes` long and
    /// contiguous. Heads are not stated.
    pub fn new(
        layers: u32,
        blocks_per_layer: u32,
        block_bytes: u64,
        tokens_per_block: u32,
        dtype: Dtype,
    ) -> Result<Self, Error> {
        let placement = BlockPlacement {
            base: 0,
            layer_stride: u64::from(blocks_per_layer).saturating_mul(block_bytes),
            block_stride: block_bytes,
            split: None,
        };
        Self::placed(
            layers,
            blocks_per_layer,
            block_bytes,
            tokens_per_block,
            dtype,
            KvHeads::UNSTATED,
            placement,
        )
    }

    /// A layout with any placement and stated heads, checked (see [`KvLayout::validate`]).
    pub fn placed(
        layers: u32,
        blocks_per_layer: u32,
        block_bytes: u64,
        tokens_per_block: u32,
        dtype: Dtype,
        heads: KvHeads,
        placement: BlockPlacement,
    ) -> Result<Self, Error> {
        let layout = Self {
            layers,
            blocks_per_layer,
            block_bytes,
            tokens_per_block,
            dtype,
            heads,
            placement,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// Checks that the layout is usable: non-zero dimensions, whole elements, heads that add up to the
    /// block's bytes, chunks inside the block's span, and no two (layer, block, chunk) ranges overlapping.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::InvalidLayout(what));
        if self.layers == 0 || self.blocks_per_layer == 0 || self.block_bytes == 0 {
            return bad(format!(
                "layout has a zero dimension ({} layers x {} blocks x {} bytes)",
                self.layers, self.blocks_per_layer, self.block_bytes
            ));
        }
        if self.tokens_per_block == 0 {
            return bad("layout has 0 tokens per block".into());
        }
        let elem = self.dtype.size();
        if !self.block_bytes.is_multiple_of(elem) {
            return bad(format!(
                "block of {} bytes is not a whole number of {:?} elements",
                self.block_bytes, self.dtype
            ));
        }
        self.validate_heads()?;
        self.validate_placement()?;
        self.extent()
            .ok_or_else(|| Error::InvalidLayout("layout is larger than 2^64 bytes".into()))?;
        Ok(())
    }

    fn validate_heads(&self) -> Result<(), Error> {
        let h = self.heads;
        if h.kind == KvKind::Bytes {
            return Ok(());
        }
        if (h.kind == KvKind::KvApart) != self.placement.split.is_some() {
            return Err(Error::InvalidLayout(format!(
                "a {:?} layout must be placed in {} per block",
                h.kind,
                if h.kind == KvKind::KvApart {
                    "two chunks"
                } else {
                    "one chunk"
                }
            )));
        }
        if h.kind == KvKind::Mla && h.kv_heads != 1 {
            return Err(Error::InvalidLayout(format!(
                "an MLA layout holds one latent vector per token, not {} heads",
                h.kv_heads
            )));
        }
        let stated = u64::from(h.kv_heads)
            .checked_mul(u64::from(h.head_size))
            .and_then(|n| n.checked_mul(u64::from(self.tokens_per_block)))
            .and_then(|n| n.checked_mul(self.dtype.size()));
        if stated != Some(self.block_bytes) {
            return Err(Error::InvalidLayout(format!(
                "{} heads x {} elements x {} tokens x {} bytes is not the block's {} bytes",
                h.kv_heads,
                h.head_size,
                self.tokens_per_block,
                self.dtype.size(),
                self.block_bytes
            )));
        }
        Ok(())
    }

    fn validate_placement(&self) -> Result<(), Error> {
        let p = self.placement;
        let elem = self.dtype.size();
        // The dimensions of the placement, each (count, stride), must nest without overlap: sorted by
        // stride, each stride reaches past the extent of everything inside it (sufficient, and it holds
        // for every layout engines use).
        let mut dims: Vec<(&str, u64, u64)> = vec![
            ("layer", u64::from(self.layers), p.layer_stride),
            ("block", u64::from(self.blocks_per_layer), p.block_stride),
        ];
        let chunk = match p.split {
            None => self.block_bytes,
            Some(s) => {
                if s.first_len == 0 || s.first_len >= self.block_bytes {
                    return Err(Error::InvalidLayout(format!(
                        "a split block's first chunk of {} bytes must be shorter than the block's {} \
                         bytes and not empty",
                        s.first_len, self.block_bytes
                    )));
                }
                if !s.first_len.is_multiple_of(elem) || !s.second_offset.is_multiple_of(elem) {
                    return Err(Error::InvalidLayout(format!(
                        "chunks of a split block (first {} bytes, second at +{}) must start and end on \
                         whole {:?} elements",
                        s.first_len, s.second_offset, self.dtype
                    )));
                }
                dims.push(("chunk", 2, s.second_offset));
                s.first_len.max(self.block_bytes - s.first_len)
            }
        };
        dims.retain(|&(_, count, _)| count > 1);
        dims.sort_by_key(|&(_, _, stride)| stride);
        let mut spanned = chunk;
        for (name, count, stride) in dims {
            if stride < spanned {
                return Err(Error::InvalidLayout(format!(
                    "the {name} stride of {stride} bytes is shorter than the {spanned} bytes inside it: \
                     (layer, block) ranges would overlap"
                )));
            }
            spanned = stride.saturating_mul(count - 1).saturating_add(spanned);
        }
        Ok(())
    }

    /// Bytes of the region the layout reaches into, from its start: the end of its last chunk. `None`
    /// when that exceeds 2^64.
    #[must_use]
    pub fn extent(&self) -> Option<u64> {
        let p = self.placement;
        let last_end = match p.split {
            None => self.block_bytes,
            Some(s) => s.first_len.max(
                s.second_offset
                    .checked_add(self.block_bytes - s.first_len)?,
            ),
        };
        u64::from(self.layers - 1)
            .checked_mul(p.layer_stride)?
            .checked_add(u64::from(self.blocks_per_layer - 1).checked_mul(p.block_stride)?)?
            .checked_add(p.base)?
            .checked_add(last_end)
    }

    /// Bytes of the region the layout reaches into (see [`KvLayout::extent`]; validated layouts fit).
    #[must_use]
    pub fn total_bytes(&self) -> u64 {
        self.extent().unwrap_or(u64::MAX)
    }

    /// Logical KV bytes of the layout: layers x blocks x bytes per block.
    #[must_use]
    pub fn kv_bytes(&self) -> u64 {
        u64::from(self.layers) * u64::from(self.blocks_per_layer) * self.block_bytes
    }

    /// Whether `block` exists in this layout.
    #[must_use]
    pub fn contains(&self, block: BlockId) -> bool {
        block.layer < self.layers && block.block < self.blocks_per_layer
    }

    /// Byte offset in the region where `block` (which the layout must contain) starts: its first chunk.
    #[must_use]
    pub fn block_offset(&self, block: BlockId) -> u64 {
        let p = self.placement;
        p.base + u64::from(block.layer) * p.layer_stride + u64::from(block.block) * p.block_stride
    }

    /// Logical offset within a block where a unit must be cut, because the block's bytes continue
    /// elsewhere: the end of the first chunk of a split block.
    #[must_use]
    pub fn cut(&self) -> Option<u64> {
        self.placement.split.map(|s| s.first_len)
    }

    /// Where a block moving between this layout and `other` must be cut: both sides' [`KvLayout::cut`],
    /// sorted, each once.
    #[must_use]
    pub fn cuts_with(&self, other: &KvLayout) -> Vec<u64> {
        let mut cuts: Vec<u64> = [self.cut(), other.cut()].into_iter().flatten().collect();
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }

    /// Whether consecutive blocks of a layer follow each other in the region with nothing between them,
    /// so a run of them can travel as one unit.
    #[must_use]
    pub fn blocks_are_contiguous(&self) -> bool {
        self.placement.split.is_none() && self.placement.block_stride == self.block_bytes
    }

    /// Where logical bytes `offset..offset + len` of `block` lie in the region, when they are one
    /// contiguous run: within one chunk, or (where blocks are contiguous) across following blocks of the
    /// same layer. `None` otherwise, or when they run past the layer's last block.
    #[must_use]
    pub fn locate(&self, block: BlockId, offset: u64, len: u64) -> Option<u64> {
        let end = offset.checked_add(len)?;
        let start = self.block_offset(block);
        match self.placement.split {
            None if end <= self.block_bytes => Some(start + offset),
            None if self.blocks_are_contiguous() => {
                let left = u64::from(self.blocks_per_layer - block.block) * self.block_bytes;
                (end <= left).then_some(start + offset)
            }
            None => None,
            Some(s) if end <= s.first_len => Some(start + offset),
            Some(s) if offset >= s.first_len && end <= self.block_bytes => {
                Some(start + s.second_offset + (offset - s.first_len))
            }
            Some(_) => None,
        }
    }

    /// The region ranges of `block`, in logical order, as (offset, length): one or two chunks.
    #[must_use]
    pub fn chunks(&self, block: BlockId) -> Vec<(u64, u64)> {
        let start = self.block_offset(block);
        match self.placement.split {
            None => vec![(start, self.block_bytes)],
            Some(s) => vec![
                (start, s.first_len),
                (start + s.second_offset, self.block_bytes - s.first_len),
            ],
        }
    }

    /// The copies, as (offset in `self`'s region, offset in `dst`'s region, length), that move block
    /// `from` of this layout to block `to` of `dst` (which must hold as many bytes per block): one per
    /// piece of the two sides' chunks.
    #[must_use]
    pub fn copies_to(&self, from: BlockId, dst: &KvLayout, to: BlockId) -> Vec<(u64, u64, u64)> {
        let mut cuts = self.cuts_with(dst);
        cuts.push(self.block_bytes);
        let mut at = 0;
        let mut out = Vec::with_capacity(cuts.len());
        for cut in cuts {
            let len = cut - at;
            if let (Some(s), Some(d)) = (self.locate(from, at, len), dst.locate(to, at, len)) {
                out.push((s, d, len));
            }
            at = cut;
        }
        out
    }

    /// Checks that blocks of `self` can be copied into blocks of `remote` as they are: the same logical
    /// KV (layer count, tokens and bytes per block, dtype, and the heads where both sides state them).
    /// Pool sizes and placements may differ. The error names the field and both values.
    pub fn check_compatible(&self, remote: &KvLayout) -> Result<(), Error> {
        let mismatch = |field, local: u64, remote: u64| {
            (local != remote).then_some(Error::LayoutMismatch {
                field,
                local,
                remote,
            })
        };
        let (h, r) = (self.heads, remote.heads);
        let stated = h.kind != KvKind::Bytes && r.kind != KvKind::Bytes;
        let found = mismatch(
            "block size (tokens per block)",
            u64::from(self.tokens_per_block),
            u64::from(remote.tokens_per_block),
        )
        .or_else(|| mismatch("layer count", self.layers.into(), remote.layers.into()))
        .or_else(|| {
            mismatch(
                "dtype code",
                u64::from(self.dtype.code()),
                u64::from(remote.dtype.code()),
            )
        })
        .or_else(|| {
            stated
                .then(|| {
                    mismatch(
                        "KV arrangement (2 K/V together, 3 K/V apart, 4 MLA, 5 K/V together head-major)",
                        h.kind.code().into(),
                        r.kind.code().into(),
                    )
                    .or_else(|| mismatch("KV heads per rank", h.kv_heads.into(), r.kv_heads.into()))
                    .or_else(|| mismatch("head size", h.head_size.into(), r.head_size.into()))
                })
                .flatten()
        })
        .or_else(|| mismatch("bytes per block", self.block_bytes, remote.block_bytes));
        found.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests;
