//! `te-bench serve` and `te-bench connect`: two processes moving KV over TCP as a deployment would.
//!
//! The server listens and allocates, for each client, a KV region of the layout the client asks for in
//! the handshake (up to `--serve-bytes`, reused for repeat layouts). The client pushes its KV there and
//! prints the same keys as `te-bench run`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use backends::tcp::{BlockingNode, Secret, TcpConfig};
use backends::{IncomingSession, Outcome};
use benches::socket_copy_gbps;
use clap::Args;
use tokio::sync::broadcast::{self, error::RecvError};
use transfer_engine::{
    Event, KvLayout, MemoryRegion, RegionId, Role, SessionId, TransferMode, TransferRequest,
};

use crate::args::{fmt_size, parse_size};
use crate::report::print_rows;
use crate::run::{ModeArg, RUN_COLUMNS, RunRow, layout_for, row};
use crate::verify::Verifier;

/// Arguments of `te-bench serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Backend: tcp; rdma (feature `rdma`; serves one region of --block-bytes x --total-bytes and
    /// prints the endpoint address clients pass as --peer-address); or shm (same host; serves one such
    /// region on --socket).
    #[arg(long, value_enum, default_value = "tcp")]
    pub(crate) backend: NetBackend,
    /// libfabric provider for --backend rdma: tcp, shm, verbs, efa, a full name, auto (efa, then
    /// verbs, then tcp, whichever is found first) or auto-local (shm before tcp: every peer on this host).
    #[arg(long, default_value = "tcp")]
    pub(crate) provider: String,
    /// libfabric domain for --backend rdma (a NIC, or `lo`; the tcp provider defaults to `lo`).
    #[arg(long)]
    pub(crate) domain: Option<String>,
    /// Bytes per KV block of the region served over RDMA or shm, with a unit.
    #[arg(long, value_parser = parse_size, default_value = "256KiB")]
    pub(crate) block_bytes: u64,
    /// Bytes of the region served over RDMA or shm, with a unit (rounded down to whole blocks).
    #[arg(long, value_parser = parse_size, default_value = "512MiB")]
    pub(crate) total_bytes: u64,
    /// Address to listen on, e.g. 127.0.0.1:7400 (a non-loopback address needs --secret).
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// This server's engine id; every client needs a different one.
    #[arg(long, default_value_t = 2)]
    pub(crate) engine_id: u32,
    /// Most bytes of KV regions allocated for clients, with a unit: 512MiB, 4GiB.
    #[arg(long, value_parser = parse_size, default_value = "4GiB")]
    serve_bytes: u64,
    /// Shared secret; clients must present the same one (HMAC-SHA256 challenge in both directions).
    #[arg(long)]
    secret: Option<String>,
    /// Most lanes (TCP connections) per client.
    #[arg(long, default_value_t = 2)]
    lanes: usize,
    /// Milliseconds a client may stall mid-frame, or leave what the server writes unread, before it
    /// loses its lane (Liveness::stall_timeout).
    #[arg(long, default_value_t = 10_000)]
    stall_ms: u64,
    /// Milliseconds a lane a client dialed may stay silent with no session live before it is closed
    /// (Liveness::inbound_idle_timeout).
    #[arg(long, default_value_t = 120_000)]
    idle_ms: u64,
    /// Milliseconds allowed for a connection's handshake (Liveness::handshake_timeout).
    #[arg(long, default_value_t = 5_000)]
    handshake_ms: u64,
    /// Most connections one IP address may hold (StrangerLimits::max_connections_per_address).
    #[arg(long, default_value_t = 128)]
    connections_per_address: usize,
    /// Most engines one IP address may have connected at once (StrangerLimits::max_peers_per_address).
    #[arg(long, default_value_t = 64)]
    peers_per_address: usize,
    /// Most of --serve-bytes the clients of one IP address may hold, with a unit (default: all of it;
    /// Serving::serve_bytes_per_address).
    #[arg(long, value_parser = parse_size)]
    serve_bytes_per_address: Option<u64>,
    /// Data payload bytes a second the lanes of one IP address together are read at, with a unit (e.g.
    /// 500MiB; default 0: unlimited; StrangerLimits::data_bytes_per_sec_per_address).
    #[arg(long, value_parser = parse_size, default_value = "0")]
    data_bytes_per_sec_per_address: u64,
    /// Data payload bytes a second the lanes of one peer (engine id) together are read at, with a unit
    /// (default 0: unlimited; StrangerLimits::data_bytes_per_sec_per_peer).
    #[arg(long, value_parser = parse_size, default_value = "0")]
    data_bytes_per_sec_per_peer: u64,
    /// Stop after this many seconds; 0 serves until killed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seconds: u64,
    /// Unix socket of --backend shm (created mode 0600, a stale socket file replaced).
    #[arg(long, default_value = "/tmp/te-bench-shm.sock")]
    pub(crate) socket: std::path::PathBuf,
    /// --backend shm: no CRC-32C (on only when both ends turn it off).
    #[arg(long)]
    pub(crate) no_checksum: bool,
    /// Check every finished session's region against the pattern its client fills (`te-bench connect`
    /// seeds it with its engine id) and print `verified` or `MISMATCH` for it.
    #[arg(long)]
    pub(crate) verify: bool,
}

