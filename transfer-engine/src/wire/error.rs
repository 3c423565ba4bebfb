//! Why bytes are not a valid frame or control payload.

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// An ack or progress frame's consumer-blocked word (bytes 24..32) is neither 0 nor 1.
    #[error("an ack or progress frame's consumer-blocked word is {0}, not 0 or 1")]
    ConsumerFlag(u64),
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
