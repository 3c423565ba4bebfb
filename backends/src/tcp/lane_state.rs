//! One lane's state between its reader and writer (why it closed, a last frame to send, when it last
//! heard from the peer), and the stall-bounded wait both use on their socket.

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use transfer_engine::wire::{FrameKind, Header};

use super::context::lock;
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

/// A `Reject` frame on `session` (0: the lane as a whole) whose payload is `text`.
pub(crate) fn reject_frame(session: u64, text: &str) -> Vec<u8> {
    let mut reject = Header::new(FrameKind::Reject, session);
    reject.length = text.len() as u32;
    reject.crc = transfer_engine::crc32c(text.as_bytes());
    let mut bytes = reject.encode().to_vec();
    bytes.extend_from_slice(text.as_bytes());
    bytes
}

impl LaneState {
    /// Closes the lane to give its seat to a newcomer: the peer is sent a `Reject` saying why first.
    pub(crate) fn shed(&self, reason: String) {
        *lock(&self.goodbye) = Some(reject_frame(0, &reason));
        self.close(&CloseReason::Shed(reason));
    }

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
