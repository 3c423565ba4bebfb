//! The worker half's loads: start the planned loads into given blocks, wait for a layer, report finished
//! requests and blocks that failed to load.

use std::time::{Duration, Instant};

use super::KvWorker;
use crate::data_plane::{LayerWait, PlaneSession};
use crate::error::ConnectorError;
use crate::metrics::Direction;
use crate::producer::lock;
use crate::request::{BlockSpec, ConnectorMetadata, request_number};
use crate::state::ActiveLoad;

impl KvWorker {
    /// vLLM's `bind_connector_metadata`: the scheduler's plan for this step.
    pub fn bind_connector_metadata(&self, meta: ConnectorMetadata) {
        self.describe_saves(&meta.saves);
        lock(&self.worker).meta = meta;
    }

    /// vLLM's `clear_connector_metadata`: the step is over.
    pub fn clear_connector_metadata(&self) {
        lock(&self.worker).meta = ConnectorMetadata::default();
        self.end_described_saves();
    }

    /// vLLM's `start_load_kv`: asks the producer for every planned load, straight into the given blocks
    /// of the registered KV caches. Blocks the producer can no longer serve, or loads that cannot start
    /// (see [`KvWorker::take_load_errors`]), are reported by [`KvWorker::failed_blocks`] at once;
    /// the rest stream in layer by layer. Fails only when no KV caches are registered.
    pub fn start_load_kv(&self) -> Result<(), ConnectorError> {
        if !self.cfg.role.loads() {
            return Ok(());
        }
        let loads = lock(&self.worker).meta.loads.clone();
        if loads.is_empty() {
            return Ok(());
        }
        if lock(&self.kv_handle).is_none() {
            return Err(ConnectorError::NoKvCaches("start_load_kv"));
        }
        for spec in loads {
            let BlockSpec {
                request,
                keys,
                blocks,
                local,
                producer,
                hold: _,
                tokens: _,
                engine_hashes: _,
                parent: _,
            } = spec;
            let number = request_number(&request);
            let started = Instant::now();
            if blocks.is_empty() {
                // Nothing to move: over at once (an asynchronous load must still be reported).
                lock(&self.worker).finished_receiving.push(request);
                continue;
            }
            if local {
                let copied = self.load_from_own_store(&keys, &blocks, number);
                let mut w = lock(&self.worker);
                let copied = copied.unwrap_or_else(|e| {
                    w.load_errors.push(e);
                    0
                });
                if copied < blocks.len() {
                    w.failed.extend(&blocks[copied..]);
                    self.metrics.recompute(blocks.len() - copied);
                }
                self.metrics.latency(started.elapsed());
                w.finished_receiving.push(request);
                continue;
            }
            let result = match &producer {
                // The scheduler names the producer of every load it plans but a local one.
                None => Err(ConnectorError::Config(
                    "a load names no producer: the scheduler plans every remote load with one"
                        .into(),
                )),
                Some(params) => {
                    let client = self.producers.client(params.control_for(self.cfg.tp));
                    match self.transport.endpoints() {
                        Some(to) => self.block_on(client.load(
                            &keys,
                            to,
                            &blocks,
                            self.cfg.class,
                            number,
                            self.rank_kv(),
                        )),
                        None => Err(ConnectorError::Config(
                            "the consumer's node has no address producers can reach".into(),
                        )),
                    }
                }
            };
            let mut w = lock(&self.worker);
            // A load that could not start at all is recompute, never an error that loses the request.
            let (session, served) = match result {
                Ok(r) => r,
                Err(e) => {
                    w.load_errors.push(e);
                    (None, 0)
                }
            };
            if served < blocks.len() {
                w.failed.extend(&blocks[served..]);
                self.metrics.recompute(blocks.len() - served);
            }
            match session {
                Some(session) => w.loads.push(ActiveLoad {
                    request,
                    session,
                    blocks: blocks[..served].to_vec(),
                    started,
                }),
                None => w.finished_receiving.push(request),
            }
        }
        Ok(())
    }

