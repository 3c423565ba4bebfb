//! The producer's side of the control channel: answers lookups and starts loads for the consumers that
//! connect, remembering where each consumer's KV pool is.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use backends::transport::BadAddress;
use backends::{PeerAddress, TransportError};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use transfer_engine::TrafficClass;

use super::auth;
use super::frame::{self, FrameError};
use super::rechecked::RecheckedRead;
use super::{ErrorKind, KV_SEGMENT, Reply, Request, scoped_keys};
use crate::data_plane::{Destination, SameHostEndpoint, Via};
use crate::error::ConnectorError;
use crate::keys::BlockHash;
use crate::producer::{ProducerCore, Started};
use crate::tp::check_pairing;

type Peers = tokio::sync::Mutex<HashMap<(Via, String), Destination>>;

/// Consumers whose KV pool a producer remembers (beyond it, it forgets them all and reconnects).
const MAX_CONSUMERS: usize = 1024;
fn class_from(code: u8) -> TrafficClass {
    TrafficClass::ALL
        .get(usize::from(code))
        .copied()
        .unwrap_or(TrafficClass::BulkKv)
}

/// How long the accept loop trusts the runtime to report a connection before it asks the socket itself.
///
/// Inside vLLM's CPU worker a connection sometimes waited 6 s in the listen queue while the runtime
/// polled on (gdb: its I/O driver in `epoll_wait` every few ms, the listener registered in its epoll,
/// `ss`: one connection queued). The edge-triggered readiness was lost, most likely taken by foreign code
/// in the process: entries that are not tokio's (level-triggered) turned up in the runtime's epoll
/// instance. Asking the socket every so often bounds what a lost edge costs a new connection.
const ACCEPT_RECHECK: Duration = Duration::from_millis(50);

/// Control connections a producer serves at once; one beyond it is closed at once (a connect flood
/// costs a socket for a moment, never a task each).
const MAX_CONNECTIONS: usize = 1024;

/// Time a connection has to complete its handshake ([`super::auth`]).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The answer to a handshake frame after the handshake.
const HANDSHAKE_OVER: &str =
    "control channel: the handshake is over; a second hello or auth is refused";

/// Serves control connections for `core` on `listener` until the runtime stops.
pub(crate) async fn serve(core: Arc<ProducerCore>, listener: TcpListener) {
    let peers: Arc<Peers> = Arc::default();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match tokio::time::timeout(ACCEPT_RECHECK, listener.accept()).await {
            Ok(Ok((stream, _))) => stream,
            Ok(Err(_)) => return,
            Err(_) => match accept_now(&listener) {
                Some(stream) => stream,
                None => continue,
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (core, peers) = (core.clone(), peers.clone());
        tokio::spawn(async move {
            connection(core, peers, stream).await;
            drop(slot);
        });
    }
}

/// A connection waiting in `listener`'s queue, taken by the accept call itself whatever the runtime
/// believes of its readiness (`None`: none waits, or it could not be taken over).
fn accept_now(listener: &TcpListener) -> Option<TcpStream> {
    let (socket, _) = socket2::SockRef::from(listener).accept().ok()?;
    socket.set_nonblocking(true).ok()?;
    TcpStream::from_std(std::net::TcpStream::from(socket)).ok()
}

/// The next frame of a connection; `None` when it ended, or must end: a frame this producer cannot
/// read is answered with the reason first.
async fn next_frame(
    read: &mut (impl tokio::io::AsyncRead + Unpin),
    write: &mut (impl tokio::io::AsyncWrite + Unpin),
) -> Option<frame::Frame> {
    match frame::read(read).await {
        Ok(Some(f)) => Some(f),
        Ok(None) | Err(FrameError::Closed(_)) => None,
        Err(FrameError::Version1) => {
            // Told in its own protocol (a JSON line), then the connection ends.
            let reply = Reply::error(FrameError::Version1.to_string());
            let mut line = serde_json::to_vec(&reply).expect("replies serialise");
            line.push(b'\n');
            let _ = write.write_all(&line).await;
            None
        }
        Err(e) => {
            // Another version, or a frame over the limits: told why, then the connection ends.
            let reply = Reply::error(e.to_string());
            let _ = frame::write(write, &reply, &[]).await;
            None
        }
    }
}

async fn connection(core: Arc<ProducerCore>, peers: Arc<Peers>, stream: TcpStream) {
    let Ok(from) = stream.peer_addr() else {
        return;
    };
    let (read, mut write) = stream.into_split();
    let mut read = tokio::io::BufReader::new(RecheckedRead::new(read));
    let handshake = async {
        let hello = next_frame(&mut read, &mut write).await?;
        auth::producer(hello, &mut read, &mut write, &core.control)
            .await
            .ok()
    };
    let consumer = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Some(consumer)) => Asker {
            engines: consumer.engines,
            from: from.ip(),
        },
        // Refused (and told why), or silent too long: the connection ends.
        Ok(None) | Err(_) => return,
    };
    loop {
        let Some(frame) = next_frame(&mut read, &mut write).await else {
            return;
        };
        let reply = match frame.head::<Request>() {
            Err(message) => Reply::error(message),
            Ok(req) => answer(&core, &peers, &consumer, req, frame.keys).await,
        };
        if frame::write(&mut write, &reply, &[]).await.is_err() {
            return;
        }
    }
}