/// Arguments of `te-bench connect`.
#[derive(Debug, Args)]
pub(crate) struct ConnectArgs {
    /// Backend: tcp, rdma (feature `rdma`; the server's endpoint address goes in --peer-address), or
    /// shm (same host; the server's socket goes in --socket).
    #[arg(long, value_enum, default_value = "tcp")]
    pub(crate) backend: NetBackend,
    /// Address of a `te-bench serve` over TCP, e.g. 127.0.0.1:7400.
    #[arg(long)]
    peer: Option<SocketAddr>,
    /// Endpoint address (hex) a `te-bench serve --backend rdma` printed.
    #[arg(long)]
    pub(crate) peer_address: Option<String>,
    /// libfabric provider for --backend rdma: tcp, shm, verbs, efa, a full name, auto (efa, then
    /// verbs, then tcp, whichever is found first) or auto-local (shm before tcp: every peer on this host).
    #[arg(long, default_value = "tcp")]
    pub(crate) provider: String,
    /// libfabric domain for --backend rdma (a NIC, or `lo`; the tcp provider defaults to `lo`).
    #[arg(long)]
    pub(crate) domain: Option<String>,
    /// Bytes per transfer, with a unit (layers x blocks x block bytes; rounded down to whole blocks).
    #[arg(long, value_parser = parse_size, default_value = "512MiB")]
    pub(crate) total_bytes: u64,
    /// Bytes per KV block, with a unit: 64KiB, 1MiB, 4MiB.
    #[arg(long, value_parser = parse_size, default_value = "256KiB")]
    pub(crate) block_bytes: u64,
    /// Wire mode; repeat or omit to run every mode.
    #[arg(long, value_enum)]
    pub(crate) mode: Vec<ModeArg>,
    /// Slice size of packetized and auto modes, in bytes (with a unit).
    #[arg(long, value_parser = parse_size, default_value = "64KiB")]
    pub(crate) slice_bytes: u64,
    /// Measured transfers per mode (after one warm-up); throughput is their median.
    #[arg(long, default_value_t = 5)]
    pub(crate) iterations: usize,
    /// This client's engine id; must differ from the server's.
    #[arg(long, default_value_t = 1)]
    pub(crate) engine_id: u32,
    /// Shared secret, as configured on the server.
    #[arg(long)]
    secret: Option<String>,
    /// Most lanes (TCP connections) to the server.
    #[arg(long, default_value_t = 2)]
    lanes: usize,
    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Skip measuring the local limits (their ratio columns read 0); for many clients at once.
    #[arg(long)]
    pub(crate) no_limit: bool,
    /// Unix socket of a `te-bench serve --backend shm`.
    #[arg(long, default_value = "/tmp/te-bench-shm.sock")]
    pub(crate) socket: std::path::PathBuf,
    /// --backend shm: the source in private memory, copied by cross-memory attach (backend
    /// `shm-cma`), instead of in shared memory granted to the server.
    #[arg(long)]
    pub(crate) private: bool,
    /// --backend shm: no CRC-32C (on only when both ends turn it off).
    #[arg(long)]
    pub(crate) no_checksum: bool,
}

/// The backends `serve` and `connect` run over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum NetBackend {
    /// TCP nodes (lanes, handshake, regions served on request).
    Tcp,
    /// libfabric nodes (feature `rdma`).
    Rdma,
    /// Same-host nodes (a Unix socket; shared memory or cross-memory attach).
    Shm,
}

