//! File descriptors over a link's Unix socket (`SCM_RIGHTS`): sending one with a message, and a buffered
//! reader that keeps the descriptors that arrive with the bytes, in order. Holds `unsafe` only to take
//! ownership of descriptors the kernel just installed in this process.

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

/// Descriptors received but not yet claimed by a message that are kept; more are closed at once.
const KEEP_FDS: usize = 16;

/// Sends `bytes` with `fd` attached to the first of them.
pub(crate) fn send_with_fd(stream: &UnixStream, bytes: &[u8], fd: RawFd) -> io::Result<()> {
    let fds = [fd];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsg,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    (&*stream).write_all(&bytes[sent..])
}

/// A buffered reader of a link's socket that collects the descriptors arriving with its bytes.
#[derive(Debug)]
pub(crate) struct FdReader {
    stream: UnixStream,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    fds: VecDeque<OwnedFd>,
    /// Descriptors closed because too many were waiting.
    pub(crate) dropped_fds: u64,
}

impl FdReader {
    pub(crate) fn new(stream: UnixStream, capacity: usize) -> Self {
        Self {
            stream,
            buf: vec![0; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
            fds: VecDeque::new(),
            dropped_fds: 0,
        }
    }

    /// Bytes read from the socket and not yet consumed.
    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// The oldest descriptor received and not yet claimed.
    pub(crate) fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut space = nix::cmsg_space!([RawFd; 8]);
        let mut iov = [IoSliceMut::new(&mut self.buf)];
        let msg = recvmsg::<()>(
            self.stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        let bytes = msg.bytes;
        let mut received = Vec::new();
        let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
        if let Ok(cmsgs) = msg.cmsgs() {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(fds) = c {
                    received.extend(fds);
                }
            }
        }
        for raw in received {
            // SAFETY: the kernel installed `raw` in this process for this message just now; nothing else
            // knows it, so this is its one owner (dropping it closes it).
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            if self.fds.len() < KEEP_FDS {
                self.fds.push_back(fd);
            } else {
                self.dropped_fds += 1;
            }
        }
        if truncated {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer sent more descriptors with one message than a link takes",
            ));
        }
        (self.start, self.end) = (0, bytes);
        Ok(())
    }
}

impl Read for FdReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.start == self.end {
            self.fill()?;
        }
        let n = out.len().min(self.end - self.start);
        out[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_arrives_with_its_bytes() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        (&a).write_all(b"before").unwrap();
        send_with_fd(&a, b"grant", file.as_raw_fd()).unwrap();
        drop(a);
        let mut r = FdReader::new(b, 4);
        let mut all = Vec::new();
        r.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"beforegrant");
        let fd = r.take_fd().expect("the descriptor arrived");
        assert!(nix::sys::stat::fstat(&fd).is_ok());
        assert!(r.take_fd().is_none());
    }
}
