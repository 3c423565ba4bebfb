//! One block's record on disk: a 4 KiB header page, then the block's bytes, padded to a whole page.
//!
//! The header names the block (namespace and hash, and its parent's hash), its format (layers, bytes per
//! layer, tokens per block, dtype), a write sequence number, and the CRC-32C of the payload; a CRC-32C of
//! the header itself ends it. A record is written with one write of header and payload together, so a
//! write cut short by a crash leaves a header whose payload CRC (or whose own CRC) fails: it is never
//! served. All integers are little-endian.
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `KVTIER\0\x01` |
//! | 8 | 2 | format version (1) |
//! | 10 | 2 | flags (bit 0: a parent is named) |
//! | 12 | 4 | header bytes covered by the header CRC (`HEADER_BYTES`) |
//! | 16 | 8 | write sequence (grows over the tier's life; the newest record of a key wins) |
//! | 24 | 8 | namespace id |
//! | 32 | 32 | block hash |
//! | 64 | 32 | parent's hash (zero without a parent) |
//! | 96 | 4 | layers |
//! | 100 | 4 | tokens per block |
//! | 104 | 8 | bytes per layer of the block |
//! | 112 | 1 | dtype code (as the wire's) |
//! | 113 | 3 | zero |
//! | 116 | 8 | payload bytes (`layers x bytes per layer`) |
//! | 124 | 4 | payload CRC-32C |
//! | 128 | 4 | header CRC-32C of bytes 0..128 |

use transfer_engine::{Dtype, NamespaceId, crc32c};

use crate::keys::{BlockHash, ScopedKey};

/// Bytes of the page that holds a header (and the alignment of every record and buffer).
pub const PAGE: usize = 4096;
/// Header bytes in use; the rest of its page is zero.
pub(crate) const HEADER_BYTES: usize = 132;
const MAGIC: [u8; 8] = *b"KVTIER\0\x01";
const VERSION: u16 = 1;
const HAS_PARENT: u16 = 1;

/// The shape of every block a tier holds: what a record's payload must match to be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFormat {
    /// Layers in a block.
    pub layers: u32,
    /// Bytes of one layer of a block.
    pub layer_bytes: u64,
    /// Tokens per block.
    pub tokens_per_block: u32,
    /// Element type.
    pub dtype: Dtype,
}

impl BlockFormat {
    /// The format of the blocks of `layout` (every layer of one block, in layer order).
    #[must_use]
    pub fn of(layout: &transfer_engine::KvLayout) -> BlockFormat {
        BlockFormat {
            layers: layout.layers,
            layer_bytes: layout.block_bytes,
            tokens_per_block: layout.tokens_per_block,
            dtype: layout.dtype,
        }
    }

    /// Bytes of one whole block (every layer).
    #[must_use]
    pub fn block_bytes(&self) -> u64 {
        u64::from(self.layers) * self.layer_bytes
    }

    /// Bytes of one record on disk: the header page and the payload rounded up to whole pages.
    #[must_use]
    pub fn record_bytes(&self) -> u64 {
        PAGE as u64 + self.block_bytes().div_ceil(PAGE as u64) * PAGE as u64
    }
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) seq: u64,
    pub(crate) key: ScopedKey,
    pub(crate) parent: Option<BlockHash>,
    pub(crate) format: BlockFormat,
    pub(crate) payload_crc: u32,
}

/// Why a header was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BadHeader {
    /// No record was ever written here (or not one of this format version).
    Empty,
    /// The header's own CRC failed: a torn or corrupted write.
    Corrupt,
}

