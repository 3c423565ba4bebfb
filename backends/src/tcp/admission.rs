//! Admission of inbound connections: how many one IP address may hold, and how a connection refused at a
//! limit (this one or the node-wide lane limit) is told why before it closes.
//!
//! A connection from an address holds a [`ConnectionSlot`] from accept until its lane ends, so one
//! address can hold at most `StrangerLimits::max_connections_per_address` of the node's lanes and handshakes
//! together, and the rest stay for everyone else; once its handshake names an engine, the slot joins it,
//! and one address has at most `StrangerLimits::max_peers_per_address` engines connected (so at most that
//! many times `EngineConfig::max_incoming_per_peer` sessions). Its handshake takes one of its address's
//! `StrangerLimits::max_handshakes_per_address` turns ([`ConnectionSlot::address_turn`]) before one of the
//! node's, so one address cannot hold every handshake turn either.
//!
//! The node's `StrangerLimits::max_lanes` are seats taken under the same lock as everything above, so the
//! bound holds however many handshakes finish at once: an inbound lane takes its seat when it is admitted
//! ([`ConnectionSlot::take_seat`]), a dialed lane when it starts ([`Admission::outbound_seat`]). At the
//! bound the newcomer is not simply refused: if another address holds at least two lanes more than the
//! newcomer's, that address's idlest lane is shed for it ([`super::lane_shares`]), so a few addresses
//! filling the node with engine ids cannot shut every other host out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use transfer_engine::PeerId;

use super::budget::{SharedBudget, control_budget, data_budget};
use super::context::lock;
use super::handshake::{self, Message};
use super::lane_shares;
use super::lane_state::LaneState;

/// Connections held per address, and the node's lane seats.
#[derive(Debug)]
pub(crate) struct Admission {
    table: Mutex<Table>,
    turns_per_address: usize,
    /// Control frames an address's inbound lanes together hand the engine per second (0: unlimited).
    control_per_sec: u64,
    /// Data payload bytes an address's inbound lanes together hand the engine per second (0: unlimited).
    data_per_sec: u64,
}

/// Everything admission counts, under one lock.
#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) by_address: HashMap<IpAddr, Held>,
    /// Lanes seated now: every address's, and the ones this node dialed.
    pub(super) lanes: usize,
    /// The id of the next seat.
    next_seat: u64,
}

/// What one address holds.
#[derive(Debug)]
pub(super) struct Held {
    connections: usize,
    /// Its seated lanes, by seat id (the lane itself once started, to be shed if it comes to that).
    pub(super) seats: HashMap<u64, Seat>,
    /// The engines its connections joined, with how many of its connections each holds.
    peers: HashMap<PeerId, usize>,
    /// Its handshake turns.
    turns: Arc<Semaphore>,
    /// Its lanes' control-frame budget.
    control: Option<SharedBudget>,
    /// Its lanes' Data byte budget.
    data: Option<SharedBudget>,
}

/// A seated lane of an address: the lane, once started (shedding closes it).
#[derive(Default)]
pub(super) struct Seat(pub(super) Weak<LaneState>);

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.strong_count() > 0 {
            "Seat(lane)"
        } else {
            "Seat"
        })
    }
}

/// One connection of an address, released when dropped.
#[derive(Debug)]
pub(crate) struct ConnectionSlot {
    admission: Arc<Admission>,
    ip: IpAddr,
    /// The engine it joined, once its handshake named one.
    peer: Option<PeerId>,
    /// Its seat among the node's lanes, once admitted.
    seat: Option<u64>,
}

/// The seat of a lane this node dialed, released when dropped.
#[derive(Debug)]
pub(crate) struct OutboundSeat(Arc<Admission>);

impl Drop for OutboundSeat {
    fn drop(&mut self) {
        lock(&self.0.table).lanes -= 1;
    }
}

/// The lane `take_seat` shed for a newcomer, to be closed (outside admission's lock) with its reason.
pub(crate) struct Shed {
    pub(crate) lane: Arc<LaneState>,
    pub(crate) reason: String,
}

impl std::fmt::Debug for Shed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shed")
            .field("reason", &self.reason)
            .finish()
    }
}

/// Why a node at its lane bound refused a lane from `ip`.
fn full(lanes: usize, ip: IpAddr) -> String {
    format!(
        "this node already has {lanes} lanes, its most, and no address holds two more than {ip} does"
    )
}

