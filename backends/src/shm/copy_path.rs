//! Which copy a receiver uses for units whose source lies in shared memory a peer granted: a plain copy
//! out of its mapping, or cross-memory attach (`process_vm_readv`) of the same bytes. Which is faster
//! depends on the host: on a virtual machine whose shared mappings copy slowly, cross-memory attach wins
//! by about 2x (see `docs/PERFORMANCE.md`); on bare metal the mapping usually does. With
//! [`CopyPath::Measure`] (the default) a receiver times both on the first grant of each peer and keeps
//! the faster.

use std::time::{Duration, Instant};

use super::cma;
use super::memfd::PeerMapping;

/// How units from a peer's granted shared memory are copied in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CopyPath {
    /// Time both on the peer's first grant and keep the faster (the default).
    #[default]
    Measure,
    /// A plain copy out of the mapping.
    Mapping,
    /// Cross-memory attach, as for memory that is not shared.
    CrossMemoryAttach,
}

/// Bytes each way is timed on (or the whole grant, when smaller): more than a last-level cache holds, so
/// the figures are those of memory, not of cache (4 MiB measured the mapping at 14.9 GB/s here).
const PROBE_BYTES: usize = 16 << 20;

/// How much faster cross-memory attach must copy to be kept: when the two are close the probe's noise
/// decides, and end to end the mapping then won here (3.5 against 3.1 GB/s for 1 GiB in 4 MiB units with
/// the probe at 8.0 against 8.7 GB/s); where the mapping is slow, cross-memory attach wins by about 2x.
const CMA_MARGIN: f64 = 1.25;

/// What a measurement found: the path kept and each path's rate in GB/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measured {
    pub(crate) cma: bool,
    pub(crate) mapping_gbps: f64,
    pub(crate) cma_gbps: f64,
}

/// Times a copy of the first bytes of `mapping` (at `address` in process `pid`) both ways, twice each
/// (the faster of the two counts: the first warms the caches and the page tables), and says which to
/// keep: cross-memory attach only when it is clearly faster ([`CMA_MARGIN`]). A pull that fails keeps
/// the mapping.
pub(crate) fn measure(mapping: &PeerMapping, pid: i32, address: u64) -> Measured {
    let len = mapping.len().min(PROBE_BYTES);
    let mut scratch = vec![0u8; len];
    let rate = |d: Duration| len as f64 / d.as_secs_f64().max(1e-9) / 1e9;
    let mut best_mapping = Duration::MAX;
    let mut best_cma = Duration::MAX;
    let mut cma_ok = true;
    for _ in 0..2 {
        let start = Instant::now();
        let _ = mapping.copy_out(0, &mut scratch, len, |_| {});
        best_mapping = best_mapping.min(start.elapsed());
        let start = Instant::now();
        cma_ok &= cma::pull(pid, address, &mut scratch).is_ok();
        best_cma = best_cma.min(start.elapsed());
    }
    let (mapping_gbps, cma_gbps) = (rate(best_mapping), rate(best_cma));
    Measured {
        cma: cma_ok && cma_gbps > CMA_MARGIN * mapping_gbps,
        mapping_gbps,
        cma_gbps: if cma_ok { cma_gbps } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::memfd::SharedMemory;
    use transfer_engine::RawMemory;

    #[test]
    fn both_paths_are_timed_on_a_grant_and_the_faster_kept() {
        let memory = SharedMemory::create(8 << 20).unwrap();
        let mapping = PeerMapping::map(memory.fd().as_ref(), 8 << 20).unwrap();
        let found = measure(&mapping, std::process::id() as i32, memory.as_ptr() as u64);
        assert!(
            found.mapping_gbps > 0.0 && found.cma_gbps > 0.0,
            "{found:?}"
        );
        assert_eq!(
            found.cma,
            found.cma_gbps > CMA_MARGIN * found.mapping_gbps,
            "{found:?}"
        );
        println!("{found:?}");
        // A pull that cannot be made (an address the process does not map) keeps the mapping.
        let refused = measure(&mapping, std::process::id() as i32, 8);
        assert!(!refused.cma && refused.cma_gbps == 0.0, "{refused:?}");
    }
}
