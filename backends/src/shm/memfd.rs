//! Shared memory for the one-copy path: regions a node allocates in a sealed memfd (so a peer it grants
//! them to can map them), and peers' granted regions mapped read-only here. The module holds the
//! backend's `unsafe`: the mappings and the copy out of a peer's.
//!
//! A memfd is sealed against shrinking and growing before it is granted, and a peer's is mapped only
//! when its seals say so: a peer cannot truncate memory this node has mapped (which would turn a read
//! into `SIGBUS`).

use std::io;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};
use transfer_engine::{MemoryKind, RawMemory};

/// Seals a granted memfd carries (and a peer's must carry before it is mapped).
fn required_seals() -> SealFlag {
    SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL
}

fn non_zero(len: usize) -> io::Result<NonZeroUsize> {
    NonZeroUsize::new(len).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty"))
}

/// Host memory in a sealed memfd, mapped read-write here: region memory that peers can be granted.
#[derive(Debug)]
pub(crate) struct SharedMemory {
    ptr: NonNull<u8>,
    len: usize,
    fd: Arc<OwnedFd>,
}

// SAFETY: the mapping is plain shared memory owned by this value (unmapped only in `Drop`); the region's
// shard locks order every access through this process, and peers map it read-only.
unsafe impl Send for SharedMemory {}
// SAFETY: as for `Send`: `&SharedMemory` hands out only the pointer and length.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// `len` zeroed bytes in a new memfd, sealed at that size.
    pub(crate) fn create(len: usize) -> io::Result<Self> {
        let size = non_zero(len)?;
        let fd = memfd_create(
            c"te-shm-region",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )?;
        let off = i64::try_from(len).map_err(|_| io::Error::other("region too large"))?;
        nix::unistd::ftruncate(&fd, off)?;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(required_seals()))?;
        // SAFETY: a fresh shared mapping of the whole memfd (its size is sealed at `len`), at an address
        // the kernel picks; nothing else refers to it yet.
        let ptr = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                &fd,
                0,
            )?
        };
        Ok(Self {
            ptr: ptr.cast(),
            len,
            fd: Arc::new(fd),
        })
    }

    /// The memfd, for granting to peers.
    pub(crate) fn fd(&self) -> &Arc<OwnedFd> {
        &self.fd
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, unmapped once; the region that held this value is gone,
        // so no view of it lives.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

// SAFETY: the mapping stays valid and fixed until `Drop`; memfd pages read as zero until written and
// hold plain bytes; in this process only the region's views reach them (peers map them read-only, and
// a read by another process changes nothing a view here can observe).
unsafe impl RawMemory for SharedMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }
}

/// A peer's granted region, mapped read-only here.
#[derive(Debug)]
pub(crate) struct PeerMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a read-only mapping owned by this value; it is only read from, by `copy_out`.
unsafe impl Send for PeerMapping {}

impl PeerMapping {
    /// Maps `len` bytes of a peer's memfd read-only, after checking that it is sealed against shrinking
    /// and at least that long.
    pub(crate) fn map(fd: &impl AsFd, len: usize) -> io::Result<Self> {
        let size = non_zero(len)?;
        let seals = SealFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GET_SEALS)?);
        if !seals.contains(required_seals()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the granted memory is not sealed against resizing",
            ));
        }
        let stat = nix::sys::stat::fstat(fd)?;
        if u64::try_from(stat.st_size).unwrap_or(0) < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the granted memory is {} bytes, not {len}", stat.st_size),
            ));
        }
        // Its page tables are filled now (`MAP_POPULATE`), once, rather than by a fault per page during the
        // first transfer.
        let flags = MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE;
        // SAFETY: a fresh read-only shared mapping of a memfd at least `len` long that can no longer
        // shrink, so every page of it stays backed; the kernel picks the address.
        let ptr = unsafe { mmap(None, size, ProtFlags::PROT_READ, flags, fd, 0)? };
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies `dst.len()` bytes from `offset` of the mapping into `dst`, in chunks of `chunk`, feeding
    /// each chunk to `each` while it is in cache. `None` when the range is outside the mapping.
    pub(crate) fn copy_out(
        &self,
        offset: usize,
        dst: &mut [u8],
        chunk: usize,
        mut each: impl FnMut(&[u8]),
    ) -> Option<()> {
        let end = offset.checked_add(dst.len())?;
        if end > self.len {
            return None;
        }
        for (i, piece) in dst.chunks_mut(chunk.max(1)).enumerate() {
            // SAFETY: `offset + i * chunk .. + piece.len()` lies inside the mapping (checked above), which
            // stays mapped while `self` lives, and `piece` is this thread's exclusive view. The peer may
            // change its bytes meanwhile (its caller broke the rule for live source blocks, or it lies):
            // the copy then holds a mix of old and new bytes, all of them plain bytes, and the unit's CRC
            // (compared before the engine takes it) turns that into a resend. No reference to the mapping
            // is ever made, only this raw copy.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.ptr.as_ptr().add(offset + i * chunk.max(1)),
                    piece.as_mut_ptr(),
                    piece.len(),
                );
            }
            each(piece);
        }
        Some(())
    }
}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; `copy_out` borrows `self`, so none runs.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_region_maps_in_a_peer_and_an_unsealed_fd_is_refused() {
        let mine = SharedMemory::create(3 << 20).unwrap();
        let fd = mine.fd().clone();
        let region = transfer_engine::MemoryRegion::from_raw_memory(mine);
        region
            .fill_with(|at, b| {
                b.iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = (at + i) as u8)
            })
            .unwrap();
        let peer = PeerMapping::map(&*fd, 3 << 20).unwrap();
        let mut got = vec![0; 1000];
        let mut seen = 0;
        peer.copy_out(5000, &mut got, 256, |p| seen += p.len())
            .unwrap();
        assert_eq!(seen, 1000);
        assert!(got.iter().enumerate().all(|(i, &x)| x == (5000 + i) as u8));
        assert!(
            peer.copy_out((3 << 20) - 10, &mut got, 256, |_| {})
                .is_none()
        );
        assert!(
            PeerMapping::map(&*fd, 4 << 20).is_err(),
            "longer than the memfd"
        );
        let unsealed = memfd_create(c"plain", MFdFlags::MFD_CLOEXEC).unwrap();
        nix::unistd::ftruncate(&unsealed, 4096).unwrap();
        let e = PeerMapping::map(&unsealed, 4096).unwrap_err();
        assert!(e.to_string().contains("not sealed"), "{e}");
    }
}
