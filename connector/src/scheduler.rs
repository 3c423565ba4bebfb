//! Scheduler-side calls: how much of a request can be loaded, which blocks it got, the per-step
//! metadata for the workers, and the end of a request.

use crate::connector::{KvConnector, Source};
use crate::error::ConnectorError;
use crate::keys::{ScopedKey, scoped};
use crate::producer::lock;
use crate::request::{BlockSpec, ConnectorMetadata, KvRequest, KvTransferParams};
use crate::state::{SavePlan, SchedulerState, Tracked};
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
    /// a producer is saving now (their layers stream as they are saved), and whether the load is
    /// asynchronous (with [`crate::ConnectorConfig::async_loads`] and something to load; otherwise its
    /// layers stream inside the forward pass). At least one prompt token is always left to compute. The connector tracks the
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
                load_async: self.cfg.async_loads && new_tokens > 0,
                save: None,
                hold: false,
            },
        );
        Ok((new_tokens, self.cfg.async_loads && new_tokens > 0))
    }

    /// A producer's request that a decode will load (vLLM's `do_remote_decode`): its saved blocks are held
    /// in the tier store (never dropped while another block can be; a disk tier may take them) until a
    /// load of them completes or
    /// [`crate::ConnectorConfig::hold_timeout`] passes after their save; the engine's own blocks are
    /// free as usual (each layer is copied into the store as it is computed). Call it after
    /// [`KvConnector::get_num_new_matched_tokens`], before the request's blocks are saved.
    pub fn hold_for_decode(&self, request: &str) -> Result<(), ConnectorError> {
        let mut sched = lock(&self.sched);
        let t = sched
            .requests
            .get_mut(request)
            .ok_or_else(|| ConnectorError::UnknownRequest(request.into()))?;
        t.hold = self.cfg.role.saves();
        Ok(())
    }

    /// vLLM's `update_state_after_alloc`: the engine allocated `block_ids` (the request's whole block
    /// table) and will load `num_external_tokens` tokens through this connector. A consumer plans the
    /// load of those blocks; a producer plans saving every full block of the prompt, each in the step
    /// that computes it (see [`KvConnector::record_step`]). A request whose load is asynchronous plans no
    /// save until the engine allocates it again, once the load is over: its blocks hold nothing yet.
    pub fn update_state_after_alloc(
        &self,
        request: &str,
        block_ids: &[u32],
        num_external_tokens: usize,
    ) -> Result<(), ConnectorError> {
        let bs = self.cfg.namespace.block_size as usize;
        let mut sched = lock(&self.sched);
        let SchedulerState { requests, pending } = &mut *sched;
        let t = requests
            .get_mut(request)
            .ok_or_else(|| ConnectorError::UnknownRequest(request.into()))?;
        let mut loading_async = false;
        if self.cfg.role.loads() && num_external_tokens > 0 {
            let first = t.computed_blocks;
            let last = (first + num_external_tokens / bs)
                .min(t.matched_blocks)
                .min(block_ids.len());
            if last > first {
                pending.loads.push(BlockSpec {
                    request: request.into(),
                    keys: t.keys[first..last].to_vec(),
                    blocks: block_ids[first..last].to_vec(),
                    local: t.local,
                    producer: t.producer.clone(),
                    hold: false,
                });
                loading_async = t.load_async;
            } else if t.load_async {
                // Told the engine the load is asynchronous, so it waits for its report: an empty one.
                pending.loads.push(BlockSpec {
                    request: request.into(),
                    keys: Vec::new(),
                    blocks: Vec::new(),
                    local: t.local,
                    producer: None,
                    hold: false,
                });
            }
        }
        t.load_async = false;
        if self.cfg.role.saves() && !loading_async && !t.keys.is_empty() {
            let saved = t.save.as_ref().map_or(0, |p| p.saved);
            t.save = Some(SavePlan {
                blocks: block_ids.to_vec(),
                saved: saved.min(block_ids.len()),
                computed_tokens: None,
            });
        }
        Ok(())
    }

    /// What the engine's step does to `request` (vLLM's `SchedulerOutput`): it appends `new_blocks` to
    /// the request's block table (or, with `replace`, the table is `new_blocks`: a preempted request
    /// resumed), and by the step's end `computed_tokens` of it are computed. A saving role then saves
    /// only the blocks computed by then, and the rest in the steps that compute them (chunked prefill).
    /// Without this call a request's every full block is saved in the step after its allocation.
    /// Returns whether the request is tracked.
    pub fn record_step(
        &self,
        request: &str,
        new_blocks: &[u32],
        replace: bool,
        computed_tokens: usize,
    ) -> bool {
        let mut sched = lock(&self.sched);
        let Some(t) = sched.requests.get_mut(request) else {
            return false;
        };
        if let Some(plan) = &mut t.save {
            if replace {
                plan.blocks = new_blocks.to_vec();
                plan.saved = plan.saved.min(plan.blocks.len());
            } else {
                plan.blocks.extend_from_slice(new_blocks);
            }
            plan.computed_tokens = Some(computed_tokens);
        }
        true
    }

    /// vLLM's `build_connector_meta`: the loads planned since the last step, and the saves of every
    /// block computed by this step's end, for the workers.
    pub fn build_connector_meta(&self) -> ConnectorMetadata {
        let bs = self.cfg.namespace.block_size as usize;
        let mut sched = lock(&self.sched);
        let SchedulerState { requests, pending } = &mut *sched;
        for (id, t) in requests.iter_mut() {
            let Some(plan) = &mut t.save else { continue };
            let full = t.keys.len().min(plan.blocks.len());
            let upto = plan.computed_tokens.map_or(full, |c| (c / bs).min(full));
            if upto > plan.saved {
                pending.saves.push(BlockSpec {
                    request: id.clone(),
                    keys: t.keys[plan.saved..upto].to_vec(),
                    blocks: plan.blocks[plan.saved..upto].to_vec(),
                    local: false,
                    producer: None,
                    hold: t.hold,
                });
                plan.saved = upto;
            }
            if plan.computed_tokens.is_none() || plan.saved == t.keys.len() {
                t.save = None;
            }
        }
        std::mem::take(pending)
    }

    /// vLLM's `request_finished`: the request is done. Returns whether the engine must keep its blocks
    /// until [`KvConnector::get_finished`] reports it (never here: a producer copies each layer into its
    /// tier store during `save_kv_layer`, so the engine's blocks are free once the step ends, and the
    /// store holds them for a decode: see [`KvConnector::hold_for_decode`]), and, from a
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
