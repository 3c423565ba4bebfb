//! Tensor-parallel instances: every rank registers its own heads' shard (here in vLLM 0.33's views: a
//! layer-major producer, a block-major consumer); rank *i* loads from rank *i* when both instances run the
//! same size, over loopback and TCP; other sizes and crossed ranks are refused naming both sides; MLA KV,
//! the same on every rank, moves once per consumer rank whatever the sizes.

mod common;

use std::time::{Duration, Instant};

use backends::tcp::TcpConfig;
use common::{Instance, request};
use connector::{
    ConnectorConfig, ConnectorError, KvRole, KvTransferParams, RequestExtras, TpRank, namespace,
};
use transfer_engine::{BlockId, Dtype, KvHeads, KvKind, KvLayout, MemoryRegion, TensorView};

const LAYERS: u32 = 3;
const POOL: u32 = 12;
const TOKENS: u32 = 16;
/// Elements per head per token (K and V together).
const HEAD: u32 = 64;
/// KV heads per rank.
const HEADS: u32 = 2;
const BLOCK: u64 = (HEADS * HEAD * TOKENS * 2) as u64; // bf16
const ELEMS: u64 = BLOCK / 2;

fn heads(mla: bool) -> KvHeads {
    if mla {
        KvHeads {
            kv_heads: 1,
            head_size: HEADS * HEAD,
            kind: KvKind::Mla,
        }
    } else {
        KvHeads {
            kv_heads: HEADS,
            head_size: HEAD,
            kind: KvKind::KvTogether,
        }
    }
}

fn config(role: KvRole, tp: TpRank, mla: bool) -> ConnectorConfig {
    let mut c = ConnectorConfig::new(role, namespace("tp-model", 1, TOKENS));
    (c.layers, c.block_bytes, c.prefetch_depth) = (LAYERS, BLOCK, 1);
    c.store_blocks = if role.saves() { 32 } else { 0 };
    c.load_timeout = Duration::from_secs(5);
    (c.heads, c.tp) = (heads(mla), tp);
    c
}

fn rank(rank: u32, size: u32) -> TpRank {
    TpRank::new(rank, size).unwrap()
}

/// The KV caches of one rank as vLLM 0.33 lays them out: one view per layer over one buffer, layer-major
/// (LBNHC) or block-major (BLNHC).
fn vllm_layout(block_major: bool, mla: bool) -> KvLayout {
    let views: Vec<TensorView> = (0..u64::from(LAYERS))
        .map(|l| {
            let (block_stride, offset) = if block_major {
                (u64::from(LAYERS) * ELEMS, l * ELEMS)
            } else {
                (ELEMS, l * u64::from(POOL) * ELEMS)
            };
            if mla {
                let latent = u64::from(HEADS * HEAD);
                TensorView::new(
                    &[u64::from(POOL), u64::from(TOKENS), latent],
                    &[block_stride, latent, 1],
                    offset,
                    2,
                )
            } else {
                let (h, t, d) = (u64::from(HEADS), u64::from(TOKENS), u64::from(HEAD));
                TensorView::new(
                    &[u64::from(POOL), h, t, d],
                    &[block_stride, d, h * d, 1],
                    offset,
                    2,
                )
            }
        })
        .collect();
    if mla {
        KvLayout::from_mla(&views, Dtype::Bf16).unwrap()
    } else {
        KvLayout::from_vllm(&views, Dtype::Bf16).unwrap()
    }
}

/// One worker: its connector, its KV caches and their layout.
struct Rank {
    c: Instance,
    kv: MemoryRegion,
    layout: KvLayout,
}

impl Rank {
    /// Registers caches filled with bytes that say whose they are (`seed`).
    fn register(c: Instance, block_major: bool, mla: bool, seed: u8) -> Rank {
        let layout = vllm_layout(block_major, mla);
        let bytes = layout.total_bytes() as usize;
        let kv = MemoryRegion::from_vec(
            (0..bytes)
                .map(|i| (i % 241) as u8 ^ seed.wrapping_mul(37))
                .collect(),
        );
        c.register_kv_layout(kv.clone(), layout).unwrap();
        Rank { c, kv, layout }
    }

    /// Block `block` of layer `layer`, as logical bytes.
    fn block(&self, layer: u32, block: u32) -> Vec<u8> {
        let id = BlockId::new(layer, block);
        self.layout
            .chunks(id)
            .into_iter()
            .flat_map(|(at, len)| {
                self.kv
                    .read(at as usize..(at + len) as usize)
                    .unwrap()
                    .to_vec()
            })
            .collect()
    }
}

