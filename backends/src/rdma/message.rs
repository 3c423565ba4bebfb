//! The messages two RDMA nodes exchange by `fi_send`/`fi_recv` (the payload itself goes by RDMA write).
//!
//! ```text
//! every message   kind u8, version u8, from u32 (the sender's engine id)
//! Hello      1    nonce u64, tag u16, name (u16 len + bytes), segments
//! Welcome    2    nonce u64, tag u16, segments
//! Frame      3    an engine control frame: 48-byte header + payload
//! Data       4    token u32, chunks u32, region u32, offset u64, 48-byte header
//! Ping       5    (nothing): asks a peer this node receives from, silent for a while, to answer
//! Pong       6    (nothing): the answer
//! segments        count u16, then each: name (u16 + bytes), region u32, key u64, len u64,
//!                 layout (u8 0, or 1 + the core's layout encoding: `KvLayout::encode_into`),
//!                 rma_base u64, rkey u64
//! ```
//! Integers are little-endian. `tag` is what the peer must put in the top bits of the CQ data of every
//! write it makes into this node (see [`super::token`]). Decoding never panics.

use transfer_engine::RegionHandle;
use transfer_engine::wire::{HEADER_LEN, Header};

use crate::TransportError;
use crate::codec::{ByteReader, put_bytes, put_named_handle};

/// The version of this message set (2: layouts in the core's encoding, with its dtype codes; 3: ping and
/// pong, which a node expects its senders to answer).
pub(crate) const VERSION: u8 = 4;

/// A region a node offers: what the engine needs to address it, and what the provider needs to write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RdmaSegment {
    /// The name it is published under.
    pub(crate) name: String,
    /// The engine's handle (id, access key, length, layout).
    pub(crate) handle: RegionHandle,
    /// The remote address of its first byte (its virtual address under `FI_MR_VIRT_ADDR`, else 0).
    pub(crate) rma_base: u64,
    /// The provider's key for writes into it.
    pub(crate) rkey: u64,
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    /// Opens a peering: the dialer's address and regions.
    Hello {
        /// Matches the answer to the call.
        nonce: u64,
        /// The tag the answering node must use in writes to the dialer.
        tag: u16,
        /// The dialer's endpoint address.
        name: Vec<u8>,
        /// The dialer's published regions.
        segments: Vec<RdmaSegment>,
    },
    /// Answers a hello.
    Welcome {
        /// The hello's nonce.
        nonce: u64,
        /// The tag the dialer must use in writes to the answering node.
        tag: u16,
        /// The answering node's published regions.
        segments: Vec<RdmaSegment>,
    },
    /// An engine control frame (header and payload, encoded).
    Frame(Vec<u8>),
    /// The header of a data unit whose payload goes by RDMA write with CQ data `token`.
    Data {
        /// The writes' CQ data.
        token: u32,
        /// How many writes carry the payload (each with `token`).
        chunks: u32,
        /// The destination region.
        region: u32,
        /// Where in it the payload lands.
        offset: u64,
        /// The data frame's header (with the payload's CRC-32C).
        header: Header,
    },
    /// Asks the peer to answer: it has sessions to this node and has been silent.
    Ping,
    /// Answers a ping.
    Pong,
}

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const FRAME: u8 = 3;
const DATA: u8 = 4;
const PING: u8 = 5;
const PONG: u8 = 6;

impl Message {
    /// Encodes the message as sent by engine `from`.
    #[must_use]
    pub(crate) fn encode(&self, from: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        let kind = match self {
            Message::Hello { .. } => HELLO,
            Message::Welcome { .. } => WELCOME,
            Message::Frame(_) => FRAME,
            Message::Data { .. } => DATA,
            Message::Ping => PING,
            Message::Pong => PONG,
        };
        out.extend([kind, VERSION]);
        out.extend(from.to_le_bytes());
        match self {
            Message::Hello {
                nonce,
                tag,
                name,
                segments,
            } => {
                out.extend(nonce.to_le_bytes());
                out.extend(tag.to_le_bytes());
                put_bytes(&mut out, name);
                put_segments(&mut out, segments);
            }
            Message::Welcome {
                nonce,
                tag,
                segments,
            } => {
                out.extend(nonce.to_le_bytes());
                out.extend(tag.to_le_bytes());
                put_segments(&mut out, segments);
            }
            Message::Frame(bytes) => out.extend(bytes),
            Message::Data {
                token,
                chunks,
                region,
                offset,
                header,
            } => {
                out.extend(token.to_le_bytes());
                out.extend(chunks.to_le_bytes());
                out.extend(region.to_le_bytes());
                out.extend(offset.to_le_bytes());
                out.extend(header.encode());
            }
            Message::Ping | Message::Pong => {}
        }
        out
    }

