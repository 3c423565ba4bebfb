//! [`Liveness`]: when a connection or a peer is given up on, one concept configured one way for every
//! backend. Each backend reads the fields that apply to how it reaches peers; each field says which.

use std::time::Duration;

/// When an idle, silent or stalled connection or peer is given up on. The `liveness` of a
/// [`TcpConfig`](crate::tcp::TcpConfig), an `RdmaConfig` and a `ShmConfig`; a field a backend has no use
/// for says so.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Liveness {
    /// TCP: a lane this node dialed, with nothing to write and nothing received for this long, is
    /// closed. (RDMA and shm keep their peering while the node lives.)
    pub idle_timeout: Duration,
    /// TCP: a lane a peer dialed, with nothing to write, nothing received for this long and no session
    /// with that peer, is closed (`None`: never), so a peer that connects and then says nothing does not
    /// hold a lane forever. Longer than `idle_timeout` by default: an honest dialer closes its idle lanes
    /// first.
    pub inbound_idle_timeout: Option<Duration>,
    /// Every backend: time allowed for connecting and the handshake (RDMA: the hello/welcome exchange).
    pub handshake_timeout: Duration,
    /// TCP and shm: a peer that starts a frame and then sends nothing for this long, or does not read what
    /// this node writes for this long, loses its connection. (RDMA: see `answer_timeout`.)
    pub stall_timeout: Duration,
    /// TCP and RDMA: how long a peer with live sessions may be out of reach (TCP: no lane, redialing
    /// refused or impossible; RDMA: every write failing, none succeeding) before its sessions end with
    /// recompute and new transfers to it are refused. (shm: a lost link tells at once.)
    pub unreachable_after: Duration,
    /// TCP: how long new transfers to a peer declared unreachable fail at once. Nothing redials it
    /// meanwhile (a lane it opens to this node clears the verdict); the first transfer after this dials
    /// it again and is judged afresh by `unreachable_after`. (RDMA and shm: until the peer is heard from
    /// again.)
    pub unreachable_hold: Duration,
    /// RDMA: a peer that answers none of the frames asking it to (opens, units, closes) for this long,
    /// sending nothing at all, is declared unreachable the same way: a closed or killed peer on
    /// libfabric's `shm` provider neither completes nor fails writes. (TCP and shm: a lost connection
    /// tells.)
    pub answer_timeout: Duration,
    /// TCP: a peer that connected here (one this node's user never dialed, added or sent a transfer to),
    /// with no lane, nothing queued and no session for this long (and at least `served_region_grace`), is
    /// forgotten with any region served to it, so strangers cycling through engine ids cannot grow the
    /// node's memory without bound. When it connects again it is a new connection group.
    pub forget_peer_after: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(30),
            inbound_idle_timeout: Some(Duration::from_secs(120)),
            handshake_timeout: Duration::from_secs(5),
            stall_timeout: Duration::from_secs(10),
            unreachable_after: Duration::from_secs(1),
            unreachable_hold: Duration::from_secs(5),
            answer_timeout: Duration::from_secs(3),
            forget_peer_after: Duration::from_secs(60),
        }
    }
}
