//! Opening a tier on what is already on disk: the header of every slot is read (in parallel), checked,
//! and turned into the index; namespaces dropped earlier (a checked manifest) are not recovered.
//!
//! Only headers are read, so the time is bounded by the slot count (one page each), not by the bytes
//! stored: a payload torn by a crash is caught by its CRC when it is first read, and never served.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use transfer_engine::{NamespaceId, crc32c};

use super::DiskError;
use super::record::{BadHeader, BlockFormat, Header, PAGE};
use super::slots::{PageBuf, SlotFile};
use crate::keys::{BlockHash, ScopedKey};

/// The manifest of dropped namespaces inside the tier's directory.
const DROPPED: &str = "dropped-namespaces";

/// What opening the tier found on disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Blocks recovered into the index (each served once its payload CRC checks on first read).
    pub blocks: usize,
    /// Slots whose header failed its check (a torn write, or bytes changed on disk): freed.
    pub corrupt_headers: usize,
    /// Records of another block format (the tier was reopened for another model or block size): freed.
    pub other_format: usize,
    /// Records of namespaces dropped before (a weight update): freed.
    pub dropped: usize,
    /// Older records of a key written again later: freed.
    pub superseded: usize,
    /// How long reading the headers took.
    pub elapsed: Duration,
    /// The manifest of dropped namespaces failed its check and was ignored: blocks of namespaces dropped
    /// before may be back (of weights no longer served, so no lookup finds them).
    pub manifest_damaged: bool,
}

/// A recovered block: its key, its slot and sequence, and its parent's key (same namespace).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    pub(crate) key: ScopedKey,
    pub(crate) parent: Option<BlockHash>,
    pub(crate) slot: u32,
    pub(crate) seq: u64,
}

/// The index rebuilt from the slot file.
pub(crate) struct Scan {
    pub(crate) found: Vec<Found>,
    pub(crate) free: Vec<u32>,
    pub(crate) next_seq: u64,
    pub(crate) report: Recovery,
}

