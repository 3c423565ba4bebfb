//! What the node's API, its driver and its listener share: the [`Context`] the links use too (with the
//! node's core), the links by peer and the memory granted to peers.

use std::collections::HashMap;
use std::ops::Deref;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};

use transfer_engine::PeerId;

use super::ShmConfig;
use super::cma::Credentials;
use super::context::Context;
use super::hello::{Hello, peer_of};
use super::link::{Link, LinkOwner, Outbound};
use crate::lock::lock;
use crate::node::LogKind;
use crate::transport::PeerInfo;

/// A region of shared memory this node allocated: its address, length and memfd (while it lives).
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) address: u64,
    pub(crate) len: u64,
    pub(crate) fd: Weak<OwnedFd>,
}

impl Pool {
    /// The grant of this pool, while its memory lives.
    pub(crate) fn grant(&self) -> Option<Outbound> {
        Some(Outbound::Grant(self.address, self.len, self.fd.upgrade()?))
    }
}

/// A GPU allocation this node exported (CUDA IPC): granted to every peer it links to while a registered
/// region lies in it.
#[derive(Debug)]
pub(crate) struct GpuPool {
    pub(crate) address: u64,
    pub(crate) len: u64,
    pub(crate) handle: Box<[u8; super::wire::GPU_HANDLE_LEN]>,
    /// The registered regions in it.
    pub(crate) regions: Vec<transfer_engine::RegionId>,
}

impl GpuPool {
    fn grant(&self) -> Outbound {
        Outbound::GpuGrant(self.address, self.len, self.handle.clone())
    }
}

/// The node beyond its [`Context`]: its links and what it grants them.
pub(crate) struct Shared {
    /// What the links use too: the engine, the configuration, counters and the log.
    pub(crate) ctx: Context,
    pub(crate) links: Mutex<HashMap<PeerId, Arc<Link>>>,
    /// Shared memory this node allocated, granted to every peer it links to.
    pub(crate) pools: Mutex<Vec<Pool>>,
    /// GPU allocations this node exported, granted to every peer it links to.
    pub(crate) gpu_pools: Mutex<Vec<GpuPool>>,
    pub(crate) handshakes: AtomicUsize,
    pub(crate) next_link: AtomicU64,
}

impl Deref for Shared {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.ctx
    }
}

impl LinkOwner for Shared {
    fn context(&self) -> &Context {
        &self.ctx
    }

