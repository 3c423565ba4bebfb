//! The control channel between a consumer and a producer over TCP: lookups and load requests as JSON
//! lines on a connection of their own (the KV itself travels on the transfer engine's lanes).
//!
//! ```text
//! consumer                                        producer
//!   {"op":"lookup","ns":..,"keys":[hex..],"tp":{"rank":0,"size":1,"mla":false}}     ->
//!                                              <-  {"reply":"found","blocks":n}
//!   {"op":"load","ns":..,"keys":[..],"engine_addr":"ip:port","blocks":[..],"class":1,"request":r,"tp":{..},
//!    "same_host":{"host":h,"addr":"shm:/path"}}                                ->
//!                                              <-  {"reply":"started","session":s,"served":n,"via":"same_host"}
//! ```
//! `same_host` (optional) is the consumer's same-host endpoint: a producer whose own same-host transport
//! runs on host `h` sends over it, and over the main transport otherwise (or when it cannot reach that
//! address); `via` says which carries the session (`main` when absent).
//! `tp` is the consumer's tensor-parallel rank and whether its KV is MLA: a producer rank answers only
//! the consumer rank of its own number in an instance of its own size (any rank, for MLA on both sides),
//! and refuses others with an error naming both ([`crate::tp`]).
//! A lookup counts blocks stored whole and blocks being saved now (a load streams their layers as they
//! are saved). A load's reply names the sending session; the consumer waits on it layer by layer. Lines longer than
//! [`MAX_LINE`] end the connection (memory stays bounded); a malformed line is answered with an error.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use backends::transport::BadAddress;
use backends::{PeerAddress, TransportError};
use policy::NamespaceId;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use transfer_engine::{PeerId, RegionHandle, SessionId, TrafficClass};

use crate::data_plane::{PlaneSession, Via};
use crate::error::ConnectorError;
use crate::keys::{BlockHash, ScopedKey};
use crate::producer::{ProducerCore, Started};
use crate::tp::{RankKv, check_pairing};

/// Longest control line accepted (16 MiB: about 250,000 keys).
pub const MAX_LINE: u64 = 16 << 20;
/// Consumers whose KV pool a producer remembers (beyond it, it forgets them all and reconnects).
const MAX_CONSUMERS: usize = 1024;
/// The segment name a consumer offers its KV pool under.
pub const KV_SEGMENT: &str = "kv";

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Request {
    Lookup {
        ns: u64,
        keys: Vec<String>,
        tp: RankKv,
    },
    Load {
        ns: u64,
        keys: Vec<String>,
        engine_addr: String,
        blocks: Vec<u32>,
        class: u8,
        request: u64,
        tp: RankKv,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        same_host: Option<SameHostEndpoint>,
    },
}

/// A consumer's same-host endpoint, named in its loads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SameHostEndpoint {
    /// The host its same-host transport runs on ([`crate::this_host`]).
    pub(crate) host: String,
    /// The same-host transport's address.
    pub(crate) addr: String,
}

/// Where a consumer's node receives loads: its main transport's address, and its same-host endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoints {
    pub(crate) main: PeerAddress,
    pub(crate) same_host: Option<SameHostEndpoint>,
}

/// A consumer as a producer sends to it: over which transport, to which peer, into which region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Destination {
    pub(crate) via: Via,
    pub(crate) peer: PeerId,
    pub(crate) region: RegionHandle,
}

type Peers = tokio::sync::Mutex<HashMap<(Via, String), Destination>>;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub(crate) enum Reply {
    Found {
        blocks: usize,
    },
    Started {
        session: Option<u64>,
        served: usize,
        #[serde(default)]
        via: Via,
    },
    Error {
        message: String,
    },
}

pub(crate) fn hex_keys(keys: &[ScopedKey]) -> Vec<String> {
    keys.iter().map(|k| k.hash.to_hex()).collect()
}

pub(crate) fn parse_keys(ns: u64, keys: &[String]) -> Result<Vec<ScopedKey>, String> {
    keys.iter()
        .map(|h| {
            if h.len() != 64 || !h.is_ascii() {
                return Err(format!("key {h:?} is not 64 hex digits"));
            }
            let mut b = [0u8; 32];
            for (i, out) in b.iter_mut().enumerate() {
                *out = u8::from_str_radix(&h[2 * i..2 * i + 2], 16)
                    .map_err(|_| format!("key {h:?} is not hex"))?;
            }
            Ok(ScopedKey {
                ns: NamespaceId(ns),
                hash: BlockHash(b),
            })
        })
        .collect()
}

