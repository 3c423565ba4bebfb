//! The producer's serving side: answers lookups from its tier store and starts loads out of it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use policy::NamespaceId;
use transfer_engine::{PeerId, RegionHandle, SessionId, TrafficClass, TransferRequest};

use crate::error::ConnectorError;
use crate::keys::ScopedKey;
use crate::metrics::{Direction, Metrics};
use crate::store::TierStore;
use crate::transport::Transport;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A load the producer started: the session, and how many of the asked blocks it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    /// The sending session (`None` when no block could be served).
    pub(crate) session: Option<SessionId>,
    /// Leading blocks served; the rest must be recomputed.
    pub(crate) served: usize,
}

/// A producer's store, transport and current namespace, shared by its worker calls and its control server.
#[derive(Debug)]
pub(crate) struct ProducerCore {
    pub(crate) store: Mutex<TierStore>,
    pub(crate) store_handle: RegionHandle,
    pub(crate) transport: Transport,
    pub(crate) namespace: Mutex<NamespaceId>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) started: Instant,
    pub(crate) prefetch_depth: u32,
    pub(crate) timeout: Duration,
    pub(crate) runtime: tokio::runtime::Handle,
}

impl ProducerCore {
    pub(crate) fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Whether `ns` is the namespace this producer serves now (counted when not).
    fn current(&self, ns: NamespaceId) -> bool {
        let ok = *lock(&self.namespace) == ns;
        if !ok {
            self.metrics.stale_lookup();
        }
        ok
    }

    /// Leading keys stored whole.
    pub(crate) fn lookup(&self, keys: &[ScopedKey]) -> usize {
        if keys.is_empty() || !keys.iter().all(|k| self.current(k.ns)) {
            return 0;
        }
        lock(&self.store).lookup(keys)
    }

    /// Starts sending the leading stored blocks of `keys` into `dst_blocks` of `dst` on `peer`; the
    /// slots stay pinned until the session ends.
    pub(crate) fn load(
        self: &Arc<Self>,
        keys: &[ScopedKey],
        peer: PeerId,
        dst: &RegionHandle,
        dst_blocks: &[u32],
        class: TrafficClass,
        request: u64,
    ) -> Result<Started, ConnectorError> {
        if keys.len() != dst_blocks.len() {
            return Err(ConnectorError::Blocks(format!(
                "{} keys but {} destination blocks",
                keys.len(),
                dst_blocks.len()
            )));
        }
        if keys.is_empty() || !keys.iter().all(|k| self.current(k.ns)) {
            return Ok(Started {
                session: None,
                served: 0,
            });
        }
        let (slots, layers) = {
            let mut store = lock(&self.store);
            (store.pin(keys, request, self.now()), store.layout().layers)
        };
        if slots.is_empty() {
            return Ok(Started {
                session: None,
                served: 0,
            });
        }
        let served = slots.len();
        let req = TransferRequest::blocks(
            peer,
            &self.store_handle,
            slots.clone(),
            dst,
            dst_blocks[..served].to_vec(),
            0..layers,
        )
        .map(|r| {
            r.with_prefetch_depth(self.prefetch_depth)
                .with_class(class)
                .with_deadline(self.timeout)
        });
        let session = match req
            .map_err(ConnectorError::from)
            .and_then(|r| self.transport.submit(r))
        {
            Ok(s) => s,
            Err(e) => {
                lock(&self.store).unpin(&slots);
                return Err(e);
            }
        };
        let bytes = served as u64
            * u64::from(layers)
            * self.store_handle.layout.map_or(0, |l| l.block_bytes);
        let core = self.clone();
        self.runtime.spawn(async move {
            let out = core
                .transport
                .wait_sent(session, core.timeout + Duration::from_secs(5))
                .await;
            if let Ok(out) = &out {
                let lost = out.recompute.len() as u64
                    * core.store_handle.layout.map_or(0, |l| l.block_bytes);
                core.metrics
                    .bytes(Direction::Out, class, bytes.saturating_sub(lost));
            }
            core.metrics.retransmits.store(
                core.transport.retransmits(),
                std::sync::atomic::Ordering::Relaxed,
            );
            lock(&core.store).unpin(&slots);
        });
        Ok(Started {
            session: Some(session),
            served,
        })
    }
}
