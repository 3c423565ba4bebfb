//! A pinned staging buffer with at most one copy in flight: the host sees its bytes only once that copy has
//! completed.

use std::mem::ManuallyDrop;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys;
use transfer_engine::MemoryRegion;

use super::driver;
use super::memory::PinnedHostMemory;
use super::stream::{DeviceSpan, Event, Stream};
use crate::cuda::{CudaError, check_range};

/// One pinned staging buffer of a [`crate::staging::Stager`]: filled from a GPU range ([`PinnedSlot::fetch`])
/// or copied into one ([`PinnedSlot::push`]) on a stream; its bytes are reachable only after the copy has
/// completed, and the region at the other end is kept alive until then.
pub struct PinnedSlot {
    stream: Arc<Stream>,
    memory: ManuallyDrop<PinnedHostMemory>,
    event: Event,
    /// The GPU region of the copy in flight, if any; kept alive until the copy completes.
    in_flight: Option<MemoryRegion>,
    /// A copy was queued but neither its completion event nor a stream wait could be recorded: the slot
    /// cannot know when its bytes are free, so it refuses every use and leaks its buffer on drop.
    broken: bool,
}

impl std::fmt::Debug for PinnedSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedSlot")
            .field("capacity", &self.capacity())
            .field("in_flight", &self.in_flight.is_some())
            .finish_non_exhaustive()
    }
}

impl PinnedSlot {
    /// A slot of `capacity` pinned bytes whose copies run on `stream`.
    pub(crate) fn new(stream: &Arc<Stream>, capacity: usize) -> Result<Self, CudaError> {
        Ok(Self {
            memory: ManuallyDrop::new(PinnedHostMemory::alloc(stream.gpu(), capacity)?),
            event: Event::new(stream.gpu())?,
            stream: Arc::clone(stream),
            in_flight: None,
            broken: false,
        })
    }

    /// Bytes the slot holds.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.memory.len()
    }

    /// Waits for the copy in flight, if any.
    pub fn settle(&mut self) -> Result<(), CudaError> {
        if self.broken {
            return Err(CudaError::Invalid(
                "this staging buffer lost track of a copy after a driver error".into(),
            ));
        }
        if self.in_flight.is_some() {
            self.event.wait()?;
            self.in_flight = None;
        }
        Ok(())
    }

    /// Whether a copy is in flight and not yet complete (does not block).
    pub fn busy(&mut self) -> Result<bool, CudaError> {
        if self.broken {
            return self.settle().map(|()| true);
        }
        if self.in_flight.is_some() && self.event.is_done()? {
            self.in_flight = None;
        }
        Ok(self.in_flight.is_some())
    }

    fn span<'a>(
        &self,
        region: &'a MemoryRegion,
        range: Range<usize>,
    ) -> Result<DeviceSpan<'a>, CudaError> {
        let gpu = self.stream.gpu();
        gpu.check_device("a staged copy", region.kind())?;
        check_range(0, range.end.saturating_sub(range.start), self.capacity())?;
        let span = DeviceSpan::of(region, range)?;
        gpu.bind()?;
        Ok(span)
    }

    /// Queues a copy of `range` of the GPU region `src` into the start of the slot (waiting first for the
    /// slot's previous copy).
    pub fn fetch(&mut self, src: &MemoryRegion, range: Range<usize>) -> Result<(), CudaError> {
        self.settle()?;
        let span = self.span(src, range)?;
        // SAFETY: `span` lies in a live allocation of this GPU, kept alive by the clone of `src` stored in
        // `in_flight`; the destination is this slot's own pinned buffer, of at least `span.len()` bytes
        // (checked in `span`), which no host reference can reach until `settle` has waited for the copy.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                self.memory.as_ptr().cast(),
                span.ptr(),
                span.len(),
                self.stream.raw(),
            )
            .result()
        }
        .map_err(driver("cuMemcpyDtoHAsync"))?;
        self.queued(src)
    }

    /// Queues a copy of the slot's first `len` bytes into the GPU region `dst` at `offset`.
    pub fn push(&mut self, dst: &MemoryRegion, offset: usize, len: usize) -> Result<(), CudaError> {
        self.settle()?;
        let span = self.span(dst, offset..offset.saturating_add(len))?;
        // SAFETY: as in `fetch`, the other way round: the slot's bytes are only read by the DMA, and no host
        // reference can write them until `settle` has waited for it.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                span.ptr(),
                self.memory.as_ptr().cast_const().cast(),
                span.len(),
                self.stream.raw(),
            )
            .result()
        }
        .map_err(driver("cuMemcpyHtoDAsync"))?;
        self.queued(dst)
    }

    /// Records the completion of the copy just queued; if that fails, waits for the stream instead, and if
    /// that fails too, marks the slot broken.
    fn queued(&mut self, region: &MemoryRegion) -> Result<(), CudaError> {
        self.in_flight = Some(region.clone());
        let recorded = self.event.record(&self.stream);
        if recorded.is_err() {
            match self.stream.synchronize() {
                Ok(()) => self.in_flight = None,
                Err(_) => self.broken = true,
            }
        }
        recorded
    }

    /// The slot's bytes, once its copy has completed.
    pub fn bytes(&mut self) -> Result<&[u8], CudaError> {
        self.settle()?;
        // SAFETY: `settle` returned Ok, so the copy in flight (if any) has completed and none is queued
        // (a broken slot fails `settle`); the slice borrows `self` mutably, so `fetch` and `push` cannot
        // queue another until it is dropped. The buffer is the slot's own, never a region.
        Ok(unsafe { self.memory.bytes() })
    }

    /// The slot's bytes, writable, once its copy has completed.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8], CudaError> {
        self.settle()?;
        // SAFETY: as in `bytes`: no copy reads or writes the buffer until the slice is dropped.
        Ok(unsafe { self.memory.bytes_mut() })
    }
}

impl Drop for PinnedSlot {
    fn drop(&mut self) {
        if self.settle().is_ok() {
            // SAFETY: dropped once, here, with no copy in flight.
            unsafe { ManuallyDrop::drop(&mut self.memory) };
        } else {
            // The DMA may still be running: the buffer, and the GPU region at its other end, are leaked
            // rather than freed under it.
            std::mem::forget(self.in_flight.take());
        }
    }
}
