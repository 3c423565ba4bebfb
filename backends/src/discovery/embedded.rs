//! The embedded registry: a map in this process, shared by cloning the handle.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Discovery, DiscoveryError, Lease, PeerRecord, SegmentRecord};

#[derive(Debug, Default)]
struct State {
    next_lease: i64,
    leases: BTreeMap<Lease, (Duration, Instant)>,
    peers: BTreeMap<u32, (PeerRecord, Lease)>,
    segments: BTreeMap<(u32, String), (SegmentRecord, Lease)>,
}

impl State {
    /// Drops expired leases and everything put under them.
    fn expire(&mut self, now: Instant) {
        self.leases.retain(|_, (_, until)| *until > now);
        let live = &self.leases;
        self.peers.retain(|_, (_, l)| live.contains_key(l));
        self.segments.retain(|_, (_, l)| live.contains_key(l));
    }

    fn check(&self, lease: Lease) -> Result<(), DiscoveryError> {
        if self.leases.contains_key(&lease) {
            Ok(())
        } else {
            Err(DiscoveryError::UnknownLease(lease))
        }
    }
}

/// An in-process registry; clones share it. Leases expire by the wall clock.
#[derive(Debug, Clone, Default)]
pub struct Embedded {
    state: Arc<Mutex<State>>,
}

impl Embedded {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.expire(Instant::now());
        f(&mut s)
    }
}

impl Discovery for Embedded {
    async fn grant(&self, ttl: Duration) -> Result<Lease, DiscoveryError> {
        Ok(self.with(|s| {
            s.next_lease += 1;
            let lease = Lease(s.next_lease);
            s.leases.insert(lease, (ttl, Instant::now() + ttl));
            lease
        }))
    }

    async fn keep_alive(&self, lease: Lease) -> Result<(), DiscoveryError> {
        self.with(|s| match s.leases.get_mut(&lease) {
            Some((ttl, until)) => {
                *until = Instant::now() + *ttl;
                Ok(())
            }
            None => Err(DiscoveryError::UnknownLease(lease)),
        })
    }

    async fn revoke(&self, lease: Lease) -> Result<(), DiscoveryError> {
        self.with(|s| {
            s.leases.remove(&lease);
            s.expire(Instant::now());
        });
        Ok(())
    }

    async fn put_peer(&self, peer: &PeerRecord, lease: Lease) -> Result<(), DiscoveryError> {
        self.with(|s| {
            s.check(lease)?;
            s.peers.insert(peer.engine_id, (peer.clone(), lease));
            Ok(())
        })
    }

    async fn peer(&self, engine_id: u32) -> Result<Option<PeerRecord>, DiscoveryError> {
        Ok(self.with(|s| s.peers.get(&engine_id).map(|(p, _)| p.clone())))
    }

    async fn peers(&self) -> Result<Vec<PeerRecord>, DiscoveryError> {
        Ok(self.with(|s| s.peers.values().map(|(p, _)| p.clone()).collect()))
    }

    async fn put_segment(
        &self,
        segment: &SegmentRecord,
        lease: Lease,
    ) -> Result<(), DiscoveryError> {
        self.with(|s| {
            s.check(lease)?;
            s.segments.insert(
                (segment.owner, segment.name.clone()),
                (segment.clone(), lease),
            );
            Ok(())
        })
    }

    async fn segment(
        &self,
        owner: u32,
        name: &str,
    ) -> Result<Option<SegmentRecord>, DiscoveryError> {
        Ok(self.with(|s| {
            s.segments
                .get(&(owner, name.to_string()))
                .map(|(r, _)| r.clone())
        }))
    }
}
