//! The raw limit a TCP transfer is measured against: a plain socket copy of the same bytes.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Instant;

/// GB/s of a plain socket copy over loopback: `bytes` split over `connections` connections, written with
/// `write_all` of `write_bytes` at a time out of one large buffer and read into another (no framing, no
/// checksums, `TCP_NODELAY` set). Timed from the first write until the last byte is read.
///
/// Each connection's writer and reader is a thread of its own doing blocking calls, the way `iperf3`
/// drives its streams: no runtime between the copy and the kernel, so the figure is the sockets' best,
/// not a scheduler's. The caller's runtime is not blocked (the copy runs on its blocking pool).
pub async fn socket_copy_gbps(
    bytes: u64,
    write_bytes: usize,
    connections: usize,
) -> io::Result<f64> {
    tokio::task::spawn_blocking(move || copy_gbps(bytes, write_bytes, connections))
        .await
        .map_err(io::Error::other)?
}

fn copy_gbps(bytes: u64, write_bytes: usize, connections: usize) -> io::Result<f64> {
    let connections = connections.max(1);
    let write_bytes = write_bytes.max(1);
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
        // Both buffers are written before the clock starts, so no page is first touched inside it.
        let src: Vec<u8> = (0..per)
            .map(|j| (j as u8).wrapping_mul(31) ^ i as u8)
            .collect();
        streams.push((out, src, inc, vec![1u8; per]));
    }
    let start = Instant::now();
    let received = std::thread::scope(|scope| {
        let mut readers = Vec::with_capacity(connections);
        let mut writers = Vec::with_capacity(connections);
        for (mut out, src, mut inc, mut dst) in streams {
            writers.push(scope.spawn(move || -> io::Result<()> {
                for chunk in src.chunks(write_bytes) {
                    out.write_all(chunk)?;
                }
                out.shutdown(Shutdown::Write)
            }));
            readers.push(scope.spawn(move || -> io::Result<usize> {
                let mut pos = 0;
                while pos < dst.len() {
                    let n = inc.read(&mut dst[pos..])?;
                    if n == 0 {
                        break;
                    }
                    pos += n;
                }
                std::hint::black_box(&dst);
                Ok(pos)
            }));
        }
        readers
            .into_iter()
            .map(|r| {
                r.join()
                    .map_err(|_| io::Error::other("a copy thread panicked"))?
            })
            .sum::<io::Result<usize>>()
    })?;
    let secs = start.elapsed().as_secs_f64();
    Ok(received as f64 / secs / 1e9)
}
