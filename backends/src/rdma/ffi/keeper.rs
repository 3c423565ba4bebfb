//! Endpoints whose provider maps in-process peers' memory directly: each is closed only once no open
//! endpoint in this process can still reach it.
//!
//! libfabric 1.17's `shm` provider does not map an in-process peer's region a second time: its address
//! vector points at the peer's own mapping. When that peer closes its endpoint the mapping goes away, and a
//! survivor that writes to the peer, or reads its own completions (which hands buffers back to the peer),
//! touches unmapped memory or whatever was mapped there since: a crash at best. (`efa` reaches local peers
//! through `shm`, so it is treated the same.) So an endpoint closed while another open endpoint here has
//! inserted its address is parked instead: its registrations are closed and its region memory released at
//! once, but the endpoint and the objects under it stay open, and nobody polls it, so the provider never
//! touches its buffers again. It is closed when the last endpoint that inserted its address closes.
//! Addresses of endpoints closed here are refused by [`link`], since the provider would hand out their old
//! mapping (libfabric keeps their names; so does the keeper, one short name per closed endpoint). A peer's
//! writes into a parked endpoint's memory would wait for that endpoint's own polling, since every write
//! carries remote CQ data; nobody polls it again, so its memory is released at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Objects;
use super::slots::Slots;
use crate::TransportError;

/// Whether `provider` (as `fi_info` names it, e.g. `shm`, `efa`, `tcp;ofi_rxm`) maps in-process peers'
/// memory directly.
pub(super) fn maps_peers_in_process(provider: &str) -> bool {
    provider.split(';').any(|p| p == "shm" || p == "efa")
}

/// Removes shared-memory files left under this process's id by an earlier process that had the same id
/// (once per process, before its first `shm` endpoint). libfabric's `shm` names an endpoint's region
/// `/dev/shm/PID:DOMAIN:ENDPOINT` and maps a file of that name if one exists: a file left by a dead
/// process of the same PID (one killed, or one whose parked endpoints were never closed) made the next
/// endpoint fail with "Device or resource busy", or crash on an empty file (SIGBUS). None of these files
/// can be a live endpoint's: no other live process has this PID, and this process has opened none yet.
pub(super) fn clear_stale_names() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prefix = format!("{}:", std::process::id());
        let Ok(entries) = std::fs::read_dir("/dev/shm") else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    });
}

/// One kept endpoint's key in the keeper.
pub(super) type KeptId = u64;

/// What a parked endpoint still holds open: its objects and message pools.
pub(super) struct Parked {
    pub(super) objects: Objects,
    pub(super) pools: [Slots; 2],
}

struct Entry {
    name: Vec<u8>,
    /// Open endpoints that inserted this one's address.
    reached_by: HashSet<KeptId>,
    /// Endpoints whose addresses this one inserted.
    reaches: HashSet<KeptId>,
    /// Set once the owner closed it while someone could still reach it.
    parked: Option<Parked>,
}

#[derive(Default)]
struct Keeper {
    next: KeptId,
    entries: HashMap<KeptId, Entry>,
    /// Addresses of this process's endpoints that are closed.
    closed: HashSet<Vec<u8>>,
}

static KEEPER: Mutex<Option<Keeper>> = Mutex::new(None);

fn keeper() -> MutexGuard<'static, Option<Keeper>> {
    // The keeper's state stays consistent between statements; a panic elsewhere does not spoil it.
    KEEPER.lock().unwrap_or_else(PoisonError::into_inner)
}

fn trimmed(name: &[u8]) -> &[u8] {
    let end = name.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &name[..end]
}

/// Starts keeping an open endpoint with address `name`.
pub(super) fn open(name: &[u8]) -> KeptId {
    let mut guard = keeper();
    let k = guard.get_or_insert_with(Keeper::default);
    k.next += 1;
    let id = k.next;
    k.entries.insert(
        id,
        Entry {
            name: trimmed(name).to_vec(),
            reached_by: HashSet::new(),
            reaches: HashSet::new(),
            parked: None,
        },
    );
    id
}

/// Records that open endpoint `id` is about to insert address `peer`; refuses the address of an endpoint
/// of this process that is already closed.
pub(super) fn link(id: KeptId, peer: &[u8]) -> Result<(), TransportError> {
    let peer = trimmed(peer);
    let mut guard = keeper();
    let k = guard.get_or_insert_with(Keeper::default);
    if k.closed.contains(peer) {
        return Err(TransportError::Unreachable(format!(
            "endpoint {} of this process is closed",
            String::from_utf8_lossy(peer)
        )));
    }
    let target = k
        .entries
        .iter()
        .find(|(other, e)| **other != id && e.name == peer)
        .map(|(&other, _)| other);
    if let Some(target) = target {
        if let Some(e) = k.entries.get_mut(&target) {
            e.reached_by.insert(id);
        }
        if let Some(e) = k.entries.get_mut(&id) {
            e.reaches.insert(target);
        }
    }
    Ok(())
}

/// The owner of endpoint `id` closed it (its registrations are closed already): `parked` is closed now if
/// no open endpoint can reach it, else when the last one closes. Endpoints parked only because `id` could
/// reach them are closed now too.
pub(super) fn close(id: KeptId, parked: Parked) {
    let mut release = Vec::new();
    {
        let mut guard = keeper();
        let k = guard.get_or_insert_with(Keeper::default);
        let Some(mut entry) = k.entries.remove(&id) else {
            release.push(parked);
            drop(guard);
            release.into_iter().for_each(Parked::close);
            return;
        };
        for reached in &entry.reaches {
            let Some(other) = k.entries.get_mut(reached) else {
                continue;
            };
            other.reached_by.remove(&id);
            if other.reached_by.is_empty()
                && other.parked.is_some()
                && let Some(done) = k.entries.remove(reached)
            {
                release.extend(done.parked);
            }
        }
        k.closed.insert(entry.name.clone());
        entry.reached_by.retain(|by| k.entries.contains_key(by));
        if entry.reached_by.is_empty() {
            release.push(parked);
        } else {
            entry.reaches.clear();
            entry.parked = Some(parked);
            k.entries.insert(id, entry);
        }
    }
    release.into_iter().for_each(Parked::close);
}

/// How many endpoints of this process are closed by their owners but still open in the provider, because an
/// open endpoint here (an in-process `shm` peer) can still reach them. Zero once every in-process peer of
/// theirs has closed.
#[must_use]
pub fn parked_endpoints() -> usize {
    keeper().as_ref().map_or(0, |k| {
        k.entries.values().filter(|e| e.parked.is_some()).count()
    })
}

impl Parked {
    fn close(self) {
        self.objects.close(&[]);
        drop(self.pools);
    }
}
