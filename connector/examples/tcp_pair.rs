//! A producer and a consumer over TCP in one process, each a scheduler half and a worker half, as a prefill
//! and a decode instance would run them in four processes: the producer saves a request's KV layer by layer while its layers are computed, the
//! consumer finds how many of the prompt's tokens it can load, loads them into its own blocks layer by
//! layer, and prints its metrics.
//!
//! `cargo run -p connector --example tcp_pair`

use backends::tcp::TcpConfig;
use connector::{
    ConnectorConfig, KvRequest, KvRole, KvScheduler, KvWorker, RequestExtras, Sources, namespace,
};
use transfer_engine::MemoryRegion;

const LAYERS: usize = 4;
const BLOCK_BYTES: usize = 4096;
const BLOCKS: usize = 32;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ns = namespace("llama-3-8b", 1, 16);
    let mut cfg = ConnectorConfig::new(KvRole::Producer, ns);
    (cfg.layers, cfg.block_bytes, cfg.store_blocks) = (LAYERS as u32, BLOCK_BYTES as u64, 64);
    // The producer serves lookups and loads on a control port; the consumer is told where.
    let listen = "127.0.0.1:0".parse()?;
    let prefill = KvWorker::tcp(cfg.clone(), TcpConfig::with_engine_id(1), Some(listen))?;
    let control = prefill
        .control_addr()
        .ok_or("a producer serves a control address")?;
    let mut consumer = cfg.clone();
    consumer.role = KvRole::Consumer;
    consumer.store_blocks = 0;
    let decode = KvWorker::tcp(consumer.clone(), TcpConfig::with_engine_id(2), None)?;
    let prefill_plan = KvScheduler::new(cfg, Sources::own(control))?;
    let decode_plan = KvScheduler::new(consumer, Sources::producer(control))?;

    let layer_bytes = BLOCK_BYTES * BLOCKS;
    let prefill_kv =
        MemoryRegion::from_vec((0..LAYERS * layer_bytes).map(|i| (i % 251) as u8).collect());
    let decode_kv = MemoryRegion::zeroed(LAYERS * layer_bytes);
    prefill.register_kv_caches(prefill_kv.clone(), BLOCKS as u32)?;
    decode.register_kv_caches(decode_kv.clone(), BLOCKS as u32)?;

    let tokens: Vec<u32> = (0..50).collect(); // 3 full blocks of 16 tokens, and 2 tokens more
    let extras = RequestExtras::default();
    let req = KvRequest {
        id: "r1",
        tokens: &tokens,
        extras: &extras,
        external_keys: None,
        transfer_params: None,
    };

    // Producer: the scheduler plans the save of blocks 0, 1, 2; the worker saves each layer once computed.
    prefill_plan.wait_matched_tokens(&req, 0)?;
    prefill_plan.update_state_after_alloc("r1", &[0, 1, 2, 3], 0)?;
    prefill.bind_connector_metadata(prefill_plan.build_connector_meta());
    for layer in 0..LAYERS as u32 {
        prefill.save_kv_layer(layer)?;
    }
    prefill.wait_for_save()?;

    // Consumer: 48 tokens can be loaded, into its blocks 7, 8, 9; each layer is waited for before it runs.
    // (The lookup runs in the background; a serving engine asks again on its next step, this waits.)
    let (tokens_to_load, _) = decode_plan.wait_matched_tokens(&req, 0)?;
    decode_plan.update_state_after_alloc("r1", &[7, 8, 9, 10], tokens_to_load)?;
    decode.bind_connector_metadata(decode_plan.build_connector_meta());
    decode.start_load_kv()?;
    for layer in 0..LAYERS as u32 {
        decode.wait_for_layer_load(layer)?;
    }
    if !decode.failed_blocks().is_empty() {
        return Err(format!("blocks to recompute: {:?}", decode.failed_blocks()).into());
    }
    let at = |block: usize| (LAYERS - 1) * layer_bytes + block * BLOCK_BYTES;
    let same = decode_kv.read(at(8)..at(8) + BLOCK_BYTES)?[..]
        == prefill_kv.read(at(1)..at(1) + BLOCK_BYTES)?[..];
    if !same {
        return Err("block 8 does not hold the producer's block 1".into());
    }
    println!("loaded {tokens_to_load} tokens over TCP into blocks 7, 8, 9; metrics:");
    println!("{}{}", decode_plan.prometheus(), decode.prometheus());
    Ok(())
}
