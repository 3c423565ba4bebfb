//! The kernel settings of a lane's socket, set on both ends before the handshake.

use std::io;
use std::net::IpAddr;

use tokio::net::TcpStream;

use super::TcpConfig;

/// Kernel socket buffers of lanes (`SO_SNDBUF`, `SO_RCVBUF`); `None` leaves a buffer to the kernel's
/// autotuning, which grows it towards the path's bandwidth-delay product.
///
/// Between two nodes on one host the kernel's copy out of the receive path is the bottleneck, and an
/// autotuned send buffer (up to `net.ipv4.tcp_wmem`'s 4 MiB here) queues so much that those bytes have
/// left the cache by the time they are copied. On the 2-core development VM, 4 MiB blocks moved 6.0-6.3
/// GB/s packetized and 5.8-6.4 exclusive with autotuning, 7.5-7.8 and 8.5-9.2 with a 512 KiB send buffer
/// (4 alternating pairs; see docs/PERFORMANCE.md, "TCP beside a steady socket limit"). Across hosts a
/// small buffer would cap a lane at buffer / round trip, so there the kernel decides unless told.
///
/// The kernel caps what is asked at `net.core.wmem_max` and `net.core.rmem_max` (212,992 bytes on a stock
/// Linux; 4 MiB on the development VM), and keeps twice the figure it grants. A receive buffer is best set
/// before connecting; set after, as here, it may not change the window scale the handshake agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketBuffers {
    /// `SO_SNDBUF` of lanes whose peer is on this host (a loopback address). Default: 512 KiB.
    pub same_host_send: Option<usize>,
    /// `SO_SNDBUF` of lanes to other hosts. Default: `None`.
    pub send: Option<usize>,
    /// `SO_RCVBUF` of every lane. Default: `None`.
    pub receive: Option<usize>,
}

impl Default for SocketBuffers {
    fn default() -> Self {
        Self {
            same_host_send: Some(512 << 10),
            send: None,
            receive: None,
        }
    }
}

/// Applies the node's settings to a lane's socket to `peer`, dialed or accepted: `TCP_NODELAY` (frames are
/// written whole, never in pieces worth delaying) and the buffers of [`SocketBuffers`].
pub(super) fn configure(stream: &TcpStream, peer: IpAddr, cfg: &TcpConfig) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let buffers = &cfg.buffers.socket_buffers;
    let send = if same_host(peer) {
        buffers.same_host_send
    } else {
        buffers.send
    };
    let socket = socket2::SockRef::from(stream);
    if let Some(bytes) = send {
        socket.set_send_buffer_size(bytes)?;
    }
    if let Some(bytes) = buffers.receive {
        socket.set_recv_buffer_size(bytes)?;
    }
    Ok(())
}

/// Whether a peer at `ip` is on this host: a loopback address, also as an IPv4 peer of a dual-stack
/// listener shows it (`::ffff:127.0.0.1`).
fn same_host(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dialed = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        (dialed, accepted)
    }

    /// The kernel's figure for a socket buffer (Linux keeps twice what was asked, for its bookkeeping).
    fn send_buffer(s: &TcpStream) -> usize {
        socket2::SockRef::from(s).send_buffer_size().unwrap()
    }

    #[test]
    fn loopback_peers_are_on_this_host_in_every_spelling() {
        for ip in ["127.0.0.1", "127.3.2.1", "::1", "::ffff:127.0.0.1"] {
            assert!(same_host(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.0.0.7", "::ffff:10.0.0.7", "fe80::1", "0.0.0.0"] {
            assert!(!same_host(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn same_host_lanes_get_the_same_host_send_buffer_and_others_the_kernels() {
        let (a, b) = pair().await;
        let autotuned = send_buffer(&b);
        let mut cfg = TcpConfig::default();
        cfg.buffers.socket_buffers.same_host_send = Some(96 << 10);
        cfg.buffers.socket_buffers.send = Some(3 << 20);
        configure(&a, a.peer_addr().unwrap().ip(), &cfg).unwrap();
        assert!(a.nodelay().unwrap());
        let set = send_buffer(&a);
        assert!(
            (96 << 10..=2 * (96 << 10)).contains(&set),
            "a loopback peer gets same_host_send: {set}"
        );
        // Left to the kernel: the buffer is what it was.
        cfg.buffers.socket_buffers.same_host_send = None;
        configure(&b, b.peer_addr().unwrap().ip(), &cfg).unwrap();
        assert_eq!(send_buffer(&b), autotuned);
        cfg.buffers.socket_buffers.receive = Some(200 << 10);
        configure(&b, b.peer_addr().unwrap().ip(), &cfg).unwrap();
        let received = socket2::SockRef::from(&b).recv_buffer_size().unwrap();
        assert!(
            (200 << 10..=2 * (200 << 10)).contains(&received),
            "{received}"
        );
    }
}