/// Reads every slot's header with `readers` threads and keeps the newest valid record of each key.
pub(crate) fn scan(
    file: &SlotFile,
    format: BlockFormat,
    dropped: &HashSet<NamespaceId>,
    readers: usize,
) -> Result<Scan, DiskError> {
    let started = Instant::now();
    let slots = file.slots();
    let next = AtomicU32::new(0);
    let headers: Mutex<Vec<(u32, Result<Header, BadHeader>)>> = Mutex::new(Vec::new());
    let failure: Mutex<Option<DiskError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..readers.clamp(1, 64) {
            s.spawn(|| {
                let mut page = PageBuf::new(PAGE);
                let mut mine = Vec::new();
                loop {
                    let slot = next.fetch_add(1, Ordering::Relaxed);
                    if slot >= slots {
                        break;
                    }
                    let read = file.written(slot).and_then(|written| {
                        if written {
                            file.read(slot, &mut page).map(|()| true)
                        } else {
                            Ok(false)
                        }
                    });
                    let written = match read {
                        Ok(w) => w,
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => false,
                        Err(e) => {
                            let what = format!("reading slot {slot} of {}", file.path().display());
                            *failure.lock().unwrap_or_else(|p| p.into_inner()) =
                                Some(DiskError::io(what, e));
                            next.store(slots, Ordering::Relaxed);
                            break;
                        }
                    };
                    let header = if written {
                        Header::decode(page.bytes())
                    } else {
                        Err(BadHeader::Empty)
                    };
                    mine.push((slot, header));
                }
                headers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(mine);
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let mut headers = headers.into_inner().unwrap_or_else(|p| p.into_inner());
    headers.sort_unstable_by_key(|(slot, _)| *slot);

    let mut report = Recovery::default();
    let mut free = Vec::new();
    let mut next_seq = 1;
    let mut newest: HashMap<ScopedKey, Found> = HashMap::new();
    for (slot, header) in headers {
        let h = match header {
            Ok(h) => h,
            Err(BadHeader::Empty) => {
                free.push(slot);
                continue;
            }
            Err(BadHeader::Corrupt) => {
                report.corrupt_headers += 1;
                free.push(slot);
                continue;
            }
        };
        next_seq = next_seq.max(h.seq + 1);
        if h.format != format {
            report.other_format += 1;
            free.push(slot);
            continue;
        }
        if dropped.contains(&h.key.ns) {
            report.dropped += 1;
            free.push(slot);
            continue;
        }
        let found = Found {
            key: h.key,
            parent: h.parent,
            slot,
            seq: h.seq,
        };
        match newest.get(&h.key) {
            Some(old) if old.seq > h.seq => {
                report.superseded += 1;
                free.push(slot);
            }
            Some(old) => {
                report.superseded += 1;
                free.push(old.slot);
                newest.insert(h.key, found);
            }
            None => {
                newest.insert(h.key, found);
            }
        }
    }
    let mut found: Vec<Found> = newest.into_values().collect();
    found.sort_unstable_by_key(|f| f.slot);
    report.blocks = found.len();
    report.elapsed = started.elapsed();
    // Lowest slots are handed out first (popped from the end).
    free.sort_unstable_by(|a, b| b.cmp(a));
    Ok(Scan {
        found,
        free,
        next_seq,
        report,
    })
}

/// The namespaces dropped in this directory. A manifest that fails its check is ignored (its blocks
/// come back; they are of weights no longer served, so no lookup finds them) and reported.
pub(crate) fn read_dropped(dir: &Path) -> Result<(HashSet<NamespaceId>, bool), DiskError> {
    let path = dir.join(DROPPED);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((HashSet::new(), true)),
        Err(e) => return Err(DiskError::io(format!("reading {}", path.display()), e)),
    };
    Ok(parse_dropped(&text).map_or_else(|| (HashSet::new(), false), |set| (set, true)))
}

fn parse_dropped(text: &str) -> Option<HashSet<NamespaceId>> {
    let body_end = text.trim_end().rfind('\n').map_or(0, |i| i + 1);
    let (body, last) = text.split_at(body_end);
    let crc = u32::from_str_radix(last.trim().strip_prefix("crc32c ")?, 16).ok()?;
    if crc != crc32c(body.as_bytes()) {
        return None;
    }
    body.lines()
        .map(|l| {
            u64::from_str_radix(l.strip_prefix("ns ")?, 16)
                .ok()
                .map(NamespaceId)
        })
        .collect()
}

/// Writes the manifest of dropped namespaces: a new file, synced, renamed over the old one, so a crash
/// leaves the old manifest or the new one, never a mix.
pub(crate) fn write_dropped(dir: &Path, dropped: &HashSet<NamespaceId>) -> Result<(), DiskError> {
    let mut ids: Vec<u64> = dropped.iter().map(|n| n.0).collect();
    ids.sort_unstable();
    let body: String = ids.iter().map(|id| format!("ns {id:016x}\n")).collect();
    let text = format!("{body}crc32c {:08x}\n", crc32c(body.as_bytes()));
    let tmp = dir.join(format!("{DROPPED}.tmp"));
    let path = dir.join(DROPPED);
    let io = |what: &str, e| DiskError::io(format!("{what} {}", tmp.display()), e);
    let mut f = fs::File::create(&tmp).map_err(|e| io("creating", e))?;
    f.write_all(text.as_bytes()).map_err(|e| io("writing", e))?;
    f.sync_all().map_err(|e| io("syncing", e))?;
    fs::rename(&tmp, &path).map_err(|e| io("renaming", e))?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| DiskError::io(format!("syncing {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dropped_manifest_round_trips_and_a_damaged_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("kv-dropped-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        assert_eq!(read_dropped(&dir).unwrap(), (HashSet::new(), true));
        let set: HashSet<NamespaceId> = [NamespaceId(1), NamespaceId(u64::MAX)].into();
        write_dropped(&dir, &set).unwrap();
        assert_eq!(read_dropped(&dir).unwrap(), (set.clone(), true));
        let text = fs::read_to_string(dir.join(DROPPED)).unwrap();
        fs::write(dir.join(DROPPED), text.replacen("ns 0", "ns 1", 1)).unwrap();
        assert_eq!(read_dropped(&dir).unwrap(), (HashSet::new(), false));
        assert_eq!(parse_dropped(""), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