/// The consumer at the other end of a connection, as its handshake showed it.
struct Asker {
    /// The engines it receives on.
    engines: Vec<u32>,
    /// The address its connection came from.
    from: IpAddr,
}

impl Asker {
    /// Why a load naming `engine_addr` cannot go there, if it cannot. Without a secret nothing the
    /// consumer says is proven, so its KV goes only to the host its connection came from; with one,
    /// the lanes' handshake proves the engine reached holds the secret (and [`Asker::owns`] that it is
    /// the consumer's own).
    fn refuses_address(&self, engine_addr: &str, authenticated: bool) -> Option<String> {
        let Ok(PeerAddress::Tcp(addr)) = engine_addr.parse::<PeerAddress>() else {
            return None;
        };
        (!authenticated && addr.ip() != self.from).then(|| {
            format!(
                "a load names engine address {addr}, not on the host its control connection came \
                 from ({}): without a shared secret KV goes only there",
                self.from
            )
        })
    }

    /// Why this consumer may not be sent to `dst`, if it may not: the engine reached there is none
    /// of the engines it receives on.
    fn owns(&self, dst: &Destination, addr: &str) -> Result<(), String> {
        if u32::try_from(dst.peer.0).is_ok_and(|e| self.engines.contains(&e)) {
            return Ok(());
        }
        Err(format!(
            "engine {} answered at {addr}, which is not an engine of the consumer that asked (its \
             engines: {:?}): a producer sends KV only to the consumer that asked",
            dst.peer.0, self.engines
        ))
    }
}

async fn answer(
    core: &Arc<ProducerCore>,
    peers: &Peers,
    asker: &Asker,
    req: Request,
    hashes: Vec<BlockHash>,
) -> Reply {
    let tp = match &req {
        Request::Lookup { tp, .. } | Request::Load { tp, .. } => *tp,
        Request::Hello { .. } | Request::Auth => {
            return Reply::error(HANDSHAKE_OVER);
        }
    };
    if let Err(message) = check_pairing(core.rank, tp) {
        return Reply::Error {
            message,
            kind: Some(ErrorKind::Pairing),
        };
    }
    match req {
        Request::Hello { .. } | Request::Auth => Reply::error(HANDSHAKE_OVER),
        Request::Lookup { ns, whole, .. } => {
            let (blocks, disk) = core.lookup_tiers(&scoped_keys(ns, hashes), whole);
            Reply::Found { blocks, disk }
        }
        Request::Load {
            ns,
            engine_addr,
            blocks,
            class,
            request,
            same_host,
            ..
        } => {
            let authenticated = core.control.secret.is_some();
            if let Some(message) = asker.refuses_address(&engine_addr, authenticated) {
                return Reply::error(message);
            }
            let keys = scoped_keys(ns, hashes);
            let class = class_from(class);
            let (mut dst, mut fell_back) =
                match choose(core, peers, asker, &engine_addr, same_host.as_ref(), false).await {
                    Ok(d) => d,
                    Err(message) => return Reply::error(message),
                };
            let mut started = core.load(&keys, dst, &blocks, class, request);
            if let Err(ConnectorError::Transport(
                TransportError::Unreachable(_) | TransportError::NoRoute { .. },
            )) = started
            {
                // The consumer was found unreachable, or its node forgot this one: reach it afresh
                // (which asks it to answer again) and try once more.
                (dst, fell_back) = match choose(
                    core,
                    peers,
                    asker,
                    &engine_addr,
                    same_host.as_ref(),
                    true,
                )
                .await
                {
                    Ok(d) => d,
                    Err(message) => return Reply::error(message),
                };
                started = core.load(&keys, dst, &blocks, class, request);
            }
            if fell_back {
                // Once per load, however many times the same-host transport was tried for it.
                core.metrics.same_host_fallback();
            }
            match started {
                Ok(Started { session, served }) => Reply::Started {
                    session: session.map(|s| s.id.0),
                    served,
                    via: dst.via,
                },
                Err(e) => Reply::error(e.to_string()),
            }
        }
    }
}