    /// Decodes a message: the sender's engine id and the message.
    pub(crate) fn decode(bytes: &[u8]) -> Result<(u32, Message), TransportError> {
        Self::decode_fields(&mut ByteReader::new(bytes, "RDMA message"))
            .map_err(|m| TransportError::protocol("rdma", m))
    }

    fn decode_fields(r: &mut ByteReader<'_>) -> Result<(u32, Message), String> {
        let kind = r.u8()?;
        let version = r.u8()?;
        if version != VERSION {
            return Err(format!(
                "message version {version}, this build speaks {VERSION}: upgrade the older side"
            ));
        }
        let from = r.u32()?;
        let msg = match kind {
            HELLO => Message::Hello {
                nonce: r.u64()?,
                tag: r.u16()?,
                name: r.bytes()?.to_vec(),
                segments: read_segments(r)?,
            },
            WELCOME => Message::Welcome {
                nonce: r.u64()?,
                tag: r.u16()?,
                segments: read_segments(r)?,
            },
            FRAME => Message::Frame(r.take_rest().to_vec()),
            DATA => Message::Data {
                token: r.u32()?,
                chunks: r.u32()?,
                region: r.u32()?,
                offset: r.u64()?,
                header: Header::decode(r.take(HEADER_LEN)?)
                    .map_err(|e| format!("a data header: {e}"))?,
            },
            PING => Message::Ping,
            PONG => Message::Pong,
            other => return Err(format!("unknown message kind {other}")),
        };
        if r.remaining() > 0 {
            return Err(format!("{} bytes beyond the message", r.remaining()));
        }
        Ok((from, msg))
    }
}

fn put_segments(out: &mut Vec<u8>, segments: &[RdmaSegment]) {
    let n = u16::try_from(segments.len()).unwrap_or(u16::MAX);
    out.extend(n.to_le_bytes());
    for s in segments.iter().take(usize::from(n)) {
        put_named_handle(out, &s.name, &s.handle);
        out.extend(s.rma_base.to_le_bytes());
        out.extend(s.rkey.to_le_bytes());
    }
}

fn read_segments(r: &mut ByteReader<'_>) -> Result<Vec<RdmaSegment>, String> {
    let n = r.u16()?;
    let mut out = Vec::new();
    for _ in 0..n {
        let (name, handle) = r.named_handle()?;
        out.push(RdmaSegment {
            name,
            handle,
            rma_base: r.u64()?,
            rkey: r.u64()?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::{AccessKey, Dtype, FrameKind, KvLayout, RegionId};

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let layout = KvLayout::new(2, 4, 4096, 16, Dtype::Bf16).unwrap();
        let seg = RdmaSegment {
            name: "kv".into(),
            handle: RegionHandle {
                id: RegionId(3),
                key: AccessKey(99),
                len: layout.total_bytes(),
                layout: Some(layout),
            },
            rma_base: 0x7000,
            rkey: 42,
        };
        let mut header = Header::new(FrameKind::Data, 7);
        header.length = 4096;
        let msgs = [
            Message::Hello {
                nonce: 5,
                tag: 2,
                name: vec![1, 2, 3],
                segments: vec![seg.clone()],
            },
            Message::Welcome {
                nonce: 5,
                tag: 1,
                segments: vec![seg],
            },
            Message::Frame(vec![9; 60]),
            Message::Data {
                token: 77,
                chunks: 1,
                region: 3,
                offset: 8192,
                header,
            },
            Message::Ping,
            Message::Pong,
        ];
        for m in msgs {
            let bytes = m.encode(11);
            assert_eq!(Message::decode(&bytes).unwrap(), (11, m.clone()));
            for cut in 0..bytes.len() {
                if !matches!(m, Message::Frame(_)) || cut < 6 {
                    assert!(
                        Message::decode(&bytes[..cut]).is_err(),
                        "{m:?} cut at {cut}"
                    );
                }
            }
        }
        assert!(Message::decode(&[9, VERSION, 0, 0, 0, 0]).is_err());
        assert!(Message::decode(&[FRAME, VERSION + 1, 0, 0, 0, 0]).is_err());
    }
}
