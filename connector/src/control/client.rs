//! The consumer's side of the control channel: one connection to a producer's control server, asking
//! lookups and loads.

use std::net::SocketAddr;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use transfer_engine::{SessionId, TrafficClass};

use super::{MAX_LINE, Reply, Request, class_code, hex_keys};
use crate::data_plane::{Endpoints, PlaneSession};
use crate::error::ConnectorError;
use crate::keys::ScopedKey;
use crate::tp::RankKv;

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
