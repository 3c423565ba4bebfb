//! The control channel between a consumer and a producer over TCP: lookups and load requests as JSON
//! lines on a connection of their own (the KV itself travels on the transfer engine's lanes).
//!
//! ```text
//! consumer                                        producer
//!   {"op":"lookup","ns":..,"keys":[hex..],"tp":{"rank":0,"size":1,"mla":false}}     ->
//!                                              <-  {"reply":"found","blocks":n}
//!   {"op":"load","ns":..,"keys":[..],"engine_addr":"ip:port","blocks":[..],"class":1,"request":r,"tp":{..}} ->
//!                                              <-  {"reply":"started","session":s,"served":n}
//! ```
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
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub(crate) enum Reply {
    Found { blocks: usize },
    Started { session: Option<u64>, served: usize },
    Error { message: String },
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
    let peers: Arc<tokio::sync::Mutex<HashMap<String, (PeerId, RegionHandle)>>> = Arc::default();
    while let Ok((stream, _)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        tokio::spawn(connection(core.clone(), peers.clone(), stream));
    }
}

async fn connection(
    core: Arc<ProducerCore>,
    peers: Arc<tokio::sync::Mutex<HashMap<String, (PeerId, RegionHandle)>>>,
    stream: TcpStream,
) {
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

async fn answer(
    core: &Arc<ProducerCore>,
    peers: &tokio::sync::Mutex<HashMap<String, (PeerId, RegionHandle)>>,
    req: Request,
) -> Reply {
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
            ..
        } => {
            let keys = match parse_keys(ns, &keys) {
                Ok(k) => k,
                Err(message) => return Reply::Error { message },
            };
            let dst = match route(core, peers, &engine_addr, false).await {
                Ok(d) => d,
                Err(message) => return Reply::Error { message },
            };
            let mut started = core.load(&keys, dst.0, &dst.1, &blocks, class_from(class), request);
            if let Err(ConnectorError::Transport(
                TransportError::Unreachable(_) | TransportError::NoRoute { .. },
            )) = started
            {
                // The consumer was found unreachable, or its node forgot this one: reach it afresh
                // (which asks it to answer again) and try once more.
                let dst = match route(core, peers, &engine_addr, true).await {
                    Ok(d) => d,
                    Err(message) => return Reply::Error { message },
                };
                started = core.load(&keys, dst.0, &dst.1, &blocks, class_from(class), request);
            }
            match started {
                Ok(Started { session, served }) => Reply::Started {
                    session: session.map(|s| s.0),
                    served,
                },
                Err(e) => Reply::Error {
                    message: e.to_string(),
                },
            }
        }
    }
}

/// The consumer at `engine_addr` as this producer addresses it: remembered from an earlier load, or
/// (when not remembered, or `fresh`) reached now.
async fn route(
    core: &ProducerCore,
    peers: &tokio::sync::Mutex<HashMap<String, (PeerId, RegionHandle)>>,
    engine_addr: &str,
    fresh: bool,
) -> Result<(PeerId, RegionHandle), String> {
    let mut peers = peers.lock().await;
    if !fresh && let Some(d) = peers.get(engine_addr) {
        return Ok(*d);
    }
    peers.remove(engine_addr);
    let d = reach(core, engine_addr).await?;
    if peers.len() >= MAX_CONSUMERS {
        peers.clear(); // bounded: forgotten consumers are reached again
    }
    peers.insert(engine_addr.to_owned(), d);
    Ok(d)
}

/// Connects the producer's node to a consumer's and finds its KV pool.
async fn reach(core: &ProducerCore, addr: &str) -> Result<(PeerId, RegionHandle), String> {
    let addr: PeerAddress = addr.parse().map_err(|e: BadAddress| e.to_string())?;
    let info = core
        .transport
        .connect(&addr)
        .await
        .map_err(|e| e.to_string())?;
    let dst = *info
        .segment(KV_SEGMENT)
        .ok_or("the consumer offers no KV pool (register_kv_caches first)")?;
    Ok((info.peer, dst))
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
        engine_addr: &PeerAddress,
        blocks: &[u32],
        class: TrafficClass,
        request: u64,
        tp: RankKv,
    ) -> Result<(Option<SessionId>, usize), ConnectorError> {
        let Some(first) = keys.first() else {
            return Ok((None, 0));
        };
        match self
            .call(&Request::Load {
                ns: first.ns.0,
                keys: hex_keys(keys),
                engine_addr: engine_addr.to_string(),
                blocks: blocks.to_vec(),
                class: class_code(class),
                request,
                tp,
            })
            .await?
        {
            Reply::Started { session, served } => {
                Ok((session.map(SessionId), served.min(keys.len())))
            }
            other => Err(self.err(format!("unexpected reply {other:?}"))),
        }
    }
}
