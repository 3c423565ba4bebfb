//! Scheduler-side calls: how much of a request can be loaded, which blocks it got, the per-step
//! metadata for the workers, and the end of a request.

use std::collections::HashMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::connector::{KvConnector, Source};
use crate::error::ConnectorError;
use crate::keys::{BlockHash, RequestExtras, ScopedKey, scoped};
use crate::producer::lock;

/// A request as the scheduler sees it.
#[derive(Debug, Clone, Copy)]
pub struct KvRequest<'a> {
    /// The serving engine's request id.
    pub id: &'a str,
    /// The prompt's token ids.
    pub tokens: &'a [u32],
    /// LoRA, multimodal items and cache salt.
    pub extras: &'a RequestExtras,
    /// The serving engine's own block hashes, used as they are instead of hashing `tokens`.
    pub external_keys: Option<&'a [BlockHash]>,
    /// Where this request's KV waits (what the producer's [`KvConnector::request_finished`] returned,
    /// carried by the serving engine's proxy); `None`: the consumer's default producer.
    pub transfer_params: Option<&'a KvTransferParams>,
}

/// What a producer hands back when a request finishes, for the proxy to pass to the consumer that
/// decodes it (vLLM's `kv_transfer_params`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvTransferParams {
    /// The producer's control address.
    pub producer: SocketAddr,
}

/// Blocks of one request to load or save in this step: `keys[i]` goes to or comes from block `blocks[i]`
/// of the worker's KV caches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSpec {
    /// The request id.
    pub request: String,
    /// The blocks' keys, in prompt order.
    pub keys: Vec<ScopedKey>,
    /// The worker's block ids, paired with `keys`.
    pub blocks: Vec<u32>,
    /// Load from this instance's own tier store (a `both` connector's lower tier) rather than a producer.
    pub local: bool,
    /// The producer to load from (`None`: the default one).
    pub producer: Option<SocketAddr>,
}

/// What the workers need for one step (vLLM's `KVConnectorMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectorMetadata {
    /// Loads to start (consumer).
    pub loads: Vec<BlockSpec>,
    /// Saves to make, layer by layer (producer).
    pub saves: Vec<BlockSpec>,
}

#[derive(Debug, Clone)]
struct Tracked {
    keys: Vec<ScopedKey>,
    computed_blocks: usize,
    matched_blocks: usize,
    local: bool,
    producer: Option<SocketAddr>,
}

/// The scheduler half's state.
#[derive(Debug, Default)]
pub(crate) struct SchedulerState {
    requests: HashMap<String, Tracked>,
    pending: ConnectorMetadata,
}

