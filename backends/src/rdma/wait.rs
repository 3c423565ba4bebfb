//! How a driver waits for completions without holding a core.
//!
//! The `tcp` (through `ofi_rxm`) and `shm` providers make progress only inside calls on the endpoint's
//! queue (`FI_PROGRESS_MANUAL` data progress), and in libfabric 1.17 a wait on their queue's wait object
//! does not wake when a peer's data arrives: measured here, a target that slept in `fi_cq_sread` with a
//! 10 ms timeout saw a window of 64 writes land only at each timeout (0.4 GB/s over tcp). So while work is
//! outstanding the driver polls, first in a short spin and then with naps that double from
//! [`MIN_NAP`] to [`MAX_NAP`] (reset by any completion). When nothing is outstanding it naps
//! [`IDLE_NAP`] between polls rather than blocking in `fi_cq_sread`: measured here, two idle nodes cost
//! 3.5% of a core on tcp with `fi_cq_sread`, but 1.98 cores on shm, whose wait spins inside libfabric.

use std::time::Duration;

use super::ffi::{Completion, Endpoint};
use crate::TransportError;

/// Polls in a row before the first nap.
const SPIN_POLLS: u32 = 200;
/// The first nap while work is outstanding.
const MIN_NAP: Duration = Duration::from_micros(20);
/// The nap between polls while idle (also the longest delay before an API call is seen).
const IDLE_NAP: Duration = Duration::from_millis(1);
/// The longest nap while work is outstanding.
const MAX_NAP: Duration = Duration::from_micros(500);

/// Backoff state between polls.
#[derive(Debug, Default)]
pub(crate) struct Waiter {
    empty_polls: u32,
    nap: Duration,
}

impl Waiter {
    /// Something completed or was posted: poll eagerly again.
    pub(crate) fn progressed(&mut self) {
        self.empty_polls = 0;
        self.nap = Duration::ZERO;
    }

    /// Waits for completions into `out`: with work outstanding (`busy`) by spinning then napping,
    /// otherwise by blocking up to `idle` on the queue. Returns how many arrived.
    pub(crate) fn wait(
        &mut self,
        ep: &mut Endpoint,
        busy: bool,
        idle: Duration,
        out: &mut Vec<Completion>,
    ) -> Result<usize, TransportError> {
        if !busy {
            // Not `fi_cq_sread`: on shm it spins inside libfabric (two idle shm nodes took 1.98 cores
            // here); a nap of at most IDLE_NAP between polls costs well under 1% of a core.
            self.progressed();
            std::thread::sleep(idle.min(IDLE_NAP));
            return ep.poll(out);
        }
        self.empty_polls += 1;
        if self.empty_polls > SPIN_POLLS {
            self.nap = (self.nap * 2).clamp(MIN_NAP, MAX_NAP);
            std::thread::sleep(self.nap);
        } else {
            std::hint::spin_loop();
        }
        let n = ep.poll(out)?;
        if n > 0 {
            self.progressed();
        }
        Ok(n)
    }
}
