//! The worker half's saves: copy each planned layer into the tier store as it is computed, and end the
//! step's saves.

use super::KvWorker;
use crate::error::ConnectorError;
use crate::producer::lock;
use crate::request::request_number;
use crate::store::SourceBlocks;

impl KvWorker {
    /// vLLM's `save_kv_layer`: copies `layer` of every planned save from the KV caches into the local
    /// tier store (blocks already stored whole are skipped: a shared prefix is saved once), then releases
    /// the layer to loads already streaming those blocks to consumers.
    pub fn save_kv_layer(&self, layer: u32) -> Result<(), ConnectorError> {
        let Some(core) = &self.producer else {
            return Err(ConnectorError::WrongRole {
                call: "save_kv_layer",
                // A saving role without a store is the scheduler half alone.
                role: if self.cfg.role.saves() {
                    "scheduler-only"
                } else {
                    self.cfg.role.name()
                },
            });
        };
        let w = lock(&self.worker);
        let (memory, layout) =
            w.kv.clone()
                .ok_or(ConnectorError::NoKvCaches("save_kv_layer"))?;
        let saves = w.meta.saves.clone();
        drop(w);
        let now = core.now();
        let mut store = lock(&core.store);
        for spec in &saves {
            let src = SourceBlocks {
                memory: &memory,
                layout: &layout,
                blocks: &spec.blocks,
            };
            let r = store.save_layer(&spec.keys, src, layer, request_number(&spec.request), now)?;
            self.metrics.saved(r.completed);
            self.metrics.save_dropped(r.dropped);
        }
        drop(store);
        core.advance_streams();
        Ok(())
    }

    /// vLLM's `wait_for_save`: every planned save is in the store once its last layer was saved (the
    /// copies are made during `save_kv_layer`), so this marks the step's requests as sent. Blocks of the
    /// step still missing layers (a save that ended early) are abandoned: never served, and loads
    /// streaming them are cancelled, so their consumers recompute instead of waiting.
    pub fn wait_for_save(&self) -> Result<(), ConnectorError> {
        let mut w = lock(&self.worker);
        let done: Vec<String> = w.meta.saves.iter().map(|s| s.request.clone()).collect();
        let saves = w.meta.saves.clone();
        w.finished_sending.extend(done);
        drop(w);
        if let Some(core) = &self.producer {
            let mut abandoned = 0;
            {
                let mut store = lock(&core.store);
                let until = core.now() + core.hold_timeout;
                for s in &saves {
                    abandoned += store.abandon_partial(&s.keys);
                    if s.hold && !core.hold_timeout.is_zero() {
                        store.hold(&s.keys, until);
                    }
                }
            }
            self.metrics.abandoned(abandoned);
            // Also cancels loads whose blocks left the store since the last save (evicted, say).
            core.advance_streams();
        }
        Ok(())
    }
}