/// Serves until killed (or `--seconds`): accepts clients, gives each the region it asks for, and prints a
/// line per finished session.
pub(crate) fn serve_main(args: &ServeArgs) -> anyhow::Result<()> {
    if args.backend != NetBackend::Tcp {
        bail!("serve over RDMA or shm runs through `rdma_net::serve` or `shm_net::serve`");
    }
    let mut cfg = TcpConfig::with_engine_id(args.engine_id);
    cfg.listen = Some(args.listen);
    cfg.security.secret = args.secret.as_deref().map(Secret::from);
    cfg.serving.serve_bytes = args.serve_bytes;
    cfg.limits.max_lanes_per_peer = args.lanes.max(1);
    cfg.liveness.stall_timeout = Duration::from_millis(args.stall_ms);
    cfg.liveness.inbound_idle_timeout = Some(Duration::from_millis(args.idle_ms));
    cfg.liveness.handshake_timeout = Duration::from_millis(args.handshake_ms);
    cfg.limits.max_connections_per_address = args.connections_per_address;
    cfg.limits.max_peers_per_address = args.peers_per_address;
    cfg.serving.serve_bytes_per_address = args.serve_bytes_per_address;
    cfg.limits.data_bytes_per_sec_per_address = args.data_bytes_per_sec_per_address;
    cfg.limits.data_bytes_per_sec_per_peer = args.data_bytes_per_sec_per_peer;
    let node = BlockingNode::start(cfg).context("starting the server")?;
    let addr = node.node().local_addr().context("no listener")?;
    println!(
        "te-bench serve: engine {} listening on {addr}, serving up to {} of KV regions",
        args.engine_id,
        fmt_size(args.serve_bytes)
    );
    let stop = (args.seconds > 0).then(|| Instant::now() + Duration::from_secs(args.seconds));
    node.block_on(serve_events(node.node(), args.verify, stop))
}

/// What `te-bench serve` needs of a node, over TCP or RDMA.
pub(crate) trait ServedNode {
    /// Every event from now on.
    fn subscribe(&self) -> broadcast::Receiver<Event>;
    /// The next incoming session; `None` once the node is shut down.
    async fn next_incoming(&self) -> Option<IncomingSession>;
    /// The memory behind a registered region.
    fn memory(&self, id: RegionId) -> anyhow::Result<MemoryRegion>;
    /// The layout of a registered region, if it has one.
    fn layout(&self, id: RegionId) -> Option<KvLayout>;
    /// The node's log lines after the first `seen`, and how many there are now (none by default).
    fn log_after(&self, seen: u64) -> (Vec<String>, u64) {
        (Vec::new(), seen)
    }
}

impl ServedNode for backends::tcp::TcpNode {
    fn subscribe(&self) -> broadcast::Receiver<Event> {
        backends::tcp::TcpNode::subscribe(self)
    }
    async fn next_incoming(&self) -> Option<IncomingSession> {
        backends::tcp::TcpNode::next_incoming(self).await.ok()
    }
    fn memory(&self, id: RegionId) -> anyhow::Result<MemoryRegion> {
        Ok(backends::tcp::TcpNode::memory(self, id)?)
    }
    fn layout(&self, id: RegionId) -> Option<KvLayout> {
        self.region_layout(id).ok().flatten()
    }
    fn log_after(&self, seen: u64) -> (Vec<String>, u64) {
        backends::tcp::TcpNode::log_after(self, seen)
    }
}

/// Prints a line per accepted session and per finished one (with `verify`, whether the bytes it wrote
/// are its client's, checked by [`Verifier`], with a summary line whenever the tally changed), and the
/// node's log every half second, until `stop` (or forever).
pub(crate) async fn serve_events(
    node: &impl ServedNode,
    verify: bool,
    stop: Option<Instant>,
) -> anyhow::Result<()> {
    let mut events = node.subscribe();
    let mut logged = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut verifier = Verifier::default();
    let mut told = verifier.tally();
    loop {
        let until = stop.map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(Instant::now())
        });
        // Notices first: a session's notice is queued before its end is.
        tokio::select! {
            biased;
            incoming = node.next_incoming() => {
                let Some(s) = incoming else { return Ok(()) };
                print_incoming(&s);
                if verify && let Some(line) = verifier.incoming(&s) {
                    println!("{line}");
                }
            }
            event = events.recv() => match event {
                Ok(event) => {
                    if let Some(session) = print_event(&event)
                        && verify
                        && let Event::Completed { stats, .. } = &event
                    {
                        let line = verifier.completed(
                            session,
                            stats.recompute_blocks,
                            |r| node.memory(r),
                            |r| node.layout(r),
                        );
                        println!("{line}");
                    } else if verify && let Event::Aborted { session, .. } = &event {
                        verifier.aborted(*session);
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    eprintln!("(missed {n} events: printing fell behind)");
                    verifier.missed(n);
                }
                Err(RecvError::Closed) => return Ok(()),
            },
            _ = tick.tick() => {
                let (lines, newest) = node.log_after(logged);
                logged = newest;
                for line in lines {
                    eprintln!("{line}");
                }
                if verify && verifier.tally() != told {
                    told = verifier.tally();
                    println!("{}", verifier.summary());
                }
            }
            () = tokio::time::sleep(until) => {
                if verify {
                    println!("{}", verifier.summary());
                }
                return Ok(());
            }
        }
    }
}

