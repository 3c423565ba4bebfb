//! Double-buffered staging of GPU bytes through pinned host memory, for backends whose I/O needs host
//! memory (a TCP socket): the device copy of one unit overlaps the send (or receive) of the other.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use transfer_engine::MemoryRegion;

use super::ffi::{PinnedSlot, Stream};
use super::{CudaError, Gpu};

/// One staging buffer: host bytes that a device copy fills or drains, with at most one copy in flight.
/// [`PinnedSlot`] is the real one; the trait lets the stager's ordering be tested over host memory.
pub trait StageSlot {
    /// Bytes the buffer holds.
    fn capacity(&self) -> usize;
    /// Queues a copy of `range` of `src` into the start of the buffer (after waiting for the previous one).
    fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), CudaError>;
    /// Queues a copy of the buffer's first `len` bytes into `dst` at `offset`.
    fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), CudaError>;
    /// The buffer's bytes, once its copy has completed.
    fn bytes(&mut self) -> Result<&[u8], CudaError>;
    /// The buffer's bytes, writable, once its copy has completed.
    fn bytes_mut(&mut self) -> Result<&mut [u8], CudaError>;
    /// Waits for the copy in flight, if any.
    fn settle(&mut self) -> Result<(), CudaError>;
    /// Whether a copy is still in flight (never blocks).
    fn busy(&mut self) -> Result<bool, CudaError>;
}

impl StageSlot for PinnedSlot {
    fn capacity(&self) -> usize {
        PinnedSlot::capacity(self)
    }
    fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), CudaError> {
        PinnedSlot::fetch(self, src, range)
    }
    fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), CudaError> {
        PinnedSlot::push(self, dst, offset, len)
    }
    fn bytes(&mut self) -> Result<&[u8], CudaError> {
        PinnedSlot::bytes(self)
    }
    fn bytes_mut(&mut self) -> Result<&mut [u8], CudaError> {
        PinnedSlot::bytes_mut(self)
    }
    fn settle(&mut self) -> Result<(), CudaError> {
        PinnedSlot::settle(self)
    }
    fn busy(&mut self) -> Result<bool, CudaError> {
        PinnedSlot::busy(self)
    }
}

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
pub struct Stager<S: StageSlot = PinnedSlot> {
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

impl Stager<PinnedSlot> {
    /// Two pinned buffers of `unit` bytes on a new stream of `gpu`.
    pub fn pinned(gpu: &Gpu, unit: usize) -> Result<Self, CudaError> {
        let stream = Arc::new(Stream::new(gpu)?);
        Ok(Self::with_slots([
            PinnedSlot::new(&stream, unit)?,
            PinnedSlot::new(&stream, unit)?,
        ]))
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

    /// The largest unit it stages.
    #[must_use]
    pub fn unit_capacity(&self) -> usize {
        self.slots[0].capacity().min(self.slots[1].capacity())
    }

    fn check_len(&self, len: usize) -> Result<(), CudaError> {
        if len > self.unit_capacity() {
            return Err(CudaError::Invalid(format!(
                "a unit of {len} bytes does not fit staging buffers of {}",
                self.unit_capacity()
            )));
        }
        Ok(())
    }

    /// Queues the device copy of `range` of `src` into the next free buffer. Fails if both buffers hold
    /// units not yet taken.
    pub fn prefetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), CudaError> {
        if self.fetched.len() == 2 {
            return Err(CudaError::Invalid(
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

    /// The oldest prefetched unit, once its device copy has completed, with the CRC-32C of its host copy.
    /// Its buffer is free again when the returned view drops.
    pub fn take(&mut self) -> Result<StagedUnit<'_>, CudaError> {
        let (slot, len) = self
            .fetched
            .pop_front()
            .ok_or_else(|| CudaError::Invalid("no unit was prefetched".into()))?;
        let bytes = &self.slots[slot].bytes()?[..len];
        Ok(StagedUnit {
            crc32c: transfer_engine::crc32c(bytes),
            bytes,
        })
    }

    /// Whether [`Stager::take`] would return without waiting (an async driver polls this, or yields,
    /// instead of blocking its executor on the device copy). `false` when nothing was prefetched.
    pub fn ready(&mut self) -> Result<bool, CudaError> {
        match self.fetched.front() {
            Some(&(slot, _)) => Ok(!self.slots[slot].busy()?),
            None => Ok(false),
        }
    }

    /// The next buffer to receive a unit into, once the device copy it last started has completed.
    pub fn receive(&mut self) -> Result<Landing<'_, S>, CudaError> {
        let slot = self.next_receive;
        if self.fetched.iter().any(|(s, _)| *s == slot) {
            return Err(CudaError::Invalid(
                "the staging buffer holds a prefetched unit not yet taken".into(),
            ));
        }
        self.slots[slot].settle()?;
        self.next_receive ^= 1;
        Ok(Landing {
            slot: &mut self.slots[slot],
        })
    }

    /// Waits for every device copy in flight.
    pub fn flush(&mut self) -> Result<(), CudaError> {
        for slot in &mut self.slots {
            slot.settle()?;
        }
        Ok(())
    }
}

/// A staged unit, ready to send: its host bytes and their CRC-32C.
#[derive(Debug)]
pub struct StagedUnit<'a> {
    bytes: &'a [u8],
    crc32c: u32,
}

impl StagedUnit<'_> {
    /// The unit's bytes (pinned host memory).
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// CRC-32C of [`StagedUnit::bytes`].
    #[must_use]
    pub fn crc32c(&self) -> u32 {
        self.crc32c
    }
}

/// A free staging buffer to receive one unit into; [`Landing::place`] starts its device copy.
#[derive(Debug)]
pub struct Landing<'a, S: StageSlot> {
    slot: &'a mut S,
}