const TOKENS_IN: usize = 3 * TOKENS as usize + 5; // 3 full blocks
const SRC_BLOCKS: [u32; 4] = [2, 5, 7, 9];
const DST_BLOCKS: [u32; 4] = [11, 0, 4, 6];

/// The producer instance's step: its scheduler rank (0) plans the save of `id`, every rank saves its
/// own shard layer by layer; returns the transfer parameters its scheduler hands the proxy.
fn produce(ranks: &[Rank], id: &str, tokens: &[u32]) -> Option<KvTransferParams> {
    let sched = &ranks[0].c;
    let extras = RequestExtras::default();
    sched
        .get_num_new_matched_tokens(&request(id, tokens, &extras), 0)
        .unwrap();
    sched.update_state_after_alloc(id, &SRC_BLOCKS, 0).unwrap();
    let meta = sched.build_connector_meta();
    for r in ranks {
        r.c.bind_connector_metadata(meta.clone());
    }
    for layer in 0..LAYERS {
        for r in ranks {
            r.c.save_kv_layer(layer).unwrap();
        }
    }
    for r in ranks {
        r.c.wait_for_save().unwrap();
        assert_eq!(r.c.get_finished().0, vec![id.to_string()]);
        r.c.clear_connector_metadata();
    }
    let handshakes: Vec<_> = ranks.iter().map(|r| r.c.rank_handshake()).collect();
    if sched.control_addr().is_some() {
        sched.set_rank_handshakes(&handshakes).unwrap();
    } else {
        assert!(sched.set_rank_handshakes(&handshakes).is_err());
    }
    sched.request_finished(id).1
}

/// The consumer instance's step: its scheduler rank plans the load of `id` (through `params`), every
/// rank loads its own shard; returns the tokens planned.
fn consume(ranks: &[Rank], id: &str, tokens: &[u32], params: Option<&KvTransferParams>) -> usize {
    let sched = &ranks[0].c;
    let extras = RequestExtras::default();
    let mut req = request(id, tokens, &extras);
    req.transfer_params = params;
    let (n, _) = sched.get_num_new_matched_tokens(&req, 0).unwrap();
    sched.update_state_after_alloc(id, &DST_BLOCKS, n).unwrap();
    let meta = sched.build_connector_meta();
    for r in ranks {
        r.c.bind_connector_metadata(meta.clone());
        r.c.start_load_kv().unwrap();
    }
    for r in ranks {
        r.c.wait_for_all_loads().unwrap();
        assert!(r.c.take_load_errors().is_empty());
        assert!(r.c.failed_blocks().is_empty());
    }
    n
}

/// Every loaded block of consumer rank `dst` holds what producer rank `src` saved, in every layer.
fn assert_loaded_from(dst: &Rank, src: &Rank, blocks: usize) {
    for layer in 0..LAYERS {
        for (&from, &to) in SRC_BLOCKS.iter().zip(&DST_BLOCKS).take(blocks) {
            assert!(
                dst.block(layer, to) == src.block(layer, from),
                "layer {layer}: block {to} does not hold the producer's block {from}"
            );
        }
    }
}

fn tcp(cfg: ConnectorConfig, engine: u32, producer: Option<std::net::SocketAddr>) -> Instance {
    let listen = cfg.role.loads();
    let mut tcp = TcpConfig::with_engine_id(engine);
    tcp.listen = listen.then(|| "127.0.0.1:0".parse().unwrap());
    Instance::tcp(cfg, tcp, None, producer).unwrap()
}

/// A producer instance of `size` ranks over TCP (engine ids from `first`).
fn tcp_producers(size: u32, mla: bool, first: u32) -> Vec<Rank> {
    (0..size)
        .map(|i| {
            let c = tcp(
                config(KvRole::Producer, rank(i, size), mla),
                first + i,
                None,
            );
            Rank::register(c, false, mla, i as u8 + 1)
        })
        .collect()
}

/// A consumer instance of `size` ranks over TCP (no default producer: requests name theirs).
fn tcp_consumers(size: u32, mla: bool, first: u32) -> Vec<Rank> {
    (0..size)
        .map(|i| {
            let c = tcp(
                config(KvRole::Consumer, rank(i, size), mla),
                first + i,
                None,
            );
            Rank::register(c, true, mla, 0x80 | i as u8)
        })
        .collect()
}