/// A stable 64-bit id for a request id (the tier manager counts sharers by it).
pub(crate) fn request_number(id: &str) -> u64 {
    // FNV-1a: stable across processes, unlike std's randomly seeded hasher.
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl KvConnector {
    /// The keys of `req`'s full blocks in the current namespace.
    #[must_use]
    pub fn request_keys(&self, req: &KvRequest<'_>) -> Vec<ScopedKey> {
        let ns = self.namespace();
        match req.external_keys {
            Some(keys) => scoped(&ns, keys),
            None => scoped(&ns, &self.hasher.block_hashes(req.tokens, req.extras)),
        }
    }

    /// Leading blocks of `keys` this connector's own tier store holds whole (a producer's prefix reuse:
    /// those blocks need no prefill). 0 without a store.
    #[must_use]
    pub fn stored_prefix(&self, keys: &[ScopedKey]) -> usize {
        self.producer.as_ref().map_or(0, |core| core.lookup(keys))
    }

    /// Leading blocks of `keys` loadable now from this connector's source (`producer`, or the default).
    fn lookup(
        &self,
        keys: &[ScopedKey],
        producer: Option<SocketAddr>,
    ) -> Result<usize, ConnectorError> {
        match &self.source {
            Source::None => Ok(0),
            Source::Local(core, _) => Ok(core.lookup_streaming(keys)),
            Source::Remote(remotes) => match remotes.client(producer) {
                Some(client) => self.rt.block_on(client.lookup(keys)),
                None => Ok(0),
            },
        }
    }

    /// vLLM's `get_num_new_matched_tokens`: how many tokens of `req` beyond the `num_computed` already in
    /// the engine's own cache can be loaded from other instances, counting blocks stored whole and blocks
    /// a producer is saving now (their layers stream as they are saved), and whether the load is asynchronous (always `false`: loads stream layer by layer inside the
    /// forward pass). At least one prompt token is always left to compute. The connector tracks the
    /// request until [`KvConnector::request_finished`]: call it for every request. Asking a producer
    /// that does not answer within `load_timeout` is an error.
    pub fn get_num_new_matched_tokens(
        &self,
        req: &KvRequest<'_>,
        num_computed: usize,
    ) -> Result<(usize, bool), ConnectorError> {
        let keys = self.request_keys(req);
        let bs = self.cfg.namespace.block_size as usize;
        let computed_blocks = num_computed / bs;
        let (mut matched, mut local) = (0, false);
        let producer = req.transfer_params.map(|p| p.producer);
        if self.cfg.role.loads() {
            let usable = keys.len().min(req.tokens.len().saturating_sub(1) / bs);
            // A `both` connector's own store is a lower tier: it wins when it holds at least as much.
            let here = self.stored_prefix(&keys[..usable]);
            matched = self.lookup(&keys[..usable], producer)?;
            if here > 0 && here >= matched {
                (matched, local) = (here, true);
            }
            self.metrics.lookup(usable, matched);
        }
        let new_tokens = (matched * bs).saturating_sub(num_computed);
        lock(&self.sched).requests.insert(
            req.id.to_owned(),
            Tracked {
                keys,
                computed_blocks,
                matched_blocks: matched,
                local,
                producer,
            },
        );
        Ok((new_tokens, false))
    }

    /// vLLM's `update_state_after_alloc`: the engine allocated `block_ids` (the request's whole block
    /// table) and will load `num_external_tokens` tokens through this connector. A consumer plans the
    /// load of those blocks; a producer plans saving every full block.
    pub fn update_state_after_alloc(
        &self,
        request: &str,
        block_ids: &[u32],
        num_external_tokens: usize,
    ) -> Result<(), ConnectorError> {
        let bs = self.cfg.namespace.block_size as usize;
        let mut sched = lock(&self.sched);
        let t = sched
            .requests
            .get(request)
            .cloned()
            .ok_or_else(|| ConnectorError::UnknownRequest(request.into()))?;
        if self.cfg.role.loads() && num_external_tokens > 0 {
            let first = t.computed_blocks;
            let last = (first + num_external_tokens / bs)
                .min(t.matched_blocks)
                .min(block_ids.len());
            if last > first {
                sched.pending.loads.push(BlockSpec {
                    request: request.into(),
                    keys: t.keys[first..last].to_vec(),
                    blocks: block_ids[first..last].to_vec(),
                    local: t.local,
                    producer: t.producer,
                });
            }
        }
        if self.cfg.role.saves() {
            let n = t.keys.len().min(block_ids.len());
            if n > 0 {
                sched.pending.saves.push(BlockSpec {
                    request: request.into(),
                    keys: t.keys[..n].to_vec(),
                    blocks: block_ids[..n].to_vec(),
                    local: false,
                    producer: None,
                });
            }
        }
        Ok(())
    }

    /// vLLM's `build_connector_meta`: the loads and saves planned since the last step, for the workers.
    pub fn build_connector_meta(&self) -> ConnectorMetadata {
        std::mem::take(&mut lock(&self.sched).pending)
    }

    /// vLLM's `request_finished`: the request is done. Returns whether the engine must keep its blocks
    /// until [`KvConnector::get_finished`] reports it (never here: a producer copies each layer into its
    /// tier store during `save_kv_layer`, so the engine's blocks are free once the step ends), and, from a
    /// producer, where a consumer finds the request's KV (vLLM's `kv_transfer_params`).
    pub fn request_finished(&self, request: &str) -> (bool, Option<KvTransferParams>) {
        lock(&self.sched).requests.remove(request);
        let params = self
            .control_addr
            .filter(|_| self.cfg.role.saves())
            .map(|producer| KvTransferParams { producer });
        (false, params)
    }
}
