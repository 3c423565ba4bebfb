//! What drivers exchange with the engine: peers, sessions, transfer requests and transmits.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use crate::wire::{HEADER_LEN, Header};
use crate::{AccessKey, Error, KvLayout, RegionHandle, RegionId, TrafficClass, TransferMode};

/// A peer engine, as the driver names it (the driver maps it to an address, a connection or a node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId(pub u64);

/// A transfer session, unique across engines with distinct engine ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A request to push KV blocks from a local region into a peer's region.
#[derive(Debug, Clone)]
pub struct TransferRequest {
    /// The receiving engine.
    pub peer: PeerId,
    /// Local region holding the source KV.
    pub src_region: RegionId,
    /// Layout of the source region.
    pub src_layout: KvLayout,
    /// The peer's destination region.
    pub dst_region: RegionId,
    /// The destination region's access key.
    pub dst_key: AccessKey,
    /// Layout of the destination region.
    pub dst_layout: KvLayout,
    /// Layers to move.
    pub layers: Range<u32>,
    /// Source block of each transferred block, within each layer.
    pub src_blocks: Vec<u32>,
    /// Destination block of each transferred block (same length as `src_blocks`).
    pub dst_blocks: Vec<u32>,
    /// Wire mode; `None` lets the engine's mode policy choose.
    pub mode: Option<TransferMode>,
    /// Traffic class; `None` lets the engine's class policy choose.
    pub class: Option<TrafficClass>,
    /// Time allowed before undelivered blocks are handed back for recompute; `None` uses the engine's.
    pub deadline: Option<Duration>,
    /// Layer-wise streaming: keep at most this many layers beyond the one the consumer is computing in
    /// flight (see [`crate::Engine::consume_layer`]); `None` sends every layer as fast as allowed.
    pub prefetch_depth: Option<u32>,
    /// Producer-side streaming: only layers below this one are written so far, so only they are sent;
    /// [`crate::Engine::layers_written`] releases more as the producer computes them (the consumer's load
    /// then overlaps the producer's compute). `None`: every layer is ready.
    pub written_until: Option<u32>,
}

impl TransferRequest {
    /// Moves every block of every layer of `src` into the same place in `dst` on `peer`.
    ///
    /// Both handles must carry a layout (see [`crate::Engine::register_kv_region`]).
    pub fn whole(peer: PeerId, src: &RegionHandle, dst: &RegionHandle) -> Result<Self, Error> {
        let (s, d) = layouts(src, dst, "whole-region")?;
        let blocks: Vec<u32> = (0..s.blocks_per_layer.min(d.blocks_per_layer)).collect();
        let layers = 0..s.layers.min(d.layers);
        Ok(Self::between(
            peer,
            src,
            dst,
            (s, d),
            blocks.clone(),
            blocks,
            layers,
        ))
    }

    /// Moves source blocks `src_blocks` of `src` into destination blocks `dst_blocks` of `dst` on `peer`,
    /// pair by pair (`src_blocks[i]` lands in `dst_blocks[i]`), for every layer in `layers`: the block ids a
    /// serving engine's block tables hand out for one request, which need not be contiguous or in order.
    ///
    /// Both handles must carry a layout. Lists of different lengths, an empty list, a destination block
    /// named twice, a block or layer beyond a layout, are refused here (and again at submit).
    pub fn blocks(
        peer: PeerId,
        src: &RegionHandle,
        src_blocks: Vec<u32>,
        dst: &RegionHandle,
        dst_blocks: Vec<u32>,
        layers: Range<u32>,
    ) -> Result<Self, Error> {
        let both = layouts(src, dst, "block-list")?;
        let req = Self::between(peer, src, dst, both, src_blocks, dst_blocks, layers);
        req.check_blocks()?;
        Ok(req)
    }

    /// A request between two regions with their layouts, with defaults for the rest.
    fn between(
        peer: PeerId,
        src: &RegionHandle,
        dst: &RegionHandle,
        (src_layout, dst_layout): (KvLayout, KvLayout),
        src_blocks: Vec<u32>,
        dst_blocks: Vec<u32>,
        layers: Range<u32>,
    ) -> Self {
        Self {
            peer,
            src_region: src.id,
            src_layout,
            dst_region: dst.id,
            dst_key: dst.key,
            dst_layout,
            layers,
            src_blocks,
            dst_blocks,
            mode: None,
            class: None,
            deadline: None,
            prefetch_depth: None,
            written_until: None,
        }
    }

