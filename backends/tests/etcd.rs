//! Discovery through a real etcd server: registration, lookup and lease expiry.
//!
//! Uses the server at `ETCD_ENDPOINT` (see `scripts/etcd.sh`), or starts `/usr/bin/etcd` on a free
//! loopback port. Fails, never skips, if neither works.
#![cfg(feature = "etcd")]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use backends::discovery::{Discovery, DiscoveryError, Etcd, PeerRecord, SegmentRecord};
use backends::tcp::Secret;
use tokio::time::timeout;
use transfer_engine::{Dtype, KvLayout, RegionId};

/// An etcd this test started (killed on drop), or none when `ETCD_ENDPOINT` names one.
struct Server {
    child: Option<Child>,
    dir: Option<std::path::PathBuf>,
    endpoint: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A loopback port for the etcd this test starts: below the kernel's ephemeral range (32768 up on
/// Linux), so no port the kernel hands out before etcd binds it (an outgoing connection, another test's
/// bind to port 0) can be this one; each call tries the next port after the last, from one this process
/// id picks.
fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id() % 6_000 * 2;
    for _ in 0..1_000 {
        let port = 20_000 + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000;
        if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free loopback port in 20000..32000");
}

fn server() -> Server {
    if let Ok(endpoint) = std::env::var("ETCD_ENDPOINT") {
        return Server {
            child: None,
            dir: None,
            endpoint,
        };
    }
    let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| {
            panic!(
                "no etcd: set ETCD_ENDPOINT or install etcd (run scripts/etcd.sh, which installs Debian's \
                 etcd-server and starts it)"
            )
        });
    let (client, peer) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("etcd-test-{}-{client}", std::process::id()));
    let child = Command::new(bin)
        .args(["--name", "te-test", "--data-dir"])
        .arg(&dir)
        .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
        ))
        .arg(format!("--initial-cluster=te-test=http://127.0.0.1:{peer}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {bin}: {e}"));
    let server = Server {
        child: Some(child),
        dir: Some(dir),
        endpoint: format!("http://127.0.0.1:{client}"),
    };
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "etcd at {} did not start within 10 s",
            server.endpoint
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_registers_finds_and_expires_peers_and_segments() {
    let server = server();
    timeout(Duration::from_secs(40), async {
        let prefix = format!("/kvte-test/{}", std::process::id());
        let etcd = Etcd::connect(std::slice::from_ref(&server.endpoint), &prefix)
            .await
            .unwrap_or_else(|e| panic!("cannot reach etcd at {}: {e}", server.endpoint));
        let peer = PeerRecord {
            engine_id: 7,
            addr: "127.0.0.1:4100".into(),
            namespace: "ns".into(),
        };
        let segment = SegmentRecord {
            owner: 7,
            name: "kv".into(),
            region: RegionId(3),
            len: 1 << 20,
            layout: Some(KvLayout::new(4, 4, 64 << 10, 16, Dtype::Bf16).unwrap()),
        };
        // A long lease: registration and lookup.
        let long = etcd.grant(Duration::from_secs(60)).await.unwrap();
        etcd.put_peer(&peer, long).await.unwrap();
        etcd.put_segment(&segment, long).await.unwrap();
        assert_eq!(etcd.peer(7).await.unwrap(), Some(peer.clone()));
        assert_eq!(etcd.segment(7, "kv").await.unwrap(), Some(segment.clone()));
        assert_eq!(etcd.peers().await.unwrap(), vec![peer.clone()]);
        etcd.keep_alive(long).await.unwrap();
        etcd.revoke(long).await.unwrap();
        assert_eq!(etcd.peer(7).await.unwrap(), None);

        // A short lease left alone: the dead peer's entries expire.
        let short = etcd.grant(Duration::from_secs(2)).await.unwrap();
        etcd.put_peer(&peer, short).await.unwrap();
        etcd.put_segment(&segment, short).await.unwrap();
        let start = Instant::now();
        while etcd.peer(7).await.unwrap().is_some() {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "the lease never expired"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert_eq!(etcd.segment(7, "kv").await.unwrap(), None);
        let renewed = etcd.keep_alive(short).await;
        assert!(
            matches!(renewed, Err(DiscoveryError::UnknownLease(_))),
            "{renewed:?}"
        );
        assert!(matches!(
            etcd.put_peer(&peer, short).await,
            Err(DiscoveryError::UnknownLease(_))
        ));
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cluster_secret_only_sealed_records_are_read() {
    let server = server();
    timeout(Duration::from_secs(40), async {
        let prefix = format!("/kvte-sealed/{}", std::process::id());
        let connect = || Etcd::connect(std::slice::from_ref(&server.endpoint), &prefix);
        let cluster = connect().await.unwrap().with_secret(Secret::from("s3cret"));
        let stranger = connect().await.unwrap().with_secret(Secret::from("other"));
        let open = connect().await.unwrap();
        let record = |engine_id, addr: &str| PeerRecord {
            engine_id,
            addr: addr.into(),
            namespace: "ns".into(),
        };
        let lease = cluster.grant(Duration::from_secs(60)).await.unwrap();
        cluster
            .put_peer(&record(7, "127.0.0.1:4100"), lease)
            .await
            .unwrap();
        // Written without the secret, or with another: a stranger pointing engine 8 at its own address.
        open.put_peer(&record(8, "10.6.6.6:1"), lease)
            .await
            .unwrap();
        stranger
            .put_peer(&record(9, "10.6.6.6:2"), lease)
            .await
            .unwrap();
        assert_eq!(
            cluster.peers().await.unwrap(),
            vec![record(7, "127.0.0.1:4100")]
        );
        assert_eq!(cluster.refused_records(), 2);
        let forged = cluster.peer(8).await;
        assert!(
            matches!(&forged, Err(DiscoveryError::Malformed { reason, .. })
                if reason.contains("not signed with this cluster's secret")),
            "{forged:?}"
        );
        assert!(stranger.peer(7).await.is_err());
        // The stored text names no secret.
        assert!(!format!("{cluster:?}").contains("s3cret"));
        cluster.revoke(lease).await.unwrap();
    })
    .await
    .unwrap();
}
