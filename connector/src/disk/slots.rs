//! The slot file: one file of fixed-size record slots, read and written whole at page-aligned offsets,
//! through the page cache or around it (`O_DIRECT`), from page-aligned buffers.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::DiskError;
use super::record::PAGE;

/// How the tier's file is read and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiskIo {
    /// Through the page cache (the kernel writes back; reads of recent blocks come from memory).
    #[default]
    Buffered,
    /// Around the page cache (`O_DIRECT`): every read and write reaches the device, no page cache is
    /// filled. Not every file system offers it (tmpfs does not): opening then fails with a clear error.
    Direct,
}

impl DiskIo {
    /// The name `te-bench disk --json` prints.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DiskIo::Buffered => "buffered",
            DiskIo::Direct => "direct",
        }
    }
}

/// A heap buffer whose bytes start on a page boundary and whose length is whole pages, as direct I/O
/// needs. Zeroed at allocation (the kernel maps its pages on first touch).
#[derive(Debug)]
pub struct PageBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl PageBuf {
    /// A buffer of `len` bytes rounded up to whole pages.
    #[must_use]
    pub fn new(len: usize) -> PageBuf {
        let len = len.div_ceil(PAGE) * PAGE;
        let raw = vec![0u8; len + PAGE];
        let start = raw.as_ptr().align_offset(PAGE);
        PageBuf { raw, start, len }
    }

    /// The bytes.
    #[must_use]
    pub fn bytes(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The bytes, to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// The file of `slots` records of `record_bytes` each.
#[derive(Debug)]
pub(crate) struct SlotFile {
    file: File,
    path: PathBuf,
    record_bytes: u64,
    slots: u32,
}

/// The slot file's name inside the tier's directory.
pub(crate) const SLOT_FILE: &str = "blocks.kvtier";

impl SlotFile {
    /// Opens (or creates) the slot file in `dir`, for `slots` records.
    pub(crate) fn open(
        dir: &Path,
        record_bytes: u64,
        slots: u32,
        io: DiskIo,
    ) -> Result<SlotFile, DiskError> {
        let path = dir.join(SLOT_FILE);
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        if io == DiskIo::Direct {
            #[cfg(target_os = "linux")]
            opts.custom_flags(libc::O_DIRECT);
            #[cfg(not(target_os = "linux"))]
            return Err(DiskError::DirectUnsupported(dir.to_owned()));
        }
        let file = opts.open(&path).map_err(|e| {
            if io == DiskIo::Direct && e.raw_os_error() == Some(libc::EINVAL) {
                DiskError::DirectUnsupported(dir.to_owned())
            } else {
                DiskError::io(format!("opening {}", path.display()), e)
            }
        })?;
        // The file grows as records are written (a full disk shows as a failed write, counted); one left
        // larger by a bigger tier is cut to this one's slots.
        let len = record_bytes * u64::from(slots);
        let had = file
            .metadata()
            .map_err(|e| DiskError::io(format!("reading {}'s size", path.display()), e))?
            .len();
        if had > len {
            file.set_len(len).map_err(|e| {
                DiskError::io(format!("cutting {} to {len} bytes", path.display()), e)
            })?;
        }
        Ok(SlotFile {
            file,
            path,
            record_bytes,
            slots,
        })
    }

    /// Whether `slot`'s header lies inside the file (a slot past its end was never written).
    pub(crate) fn written(&self, slot: u32) -> io::Result<bool> {
        Ok(self.offset(slot) < self.file.metadata()?.len())
    }

    pub(crate) fn slots(&self) -> u32 {
        self.slots
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn offset(&self, slot: u32) -> u64 {
        debug_assert!(slot < self.slots);
        u64::from(slot) * self.record_bytes
    }

    /// Writes a whole record (`buf`, at most `record_bytes`) into `slot`.
    pub(crate) fn write(&self, slot: u32, buf: &PageBuf) -> io::Result<()> {
        self.file.write_all_at(buf.bytes(), self.offset(slot))
    }

    /// Flushes what the page cache holds of the file to the device.
    pub(crate) fn sync(&self) -> Result<(), DiskError> {
        self.file
            .sync_data()
            .map_err(|e| DiskError::io(format!("syncing {}", self.path.display()), e))
    }

    /// Reads `buf.len()` bytes of `slot`'s record from its start (a header page, or the whole record).
    pub(crate) fn read(&self, slot: u32, buf: &mut PageBuf) -> io::Result<()> {
        self.file.read_exact_at(buf.bytes_mut(), self.offset(slot))
    }
}

/// Whether `e` says the disk (or the file size limit) is full.
pub(crate) fn is_full(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC | libc::EFBIG | libc::EDQUOT)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_buffers_are_aligned_and_whole_pages() {
        for len in [1, PAGE, PAGE + 1, 3 * PAGE] {
            let mut b = PageBuf::new(len);
            assert_eq!(b.bytes().as_ptr() as usize % PAGE, 0);
            assert_eq!(b.bytes().len(), len.div_ceil(PAGE) * PAGE);
            b.bytes_mut()[0] = 1;
            assert!(b.bytes()[1..].iter().all(|&x| x == 0));
        }
    }
}
