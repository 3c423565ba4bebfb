//! The KV connector: what a serving engine embeds to share KV between instances, in two halves shaped
//! after vLLM's v1 connector, so that a thin wrapper maps one of its calls to one call here.
//!
//! - [`KvScheduler`], the scheduler half (vLLM's engine-core process): hashes each prompt once, asks every
//!   candidate producer at once how much of it they hold (in the background: the serving engine's
//!   scheduler thread never waits on the network), and plans each step's saves and loads into
//!   [`ConnectorMetadata`], a few bytes handed to the workers.
//! - [`KvWorker`], the worker half (each worker process): its KV caches registered in place, its transport
//!   node (TCP, RDMA, shm, loopback), and for a role that saves the host tier store ([`store::TierStore`],
//!   under the policy crate's tier manager, with an optional disk tier) and the control server
//!   ([`control`]) that answers lookups and starts loads. A consumer's worker loads straight into its KV
//!   caches, layer by layer.
//! - Roles ([`KvRole`]): a producer (prefill) saves; a consumer (decode) loads; `both` also loads from its
//!   own store (a lower tier). Consumers find producers per request through [`KvTransferParams`], by a
//!   default producer and peers ([`Sources`]), or through discovery ([`discovery`]).
//! - Keys ([`keys`]): vLLM's `sha256_cbor` prefix hashes byte for byte, or the engine's own keys, always
//!   inside a namespace (model, weight version, block size, dtype): after a weight update
//!   ([`KvWorker::set_weight_version`], [`KvScheduler::set_weight_version`]) no block of the old weights is
//!   served.
//! - Failures are values: a block that cannot arrive intact is reported by [`KvWorker::failed_blocks`]
//!   for recompute; a loaded block always holds the producer's bytes (checksummed on the way).
//! - Metrics ([`metrics`]) with stable names, as Prometheus text ([`KvWorker::prometheus`]).
//!
//! | vLLM `KVConnectorBase_V1` | here |
//! | --- | --- |
//! | `get_num_new_matched_tokens` | [`KvScheduler::get_num_new_matched_tokens`] (`None` while its lookup runs) |
//! | `update_state_after_alloc` | [`KvScheduler::update_state_after_alloc`] |
//! | `build_connector_meta` (its `SchedulerOutput`) | [`KvScheduler::build_connector_meta`] ([`KvScheduler::record_step`]) |
//! | `request_finished` (and its `kv_transfer_params`) | [`KvScheduler::request_finished`] ([`KvTransferParams`]) |
//! | `set_xfer_handshake_metadata` | [`KvScheduler::set_rank_handshakes`] |
//! | `register_kv_caches` | [`KvWorker::register_kv_caches`], [`KvWorker::register_kv_layout`] |
//! | `get_handshake_metadata` | [`KvWorker::rank_handshake`] |
//! | `bind_connector_metadata` / `clear_connector_metadata` | [`KvWorker::bind_connector_metadata`] / [`KvWorker::clear_connector_metadata`] |
//! | `start_load_kv` | [`KvWorker::start_load_kv`] |
//! | `wait_for_layer_load` | [`KvWorker::wait_for_layer_load`] |
//! | `save_kv_layer` | [`KvWorker::save_kv_layer`] |
//! | `wait_for_save` | [`KvWorker::wait_for_save`] |
//! | `get_finished` | [`KvWorker::get_finished`] |
//! | `get_block_ids_with_load_errors` | [`KvWorker::failed_blocks`] |
//!
//! Prefill and decode in one process, each a scheduler and a worker, over the loopback backend (over TCP,
//! build each worker with [`KvWorker::tcp`]; the two halves of one instance may live in two processes,
//! the metadata going from one to the other as [`ConnectorMetadata::to_bytes`]):
//!
//! ```
//! use connector::{ConnectorConfig, KvRequest, KvRole, KvScheduler, KvWorker, RequestExtras, Sources, namespace};
//! use transfer_engine::MemoryRegion;
//!
//! let ns = namespace("llama-3-8b", 1, 16);
//! let mut cfg = ConnectorConfig::new(KvRole::Producer, ns.clone());
//! (cfg.layers, cfg.block_bytes, cfg.store_blocks) = (4, 4096, 64);
//! let mut consumer = cfg.clone();
//! (consumer.role, consumer.store_blocks) = (KvRole::Consumer, 0);
//! let (prefill, decode) = KvWorker::loopback_pair(cfg.clone(), consumer.clone())?;
//! let control = prefill.control_addr().unwrap(); // where the prefill's workers serve
//! let prefill_plan = KvScheduler::new(cfg, Sources::own(control))?;
//! let decode_plan = KvScheduler::new(consumer, Sources::producer(control))?;
//! let layer_bytes = 4096 * 32; // one layer of a 32-block KV pool
//! let prefill_kv = MemoryRegion::from_vec((0..4 * layer_bytes).map(|i| (i % 251) as u8).collect());
//! let decode_kv = MemoryRegion::zeroed(4 * layer_bytes);
//! prefill.register_kv_caches(prefill_kv.clone(), 32)?;
//! decode.register_kv_caches(decode_kv.clone(), 32)?;
//!
//! let tokens: Vec<u32> = (0..50).collect(); // 3 full blocks of 16 tokens
//! let extras = RequestExtras::default();
//! let req = KvRequest { id: "r1", tokens: &tokens, extras: &extras, external_keys: None, transfer_params: None };
//!
//! // Prefill: the scheduler plans the save of blocks 0, 1, 2; the worker saves layer by layer.
//! prefill_plan.wait_matched_tokens(&req, 0)?;
//! prefill_plan.update_state_after_alloc("r1", &[0, 1, 2, 3], 0)?;
//! prefill.bind_connector_metadata(prefill_plan.build_connector_meta());
//! for layer in 0..4 {
//!     prefill.save_kv_layer(layer)?; // after the layer's attention ran
//! }
//! prefill.wait_for_save()?;
//!
//! // Decode: 48 tokens can be loaded (the lookup ran in the background; vLLM asks again on a later
//! // step, this example waits); they land in its blocks 7, 8, 9, layer by layer.
//! let (tokens_to_load, _async) = decode_plan.wait_matched_tokens(&req, 0)?;
//! assert_eq!(tokens_to_load, 48);
//! decode_plan.update_state_after_alloc("r1", &[7, 8, 9, 10], tokens_to_load)?;
//! decode.bind_connector_metadata(decode_plan.build_connector_meta());
//! decode.start_load_kv()?;
//! for layer in 0..4 {
//!     decode.wait_for_layer_load(layer)?; // then run the layer
//! }
//! assert!(decode.failed_blocks().is_empty());
//! let at = |block: usize| 3 * layer_bytes + block * 4096; // layer 3
//! assert_eq!(
//!     decode_kv.read(at(8)..at(8) + 4096)?[..],
//!     prefill_kv.read(at(1)..at(1) + 4096)?[..],
//! );
//! assert!(decode_plan.prometheus().contains("kv_cache_hit_rate 1"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod config;
pub mod control;
pub mod copier;
mod data_plane;
pub mod discovery;
pub mod disk;
pub mod error;
pub mod keys;
pub mod metrics;
mod producer;
mod producers;
mod request;
mod runtime;
mod scheduler;
mod state;
pub mod store;
pub mod tp;
mod worker;

pub use config::{ConnectorConfig, KvRole, namespace};
pub use data_plane::{SameHostTransport, this_host};
pub use error::ConnectorError;
pub use keys::{
    BlockHash, ExtraKeyLayout, Lora, MmItem, RequestExtras, ScopedKey, VllmHasher, root_hash,
};
pub use metrics::{Metrics, MetricsSnapshot};
pub use request::{BlockSpec, ConnectorMetadata, KvRequest, KvTransferParams};
pub use scheduler::{HitSource, KvScheduler, Sources};
pub use store::{SaveReport, SourceBlocks, TierStore};
pub use tp::{RankHandshake, TpRank};
pub use worker::KvWorker;
