//! The RDMA backend over libfabric's `tcp` (through `ofi_rxm`) and `shm` providers, in one process: whole
//! transfers byte-identical in each mode, and the provider's refusal of a wrong key and of an out-of-region
//! write.
#![cfg(feature = "rdma")]

mod common;

use std::time::{Duration, Instant};

use backends::rdma::{
    HostMemoryAccess, InPlace, Provider, RdmaConfig, RdmaNode, WriteAnswer, probe_refusals,
};
use common::on_listed_provider;
use transfer_engine::{Dtype, KvLayout, MemoryRegion, TransferMode, TransferRequest};

/// The providers exercised here, with the domain each runs on (`lo` keeps tcp on the loopback interface).
const PROVIDERS: [(&str, Option<&str>); 2] = [("tcp", Some("lo")), ("shm", None)];

fn config(id: u32, provider: &str, domain: Option<&str>) -> RdmaConfig {
    let mut cfg = RdmaConfig::new(id, Provider::Named(provider.into()));
    cfg.domain = domain.map(str::to_owned);
    cfg
}

/// Host regions registered as they are (zero-copy) rather than through mirrors.
fn in_place() -> HostMemoryAccess {
    // SAFETY: these tests read a destination only once its session is over at both ends, never write a
    // source while it is sent, and hand region keys only to nodes of the same test.
    #[allow(unsafe_code)]
    let granted = unsafe { InPlace::granted() };
    HostMemoryAccess::InPlace(granted)
}

/// Starts a node: `None` (printed as "not run") only where libfabric lists no such provider; a listed
/// provider that cannot start a node fails the test.
fn start(
    id: u32,
    provider: &str,
    domain: Option<&str>,
    host: HostMemoryAccess,
) -> Option<RdmaNode> {
    on_listed_provider(provider, domain, || {
        let mut cfg = config(id, provider, domain);
        cfg.host_memory = host;
        RdmaNode::start(cfg)
    })
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 13) as u8;
    }
    v
}

/// Moves every block of `layout` from one node to another in `mode`, host regions reached as `host`
/// says, and checks the bytes.
fn whole_transfer(
    provider: &str,
    domain: Option<&str>,
    layout: KvLayout,
    mode: TransferMode,
    host: HostMemoryAccess,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (Some(producer), Some(consumer)) = (
        start(1, provider, domain, host),
        start(2, provider, domain, host),
    ) else {
        return;
    };
    let bytes = layout.total_bytes() as usize;
    let src = producer
        .register_kv_region(layout, MemoryRegion::from_vec(pattern(bytes, 7)))
        .unwrap();
    let pool = MemoryRegion::zeroed(bytes);
    let dst = consumer.register_kv_region(layout, pool.clone()).unwrap();
    consumer.publish_segment("kv", dst).unwrap();
    let peer = rt
        .block_on(producer.connect(consumer.address()))
        .unwrap_or_else(|e| {
            panic!(
                "{provider}: {e}: {:?} {:?} {:?} {:?}",
                producer.log(),
                consumer.log(),
                producer.stats(),
                consumer.stats()
            )
        });
    let dst = *peer.segment("kv").unwrap();
    let req = TransferRequest::whole(peer.peer, &src, &dst)
        .unwrap()
        .with_mode(mode)
        .with_deadline(Duration::from_secs(60));
    let started = Instant::now();
    let out = rt
        .block_on(producer.transfer(req, Duration::from_secs(90)))
        .unwrap();
    let took = started.elapsed();
    assert!(
        out.recompute.is_empty(),
        "{provider} {mode:?}: {out:?} {:?}",
        producer.log()
    );
    let received = rt.block_on(consumer.wait_received(out.session)).unwrap();
    assert!(received.recompute.is_empty());
    let source = producer.memory(src.id).unwrap();
    for at in (0..bytes).step_by(16 << 20) {
        let end = (at + (16 << 20)).min(bytes);
        assert!(
            pool.read(at..end).unwrap()[..] == source.read(at..end).unwrap()[..],
            "{provider} {mode:?}: bytes {at}..{end} differ"
        );
    }
    let (p, c) = (producer.stats(), consumer.stats());
    assert_eq!(p.write_errors, 0, "{:?}", producer.log());
    assert_eq!(c.refused, 0, "{:?}", consumer.log());
    assert!(p.writes > 0 && c.remote_writes >= p.writes, "{p:?} {c:?}");
    println!(
        "{provider} {}: {} MiB in {took:?}, {} writes",
        mode.name(),
        bytes >> 20,
        p.writes,
    );
}

