//! Transfer modes and the plan of units both ends derive from a transfer's description.
//!
//! Sender and receiver compute the same plan from the same inputs, so a data frame's `sequence` names its
//! slice exactly and the receiver can check every field of a data header against what it expects.

use std::ops::Range;

use crate::wire::MAX_PAYLOAD;
use crate::{Error, KvLayout};

/// Default slice size of packetized transfers: 64 KiB.
pub const DEFAULT_SLICE_BYTES: u32 = 64 * 1024;
/// Smallest slice allowed: below this, headers eat the link.
pub const MIN_SLICE_BYTES: u32 = 256;
/// Most slices one coalesced data frame may carry (see [`crate::EngineConfig::coalesce_bytes`]): bounds
/// the receiver's check of a frame, whatever a peer claims.
pub const MAX_COALESCED_SLICES: usize = 64;
/// Default smallest contiguous run that auto mode sends exclusive: 1 MiB.
pub const DEFAULT_EXCLUSIVE_MIN_BYTES: u64 = 1 << 20;
/// Largest unit auto mode makes of a contiguous run: 1 MiB. Larger units gain nothing on the wire (drivers
/// batch units into large writes anyway) and cost more to resend and to pipeline.
pub const AUTO_MAX_UNIT_BYTES: u64 = 1 << 20;

/// How a transfer's bytes are cut into units on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferMode {
    /// Each block travels whole, as one unit on a channel reserved for it: simple and predictable.
    Exclusive,
    /// Blocks are cut into slices of at most `slice_bytes`, interleaved with other sessions, reassembled
    /// out of order, each checksummed and acknowledged.
    Packetized {
        /// Largest slice, in bytes.
        slice_bytes: u32,
    },
    /// Runs of blocks contiguous on both sides of at least `exclusive_min_bytes` travel exclusive (whole
    /// blocks, merged up to 1 MiB a unit); the rest is packetized with `slice_bytes` slices.
    Auto {
        /// Largest slice of the packetized part.
        slice_bytes: u32,
        /// Smallest contiguous run sent exclusive.
        exclusive_min_bytes: u64,
    },
}

impl TransferMode {
    /// Packetized with the default 64 KiB slices.
    #[must_use]
    pub fn packetized() -> Self {
        TransferMode::Packetized {
            slice_bytes: DEFAULT_SLICE_BYTES,
        }
    }

    /// Auto with the default 64 KiB slices and 1 MiB exclusive threshold.
    #[must_use]
    pub fn auto() -> Self {
        TransferMode::Auto {
            slice_bytes: DEFAULT_SLICE_BYTES,
            exclusive_min_bytes: DEFAULT_EXCLUSIVE_MIN_BYTES,
        }
    }

    /// Short name: `exclusive`, `packetized` or `auto`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            TransferMode::Exclusive => "exclusive",
            TransferMode::Packetized { .. } => "packetized",
            TransferMode::Auto { .. } => "auto",
        }
    }

    /// Slice size of the packetized part (exclusive mode has none: whole blocks).
    fn slice_bytes(&self) -> u32 {
        match *self {
            TransferMode::Exclusive => MAX_PAYLOAD,
            TransferMode::Packetized { slice_bytes } | TransferMode::Auto { slice_bytes, .. } => {
                slice_bytes
            }
        }
    }

    pub(crate) fn validate(&self, block_bytes: u64) -> Result<(), Error> {
        let slice = match *self {
            TransferMode::Exclusive => None,
            TransferMode::Packetized { slice_bytes } | TransferMode::Auto { slice_bytes, .. } => {
                Some(slice_bytes)
            }
        };
        if let Some(slice) = slice
            && !(MIN_SLICE_BYTES..=MAX_PAYLOAD).contains(&slice)
        {
            return Err(Error::InvalidUnits(format!(
                "slice of {slice} bytes is outside {MIN_SLICE_BYTES}..={MAX_PAYLOAD}"
            )));
        }
        if !matches!(self, TransferMode::Packetized { .. }) && block_bytes > u64::from(MAX_PAYLOAD)
        {
            return Err(Error::InvalidUnits(format!(
                "block of {block_bytes} bytes is larger than the {MAX_PAYLOAD}-byte exclusive unit limit: \
                 use packetized mode"
            )));
        }
        Ok(())
    }
}

/// One unit on the wire, what one data frame carries: a slice of a block (packetized), a whole block
/// (exclusive), or a run of whole contiguous blocks (exclusive, auto). "Slice" names only the first kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unit {
    /// Layer (absolute).
    pub(crate) layer: u32,
    /// Index of the first block in the transfer's block lists.
    pub(crate) first: u32,
    /// Number of blocks the unit touches.
    pub(crate) blocks: u32,
    /// Byte offset within the first block.
    pub(crate) offset: u64,
    /// Bytes.
    pub(crate) len: u32,
    /// Whether the unit travels exclusive (a whole block or run on a reserved channel).
    pub(crate) exclusive: bool,
}

