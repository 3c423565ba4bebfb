//! The disk tier: KV blocks on local SSD, below host memory, checksummed and crash-safe.
//!
//! One file of fixed-size slots ([`BlockFormat::record_bytes`] each: a header page naming the block and
//! the CRC-32C of its bytes, then the bytes), in a directory of its own. A block put into the tier is
//! copied into a page-aligned staging buffer and queued; one write-back thread writes each queued record
//! with a single large, aligned write (buffered or `O_DIRECT`, see [`DiskIo`]); nothing is `fsync`ed per
//! block. The queue is bounded ([`DiskConfig::queue_blocks`]): a put that finds it full is dropped and
//! counted, so a disk slower than the demotion rate never blocks the caller. A queued block is served
//! from its staging buffer until it is written.
//!
//! Reads check the record's header (key, format, sequence) and its payload CRC before a byte reaches the
//! caller: a block that fails is never served, is removed and counted ([`DiskStats::corrupt`]), and the
//! caller recomputes. Several blocks are read at once ([`DiskTier::get_many`], [`DiskConfig::readers`]).
//!
//! **Crash safety.** After `kill -9` at any moment, reopening the directory reads every slot's header
//! (bounded time: one page per slot) and serves every block whose record was completely written, and no
//! other: a torn record fails its CRC. Dropped namespaces are kept in a small manifest written by
//! rename, so a weight update's old blocks do not come back. Without `fsync`, a power loss (not a
//! process crash) may lose recent records; it never makes a wrong one served.
//!
//! Which blocks live here is the caller's choice (the tier store asks its tier manager); the tier holds
//! at most [`DiskTier::capacity_blocks`] and refuses a put when no slot is free.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use transfer_engine::{MemoryRegion, NamespaceId, crc32c};

use crate::keys::{BlockHash, ScopedKey};

mod config;
mod error;
mod read;
mod record;
mod recover;
mod slots;
mod writer;

pub use config::DiskConfig;
pub use error::DiskError;
pub use read::{Got, Pieces};
pub use record::{BlockFormat, PAGE};
pub use recover::Recovery;
pub use slots::{DiskIo, PageBuf};

use record::Header;
use slots::SlotFile;

/// Counters of a disk tier since it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Blocks held (written or queued).
    pub blocks: usize,
    /// Records waiting in the write-back queue.
    pub queued: usize,
    /// Records written.
    pub written: u64,
    /// Bytes written (whole records).
    pub bytes_written: u64,
    /// Puts dropped because the write-back queue was full.
    pub dropped_queue_full: u64,
    /// Puts refused because every slot was taken.
    pub dropped_no_slot: u64,
    /// Writes that failed because the disk (or the file size limit) was full.
    pub disk_full: u64,
    /// Writes that failed otherwise.
    pub write_errors: u64,
    /// Blocks served from disk.
    pub disk_hits: u64,
    /// Blocks served from the write-back queue before they were written.
    pub queue_hits: u64,
    /// Payload bytes served.
    pub bytes_read: u64,
    /// Blocks that failed their check on read: never served, removed.
    pub corrupt: u64,
    /// Reads that failed with an I/O error.
    pub read_errors: u64,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// Staged and queued for writing (served from now on).
    Queued,
    /// The block is held already.
    AlreadyStored,
    /// The write-back queue is full: not stored (counted).
    QueueFull,
    /// No slot is free: not stored (counted).
    NoSlot,
}

/// One block's place in the tier.
#[derive(Debug)]
pub(crate) struct Entry {
    slot: u32,
    seq: u64,
    /// The staged record while it waits to be written.
    staged: Option<Arc<PageBuf>>,
}

/// A record waiting for the writer.
pub(crate) struct Job {
    key: ScopedKey,
    seq: u64,
    slot: u32,
    buf: Arc<PageBuf>,
}

pub(crate) struct State {
    index: HashMap<ScopedKey, Entry>,
    free: Vec<u32>,
    queue: VecDeque<Job>,
    /// Puts between taking a slot and queueing (counted against the queue's bound).
    reserved: usize,
    /// Spare staging buffers.
    pool: Vec<PageBuf>,
    writing: bool,
    /// Holds the writer (tests: a disk that does not keep up).
    paused: bool,
    shutdown: bool,
    next_seq: u64,
    dropped: HashSet<NamespaceId>,
    stats: DiskStats,
    last_error: Option<String>,
}

impl State {
    /// Keeps a staging buffer for the next put, once no reader shares it.
    fn recycle(&mut self, buf: Arc<PageBuf>) {
        if let Ok(buf) = Arc::try_unwrap(buf) {
            self.pool.push(buf);
        }
    }
}

