//! The loopback driver's error.

use std::time::Duration;

use transfer_engine::Error;

use super::Side;
use crate::board::WaitError;

/// Errors of the loopback driver (the engines' refusals of frames are recorded, not raised).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoopbackError {
    /// The engine refused a command.
    #[error(transparent)]
    Engine(#[from] Error),
    /// A wait on the receiving or sending side ended without its answer.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// The other end was shut down: its sessions ended with recompute, and new ones are refused.
    #[error("{0}")]
    Unreachable(String),
    /// This end cannot do that (a consumer does not send, a producer does not receive).
    #[error("a loopback {end} cannot {what}")]
    Unsupported {
        /// Which end.
        end: Side,
        /// What it cannot do.
        what: &'static str,
    },
    /// Transfers did not finish within the time allowed.
    #[error("{pending} session(s) did not finish within {waited:?}")]
    Stalled {
        /// Sessions still running.
        pending: usize,
        /// How long we waited.
        waited: Duration,
    },
}
