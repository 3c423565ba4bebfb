//! The kernel settings of a lane's socket, set on both ends before the handshake.

use std::io;

use tokio::net::TcpStream;

use super::TcpConfig;

/// Kernel socket buffers of lanes (`SO_SNDBUF`, `SO_RCVBUF`); `None` leaves a buffer to the kernel's
/// autotuning, which grows it towards the path's bandwidth-delay product.
///
/// Between two nodes on one host the kernel's copy out of the receive path is the bottleneck, and an
/// autotuned send buffer (up to `net.ipv4.tcp_wmem`'s 4 MiB here) queues so much that those bytes have
/// left the cache by the time they are copied. On the 2-core development VM, 4 MiB blocks moved 6.0-6.3
/// GB/s packetized and 5.8-6.4 exclusive with autotuning, 7.5-7.8 and 8.5-9.2 with a 512 KiB send buffer
/// (4 alternating pairs; see the README). Across hosts a small buffer would cap a lane at buffer / round
/// trip, so there the kernel decides unless told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Applies the node's settings to a lane's socket, dialed or accepted: `TCP_NODELAY` (frames are written
/// whole, never in pieces worth delaying) and the buffers of [`SocketBuffers`].
pub(super) fn configure(stream: &TcpStream, cfg: &TcpConfig) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let buffers = &cfg.socket_buffers;
    let same_host = stream.peer_addr()?.ip().is_loopback();
    let send = if same_host {
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

    #[tokio::test]
    async fn same_host_lanes_get_the_same_host_send_buffer_and_others_the_kernels() {
        let (a, b) = pair().await;
        let autotuned = send_buffer(&a);
        let mut cfg = TcpConfig::default();
        cfg.socket_buffers.same_host_send = Some(96 << 10);
        cfg.socket_buffers.send = Some(3 << 20);
        configure(&a, &cfg).unwrap();
        assert!(a.nodelay().unwrap());
        let set = send_buffer(&a);
        assert!(
            (96 << 10..=2 * (96 << 10)).contains(&set),
            "a loopback peer gets same_host_send: {set}"
        );
        // Left to the kernel: the buffer is what it was.
        cfg.socket_buffers.same_host_send = None;
        configure(&b, &cfg).unwrap();
        assert_eq!(send_buffer(&b), autotuned);
        cfg.socket_buffers.receive = Some(200 << 10);
        configure(&b, &cfg).unwrap();
        let received = socket2::SockRef::from(&b).recv_buffer_size().unwrap();
        assert!(
            (200 << 10..=2 * (200 << 10)).contains(&received),
            "{received}"
        );
    }
}