pub(crate) struct Shared {
    cfg: DiskConfig,
    format: BlockFormat,
    file: SlotFile,
    state: Mutex<State>,
    /// The writer waits here for records.
    queued: Condvar,
    /// [`DiskTier::flush`] waits here for the writer to go idle.
    idle: Condvar,
    /// Read buffers kept between reads (at most `readers`).
    read_pool: Mutex<Vec<PageBuf>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// KV blocks on local disk. See the module docs.
pub struct DiskTier {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    recovery: Recovery,
    recovered: Vec<(ScopedKey, Option<ScopedKey>)>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.shared.cfg.dir)
            .field("format", &self.shared.format)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl DiskTier {
    /// Opens the tier in `cfg.dir` for blocks of `format`, recovering the blocks a previous run wrote
    /// completely (see [`DiskTier::recovery`] and [`DiskTier::take_recovered`]).
    pub fn open(cfg: DiskConfig, format: BlockFormat) -> Result<DiskTier, DiskError> {
        if format.block_bytes() == 0 {
            return Err(DiskError::Config("blocks of zero bytes".into()));
        }
        if cfg.queue_blocks == 0 || cfg.readers == 0 {
            return Err(DiskError::Config(
                "queue_blocks and readers must be at least 1".into(),
            ));
        }
        let slots = cfg.capacity_bytes / format.record_bytes();
        let slots = u32::try_from(slots)
            .map_err(|_| DiskError::Config(format!("{slots} slots are more than 2^32")))?;
        if slots == 0 {
            return Err(DiskError::Config(format!(
                "a capacity of {} bytes holds no record of {} bytes",
                cfg.capacity_bytes,
                format.record_bytes()
            )));
        }
        std::fs::create_dir_all(&cfg.dir)
            .map_err(|e| DiskError::io(format!("creating {}", cfg.dir.display()), e))?;
        let file = SlotFile::open(&cfg.dir, format.record_bytes(), slots, cfg.io)?;
        let (dropped, manifest_ok) = recover::read_dropped(&cfg.dir)?;
        let scan = recover::scan(&file, format, &dropped, cfg.readers)?;
        let by_hash: HashSet<(NamespaceId, BlockHash)> =
            scan.found.iter().map(|f| (f.key.ns, f.key.hash)).collect();
        let recovered = scan
            .found
            .iter()
            .map(|f| {
                let parent = f
                    .parent
                    .filter(|p| by_hash.contains(&(f.key.ns, *p)))
                    .map(|hash| ScopedKey { ns: f.key.ns, hash });
                (f.key, parent)
            })
            .collect();
        let index = scan
            .found
            .iter()
            .map(|f| {
                let e = Entry {
                    slot: f.slot,
                    seq: f.seq,
                    staged: None,
                };
                (f.key, e)
            })
            .collect();
        let state = State {
            index,
            free: scan.free,
            queue: VecDeque::new(),
            reserved: 0,
            pool: Vec::new(),
            writing: false,
            paused: false,
            shutdown: false,
            next_seq: scan.next_seq,
            dropped,
            stats: DiskStats::default(),
            last_error: None,
        };
        let shared = Arc::new(Shared {
            cfg,
            format,
            file,
            state: Mutex::new(state),
            queued: Condvar::new(),
            idle: Condvar::new(),
            read_pool: Mutex::new(Vec::new()),
        });
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("kv-disk-writer".into())
                .spawn(move || writer::run(&shared))
                .map_err(|e| DiskError::io("starting the disk writer".into(), e))?
        };
        Ok(DiskTier {
            shared,
            writer: Some(writer),
            recovery: Recovery {
                manifest_damaged: !manifest_ok,
                ..scan.report
            },
            recovered,
        })
    }

    /// What opening found on disk.
    #[must_use]
    pub fn recovery(&self) -> Recovery {
        self.recovery
    }

    /// The blocks recovered at open, each with its parent when that was recovered too (parents come
    /// in any order: see the key's chain). Taken once; later calls return nothing.
    pub fn take_recovered(&mut self) -> Vec<(ScopedKey, Option<ScopedKey>)> {
        std::mem::take(&mut self.recovered)
    }

    /// The block format the tier holds.
    #[must_use]
    pub fn format(&self) -> BlockFormat {
        self.shared.format
    }

    /// Blocks the tier can hold.
    #[must_use]
    pub fn capacity_blocks(&self) -> u32 {
        self.shared.file.slots()
    }

