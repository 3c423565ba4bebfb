//! The data plane under a connector: a main [`Transport`] (loopback, TCP, RDMA, shm) and, optionally, a
//! same-host one beside it for peers on this host, and the few waits the connector builds from their calls.
//!
//! A session lives on one of the two ([`Via`]); every call about it goes to that transport. Traffic shaping
//! (the KV bandwidth cap) applies to the main transport only: same-host copies never touch the NIC.

use std::sync::Arc;
use std::time::Duration;

use backends::board::Outcome;
use backends::{PeerAddress, PeerInfo, Transport, TransportError, WaitError};
use serde::{Deserialize, Serialize};
use transfer_engine::{
    BlockId, KvLayout, MemoryRegion, PeerId, RegionHandle, SessionId, ShapingConfig,
    TransferRequest,
};

use crate::error::ConnectorError;

/// Which of a data plane's transports carries a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Via {
    /// The main transport (TCP, RDMA, ...).
    #[default]
    Main,
    /// The same-host transport (shared memory), for a peer on this host.
    SameHost,
}

/// A session and the transport that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlaneSession {
    pub(crate) via: Via,
    pub(crate) id: SessionId,
}

/// A consumer's same-host endpoint, named in its loads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SameHostEndpoint {
    /// The host its same-host transport runs on ([`crate::this_host`]).
    pub(crate) host: String,
    /// The same-host transport's address.
    pub(crate) addr: String,
}

/// Where a consumer's node receives loads: its main transport's address, and its same-host endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoints {
    pub(crate) main: PeerAddress,
    pub(crate) same_host: Option<SameHostEndpoint>,
}

/// A consumer as a producer sends to it: over which transport, to which peer, into which region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Destination {
    pub(crate) via: Via,
    pub(crate) peer: PeerId,
    pub(crate) region: RegionHandle,
}

/// A region registered on every transport of a data plane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlaneRegion {
    pub(crate) main: RegionHandle,
    pub(crate) same_host: Option<RegionHandle>,
}

impl PlaneRegion {
    /// The region's handle on the transport `via` names.
    pub(crate) fn on(&self, via: Via) -> Result<&RegionHandle, ConnectorError> {
        match via {
            Via::Main => Ok(&self.main),
            Via::SameHost => self.same_host.as_ref().ok_or_else(no_same_host),
        }
    }

    /// The region's layout (the same on every transport).
    pub(crate) fn layout(&self) -> Option<KvLayout> {
        self.main.layout
    }
}

/// A same-host transport and the host it runs on: a connector uses it for peers that name the same host,
/// its main transport for the rest.
#[derive(Debug, Clone)]
pub struct SameHostTransport {
    transport: Arc<dyn Transport>,
    host: String,
}

impl SameHostTransport {
    /// `transport` on this host ([`this_host`]).
    #[must_use]
    pub fn new(transport: Arc<dyn Transport>) -> SameHostTransport {
        SameHostTransport::on_host(transport, this_host())
    }

    /// `transport`, said to run on `host`: peers naming another host are reached over the main transport.
    #[must_use]
    pub fn on_host(transport: Arc<dyn Transport>, host: impl Into<String>) -> SameHostTransport {
        SameHostTransport {
            transport,
            host: host.into(),
        }
    }

    /// The host it runs on.
    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }
}

/// This host, as same-host peers recognise each other: the kernel's boot id with the host name (two
/// containers of one kernel usually differ by name, and may not share a socket directory). Where neither
/// can be read, a name that matches no other process's, so nobody is taken for a same-host peer.
#[must_use]
pub fn this_host() -> String {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    match (
        read("/proc/sys/kernel/random/boot_id"),
        read("/proc/sys/kernel/hostname"),
    ) {
        (None, None) => format!("unknown-host-{}", std::process::id()),
        (boot, name) => format!("{}/{}", boot.unwrap_or_default(), name.unwrap_or_default()),
    }
}

fn no_same_host() -> ConnectorError {
    ConnectorError::Config("this connector has no same-host transport".into())
}