/// What the plan needs to know of both sides' layouts: bytes per block, where a unit must be cut (a
/// chunk boundary on either side), and whether runs of consecutive blocks are contiguous on both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockShape {
    pub(crate) block_bytes: u64,
    /// Logical offsets within a block, sorted, each strictly inside it.
    pub(crate) cuts: Vec<u64>,
    pub(crate) runs: bool,
}

impl BlockShape {
    /// The shape of blocks moving from `src` to `dst` (which hold as many bytes per block).
    pub(crate) fn between(src: &KvLayout, dst: &KvLayout) -> Self {
        Self {
            block_bytes: src.block_bytes,
            cuts: src.cuts_with(dst),
            runs: src.blocks_are_contiguous() && dst.blocks_are_contiguous(),
        }
    }

    /// Contiguous blocks of `block_bytes`, uncut (a layer-major layout on both sides).
    #[cfg(test)]
    pub(crate) fn whole(block_bytes: u64) -> Self {
        Self {
            block_bytes,
            cuts: Vec::new(),
            runs: true,
        }
    }

    /// The block's pieces between cuts, as (offset, length).
    fn pieces(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let ends = self.cuts.iter().copied().chain([self.block_bytes]);
        let starts = [0].into_iter().chain(self.cuts.iter().copied());
        starts.zip(ends).map(|(s, e)| (s, e - s))
    }
}

/// The units of one transfer, layer-major, and the map from blocks to the units that cover them.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) units: Vec<Unit>,
    /// Offsets within a block where units are cut (chunk boundaries): no coalesced frame spans one.
    cuts: Vec<u64>,
    /// First layer transferred.
    pub(crate) layer_start: u32,
    /// Blocks per layer in the transfer.
    pub(crate) blocks_per_layer: u32,
    /// Number of units covering each slot (`slot = (layer - layer_start) * blocks_per_layer + index`).
    pub(crate) units_per_slot: Vec<u32>,
}

impl Plan {
    /// Cuts the blocks `src[i] -> dst[i]` of layers `layers`, of `shape`, into units: none spans a cut,
    /// and runs of several blocks only where blocks are contiguous on both sides.
    pub(crate) fn build(
        shape: &BlockShape,
        layers: Range<u32>,
        src: &[u32],
        dst: &[u32],
        mode: TransferMode,
    ) -> Result<Self, Error> {
        let block_bytes = shape.block_bytes;
        mode.validate(block_bytes)?;
        if src.len() != dst.len() {
            return Err(Error::InvalidBlocks(format!(
                "{} source blocks but {} destination blocks",
                src.len(),
                dst.len()
            )));
        }
        let blocks_per_layer = u32::try_from(src.len())
            .map_err(|_| Error::InvalidBlocks("too many blocks in one transfer".into()))?;
        if blocks_per_layer == 0 || layers.is_empty() {
            return Err(Error::InvalidBlocks(
                "a transfer needs at least one layer and one block".into(),
            ));
        }
        let slots = u64::from(layers.end - layers.start) * u64::from(blocks_per_layer);
        let slots = usize::try_from(slots)
            .map_err(|_| Error::InvalidBlocks("transfer too large".into()))?;
        let mut plan = Plan {
            units: Vec::new(),
            cuts: shape.cuts.clone(),
            layer_start: layers.start,
            blocks_per_layer,
            units_per_slot: vec![0; slots],
        };
        for layer in layers {
            let mut i = 0u32;
            while i < blocks_per_layer {
                let run = match mode {
                    TransferMode::Exclusive => 1,
                    TransferMode::Packetized { .. } => 0,
                    TransferMode::Auto {
                        exclusive_min_bytes,
                        ..
                    } => {
                        let run = if shape.runs {
                            contiguous_run(src, dst, i as usize)
                        } else {
                            1
                        };
                        if u64::from(run) * block_bytes >= exclusive_min_bytes {
                            run
                        } else {
                            0
                        }
                    }
                };
                if run == 0 {
                    for (offset, len) in shape.pieces() {
                        plan.push_slices(layer, i, offset, len, mode.slice_bytes());
                    }
                    i += 1;
                } else if shape.cuts.is_empty() {
                    plan.push_exclusive_run(layer, i, run, block_bytes);
                    i += run;
                } else {
                    // A block in chunks travels whole as one exclusive unit per chunk piece.
                    for (offset, len) in shape.pieces() {
                        plan.push(Unit {
                            layer,
                            first: i,
                            blocks: 1,
                            offset,
                            len: len as u32,
                            exclusive: true,
                        });
                    }
                    i += 1;
                }
            }
        }
        u32::try_from(plan.units.len())
            .map_err(|_| Error::InvalidUnits("more than 2^32 units: use larger slices".into()))?;
        Ok(plan)
    }