#[test]
fn small_transfers_arrive_byte_identical_in_each_mode() {
    let layout = KvLayout::new(4, 8, 64 << 10, 16, Dtype::F16).unwrap();
    for (provider, domain) in PROVIDERS {
        for mode in [
            TransferMode::Exclusive,
            TransferMode::Packetized {
                slice_bytes: 16 << 10,
            },
            TransferMode::auto(),
        ] {
            for host in [HostMemoryAccess::Mirrored, in_place()] {
                whole_transfer(provider, domain, layout, mode, host);
            }
        }
    }
}

#[test]
fn the_provider_refuses_a_wrong_key_and_an_out_of_region_write() {
    for (provider, domain) in PROVIDERS {
        let Some(report) = on_listed_provider(provider, domain, || {
            probe_refusals(&Provider::Named(provider.into()), domain)
        }) else {
            continue;
        };
        println!("{report:?}");
        assert!(report.valid_write_landed, "{report:?}");
        // Refused with an error at the sender, or dropped by the target without a completion: never
        // completed, and (below) no byte written anywhere.
        assert_ne!(report.wrong_key, WriteAnswer::Completed, "{report:?}");
        assert_ne!(report.out_of_region, WriteAnswer::Completed, "{report:?}");
        assert!(report.nothing_else_written, "{report:?}");
    }
}

#[test]
fn one_gib_arrives_byte_identical_in_each_mode() {
    // 8 layers x 32 blocks x 4 MiB.
    let layout = KvLayout::new(8, 32, 4 << 20, 16, Dtype::Bf16).unwrap();
    for (provider, domain) in PROVIDERS {
        for mode in [
            TransferMode::Exclusive,
            TransferMode::packetized(),
            TransferMode::auto(),
        ] {
            // Zero-copy at scale; the small transfers above cover the mirrors too.
            whole_transfer(provider, domain, layout, mode, in_place());
        }
    }
}

#[test]
fn the_provider_limit_loop_moves_its_bytes() {
    for (provider, domain) in PROVIDERS {
        let gbps = on_listed_provider(provider, domain, || {
            backends::rdma::provider_limit_gbps(
                &Provider::Named(provider.into()),
                domain,
                64 << 10,
                64,
                64 << 20,
                true,
            )
        });
        if let Some(gbps) = gbps {
            assert!(gbps > 0.0, "{provider}: {gbps}");
        }
    }
}

