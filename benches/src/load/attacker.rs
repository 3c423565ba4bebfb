//! What every attacker of `te-bench load` shares: its own address, its time limit for one step, the
//! connection it makes from that address, and the tally of what it did.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

/// The attacker's own address: another host, as far as the server's per-address limits can tell.
const ATTACKER_IP: [u8; 4] = [127, 0, 0, 2];
/// How long an attacker waits for one step (a handshake, a write) before it gives up on it.
pub(super) const LIMIT: Duration = Duration::from_secs(5);

/// What an attacker did, counted as it went.
#[derive(Default)]
pub(super) struct Tally {
    /// Lanes or connections the server accepted.
    pub(super) admitted: AtomicU64,
    /// Handshakes it refused.
    pub(super) refused: AtomicU64,
    /// Connections the server closed under the attacker.
    pub(super) closed: AtomicU64,
    /// Frames written.
    pub(super) frames: AtomicU64,
    /// The first refusal's reason.
    pub(super) reason: std::sync::Mutex<Option<String>>,
}

impl Tally {
    pub(super) fn refuse(&self, why: String) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.reason.lock().unwrap().get_or_insert(why);
    }
}

/// A connection to `server` from the attacker's address.
pub(super) async fn connect(server: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((ATTACKER_IP, 0)))?;
    socket.connect(server).await
}