impl Header {
    /// Writes the header into the first [`HEADER_BYTES`] of `page` (at least that long).
    pub(crate) fn encode(&self, page: &mut [u8]) {
        let h = &mut page[..HEADER_BYTES];
        h.fill(0);
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        let flags = if self.parent.is_some() { HAS_PARENT } else { 0 };
        h[10..12].copy_from_slice(&flags.to_le_bytes());
        h[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
        h[16..24].copy_from_slice(&self.seq.to_le_bytes());
        h[24..32].copy_from_slice(&self.key.ns.0.to_le_bytes());
        h[32..64].copy_from_slice(&self.key.hash.0);
        if let Some(p) = self.parent {
            h[64..96].copy_from_slice(&p.0);
        }
        let f = &self.format;
        h[96..100].copy_from_slice(&f.layers.to_le_bytes());
        h[100..104].copy_from_slice(&f.tokens_per_block.to_le_bytes());
        h[104..112].copy_from_slice(&f.layer_bytes.to_le_bytes());
        h[112] = f.dtype.code();
        h[116..124].copy_from_slice(&f.block_bytes().to_le_bytes());
        h[124..128].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32c(&h[..128]);
        h[128..132].copy_from_slice(&crc.to_le_bytes());
    }

    /// Reads a header from `page`, checking its magic, version and CRC. Never panics on any input.
    pub(crate) fn decode(page: &[u8]) -> Result<Header, BadHeader> {
        let Some(h) = page.get(..HEADER_BYTES) else {
            return Err(BadHeader::Corrupt);
        };
        if h[0..8] != MAGIC || le16(&h[8..10]) != VERSION {
            return Err(if h.iter().all(|&b| b == 0) {
                BadHeader::Empty
            } else {
                BadHeader::Corrupt
            });
        }
        if le32(&h[12..16]) as usize != HEADER_BYTES || le32(&h[128..132]) != crc32c(&h[..128]) {
            return Err(BadHeader::Corrupt);
        }
        let dtype = Dtype::from_code(h[112]).ok_or(BadHeader::Corrupt)?;
        let format = BlockFormat {
            layers: le32(&h[96..100]),
            tokens_per_block: le32(&h[100..104]),
            layer_bytes: le64(&h[104..112]),
            dtype,
        };
        if u64::from(format.layers).checked_mul(format.layer_bytes) != Some(le64(&h[116..124])) {
            return Err(BadHeader::Corrupt);
        }
        let mut hash = [0; 32];
        hash.copy_from_slice(&h[32..64]);
        let parent = (le16(&h[10..12]) & HAS_PARENT != 0).then(|| {
            let mut p = [0; 32];
            p.copy_from_slice(&h[64..96]);
            BlockHash(p)
        });
        Ok(Header {
            seq: le64(&h[16..24]),
            key: ScopedKey {
                ns: NamespaceId(le64(&h[24..32])),
                hash: BlockHash(hash),
            },
            parent,
            format,
            payload_crc: le32(&h[124..128]),
        })
    }
}

fn le16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(parent: Option<BlockHash>) -> Header {
        Header {
            seq: 42,
            key: ScopedKey {
                ns: NamespaceId(0xfeed),
                hash: BlockHash([7; 32]),
            },
            parent,
            format: BlockFormat {
                layers: 32,
                layer_bytes: 65536,
                tokens_per_block: 16,
                dtype: Dtype::Bf16,
            },
            payload_crc: 0xdead_beef,
        }
    }

    #[test]
    fn a_header_round_trips_with_and_without_a_parent() {
        for parent in [None, Some(BlockHash([9; 32]))] {
            let mut page = vec![0xAA; PAGE];
            header(parent).encode(&mut page);
            assert_eq!(Header::decode(&page), Ok(header(parent)));
        }
    }

    #[test]
    fn a_zero_page_is_empty_and_any_flipped_byte_is_corrupt() {
        assert_eq!(Header::decode(&[0; PAGE]), Err(BadHeader::Empty));
        let mut page = vec![0; PAGE];
        header(None).encode(&mut page);
        for at in 0..HEADER_BYTES {
            let mut bad = page.clone();
            bad[at] ^= 0x10;
            assert!(
                Header::decode(&bad).is_err(),
                "byte {at} flipped was accepted"
            );
        }
        assert_eq!(Header::decode(&page[..10]), Err(BadHeader::Corrupt));
    }

    #[test]
    fn a_record_is_a_header_page_and_whole_pages_of_payload() {
        let f = header(None).format;
        assert_eq!(f.block_bytes(), 32 * 65536);
        assert_eq!(f.record_bytes(), 4096 + 32 * 65536);
        let odd = BlockFormat {
            layer_bytes: 100,
            layers: 3,
            ..f
        };
        assert_eq!(odd.record_bytes(), 8192);
    }
}