pub(crate) fn class_code(c: TrafficClass) -> u8 {
    c.index() as u8
}

fn class_from(code: u8) -> TrafficClass {
    TrafficClass::ALL
        .get(usize::from(code))
        .copied()
        .unwrap_or(TrafficClass::BulkKv)
}

/// Serves control connections for `core` on `listener` until the runtime stops.
pub(crate) async fn serve(core: Arc<ProducerCore>, listener: TcpListener) {
    let peers: Arc<Peers> = Arc::default();
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(core.clone(), peers.clone(), stream));
    }
}

async fn connection(core: Arc<ProducerCore>, peers: Arc<Peers>, stream: TcpStream) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut read)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) if line.last() != Some(&b'\n') => return, // over the limit
            Ok(_) => {}
        }
        let reply = match serde_json::from_slice::<Request>(&line) {
            Err(e) => Reply::Error {
                message: format!("malformed control line: {e}"),
            },
            Ok(req) => answer(&core, &peers, req).await,
        };
        let mut out = serde_json::to_vec(&reply).expect("replies serialise");
        out.push(b'\n');
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn answer(core: &Arc<ProducerCore>, peers: &Peers, req: Request) -> Reply {
    let (Request::Lookup { tp, .. } | Request::Load { tp, .. }) = &req;
    if let Err(message) = check_pairing(core.rank, *tp) {
        return Reply::Error { message };
    }
    match req {
        Request::Lookup { ns, keys, .. } => match parse_keys(ns, &keys) {
            Ok(keys) => Reply::Found {
                blocks: core.lookup_streaming(&keys),
            },
            Err(message) => Reply::Error { message },
        },
        Request::Load {
            ns,
            keys,
            engine_addr,
            blocks,
            class,
            request,
            same_host,
            ..
        } => {
            let keys = match parse_keys(ns, &keys) {
                Ok(k) => k,
                Err(message) => return Reply::Error { message },
            };
            let class = class_from(class);
            let (mut dst, mut fell_back) =
                match choose(core, peers, &engine_addr, same_host.as_ref(), false).await {
                    Ok(d) => d,
                    Err(message) => return Reply::Error { message },
                };
            let mut started = core.load(&keys, dst, &blocks, class, request);
            if let Err(ConnectorError::Transport(
                TransportError::Unreachable(_) | TransportError::NoRoute { .. },
            )) = started
            {
                // The consumer was found unreachable, or its node forgot this one: reach it afresh
                // (which asks it to answer again) and try once more.
                (dst, fell_back) =
                    match choose(core, peers, &engine_addr, same_host.as_ref(), true).await {
                        Ok(d) => d,
                        Err(message) => return Reply::Error { message },
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
                Err(e) => Reply::Error {
                    message: e.to_string(),
                },
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
    engine_addr: &str,
    same_host: Option<&SameHostEndpoint>,
    fresh: bool,
) -> Result<(Destination, bool), String> {
    let mut fell_back = false;
    if let Some(end) = same_host
        && core.transport.shares_host(&end.host)
    {
        match route(core, peers, Via::SameHost, &end.addr, fresh).await {
            Ok(d) => return Ok((d, false)),
            // Same host by name, yet not reachable there (another container, say): the main transport.
            Err(_) => fell_back = true,
        }
    }
    Ok((
        route(core, peers, Via::Main, engine_addr, fresh).await?,
        fell_back,
    ))
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

/// A consumer's connection to one producer's control server.
#[derive(Debug)]
pub(crate) struct ControlClient {
    addr: SocketAddr,
    /// Longest a call may take (connect, ask, answer).
    timeout: std::time::Duration,
    conn: tokio::sync::Mutex<
        Option<(
            BufReader<tokio::net::tcp::OwnedReadHalf>,
            tokio::net::tcp::OwnedWriteHalf,
        )>,
    >,
}

impl ControlClient {
    pub(crate) fn new(addr: SocketAddr, timeout: std::time::Duration) -> ControlClient {
        ControlClient {
            addr,
            timeout,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    fn err(&self, message: impl Into<String>) -> ConnectorError {
        ConnectorError::Control {
            peer: self.addr.to_string(),
            message: message.into(),
        }
    }

    async fn call(&self, req: &Request) -> Result<Reply, ConnectorError> {
        match tokio::time::timeout(self.timeout, self.call_now(req)).await {
            Ok(r) => r,
            Err(_) => {
                // The connection may hold half an answer: start afresh next time.
                if let Ok(mut guard) = self.conn.try_lock() {
                    *guard = None;
                }
                Err(self.err(format!("no answer within {:?}", self.timeout)))
            }
        }
    }

    async fn call_now(&self, req: &Request) -> Result<Reply, ConnectorError> {
        let mut guard = self.conn.lock().await;
        if guard.is_none() {
            let s = TcpStream::connect(self.addr)
                .await
                .map_err(|e| self.err(format!("cannot connect: {e}")))?;
            let _ = s.set_nodelay(true);
            let (r, w) = s.into_split();
            *guard = Some((BufReader::new(r), w));
        }
        let (read, write) = guard.as_mut().expect("connected above");
        let mut out = serde_json::to_vec(req).expect("requests serialise");
        out.push(b'\n');
        let mut line = Vec::new();
        let io = async {
            write.write_all(&out).await?;
            read.take(MAX_LINE).read_until(b'\n', &mut line).await
        };
        match io.await {
            Ok(n) if n > 0 && line.last() == Some(&b'\n') => {}
            other => {
                *guard = None; // reconnect next time
                return Err(self.err(format!("connection lost: {other:?}")));
            }
        }
        let reply: Reply =
            serde_json::from_slice(&line).map_err(|e| self.err(format!("bad reply: {e}")))?;
        if let Reply::Error { message } = reply {
            return Err(self.err(message));
        }
        Ok(reply)
    }

    pub(crate) async fn lookup(
        &self,
        keys: &[ScopedKey],
        tp: RankKv,
    ) -> Result<usize, ConnectorError> {
        let Some(first) = keys.first() else {
            return Ok(0);
        };
        match self
            .call(&Request::Lookup {
                ns: first.ns.0,
                keys: hex_keys(keys),
                tp,
            })
            .await?
        {
            Reply::Found { blocks } => Ok(blocks.min(keys.len())),
            other => Err(self.err(format!("unexpected reply {other:?}"))),
        }
    }

    pub(crate) async fn load(
        &self,
        keys: &[ScopedKey],
        to: Endpoints,
        blocks: &[u32],
        class: TrafficClass,
        request: u64,
        tp: RankKv,
    ) -> Result<(Option<PlaneSession>, usize), ConnectorError> {
        let Some(first) = keys.first() else {
            return Ok((None, 0));
        };
        match self
            .call(&Request::Load {
                ns: first.ns.0,
                keys: hex_keys(keys),
                engine_addr: to.main.to_string(),
                blocks: blocks.to_vec(),
                class: class_code(class),
                request,
                tp,
                same_host: to.same_host,
            })
            .await?
        {
            Reply::Started {
                session,
                served,
                via,
            } => Ok((
                session.map(|s| PlaneSession {
                    via,
                    id: SessionId(s),
                }),
                served.min(keys.len()),
            )),
            other => Err(self.err(format!("unexpected reply {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every JSON example in `docs/CONTROL.md` is a request or reply this code reads, and writes back the
    /// same.
    #[test]
    fn the_documents_examples_are_what_the_code_reads_and_writes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CONTROL.md");
        let doc = std::fs::read_to_string(path).expect("docs/CONTROL.md");
        let (mut requests, mut replies, mut inside) = (0, 0, false);
        for line in doc.lines() {
            match line.trim() {
                "```json" => inside = true,
                "```" => inside = false,
                example if inside => {
                    let written: serde_json::Value = serde_json::from_str(example).unwrap();
                    let again = if let Ok(r) = serde_json::from_str::<Request>(example) {
                        requests += 1;
                        serde_json::to_value(r).unwrap()
                    } else {
                        let r: Reply = serde_json::from_str(example).unwrap_or_else(|e| {
                            panic!("{example}: neither request nor reply: {e}")
                        });
                        replies += 1;
                        serde_json::to_value(r).unwrap()
                    };
                    assert_eq!(again, written, "{example}");
                }
                _ => {}
            }
        }
        assert_eq!(
            (requests, replies),
            (3, 3),
            "the examples were not all found"
        );
    }

    #[test]
    fn a_reply_without_via_is_main_and_a_load_without_same_host_has_none() {
        let r: Reply =
            serde_json::from_str(r#"{"reply":"started","session":1,"served":2}"#).unwrap();
        assert!(matches!(r, Reply::Started { via: Via::Main, .. }));
        let load = r#"{"op":"load","ns":1,"keys":[],"engine_addr":"a","blocks":[],"class":2,"request":0,"tp":{"rank":0,"size":1,"mla":false}}"#;
        let r: Request = serde_json::from_str(load).unwrap();
        assert!(matches!(
            r,
            Request::Load {
                same_host: None,
                ..
            }
        ));
    }
}