    /// Copies the leading stored blocks of `keys` from this connector's own tier store into `blocks` of
    /// the KV caches, every layer; returns how many were copied.
    fn load_from_own_store(
        &self,
        keys: &[crate::keys::ScopedKey],
        blocks: &[u32],
        request: u64,
    ) -> Result<usize, ConnectorError> {
        let Some(core) = &self.producer else {
            return Ok(0);
        };
        let (memory, layout) = lock(&self.worker)
            .kv
            .clone()
            .ok_or(ConnectorError::NoKvCaches("start_load_kv"))?;
        let mut store = lock(&core.store);
        let slots = store.pin(keys, request, core.now());
        let store_layout = store.layout();
        let copy = || -> Result<(), ConnectorError> {
            use transfer_engine::BlockId;
            for layer in 0..layout.layers {
                for (&slot, &block) in slots.iter().zip(blocks) {
                    let (from, to) = (BlockId::new(layer, slot), BlockId::new(layer, block));
                    for (at, into, len) in store_layout.copies_to(from, &layout, to) {
                        store.copy_out(at as usize, &memory, into as usize, len as usize)?;
                    }
                }
            }
            Ok(())
        };
        let result = copy();
        store.unpin(&slots);
        result?;
        self.metrics
            .local_tier_bytes(slots.len() as u64 * layout.block_bytes * u64::from(layout.layers));
        Ok(slots.len())
    }

    /// vLLM's `handle_preemptions`: the engine preempted the requests `meta` names, and is about to give
    /// their blocks to others. A load of theirs still running is abandoned at once (none of its bytes is
    /// placed from now on, so none lands in a block another request now owns) and reported over; its
    /// blocks are not failed blocks (the engine recomputes a preempted request anyway).
    pub fn handle_preemptions(&self, meta: &ConnectorMetadata) {
        if meta.preempted.is_empty() {
            return;
        }
        let mut w = lock(&self.worker);
        let (gone, kept): (Vec<ActiveLoad>, Vec<ActiveLoad>) = std::mem::take(&mut w.loads)
            .into_iter()
            .partition(|l| meta.preempted.contains(&l.request));
        w.loads = kept;
        for load in gone {
            let _ = self.transport.abandon(load.session);
            w.finished_receiving.push(load.request);
        }
    }

    /// vLLM's `wait_for_layer_load`: blocks until `layer` of every running load has arrived whole (or
    /// its session ended without it: those blocks become failed blocks, to recompute). Tells the
    /// transfers the consumer is at `layer`, so they keep up to the prefetch depth ahead.
    pub fn wait_for_layer_load(&self, layer: u32) -> Result<(), ConnectorError> {
        if self.cfg.async_loads {
            // Asynchronous loads are waited for by `get_finished`, never inside the forward pass.
            return Ok(());
        }
        let sessions: Vec<(PlaneSession, Vec<u32>)> = lock(&self.worker)
            .loads
            .iter()
            .map(|l| (l.session, l.blocks.clone()))
            .collect();
        let last = layer + 1 == self.cfg.layers;
        for (session, blocks) in sessions {
            let wait = self.block_on(async {
                tokio::time::timeout(
                    self.cfg.load_timeout,
                    self.transport.wait_layer(session, layer),
                )
                .await
            });
            let lost: Option<Vec<u32>> = match wait {
                Ok(Ok(LayerWait::Arrived)) => None,
                // The session ended without this layer: every block that is not whole in every layer
                // is recomputed (the session's final report names them; without it, all of them).
                Ok(Ok(LayerWait::Lost(ids))) => {
                    let report = self.block_on(
                        self.transport
                            .unfinished_blocks(session, Duration::from_secs(1)),
                    );
                    let mut b: Vec<u32> = match report {
                        Some(all) => all.iter().chain(&ids).map(|id| id.block).collect(),
                        None => blocks.clone(),
                    };
                    b.sort_unstable();
                    b.dedup();
                    Some(b)
                }
                // Timed out or the transport failed: nothing of this load can be trusted, and
                // nothing more of it may land in blocks the engine now recomputes.
                Ok(Err(_)) | Err(_) => {
                    let _ = self.transport.abandon(session);
                    Some(blocks.clone())
                }
            };
            let mut w = lock(&self.worker);
            let Some(pos) = w.loads.iter().position(|l| l.session == session) else {
                continue;
            };
            if let Some(lost) = lost {
                // A block with any layer missing is recomputed whole; the load ends here.
                let load = w.loads.remove(pos);
                self.metrics.recompute(lost.len());
                w.failed.extend(lost);
                w.finished_receiving.push(load.request);
            } else if last {
                let load = w.loads.remove(pos);
                self.metrics.latency(load.started.elapsed());
                self.metrics.bytes(
                    Direction::In,
                    self.cfg.class,
                    load.blocks.len() as u64 * self.block_bytes_all_layers(),
                );
                w.finished_receiving.push(load.request);
            }
        }
        Ok(())
    }

