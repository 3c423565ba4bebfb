//! A region served to a peer that asked for one in its handshake, as the node keeps it (`served.rs` hands
//! them out and frees them).

use std::net::IpAddr;
use std::time::Instant;

use transfer_engine::PeerId;

use super::handshake::{Segment, TOKEN_LEN};

/// A region served to a peer that asked for one in its handshake: it belongs to that peer's connection
/// group, and goes with it.
#[derive(Debug)]
pub(crate) struct ServedRegion {
    pub(crate) owner: PeerId,
    /// The token of the owner's connection group.
    pub(crate) group: [u8; TOKEN_LEN],
    /// The address the owner's handshake came from: its bytes count against that address's share.
    pub(crate) address: IpAddr,
    pub(crate) segment: Segment,
    /// When a handshake last handed it out: its owner may not have a lane attached yet (the handshake's
    /// answer goes out before the lane joins its peer link), so it stays for the grace from then too.
    pub(crate) handed_out: Instant,
}
