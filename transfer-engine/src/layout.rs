//! How a request's KV cache is laid out in memory: layers x blocks x bytes, layer-major.

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

/// The KV cache of a region: `layers` x `blocks_per_layer` blocks of `block_bytes` each, layer-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    /// Number of transformer layers.
    pub layers: u32,
    /// Blocks per layer (the size of the block pool, not of one request).
    pub blocks_per_layer: u32,
    /// Bytes of one block of one layer (K and V together).
    pub block_bytes: u64,
    /// Tokens per block (vLLM's block size, 16 by default).
    pub tokens_per_block: u32,
    /// Element type.
    pub dtype: Dtype,
}

impl KvLayout {
    /// A layout, checked: every dimension must be non-zero and the total must fit in 64 bits.
    pub fn new(
        layers: u32,
        blocks_per_layer: u32,
        block_bytes: u64,
        tokens_per_block: u32,
        dtype: Dtype,
    ) -> Result<Self, Error> {
        let layout = Self {
            layers,
            blocks_per_layer,
            block_bytes,
            tokens_per_block,
            dtype,
        };
        layout.validate()?;
        Ok(layout)
    }

    /// Checks that the layout is usable.
    pub fn validate(&self) -> Result<(), Error> {
        if self.layers == 0 || self.blocks_per_layer == 0 || self.block_bytes == 0 {
            return Err(Error::InvalidRequest(format!(
                "layout has a zero dimension ({} layers x {} blocks x {} bytes)",
                self.layers, self.blocks_per_layer, self.block_bytes
            )));
        }
        if self.tokens_per_block == 0 {
            return Err(Error::InvalidRequest(
                "layout has 0 tokens per block".into(),
            ));
        }
        if !self.block_bytes.is_multiple_of(self.dtype.size()) {
            return Err(Error::InvalidRequest(format!(
                "block of {} bytes is not a whole number of {:?} elements",
                self.block_bytes, self.dtype
            )));
        }
        u64::from(self.layers)
            .checked_mul(u64::from(self.blocks_per_layer))
            .and_then(|n| n.checked_mul(self.block_bytes))
            .ok_or_else(|| Error::InvalidRequest("layout is larger than 2^64 bytes".into()))?;
        Ok(())
    }

    /// Total bytes of the layout.
    #[must_use]
    pub fn total_bytes(&self) -> u64 {
        u64::from(self.layers) * u64::from(self.blocks_per_layer) * self.block_bytes
    }

    /// Whether `block` exists in this layout.
    #[must_use]
    pub fn contains(&self, block: BlockId) -> bool {
        block.layer < self.layers && block.block < self.blocks_per_layer
    }

    /// Byte offset of `block` from the start of the layout (which must contain it).
    #[must_use]
    pub fn block_offset(&self, block: BlockId) -> u64 {
        (u64::from(block.layer) * u64::from(self.blocks_per_layer) + u64::from(block.block))
            * self.block_bytes
    }

    /// Checks that blocks of `self` can be copied into blocks of `remote` as they are: same block size,
    /// same bytes per block, same dtype. Pool sizes and layer counts may differ.
    pub fn check_compatible(&self, remote: &KvLayout) -> Result<(), Error> {
        let mismatch = |field, local: u64, remote: u64| {
            (local != remote).then_some(Error::LayoutMismatch {
                field,
                local,
                remote,
            })
        };
        let found = mismatch(
            "block size (tokens per block)",
            u64::from(self.tokens_per_block),
            u64::from(remote.tokens_per_block),
        )
        .or_else(|| mismatch("bytes per block", self.block_bytes, remote.block_bytes))
        .or_else(|| {
            mismatch(
                "dtype code",
                u64::from(self.dtype.code()),
                u64::from(remote.dtype.code()),
            )
        });
        found.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_codec_round_trips_and_refuses_short_or_unknown_input() {
        let l = KvLayout::new(32, 128, 256 << 10, 16, Dtype::Fp8).unwrap();
        let mut out = vec![9];
        l.encode_into(&mut out);
        assert_eq!(out.len(), 1 + KvLayout::ENCODED_LEN);
        assert_eq!(KvLayout::decode_from(&out[1..]), Some(l));
        assert_eq!(KvLayout::decode_from(&out[1..KvLayout::ENCODED_LEN]), None);
        out[KvLayout::ENCODED_LEN] = 99;
        assert_eq!(KvLayout::decode_from(&out[1..]), None, "unknown dtype code");
    }

    fn layout(tokens: u32, bytes: u64) -> KvLayout {
        KvLayout::new(2, 8, bytes, tokens, Dtype::F16).unwrap()
    }

    #[test]
    fn offsets_are_layer_major() {
        let l = layout(16, 1024);
        assert_eq!(l.block_offset(BlockId::new(0, 3)), 3 * 1024);
        assert_eq!(l.block_offset(BlockId::new(1, 0)), 8 * 1024);
        assert_eq!(l.total_bytes(), 16 * 1024);
        assert!(!l.contains(BlockId::new(2, 0)));
        assert!(!l.contains(BlockId::new(0, 8)));
    }

    #[test]
    fn mismatched_block_size_names_both_values() {
        let err = layout(32, 1024)
            .check_compatible(&layout(16, 1024))
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("32") && text.contains("16"), "{text}");
        assert!(text.contains("tokens per block"), "{text}");
    }

    #[test]
    fn zero_dimensions_are_refused() {
        assert!(KvLayout::new(0, 8, 1024, 16, Dtype::F16).is_err());
        assert!(KvLayout::new(1, 8, 1023, 16, Dtype::F16).is_err());
        assert!(KvLayout::new(u32::MAX, u32::MAX, u64::MAX / 2, 16, Dtype::Fp8).is_err());
    }
}
