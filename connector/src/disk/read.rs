//! Reading blocks back: from the staging buffer while a record is queued, from its slot once written,
//! checked (header, key, sequence, format, payload CRC) before any byte reaches the caller.

use std::sync::PoisonError;
use std::sync::atomic::{AtomicUsize, Ordering};

use transfer_engine::{MemoryRegion, crc32c};

use super::record::{Header, PAGE};
use super::slots::PageBuf;
use super::{DiskError, DiskTier, Shared};
use crate::keys::ScopedKey;

/// What a read found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Got {
    /// The block's bytes are in the caller's memory, checked.
    Served,
    /// The tier does not hold the block (never put, removed, or removed while being read).
    Missing,
    /// The record failed its check: nothing was served, the block is removed (counted), recompute it.
    Corrupt,
}

/// Where one read lands: `(offset, len)` ranges of the caller's memory, in the block's byte order.
pub type Pieces<'a> = &'a [(usize, usize)];

impl DiskTier {
    /// Reads block `key` into `dst` at `pieces` (as [`DiskTier::put`] took them). An I/O error is an
    /// error (counted); a record that fails its check is [`Got::Corrupt`] and nothing is written to
    /// `dst`.
    pub fn get(
        &self,
        key: &ScopedKey,
        dst: &MemoryRegion,
        pieces: Pieces<'_>,
    ) -> Result<Got, DiskError> {
        get(&self.shared, key, dst, pieces)
    }

    /// Reads many blocks at once, up to [`super::DiskConfig::readers`] in flight, each as
    /// [`DiskTier::get`]; results in the order of `blocks`.
    pub fn get_many(
        &self,
        blocks: &[(ScopedKey, Pieces<'_>)],
        dst: &MemoryRegion,
    ) -> Vec<Result<Got, DiskError>> {
        let workers = self.shared.cfg.readers.min(blocks.len());
        if workers <= 1 {
            return blocks
                .iter()
                .map(|(k, p)| get(&self.shared, k, dst, p))
                .collect();
        }
        let next = AtomicUsize::new(0);
        let mut results: Vec<(usize, Result<Got, DiskError>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some((key, pieces)) = blocks.get(i) else {
                                break;
                            };
                            mine.push((i, get(&self.shared, key, dst, pieces)));
                        }
                        mine
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        results.sort_unstable_by_key(|(i, _)| *i);
        results.into_iter().map(|(_, r)| r).collect()
    }
}

fn get(
    shared: &Shared,
    key: &ScopedKey,
    dst: &MemoryRegion,
    pieces: Pieces<'_>,
) -> Result<Got, DiskError> {
    let block_bytes = shared.format.block_bytes() as usize;
    let total: usize = pieces.iter().map(|p| p.1).sum();
    if total != block_bytes {
        return Err(DiskError::Config(format!(
            "a read of {total} bytes, the tier holds blocks of {block_bytes}"
        )));
    }
    let (slot, seq, staged) = {
        let st = shared.state();
        let Some(e) = st.index.get(key) else {
            return Ok(Got::Missing);
        };
        (e.slot, e.seq, e.staged.clone())
    };
    if let Some(buf) = staged {
        deliver(&buf.bytes()[PAGE..PAGE + block_bytes], dst, pieces)?;
        let mut st = shared.state();
        st.stats.queue_hits += 1;
        st.stats.bytes_read += block_bytes as u64;
        return Ok(Got::Served);
    }
    let mut buf = shared
        .read_pool
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop()
        .unwrap_or_else(|| PageBuf::new(shared.format.record_bytes() as usize));
    let mut read = shared.file.read(slot, &mut buf);
    if read
        .as_ref()
        .is_err_and(|e| e.kind() == std::io::ErrorKind::UnexpectedEof)
    {
        read = Ok(()); // the file ends inside the record: a torn write, which the check refuses
        buf.bytes_mut().fill(0);
    }
    let verdict = match &read {
        Ok(()) => check(shared, &buf, key, seq),
        Err(_) => false,
    };
    if verdict {
        deliver(&buf.bytes()[PAGE..PAGE + block_bytes], dst, pieces)?;
    }
    let mut pool = shared
        .read_pool
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if pool.len() < shared.cfg.readers {
        pool.push(buf);
    }
    drop(pool);
    let mut st = shared.state();
    if verdict {
        st.stats.disk_hits += 1;
        st.stats.bytes_read += block_bytes as u64;
        return Ok(Got::Served);
    }
    // Removed (and its slot reused) while it was read: a miss, not damage.
    if !st
        .index
        .get(key)
        .is_some_and(|e| e.seq == seq && e.slot == slot)
    {
        return Ok(Got::Missing);
    }
    st.index.remove(key);
    if read.is_ok() {
        // Damaged: its header is zeroed so that a reopened tier does not recover it again. Rare, so
        // done under the lock (the slot must not be handed out before).
        let _ = shared.file.write(slot, &PageBuf::new(PAGE));
    }
    st.free.push(slot);
    match read {
        Err(e) => {
            st.stats.read_errors += 1;
            Err(DiskError::io(
                format!("reading slot {slot} of {}", shared.file.path().display()),
                e,
            ))
        }
        Ok(()) => {
            st.stats.corrupt += 1;
            Ok(Got::Corrupt)
        }
    }
}

/// Whether the record in `buf` is `key`'s, written as sequence `seq`, of the tier's format, intact.
fn check(shared: &Shared, buf: &PageBuf, key: &ScopedKey, seq: u64) -> bool {
    let Ok(h) = Header::decode(buf.bytes()) else {
        return false;
    };
    let len = shared.format.block_bytes() as usize;
    h.key == *key
        && h.seq == seq
        && h.format == shared.format
        && crc32c(&buf.bytes()[PAGE..PAGE + len]) == h.payload_crc
}

fn deliver(payload: &[u8], dst: &MemoryRegion, pieces: Pieces<'_>) -> Result<(), DiskError> {
    let mut at = 0;
    for &(offset, len) in pieces {
        dst.copy_from(offset, &payload[at..at + len])
            .map_err(|e| DiskError::Config(format!("writing the block read: {e}")))?;
        at += len;
    }
    Ok(())
}
