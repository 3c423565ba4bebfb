//! `te-bench overlap --backend tcp|loopback`: layer-wise streaming in real time over a real backend. The
//! producer streams every layer of a request with a prefetch depth; the consumer, for each layer in
//! order, tells the producer it is about to compute it, waits for it to arrive whole, and computes it for
//! a fixed time (a sleep: a GPU's compute does not take the host's cores). Each depth is reported against
//! `max(total transfer, total compute) + one layer of the smaller`, where total transfer is the same
//! request moved with no prefetch limit and nothing computed.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use backends::loopback::{CONSUMER, LoopbackPair};
use backends::tcp::{BlockingNode, TcpConfig};
use fabric_sim::{OverlapReport, OverlapRun};
use serde::Serialize;
use transfer_engine::{Dtype, KvLayout, MemoryRegion, SessionId, TransferMode, TransferRequest};

/// Transfers timed for the unlimited-transfer figure (its median is used).
const TRANSFER_RUNS: usize = 3;

/// One row of the report: a depth's run on a backend.
#[derive(Debug, Serialize)]
pub(crate) struct StreamRow {
    pub(crate) backend: &'static str,
    #[serde(flatten)]
    pub(crate) report: OverlapReport,
}

/// What a streaming run needs: the request, the memory on both ends, and the backend.
struct Rig {
    backend: Backend,
    req: TransferRequest,
    src: MemoryRegion,
    dst: MemoryRegion,
}

enum Backend {
    Tcp { tx: BlockingNode, rx: BlockingNode },
    Loopback(LoopbackPair),
}

impl Rig {
    fn new(backend: &str, layout: KvLayout) -> anyhow::Result<Self> {
        let len = crate::buffers::kv_len(layout)?;
        let mut kv = vec![0u8; len];
        crate::buffers::fill(&mut kv);
        let (src, dst) = (MemoryRegion::from_vec(kv), MemoryRegion::zeroed(len));
        let (backend, req) = match backend {
            "tcp" => {
                let rx = BlockingNode::start(TcpConfig::with_engine_id(2))?;
                let tx = BlockingNode::start_beside(&rx, {
                    let mut cfg = TcpConfig::with_engine_id(1);
                    cfg.listen = None;
                    cfg
                })?;
                let s = tx.register_kv_region(layout, src.clone())?;
                let d = rx.register_kv_region(layout, dst.clone())?;
                let addr = rx.node().local_addr().context("no listener")?;
                let peer = tx.connect(addr, None)?.peer;
                let req = TransferRequest::whole(peer, &s, &d)?;
                (Backend::Tcp { tx, rx }, req)
            }
            "loopback" => {
                let pair = LoopbackPair::with_defaults();
                let s = pair.producer().register_kv_region(layout, src.clone())?;
                let d = pair.consumer().register_kv_region(layout, dst.clone())?;
                let req = TransferRequest::whole(CONSUMER, &s, &d)?;
                (Backend::Loopback(pair), req)
            }
            other => bail!("--backend {other} is not one of sim, tcp, loopback"),
        };
        let req = req.with_mode(TransferMode::packetized());
        Ok(Self {
            backend,
            req,
            src,
            dst,
        })
    }

    fn submit(&self, req: TransferRequest) -> anyhow::Result<SessionId> {
        Ok(match &self.backend {
            Backend::Tcp { tx, .. } => tx.node().submit(req)?,
            Backend::Loopback(pair) => pair.submit(req)?,
        })
    }

    /// The consumer takes the notice of the next incoming session (it must be `session`).
    fn take_incoming(&self, session: SessionId) -> anyhow::Result<()> {
        let incoming = match &self.backend {
            Backend::Tcp { rx, .. } => rx.block_on(rx.node().next_incoming())?,
            Backend::Loopback(pair) => pair.block_on(pair.consumer().next_incoming())?,
        };
        if incoming.session != session {
            bail!(
                "accepted session {} while waiting for {session}",
                incoming.session
            );
        }
        Ok(())
    }

