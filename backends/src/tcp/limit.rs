//! The raw limit a TCP transfer is measured against: a plain socket copy of the same bytes.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

/// A plain socket copy over loopback, set up once and run as often as wanted: `bytes` split over
/// `connections` connections, written with `write_all` of `write_bytes` at a time out of one large buffer
/// and read into another (no framing, `TCP_NODELAY` set; checksums only in
/// [`SocketCopy::run_checksummed`]).
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
        self.copy(false)
    }

    /// Copies every buffer once, taking the CRC-32C of every byte at both ends as the engine does, and as
    /// cheaply as a plain loop can: the writer checksums each 512 KiB piece (the TCP writer's fold size)
    /// just before writing it, so the kernel's copy reads bytes the checksum brought into cache; the
    /// reader checksums what each read (of at most a piece) brought in, while it is in cache. No framing:
    /// this is the raw limit of a transfer checksummed end to end over these sockets. GB/s as
    /// [`SocketCopy::run`]; an error if a stream's two checksums differ.
    pub fn run_checksummed(&mut self) -> io::Result<f64> {
        self.copy(true)
    }

    fn copy(&mut self, checksum: bool) -> io::Result<f64> {
        let write_bytes = self.write_bytes;
        let total: usize = self.streams.iter().map(|s| s.dst.len()).sum();
        let start = Instant::now();
        std::thread::scope(|scope| {
            let mut ends = Vec::with_capacity(self.streams.len());
            for s in &mut self.streams {
                let (out, src, inc, dst) = (&mut s.out, &s.src, &mut s.inc, &mut s.dst);
                let writer = scope.spawn(move || -> io::Result<u32> {
                    if checksum {
                        write_checksummed(out, src)
                    } else {
                        src.chunks(write_bytes)
                            .try_for_each(|c| out.write_all(c))
                            .map(|()| 0)
                    }
                });
                let reader = scope.spawn(move || -> io::Result<u32> {
                    let crc = if checksum {
                        read_checksummed(inc, dst)?
                    } else {
                        inc.read_exact(dst)?;
                        0
                    };
                    std::hint::black_box(&dst);
                    Ok(crc)
                });
                ends.push((writer, reader));
            }
            let panicked = || io::Error::other("a copy thread panicked");
            for (writer, reader) in ends {
                let sent = writer.join().map_err(|_| panicked())??;
                let received = reader.join().map_err(|_| panicked())??;
                if sent != received {
                    return Err(io::Error::other(format!(
                        "a checksummed copy's stream arrived with CRC {received:#010x}, sent with {sent:#010x}"
                    )));
                }
            }
            Ok(())
        })?;
        Ok(total as f64 / start.elapsed().as_secs_f64() / 1e9)
    }
}

/// Bytes a checksummed copy checksums and then writes, and reads at most before checksumming: the TCP
/// writer's own fold size, small enough to stay in a core's L2 between the two passes.
const CHECKSUM_PIECE: usize = super::writer::FOLD_BYTES;

/// Writes `src`, checksumming each piece just before writing it; returns the CRC-32C of all of it.
fn write_checksummed(out: &mut TcpStream, src: &[u8]) -> io::Result<u32> {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    for piece in src.chunks(CHECKSUM_PIECE) {
        digest.update(piece);
        out.write_all(piece)?;
    }
    Ok(digest.finalize() as u32)
}

/// Fills `dst`, checksumming what each read brought in; returns the CRC-32C of all of it.
fn read_checksummed(inc: &mut TcpStream, dst: &mut [u8]) -> io::Result<u32> {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    let mut pos = 0;
    while pos < dst.len() {
        let end = (pos + CHECKSUM_PIECE).min(dst.len());
        let n = inc.read(&mut dst[pos..end])?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        digest.update(&dst[pos..pos + n]);
        pos += n;
    }
    Ok(digest.finalize() as u32)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_copies_move_every_byte_and_the_checksummed_one_agrees_end_to_end() {
        let bytes = 3 * CHECKSUM_PIECE as u64 + 12_345;
        let mut copy = SocketCopy::new(bytes, 1 << 20, 2).unwrap();
        for checksummed in [false, true] {
            for s in &mut copy.streams {
                s.dst.fill(0);
            }
            let gbps = if checksummed {
                copy.run_checksummed()
            } else {
                copy.run()
            }
            .unwrap();
            assert!(gbps > 0.0);
            for s in &copy.streams {
                assert!(
                    s.src == s.dst,
                    "checksummed {checksummed}: a stream differs"
                );
            }
        }
    }
}
