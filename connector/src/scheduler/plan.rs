//! The scheduler half's plans: a request tracked with what its lookup found, which blocks it got, what
//! each step computes, and the per-step metadata for the workers.

use std::sync::Arc;

use super::KvScheduler;
use super::lookup::Found;
use crate::error::ConnectorError;
use crate::keys::BlockHash;
use crate::producer::lock;
use crate::request::{BlockSpec, ConnectorMetadata, KvRequest};
use crate::state::{SavePlan, SchedulerState, Tracked};

impl KvScheduler {
    /// Tracks `req` with what its lookup found, and answers vLLM's `get_num_new_matched_tokens`.
    pub(super) fn track(
        &self,
        req: &KvRequest<'_>,
        num_computed: usize,
        found: Found,
    ) -> (usize, bool) {
        let bs = self.cfg.namespace.block_size as usize;
        let Found {
            keys,
            matched,
            disk,
            local,
            producer,
            errors,
        } = found;
        if self.cfg.role.loads() {
            let usable = keys.len().min(req.tokens.len().saturating_sub(1) / bs);
            self.metrics.lookup(usable, matched);
        }
        if !errors.is_empty() {
            lock(&self.lookup_errors).extend(errors);
        }
        let new_tokens = (matched * bs).saturating_sub(num_computed);
        let load_async = self.cfg.async_loads && new_tokens > 0;
        let tokens = if self.cfg.kv_events && self.cfg.role.saves() {
            req.tokens[..(keys.len() * bs).min(req.tokens.len())].to_vec()
        } else {
            Vec::new()
        };
        lock(&self.state).requests.insert(
            req.id.to_owned(),
            Tracked {
                keys: Arc::unwrap_or_clone(keys),
                computed_blocks: num_computed / bs,
                matched_blocks: matched,
                disk_blocks: disk,
                local,
                producer,
                load_async,
                save: None,
                hold: false,
                tokens,
                engine_hashes: Vec::new(),
            },
        );
        (new_tokens, load_async)
    }

    /// A producer's request that a decode will load (vLLM's `do_remote_decode`): its saved blocks are held
    /// in the tier store (never dropped while another block can be; a disk tier may take them) until a
    /// load of them completes or
    /// [`crate::ConnectorConfig::hold_timeout`] passes after their save; the engine's own blocks are
    /// free as usual (each layer is copied into the store as it is computed). Call it after
    /// [`KvScheduler::get_num_new_matched_tokens`], before the request's blocks are saved.
    pub fn hold_for_decode(&self, request: &str) -> Result<(), ConnectorError> {
        let mut sched = lock(&self.state);
        let t = sched
            .requests
            .get_mut(request)
            .ok_or_else(|| ConnectorError::UnknownRequest(request.into()))?;
        t.hold = self.cfg.role.saves();
        Ok(())
    }

    /// The serving engine's own hashes of `request`'s blocks (vLLM's `request.block_hashes`), when they
    /// are not this connector's keys: the KV events of its saves name the blocks by them
    /// ([`crate::ConnectorConfig::kv_events`]), so that they match the engine's own events. Call it
    /// after [`KvScheduler::get_num_new_matched_tokens`]. Returns whether the request is tracked.
    pub fn set_engine_hashes(&self, request: &str, hashes: Vec<BlockHash>) -> bool {
        let mut sched = lock(&self.state);
        let Some(t) = sched.requests.get_mut(request) else {
            return false;
        };
        if self.cfg.kv_events {
            t.engine_hashes = hashes;
        }
        true
    }

    /// vLLM's `update_state_after_alloc`: the engine allocated `block_ids` (the request's whole block
    /// table) and will load `num_external_tokens` tokens through this connector. A consumer plans the
    /// load of those blocks; a producer plans saving every full block of the prompt, each in the step
    /// that computes it (see [`KvScheduler::record_step`]). A request whose load is asynchronous plans no
    /// save until the engine allocates it again, once the load is over: its blocks hold nothing yet.
    pub fn update_state_after_alloc(
        &self,
        request: &str,
        block_ids: &[u32],
        num_external_tokens: usize,
    ) -> Result<(), ConnectorError> {
        let bs = self.cfg.namespace.block_size as usize;
        let mut sched = lock(&self.state);
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
                    tokens: Vec::new(),
                    engine_hashes: Vec::new(),
                    parent: None,
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
                    tokens: Vec::new(),
                    engine_hashes: Vec::new(),
                    parent: None,
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
        let mut sched = lock(&self.state);
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

    /// The engine preempted `request` (vLLM's `SchedulerOutput.preempted_req_ids`): its blocks go to other
    /// requests, so the rest of its save plan is dropped (what was saved stays whole in the store) and the
    /// workers are told in the next metadata. When it is scheduled again its lookup runs afresh. Returns
    /// whether the request is tracked.
    pub fn request_preempted(&self, request: &str) -> bool {
        let mut sched = lock(&self.state);
        let SchedulerState { requests, pending } = &mut *sched;
        let Some(t) = requests.get_mut(request) else {
            return false;
        };
        t.save = None;
        t.load_async = false;
        pending.preempted.push(request.to_owned());
        true
    }

    /// vLLM's `build_connector_meta`: the loads planned since the last step, and the saves of every
    /// block computed by this step's end, for the workers.
    pub fn build_connector_meta(&self) -> ConnectorMetadata {
        let bs = self.cfg.namespace.block_size as usize;
        let mut sched = lock(&self.state);
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
                    tokens: t
                        .tokens
                        .get(plan.saved * bs..upto * bs)
                        .map(<[u32]>::to_vec)
                        .unwrap_or_default(),
                    engine_hashes: t
                        .engine_hashes
                        .get(plan.saved..upto)
                        .map(<[BlockHash]>::to_vec)
                        .unwrap_or_default(),
                    parent: plan
                        .saved
                        .checked_sub(1)
                        .filter(|_| !t.tokens.is_empty())
                        .map(|i| t.engine_hashes.get(i).copied().unwrap_or(t.keys[i].hash)),
                });
                plan.saved = upto;
            }
            if plan.computed_tokens.is_none() || plan.saved == t.keys.len() {
                t.save = None;
            }
        }
        std::mem::take(pending)
    }
}
