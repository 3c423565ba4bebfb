//! The raw limit a TCP transfer is measured against: a plain socket copy of the same bytes. It uses nothing
//! of the engine; te-bench and the RDMA example measure against it.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

/// A plain socket copy over loopback, set up once and run as often as wanted: `bytes` split over
/// `connections` connections, written with `write_all` of `write_bytes` at a time out of one large buffer
/// and read into another (no framing, no checksums, `TCP_NODELAY` set).
///
/// Each connection's writer and reader is a thread of its own doing blocking calls, the way `iperf3`
/// drives its streams: no runtime between the copy and the kernel, so the figure is the sockets' best, not
/// a scheduler's. Buffers and connections are made once, so repeated runs (interleaved with what they are
/// compared to) measure the copy alone, not page faults or handshakes.
pub struct SocketCopy {
    streams: Vec<Stream>,
    write_bytes: usize,
}

struct Stream {
    out: TcpStream,
    src: Vec<u8>,
    inc: TcpStream,
    dst: Vec<u8>,
}

impl SocketCopy {
    /// Connects the streams and fills both buffers of each.
    pub fn new(bytes: u64, write_bytes: usize, connections: usize) -> io::Result<Self> {
        let connections = connections.max(1);
        let per = usize::try_from(bytes / connections as u64)
            .map_err(|_| io::Error::other("too many bytes for one buffer"))?;
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let mut streams = Vec::with_capacity(connections);
        for i in 0..connections {
            let out = TcpStream::connect(addr)?;
            let (inc, _) = listener.accept()?;
            out.set_nodelay(true)?;
            inc.set_nodelay(true)?;
            let src = (0..per)
                .map(|j| (j as u8).wrapping_mul(31) ^ i as u8)
                .collect();
            streams.push(Stream {
                out,
                src,
                inc,
                dst: vec![1u8; per],
            });
        }
        Ok(Self {
            streams,
            write_bytes: write_bytes.max(1),
        })
    }

    /// Copies every buffer once; GB/s from the first write until the last byte is read.
    pub fn run(&mut self) -> io::Result<f64> {
        let write_bytes = self.write_bytes;
        let start = Instant::now();
        let received = std::thread::scope(|scope| {
            let mut writers = Vec::with_capacity(self.streams.len());
            let mut readers = Vec::with_capacity(self.streams.len());
            for s in &mut self.streams {
                let (out, src, inc, dst) = (&mut s.out, &s.src, &mut s.inc, &mut s.dst);
                writers.push(scope.spawn(move || -> io::Result<()> {
                    for chunk in src.chunks(write_bytes) {
                        out.write_all(chunk)?;
                    }
                    Ok(())
                }));
                readers.push(scope.spawn(move || -> io::Result<usize> {
                    inc.read_exact(dst)?;
                    std::hint::black_box(&dst);
                    Ok(dst.len())
                }));
            }
            let panicked = || io::Error::other("a copy thread panicked");
            for w in writers {
                w.join().map_err(|_| panicked())??;
            }
            readers
                .into_iter()
                .map(|r| r.join().map_err(|_| panicked())?)
                .sum::<io::Result<usize>>()
        })?;
        Ok(received as f64 / start.elapsed().as_secs_f64() / 1e9)
    }
}

/// GB/s of one [`SocketCopy`] of `bytes` (set up, run once), on the runtime's blocking pool.
pub async fn socket_copy_gbps(
    bytes: u64,
    write_bytes: usize,
    connections: usize,
) -> io::Result<f64> {
    tokio::task::spawn_blocking(move || SocketCopy::new(bytes, write_bytes, connections)?.run())
        .await
        .map_err(io::Error::other)?
}
