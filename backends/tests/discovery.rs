//! The embedded registry: registration, lookup, lease expiry, and connecting through it.

use std::time::{Duration, Instant};

use backends::discovery::{self, Discovery, DiscoveryError, Embedded, SegmentRecord};
use backends::tcp::{Namespace, TcpConfig, TcpNode};
use tokio::time::timeout;
use transfer_engine::{Dtype, KvLayout, TransferRequest};

/// The lease's time to live. The registry expires leases by the wall clock; each wait below either has
/// most of this as its margin or polls for the outcome.
const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_and_segments_are_found_and_expire_with_their_lease() {
    timeout(Duration::from_secs(30), async {
        let registry = Embedded::new();
        let rx = TcpNode::start(TcpConfig::with_engine_id(2)).await.unwrap();
        let layout = KvLayout::new(2, 4, 64 << 10, 16, Dtype::F16).unwrap();
        let dst = rx.kv_region(layout).unwrap();
        rx.publish_segment("kv", dst).unwrap();
        let lease = registry.grant(TTL).await.unwrap();
        // Taken after the grant: the lease started no later than this.
        let granted = Instant::now();
        discovery::announce(&registry, &rx, &Namespace::default(), lease)
            .await
            .unwrap();
        registry
            .put_segment(
                &SegmentRecord {
                    owner: 2,
                    name: "kv".into(),
                    region: dst.id,
                    len: dst.len,
                    layout: dst.layout,
                },
                lease,
            )
            .await
            .unwrap();

        let tx = TcpNode::start(TcpConfig::with_engine_id(1)).await.unwrap();
        let src = tx.kv_region(layout).unwrap();
        let info = discovery::connect(&registry, &tx, 2).await.unwrap();
        // The registry says which region; its key comes from the handshake alone.
        let seg = registry.segment(2, "kv").await.unwrap().unwrap();
        assert_eq!((seg.region, seg.layout), (dst.id, dst.layout));
        let handle = info
            .segments
            .iter()
            .find(|s| s.handle.id == seg.region)
            .unwrap()
            .handle;
        let req = TransferRequest::whole(info.peer, &src, &handle).unwrap();
        let out = tx.transfer(req, Duration::from_secs(10)).await.unwrap();
        assert!(out.recompute.is_empty());

        // Kept alive (every eighth of the time to live, so a stall of most of it is survived), the
        // entries stay past the first time to live.
        while granted.elapsed() <= TTL {
            registry.keep_alive(lease).await.unwrap();
            tokio::time::sleep(TTL / 8).await;
        }
        registry.keep_alive(lease).await.unwrap();
        assert_eq!(registry.peers().await.unwrap().len(), 1);
        assert!(registry.segment(2, "kv").await.unwrap().is_some());
        // Left alone, they expire: polled until they have (the test's timeout only guards a hang).
        while registry.peer(2).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(registry.segment(2, "kv").await.unwrap(), None);
        assert!(matches!(
            registry.keep_alive(lease).await,
            Err(DiscoveryError::UnknownLease(_))
        ));
        assert!(matches!(
            discovery::connect(&registry, &tx, 2).await,
            Err(DiscoveryError::NotFound(2))
        ));
    })
    .await
    .unwrap();
}

/// Discovery is the same for every backend: a same-host node is announced under its socket path and
/// reached through the registry like a TCP one.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_host_node_is_announced_and_reached_through_the_registry() {
    use backends::shm::{ShmConfig, ShmNode};
    timeout(Duration::from_secs(30), async {
        let dir = std::env::temp_dir();
        let path = |id: u32| dir.join(format!("te-discovery-{}-{id}.sock", std::process::id()));
        let rx = ShmNode::start(ShmConfig::new(2, Some(path(2)))).unwrap();
        let tx = ShmNode::start(ShmConfig::new(1, None)).unwrap();
        let layout = KvLayout::new(2, 4, 64 << 10, 16, Dtype::F16).unwrap();
        let dst = rx.kv_region(layout).unwrap();
        rx.publish_segment("kv", dst).unwrap();
        let registry = Embedded::new();
        let lease = registry.grant(Duration::from_secs(30)).await.unwrap();
        discovery::announce(&registry, &rx, &Namespace::default(), lease)
            .await
            .unwrap();
        let rec = registry.peer(2).await.unwrap().unwrap();
        assert_eq!(rec.addr, format!("shm:{}", path(2).display()));
        // A node that only dials has no address to announce.
        let refused = discovery::announce(&registry, &tx, &Namespace::default(), lease).await;
        assert!(
            matches!(&refused, Err(DiscoveryError::Transport(e)) if e.fault() == backends::Fault::Caller),
            "{refused:?}"
        );
        let src = tx.kv_region(layout).unwrap();
        let info = discovery::connect(&registry, &tx, 2).await.unwrap();
        let dst = *info.segment("kv").unwrap();
        let req = TransferRequest::whole(info.peer, &src, &dst).unwrap();
        let out = tx.transfer(req, Duration::from_secs(10)).await.unwrap();
        assert!(out.recompute.is_empty(), "{out:?}");
    })
    .await
    .unwrap();
}
