//! The frame header: fixed size, versioned, self-checking (layout in the [module docs](super)).

use super::WireError;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 48;
/// The protocol version this build speaks.
pub const VERSION: u8 = 3;
/// Largest payload a frame may carry (1 GiB): an exclusive unit is at most this.
pub const MAX_PAYLOAD: u32 = 1 << 30;
/// Largest control payload (open, ack, reject): 4 MiB.
pub const MAX_CONTROL_PAYLOAD: u32 = 4 << 20;

const MAGIC: u16 = 0x4B56;

/// What a frame is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Sender to receiver: open a session (payload: the transfer's description).
    Open,
    /// Receiver to sender: the session is accepted.
    OpenAck,
    /// Receiver to sender: the session is refused (payload: the reason, UTF-8).
    Reject,
    /// Sender to receiver: one unit of KV bytes (a packetized slice or an exclusive block), or a coalesced
    /// run of following slices of one block (see [`crate::EngineConfig::coalesce_bytes`]).
    Data,
    /// Receiver to sender: selective acknowledgement (payload: ranges of verified units).
    Ack,
    /// Receiver to sender: the unit named by `sequence` failed its checksum.
    Nack,
    /// Sender to receiver: the sender is done; whatever has not verified is to be recomputed.
    Close,
    /// Receiver to sender: close received.
    CloseAck,
    /// Receiver to sender: the consumer is about to compute `layer`, and whether it is blocked on it.
    Progress,
}

impl FrameKind {
    /// Whether frames of this kind travel from the receiver of a session back to its sender.
    #[must_use]
    pub fn is_from_receiver(self) -> bool {
        matches!(
            self,
            FrameKind::OpenAck
                | FrameKind::Reject
                | FrameKind::Ack
                | FrameKind::Nack
                | FrameKind::CloseAck
                | FrameKind::Progress
        )
    }

    /// Whether frames of this kind report the consumer (its layer and whether it is blocked): acks and
    /// progress frames, whose header word at byte 24 is the blocked flag rather than a byte offset.
    #[must_use]
    pub fn reports_consumer(self) -> bool {
        matches!(self, FrameKind::Ack | FrameKind::Progress)
    }
}

/// A decoded frame header.
///
/// The eight bytes at 24 mean one of two things by kind, and each has its own field here: `offset` for
/// every kind but acks and progress frames, `consumer_blocked` (0 or 1 on the wire) for those two.
/// Encoding writes the one the kind uses; decoding fills it and leaves the other zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the frame is for.
    pub kind: FrameKind,
    /// How many times this unit was sent before (0 on first transmission).
    pub attempt: u16,
    /// The session.
    pub session: u64,
    /// Layer of the unit (data frames); the consumer's layer (acks and progress frames).
    pub layer: u32,
    /// Destination block of the unit's first byte (data frames).
    pub block: u32,
    /// Byte offset of the unit within that block (data frames; every kind but acks and progress frames
    /// carries it on the wire).
    pub offset: u64,
    /// Whether the consumer is blocked on `layer`, waiting for its bytes (acks and progress frames only:
    /// see [`FrameKind::reports_consumer`]).
    pub consumer_blocked: bool,
    /// Payload bytes following the header.
    pub length: u32,
    /// Unit index within the session (data: its first unit; nack).
    pub sequence: u32,
    /// CRC-32C of the payload.
    pub crc: u32,
}

impl Header {
    /// A header of `kind` for `session` with every other field zero.
    #[must_use]
    pub fn new(kind: FrameKind, session: u64) -> Self {
        Self {
            kind,
            attempt: 0,
            session,
            layer: 0,
            block: 0,
            offset: 0,
            consumer_blocked: false,
            length: 0,
            sequence: 0,
            crc: 0,
        }
    }

    /// Encodes the header, computing its own checksum.
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        out[2] = VERSION;
        out[3] = self.kind.code();
        out[4..6].copy_from_slice(&self.attempt.to_le_bytes());
        out[8..16].copy_from_slice(&self.session.to_le_bytes());
        out[16..20].copy_from_slice(&self.layer.to_le_bytes());
        out[20..24].copy_from_slice(&self.block.to_le_bytes());
        let word = if self.kind.reports_consumer() {
            u64::from(self.consumer_blocked)
        } else {
            self.offset
        };
        out[24..32].copy_from_slice(&word.to_le_bytes());
        out[32..36].copy_from_slice(&self.length.to_le_bytes());
        out[36..40].copy_from_slice(&self.sequence.to_le_bytes());
        out[40..44].copy_from_slice(&self.crc.to_le_bytes());
        let hcrc = crate::crc32c(&out[..44]);
        out[44..48].copy_from_slice(&hcrc.to_le_bytes());
        out
    }

    /// Decodes the header at the start of `bytes` (which may hold more, such as the payload).
    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let Some(h) = bytes.get(..HEADER_LEN) else {
            return Err(WireError::Truncated {
                needed: HEADER_LEN,
                got: bytes.len(),
            });
        };
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        let magic = u16_at(0);
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if h[2] != VERSION {
            return Err(WireError::UnsupportedVersion {
                got: h[2],
                supported: VERSION,
            });
        }
        if crate::crc32c(&h[..44]) != u32_at(44) {
            return Err(WireError::HeaderChecksum);
        }
        let kind = FrameKind::from_code(h[3]).ok_or(WireError::UnknownKind(h[3]))?;
        if u16_at(6) != 0 {
            return Err(WireError::Reserved(u16_at(6)));
        }
        let word = u64_at(24);
        let (offset, consumer_blocked) = if kind.reports_consumer() {
            match word {
                0 | 1 => (0, word == 1),
                _ => return Err(WireError::ConsumerFlag(word)),
            }
        } else {
            (word, false)
        };
        let header = Header {
            kind,
            attempt: u16_at(4),
            session: u64_at(8),
            layer: u32_at(16),
            block: u32_at(20),
            offset,
            consumer_blocked,
            length: u32_at(32),
            sequence: u32_at(36),
            crc: u32_at(40),
        };
        let limit = header.payload_limit();
        if header.length > limit {
            return Err(WireError::Oversized {
                length: header.length,
                limit,
            });
        }
        Ok(header)
    }

    /// Acks and progress frames: the layer the consumer is about to compute, and whether it is blocked
    /// on it (waiting for that layer's bytes).
    #[must_use]
    pub fn consumer(&self) -> (u32, bool) {
        (self.layer, self.consumer_blocked)
    }

    /// Acks and progress frames: records the consumer's layer and whether it is blocked on it.
    pub fn set_consumer(&mut self, layer: u32, blocked: bool) {
        self.layer = layer;
        self.consumer_blocked = blocked;
    }

    /// Largest payload allowed for this header's kind.
    #[must_use]
    pub fn payload_limit(&self) -> u32 {
        match self.kind {
            FrameKind::Data => MAX_PAYLOAD,
            FrameKind::Open | FrameKind::Ack | FrameKind::Reject => MAX_CONTROL_PAYLOAD,
            FrameKind::OpenAck
            | FrameKind::Nack
            | FrameKind::Close
            | FrameKind::CloseAck
            | FrameKind::Progress => 0,
        }
    }

    /// Whether `payload`'s CRC-32C matches the header's.
    #[must_use]
    pub fn payload_verifies(&self, payload: &[u8]) -> bool {
        crate::crc32c(payload) == self.crc
    }
}
