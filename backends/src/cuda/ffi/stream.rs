//! A CUDA stream, and scoped asynchronous copies on it: a host slice handed to a copy stays borrowed until
//! the copy has completed, because the scope waits for the stream before it returns (also on error or
//! panic), as `std::thread::scope` joins its threads.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::AssertUnwindSafe;

use cudarc::driver::{result, sys};
use transfer_engine::{MemoryKind, MemoryRegion};

use super::{Gpu, driver};
use crate::cuda::{CudaError, check_range};

/// A range of a GPU region: a device address and a length, borrowed from the region for `'a` so the
/// region (and its memory) outlives every copy that uses it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceSpan<'a> {
    ordinal: u32,
    ptr: sys::CUdeviceptr,
    len: usize,
    _region: PhantomData<&'a MemoryRegion>,
}

impl<'a> DeviceSpan<'a> {
    /// `range` of `region`, which must be GPU memory.
    pub(crate) fn of(region: &'a MemoryRegion, range: Range<usize>) -> Result<Self, CudaError> {
        let MemoryKind::Device { ordinal } = region.kind() else {
            return Err(CudaError::WrongKind {
                what: "a device copy",
                expected: "GPU memory",
                got: region.kind(),
            });
        };
        if range.start > range.end {
            return Err(CudaError::Invalid(format!("reversed range {range:?}")));
        }
        check_range(range.start, range.len(), region.len())?;
        Ok(Self {
            ordinal,
            ptr: region.address() as sys::CUdeviceptr + range.start as sys::CUdeviceptr,
            len: range.len(),
            _region: PhantomData,
        })
    }

    /// The part `range` of this span (relative to its start).
    pub(crate) fn sub(&self, range: Range<usize>) -> Result<Self, CudaError> {
        check_range(range.start, range.end.saturating_sub(range.start), self.len)?;
        Ok(Self {
            ptr: self.ptr + range.start as sys::CUdeviceptr,
            len: range.end - range.start,
            ..*self
        })
    }

    /// The device address.
    pub(crate) fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the two spans share a byte.
    pub(crate) fn overlaps(&self, other: &DeviceSpan<'_>) -> bool {
        self.ordinal == other.ordinal
            && self.ptr < other.ptr + other.len as u64
            && other.ptr < self.ptr + self.len as u64
    }
}

/// A CUDA event (timing disabled), destroyed on drop.
pub(super) struct Event {
    gpu: Gpu,
    raw: sys::CUevent,
}

// SAFETY: an event handle may be recorded, queried, waited for and destroyed from any thread once its
// context is current (every method binds it first).
unsafe impl Send for Event {}
// SAFETY: as for `Send`: the driver serialises operations on one event.
unsafe impl Sync for Event {}

impl Event {
    pub(super) fn new(gpu: &Gpu) -> Result<Self, CudaError> {
        gpu.bind()?;
        let raw = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(driver("cuEventCreate"))?;
        Ok(Self {
            gpu: gpu.clone(),
            raw,
        })
    }

    /// Marks the point in `stream` that [`Event::wait`] waits for.
    pub(super) fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        // SAFETY: both handles are alive (owned by `self` and `stream`) and of the same, bound, context.
        unsafe { result::event::record(self.raw, stream.raw) }.map_err(driver("cuEventRecord"))
    }

    /// Blocks until the work recorded before it has completed.
    pub(super) fn wait(&self) -> Result<(), CudaError> {
        self.gpu.bind()?;
        // SAFETY: the event handle is alive (owned by `self`).
        unsafe { result::event::synchronize(self.raw) }.map_err(driver("cuEventSynchronize"))
    }

    /// Whether the recorded work has completed, without blocking.
    pub(super) fn is_done(&self) -> Result<bool, CudaError> {
        self.gpu.bind()?;
        // SAFETY: the event handle is alive (owned by `self`).
        match unsafe { result::event::query(self.raw) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(driver("cuEventQuery")(e)),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: destroyed once, here; the driver releases it after any pending record completes.
        let _ = unsafe { result::event::destroy(self.raw) };
    }
}

/// A non-blocking CUDA stream of one GPU; waits for its work before it is destroyed.
pub(crate) struct Stream {
    gpu: Gpu,
    raw: sys::CUstream,
}

