//! The handshake's refusals, the same checks on every backend that authenticates (TCP lanes and same-host
//! shm): a peer with the right secret and namespace connects; one with another secret, with none, or
//! serving another namespace is refused with the reason; and a recorded handshake replayed to the
//! listener (the honest dialer's bytes, captured by a relay between the two) does not verify again.
//! RDMA's connection setup does not authenticate yet (see docs/PROTOCOL.md), so it has no row here.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backends::Transport;
use backends::TransportError;
use backends::tcp::Secret;
use common::runtime;
use transfer_engine::Namespace;

/// One side of a handshake: its secret and the model its namespace serves.
#[derive(Clone, Copy)]
struct Side {
    secret: Option<&'static str>,
    model: &'static str,
}

const HONEST: Side = Side {
    secret: Some("correct horse"),
    model: "m",
};

fn namespace(side: Side) -> Namespace {
    Namespace {
        model: side.model.into(),
        ..Namespace::default()
    }
}

/// What a backend needs for these checks: a listener and a dialer with given sides, and a relay that
/// records what the dialer sends.
trait Backend {
    /// A listening node (engine 2) with `side`.
    fn listener(&self, rt: &tokio::runtime::Runtime, side: Side) -> Arc<dyn Transport>;
    /// A dialing node (engine 1) with `side`.
    fn dialer(&self, rt: &tokio::runtime::Runtime, side: Side) -> Arc<dyn Transport>;
    /// Connects `dialer` to `listener` through a relay, and returns the bytes the dialer sent during its
    /// handshake.
    fn recorded_connect(
        &self,
        rt: &tokio::runtime::Runtime,
        dialer: &dyn Transport,
        listener: &dyn Transport,
    ) -> Vec<u8>;
    /// Sends `bytes` to `listener` on a fresh connection and returns all it answers until it closes.
    fn replay(
        &self,
        rt: &tokio::runtime::Runtime,
        listener: &dyn Transport,
        bytes: &[u8],
    ) -> String;
}

fn connect(
    rt: &tokio::runtime::Runtime,
    dialer: &dyn Transport,
    listener: &dyn Transport,
) -> Result<(), TransportError> {
    let address = listener.address().expect("a listener has an address");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), dialer.connect(&address))
            .await
            .expect("a handshake hung")
    })
    .map(|_| ())
}

fn refused(backend: &dyn Backend, listener: Side, dialer: Side, why: &str) {
    let rt = runtime();
    let l = backend.listener(&rt, listener);
    let d = backend.dialer(&rt, dialer);
    let e = connect(&rt, &*d, &*l).expect_err("a mismatched peer connected");
    assert!(e.to_string().contains(why), "{e}");
    d.shutdown();
    l.shutdown();
}

fn holders_of_the_secret_connect(backend: &dyn Backend) {
    let rt = runtime();
    let (l, d) = (backend.listener(&rt, HONEST), backend.dialer(&rt, HONEST));
    connect(&rt, &*d, &*l).unwrap();
    d.shutdown();
    l.shutdown();
}

fn another_secret_is_refused(backend: &dyn Backend) {
    let other = Side {
        secret: Some("wrong horse"),
        ..HONEST
    };
    refused(
        backend,
        HONEST,
        other,
        "failed shared-secret authentication",
    );
}

fn no_secret_is_refused_either_way(backend: &dyn Backend) {
    let none = Side {
        secret: None,
        ..HONEST
    };
    refused(backend, HONEST, none, "no secret");
    refused(backend, none, HONEST, "no secret");
}

fn another_namespace_is_refused(backend: &dyn Backend) {
    let other = Side {
        model: "another-model",
        ..HONEST
    };
    refused(backend, HONEST, other, "namespace mismatch");
}

fn a_replayed_handshake_does_not_verify(backend: &dyn Backend) {
    let rt = runtime();
    let (l, d) = (backend.listener(&rt, HONEST), backend.dialer(&rt, HONEST));
    let recorded = backend.recorded_connect(&rt, &*d, &*l);
    assert!(!recorded.is_empty());
    // The honest dialer stays connected (its probe word, for shm, stays valid): what refuses the replay
    // is its MAC over a nonce the listener never drew again, not a duplicate engine id.
    let answer = backend.replay(&rt, &*l, &recorded);
    assert!(
        answer.contains("the dialer failed shared-secret authentication"),
        "{answer:?}"
    );
    d.shutdown();
    l.shutdown();
}

/// Relays one connection each way, appending what the dialer sends to `record`.
async fn relay<A, B>(a: A, b: B, record: Arc<Mutex<Vec<u8>>>)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let up = async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = ar.read(&mut buf).await {
            if n == 0 || bw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            record.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    };
    tokio::spawn(up);
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut br, &mut aw).await;
    });
}

async fn answer_of<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut s: S,
    bytes: &[u8],
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(bytes).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    String::from_utf8_lossy(&got).into_owned()
}

struct Tcp;

fn tcp_addr(listener: &dyn Transport) -> std::net::SocketAddr {
    match listener.address().unwrap() {
        backends::PeerAddress::Tcp(addr) => addr,
        other => panic!("a TCP node's address is {other:?}"),
    }
}

