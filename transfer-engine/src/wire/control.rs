//! Control payloads: the open request and selective acknowledgements.

use std::ops::Range;
use std::time::Duration;

use super::WireError;
use super::codes::{mode_code, mode_from_code};
use crate::{AccessKey, KvLayout, RegionId, TrafficClass, TransferMode};

/// The description of a transfer carried by an open frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpenRequest {
    pub(crate) dst_layout: KvLayout,
    /// The sender's layout: the receiver derives the same plan (where units are cut) from both.
    pub(crate) src_layout: KvLayout,
    pub(crate) dst_region: RegionId,
    pub(crate) dst_key: AccessKey,
    pub(crate) mode: TransferMode,
    pub(crate) class: TrafficClass,
    pub(crate) layers: Range<u32>,
    pub(crate) deadline: Duration,
    pub(crate) src_blocks: Vec<u32>,
    pub(crate) dst_blocks: Vec<u32>,
}

impl OpenRequest {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(180 + 8 * self.src_blocks.len());
        self.dst_layout.encode_into(&mut out);
        self.src_layout.encode_into(&mut out);
        out.extend_from_slice(&self.dst_region.0.to_le_bytes());
        out.extend_from_slice(&self.dst_key.0.to_le_bytes());
        let (slice, min) = match self.mode {
            TransferMode::Exclusive => (0u32, 0u64),
            TransferMode::Packetized { slice_bytes } => (slice_bytes, 0),
            TransferMode::Auto {
                slice_bytes,
                exclusive_min_bytes,
            } => (slice_bytes, exclusive_min_bytes),
        };
        out.push(mode_code(self.mode));
        out.extend_from_slice(&slice.to_le_bytes());
        out.extend_from_slice(&min.to_le_bytes());
        out.push(self.class.code());
        out.extend_from_slice(&self.layers.start.to_le_bytes());
        out.extend_from_slice(&self.layers.end.to_le_bytes());
        out.extend_from_slice(
            &u64::try_from(self.deadline.as_micros())
                .unwrap_or(u64::MAX)
                .to_le_bytes(),
        );
        out.extend_from_slice(&(self.src_blocks.len() as u32).to_le_bytes());
        for b in self.src_blocks.iter().chain(&self.dst_blocks) {
            out.extend_from_slice(&b.to_le_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let bad = WireError::BadControl { what: "open" };
        let mut r = Reader {
            bytes,
            bad: bad.clone(),
        };
        let dst_layout = KvLayout::decode_from(r.bytes).ok_or(bad.clone())?;
        r.bytes = &r.bytes[KvLayout::ENCODED_LEN..];
        let src_layout = KvLayout::decode_from(r.bytes).ok_or(bad.clone())?;
        r.bytes = &r.bytes[KvLayout::ENCODED_LEN..];
        let dst_region = RegionId(r.u32()?);
        let dst_key = AccessKey(r.u64()?);
        let (code, slice_bytes, exclusive_min_bytes) = (r.u8()?, r.u32()?, r.u64()?);
        let mode = mode_from_code(code, slice_bytes, exclusive_min_bytes).ok_or(bad.clone())?;
        let class = TrafficClass::from_code(r.u8()?).ok_or(bad.clone())?;
        let layers = r.u32()?..r.u32()?;
        let deadline = Duration::from_micros(r.u64()?);
        let n = r.u32()? as usize;
        if r.bytes.len() != n.checked_mul(8).ok_or(bad.clone())? {
            return Err(bad);
        }
        let src_blocks = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
        let dst_blocks = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
        Ok(Self {
            dst_layout,
            src_layout,
            dst_region,
            dst_key,
            mode,
            class,
            layers,
            deadline,
            src_blocks,
            dst_blocks,
        })
    }
}

/// Encodes sorted, disjoint ranges of verified unit indices.
pub(crate) fn encode_ranges(ranges: &[Range<u32>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 8 * ranges.len());
    out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
    for r in ranges {
        out.extend_from_slice(&r.start.to_le_bytes());
        out.extend_from_slice(&r.end.to_le_bytes());
    }
    out
}

/// Decodes ack ranges; each must be non-empty.
pub(crate) fn decode_ranges(bytes: &[u8]) -> Result<Vec<Range<u32>>, WireError> {
    let bad = WireError::BadControl { what: "ack" };
    let mut r = Reader {
        bytes,
        bad: bad.clone(),
    };
    let n = r.u32()? as usize;
    if r.bytes.len() != n.checked_mul(8).ok_or(bad.clone())? {
        return Err(bad);
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let range = r.u32()?..r.u32()?;
        if range.is_empty() {
            return Err(bad);
        }
        out.push(range);
    }
    Ok(out)
}

/// Coalesces unit indices into sorted disjoint ranges.
pub(crate) fn to_ranges(indices: &mut [u32]) -> Vec<Range<u32>> {
    indices.sort_unstable();
    let mut out: Vec<Range<u32>> = Vec::new();
    for &i in indices.iter() {
        match out.last_mut() {
            Some(last) if last.end == i => last.end += 1,
            Some(last) if last.end > i => {}
            _ => out.push(i..i + 1),
        }
    }
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    bad: WireError,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or_else(|| self.bad.clone())?;
        self.bytes = rest;
        Ok(*head)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;
    use proptest::prelude::*;

    #[test]
    fn open_round_trips() {
        let open = OpenRequest {
            dst_layout: KvLayout::new(4, 16, 4096, 16, Dtype::Bf16).unwrap(),
            src_layout: KvLayout::new(4, 8, 4096, 16, Dtype::Bf16).unwrap(),
            dst_region: RegionId(3),
            dst_key: AccessKey(99),
            mode: TransferMode::auto(),
            class: TrafficClass::UrgentKv,
            layers: 1..3,
            deadline: Duration::from_millis(250),
            src_blocks: vec![1, 2, 3],
            dst_blocks: vec![7, 8, 9],
        };
        assert_eq!(OpenRequest::decode(&open.encode()), Ok(open.clone()));
        let bytes = open.encode();
        assert!(OpenRequest::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn ranges_coalesce() {
        assert_eq!(to_ranges(&mut [5, 1, 2, 3, 9, 2]), vec![1..4, 5..6, 9..10]);
    }

    proptest! {
        #[test]
        fn control_decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = OpenRequest::decode(&bytes);
            let _ = decode_ranges(&bytes);
        }

        #[test]
        fn ranges_round_trip(mut idx in proptest::collection::vec(0u32..1000, 0..50)) {
            let ranges = to_ranges(&mut idx);
            prop_assert_eq!(decode_ranges(&encode_ranges(&ranges)), Ok(ranges));
        }
    }
}