#[test]
fn tp2_to_tp2_over_loopback_moves_each_rank_its_own_shard() {
    let (mut producers, mut consumers) = (Vec::new(), Vec::new());
    for i in 0..2 {
        let (p, c) = Instance::loopback_pair(
            config(KvRole::Producer, rank(i, 2), false),
            config(KvRole::Consumer, rank(i, 2), false),
        )
        .unwrap();
        producers.push(Rank::register(p, false, false, i as u8 + 1));
        consumers.push(Rank::register(c, true, false, 0x80 | i as u8));
    }
    let tokens: Vec<u32> = (0..TOKENS_IN as u32).collect();
    // Loopback producers serve control channels too: their parameters name both ranks, and each
    // consumer rank loads from the producer rank of its number.
    let params = produce(&producers, "r", &tokens).expect("a producer names itself");
    assert_eq!(params.ranks.len(), 2);
    assert_eq!(
        consume(&consumers, "r", &tokens, Some(&params)),
        3 * TOKENS as usize
    );
    for i in 0..2 {
        assert_loaded_from(&consumers[i], &producers[i], 3);
    }
    // The shards differ, so a crossed load would have shown.
    assert!(producers[0].block(0, SRC_BLOCKS[0]) != producers[1].block(0, SRC_BLOCKS[0]));
}

#[test]
fn tp2_to_tp2_over_tcp_moves_each_rank_its_own_shard() {
    let producers = tcp_producers(2, false, 1);
    let consumers = tcp_consumers(2, false, 11);
    let tokens: Vec<u32> = (100..100 + TOKENS_IN as u32).collect();
    let params = produce(&producers, "r", &tokens).unwrap();
    let controls: Vec<_> = producers
        .iter()
        .map(|p| p.c.control_addr().unwrap())
        .collect();
    assert_eq!(
        params.ranks, controls,
        "the parameters name every rank, in order"
    );
    // The proxy carries them as JSON, as vLLM's kv_transfer_params.
    let carried: KvTransferParams =
        serde_json::from_str(&serde_json::to_string(&params).unwrap()).unwrap();
    assert_eq!(
        consume(&consumers, "r", &tokens, Some(&carried)),
        3 * TOKENS as usize
    );
    for i in 0..2 {
        assert_loaded_from(&consumers[i], &producers[i], 3);
    }
    assert!(producers[0].block(1, SRC_BLOCKS[1]) != producers[1].block(1, SRC_BLOCKS[1]));
}

#[test]
fn tp2_to_tp1_is_refused_naming_both_sizes() {
    let refused = Instance::loopback_pair(
        config(KvRole::Producer, rank(0, 2), false),
        config(KvRole::Consumer, TpRank::SINGLE, false),
    )
    .unwrap_err();
    assert!(
        matches!(&refused, ConnectorError::TensorParallel(m) if m.contains("producer runs 2 ranks, the consumer 1")),
        "{refused}"
    );

    let producers = tcp_producers(2, false, 21);
    let consumers = tcp_consumers(1, false, 31);
    let tokens: Vec<u32> = (200..200 + TOKENS_IN as u32).collect();
    let params = produce(&producers, "r", &tokens).unwrap();
    let extras = RequestExtras::default();
    let mut req = request("r", &tokens, &extras);
    req.transfer_params = Some(&params);
    let e = consumers[0]
        .c
        .get_num_new_matched_tokens(&req, 0)
        .unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.contains("producer runs 2 ranks, the consumer 1"),
        "{shown}"
    );
}

#[test]
fn a_consumer_rank_that_reaches_another_producer_rank_is_refused_and_recomputes() {
    let producers = tcp_producers(2, false, 41);
    // Rank 1 of the consumer wrongly configured with the producer's rank 0 as its default.
    let c = tcp(
        config(KvRole::Consumer, rank(1, 2), false),
        51,
        producers[0].c.control_addr(),
    );
    let consumer = Rank::register(c, true, false, 0x81);
    let tokens: Vec<u32> = (300..300 + TOKENS_IN as u32).collect();
    produce(&producers, "r", &tokens);
    let extras = RequestExtras::default();
    let e = consumer
        .c
        .get_num_new_matched_tokens(&request("r", &tokens, &extras), 0)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("consumer's rank 1 of 2 reached the producer's rank 0 of 2"),
        "{e}"
    );
    // A plan that reaches the worker anyway (metadata made elsewhere) fails its load, loudly, and
    // hands every block back for recompute.
    let good = tcp(
        config(KvRole::Consumer, rank(0, 2), false),
        52,
        producers[0].c.control_addr(),
    );
    let (n, _) = good
        .get_num_new_matched_tokens(&request("r", &tokens, &extras), 0)
        .unwrap();
    good.update_state_after_alloc("r", &DST_BLOCKS, n).unwrap();
    consumer
        .c
        .bind_connector_metadata(good.build_connector_meta());
    consumer.c.start_load_kv().unwrap();
    let errors = consumer.c.take_load_errors();
    assert!(
        errors.len() == 1 && errors[0].to_string().contains("rank 1 of 2 reached"),
        "{errors:?}"
    );
    assert_eq!(consumer.c.failed_blocks(), {
        let mut b = DST_BLOCKS[..3].to_vec();
        b.sort_unstable();
        b
    });
}

