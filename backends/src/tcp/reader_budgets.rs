//! The budgets a lane's reader charges before it hands a frame on (their shapes are in `budget.rs`).
//! Past any of them the reader waits before it reads on, so TCP holds the sender back; a budget never
//! refuses a frame or closes a lane by itself.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use transfer_engine::TokenBucket;
use transfer_engine::wire::{FrameKind, Header};

use super::budget::control_budget;
use super::context::{Context, lock};
use super::lane_state::LaneState;
use super::peer_link::PeerLink;

/// What one reader charges: its lane's own control budget, and the shared ones its lane belongs to.
pub(crate) struct ReaderBudgets<'a> {
    ctx: &'a Context,
    link: &'a PeerLink,
    lane: &'a LaneState,
    own_control: Option<TokenBucket>,
}

impl<'a> ReaderBudgets<'a> {
    /// The budgets of a reader of `lane`, a lane to `link`'s peer.
    pub(crate) fn new(ctx: &'a Context, link: &'a PeerLink, lane: &'a LaneState) -> Self {
        Self {
            ctx,
            link,
            lane,
            own_control: control_budget(ctx.cfg.limits.control_frames_per_sec),
        }
    }

    /// Charges the frame `header` announces (a control frame: one frame to the lane and to its address;
    /// a Data frame: its payload bytes to its address and to its peer) and waits while any budget it was
    /// charged to is spent. The payload is charged before it is read, so the wait holds it in the socket.
    pub(crate) async fn admit(&mut self, header: &Header, now: Instant) {
        let counters = &self.ctx.counters;
        if header.kind != FrameKind::Data {
            let own = self.own_control.as_mut().and_then(|b| charge(b, now, 1));
            let address = self
                .lane
                .address_budget
                .as_ref()
                .and_then(|b| charge_shared(b, now, 1));
            hold(own.max(address), &counters.control_frames_throttled).await;
        } else {
            let bytes = u64::from(header.length);
            let address = self
                .lane
                .address_data_budget
                .as_ref()
                .and_then(|b| charge_shared(b, now, bytes));
            let peer = self
                .link
                .data_budget()
                .and_then(|b| charge_shared(b, now, bytes));
            hold(address.max(peer), &counters.data_frames_throttled).await;
        }
    }
}

/// Charges `amount` to `bucket`: when the reader may go on, if it must wait.
fn charge(bucket: &mut TokenBucket, now: Instant, amount: u64) -> Option<Instant> {
    bucket.charge(now, amount);
    bucket.ready_at(now)
}

/// [`charge`] on a shared budget.
fn charge_shared(bucket: &Mutex<TokenBucket>, now: Instant, amount: u64) -> Option<Instant> {
    charge(&mut lock(bucket), now, amount)
}

/// Waits until `until` (if any), counted in `throttled`.
async fn hold(until: Option<Instant>, throttled: &AtomicU64) {
    if let Some(at) = until {
        throttled.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep_until(at.into()).await;
    }
}