impl<S: StageSlot> Landing<'_, S> {
    /// The whole buffer, to fill from the socket.
    pub fn buffer(&mut self) -> Result<&mut [u8], CudaError> {
        self.slot.bytes_mut()
    }

    /// CRC-32C of the first `len` bytes received, to check against the frame's before placing.
    pub fn crc32c(&mut self, len: usize) -> Result<u32, CudaError> {
        let bytes = self.slot.bytes()?;
        let got = bytes.get(..len).ok_or(CudaError::Range {
            offset: 0,
            length: len as u64,
            len: bytes.len() as u64,
        })?;
        Ok(transfer_engine::crc32c(got))
    }

    /// Starts the device copy of the first `len` bytes into `dst` at `offset` (already checksummed).
    pub fn push(self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), CudaError> {
        if len > self.slot.capacity() {
            return Err(CudaError::Range {
                offset: 0,
                length: len as u64,
                len: self.slot.capacity() as u64,
            });
        }
        self.slot.push(dst, offset, len)
    }

    /// Checksums the first `len` bytes, then starts their device copy into `dst` at `offset`; returns the
    /// CRC-32C.
    pub fn place(
        mut self,
        dst: &MemoryRegion,
        offset: usize,
        len: usize,
    ) -> Result<u32, CudaError> {
        let crc = self.crc32c(len)?;
        self.push(dst, offset, len)?;
        Ok(crc)
    }
}

#[cfg(test)]
mod tests {
    //! The stager's ordering and checksums over host memory: `HostSlot` stands in for a pinned buffer and
    //! copies at once where the GPU would copy later, and records what it was asked in which order. The
    //! GPU itself is exercised by the `#[ignore]`d tests in `tests/cuda.rs`, on a machine with a GPU.
    use super::*;
    use std::sync::Mutex;

