//! Fair shares of a node at its lane bound: which address gives up a lane for a newcomer, and which lane.
//!
//! At `StrangerLimits::max_lanes` a lane from address N is admitted only by shedding one: the donor is
//! the address holding the most lanes, if it holds at least two more than N does (so after the shed it
//! still holds no fewer than N); among its lanes, the one its peer last sent anything on longest ago
//! goes (an idle or silent lane before a busy one). Ties go to the lowest address, so the choice is
//! the same for the same table. Every address thereby keeps about an equal share of a full node
//! whatever number of engine ids the others use, and a new host always gets in while any address
//! holds two lanes more than it.

use std::net::IpAddr;

use super::admission::{Shed, Table};
use super::context::lock;

/// The address that would give up a lane for a newcomer from `ip`, if any.
pub(super) fn donor(table: &Table, ip: IpAddr) -> Option<IpAddr> {
    let mine = table.by_address.get(&ip).map_or(0, |h| h.seats.len());
    table
        .by_address
        .iter()
        .filter(|(a, h)| **a != ip && h.seats.len() >= mine + 2)
        .max_by(|(a, x), (b, y)| x.seats.len().cmp(&y.seats.len()).then(b.cmp(a)))
        .map(|(a, _)| *a)
}

/// Takes the donor's idlest started lane off the table for a newcomer from `ip` (its seat is given up
/// now, so the bound holds while the lane closes); `None` when no address may donate.
pub(super) fn shed_for(table: &mut Table, ip: IpAddr) -> Option<Shed> {
    let from = donor(table, ip)?;
    let held = table.by_address.get_mut(&from)?;
    let count = held.seats.len();
    let (id, lane) = held
        .seats
        .iter()
        .filter_map(|(id, seat)| seat.0.upgrade().map(|lane| (*id, lane)))
        .min_by_key(|(id, lane)| (*lock(&lane.last_rx), *id))?;
    held.seats.remove(&id);
    table.lanes -= 1;
    let reason = format!(
        "lane shed: this node is at its lane bound and address {from} held the most lanes ({count}); \
         one went to a newcomer from {ip}"
    );
    Some(Shed { lane, reason })
}
