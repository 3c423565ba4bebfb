//! What `te-bench run` prints: one row per measured transfer, and the columns each backend's table shows.

use serde::Serialize;

/// Columns of the `run` (and `connect`) table.
pub(crate) const RUN_COLUMNS: [&str; 11] = [
    "backend",
    "mode",
    "layout",
    "block",
    "bytes",
    "gbps",
    "limit_gbps",
    "ratio",
    "p50_ms",
    "p99_ms",
    "recompute_blocks",
];

/// One result row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunRow {
    pub(crate) backend: &'static str,
    pub(crate) mode: &'static str,
    /// Where the blocks lie on each side (`--layout`).
    pub(crate) layout: &'static str,
    pub(crate) block_bytes: u64,
    pub(crate) block: String,
    pub(crate) bytes: u64,
    pub(crate) iterations: usize,
    pub(crate) seconds: f64,
    pub(crate) gbps: f64,
    pub(crate) limit_gbps: f64,
    pub(crate) ratio: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) retransmits: u64,
    pub(crate) recompute_blocks: usize,
    /// Several `--layout`s: the median over rounds of this layout's throughput over the first layout's
    /// in the same round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) vs_first_layout: Option<f64>,
    /// RDMA only: the libfabric provider that carried the bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) provider: Option<String>,
    /// RDMA only: the provider's own ceiling (a plain loop of its writes, same unit size and window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) provider_limit_gbps: Option<f64>,
    /// RDMA only: `gbps / provider_limit_gbps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) provider_ratio: Option<f64>,
    /// RDMA only: how NICs reached host regions, `mirrored` (the default) or `in_place` (`--in-place`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) host_memory: Option<&'static str>,
    /// shm only: whether units were checksummed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) checksum: Option<bool>,
    /// shm only: median CPU seconds per GiB moved in the sending process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sender_cpu_s_per_gib: Option<f64>,
    /// shm only: median CPU seconds per GiB moved in the receiving process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) receiver_cpu_s_per_gib: Option<f64>,
}

#[cfg(feature = "rdma")]
impl RunRow {
    /// RDMA rows: the provider that carried the bytes, and its own ceiling (when measured) with the ratio.
    pub(crate) fn set_provider(&mut self, provider: String, provider_limit_gbps: Option<f64>) {
        self.provider = Some(provider);
        self.provider_ratio = provider_limit_gbps.map(|limit| self.gbps / limit);
        self.provider_limit_gbps = provider_limit_gbps;
    }
}

/// Columns of the `run --backend rdma` table.
pub(crate) const RDMA_COLUMNS: [&str; 13] = [
    "backend",
    "provider",
    "mode",
    "block",
    "bytes",
    "gbps",
    "provider_limit_gbps",
    "provider_ratio",
    "limit_gbps",
    "ratio",
    "p50_ms",
    "p99_ms",
    "recompute_blocks",
];

/// Columns of the `run --backend shm` table.
pub(crate) const SHM_COLUMNS: [&str; 12] = [
    "backend",
    "mode",
    "block",
    "bytes",
    "checksum",
    "gbps",
    "limit_gbps",
    "ratio",
    "sender_cpu_s_per_gib",
    "receiver_cpu_s_per_gib",
    "p50_ms",
    "recompute_blocks",
];