#[test]
fn peers_find_each_other_through_the_discovery_registry() {
    use backends::discovery::{
        self, Discovery, DiscoveryError, Embedded, PeerRecord, SegmentRecord,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (provider, domain) = ("shm", None);
    let host = HostMemoryAccess::Mirrored;
    let (Some(producer), Some(consumer)) = (
        start(1, provider, domain, host),
        start(2, provider, domain, host),
    ) else {
        return;
    };
    let layout = KvLayout::new(2, 4, 64 << 10, 16, Dtype::F16).unwrap();
    let bytes = layout.total_bytes() as usize;
    let src = producer
        .register_kv_region(layout, MemoryRegion::from_vec(pattern(bytes, 5)))
        .unwrap();
    let pool = MemoryRegion::zeroed(bytes);
    let dst = consumer.register_kv_region(layout, pool.clone()).unwrap();
    consumer.publish_segment("kv", dst).unwrap();
    rt.block_on(async {
        let registry = Embedded::new();
        let lease = registry.grant(Duration::from_secs(30)).await.unwrap();
        discovery::announce(
            &registry,
            &consumer,
            &transfer_engine::Namespace::default(),
            lease,
        )
        .await
        .unwrap();
        let segment = SegmentRecord {
            owner: 2,
            name: "kv".into(),
            region: dst.id,
            len: dst.len,
            layout: dst.layout,
        };
        registry.put_segment(&segment, lease).await.unwrap();
        // Found by engine id, then the segment by name; an engine nobody announced is a clear error.
        let peer = discovery::connect(&registry, &producer, 2).await.unwrap();
        // The registry names the region; its key comes with the peer's welcome.
        let seg = registry.segment(2, "kv").await.unwrap().unwrap();
        let handle = peer.segment("kv").unwrap();
        assert_eq!(handle.id, seg.region);
        let req = TransferRequest::whole(peer.peer, &src, handle).unwrap();
        let out = producer
            .transfer(req, Duration::from_secs(30))
            .await
            .unwrap();
        assert!(out.recompute.is_empty(), "{out:?}");
        assert!(matches!(
            discovery::connect(&registry, &producer, 9).await,
            Err(DiscoveryError::NotFound(9))
        ));
        // A peer registered on another provider is refused as the caller's mistake, before libfabric
        // is handed a name it cannot use.
        let elsewhere = PeerRecord {
            engine_id: 7,
            addr: "rdma:verbs;ofi_rxm:00ff10".into(),
            namespace: transfer_engine::Namespace::default().to_string(),
        };
        registry.put_peer(&elsewhere, lease).await.unwrap();
        match discovery::connect(&registry, &producer, 7).await {
            Err(DiscoveryError::Transport(e)) => {
                assert_eq!(e.fault(), backends::Fault::Caller, "{e}");
                assert!(e.to_string().contains("start both on one provider"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    });
    assert!(*pool.read(0..bytes).unwrap() == pattern(bytes, 5)[..]);
}

#[test]
fn automatic_selection_takes_the_fastest_provider_that_reaches_the_peers() {
    use backends::rdma::available_providers;
    let found: Vec<String> = available_providers()
        .expect("fi_getinfo")
        .into_iter()
        .map(|p| p.provider)
        .collect();
    // The documented order: efa, verbs, shm when every peer is on this host, then tcp.
    let expect = |same_host: bool| {
        ["efa", "verbs;ofi_rxm", "shm", "tcp;ofi_rxm"]
            .into_iter()
            .filter(|p| same_host || *p != "shm")
            .find(|p| found.iter().any(|f| f == p))
    };
    for same_host in [true, false] {
        let Some(want) = expect(same_host) else {
            common::say(&format!(
                "not run: libfabric lists none of efa, verbs, shm, tcp here ({found:?})"
            ));
            return;
        };
        let start = |id| RdmaNode::start(RdmaConfig::new(id, Provider::Auto { same_host }));
        let (a, b) = (start(1).unwrap(), start(2).unwrap());
        assert_eq!(a.provider().provider, want, "same_host {same_host}");
        // And the nodes it picked move bytes.
        let layout = KvLayout::new(2, 4, 64 << 10, 16, Dtype::F16).unwrap();
        let bytes = layout.total_bytes() as usize;
        let src = a
            .register_kv_region(layout, MemoryRegion::from_vec(pattern(bytes, 9)))
            .unwrap();
        let pool = MemoryRegion::zeroed(bytes);
        b.publish_segment("kv", b.register_kv_region(layout, pool.clone()).unwrap())
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let peer = rt.block_on(a.connect(b.address())).unwrap();
        let req = TransferRequest::whole(peer.peer, &src, peer.segment("kv").unwrap()).unwrap();
        let out = rt
            .block_on(a.transfer(req, Duration::from_secs(30)))
            .unwrap();
        assert!(out.recompute.is_empty(), "{want}: {out:?}");
        assert!(*pool.read(0..bytes).unwrap() == pattern(bytes, 9)[..]);
        println!("auto (same_host {same_host}) chose {want}");
    }
}
