//! The wire format: a fixed-size, versioned, self-checking header followed by the payload.
//!
//! ```text
//!  0  magic   u16 = 0x4B56 (56 4B)    24  offset    u64  byte offset within the first block (*)
//!  2  version u8  = 3                 32  length    u32  payload bytes that follow
//!  3  kind    u8                      36  sequence  u32  unit index within the session
//!  4  attempt u16 retransmit count    40  crc       u32  CRC-32C of the payload
//!  6  reserved u16 = 0                44  hcrc      u32  CRC-32C of bytes 0..44
//!  8  session u64
//! 16  layer   u32
//! 20  block   u32
//! ```
//! (*) Acks and progress frames carry the consumer-blocked flag here instead, 0 or 1
//! ([`Header::consumer_blocked`]).
//! All integers are little-endian. The header checksum lets a receiver refuse a corrupted header before it
//! places a single payload byte, so a flipped bit in `block` can never steer bytes into the wrong block.
//! Decoding never panics: any byte string gives a header or a [`WireError`].
//!
//! Parts: [`Header`] and [`FrameKind`], whole frames ([`encode_frame`], [`decode_frame`]), the control
//! payloads (open request, ack ranges: crate-internal), every enum's numeric code and the layout's encoding
//! (codes.rs), and [`WireError`]. Drivers that join a [`crate::Transmit`] into one byte string use
//! [`crate::Engine::encode_transmit`]; zero-copy drivers send [`crate::Transmit::seal`]'s header and the
//! region's bytes side by side.

mod codes;
pub(crate) mod control;
mod error;
mod frame;
mod header;
#[cfg(test)]
mod protocol_doc_tests;

pub use error::WireError;
pub use frame::{decode_frame, encode_frame};
pub use header::{FrameKind, HEADER_LEN, Header, MAX_CONTROL_PAYLOAD, MAX_PAYLOAD, VERSION};
