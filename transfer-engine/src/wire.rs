//! The wire format: a fixed-size, versioned, self-checking header followed by the payload.
//!
//! ```text
//!  0  magic   u16 = 0x4B56 (56 4B)    24  offset    u64  byte offset within the first block
//!  2  version u8  = 1                 32  length    u32  payload bytes that follow
//!  3  kind    u8                      36  sequence  u32  slice (unit) index within the session
//!  4  attempt u16 retransmit count    40  crc       u32  CRC-32C of the payload
//!  6  reserved u16 = 0                44  hcrc      u32  CRC-32C of bytes 0..44
//!  8  session u64
//! 16  layer   u32
//! 20  block   u32
//! ```
//! All integers are little-endian. The header checksum lets a receiver refuse a corrupted header before it
//! places a single payload byte, so a flipped bit in `block` can never steer bytes into the wrong block.
//! Decoding never panics: any byte string gives a header or a [`WireError`].

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 48;
/// The protocol version this build speaks.
pub const VERSION: u8 = 1;
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
    /// Sender to receiver: one slice of KV bytes.
    Data,
    /// Receiver to sender: selective acknowledgement (payload: ranges of verified slices).
    Ack,
    /// Receiver to sender: the slice named by `sequence` failed its checksum.
    Nack,
    /// Sender to receiver: the sender is done; whatever has not verified is to be recomputed.
    Close,
    /// Receiver to sender: close received.
    CloseAck,
    /// Receiver to sender: the consumer is about to compute `layer`; `offset` is 1 when it is blocked on it.
    Progress,
}