    /// Waits for every layer of every running load (a worker that does not stream layer by layer).
    pub fn wait_for_all_loads(&self) -> Result<(), ConnectorError> {
        for layer in 0..self.cfg.layers {
            self.wait_for_layer_load(layer)?;
        }
        Ok(())
    }

    /// vLLM's `get_finished`: requests whose saves ended and requests whose loads ended since the last
    /// call, as `(finished_sending, finished_receiving)`. With asynchronous loads, it first looks (without
    /// waiting) for loads that are over: every layer arrived, or the session ended and its missing
    /// blocks are failed blocks, or `load_timeout` passed and all of its blocks are.
    pub fn get_finished(&self) -> (Vec<String>, Vec<String>) {
        if self.cfg.async_loads {
            self.poll_loads();
        }
        let mut w = lock(&self.worker);
        (
            std::mem::take(&mut w.finished_sending),
            std::mem::take(&mut w.finished_receiving),
        )
    }

    /// Ends the asynchronous loads that are over (see [`KvWorker::get_finished`]).
    fn poll_loads(&self) {
        let sessions: Vec<(PlaneSession, Instant)> = lock(&self.worker)
            .loads
            .iter()
            .map(|l| (l.session, l.started))
            .collect();
        let last = self.cfg.layers.saturating_sub(1);
        for (session, started) in sessions {
            let over = self.block_on(async {
                tokio::time::timeout(Duration::ZERO, self.transport.wait_whole(session, last)).await
            });
            let lost: Option<Vec<u32>> = match over {
                Ok(Ok(missing)) => Some(missing.iter().map(|id| id.block).collect()),
                Ok(Err(e)) => {
                    lock(&self.worker).load_errors.push(e);
                    None
                }
                Err(_) if started.elapsed() < self.cfg.load_timeout => continue,
                Err(_) => {
                    // Nothing more of it may land in blocks the engine now recomputes.
                    let _ = self.transport.abandon(session);
                    None
                }
            };
            let mut w = lock(&self.worker);
            let Some(pos) = w.loads.iter().position(|l| l.session == session) else {
                continue;
            };
            let load = w.loads.remove(pos);
            let mut lost = lost.unwrap_or_else(|| load.blocks.clone());
            lost.sort_unstable();
            lost.dedup();
            let delivered = load.blocks.len() - lost.len().min(load.blocks.len());
            if lost.is_empty() {
                self.metrics.latency(load.started.elapsed());
            } else {
                self.metrics.recompute(lost.len());
            }
            self.metrics.bytes(
                Direction::In,
                self.cfg.class,
                delivered as u64 * self.block_bytes_all_layers(),
            );
            w.failed.extend(lost);
            w.finished_receiving.push(load.request);
        }
    }

    /// Why loads could not start since the last call (their blocks are in
    /// [`KvWorker::failed_blocks`]): a producer that cannot be reached, say.
    pub fn take_load_errors(&self) -> Vec<ConnectorError> {
        std::mem::take(&mut lock(&self.worker).load_errors)
    }

    /// vLLM's `get_block_ids_with_load_errors`: blocks whose load failed since the last call. Their KV
    /// is not valid: the engine must recompute them. Every other loaded block holds the producer's bytes,
    /// verified by checksum.
    pub fn failed_blocks(&self) -> Vec<u32> {
        std::mem::take(&mut lock(&self.worker).failed)
            .into_iter()
            .collect()
    }
}
