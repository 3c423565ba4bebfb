//! Double-buffered staging, for bytes a backend cannot send or receive in place (GPU memory on TCP): the
//! device copy of one unit overlaps the socket send (or receive) of the other, and CRC-32C is taken on the
//! host copy.
//!
//! The stager's ordering is the same whatever the buffers are: `cuda::PinnedSlot` (feature
//! `cuda`) stages GPU memory through pinned buffers on a CUDA stream; [`HostSlot`] stages host memory
//! through ordinary buffers, which lets the staged path of a backend run, and be measured, on a machine
//! without a GPU.

mod host;

use std::collections::VecDeque;
use std::ops::Range;

use transfer_engine::MemoryRegion;

pub use host::HostSlot;

/// What went wrong while staging.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StagingError {
    /// A request the stager cannot carry out in its state (nothing to take, both buffers full, a unit
    /// larger than a buffer).
    #[error("staging: {0}")]
    Invalid(String),
    /// A range outside a buffer.
    #[error("staging: bytes {offset}..{offset}+{length} do not fit a buffer of {len} bytes")]
    Range {
        /// First byte.
        offset: u64,
        /// Length asked for.
        length: u64,
        /// The buffer's length.
        len: u64,
    },
    /// The copy between a buffer and its region failed (a GPU driver error, say); the text is its own.
    #[error("staging copy failed: {0}")]
    Copy(String),
    /// The host side of a region refused access.
    #[error(transparent)]
    Memory(#[from] transfer_engine::Error),
}

/// One staging buffer: host bytes that a device copy fills or drains, with at most one copy in flight.
/// `cuda::PinnedSlot` (feature `cuda`) stages GPU memory; [`HostSlot`] stages host memory.
pub trait StageSlot {
    /// Bytes the buffer holds.
    fn capacity(&self) -> usize;
    /// Queues a copy of `range` of `src` into the start of the buffer (after waiting for the previous one).
    fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), StagingError>;
    /// Queues a copy of the buffer's first `len` bytes into `dst` at `offset`.
    fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), StagingError>;
    /// The buffer's bytes, once its copy has completed.
    fn bytes(&mut self) -> Result<&[u8], StagingError>;
    /// The buffer's bytes, writable, once its copy has completed.
    fn bytes_mut(&mut self) -> Result<&mut [u8], StagingError>;
    /// Waits for the copy in flight, if any.
    fn settle(&mut self) -> Result<(), StagingError>;
    /// Whether a copy is still in flight (never blocks).
    fn busy(&mut self) -> Result<bool, StagingError>;
    /// The CRC-32C of the unit the last [`StageSlot::fetch`] brought in, if the slot took it while
    /// copying (a CPU copy can; a DMA cannot, and the stager then checksums the buffer).
    fn fetched_crc32c(&self) -> Option<u32> {
        None
    }
}

impl<S: StageSlot + ?Sized> StageSlot for Box<S> {
    fn capacity(&self) -> usize {
        (**self).capacity()
    }
    fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), StagingError> {
        (**self).fetch(src, range)
    }
    fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), StagingError> {
        (**self).push(dst, offset, len)
    }
    fn bytes(&mut self) -> Result<&[u8], StagingError> {
        (**self).bytes()
    }
    fn bytes_mut(&mut self) -> Result<&mut [u8], StagingError> {
        (**self).bytes_mut()
    }
    fn settle(&mut self) -> Result<(), StagingError> {
        (**self).settle()
    }
    fn busy(&mut self) -> Result<bool, StagingError> {
        (**self).busy()
    }
    fn fetched_crc32c(&self) -> Option<u32> {
        (**self).fetched_crc32c()
    }
}

/// A stager over buffers of any kind, as a backend keeps one per kind of memory it meets.
pub type AnyStager = Stager<Box<dyn StageSlot + Send>>;

/// Two staging buffers used in turn.
///
/// Sending (GPU to socket): prefetch unit N+1 before taking unit N, so its device copy runs while unit N is
/// sent:
/// ```text
/// stager.prefetch(&gpu_region, units[0].clone())?;
/// for i in 0..units.len() {
///     if let Some(next) = units.get(i + 1) { stager.prefetch(&gpu_region, next.clone())?; }
///     let unit = stager.take()?;            // waits for unit i's device copy
///     socket.send(unit.bytes(), unit.crc32c());
/// }
/// ```
/// Receiving (socket to GPU): each [`Stager::receive`] hands out the buffer whose device copy finished
/// longest ago, so unit N's device copy runs while unit N+1 is received; [`Stager::flush`] waits for the
/// last ones. CRC-32C is taken on the host copy in both directions.
pub struct Stager<S: StageSlot> {
    slots: [S; 2],
    /// Prefetched units not yet taken, oldest first: (slot, length).
    fetched: VecDeque<(usize, usize)>,
    next_fetch: usize,
    next_receive: usize,
}

impl<S: StageSlot> std::fmt::Debug for Stager<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stager")
            .field("unit", &self.unit_capacity())
            .field("fetched", &self.fetched.len())
            .finish_non_exhaustive()
    }
}

impl<S: StageSlot> Stager<S> {
    /// A stager over two given buffers.
    pub fn with_slots(slots: [S; 2]) -> Self {
        Self {
            slots,
            fetched: VecDeque::with_capacity(2),
            next_fetch: 0,
            next_receive: 0,
        }
    }

    /// The same stager with its buffers boxed, so stagers over buffers of different kinds can be kept
    /// together ([`AnyStager`]).
    #[must_use]
    pub fn boxed(self) -> AnyStager
    where
        S: Send + 'static,
    {
        let [a, b] = self.slots;
        Stager {
            slots: [Box::new(a), Box::new(b)],
            fetched: self.fetched,
            next_fetch: self.next_fetch,
            next_receive: self.next_receive,
        }
    }