/// Prints the line a server gives a session it accepted.
pub(crate) fn print_incoming(s: &IncomingSession) {
    println!(
        "session {} from engine {}: layers {:?} of {} blocks into region {}",
        s.session,
        s.peer.0,
        s.layers,
        s.blocks.len(),
        s.region
    );
}

/// Prints the line a server gives an engine event, if any; returns the session when a receiving session
/// completed (the one to verify).
pub(crate) fn print_event(event: &Event) -> Option<SessionId> {
    match event {
        Event::Completed {
            session,
            role: Role::Receiver,
            stats,
        } => {
            println!(
                "session {session}: {} received, {} blocks delivered, {} to recompute",
                fmt_size(stats.bytes_received),
                stats.blocks_delivered,
                stats.recompute_blocks
            );
            Some(*session)
        }
        Event::Aborted {
            session, reason, ..
        } => {
            println!("session {session} ended early: {reason}");
            None
        }
        _ => None,
    }
}

/// The modes a `connect` runs, in order (every mode when none is named), with `--slice-bytes` slices.
pub(crate) fn connect_modes(args: &ConnectArgs) -> anyhow::Result<Vec<TransferMode>> {
    let slice_bytes =
        u32::try_from(args.slice_bytes).context("--slice-bytes must fit in 32 bits")?;
    let modes = if args.mode.is_empty() {
        ModeArg::ALL.to_vec()
    } else {
        args.mode.clone()
    };
    Ok(modes
        .into_iter()
        .map(|m| m.with_slice(slice_bytes))
        .collect())
}

/// Runs every mode of `args` (one warm-up and `--iterations` measured transfers each, by `transfer`) and
/// makes their rows; `retransmits` reads the sender's retransmit counter.
pub(crate) fn measure_modes(
    args: &ConnectArgs,
    backend: &'static str,
    layout: KvLayout,
    limit_gbps: f64,
    mut transfer: impl FnMut(TransferMode) -> anyhow::Result<Outcome>,
    retransmits: impl Fn() -> u64,
) -> anyhow::Result<Vec<RunRow>> {
    let mut rows = Vec::new();
    for mode in connect_modes(args)? {
        let retransmits_before = retransmits();
        let mut seconds = Vec::new();
        let mut recompute = 0;
        for i in 0..=args.iterations {
            let out = transfer(mode)?;
            if let Some(reason) = out.reason {
                bail!("the server refused the transfer: {reason}");
            }
            recompute += out.recompute.len();
            if i > 0 {
                seconds.push(out.elapsed.as_secs_f64());
            }
        }
        rows.push(row(
            backend,
            layout,
            mode,
            seconds,
            limit_gbps,
            retransmits() - retransmits_before,
            recompute,
        ));
    }
    Ok(rows)
}

/// Pushes KV to a `te-bench serve` and prints throughput beside a local socket-copy limit.
pub(crate) fn connect_main(args: &ConnectArgs) -> anyhow::Result<()> {
    if args.backend != NetBackend::Tcp {
        bail!("connect over RDMA or shm runs through `rdma_net::connect` or `shm_net::connect`");
    }
    let peer = args
        .peer
        .context("--peer (the address a `te-bench serve` listens on) is required over TCP")?;
    let layout = layout_for(args.block_bytes, args.total_bytes)?;
    let mut cfg = TcpConfig::with_engine_id(args.engine_id);
    cfg.listen = None;
    cfg.security.secret = args.secret.as_deref().map(Secret::from);
    cfg.limits.max_lanes_per_peer = args.lanes.max(1);
    let node = BlockingNode::start(cfg)?;
    let src = node.kv_region(layout)?;
    // Each client's own pattern, seeded by its engine id: a `serve --verify` checks it on arrival.
    crate::tcp::fill(node.node(), &src, u64::from(args.engine_id))?;
    let info = node
        .connect(peer, Some(layout))
        .with_context(|| format!("connecting to {peer}"))?;
    let dst = *info
        .segment("served")
        .context("the server offered no region: is it a `te-bench serve`?")?;
    // The raw limit: a plain socket copy of the same bytes over loopback on this machine.
    let limit_gbps = if args.no_limit {
        0.0
    } else {
        node.block_on(socket_copy_gbps(
            layout.total_bytes(),
            4 << 20,
            args.lanes.max(1),
        ))?
    };
    let rows = measure_modes(
        args,
        "tcp",
        layout,
        limit_gbps,
        |mode| {
            let req = TransferRequest::whole(info.peer, &src, &dst)?.with_mode(mode);
            Ok(node.transfer(req, Duration::from_secs(600))?)
        },
        || node.node().stats().engine.retransmits,
    )?;
    print_rows(&rows, args.json, &RUN_COLUMNS)
}
