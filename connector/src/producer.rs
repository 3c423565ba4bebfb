//! The producer's serving side: answers lookups from its tier store and starts loads out of it.
//!
//! A load may ask for blocks that are still being saved (a prefill computing them now): its session starts
//! at once, gated to the layers saved so far, and each `save_kv_layer` releases the next layer to it
//! ([`ProducerCore::advance_streams`]), so the transfer overlaps the prefill's compute. If a block it
//! carries is abandoned or evicted before its last layer, the session is cancelled and the consumer
//! recomputes what did not arrive.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use policy::NamespaceId;
use transfer_engine::{TrafficClass, TransferRequest};

use crate::control::ControlIdentity;
use crate::data_plane::{DataPlane, Destination, PlaneRegion, PlaneSession, Via};
use crate::error::ConnectorError;
use crate::keys::ScopedKey;
use crate::metrics::{Direction, Metrics};
use crate::store::TierStore;
use crate::tp::RankKv;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A load the producer started: the session, and how many of the asked blocks it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Started {
    /// The sending session (`None` when no block could be served).
    pub(crate) session: Option<PlaneSession>,
    /// Leading blocks served; the rest must be recomputed.
    pub(crate) served: usize,
}

/// A sending session carrying blocks that were still being saved when it started.
#[derive(Debug)]
pub(crate) struct Stream {
    session: PlaneSession,
    keys: Vec<ScopedKey>,
    /// The slots the session reads, paired with `keys`.
    slots: Vec<u32>,
    /// Layers released to the session so far.
    released: u32,
}

/// A producer's store, transport and current namespace, shared by its worker calls and its control server.
#[derive(Debug)]
pub(crate) struct ProducerCore {
    pub(crate) store: Mutex<TierStore>,
    /// The store's memory as each transport of the data plane addresses it.
    pub(crate) store_handle: PlaneRegion,
    pub(crate) transport: DataPlane,
    pub(crate) namespace: Mutex<NamespaceId>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) started: Instant,
    pub(crate) prefetch_depth: u32,
    pub(crate) timeout: Duration,
    /// How long blocks saved for a decode stay held when no load of them comes.
    pub(crate) hold_timeout: Duration,
    pub(crate) runtime: tokio::runtime::Handle,
    /// Loads waiting for layers still to be saved. Locked after `store`, never before.
    pub(crate) streams: Mutex<Vec<Stream>>,
    /// This worker's tensor-parallel rank: consumers of another rank are refused.
    pub(crate) rank: RankKv,
    /// What its control server checks of consumers (secret, lane namespace).
    pub(crate) control: ControlIdentity,
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

    /// Whether `keys` name anything this producer may serve: some keys, all in its current namespace.
    fn servable(&self, keys: &[ScopedKey]) -> bool {
        !keys.is_empty() && keys.iter().all(|k| self.current(k.ns))
    }

    /// Leading keys stored whole.
    pub(crate) fn lookup(&self, keys: &[ScopedKey]) -> usize {
        if !self.servable(keys) {
            return 0;
        }
        lock(&self.store).lookup(keys)
    }

    /// A lookup's answer: leading keys this producer can serve (stored whole only, with `whole`; else also
    /// being saved now), and how many of those only its disk tier holds.
    pub(crate) fn lookup_tiers(&self, keys: &[ScopedKey], whole: bool) -> (usize, usize) {
        if !self.servable(keys) {
            return (0, 0);
        }
        let store = lock(&self.store);
        let found = if whole {
            store.lookup(keys)
        } else {
            store.lookup_streaming(keys)
        };
        (found, store.disk_only(&keys[..found]))
    }

    /// Releases to each streaming load the layers saved since (after a `save_kv_layer`), and cancels those
    /// whose blocks were abandoned or evicted before their last layer.
    pub(crate) fn advance_streams(&self) {
        let store = lock(&self.store);
        let layers = store.layout().layers;
        lock(&self.streams).retain_mut(|s| match store.layers_saved(&s.keys, &s.slots) {
            None => {
                // The session may be over already; then there is nothing to cancel.
                let _ = self.transport.cancel(s.session);
                false
            }
            Some(saved) => {
                if saved > s.released && self.transport.layers_written(s.session, saved).is_ok() {
                    s.released = saved;
                }
                s.released < layers
            }
        });
    }

    /// Starts sending the leading blocks of `keys` stored whole or being saved into `dst_blocks` of `dst`
    /// (layers still to be saved go out as they are saved); the slots stay pinned until the session ends.
    pub(crate) fn load(
        self: &Arc<Self>,
        keys: &[ScopedKey],
        dst: Destination,
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
        if !self.servable(keys) {
            return Ok(Started {
                session: None,
                served: 0,
            });
        }
        // The store stays locked until the stream is recorded, so no layer saved meanwhile is missed.
        let mut store = lock(&self.store);
        let slots = store.pin_streaming(keys, request, self.now());
        if slots.is_empty() {
            return Ok(Started {
                session: None,
                served: 0,
            });
        }
        let served = slots.len();
        let layers = store.layout().layers;
        let Some(saved) = store.layers_saved(&keys[..served], &slots) else {
            // Pinning one block evicted another it had pinned: that load could never complete.
            store.unpin(&slots);
            return Ok(Started {
                session: None,
                served: 0,
            });
        };
        let req = self
            .store_handle
            .on(dst.via)
            .and_then(|src| {
                Ok(TransferRequest::blocks(
                    dst.peer,
                    src,
                    slots.clone(),
                    &dst.region,
                    dst_blocks[..served].to_vec(),
                    0..layers,
                )?)
            })
            .map(|r| {
                let r = r
                    .with_prefetch_depth(self.prefetch_depth)
                    .with_class(class)
                    .with_deadline(self.timeout);
                if saved < layers {
                    r.with_layers_written(saved)
                } else {
                    r
                }
            });
        let session = match req.and_then(|r| self.transport.submit(dst.via, r)) {
            Ok(s) => s,
            Err(e) => {
                store.unpin(&slots);
                return Err(e);
            }
        };
        if saved < layers {
            lock(&self.streams).push(Stream {
                session,
                keys: keys[..served].to_vec(),
                slots: slots.clone(),
                released: saved,
            });
            self.metrics.streamed_load();
        }
        if dst.via == Via::SameHost {
            self.metrics.same_host_load();
        }
        drop(store);
        let bytes = served as u64
            * u64::from(layers)
            * self.store_handle.layout().map_or(0, |l| l.block_bytes);
        let core = self.clone();
        let keys = keys[..served].to_vec();
        self.runtime.spawn(async move {
            let out = core
                .transport
                .wait_sent(session, core.timeout + Duration::from_secs(5))
                .await;
            let delivered = out.as_ref().is_ok_and(|o| o.recompute.is_empty());
            if let Ok(out) = &out {
                let lost = out.recompute.len() as u64
                    * core.store_handle.layout().map_or(0, |l| l.block_bytes);
                core.metrics
                    .bytes(Direction::Out, class, bytes.saturating_sub(lost));
            }
            core.metrics.set_retransmits(core.transport.retransmits());
            let mut store = lock(&core.store);
            store.unpin(&slots);
            if delivered {
                // A decode has its blocks: their holds end (a failed load keeps them for a retry).
                store.release_holds(&keys);
            }
            lock(&core.streams).retain(|s| s.session != session);
        });
        Ok(Started {
            session: Some(session),
            served,
        })
    }
}
