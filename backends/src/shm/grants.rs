//! What a peer granted a link: regions of its shared memory, mapped here, and its GPU allocations; and
//! how units in its shared memory are copied.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use transfer_engine::PeerId;

use super::context::Context;
use super::copy_path::{self, CopyPath};
use super::gpu::GpuGrants;
use super::memfd::PeerMapping;
use crate::TransportError;
use crate::node::LogKind;

/// Regions of shared memory one peer may grant this node (more are refused; their units are copied by
/// cross-memory attach instead).
const MAX_GRANTS: usize = 4096;

/// What a peer granted: regions of its shared memory, mapped here, by their address in the peer, and
/// its GPU allocations.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    shared: BTreeMap<u64, PeerMapping>,
    pub(crate) gpu: GpuGrants,
    /// Whether units in granted shared memory are copied by cross-memory attach (`None` until decided).
    pub(crate) by_cma: Option<bool>,
}

impl Grants {
    /// Maps a granted region (replacing an earlier grant at the same address).
    pub(crate) fn add(
        &mut self,
        address: u64,
        len: u64,
        fd: &OwnedFd,
    ) -> Result<(), TransportError> {
        if self.shared.len() >= MAX_GRANTS && !self.shared.contains_key(&address) {
            return Err(TransportError::protocol(
                "shm",
                format!("a grant beyond the {MAX_GRANTS} a peer may make"),
            ));
        }
        let len = usize::try_from(len)
            .map_err(|_| TransportError::protocol("shm", "a grant longer than memory"))?;
        let mapping = PeerMapping::map(fd, len).map_err(|e| TransportError::Io {
            backend: "shm",
            message: format!("a grant cannot be mapped: {e}"),
        })?;
        self.shared.insert(address, mapping);
        Ok(())
    }

    /// Decides, on the peer's first grant (the one at `address`), how units in its shared memory are
    /// copied: as configured, or by timing both paths on that grant (the result is logged).
    pub(crate) fn choose_path(&mut self, ctx: &Context, peer: PeerId, pid: i32, address: u64) {
        if self.by_cma.is_some() {
            return;
        }
        let by_cma = match ctx.cfg.copy_path {
            CopyPath::Mapping => false,
            CopyPath::CrossMemoryAttach => true,
            CopyPath::Measure => {
                let Some(mapping) = self.shared.get(&address) else {
                    return;
                };
                let found = copy_path::measure(mapping, pid, address);
                ctx.core.log.note(LogKind::Connected, Some(peer), format!(
                    "copy path for engine {}: {} (shared mapping {:.2} GB/s, cross-memory attach \
                     {:.2} GB/s, measured on its first grant)",
                    peer.0,
                    if found.cma { "cross-memory attach" } else { "shared mapping" },
                    found.mapping_gbps,
                    found.cma_gbps
                ));
                found.cma
            }
        };
        self.by_cma = Some(by_cma);
    }

    /// The mapping holding `len` bytes at `address` of the peer, and the offset of `address` in it.
    pub(crate) fn find(&self, address: u64, len: usize) -> Option<(&PeerMapping, usize)> {
        let (&start, mapping) = self.shared.range(..=address).next_back()?;
        let offset = usize::try_from(address - start).ok()?;
        (offset.checked_add(len)? <= mapping.len()).then_some((mapping, offset))
    }
}
