//! Regions served to peers that ask for one in their handshake: each belongs to the connection group of
//! the peer that asked, comes out of the node's `Serving::serve_bytes` and its address's
//! `Serving::serve_bytes_per_address`, and is freed for others only when idle and its peer has been
//! gone longer than `Serving::served_region_grace`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Instant;

use transfer_engine::{KvLayout, MemoryRegion, PeerId};

use super::context::lock;
use super::handshake::{Segment, TOKEN_LEN};
use super::served_region::ServedRegion;
use super::state::NodeState;

/// Who asks for a region: a peer's connection group, from an address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asker {
    pub(crate) peer: PeerId,
    pub(crate) group: [u8; TOKEN_LEN],
    pub(crate) address: IpAddr,
}

/// Segments offered to a dialer: the published ones, and a region of `want`'s layout for `asker` if it
/// asked and the node serves regions.
pub(crate) fn offer(
    node: &NodeState,
    asker: Asker,
    want: Option<KvLayout>,
) -> Result<Vec<Segment>, String> {
    let mut segments = node.ctx.core.segments.list();
    if let Some(layout) = want {
        segments.push(serve(node, asker, layout)?);
    }
    Ok(segments)
}

/// Frees the served regions of `peer` that belong to a connection group other than `group` (their
/// sessions have ended), so nothing of the new group can open a session into them.
pub(crate) fn free_earlier_groups(node: &NodeState, peer: PeerId, group: [u8; TOKEN_LEN]) {
    // (The served list before the engine, the order `serve` takes them in.)
    let mut served = lock(&node.served);
    let mut engine = node.ctx.core.station.engine();
    served.retain(|r| {
        r.owner != peer
            || r.group == group
            || engine.unregister_region(r.segment.handle.id).is_err()
    });
}

/// Frees every served region of `peer` (a stranger forgotten after idling: no session can use them).
pub(crate) fn free_all_of(node: &NodeState, peer: PeerId) {
    let mut served = lock(&node.served);
    let mut engine = node.ctx.core.station.engine();
    served.retain(|r| r.owner != peer || engine.unregister_region(r.segment.handle.id).is_err());
}

/// A region of `layout` that belongs to `asker`'s connection group: the group's earlier one if it has
/// one of this layout (never an earlier group's: a process claiming a departed peer's engine id gets a
/// zeroed region, not the departed one's bytes), else a new one. To stay within the address's share and
/// the node's `serve_bytes`, idle regions are freed first: the asker's own, and those of peers gone
/// longer than the grace (no lane now, none for `served_region_grace`, and not handed out for as long),
/// so a stranger asking for regions cannot take one from a client between its handshake and its first
/// session, or while it reconnects.
fn serve(node: &NodeState, asker: Asker, layout: KvLayout) -> Result<Segment, String> {
    let cfg = &node.ctx.cfg;
    let bytes = layout.total_bytes();
    let limit = cfg.serving.serve_bytes;
    let share = cfg
        .serving
        .serve_bytes_per_address
        .unwrap_or(limit)
        .min(limit);
    if bytes > share {
        let what = if share < limit {
            "one address's share"
        } else {
            "the most this node serves"
        };
        return Err(format!(
            "a region of {bytes} bytes was asked for but {what} is {share} bytes: start the node with a \
             larger serve size"
        ));
    }
    // Peers whose regions stay (taken before the served list: the links are never locked under it).
    let kept = kept_peers(node, asker.peer);
    let now = Instant::now();
    let handed_out_lately = |r: &ServedRegion| {
        now.saturating_duration_since(r.handed_out) < cfg.serving.served_region_grace
    };
    let mut served = lock(&node.served);
    if let Some(r) = served.iter_mut().find(|r| {
        r.owner == asker.peer && r.group == asker.group && r.segment.handle.layout == Some(layout)
    }) {
        r.handed_out = now;
        return Ok(r.segment.clone());
    }
    let mut engine = node.ctx.core.station.engine();
    // The address's own regions first (its share), then anyone's (the node's limit).
    for address in [Some(asker.address), None] {
        let cap = if address.is_some() { share } else { limit };
        let counted = |r: &ServedRegion| address.is_none_or(|a| r.address == a);
        let mut total: u64 = served
            .iter()
            .filter(|r| counted(r))
            .map(|r| r.segment.handle.len)
            .sum();
        let mut i = 0;
        while total + bytes > cap && i < served.len() {
            let r = &served[i];
            if counted(r)
                && !kept.contains(&r.owner)
                && (r.owner == asker.peer || !handed_out_lately(r))
                && engine.unregister_region(r.segment.handle.id).is_ok()
            {
                total -= r.segment.handle.len;
                served.remove(i);
            } else {
                i += 1;
            }
        }
        if total + bytes > cap {
            return Err(match address {
                Some(a) => format!(
                    "address {a} already holds {total} bytes of served regions here and its share is \
                     {share}: every one is busy or held by a connected peer; try again when one leaves"
                ),
                None => {
                    "every served region is busy or held by a connected peer: try again when one \
                         leaves"
                        .into()
                }
            });
        }
    }
    let len =
        usize::try_from(bytes).map_err(|_| "the layout does not fit in memory".to_string())?;
    let handle = engine
        .register_kv_region(layout, MemoryRegion::zeroed(len))
        .map_err(|e| e.to_string())?;
    engine
        .set_region_owner(handle.id, Some(asker.peer))
        .map_err(|e| e.to_string())?;
    let segment = Segment {
        name: "served".into(),
        handle,
    };
    served.push(ServedRegion {
        owner: asker.peer,
        group: asker.group,
        address: asker.address,
        segment: segment.clone(),
        handed_out: now,
    });
    Ok(segment)
}

/// Peers other than `asker` with a lane here now, or whose last lane closed within the grace.
fn kept_peers(node: &NodeState, asker: PeerId) -> BTreeSet<PeerId> {
    let now = Instant::now();
    let grace = node.ctx.cfg.serving.served_region_grace;
    node.all_links()
        .iter()
        .filter(|l| l.peer != asker)
        .filter(|l| {
            l.lane_count() > 0
                || l.last_lane_closed()
                    .is_some_and(|at| now.saturating_duration_since(at) < grace)
        })
        .map(|l| l.peer)
        .collect()
}
