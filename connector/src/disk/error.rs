//! The disk tier's one error type.

use std::path::PathBuf;

use super::slots;

/// The disk tier's errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiskError {
    /// The configuration cannot be used; the message says why.
    #[error("disk tier configuration: {0}")]
    Config(String),
    /// The file system does not offer direct I/O (tmpfs, for one).
    #[error("{0} does not support direct I/O (O_DIRECT); use DiskIo::Buffered there")]
    DirectUnsupported(PathBuf),
    /// The disk, or the file size limit, is full.
    #[error("the disk is full: {0}")]
    Full(String),
    /// A read or write failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, and to which file.
        what: String,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl DiskError {
    pub(crate) fn io(what: String, source: std::io::Error) -> DiskError {
        if slots::is_full(&source) {
            DiskError::Full(format!("{what}: {source}"))
        } else {
            DiskError::Io { what, source }
        }
    }
}