impl FrameKind {
    fn code(self) -> u8 {
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

    fn from_code(code: u8) -> Option<Self> {
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
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than a header, or than the header says follow.
    #[error("truncated frame: {needed} bytes needed, {got} present")]
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// More bytes than the header says follow.
    #[error("frame has {extra} bytes beyond its declared length")]
    TrailingBytes {
        /// Bytes beyond the declared payload.
        extra: usize,
    },
    /// The frame does not start with the protocol's magic number.
    #[error("not a KV transfer frame (magic {0:#06x}): is the peer speaking this protocol?")]
    BadMagic(u16),
    /// The peer speaks another protocol version.
    #[error(
        "protocol version {got} is not supported (this build speaks {supported}): upgrade the older side"
    )]
    UnsupportedVersion {
        /// The version in the frame.
        got: u8,
        /// The version this build speaks.
        supported: u8,
    },
    /// The header failed its checksum.
    #[error("header checksum mismatch: the frame was corrupted in transit")]
    HeaderChecksum,
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The reserved header bytes (6..8) are not zero.
    #[error(
        "reserved header bytes hold {0:#06x}, not zero: the peer speaks another protocol revision"
    )]
    Reserved(u16),
    /// The declared payload is larger than allowed for its kind.
    #[error("payload of {length} bytes exceeds the limit of {limit} for this frame kind")]
    Oversized {
        /// Declared length.
        length: u32,
        /// The limit.
        limit: u32,
    },
    /// A control payload failed its checksum.
    #[error("control payload checksum mismatch: the frame was corrupted in transit")]
    PayloadChecksum,
    /// A control payload is malformed.
    #[error("malformed {what} payload")]
    BadControl {
        /// Which payload.
        what: &'static str,
    },
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the frame is for.
    pub kind: FrameKind,
    /// How many times this slice was sent before (0 on first transmission).
    pub attempt: u16,
    /// The session.
    pub session: u64,
    /// Layer of the slice (data frames).
    pub layer: u32,
    /// Destination block of the slice's first byte (data frames).
    pub block: u32,
    /// Byte offset of the slice within that block (data frames). Acks and progress frames carry 1 here
    /// when the consumer is blocked on `layer` ([`Header::consumer`] reads it, [`Header::set_consumer`]
    /// writes it).
    pub offset: u64,
    /// Payload bytes following the header.
    pub length: u32,
    /// Slice index within the session (data, nack).
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
        out[24..32].copy_from_slice(&self.offset.to_le_bytes());
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
        let header = Header {
            kind,
            attempt: u16_at(4),
            session: u64_at(8),
            layer: u32_at(16),
            block: u32_at(20),
            offset: u64_at(24),
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
        (self.layer, self.offset == 1)
    }

    /// Acks and progress frames: records the consumer's layer and whether it is blocked on it.
    pub fn set_consumer(&mut self, layer: u32, blocked: bool) {
        self.layer = layer;
        self.offset = u64::from(blocked);
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

/// Decodes one whole frame (header and exactly its payload) from `bytes`.
pub fn decode_frame(bytes: &[u8]) -> Result<(Header, &[u8]), WireError> {
    let header = Header::decode(bytes)?;
    let body = &bytes[HEADER_LEN..];
    let length = header.length as usize;
    if body.len() < length {
        return Err(WireError::Truncated {
            needed: HEADER_LEN + length,
            got: bytes.len(),
        });
    }
    if body.len() > length {
        return Err(WireError::TrailingBytes {
            extra: body.len() - length,
        });
    }
    Ok((header, body))
}

/// Encodes a whole frame: the header with `length` and `crc` set from `payload`, then the payload.
#[must_use]
pub fn encode_frame(header: &Header, payload: &[u8]) -> Vec<u8> {
    let mut header = *header;
    header.length = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    header.crc = crate::crc32c(payload);
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_bytes_must_be_zero() {
        // A CloseAck with reserved = 0xBEEF and a valid header checksum (from issue 13).
        let hex = "564b01080000efbe2a00000000000000000000000000000000000000000000000000000000000000000000001c4b1c1e";
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(Header::decode(&bytes), Err(WireError::Reserved(0xBEEF)));
        // Decode then encode is the identity for every header that decodes.
        let h = Header::new(FrameKind::CloseAck, 42);
        let encoded = h.encode();
        assert_eq!(Header::decode(&encoded).unwrap().encode(), encoded);
    }
    use proptest::prelude::*;

    fn kind() -> impl Strategy<Value = FrameKind> {
        (1u8..=9).prop_map(|c| FrameKind::from_code(c).unwrap())
    }

    fn header() -> impl Strategy<Value = Header> {
        (
            kind(),
            any::<u16>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
        )
            .prop_map(
                |(kind, attempt, session, layer, block, offset, sequence, crc)| Header {
                    kind,
                    attempt,
                    session,
                    layer,
                    block,
                    offset,
                    length: 0,
                    sequence,
                    crc,
                },
            )
    }

    proptest! {
        #[test]
        fn header_round_trips(h in header()) {
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn frame_round_trips(h in header(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut h = h;
            h.kind = FrameKind::Data;
            let bytes = encode_frame(&h, &payload);
            let (got, body) = decode_frame(&bytes).unwrap();
            prop_assert_eq!(body, &payload[..]);
            prop_assert!(got.payload_verifies(body));
            prop_assert_eq!(got.session, h.session);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_frame(&bytes);
        }

        #[test]
        fn any_single_bit_flip_in_a_header_is_caught(h in header(), bit in 0usize..(HEADER_LEN * 8)) {
            let mut bytes = h.encode();
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Header::decode(&bytes).is_err());
        }
    }

    #[test]
    fn bad_inputs_give_clear_errors() {
        let h = Header::new(FrameKind::Data, 1);
        let bytes = encode_frame(&h, b"hello");
        assert!(matches!(
            decode_frame(&bytes[..10]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            decode_frame(&bytes[..50]),
            Err(WireError::Truncated { .. })
        ));
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            decode_frame(&long),
            Err(WireError::TrailingBytes { extra: 1 })
        );
        let mut v2 = bytes.clone();
        v2[2] = 2;
        let err = decode_frame(&v2).unwrap_err();
        assert_eq!(
            err,
            WireError::UnsupportedVersion {
                got: 2,
                supported: 1
            }
        );
        assert!(err.to_string().contains("version 2"));
        let mut magic = bytes;
        magic[0] = 0;
        assert!(matches!(decode_frame(&magic), Err(WireError::BadMagic(_))));
        let mut big = Header::new(FrameKind::Ack, 1);
        big.length = MAX_CONTROL_PAYLOAD + 1;
        assert!(matches!(
            Header::decode(&big.encode()),
            Err(WireError::Oversized { .. })
        ));
    }
}