    /// Checks the block lists and layers against both layouts.
    pub(crate) fn check_blocks(&self) -> Result<(), Error> {
        if self.src_blocks.len() != self.dst_blocks.len() {
            return Err(Error::InvalidBlocks(format!(
                "{} source blocks but {} destination blocks: the lists pair up one to one",
                self.src_blocks.len(),
                self.dst_blocks.len()
            )));
        }
        if self.src_blocks.is_empty() {
            return Err(Error::InvalidBlocks(
                "a transfer needs at least one block".into(),
            ));
        }
        check_blocks(&self.src_layout, &self.layers, &self.src_blocks, "source")?;
        check_blocks(
            &self.dst_layout,
            &self.layers,
            &self.dst_blocks,
            "destination",
        )?;
        check_distinct(&self.dst_blocks)
    }

    /// The same request with `mode`.
    #[must_use]
    pub fn with_mode(mut self, mode: TransferMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// The same request streamed layer by layer, `depth` layers ahead of the consumer.
    #[must_use]
    pub fn with_prefetch_depth(mut self, depth: u32) -> Self {
        self.prefetch_depth = Some(depth);
        self
    }

    /// The same request sent as the producer writes it: layers below `until` are written now; the rest go
    /// out as [`crate::Engine::layers_written`] releases them (the session's deadline still applies).
    #[must_use]
    pub fn with_layers_written(mut self, until: u32) -> Self {
        self.written_until = Some(until);
        self
    }

    /// The same request in traffic class `class`.
    #[must_use]
    pub fn with_class(mut self, class: TrafficClass) -> Self {
        self.class = Some(class);
        self
    }

    /// The same request with `deadline`.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }
}

/// Which channel a transmit should ride: a hint to the driver (the TCP driver sends an exclusive unit on a
/// lane, one connection, it holds for that unit alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Any shared channel; packetized slices and control frames interleave here.
    Shared,
    /// A channel reserved for this unit for the time it takes (exclusive mode).
    Exclusive,
}

/// Where a data transmit's payload lives: `len` bytes at `offset` in local region `region`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadRef {
    /// Local region.
    pub region: RegionId,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
}

impl PayloadRef {
    /// The byte range within the region.
    #[must_use]
    pub fn range(&self) -> Range<usize> {
        let start = self.offset as usize;
        start..start + self.len as usize
    }
}

/// What follows a transmit's header on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Nothing.
    Empty,
    /// A small control payload, already encoded and checksummed into the header.
    Control(Vec<u8>),
    /// KV bytes, read by the driver from a registered region; the driver seals the header with their CRC.
    Payload(PayloadRef),
}

/// One frame the engine asks the driver to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Destination.
    pub peer: PeerId,
    /// The header; for [`Body::Payload`] its `crc` is filled in by [`Transmit::seal`].
    pub header: Header,
    /// What follows the header.
    pub body: Body,
    /// Channel hint.
    pub channel: Channel,
    /// Traffic class, for the driver's shaping.
    pub class: TrafficClass,
}

impl Transmit {
    /// Sets the header's CRC from the payload bytes (read from the region [`Body::Payload`] names) and
    /// returns the encoded header.
    pub fn seal(&mut self, payload: &[u8]) -> [u8; HEADER_LEN] {
        self.header.crc = crate::crc32c(payload);
        self.header.encode()
    }

    /// Bytes this transmit puts on the wire, header included.
    #[must_use]
    pub fn wire_len(&self) -> usize {
        HEADER_LEN + self.header.length as usize
    }
}

/// The layouts both handles carry; `what` names the kind of transfer in the error when one does not.
fn layouts(
    src: &RegionHandle,
    dst: &RegionHandle,
    what: &str,
) -> Result<(KvLayout, KvLayout), Error> {
    match (src.layout, dst.layout) {
        (Some(s), Some(d)) => Ok((s, d)),
        _ => Err(Error::InvalidLayout(format!(
            "{what} transfers need regions registered with a layout"
        ))),
    }
}

/// Checks that `layers` and every block of `blocks` exist in `layout`.
pub(crate) fn check_blocks(
    layout: &KvLayout,
    layers: &Range<u32>,
    blocks: &[u32],
    side: &str,
) -> Result<(), Error> {
    if layers.end > layout.layers || layers.is_empty() {
        return Err(Error::InvalidBlocks(format!(
            "layers {layers:?} are not within the {side} layout's {} layers",
            layout.layers
        )));
    }
    if let Some(b) = blocks.iter().find(|&&b| b >= layout.blocks_per_layer) {
        return Err(Error::InvalidBlocks(format!(
            "{side} block {b} is beyond the layout's {} blocks per layer",
            layout.blocks_per_layer
        )));
    }
    Ok(())
}

/// Checks that no destination block is named twice.
pub(crate) fn check_distinct(dst_blocks: &[u32]) -> Result<(), Error> {
    let mut seen = dst_blocks.to_vec();
    seen.sort_unstable();
    match seen.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(Error::InvalidBlocks(format!(
            "destination block {} is named twice: two source blocks cannot land in one place",
            w[0]
        ))),
        None => Ok(()),
    }
}
