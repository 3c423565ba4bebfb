//! Every number this protocol puts on the wire for an enum, in one place, and the layout's encoding.
//!
//! Codes are explicit: reordering or extending an enum never changes what an older peer reads. A code this
//! build does not know decodes to `None` (the caller refuses the frame with a clear error).

use crate::{
    BlockPlacement, ChunkSplit, Dtype, KvHeads, KvKind, KvLayout, TrafficClass, TransferMode,
};

use super::FrameKind;

impl FrameKind {
    pub(crate) fn code(self) -> u8 {
        match self {
            FrameKind::Open => 1,
            FrameKind::OpenAck => 2,
            FrameKind::Reject => 3,
            FrameKind::Data => 4,
            FrameKind::Ack => 5,
            FrameKind::Nack => 6,
            FrameKind::Close => 7,
            FrameKind::CloseAck => 8,
            FrameKind::Progress => 9,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => FrameKind::Open,
            2 => FrameKind::OpenAck,
            3 => FrameKind::Reject,
            4 => FrameKind::Data,
            5 => FrameKind::Ack,
            6 => FrameKind::Nack,
            7 => FrameKind::Close,
            8 => FrameKind::CloseAck,
            9 => FrameKind::Progress,
            _ => return None,
        })
    }
}

impl Dtype {
    /// Wire code of this dtype.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Dtype::F16 => 1,
            Dtype::Bf16 => 2,
            Dtype::F32 => 3,
            Dtype::Fp8 => 4,
        }
    }

    /// The dtype with this wire code, if any.
    #[must_use]
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Dtype::F16,
            2 => Dtype::Bf16,
            3 => Dtype::F32,
            4 => Dtype::Fp8,
            _ => return None,
        })
    }
}

impl TrafficClass {
    /// Wire code of this class (explicit: reordering the enum never changes the wire).
    pub(crate) fn code(self) -> u8 {
        match self {
            TrafficClass::Collective => 0,
            TrafficClass::UrgentKv => 1,
            TrafficClass::BulkKv => 2,
        }
    }

    /// The class with this wire code, if any.
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => TrafficClass::Collective,
            1 => TrafficClass::UrgentKv,
            2 => TrafficClass::BulkKv,
            _ => return None,
        })
    }
}

/// Wire code of a transfer mode (the open request carries it with the mode's parameters).
pub(crate) fn mode_code(mode: TransferMode) -> u8 {
    match mode {
        TransferMode::Exclusive => 1,
        TransferMode::Packetized { .. } => 2,
        TransferMode::Auto { .. } => 3,
    }
}

/// The transfer mode with wire code `code` and its parameters, if the code is known.
pub(crate) fn mode_from_code(
    code: u8,
    slice_bytes: u32,
    exclusive_min_bytes: u64,
) -> Option<TransferMode> {
    Some(match code {
        1 => TransferMode::Exclusive,
        2 => TransferMode::Packetized { slice_bytes },
        3 => TransferMode::Auto {
            slice_bytes,
            exclusive_min_bytes,
        },
        _ => return None,
    })
}

impl KvLayout {
    /// Bytes of a layout on the wire, all little-endian: layers u32, blocks per layer u32, block bytes
    /// u64, tokens per block u32, dtype code u8, KV kind code u8, KV heads u32, head size u32, base u64,
    /// layer stride u64, block stride u64, first chunk's length u64 (0: one chunk), second chunk's offset
    /// u64. The open request, the lane handshake and the RDMA and discovery records use it.
    pub const ENCODED_LEN: usize = 70;

    /// Appends the layout's wire encoding to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let p = self.placement;
        let (first_len, second_offset) = p.split.map_or((0, 0), |s| (s.first_len, s.second_offset));
        out.extend_from_slice(&self.layers.to_le_bytes());
        out.extend_from_slice(&self.blocks_per_layer.to_le_bytes());
        out.extend_from_slice(&self.block_bytes.to_le_bytes());
        out.extend_from_slice(&self.tokens_per_block.to_le_bytes());
        out.push(self.dtype.code());
        out.push(self.heads.kind.code());
        out.extend_from_slice(&self.heads.kv_heads.to_le_bytes());
        out.extend_from_slice(&self.heads.head_size.to_le_bytes());
        for v in [
            p.base,
            p.layer_stride,
            p.block_stride,
            first_len,
            second_offset,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// Decodes a layout from the first [`KvLayout::ENCODED_LEN`] bytes of `bytes` (not validated: call
    /// [`KvLayout::validate`]); `None` if they are too few or a code is unknown.
    #[must_use]
    pub fn decode_from(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..Self::ENCODED_LEN)?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        let first_len = u64_at(54);
        Some(Self {
            layers: u32_at(0),
            blocks_per_layer: u32_at(4),
            block_bytes: u64_at(8),
            tokens_per_block: u32_at(16),
            dtype: Dtype::from_code(b[20])?,
            heads: KvHeads {
                kind: KvKind::from_code(b[21])?,
                kv_heads: u32_at(22),
                head_size: u32_at(26),
            },
            placement: BlockPlacement {
                base: u64_at(30),
                layer_stride: u64_at(38),
                block_stride: u64_at(46),
                split: (first_len > 0).then(|| ChunkSplit {
                    first_len,
                    second_offset: u64_at(62),
                }),
            },
        })
    }
}
