//! The conformance suite's pairs: a sender and a receiver of one backend, what a check sets up on them,
//! and the fixture of each backend.

use std::sync::Arc;
use std::time::Duration;

use backends::{PeerInfo, Transport};
use transfer_engine::{
    BlockId, Dtype, KvLayout, MemoryRegion, PeerId, RegionHandle, SessionId, TransferRequest,
};

#[cfg(feature = "rdma")]
use super::common;
use super::common::runtime;

/// 4 layers x 8 blocks x 16 KiB: small enough for a debug build, several slices a block.
pub(crate) fn layout() -> KvLayout {
    KvLayout::new(4, 8, 16 << 10, 16, Dtype::Bf16).unwrap()
}

/// Longest any wait may take before the test calls it a hang (never a timing assertion).
pub(crate) const HANG: Duration = Duration::from_secs(60);

pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8)
        .collect()
}

/// A sender and a receiver of one backend, and the runtime their waits (and TCP's tasks) run on.
pub(crate) struct Pair {
    pub(crate) sender: Arc<dyn Transport>,
    pub(crate) receiver: Arc<dyn Transport>,
    pub(crate) rt: tokio::runtime::Runtime,
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _guard = self.rt.enter();
        self.sender.shutdown();
        self.receiver.shutdown();
    }
}

/// A source region on the sender, the receiver's pool (and a spare region) published, and the sender's
/// view of the receiver.
pub(crate) struct Setup {
    pub(crate) src: RegionHandle,
    pub(crate) source: Vec<u8>,
    pub(crate) pool: MemoryRegion,
    pub(crate) peer: PeerInfo,
}

impl Pair {
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Runs `f`, at most [`HANG`] (longer is a hang: the test fails).
    pub(crate) fn within<F: std::future::Future>(
        &self,
        f: F,
    ) -> Result<F::Output, tokio::time::error::Elapsed> {
        self.rt
            .block_on(async { tokio::time::timeout(HANG, f).await })
    }

    pub(crate) fn setup(&self) -> Setup {
        let layout = layout();
        let bytes = layout.total_bytes() as usize;
        let source = pattern(bytes, 7);
        let src = self
            .sender
            .register_kv_region(layout, MemoryRegion::from_vec(source.clone()))
            .unwrap();
        let pool = MemoryRegion::zeroed(bytes);
        let dst = self
            .receiver
            .register_kv_region(layout, pool.clone())
            .unwrap();
        self.receiver.publish_segment("kv", dst).unwrap();
        let address = self.receiver.address().expect("a receiver has an address");
        let peer = self.block_on(self.sender.connect(&address)).unwrap();
        assert_eq!(peer.peer, PeerId(u64::from(self.receiver.engine_id())));
        Setup {
            src,
            source,
            pool,
            peer,
        }
    }

    /// Starts a session of which only layer 0 is written (it cannot finish by itself) and waits until the
    /// receiver has layer 0 whole.
    pub(crate) fn layer_zero_only(&self, s: &Setup) -> SessionId {
        let session = self
            .sender
            .submit(s.request().with_layers_written(1))
            .unwrap();
        self.block_on(async {
            self.receiver.wait_announced(session).await?;
            self.receiver.wait_layer(session, 0).await
        })
        .unwrap();
        session
    }

    /// Waits for sending session `session` and checks it delivered everything.
    pub(crate) fn delivered(&self, session: SessionId) {
        let out = self
            .block_on(self.sender.wait(session, HANG))
            .unwrap_or_else(|e| panic!("{} session {session}: {e}", self.sender.backend()));
        assert!(out.recompute.is_empty(), "{out:?}");
        let got = self
            .within(self.receiver.wait_received(session))
            .expect("the receiver hears the end of the session")
            .unwrap();
        assert!(got.recompute.is_empty(), "{got:?}");
    }
}

impl Setup {
    pub(crate) fn dst(&self) -> RegionHandle {
        *self.peer.segment("kv").expect("the receiver offers kv")
    }

    pub(crate) fn request(&self) -> TransferRequest {
        TransferRequest::whole(self.peer.peer, &self.src, &self.dst())
            .unwrap()
            .with_deadline(Duration::from_secs(30))
    }

    pub(crate) fn layer_bytes(&self, layer: u32) -> (Vec<u8>, Vec<u8>) {
        let layout = layout();
        let at = layout.block_offset(BlockId::new(layer, 0)) as usize;
        let len = (layout.blocks_per_layer as u64 * layout.block_bytes) as usize;
        (
            self.pool.read(at..at + len).unwrap().to_vec(),
            self.source[at..at + len].to_vec(),
        )
    }
}

pub(crate) fn loopback() -> Option<Pair> {
    let (sender, receiver) = backends::loopback::LoopbackPair::with_defaults().into_nodes();
    Some(Pair {
        sender: Arc::new(sender),
        receiver: Arc::new(receiver),
        rt: runtime(),
    })
}

pub(crate) fn tcp() -> Option<Pair> {
    use backends::tcp::{TcpConfig, TcpNode};
    let rt = runtime();
    let (sender, receiver) = rt.block_on(async {
        let sender = TcpNode::start({
            let mut cfg = TcpConfig::with_engine_id(1);
            cfg.listen = None;
            cfg
        })
        .await
        .unwrap();
        let receiver = TcpNode::start(TcpConfig::with_engine_id(2)).await.unwrap();
        (sender, receiver)
    });
    Some(Pair {
        sender: Arc::new(sender),
        receiver: Arc::new(receiver),
        rt,
    })
}

/// Nodes on libfabric provider `provider`, under the RDMA tests' one rule (`common::on_listed_provider`):
/// "not run" only where libfabric does not list it; a listed provider that fails to start fails the test.
#[cfg(feature = "rdma")]
pub(crate) fn rdma(provider: &str, domain: Option<&str>) -> Option<Pair> {
    use backends::rdma::{Provider, RdmaConfig, RdmaNode};
    let start = |id| {
        let mut cfg = RdmaConfig::new(id, Provider::Named(provider.into()));
        cfg.domain = domain.map(str::to_owned);
        cfg.liveness.answer_timeout = Duration::from_secs(1);
        RdmaNode::start(cfg)
    };
    let (sender, receiver) = common::on_listed_provider(provider, domain, || {
        Ok::<_, backends::TransportError>((start(1)?, start(2)?))
    })?;
    Some(Pair {
        sender: Arc::new(sender),
        receiver: Arc::new(receiver),
        rt: runtime(),
    })
}

/// Two same-host nodes in this process (cross-memory attach copies from this process itself), each
/// listening on a socket of its own.
#[cfg(target_os = "linux")]
pub(crate) fn shm() -> Option<Pair> {
    use backends::shm::{ShmConfig, ShmNode};
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let path = |id: u32| {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        std::env::temp_dir().join(format!(
            "te-conformance-{}-{n}-{id}.sock",
            std::process::id()
        ))
    };
    let start = |id| ShmNode::start(ShmConfig::new(id, Some(path(id)))).unwrap();
    Some(Pair {
        sender: Arc::new(start(1)),
        receiver: Arc::new(start(2)),
        rt: runtime(),
    })
}
