//! One lane's state between its reader and writer (why it closed, a last frame to send, when it last
//! heard from the peer), and the stall-bounded wait both use on their socket.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::transport::CloseReason;

/// One lane's shared state between its reader and writer.
pub(crate) struct LaneState {
    pub(crate) id: u64,
    pub(crate) outbound: bool,
    pub(crate) closed: watch::Sender<Option<CloseReason>>,
    pub(crate) goodbye: Mutex<Option<Vec<u8>>>,
    pub(crate) last_rx: Mutex<Instant>,
    /// The control-frame budget its peer's address shares among its inbound lanes (`None`: a lane this
    /// node dialed, or no per-address limit).
    pub(crate) address_budget: Option<super::budget::SharedBudget>,
    /// The Data byte budget its peer's address shares among its inbound lanes (`None`: a lane this node
    /// dialed, or no per-address limit).
    pub(crate) address_data_budget: Option<super::budget::SharedBudget>,
}

impl LaneState {
    pub(crate) fn close(&self, reason: &CloseReason) {
        self.closed.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason.clone());
                true
            } else {
                false
            }
        });
    }
}

/// Waits for a socket to be ready, at most `stall`: a peer that makes no progress for that long is
/// reported as having `what` (and loses its lane).
pub(crate) async fn ready(
    wait: impl std::future::Future<Output = io::Result<()>>,
    stall: Duration,
    what: &str,
) -> io::Result<()> {
    match tokio::time::timeout(stall, wait).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the peer {what} for {} s", stall.as_secs_f64()),
        )),
    }
}
