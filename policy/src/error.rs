//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in this crate. Messages say what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A trace file could not be opened or read.
    #[error(
        "cannot read trace {path}: {source}; check the path (the project's traces live in data/traces)"
    )]
    TraceIo {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A trace line is not a Mooncake request record.
    #[error(
        "trace {trace}, line {line}: {message}; each line must be a JSON object with \
         timestamp, input_length, output_length and hash_ids (see data/traces/README.md)"
    )]
    TraceFormat {
        /// The trace's name.
        trace: String,
        /// 1-based line number.
        line: usize,
        /// What the parser said.
        message: String,
    },
    /// A policy name was not recognised.
    #[error(
        "unknown policy {0:?}; use one of: lru, s3fifo, lirs, arc, wtinylfu, heat, continuation, tier-continuation, belady"
    )]
    UnknownPolicy(String),
    /// A configuration value is out of range.
    #[error("invalid policy configuration: {0}")]
    InvalidConfig(String),
}
