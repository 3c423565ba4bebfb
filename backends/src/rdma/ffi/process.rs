//! The processes behind peers' addresses on providers that map peers' memory (`shm`): a call towards a
//! peer whose process has exited is refused before it reaches the provider.
//!
//! libfabric 1.17's `shm` provider guards each endpoint's region with a spin lock that lives in the
//! region's shared memory: a send or write to a peer first takes the peer's lock, and the peer takes it
//! itself while it reads its queue. A peer killed while holding it (a receiver killed mid-transfer, seen
//! here about one run in seven) leaves it held for good, and the next send or write to that peer spins
//! inside the provider forever. So each peer's process is looked up when its address is inserted (an
//! `shm` address is `fi_shm://PID:UID:INDEX`) and checked before every call towards it: the handle on
//! `/proc/PID/stat` is held, so it names that process even once its id is reused, and reads fail (or
//! show a zombie) once it has exited. A peer that dies during a call cannot be caught here; the node's
//! driver watch ([`crate::rdma::RdmaConfig::stuck_after`]) covers that.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// The process of `shm` address `name`, if the address names one other than this process (an
/// in-process peer is alive while this process is) and it can be looked up.
pub(super) fn of_address(name: &[u8]) -> Option<PeerProcess> {
    let text = std::str::from_utf8(name).ok()?;
    let text = text.trim_end_matches('\0');
    let text = text.strip_prefix("fi_shm://").unwrap_or(text);
    let pid: u32 = text.split(':').next()?.parse().ok()?;
    if pid == std::process::id() {
        return None;
    }
    let stat = File::open(format!("/proc/{pid}/stat")).ok()?;
    Some(PeerProcess { pid, stat })
}

/// A peer's process, held by its `/proc` entry.
#[derive(Debug)]
pub(super) struct PeerProcess {
    pid: u32,
    stat: File,
}

impl PeerProcess {
    /// The process id.
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is still running: its entry is readable and it is not a zombie.
    pub(super) fn alive(&self) -> bool {
        let mut buf = [0u8; 512];
        let Ok(n) = self.stat.read_at(&mut buf, 0) else {
            return false;
        };
        // `PID (COMM) STATE ...`: the state follows the last ')' (COMM may hold anything).
        let stat = &buf[..n];
        let Some(end) = stat.iter().rposition(|&b| b == b')') else {
            return true;
        };
        !matches!(stat.get(end + 2), Some(b'Z' | b'X' | b'x'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_is_alive_and_an_exited_one_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let name = format!("fi_shm://{}:0:0\0", child.id());
        let process = of_address(name.as_bytes()).unwrap();
        assert_eq!(process.pid(), child.id());
        assert!(process.alive());
        child.kill().unwrap();
        // A zombie until reaped, gone after: dead both ways.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!process.alive());
        child.wait().unwrap();
        assert!(!process.alive());
    }

    #[test]
    fn addresses_without_another_process_name_none() {
        assert!(of_address(format!("fi_shm://{}:0:0", std::process::id()).as_bytes()).is_none());
        assert!(of_address(b"fi_ns://node:svc").is_none());
        assert!(of_address(&[0xff, 0x00]).is_none());
    }
}