    /// Blocks held (written or queued).
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.state().index.len()
    }

    /// Whether no block is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` is held (written, or queued and served from its staging buffer).
    #[must_use]
    pub fn contains(&self, key: &ScopedKey) -> bool {
        self.shared.state().index.contains_key(key)
    }

    /// The counters.
    #[must_use]
    pub fn stats(&self) -> DiskStats {
        let st = self.shared.state();
        DiskStats {
            blocks: st.index.len(),
            queued: st.queue.len(),
            ..st.stats
        }
    }

    /// The last write error, if any (the counters say how many).
    #[must_use]
    pub fn last_error(&self) -> Option<String> {
        self.shared.state().last_error.clone()
    }

    /// Stages block `key` (child of `parent`, or a chain's first block) from `src`: `pieces` are
    /// `(offset, len)` ranges of `src` that together make the block's bytes in order (one per layer, say),
    /// `format().block_bytes()` in all. Never waits for the disk.
    pub fn put(
        &self,
        key: ScopedKey,
        parent: Option<BlockHash>,
        src: &MemoryRegion,
        pieces: &[(usize, usize)],
    ) -> Result<Put, DiskError> {
        let total: usize = pieces.iter().map(|p| p.1).sum();
        if total as u64 != self.shared.format.block_bytes() {
            return Err(DiskError::Config(format!(
                "a block of {total} bytes, the tier holds blocks of {}",
                self.shared.format.block_bytes()
            )));
        }
        let (slot, seq, buf) = {
            let mut st = self.shared.state();
            if st.index.contains_key(&key) {
                return Ok(Put::AlreadyStored);
            }
            if st.queue.len() + st.reserved >= self.shared.cfg.queue_blocks {
                st.stats.dropped_queue_full += 1;
                return Ok(Put::QueueFull);
            }
            let Some(slot) = st.free.pop() else {
                st.stats.dropped_no_slot += 1;
                return Ok(Put::NoSlot);
            };
            st.reserved += 1;
            st.next_seq += 1;
            let buf = st.pool.pop();
            (slot, st.next_seq - 1, buf)
        };
        let mut buf =
            buf.unwrap_or_else(|| PageBuf::new(self.shared.format.record_bytes() as usize));
        let filled = fill(&mut buf, src, pieces).map(|crc| {
            Header {
                seq,
                key,
                parent,
                format: self.shared.format,
                payload_crc: crc,
            }
            .encode(buf.bytes_mut());
        });
        let mut st = self.shared.state();
        st.reserved -= 1;
        if let Err(e) = filled {
            st.free.push(slot);
            st.pool.push(buf);
            return Err(e);
        }
        if st.index.contains_key(&key) {
            st.free.push(slot);
            st.pool.push(buf);
            return Ok(Put::AlreadyStored);
        }
        let buf = Arc::new(buf);
        let staged = Some(buf.clone());
        st.index.insert(key, Entry { slot, seq, staged });
        st.queue.push_back(Job {
            key,
            seq,
            slot,
            buf,
        });
        drop(st);
        self.shared.queued.notify_one();
        Ok(Put::Queued)
    }

    /// Removes `key` (evicted by the caller's policy); its slot is free at once. Whether it was held.
    pub fn remove(&self, key: &ScopedKey) -> bool {
        let mut st = self.shared.state();
        match st.index.remove(key) {
            Some(e) => {
                st.free.push(e.slot);
                true
            }
            None => false,
        }
    }

    /// Drops every block of namespace `ns` (after a weight update), on disk too: a reopened tier does
    /// not recover them. Returns how many were held.
    pub fn drop_namespace(&self, ns: NamespaceId) -> Result<usize, DiskError> {
        let mut st = self.shared.state();
        let stale: Vec<ScopedKey> = st.index.keys().filter(|k| k.ns == ns).copied().collect();
        for key in &stale {
            if let Some(e) = st.index.remove(key) {
                st.free.push(e.slot);
            }
        }
        if st.dropped.insert(ns) {
            recover::write_dropped(&self.shared.cfg.dir, &st.dropped)?;
        }
        Ok(stale.len())
    }

    /// Makes every record written so far durable (`fsync` of the slot file): a tier never needs it to
    /// stay consistent (see the module docs), but a caller that must survive a power loss can.
    pub fn sync(&self) -> Result<(), DiskError> {
        self.flush();
        self.shared.file.sync()
    }

    /// The slot file (for tools that inspect or measure it).
    #[must_use]
    pub fn file_path(&self) -> &std::path::Path {
        self.shared.file.path()
    }

    /// Holds or releases the writer, as a disk that stops keeping up would.
    #[cfg(test)]
    fn pause_writer(&self, paused: bool) {
        self.shared.state().paused = paused;
        self.shared.queued.notify_all();
    }

    /// Waits until every queued record is written (or failed).
    pub fn flush(&self) {
        let mut st = self.shared.state();
        while !st.queue.is_empty() || st.writing || st.reserved > 0 {
            st = self
                .shared
                .idle
                .wait(st)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for DiskTier {
    /// Writes what is queued, then stops the writer.
    fn drop(&mut self) {
        let mut st = self.shared.state();
        (st.shutdown, st.paused) = (true, false);
        drop(st);
        self.shared.queued.notify_all();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Copies `pieces` of `src` into the payload part of `buf` and returns their CRC-32C.
fn fill(
    buf: &mut PageBuf,
    src: &MemoryRegion,
    pieces: &[(usize, usize)],
) -> Result<u32, DiskError> {
    let payload = &mut buf.bytes_mut()[PAGE..];
    let mut at = 0;
    for &(offset, len) in pieces {
        let end = offset
            .checked_add(len)
            .ok_or_else(|| DiskError::Config("a piece past the end of memory".into()))?;
        let view = src
            .read(offset..end)
            .map_err(|e| DiskError::Config(format!("reading the block to put: {e}")))?;
        payload[at..at + len].copy_from_slice(&view);
        at += len;
    }
    payload[at..].fill(0);
    Ok(crc32c(&payload[..at]))
}

#[cfg(test)]
mod tests;