    /// Slot index of block `index` of `layer`.
    pub(crate) fn slot(&self, layer: u32, index: u32) -> usize {
        ((layer - self.layer_start) as usize) * self.blocks_per_layer as usize + index as usize
    }

    /// Slots covered by `unit`.
    pub(crate) fn slots(&self, unit: &Unit) -> Range<usize> {
        let first = self.slot(unit.layer, unit.first);
        first..first + unit.blocks as usize
    }

    /// Layer and block index of `slot`.
    pub(crate) fn slot_position(&self, slot: usize) -> (u32, u32) {
        let per = self.blocks_per_layer as usize;
        (self.layer_start + (slot / per) as u32, (slot % per) as u32)
    }

    /// Number of layers.
    pub(crate) fn layers(&self) -> u32 {
        (self.units_per_slot.len() / self.blocks_per_layer as usize) as u32
    }

    /// Slices of at most `slice_bytes` covering bytes `start..start + bytes` of a block.
    fn push_slices(&mut self, layer: u32, index: u32, start: u64, bytes: u64, slice_bytes: u32) {
        let (mut offset, end) = (start, start + bytes);
        while offset < end {
            let len = (end - offset).min(u64::from(slice_bytes)) as u32;
            self.push(Unit {
                layer,
                first: index,
                blocks: 1,
                offset,
                len,
                exclusive: false,
            });
            offset += u64::from(len);
        }
    }

    fn push_exclusive_run(&mut self, layer: u32, first: u32, run: u32, block_bytes: u64) {
        let per_unit = (AUTO_MAX_UNIT_BYTES / block_bytes).clamp(1, u64::from(u32::MAX)) as u32;
        let mut done = 0;
        while done < run {
            let blocks = per_unit.min(run - done);
            let len = (u64::from(blocks) * block_bytes) as u32;
            self.push(Unit {
                layer,
                first: first + done,
                blocks,
                offset: 0,
                len,
                exclusive: true,
            });
            done += blocks;
        }
    }

    /// Whether unit `next` is the slice that follows slice `prev` in the same block: the two can travel
    /// back to back in one coalesced data frame.
    pub(crate) fn follows(&self, prev: usize, next: usize) -> bool {
        let (Some(p), Some(n)) = (self.units.get(prev), self.units.get(next)) else {
            return false;
        };
        !p.exclusive
            && !n.exclusive
            && (p.layer, p.first) == (n.layer, n.first)
            && p.offset + u64::from(p.len) == n.offset
            && !self.cuts.contains(&n.offset)
    }

    /// The lengths of unit `first` and of the slices that follow it in its block, in order, at most
    /// [`MAX_COALESCED_SLICES`] in all: what one data frame starting at `first` may carry. Empty when
    /// there is no unit `first`.
    pub(crate) fn coalescible(&self, first: usize) -> impl Iterator<Item = u32> + '_ {
        let following = (first + 1..self.units.len())
            .take(MAX_COALESCED_SLICES - 1)
            .take_while(move |&i| self.follows(i - 1, i));
        self.units
            .get(first)
            .into_iter()
            .map(|u| u.len)
            .chain(following.map(|i| self.units[i].len))
    }

    /// The units a data frame of `bytes` payload starting at unit `first` carries: one unit of exactly that
    /// length, or a coalesced run of following slices of one block whose lengths add up to it (see
    /// [`Plan::coalescible`]). `None` when no such run exists.
    pub(crate) fn frame_units(&self, first: usize, bytes: u32) -> Option<Range<usize>> {
        let (mut total, mut count) = (0u64, 0);
        for len in self.coalescible(first) {
            if total >= u64::from(bytes) {
                break;
            }
            total += u64::from(len);
            count += 1;
        }
        (count > 0 && total == u64::from(bytes)).then_some(first..first + count)
    }

    fn push(&mut self, unit: Unit) {
        for slot in self.slots(&unit) {
            self.units_per_slot[slot] += 1;
        }
        self.units.push(unit);
    }
}

/// Length of the run starting at `i` whose source and destination ids both go up by one each step.
fn contiguous_run(src: &[u32], dst: &[u32], i: usize) -> u32 {
    let mut n = 1;
    while i + n < src.len()
        && src[i + n - 1].checked_add(1) == Some(src[i + n])
        && dst[i + n - 1].checked_add(1) == Some(dst[i + n])
    {
        n += 1;
    }
    n as u32
}

#[cfg(test)]
mod tests;