/// Where a connector's KV travels, shared by the connector's halves.
#[derive(Debug, Clone)]
pub(crate) struct DataPlane {
    main: Arc<dyn Transport>,
    same_host: Option<SameHostTransport>,
}

/// How waiting for a layer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LayerWait {
    /// The layer arrived whole and verified.
    Arrived,
    /// The session ended without it: these destination blocks must be recomputed.
    Lost(Vec<BlockId>),
}

impl DataPlane {
    pub(crate) fn new(main: Arc<dyn Transport>) -> Self {
        Self {
            main,
            same_host: None,
        }
    }

    pub(crate) fn with_same_host(main: Arc<dyn Transport>, same_host: SameHostTransport) -> Self {
        Self {
            main,
            same_host: Some(same_host),
        }
    }

    fn on(&self, via: Via) -> Result<&Arc<dyn Transport>, ConnectorError> {
        match via {
            Via::Main => Ok(&self.main),
            Via::SameHost => Ok(&self.same_host.as_ref().ok_or_else(no_same_host)?.transport),
        }
    }

    fn all(&self) -> impl Iterator<Item = &Arc<dyn Transport>> {
        std::iter::once(&self.main).chain(self.same_host.as_ref().map(|s| &s.transport))
    }

    /// The engine ids of its transports (the main one first): a producer sends a consumer's loads only
    /// to these.
    pub(crate) fn engines(&self) -> Vec<u32> {
        self.all().map(|t| t.engine_id()).collect()
    }