/// Waits until `p` has served `bytes` (its count is taken once a session's acknowledgements are in).
fn served(p: &Instance, bytes: u64) -> u64 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let out = p.metrics().snapshot().bytes_out;
        if out >= bytes || Instant::now() > until {
            return out;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn mla_kv_moves_once_per_consumer_rank_whatever_the_sizes() {
    let request_bytes = 3 * BLOCK * u64::from(LAYERS);
    // Two producer ranks hold the same latent KV; one consumer rank loads it once, from rank 0.
    let producers = tcp_producers(2, true, 61);
    let consumers = tcp_consumers(1, true, 71);
    let tokens: Vec<u32> = (400..400 + TOKENS_IN as u32).collect();
    let params = produce(&producers, "r", &tokens);
    assert_eq!(
        consume(&consumers, "r", &tokens, params.as_ref()),
        3 * TOKENS as usize
    );
    assert_loaded_from(&consumers[0], &producers[0], 3);
    assert_eq!(served(&producers[0].c, request_bytes), request_bytes);
    assert_eq!(producers[1].c.metrics().snapshot().bytes_out, 0);

    // One producer rank serves each of two consumer ranks: once per destination rank.
    let producer = tcp_producers(1, true, 81);
    let consumers = tcp_consumers(2, true, 91);
    let tokens: Vec<u32> = (500..500 + TOKENS_IN as u32).collect();
    let params = produce(&producer, "s", &tokens);
    assert_eq!(
        consume(&consumers, "s", &tokens, params.as_ref()),
        3 * TOKENS as usize
    );
    for c in &consumers {
        assert_loaded_from(c, &producer[0], 3);
    }
    assert_eq!(served(&producer[0].c, 2 * request_bytes), 2 * request_bytes);
}

#[test]
fn caches_of_other_heads_than_configured_are_refused() {
    let c = tcp(config(KvRole::Consumer, TpRank::SINGLE, false), 101, None);
    // MLA caches under a K/V-together configuration.
    let e = c
        .register_kv_layout(MemoryRegion::zeroed(1 << 20), vllm_layout(false, true))
        .unwrap_err();
    assert!(
        e.to_string().contains("Mla") && e.to_string().contains("KvTogether"),
        "{e}"
    );
    // Too few layers.
    let mut cfg = config(KvRole::Consumer, TpRank::SINGLE, false);
    cfg.layers = LAYERS + 1;
    let c = tcp(cfg, 102, None);
    let e = c
        .register_kv_layout(MemoryRegion::zeroed(1 << 20), vllm_layout(false, false))
        .unwrap_err();
    assert!(e.to_string().contains("layer count"), "{e}");
    assert!(TpRank::new(2, 2).is_err());
}

#[test]
fn a_store_keeps_its_workers_arrangement_so_kv_apart_never_feeds_kv_together() {
    let mut apart = config(KvRole::Producer, TpRank::SINGLE, false);
    apart.heads.kind = KvKind::KvApart;
    let (p, c) =
        Instance::loopback_pair(apart, config(KvRole::Consumer, TpRank::SINGLE, false)).unwrap();
    let bytes = (u64::from(LAYERS * POOL) * BLOCK) as usize;
    p.register_kv_caches(MemoryRegion::from_vec(vec![7; bytes]), POOL)
        .unwrap();
    let dst = MemoryRegion::zeroed(bytes);
    c.register_kv_caches(dst.clone(), POOL).unwrap();
    let producer = [Rank {
        c: p,
        kv: MemoryRegion::zeroed(1),
        layout: vllm_layout(false, false),
    }];
    let tokens: Vec<u32> = (600..600 + TOKENS_IN as u32).collect();
    produce(&producer, "a", &tokens);
    let extras = RequestExtras::default();
    let (n, _) = c
        .get_num_new_matched_tokens(&request("a", &tokens, &extras), 0)
        .unwrap();
    c.update_state_after_alloc("a", &DST_BLOCKS, n).unwrap();
    c.bind_connector_metadata(c.build_connector_meta());
    c.start_load_kv().unwrap();
    let errors = c.take_load_errors();
    assert!(
        errors.len() == 1 && errors[0].to_string().contains("KV arrangement"),
        "{errors:?}"
    );
    assert_eq!(c.failed_blocks().len(), 3);
    assert!(
        dst.read(0..bytes).unwrap().iter().all(|&b| b == 0),
        "nothing was written"
    );
}