    fn consume_layer(&self, session: SessionId, layer: u32) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Tcp { rx, .. } => rx.node().consume_layer(session, layer)?,
            Backend::Loopback(pair) => pair.consumer().consume_layer(session, layer)?,
        };
        Ok(())
    }

    fn wait_layer(&self, session: SessionId, layer: u32) -> anyhow::Result<()> {
        match &self.backend {
            Backend::Tcp { rx, .. } => rx.block_on(rx.node().wait_layer(session, layer))?,
            Backend::Loopback(pair) => {
                pair.block_on(pair.consumer().wait_layer(session, layer))?;
            }
        }
        Ok(())
    }

    /// Waits until the sender has the session acknowledged (so the next run starts clean).
    fn wait_sent(&self, session: SessionId) -> anyhow::Result<()> {
        let recompute = match &self.backend {
            Backend::Tcp { tx, .. } => {
                tx.block_on(tx.node().wait(session, Duration::from_secs(600)))?
                    .recompute
            }
            Backend::Loopback(pair) => {
                pair.block_on(pair.producer().wait(session, Duration::from_secs(600)))?
                    .recompute
            }
        };
        if !recompute.is_empty() {
            bail!("{} blocks came back for recompute", recompute.len());
        }
        Ok(())
    }

    /// Zeroes the destination so each run's arrival is checked afresh.
    fn clear(&self) -> anyhow::Result<()> {
        self.dst.fill_with(|_, b| b.fill(0))?;
        Ok(())
    }

    fn intact(&self) -> anyhow::Result<bool> {
        let len = self.src.len();
        Ok(*self.src.read(0..len)? == *self.dst.read(0..len)?)
    }

    /// The whole request with no prefetch limit and no compute: time until the last layer arrived.
    fn transfer_time(&self, layers: u32) -> anyhow::Result<Duration> {
        self.clear()?;
        let start = Instant::now();
        let session = self.submit(self.req.clone())?;
        self.take_incoming(session)?;
        for layer in 0..layers {
            self.wait_layer(session, layer)?;
        }
        let took = start.elapsed();
        self.wait_sent(session)?;
        Ok(took)
    }

    /// The pipelined schedule at `depth`: returns (elapsed, time the consumer spent waiting, compute).
    fn pipelined(
        &self,
        layers: u32,
        depth: u32,
        compute: Duration,
    ) -> anyhow::Result<(Duration, Duration, Duration)> {
        self.clear()?;
        let start = Instant::now();
        let session = self.submit(self.req.clone().with_prefetch_depth(depth))?;
        self.take_incoming(session)?;
        let (mut stall, mut computed) = (Duration::ZERO, Duration::ZERO);
        for layer in 0..layers {
            self.consume_layer(session, layer)?;
            let waiting = Instant::now();
            self.wait_layer(session, layer)?;
            stall += waiting.elapsed();
            let computing = Instant::now();
            std::thread::sleep(compute);
            computed += computing.elapsed();
        }
        let took = start.elapsed();
        self.wait_sent(session)?;
        Ok((took, stall, computed))
    }
}

/// Runs the real-time overlap table on `backend` for each depth.
pub(crate) fn rows(
    backend: &'static str,
    layers: u32,
    layer_bytes: u64,
    block_bytes: u64,
    layer_compute: Option<Duration>,
    depths: &[u32],
) -> anyhow::Result<Vec<StreamRow>> {
    let blocks = u32::try_from(layer_bytes / block_bytes).context("too many blocks a layer")?;
    let layout = KvLayout::new(layers, blocks, block_bytes, 16, Dtype::Bf16)?;
    let rig = Rig::new(backend, layout)?;
    let mut times = Vec::with_capacity(TRANSFER_RUNS);
    rig.transfer_time(layers)?; // warm-up: lanes, caches, page faults
    for _ in 0..TRANSFER_RUNS {
        times.push(rig.transfer_time(layers)?);
    }
    times.sort();
    let transfer = times[TRANSFER_RUNS / 2];
    let intact_transfer = rig.intact()?;
    let per_layer = transfer / layers;
    // By default each layer computes as long as it takes to arrive: the balanced, hardest case.
    let compute = layer_compute.unwrap_or(per_layer);
    let mut rows = Vec::new();
    for &depth in depths {
        let (pipelined, stall, computed) = rig.pipelined(layers, depth, compute)?;
        let run = OverlapRun {
            layers,
            prefetch_depth: depth,
            layer_bytes,
            layer_compute: compute,
            transfer,
            compute: computed,
            pipelined,
            stall,
            intact: intact_transfer && rig.intact()?,
        };
        rows.push(StreamRow {
            backend,
            report: run.into(),
        });
    }
    Ok(rows)
}
