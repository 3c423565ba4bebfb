//! The embedded registry: registration, lookup, lease expiry, and connecting through it.

use std::time::Duration;

use backends::discovery::{self, Discovery, DiscoveryError, Embedded, SegmentRecord};
use backends::tcp::{Namespace, TcpConfig, TcpNode};
use tokio::time::timeout;
use transfer_engine::{Dtype, KvLayout, TransferRequest};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_and_segments_are_found_and_expire_with_their_lease() {
    timeout(Duration::from_secs(30), async {
        let registry = Embedded::new();
        let rx = TcpNode::start(TcpConfig::with_engine_id(2)).await.unwrap();
        let layout = KvLayout::new(2, 4, 64 << 10, 16, Dtype::F16).unwrap();
        let dst = rx.kv_region(layout).unwrap();
        let lease = registry.grant(Duration::from_millis(300)).await.unwrap();
        discovery::announce(&registry, &rx, &Namespace::default(), lease)
            .await
            .unwrap();
        registry
            .put_segment(
                &SegmentRecord {
                    owner: 2,
                    name: "kv".into(),
                    handle: dst,
                },
                lease,
            )
            .await
            .unwrap();

        let tx = TcpNode::start(TcpConfig::with_engine_id(1)).await.unwrap();
        let src = tx.kv_region(layout).unwrap();
        let info = discovery::connect(&registry, &tx, 2).await.unwrap();
        let seg = registry.segment(2, "kv").await.unwrap().unwrap();
        let req = TransferRequest::whole(info.peer, &src, &seg.handle).unwrap();
        let out = tx.transfer(req, Duration::from_secs(10)).await.unwrap();
        assert!(out.recompute.is_empty());

        // Kept alive, the entries stay past the first time to live.
        tokio::time::sleep(Duration::from_millis(200)).await;
        registry.keep_alive(lease).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(registry.peers().await.unwrap().len(), 1);
        // Left alone, they expire.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(registry.peer(2).await.unwrap(), None);
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