    struct HostSlot {
        id: usize,
        bytes: Vec<u8>,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl StageSlot for HostSlot {
        fn capacity(&self) -> usize {
            self.bytes.len()
        }
        fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), CudaError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("fetch {} {range:?}", self.id));
            let len = range.len();
            self.bytes[..len].copy_from_slice(&src.read(range)?);
            Ok(())
        }
        fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), CudaError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("push {} {offset}", self.id));
            dst.copy_from(offset, &self.bytes[..len])?;
            Ok(())
        }
        fn bytes(&mut self) -> Result<&[u8], CudaError> {
            Ok(&self.bytes)
        }
        fn bytes_mut(&mut self) -> Result<&mut [u8], CudaError> {
            Ok(&mut self.bytes)
        }
        fn settle(&mut self) -> Result<(), CudaError> {
            self.log.lock().unwrap().push(format!("settle {}", self.id));
            Ok(())
        }
        fn busy(&mut self) -> Result<bool, CudaError> {
            Ok(false)
        }
    }

    fn stager(unit: usize) -> (Stager<HostSlot>, Arc<Mutex<Vec<String>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let slot = |id| HostSlot {
            id,
            bytes: vec![0; unit],
            log: Arc::clone(&log),
        };
        (Stager::with_slots([slot(0), slot(1)]), log)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    #[test]
    fn sending_prefetches_the_next_unit_into_the_other_buffer_before_the_current_one_is_sent() {
        let (mut stager, log) = stager(1000);
        let data = pattern(3500);
        let src = MemoryRegion::from_vec(data.clone());
        let units: Vec<Range<usize>> = (0..4)
            .map(|i| i * 1000..(i * 1000 + 1000).min(3500))
            .collect();
        let mut sent = Vec::new();
        stager.prefetch(&src, units[0].clone()).unwrap();
        for i in 0..units.len() {
            if let Some(next) = units.get(i + 1) {
                stager.prefetch(&src, next.clone()).unwrap();
            }
            let unit = stager.take().unwrap();
            assert_eq!(
                unit.crc32c(),
                transfer_engine::crc32c(&data[units[i].clone()])
            );
            sent.extend_from_slice(unit.bytes());
            log.lock().unwrap().push(format!("send {i}"));
        }
        assert_eq!(sent, data);
        let log = log.lock().unwrap().join(", ");
        assert!(
            log.starts_with(
                "fetch 0 0..1000, fetch 1 1000..2000, send 0, fetch 0 2000..3000, send 1"
            ),
            "{log}"
        );
    }

    #[test]
    fn receiving_alternates_buffers_and_checksums_what_arrived() {
        let (mut stager, log) = stager(1000);
        let data = pattern(2500);
        let dst = MemoryRegion::zeroed(2500);
        for (i, chunk) in data.chunks(1000).enumerate() {
            let mut landing = stager.receive().unwrap();
            landing.buffer().unwrap()[..chunk.len()].copy_from_slice(chunk);
            let crc = landing.place(&dst, i * 1000, chunk.len()).unwrap();
            assert_eq!(crc, transfer_engine::crc32c(chunk));
        }
        stager.flush().unwrap();
        assert_eq!(dst.to_vec().unwrap(), data);
        let log = log.lock().unwrap().join(", ");
        assert!(
            log.starts_with("settle 0, push 0 0, settle 1, push 1 1000, settle 0, push 0 2000"),
            "{log}"
        );
    }

    #[test]
    fn misuse_is_refused_with_a_clear_error_and_loses_nothing() {
        let (mut stager, _) = stager(100);
        let src = MemoryRegion::from_vec(pattern(1000));
        assert!(matches!(stager.take(), Err(CudaError::Invalid(_))));
        assert!(
            !stager.ready().unwrap(),
            "nothing prefetched, nothing to take"
        );
        let too_big = stager.prefetch(&src, 0..101).unwrap_err();
        assert!(too_big.to_string().contains("does not fit"), "{too_big}");
        stager.prefetch(&src, 0..100).unwrap();
        stager.prefetch(&src, 100..200).unwrap();
        assert!(
            stager.prefetch(&src, 200..300).is_err(),
            "both buffers are taken"
        );
        assert!(stager.ready().unwrap());
        assert!(
            stager.receive().is_err(),
            "the receive buffer holds a unit not yet sent"
        );
        assert_eq!(stager.take().unwrap().bytes(), &pattern(1000)[..100]);
        assert_eq!(stager.take().unwrap().bytes(), &pattern(1000)[100..200]);
        let mut landing = stager.receive().unwrap();
        assert!(landing.crc32c(101).is_err());
        let dst = MemoryRegion::zeroed(10);
        assert!(landing.push(&dst, 0, 101).is_err());
    }
}