impl Admission {
    /// Admission where each address has `turns_per_address` handshake turns, and its lanes together
    /// hand the engine `control_per_sec` control frames and `data_per_sec` Data payload bytes a second
    /// (0: unlimited).
    pub(crate) fn new(turns_per_address: usize, control_per_sec: u64, data_per_sec: u64) -> Self {
        Self {
            table: Mutex::default(),
            turns_per_address: turns_per_address.max(1),
            control_per_sec,
            data_per_sec,
        }
    }

    /// A slot for a connection from `ip`, unless the address already holds `limit`, or the node holds
    /// `max_lanes` and would shed none for `ip` (checked again, atomically, at [`ConnectionSlot::take_seat`]).
    pub(crate) fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        limit: usize,
        max_lanes: usize,
    ) -> Result<ConnectionSlot, String> {
        let mut table = lock(&self.table);
        if table.lanes >= max_lanes && lane_shares::donor(&table, ip).is_none() {
            return Err(full(table.lanes, ip));
        }
        let h = table.by_address.entry(ip).or_insert_with(|| Held {
            connections: 0,
            seats: HashMap::new(),
            peers: HashMap::new(),
            turns: Arc::new(Semaphore::new(self.turns_per_address)),
            control: control_budget(self.control_per_sec).map(|b| Arc::new(Mutex::new(b))),
            data: data_budget(self.data_per_sec).map(|b| Arc::new(Mutex::new(b))),
        });
        if h.connections >= limit {
            let n = h.connections;
            return Err(format!(
                "address {ip} already holds {n} connections here, the most this node allows one address"
            ));
        }
        h.connections += 1;
        Ok(ConnectionSlot {
            admission: self.clone(),
            ip,
            peer: None,
            seat: None,
        })
    }

    /// A seat for a lane this node dialed: always given (this node asked for the lane), and counted, so
    /// inbound lanes find the node that much fuller.
    pub(crate) fn outbound_seat(self: &Arc<Self>) -> OutboundSeat {
        lock(&self.table).lanes += 1;
        OutboundSeat(self.clone())
    }

    /// Connections `ip` holds now.
    #[cfg(test)]
    fn held(&self, ip: IpAddr) -> usize {
        lock(&self.table)
            .by_address
            .get(&ip)
            .map_or(0, |h| h.connections)
    }
}

impl ConnectionSlot {
    /// Seats the connection's lane among the node's `max_lanes`, checked and taken under admission's
    /// lock. At the bound, an address holding at least two lanes more than this one's gives up its idlest
    /// lane for it, returned to be closed; with no such address the lane is refused.
    pub(crate) fn take_seat(&mut self, max_lanes: usize) -> Result<Option<Shed>, String> {
        if self.seat.is_some() {
            return Ok(None);
        }
        let mut table = lock(&self.admission.table);
        let shed = if table.lanes >= max_lanes {
            let lanes = table.lanes;
            Some(lane_shares::shed_for(&mut table, self.ip).ok_or_else(|| full(lanes, self.ip))?)
        } else {
            None
        };
        let id = table.next_seat;
        table.next_seat += 1;
        table.lanes += 1;
        table
            .by_address
            .get_mut(&self.ip)
            .expect("a live slot keeps its address's entry")
            .seats
            .insert(id, Seat::default());
        self.seat = Some(id);
        Ok(shed)
    }

    /// Names the lane that sits in this slot's seat (so it can be shed).
    pub(crate) fn seat_lane(&self, lane: &Arc<LaneState>) {
        let Some(id) = self.seat else { return };
        if let Some(seat) = lock(&self.admission.table)
            .by_address
            .get_mut(&self.ip)
            .and_then(|h| h.seats.get_mut(&id))
        {
            seat.0 = Arc::downgrade(lane);
        }
    }

    /// The control-frame budget its address's lanes share, if the node limits one.
    pub(crate) fn control_budget(&self) -> Option<SharedBudget> {
        lock(&self.admission.table)
            .by_address
            .get(&self.ip)
            .and_then(|h| h.control.clone())
    }

    /// The Data byte budget its address's lanes share, if the node limits one.
    pub(crate) fn data_budget(&self) -> Option<SharedBudget> {
        lock(&self.admission.table)
            .by_address
            .get(&self.ip)
            .and_then(|h| h.data.clone())
    }

