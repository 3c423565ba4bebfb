//! Connection groups: the lanes of one peer that share the token its first handshake was given. A lane
//! that brings a new token (a restarted process, or another claiming the engine id) starts a new group,
//! and the earlier group's sessions and served regions end here.

use super::handshake::TOKEN_LEN;
use super::peer_link::PeerLink;
use super::served;
use super::state::NodeState;

/// Binds `link`'s peer to the connection group of `token`. When that is a new group (the peer's process
/// restarted, or another process claims its engine id while its lanes are down), the sessions of the
/// earlier group end here at once with recompute, and what was queued for it is dropped: sessions belong
/// to the group that opened them, so no frame of the new group (Data, Ack, Nack, Close, Progress) reaches
/// them: the engine refuses frames for a session it closed. The earlier group's served regions are freed.
pub(crate) fn join(node: &NodeState, link: &PeerLink, token: [u8; TOKEN_LEN]) {
    let earlier = link.token();
    link.set_token(token);
    if earlier.is_none_or(|t| t == token) {
        return;
    }
    let reason = format!(
        "engine {} is a new connection group (a restarted process, or another claiming its engine id): \
         the sessions of its earlier group end here",
        link.peer.0
    );
    node.ctx.core.replace_peer(link.peer, &reason);
    link.clear_queue(&node.ctx);
    // The earlier group's served regions go with it (their sessions have just ended).
    served::free_earlier_groups(node, link.peer, token);
}
