//! Scheduler-side calls: how much of a request can be loaded, which blocks it got, the per-step
//! metadata for the workers, and the end of a request.

use crate::connector::{KvConnector, Source};
use crate::error::ConnectorError;
use crate::keys::{ScopedKey, scoped};
use crate::producer::lock;
use crate::request::{BlockSpec, ConnectorMetadata, KvRequest, KvTransferParams};
use crate::state::Tracked;
use crate::tp::{RankHandshake, rank_controls};

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
        producer: Option<&KvTransferParams>,
    ) -> Result<usize, ConnectorError> {
        match &self.source {
            Source::None => Ok(0),
            Source::Local(core, _) => Ok(core.lookup_streaming(keys)),
            Source::Remote(remotes) => {
                match remotes.client(producer.map(|p| p.control_for(self.cfg.tp))) {
                    Some(client) => self.block_on(client.lookup(keys, self.rank_kv())),
                    None => Ok(0),
                }
            }
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
        let producer = req.transfer_params.cloned();
        if self.cfg.role.loads() {
            let usable = keys.len().min(req.tokens.len().saturating_sub(1) / bs);
            // A `both` connector's own store is a lower tier: it wins when it holds at least as much.
            let here = self.stored_prefix(&keys[..usable]);
            matched = self.lookup(&keys[..usable], producer.as_ref())?;
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
                    producer: t.producer.clone(),
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
    /// producer, where a consumer finds the request's KV (vLLM's `kv_transfer_params`): this rank's
    /// control address and, under tensor parallelism, every rank's (see
    /// [`KvConnector::set_rank_handshakes`]).
    pub fn request_finished(&self, request: &str) -> (bool, Option<KvTransferParams>) {
        lock(&self.sched).requests.remove(request);
        let params = self
            .control_addr
            .filter(|_| self.cfg.role.saves())
            .map(|producer| KvTransferParams {
                producer,
                ranks: lock(&self.rank_controls).clone(),
            });
        (false, params)
    }

    /// vLLM's `set_xfer_handshake_metadata`: every rank's handshake ([`KvConnector::rank_handshake`]),
    /// gathered by the serving engine, so transfer parameters name each rank's control address. Needed
    /// on a producer's scheduler rank under tensor parallelism; the error names a missing or wrong rank.
    pub fn set_rank_handshakes(&self, handshakes: &[RankHandshake]) -> Result<(), ConnectorError> {
        let controls = rank_controls(self.cfg.tp, handshakes)?;
        *lock(&self.rank_controls) = controls;
        Ok(())
    }
}