    /// The main transport's backend name.
    pub(crate) fn backend(&self) -> &'static str {
        self.main.backend()
    }

    /// Registers `memory` as a KV region of `layout` on every transport.
    pub(crate) fn register(
        &self,
        layout: KvLayout,
        memory: MemoryRegion,
    ) -> Result<PlaneRegion, ConnectorError> {
        let main = self.main.register_kv_region(layout, memory.clone())?;
        let same_host = match &self.same_host {
            Some(s) => Some(s.transport.register_kv_region(layout, memory)?),
            None => None,
        };
        Ok(PlaneRegion { main, same_host })
    }

    /// Offers a registered region to producers under `name`, on every transport.
    pub(crate) fn publish(&self, name: &str, region: PlaneRegion) -> Result<(), ConnectorError> {
        self.main.publish_segment(name, region.main)?;
        if let (Some(s), Some(handle)) = (&self.same_host, region.same_host) {
            s.transport.publish_segment(name, handle)?;
        }
        Ok(())
    }

    /// Where producers reach this end over the main transport.
    pub(crate) fn address(&self) -> Option<PeerAddress> {
        self.main.address()
    }

    /// Where producers reach this end: the main transport's address (`None`: it does not listen), and
    /// this end's host and same-host address if its same-host transport listens.
    pub(crate) fn endpoints(&self) -> Option<Endpoints> {
        let same_host = self.same_host.as_ref().and_then(|s| {
            Some(SameHostEndpoint {
                host: s.host.clone(),
                addr: s.transport.address()?.to_string(),
            })
        });
        Some(Endpoints {
            main: self.main.address()?,
            same_host,
        })
    }

    /// Whether a peer on `host` is on this end's host, and this end can reach it there.
    pub(crate) fn shares_host(&self, host: &str) -> bool {
        self.same_host.as_ref().is_some_and(|s| s.host == host)
    }

    /// Reaches a consumer's node over `via`.
    pub(crate) async fn connect(
        &self,
        via: Via,
        address: &PeerAddress,
    ) -> Result<PeerInfo, ConnectorError> {
        Ok(self.on(via)?.connect(address).await?)
    }

    /// Sets this end's traffic shaping (the KV bandwidth cap), on the main transport.
    pub(crate) fn set_shaping(&self, shaping: ShapingConfig) -> Result<(), ConnectorError> {
        Ok(self.main.set_shaping(shaping)?)
    }

    /// Starts a transfer from this end over `via`.
    pub(crate) fn submit(
        &self,
        via: Via,
        req: TransferRequest,
    ) -> Result<PlaneSession, ConnectorError> {
        let id = self.on(via)?.submit(req)?;
        Ok(PlaneSession { via, id })
    }

    /// The producer has saved every layer below `until` of the blocks sending session `session` carries.
    pub(crate) fn layers_written(
        &self,
        session: PlaneSession,
        until: u32,
    ) -> Result<(), ConnectorError> {
        Ok(self.on(session.via)?.layers_written(session.id, until)?)
    }

    /// Stops sending session `session`; its unacknowledged blocks are recomputed.
    pub(crate) fn cancel(&self, session: PlaneSession) -> Result<(), ConnectorError> {
        Ok(self.on(session.via)?.cancel(session.id)?)
    }

    /// Waits until sending session `session` is over.
    pub(crate) async fn wait_sent(
        &self,
        session: PlaneSession,
        limit: Duration,
    ) -> Result<Outcome, ConnectorError> {
        Ok(self.on(session.via)?.wait(session.id, limit).await?)
    }

    /// Tells the sender the consumer is at `layer` of `session`, then waits until that layer is whole, or
    /// the session ended without it. A session this end has not heard of yet (the producer's answer can
    /// overtake its first frame) is waited for until it is announced; the caller bounds the wait.
    pub(crate) async fn wait_layer(
        &self,
        session: PlaneSession,
        layer: u32,
    ) -> Result<LayerWait, ConnectorError> {
        let t = self.on(session.via)?;
        t.wait_announced(session.id).await?;
        // Moves the prefetch window; a session that already finished answers from the board.
        let _ = t.consume_layer(session.id, layer);
        match t.wait_layer(session.id, layer).await {
            Ok(()) => Ok(LayerWait::Arrived),
            Err(TransportError::Wait(WaitError::LayerLost { blocks, .. })) => {
                Ok(LayerWait::Lost(blocks))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the whole prefetch window of receiving session `session` (whose last layer is `last`: no
    /// compute runs alongside), then waits until it is over; returns its destination blocks that did not
    /// arrive intact. The caller bounds the wait.
    pub(crate) async fn wait_whole(
        &self,
        session: PlaneSession,
        last: u32,
    ) -> Result<Vec<BlockId>, ConnectorError> {
        let t = self.on(session.via)?;
        t.wait_announced(session.id).await?;
        let _ = t.consume_layer(session.id, last);
        Ok(t.wait_received(session.id).await?.recompute)
    }

    /// Stops placing the bytes of receiving session `session`: its blocks are recomputed instead.
    pub(crate) fn abandon(&self, session: PlaneSession) -> Result<(), ConnectorError> {
        Ok(self.on(session.via)?.abandon_receive(session.id)?)
    }

    /// Destination blocks of receiving session `session` that did not arrive intact, once it is over
    /// (`None` if that is not known within `limit`).
    pub(crate) async fn unfinished_blocks(
        &self,
        session: PlaneSession,
        limit: Duration,
    ) -> Option<Vec<BlockId>> {
        let t = self.on(session.via).ok()?;
        tokio::time::timeout(limit, t.wait_received(session.id))
            .await
            .ok()
            .and_then(Result::ok)
            .map(|r| r.recompute)
    }

    /// Accepts incoming sessions on every transport forever (the connector tracks them by id), so their
    /// notices never pile up. Ends when the nodes shut down.
    pub(crate) async fn drain_incoming(self) {
        let drain = |t: Arc<dyn Transport>| async move { while t.next_incoming().await.is_ok() {} };
        match self.same_host {
            Some(s) => {
                tokio::join!(drain(self.main), drain(s.transport));
            }
            None => drain(self.main).await,
        }
    }

    /// Data frames this end sent again, on every transport.
    pub(crate) fn retransmits(&self) -> u64 {
        self.all().map(|t| t.counters().retransmits).sum()
    }

    /// Stops every transport.
    pub(crate) fn shutdown(&self) {
        for t in self.all() {
            t.shutdown();
        }
    }
}
