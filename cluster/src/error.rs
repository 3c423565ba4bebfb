//! The cluster index's one error type.

/// Why an index call failed. Every variant leaves serving to go on: a caller falls back to its own store.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The configuration cannot work (the message says which setting).
    #[error("cluster index configuration: {0}")]
    Config(String),
    /// Redis did not answer within the configured time.
    #[error("the cluster index did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// Redis refused the call, the connection failed, or an answer was not what this crate writes.
    #[error("the cluster index failed: {0}")]
    Redis(#[from] redis::RedisError),
}
