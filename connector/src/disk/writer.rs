//! The write-back thread: takes staged records off the bounded queue in order and writes each into its
//! slot, so a save or a demotion never waits for the disk.
//!
//! One thread writes, in queue order, so a slot freed and handed to a newer record is always written by
//! the newer record last. A record whose block was removed while it waited is skipped.

use std::sync::{Arc, PoisonError};

use super::slots::is_full;
use super::{Job, Shared};

/// Runs until the tier shuts down and its queue is empty.
pub(crate) fn run(shared: &Arc<Shared>) {
    loop {
        let job = {
            let mut st = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                let next = if st.paused {
                    None
                } else {
                    st.queue.pop_front()
                };
                if let Some(job) = next {
                    if st.index.get(&job.key).is_some_and(|e| e.seq == job.seq) {
                        st.writing = true;
                        break Some(job);
                    }
                    st.recycle(job.buf); // removed while queued: nothing to write
                    continue;
                }
                if st.shutdown && st.queue.is_empty() {
                    break None;
                }
                shared.idle.notify_all();
                st = shared
                    .queued
                    .wait(st)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        let Some(Job {
            key,
            seq,
            slot,
            buf,
        }) = job
        else {
            shared.idle.notify_all();
            return;
        };
        let written = shared.file.write(slot, &buf);
        let mut st = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        st.writing = false;
        let current = st.index.get(&key).is_some_and(|e| e.seq == seq);
        match written {
            Ok(()) => {
                st.stats.written += 1;
                st.stats.bytes_written += buf.bytes().len() as u64;
                if current && let Some(e) = st.index.get_mut(&key) {
                    e.staged = None;
                }
            }
            Err(e) => {
                if is_full(&e) {
                    st.stats.disk_full += 1;
                } else {
                    st.stats.write_errors += 1;
                }
                st.last_error = Some(format!(
                    "writing slot {slot} of {}: {e}",
                    shared.file.path().display()
                ));
                if current {
                    st.index.remove(&key);
                    st.free.push(slot);
                }
            }
        }
        st.recycle(buf);
        drop(st);
        shared.idle.notify_all();
    }
}
