//! The connector's own tokio runtime. The connector's calls are blocking calls (vLLM makes them from
//! plain threads): each runs its waits on this runtime. Called from a thread that runs, or has entered,
//! an async runtime (an async task, `spawn_blocking`), where tokio refuses a nested `block_on`, the wait
//! runs on a short-lived thread of its own while the caller's thread blocks; and dropping the connector
//! there shuts its runtime down in the background instead of blocking.

use std::future::Future;
use std::ops::Deref;

use tokio::runtime::{Handle, Runtime};

use crate::error::ConnectorError;

/// A runtime that may be used and dropped anywhere.
#[derive(Debug)]
pub(crate) struct OwnRuntime(Option<Runtime>);

impl OwnRuntime {
    /// Two worker threads with timers and I/O.
    pub(crate) fn new() -> Result<OwnRuntime, ConnectorError> {
        Ok(OwnRuntime(Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?,
        )))
    }

    /// Runs `f` to completion and returns its output, from any thread.
    pub(crate) fn block_on<F>(&self, f: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        if Handle::try_current().is_err() {
            return self.deref().block_on(f);
        }
        std::thread::scope(|s| {
            s.spawn(|| self.deref().block_on(f))
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }
}

impl Deref for OwnRuntime {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        self.0
            .as_ref()
            .expect("the runtime lives until the connector drops")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            if Handle::try_current().is_ok() {
                rt.shutdown_background();
            } else {
                drop(rt);
            }
        }
    }
}