    /// Binds the connection to engine `peer`, unless its address already has `limit` other engines
    /// connected here (an engine it already has may add connections up to its lane bound).
    pub(crate) fn join(&mut self, peer: PeerId, limit: usize) -> Result<(), String> {
        let mut table = lock(&self.admission.table);
        let h = table
            .by_address
            .get_mut(&self.ip)
            .expect("a live slot keeps its address's entry");
        if self.peer == Some(peer) {
            return Ok(());
        }
        if !h.peers.contains_key(&peer) && h.peers.len() >= limit {
            let (ip, n) = (self.ip, h.peers.len());
            return Err(format!(
                "address {ip} already has {n} engines connected here, the most this node allows one \
                 address"
            ));
        }
        *h.peers.entry(peer).or_default() += 1;
        self.peer = Some(peer);
        Ok(())
    }

    /// Waits for one of its address's handshake turns, held until the permit is dropped.
    pub(crate) async fn address_turn(&self) -> OwnedSemaphorePermit {
        let turns = lock(&self.admission.table)
            .by_address
            .get(&self.ip)
            .map(|h| h.turns.clone())
            .expect("a live slot keeps its address's entry");
        turns
            .acquire_owned()
            .await
            .expect("an address's turns are never closed")
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut table = lock(&self.admission.table);
        let table = &mut *table;
        let held = &mut table.by_address;
        if let Some(h) = held.get_mut(&self.ip) {
            // (A seat already gone was shed: counted off then.)
            if let Some(id) = self.seat
                && h.seats.remove(&id).is_some()
            {
                table.lanes -= 1;
            }
            if let Some(peer) = self.peer
                && let Some(n) = h.peers.get_mut(&peer)
            {
                *n -= 1;
                if *n == 0 {
                    h.peers.remove(&peer);
                }
            }
            h.connections -= 1;
            if h.connections == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Tells a connection refused at admission why, then closes it: what the dialer already sent (its Hello)
/// is read first and the rest drained briefly, since a socket closed with unread bytes is reset and the
/// reason would be lost. Bounded: a peer that sends nothing or reads nothing costs at most about 1 s.
pub(crate) async fn refuse(mut stream: TcpStream, reason: String) {
    let brief = Duration::from_millis(200);
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(brief, stream.read(&mut sink)).await;
    let _ = tokio::time::timeout(
        Duration::from_millis(500),
        handshake::send(&mut stream, &Message::Reject(reason)),
    )
    .await;
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
    let drain = async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(brief, drain).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_limit_and_slots_return_when_dropped() {
        let admission = Arc::new(Admission::new(1, 0, 0));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = admission.admit(a, 2, usize::MAX).unwrap();
        let _second = admission.admit(a, 2, usize::MAX).unwrap();
        let refused = admission.admit(a, 2, usize::MAX).unwrap_err();
        assert!(refused.contains("already holds 2 connections"), "{refused}");
        // Another address is not affected.
        let _other = admission.admit(b, 2, usize::MAX).unwrap();
        drop(first);
        assert_eq!(admission.held(a), 1);
        admission.admit(a, 2, usize::MAX).unwrap();
        assert_eq!(admission.held(a), 1, "the slot just made was dropped");
    }

    #[test]
    fn seats_hold_the_lane_bound_and_return_when_their_slot_drops() {
        let admission = Arc::new(Admission::new(1, 0, 0));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut first = admission.admit(a, 8, 2).unwrap();
        let mut second = admission.admit(a, 8, 2).unwrap();
        let mut third = admission.admit(b, 8, 2).unwrap();
        assert!(first.take_seat(2).unwrap().is_none());
        let dialed = admission.outbound_seat();
        // The dialed lane took the last seat; `a`'s seats have no started lane to shed.
        let refused = second.take_seat(2).unwrap_err();
        assert!(
            refused.contains("already has 2 lanes, its most"),
            "{refused}"
        );
        assert!(third.take_seat(2).is_err());
        // An arrival at the bound is refused at once when no address holds two more than its own.
        assert!(admission.admit(a, 8, 2).is_err());
        drop(dialed);
        assert!(third.take_seat(2).unwrap().is_none());
        drop(first);
        assert!(second.take_seat(2).unwrap().is_none());
        assert_eq!(lock(&admission.table).lanes, 2);
        drop((second, third));
        assert_eq!(lock(&admission.table).lanes, 0);
    }

    #[tokio::test]
    async fn an_address_holding_its_handshake_turns_holds_no_one_elses() {
        let admission = Arc::new(Admission::new(1, 0, 0));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (first, second) = (
            admission.admit(a, 8, usize::MAX).unwrap(),
            admission.admit(a, 8, usize::MAX).unwrap(),
        );
        let turn = first.address_turn().await;
        let waiting = tokio::time::timeout(Duration::from_millis(50), second.address_turn()).await;
        assert!(
            waiting.is_err(),
            "a second turn of the same address was given"
        );
        let other = admission.admit(b, 8, usize::MAX).unwrap();
        let _b_turn = tokio::time::timeout(Duration::from_secs(5), other.address_turn())
            .await
            .expect("another address waited on this one's turns");
        drop(turn);
        let _again = tokio::time::timeout(Duration::from_secs(5), second.address_turn())
            .await
            .expect("a returned turn was not given again");
    }

    #[test]
    fn an_address_connects_at_most_its_limit_of_engines_and_each_returns_with_its_last_slot() {
        let admission = Arc::new(Admission::new(1, 0, 0));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut first = admission.admit(a, 8, usize::MAX).unwrap();
        first.join(PeerId(1), 2).unwrap();
        let mut again = admission.admit(a, 8, usize::MAX).unwrap();
        again.join(PeerId(1), 2).unwrap();
        let mut second = admission.admit(a, 8, usize::MAX).unwrap();
        second.join(PeerId(2), 2).unwrap();
        let mut third = admission.admit(a, 8, usize::MAX).unwrap();
        let refused = third.join(PeerId(3), 2).unwrap_err();
        assert!(refused.contains("already has 2 engines"), "{refused}");
        // An engine the address already has may add a connection; another address is not affected.
        let mut more = admission.admit(a, 8, usize::MAX).unwrap();
        more.join(PeerId(2), 2).unwrap();
        let mut other = admission.admit(b, 8, usize::MAX).unwrap();
        other.join(PeerId(3), 2).unwrap();
        // Engine 1 is still connected while one of its two slots lives.
        drop(first);
        third.join(PeerId(3), 2).unwrap_err();
        drop(again);
        third.join(PeerId(3), 2).unwrap();
    }

    #[test]
    fn the_slots_of_one_address_share_one_control_budget_and_another_address_has_its_own() {
        let admission = Arc::new(Admission::new(1, 1000, 0));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (first, second) = (
            admission.admit(a, 8, usize::MAX).unwrap(),
            admission.admit(a, 8, usize::MAX).unwrap(),
        );
        let other = admission.admit(b, 8, usize::MAX).unwrap();
        let now = std::time::Instant::now();
        // The burst (a tenth of a second's worth) spent through one lane of `a` ...
        let shared = first.control_budget().unwrap();
        lock(&shared).charge(now, 101);
        // ... leaves the address's other lane waiting, and another address not.
        assert!(
            lock(&second.control_budget().unwrap())
                .ready_at(now)
                .is_some()
        );
        assert!(
            lock(&other.control_budget().unwrap())
                .ready_at(now)
                .is_none()
        );
        let unlimited = Arc::new(Admission::new(1, 0, 0));
        assert!(
            unlimited
                .admit(a, 8, usize::MAX)
                .unwrap()
                .control_budget()
                .is_none()
        );
    }

    #[test]
    fn the_slots_of_one_address_share_one_data_budget_and_another_address_has_its_own() {
        let admission = Arc::new(Admission::new(1, 0, 10 << 20));
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (first, second, other) = (
            admission.admit(a, 8, usize::MAX).unwrap(),
            admission.admit(a, 8, usize::MAX).unwrap(),
            admission.admit(b, 8, usize::MAX).unwrap(),
        );
        let shared = first.data_budget().unwrap();
        assert!(Arc::ptr_eq(&shared, &second.data_budget().unwrap()));
        assert!(!Arc::ptr_eq(&shared, &other.data_budget().unwrap()));
        // A burst of a tenth of a second (1 MiB here), then the address waits; the other does not.
        let now = std::time::Instant::now();
        lock(&shared).charge(now, 3 << 20);
        assert!(lock(&shared).ready_at(now).is_some());
        assert!(lock(&other.data_budget().unwrap()).ready_at(now).is_none());
        assert!(first.control_budget().is_none());
        let unlimited = Arc::new(Admission::new(1, 0, 0));
        assert!(
            unlimited
                .admit(a, 8, usize::MAX)
                .unwrap()
                .data_budget()
                .is_none()
        );
    }
}