/// The transport a load goes over: the same-host one when the consumer names this producer's host and
/// can be reached there, the main one otherwise; `true` beside it when the same-host one was tried and
/// could not be used (a fallback, which the caller counts).
async fn choose(
    core: &ProducerCore,
    peers: &Peers,
    asker: &Asker,
    engine_addr: &str,
    same_host: Option<&SameHostEndpoint>,
    fresh: bool,
) -> Result<(Destination, bool), String> {
    let mut fell_back = false;
    if let Some(end) = same_host
        && core.transport.shares_host(&end.host)
    {
        match route(core, peers, Via::SameHost, &end.addr, fresh).await {
            Ok(d) => return asker.owns(&d, &end.addr).map(|()| (d, false)),
            // Same host by name, yet not reachable there (another container, say): the main transport.
            Err(_) => fell_back = true,
        }
    }
    let d = route(core, peers, Via::Main, engine_addr, fresh).await?;
    asker.owns(&d, engine_addr)?;
    Ok((d, fell_back))
}

/// The consumer at `addr` on transport `via`, as this producer addresses it: remembered from an earlier
/// load, or (when not remembered, or `fresh`) reached now.
async fn route(
    core: &ProducerCore,
    peers: &Peers,
    via: Via,
    addr: &str,
    fresh: bool,
) -> Result<Destination, String> {
    let key = (via, addr.to_owned());
    let mut peers = peers.lock().await;
    if !fresh && let Some(d) = peers.get(&key) {
        return Ok(*d);
    }
    peers.remove(&key);
    let d = reach(core, via, addr).await?;
    if peers.len() >= MAX_CONSUMERS {
        peers.clear(); // bounded: forgotten consumers are reached again
    }
    peers.insert(key, d);
    Ok(d)
}

/// Connects the producer's node to a consumer's over `via` and finds its KV pool.
async fn reach(core: &ProducerCore, via: Via, addr: &str) -> Result<Destination, String> {
    let parsed: PeerAddress = addr.parse().map_err(|e: BadAddress| e.to_string())?;
    let info = core
        .transport
        .connect(via, &parsed)
        .await
        .map_err(|e| e.to_string())?;
    let region = *info
        .segment(KV_SEGMENT)
        .ok_or("the consumer offers no KV pool (register_kv_caches first)")?;
    Ok(Destination {
        via,
        peer: info.peer,
        region,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_queued_connection_is_taken_without_the_runtime_reporting_it() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        assert!(accept_now(&listener).is_none(), "nothing waits yet");
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || std::net::TcpStream::connect(addr).unwrap());
        let _client = client.join().unwrap();
        // Never polled by `accept`: only the socket itself says the connection is there.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let stream = loop {
            if let Some(s) = accept_now(&listener) {
                break s;
            }
            assert!(std::time::Instant::now() < deadline, "never taken");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(stream.local_addr().unwrap(), addr);
    }
}