// SAFETY: a stream handle may be used from any thread once its context is current (every method binds it).
unsafe impl Send for Stream {}
// SAFETY: as for `Send`: the driver serialises work submitted to one stream.
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new(gpu: &Gpu) -> Result<Self, CudaError> {
        gpu.bind()?;
        let raw = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver("cuStreamCreate"))?;
        Ok(Self {
            gpu: gpu.clone(),
            raw,
        })
    }

    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub(super) fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Blocks until everything queued on the stream has completed.
    pub(crate) fn synchronize(&self) -> Result<(), CudaError> {
        self.gpu.bind()?;
        // SAFETY: the stream handle is alive (owned by `self`).
        unsafe { result::stream::synchronize(self.raw) }.map_err(driver("cuStreamSynchronize"))
    }

    /// Runs `f` with a [`Scope`] whose copies may borrow anything that outlives the call; waits for the
    /// stream before returning, whatever `f` returned (or if it panicked), so no copy outlives a borrow.
    ///
    /// If that wait fails after copies were queued, the process aborts: the copies may still be writing
    /// into or reading from host memory whose borrow would end, and only a broken context (a sticky CUDA
    /// error, after which the process cannot use the GPU again anyway) makes the wait fail.
    pub(crate) fn scope<'env, F, T>(&'env self, f: F) -> Result<T, CudaError>
    where
        F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<T, CudaError>,
    {
        let scope = Scope {
            stream: self,
            events: RefCell::new(Vec::new()),
            queued: Cell::new(false),
            _scope: PhantomData,
            _env: PhantomData,
        };
        let out = std::panic::catch_unwind(AssertUnwindSafe(|| f(&scope)));
        let synced = self.synchronize();
        if let Err(e) = &synced
            && scope.queued.get()
        {
            eprintln!(
                "fatal: a CUDA stream with copies of borrowed host memory in flight could not be waited \
                 for ({e}); aborting rather than freeing memory under a running copy"
            );
            std::process::abort();
        }
        match out {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(out) => {
                let out = out?;
                synced?;
                Ok(out)
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.synchronize().is_ok() {
            // SAFETY: destroyed once, here, after its work has completed.
            let _ = unsafe { result::stream::destroy(self.raw) };
        }
        // If the wait failed the context is broken; the stream is leaked rather than destroyed under work.
    }
}

/// Where scoped copies are queued; see [`Stream::scope`]. `'scope` is the scope's own lifetime, `'env`
/// what the borrowed data must outlive.
pub(crate) struct Scope<'scope, 'env: 'scope> {
    stream: &'env Stream,
    /// Events of completed copies, reused by later ones.
    events: RefCell<Vec<Event>>,
    /// Whether a copy was queued (so the final wait must not fail).
    queued: Cell<bool>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// A copy in flight; [`Pending::wait`] blocks until it has completed and hands back what it borrowed.
pub(crate) struct Pending<'scope, T> {
    scope: &'scope RefCell<Vec<Event>>,
    event: Option<Event>,
    value: Option<T>,
}

impl<T> Pending<'_, T> {
    /// Blocks until the copy has completed; returns the host slice it wrote (device to host) or `()`.
    pub(crate) fn wait(mut self) -> Result<T, CudaError> {
        if let Some(event) = self.event.take() {
            event.wait()?;
            self.scope.borrow_mut().push(event);
        }
        self.value
            .take()
            .ok_or_else(|| CudaError::Invalid("copy already waited for".into()))
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    fn check(&self, span: &DeviceSpan<'_>, len: usize) -> Result<(), CudaError> {
        let ordinal = self.stream.gpu.ordinal();
        if span.ordinal != ordinal {
            return Err(CudaError::OtherDevice {
                memory: span.ordinal,
                engine: ordinal,
            });
        }
        if span.len != len {
            return Err(CudaError::Invalid(format!(
                "copy of {len} bytes into or out of a span of {}",
                span.len
            )));
        }
        self.stream.gpu.bind()
    }

    fn record<T>(&'scope self, value: T) -> Result<Pending<'scope, T>, CudaError> {
        self.queued.set(true);
        let event = match self.events.borrow_mut().pop() {
            Some(e) => e,
            None => Event::new(&self.stream.gpu)?,
        };
        event.record(self.stream)?;
        Ok(Pending {
            scope: &self.events,
            event: Some(event),
            value: Some(value),
        })
    }

    /// Queues a copy of `src` into `dst` (host to device).
    pub(crate) fn h2d(
        &'scope self,
        dst: DeviceSpan<'scope>,
        src: &'scope [u8],
    ) -> Result<Pending<'scope, ()>, CudaError> {
        self.check(&dst, src.len())?;
        // SAFETY: `dst` lies in a live allocation of this GPU (borrowed for 'scope); `src` is borrowed for
        // 'scope, and the scope waits for the stream before 'scope ends, so it outlives the DMA.
        unsafe { result::memcpy_htod_async(dst.ptr, src, self.stream.raw) }
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        self.record(())
    }

    /// Queues a copy of `src` into `dst` (device to host); `dst` is handed back by [`Pending::wait`].
    pub(crate) fn d2h(
        &'scope self,
        dst: &'scope mut [u8],
        src: DeviceSpan<'scope>,
    ) -> Result<Pending<'scope, &'scope mut [u8]>, CudaError> {
        self.check(&src, dst.len())?;
        // SAFETY: `src` lies in a live allocation of this GPU; `dst` is exclusively borrowed for 'scope and
        // only handed back (by `Pending::wait`) after the DMA into it has completed; the scope waits for
        // the stream before 'scope ends in every other case.
        unsafe { result::memcpy_dtoh_async(&mut *dst, src.ptr, self.stream.raw) }
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        self.record(dst)
    }

    /// Queues a copy of `src` into `dst` on the same GPU.
    pub(crate) fn d2d(
        &'scope self,
        dst: DeviceSpan<'scope>,
        src: DeviceSpan<'scope>,
    ) -> Result<Pending<'scope, ()>, CudaError> {
        self.check(&dst, src.len)?;
        self.check(&src, src.len)?;
        if dst.overlaps(&src) {
            return Err(CudaError::Invalid("source and destination overlap".into()));
        }
        // SAFETY: both spans lie in live allocations of this GPU, borrowed for 'scope, and do not overlap.
        unsafe { result::memcpy_dtod_async(dst.ptr, src.ptr, src.len, self.stream.raw) }
            .map_err(driver("cuMemcpyDtoDAsync"))?;
        self.record(())
    }
}