    fn link_lost(&self, peer: PeerId, id: u64, why: &str) {
        Shared::link_lost(self, peer, id, why);
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("engine_id", &self.engine_id())
            .field("path", &self.cfg.socket_path)
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn new(cfg: ShmConfig, wake: mpsc::SyncSender<()>) -> Self {
        Self {
            ctx: Context::new(cfg, wake),
            links: Mutex::default(),
            pools: Mutex::default(),
            gpu_pools: Mutex::default(),
            handshakes: AtomicUsize::new(0),
            next_link: AtomicU64::new(1),
        }
    }

    /// This node's hello (or welcome).
    /// This node's hello (or welcome), with a fresh nonce.
    pub(crate) fn hello(&self) -> Result<Hello, String> {
        let nonce = crate::node::handshake::fresh("a nonce")?;
        Ok(Hello {
            engine_id: self.engine_id(),
            checksum: self.cfg.checksum,
            path: self.cfg.socket_path.clone(),
            probe: self.ctx.probe(),
            namespace: self.cfg.namespace.clone(),
            authenticated: self.cfg.secret.is_some(),
            nonce,
            segments: self.core.segments.list(),
        })
    }

    /// The live link to the peer listening at `path`, if any.
    pub(crate) fn link_at(&self, path: &std::path::Path) -> Option<Arc<Link>> {
        lock(&self.links)
            .values()
            .find(|l| l.path.as_deref() == Some(path))
            .cloned()
    }

    /// Makes a connection whose handshake passed a link of this node, unless its engine id is connected
    /// already or the node has `max_peers` links: `greet` (the welcome, on the listener's side) runs under
    /// the links' lock, so two connections claiming one engine id cannot both be admitted. A refusal is
    /// written to the peer, with its reason, before the connection closes.
    pub(crate) fn admit(
        self: &Arc<Self>,
        mut stream: UnixStream,
        creds: Credentials,
        hello: Hello,
        greet: impl FnOnce(&mut UnixStream) -> Result<(), String>,
    ) -> Result<Arc<Link>, String> {
        let peer = peer_of(&hello);
        let mut links = lock(&self.links);
        let refusal = if let Some(old) = links.get(&peer) {
            Some(format!(
                "engine id {} is already connected (process {})",
                peer.0, old.creds.pid
            ))
        } else if links.len() >= self.cfg.max_peers {
            Some(format!("this node has {} peers, its limit", links.len()))
        } else {
            greet(&mut stream).err()
        };
        if let Some(why) = refusal {
            super::wire::refuse(&mut stream, &why);
            return Err(why);
        }
        let id = self.next_link.fetch_add(1, Ordering::Relaxed);
        let owner: Weak<dyn LinkOwner> = Arc::downgrade(self) as Weak<Self>;
        let link = Link::start(owner, &self.ctx, id, stream, creds, hello)
            .map_err(|e| format!("cannot start the link: {e}"))?;
        links.insert(peer, link.clone());
        drop(links);
        self.grant_pools(&link);
        self.core.reachable_again(peer);
        self.core.log.note(
            LogKind::Connected,
            Some(peer),
            format!(
                "linked to engine {} (process {}, user {})",
                peer.0, creds.pid, creds.uid
            ),
        );
        Ok(link)
    }

    /// Queues grants of every live pool on `link` (dropping the pools whose memory is gone).
    fn grant_pools(&self, link: &Link) {
        let mut pools = lock(&self.pools);
        pools.retain(|p| p.fd.strong_count() > 0);
        for grant in pools.iter().filter_map(Pool::grant) {
            link.send(grant);
        }
        drop(pools);
        for pool in lock(&self.gpu_pools).iter() {
            link.send(pool.grant());
        }
    }

    /// Records that registered region `id` lies in the exported GPU allocation `address..+len`, and
    /// grants the allocation to every linked peer the first time.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn add_gpu_region(
        &self,
        id: transfer_engine::RegionId,
        address: u64,
        len: u64,
        handle: [u8; super::wire::GPU_HANDLE_LEN],
    ) {
        let mut pools = lock(&self.gpu_pools);
        if let Some(pool) = pools.iter_mut().find(|p| p.address == address) {
            pool.regions.push(id);
            return;
        }
        let pool = GpuPool {
            address,
            len,
            handle: Box::new(handle),
            regions: vec![id],
        };
        for link in lock(&self.links).values() {
            link.send(pool.grant());
        }
        pools.push(pool);
    }

    /// Forgets region `id` in the GPU pools; an allocation with no registered region left is no longer
    /// granted to new peers (peers that opened it keep their mapping until their link ends).
    pub(crate) fn remove_gpu_region(&self, id: transfer_engine::RegionId) {
        let mut pools = lock(&self.gpu_pools);
        for pool in pools.iter_mut() {
            pool.regions.retain(|r| *r != id);
        }
        pools.retain(|p| !p.regions.is_empty());
    }

    /// Records a pool and grants it to every linked peer.
    pub(crate) fn add_pool(&self, pool: Pool) {
        let grant = pool.grant();
        lock(&self.pools).push(pool);
        if let Some(Outbound::Grant(address, len, fd)) = grant {
            for link in lock(&self.links).values() {
                link.send(Outbound::Grant(address, len, fd.clone()));
            }
        }
    }

    /// Ends link `id` to `peer` (its socket closed, it broke the protocol, or it stalled): its sessions end
    /// with recompute here, and new ones are refused until the peer is reached again. A newer link to the
    /// same peer is left alone.
    pub(crate) fn link_lost(&self, peer: PeerId, id: u64, why: &str) {
        let removed = {
            let mut links = lock(&self.links);
            match links.get(&peer) {
                Some(l) if l.id == id => links.remove(&peer),
                _ => None,
            }
        };
        let Some(link) = removed else {
            return;
        };
        link.close();
        self.counters.peers_lost.fetch_add(1, Ordering::Relaxed);
        let reason = format!(
            "unreachable: engine {} (process {}) {why}",
            peer.0, link.creds.pid
        );
        self.core
            .declare_unreachable(peer, reason, std::time::Instant::now());
        self.wake();
    }

    /// What this node knows of `peer`.
    pub(crate) fn peer_info(&self, peer: PeerId) -> Option<PeerInfo> {
        lock(&self.links).get(&peer).map(|l| PeerInfo {
            peer,
            segments: l.segments.clone(),
        })
    }
}
