//! The raw limit a TCP transfer is measured against: a plain tokio socket copy of the same bytes.

use std::io;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// GB/s of a plain socket copy over loopback: `bytes` split over `connections` connections, written with
/// `write_all` of `write_bytes` at a time out of one large buffer and read into another (no framing, no
/// checksums, `TCP_NODELAY` set). Timed from the first write until the last byte is read.
pub async fn socket_copy_gbps(
    bytes: u64,
    write_bytes: usize,
    connections: usize,
) -> io::Result<f64> {
    let connections = connections.max(1);
    let write_bytes = write_bytes.max(1);
    let per = usize::try_from(bytes / connections as u64)
        .map_err(|_| io::Error::other("too many bytes for one buffer"))?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let mut readers = Vec::new();
    let mut writers = Vec::new();
    for i in 0..connections {
        let (out, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (out, (inc, _)) = (out?, accepted?);
        out.set_nodelay(true)?;
        inc.set_nodelay(true)?;
        let src: Vec<u8> = (0..per)
            .map(|j| (j as u8).wrapping_mul(31) ^ i as u8)
            .collect();
        writers.push((out, src));
        readers.push((inc, vec![1u8; per]));
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (mut inc, mut dst) in readers {
        tasks.push(tokio::spawn(async move {
            let mut pos = 0;
            while pos < dst.len() {
                let n = inc.read(&mut dst[pos..]).await?;
                if n == 0 {
                    break;
                }
                pos += n;
            }
            std::hint::black_box(&dst);
            io::Result::Ok(pos)
        }));
    }
    for (mut out, src) in writers {
        tasks.push(tokio::spawn(async move {
            for chunk in src.chunks(write_bytes) {
                out.write_all(chunk).await?;
            }
            out.shutdown().await?;
            io::Result::Ok(0)
        }));
    }
    let mut received = 0usize;
    for t in tasks {
        received += t.await.map_err(io::Error::other)??;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(received as f64 / secs / 1e9)
}
