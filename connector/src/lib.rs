//! The KV connector: what a serving engine embeds to share KV between instances, shaped after vLLM's v1
//! KV connector so that a thin wrapper maps one of its calls to one call here.
//!
//! - Roles ([`KvRole`]): a producer (prefill) saves KV layer by layer into its local tier store
//!   ([`store::TierStore`], host memory under the policy crate's tier manager); a consumer (decode) asks it
//!   how much of a prompt it holds and loads those blocks straight into its own KV caches, layer by layer,
//!   over TCP ([`KvConnector::tcp`]) or in process ([`KvConnector::loopback_pair`]).
//!   A `both` connector also loads from its own store (a lower tier). Consumers find producers by address,
//!   per request through [`KvTransferParams`], or through discovery ([`discovery`]).
//! - Keys ([`keys`]): vLLM's `sha256_cbor` prefix hashes byte for byte, or the engine's own keys, always
//!   inside a namespace (model, weight version, block size, dtype): after a weight update
//!   ([`KvConnector::set_weight_version`]) no block of the old weights is served.
//! - Failures are values: a block that cannot arrive intact is reported by [`KvConnector::failed_blocks`]
//!   for recompute; a loaded block always holds the producer's bytes (checksummed on the way).
//! - Metrics ([`metrics`]) with stable names, as Prometheus text ([`KvConnector::prometheus`]).
//!
//! | vLLM `KVConnectorBase_V1` | here |
//! | --- | --- |
//! | `get_num_new_matched_tokens` | [`KvConnector::get_num_new_matched_tokens`] |
//! | `update_state_after_alloc` | [`KvConnector::update_state_after_alloc`] |
//! | `build_connector_meta` (its `SchedulerOutput`) | [`KvConnector::build_connector_meta`] ([`KvConnector::record_step`]) |
//! | `request_finished` (and its `kv_transfer_params`) | [`KvConnector::request_finished`] ([`KvTransferParams`]) |
//! | `register_kv_caches` | [`KvConnector::register_kv_caches`] |
//! | `bind_connector_metadata` / `clear_connector_metadata` | [`KvConnector::bind_connector_metadata`] / [`KvConnector::clear_connector_metadata`] |
//! | `start_load_kv` | [`KvConnector::start_load_kv`] |
//! | `wait_for_layer_load` | [`KvConnector::wait_for_layer_load`] |
//! | `save_kv_layer` | [`KvConnector::save_kv_layer`] |
//! | `wait_for_save` | [`KvConnector::wait_for_save`] |
//! | `get_finished` | [`KvConnector::get_finished`] |
//! | `get_block_ids_with_load_errors` | [`KvConnector::failed_blocks`] |
//!
//! A producer and a consumer half, in one process over the loopback backend (over TCP, build each with
//! [`KvConnector::tcp`] and give the consumer the producer's [`KvConnector::control_addr`]):
//!
//! ```
//! use connector::{ConnectorConfig, KvConnector, KvRequest, KvRole, RequestExtras, namespace};
//! use transfer_engine::MemoryRegion;
//!
//! let ns = namespace("llama-3-8b", 1, 16);
//! let mut cfg = ConnectorConfig::new(KvRole::Producer, ns.clone());
//! (cfg.layers, cfg.block_bytes, cfg.store_blocks) = (4, 4096, 64);
//! let mut consumer = cfg.clone();
//! (consumer.role, consumer.store_blocks) = (KvRole::Consumer, 0);
//! let (prefill, decode) = KvConnector::loopback_pair(cfg, consumer)?;
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
//! // Producer: scheduler plans the save of blocks 0, 1, 2; the worker saves layer by layer.
//! prefill.get_num_new_matched_tokens(&req, 0)?;
//! prefill.update_state_after_alloc("r1", &[0, 1, 2, 3], 0)?;
//! prefill.bind_connector_metadata(prefill.build_connector_meta());
//! for layer in 0..4 {
//!     prefill.save_kv_layer(layer)?; // after the layer's attention ran
//! }
//! prefill.wait_for_save()?;
//!
//! // Consumer: 48 tokens can be loaded; they land in its blocks 7, 8, 9, layer by layer.
//! let (tokens_to_load, _async) = decode.get_num_new_matched_tokens(&req, 0)?;
//! assert_eq!(tokens_to_load, 48);
//! decode.update_state_after_alloc("r1", &[7, 8, 9, 10], tokens_to_load)?;
//! decode.bind_connector_metadata(decode.build_connector_meta());
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
//! assert!(decode.prometheus().contains("kv_cache_hit_rate 1"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod config;
mod connector;
pub mod control;
pub mod copier;
mod data_plane;
pub mod discovery;
pub mod disk;
pub mod error;
pub mod keys;
pub mod metrics;
mod open;
mod producer;
mod request;
mod runtime;
mod scheduler;
mod state;
pub mod store;
pub mod tp;
mod worker;

pub use config::{ConnectorConfig, KvRole, namespace};
pub use connector::KvConnector;
pub use data_plane::{SameHostTransport, this_host};
pub use error::ConnectorError;
pub use keys::{
    BlockHash, ExtraKeyLayout, Lora, MmItem, RequestExtras, ScopedKey, VllmHasher, root_hash,
};
pub use metrics::{Metrics, MetricsSnapshot};
pub use request::{BlockSpec, ConnectorMetadata, KvRequest, KvTransferParams};
pub use store::{SaveReport, SourceBlocks, TierStore};
pub use tp::{RankHandshake, TpRank};
