//! The two socket steps a lane's reader and writer share with its staged path: an exact receive that
//! also takes the next header's first bytes, and the position of a vectored write after a short write.

use std::io::{self, IoSliceMut};
use std::time::Duration;

use tokio::net::tcp::OwnedReadHalf;

use super::lane_state::ready;

/// Receives into `dst`, and the next header's first bytes into `hdr` in the same syscall once `dst` is
/// nearly full (pass an empty `hdr` where more of the payload follows `dst`); folds what lands in `dst`
/// into `digest`, if given, right after each syscall.
pub(crate) async fn recv_exact(
    rd: &OwnedReadHalf,
    dst: &mut [u8],
    hdr: &mut [u8],
    have: &mut usize,
    stall: Duration,
    mut digest: Option<&mut crc_fast::Digest>,
) -> io::Result<()> {
    let mut pos = 0;
    while pos < dst.len() {
        ready(rd.readable(), stall, "stopped sending mid-frame").await?;
        let mut bufs = [
            IoSliceMut::new(&mut dst[pos..]),
            IoSliceMut::new(&mut hdr[..]),
        ];
        match rd.try_read_vectored(&mut bufs) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the lane mid-frame",
                ));
            }
            Ok(n) => {
                let take = n.min(dst.len() - pos);
                if let Some(d) = digest.as_deref_mut() {
                    d.update(&dst[pos..pos + take]);
                }
                pos += take;
                *have += n - take;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Moves a vectored write's position (piece `first`, `skip` bytes into it; `count` pieces of `len(i)` bytes)
/// past `n` bytes written, and past the empty pieces that follow.
pub(crate) fn advance(
    len: impl Fn(usize) -> usize,
    count: usize,
    mut n: usize,
    first: &mut usize,
    skip: &mut usize,
) {
    while n > 0 && *first < count {
        let left = len(*first) - *skip;
        if n >= left {
            n -= left;
            *first += 1;
            *skip = 0;
        } else {
            *skip += n;
            n = 0;
        }
    }
    while *first < count && len(*first) == 0 {
        *first += 1;
    }
}