impl Backend for Tcp {
    fn listener(&self, rt: &tokio::runtime::Runtime, side: Side) -> Arc<dyn Transport> {
        let mut cfg = backends::tcp::TcpConfig::with_engine_id(2);
        cfg.namespace = namespace(side);
        cfg.security.secret = side.secret.map(Secret::from);
        Arc::new(rt.block_on(backends::tcp::TcpNode::start(cfg)).unwrap())
    }

    fn dialer(&self, rt: &tokio::runtime::Runtime, side: Side) -> Arc<dyn Transport> {
        let mut cfg = backends::tcp::TcpConfig::with_engine_id(1);
        cfg.listen = None;
        cfg.namespace = namespace(side);
        cfg.security.secret = side.secret.map(Secret::from);
        Arc::new(rt.block_on(backends::tcp::TcpNode::start(cfg)).unwrap())
    }

    fn recorded_connect(
        &self,
        rt: &tokio::runtime::Runtime,
        dialer: &dyn Transport,
        listener: &dyn Transport,
    ) -> Vec<u8> {
        let target = tcp_addr(listener);
        let record = Arc::new(Mutex::new(Vec::new()));
        let relay_at = rt.block_on(async {
            let relay_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let at = relay_listener.local_addr().unwrap();
            let record = record.clone();
            tokio::spawn(async move {
                let (a, _) = relay_listener.accept().await.unwrap();
                let b = tokio::net::TcpStream::connect(target).await.unwrap();
                relay(a, b, record).await;
            });
            at
        });
        let address = backends::PeerAddress::Tcp(relay_at);
        rt.block_on(dialer.connect(&address)).unwrap();
        record.lock().unwrap().clone()
    }

    fn replay(
        &self,
        rt: &tokio::runtime::Runtime,
        listener: &dyn Transport,
        bytes: &[u8],
    ) -> String {
        let target = tcp_addr(listener);
        rt.block_on(async {
            answer_of(tokio::net::TcpStream::connect(target).await.unwrap(), bytes).await
        })
    }
}

#[cfg(target_os = "linux")]
struct Shm;

#[cfg(target_os = "linux")]
fn socket_path(what: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "te-refusals-{}-{n}-{what}.sock",
        std::process::id()
    ))
}

#[cfg(target_os = "linux")]
impl Shm {
    fn node(id: u32, path: Option<std::path::PathBuf>, side: Side) -> Arc<dyn Transport> {
        let mut cfg = backends::shm::ShmConfig::new(id, path);
        cfg.namespace = namespace(side);
        cfg.secret = side.secret.map(Secret::from);
        Arc::new(backends::shm::ShmNode::start(cfg).unwrap())
    }

    fn path_of(listener: &dyn Transport) -> std::path::PathBuf {
        match listener.address().unwrap() {
            backends::PeerAddress::Shm(path) => path,
            other => panic!("an shm node's address is {other:?}"),
        }
    }
}

#[cfg(target_os = "linux")]
impl Backend for Shm {
    fn listener(&self, _: &tokio::runtime::Runtime, side: Side) -> Arc<dyn Transport> {
        Shm::node(2, Some(socket_path("listener")), side)
    }

    fn dialer(&self, _: &tokio::runtime::Runtime, side: Side) -> Arc<dyn Transport> {
        Shm::node(1, None, side)
    }

    fn recorded_connect(
        &self,
        rt: &tokio::runtime::Runtime,
        dialer: &dyn Transport,
        listener: &dyn Transport,
    ) -> Vec<u8> {
        let target = Shm::path_of(listener);
        let relay_at = socket_path("relay");
        let record = Arc::new(Mutex::new(Vec::new()));
        rt.block_on(async {
            let relay_listener = tokio::net::UnixListener::bind(&relay_at).unwrap();
            let record = record.clone();
            tokio::spawn(async move {
                let (a, _) = relay_listener.accept().await.unwrap();
                let b = tokio::net::UnixStream::connect(target).await.unwrap();
                relay(a, b, record).await;
            });
        });
        let address = backends::PeerAddress::Shm(relay_at.clone());
        rt.block_on(dialer.connect(&address)).unwrap();
        let _ = std::fs::remove_file(relay_at);
        record.lock().unwrap().clone()
    }

    fn replay(
        &self,
        rt: &tokio::runtime::Runtime,
        listener: &dyn Transport,
        bytes: &[u8],
    ) -> String {
        let target = Shm::path_of(listener);
        rt.block_on(async {
            answer_of(
                tokio::net::UnixStream::connect(target).await.unwrap(),
                bytes,
            )
            .await
        })
    }
}

/// One module per backend with one test per check.
macro_rules! refusals {
    ($backend:ident, $fixture:expr) => {
        refusals!(
            @each $backend, $fixture,
            holders_of_the_secret_connect,
            another_secret_is_refused,
            no_secret_is_refused_either_way,
            another_namespace_is_refused,
            a_replayed_handshake_does_not_verify
        );
    };
    (@each $backend:ident, $fixture:expr, $($check:ident),+) => {
        mod $backend {
            use super::*;
            $(
                #[test]
                fn $check() {
                    super::$check(&$fixture);
                }
            )+
        }
    };
}

refusals!(tcp, Tcp);
#[cfg(target_os = "linux")]
refusals!(shm, Shm);