    /// The largest unit it stages.
    #[must_use]
    pub fn unit_capacity(&self) -> usize {
        self.slots[0].capacity().min(self.slots[1].capacity())
    }

    fn check_len(&self, len: usize) -> Result<(), StagingError> {
        if len > self.unit_capacity() {
            return Err(StagingError::Invalid(format!(
                "a unit of {len} bytes does not fit staging buffers of {}",
                self.unit_capacity()
            )));
        }
        Ok(())
    }

    /// Queues the device copy of `range` of `src` into the next free buffer. Fails if both buffers hold
    /// units not yet taken.
    pub fn prefetch(
        &mut self,
        src: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<(), StagingError> {
        if self.fetched.len() == 2 {
            return Err(StagingError::Invalid(
                "both staging buffers hold units not yet taken".into(),
            ));
        }
        let len = range.end.saturating_sub(range.start);
        self.check_len(len)?;
        let slot = self.next_fetch;
        self.slots[slot].fetch(src, range)?;
        self.fetched.push_back((slot, len));
        self.next_fetch ^= 1;
        Ok(())
    }

    /// The oldest prefetched unit, once its device copy has completed (its CRC-32C on demand).
    /// Its buffer is free again when the returned view drops.
    pub fn take(&mut self) -> Result<StagedUnit<'_>, StagingError> {
        let (slot, len) = self
            .fetched
            .pop_front()
            .ok_or_else(|| StagingError::Invalid("no unit was prefetched".into()))?;
        let fetched = self.slots[slot].fetched_crc32c();
        let bytes = &self.slots[slot].bytes()?[..len];
        Ok(StagedUnit { bytes, fetched })
    }

    /// Whether [`Stager::take`] would return without waiting (an async driver polls this, or yields,
    /// instead of blocking its executor on the device copy). `false` when nothing was prefetched.
    pub fn ready(&mut self) -> Result<bool, StagingError> {
        match self.fetched.front() {
            Some(&(slot, _)) => Ok(!self.slots[slot].busy()?),
            None => Ok(false),
        }
    }

    /// The next buffer to receive a unit into, once the device copy it last started has completed.
    pub fn receive(&mut self) -> Result<Landing<'_, S>, StagingError> {
        let slot = self.next_receive;
        if self.fetched.iter().any(|(s, _)| *s == slot) {
            return Err(StagingError::Invalid(
                "the staging buffer holds a prefetched unit not yet taken".into(),
            ));
        }
        self.slots[slot].settle()?;
        self.next_receive ^= 1;
        Ok(Landing {
            slots: &mut self.slots,
            slot,
        })
    }

    /// Waits for every device copy in flight.
    pub fn flush(&mut self) -> Result<(), StagingError> {
        for slot in &mut self.slots {
            slot.settle()?;
        }
        Ok(())
    }
}

/// A staged unit, ready to send: its host bytes, and their CRC-32C on demand.
#[derive(Debug)]
pub struct StagedUnit<'a> {
    bytes: &'a [u8],
    /// The CRC-32C the slot took while copying, if it did.
    fetched: Option<u32>,
}

impl StagedUnit<'_> {
    /// The unit's bytes (pinned host memory).
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// CRC-32C of [`StagedUnit::bytes`]: the one taken while copying, or a pass over the bytes (each call).
    #[must_use]
    pub fn crc32c(&self) -> u32 {
        self.fetched
            .unwrap_or_else(|| transfer_engine::crc32c(self.bytes))
    }
}

/// A free staging buffer to receive one unit into; [`Landing::place`] starts its device copy.
#[derive(Debug)]
pub struct Landing<'a, S: StageSlot> {
    slots: &'a mut [S; 2],
    slot: usize,
}

impl<S: StageSlot> Landing<'_, S> {
    /// The whole buffer, to fill from the socket.
    pub fn buffer(&mut self) -> Result<&mut [u8], StagingError> {
        self.slots[self.slot].bytes_mut()
    }

    /// Waits for the other buffer's device copy (the unit received before this one), so a receiver can
    /// report that unit placed while this one is still in its buffer.
    pub fn settle_other(&mut self) -> Result<(), StagingError> {
        self.slots[self.slot ^ 1].settle()
    }

    /// CRC-32C of the first `len` bytes received, to check against the frame's before placing.
    pub fn crc32c(&mut self, len: usize) -> Result<u32, StagingError> {
        let bytes = self.slots[self.slot].bytes()?;
        let got = bytes.get(..len).ok_or(StagingError::Range {
            offset: 0,
            length: len as u64,
            len: bytes.len() as u64,
        })?;
        Ok(transfer_engine::crc32c(got))
    }

    /// Starts the device copy of the first `len` bytes into `dst` at `offset` (already checksummed).
    pub fn push(self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), StagingError> {
        let slot = &mut self.slots[self.slot];
        if len > slot.capacity() {
            return Err(StagingError::Range {
                offset: 0,
                length: len as u64,
                len: slot.capacity() as u64,
            });
        }
        slot.push(dst, offset, len)
    }

    /// Checksums the first `len` bytes, then starts their device copy into `dst` at `offset`; returns the
    /// CRC-32C.
    pub fn place(
        mut self,
        dst: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<u32, StagingError> {
        let crc = self.crc32c(len)?;
        self.push(dst, offset, len)?;
        Ok(crc)
    }
}

#[cfg(test)]
mod tests;
