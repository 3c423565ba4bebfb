//! How a disk tier is set up.

use std::path::PathBuf;

use super::DiskIo;

/// How a disk tier is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskConfig {
    /// The tier's own directory (created if missing); reopening it recovers what it holds.
    pub dir: PathBuf,
    /// Bytes the tier may take on disk (whole records of the block format).
    pub capacity_bytes: u64,
    /// Buffered or direct I/O.
    pub io: DiskIo,
    /// Records the write-back queue holds; a put beyond is dropped and counted. Staging memory is at most
    /// `queue_blocks + 1` records.
    pub queue_blocks: usize,
    /// Blocks read at once by [`super::DiskTier::get_many`] (and headers at recovery).
    pub readers: usize,
}

impl DiskConfig {
    /// A tier in `dir` of at most `capacity_bytes`, buffered I/O, a queue of 32 records, 4 readers.
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>, capacity_bytes: u64) -> DiskConfig {
        DiskConfig {
            dir: dir.into(),
            capacity_bytes,
            io: DiskIo::default(),
            queue_blocks: 32,
            readers: 4,
        }
    }
}
