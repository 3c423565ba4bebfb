//! The two kernel services this backend rests on, through `nix`'s safe wrappers: copying from another
//! process's memory (cross-memory attach) and asking who is at the other end of a Unix socket.

use std::io::{self, IoSliceMut};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::unistd::Pid;

/// Who is at the other end of a Unix socket, as the kernel saw it when the connection was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Credentials {
    pub(crate) pid: i32,
    pub(crate) uid: u32,
}

/// The peer credentials (`SO_PEERCRED`) of `stream`.
pub(crate) fn peer_credentials(stream: &UnixStream) -> io::Result<Credentials> {
    let c = getsockopt(stream, PeerCredentials).map_err(io::Error::from)?;
    Ok(Credentials {
        pid: c.pid(),
        uid: c.uid(),
    })
}

/// Fills `dst` with the bytes at `address` in process `pid` (several calls when the kernel copies less
/// than asked). Memory the process does not have mapped there is an error (`EFAULT`), as is a process
/// this one may not trace (`EPERM`).
pub(crate) fn pull(pid: i32, address: u64, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < dst.len() {
        let base = usize::try_from(address)
            .ok()
            .and_then(|a| a.checked_add(done))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "address out of range"))?;
        let want = dst.len() - done;
        let remote = [RemoteIoVec { base, len: want }];
        let mut local = [IoSliceMut::new(&mut dst[done..])];
        let n =
            process_vm_readv(Pid::from_raw(pid), &mut local, &remote).map_err(io::Error::from)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer's memory ended before the unit did",
            ));
        }
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pulls_from_this_process_and_refuses_an_unmapped_address() {
        let src: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0; src.len()];
        pull(std::process::id() as i32, src.as_ptr() as u64, &mut dst).unwrap();
        assert_eq!(dst, src);
        let e = pull(std::process::id() as i32, 8, &mut dst[..16]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::EFAULT), "{e}");
    }
}
