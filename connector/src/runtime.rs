//! The connector's own tokio runtime. The connector's calls are blocking calls (vLLM makes them from
//! plain threads): each runs its waits on this runtime. On a thread that already runs an async runtime,
//! where blocking would stall it (and tokio panics), a call is refused with
//! [`ConnectorError::OnRuntimeThread`], and dropping the connector there shuts its runtime down in the
//! background instead of blocking.

use std::future::Future;
use std::ops::Deref;

use tokio::runtime::{Handle, Runtime};

use crate::error::ConnectorError;

/// A runtime that may be dropped anywhere.
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

    /// Runs `f` to completion for blocking call `call`, refused on a runtime thread.
    pub(crate) fn block_on<F: Future>(
        &self,
        call: &'static str,
        f: F,
    ) -> Result<F::Output, ConnectorError> {
        refuse_on_runtime_thread(call)?;
        Ok(self.deref().block_on(f))
    }
}

/// Refuses blocking call `call` when this thread runs an async runtime.
pub(crate) fn refuse_on_runtime_thread(call: &'static str) -> Result<(), ConnectorError> {
    match Handle::try_current() {
        Ok(_) => Err(ConnectorError::OnRuntimeThread(call)),
        Err(_) => Ok(()),
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
