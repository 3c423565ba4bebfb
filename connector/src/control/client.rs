//! The consumer's side of the control channel: one connection to a producer's control server, asking
//! lookups and loads.

use std::net::SocketAddr;

use tokio::io::BufReader;
use tokio::net::TcpStream;
use transfer_engine::{SessionId, TrafficClass};

use super::auth::{self, ControlIdentity};
use super::frame::{self, FrameError};
use super::rechecked::RecheckedRead;
use super::{ErrorKind, Reply, Request, class_code, hashes};
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
    /// What it says of itself in each connection's handshake.
    identity: ControlIdentity,
    conn: tokio::sync::Mutex<Option<(BufReader<RecheckedRead>, tokio::net::tcp::OwnedWriteHalf)>>,
}

impl ControlClient {
    pub(crate) fn new(
        addr: SocketAddr,
        timeout: std::time::Duration,
        identity: ControlIdentity,
    ) -> ControlClient {
        ControlClient {
            addr,
            timeout,
            identity,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    fn err(&self, message: impl Into<String>) -> ConnectorError {
        ConnectorError::Control {
            peer: self.addr.to_string(),
            message: message.into(),
        }
    }

    async fn call(&self, req: &Request, keys: &[ScopedKey]) -> Result<Reply, ConnectorError> {
        match tokio::time::timeout(self.timeout, self.call_now(req, keys)).await {
            Ok(r) => r,
            // The call's connection went with it (see `call_now`): the next one connects afresh.
            Err(_) => Err(self.err(format!("no answer within {:?}", self.timeout))),
        }
    }

    async fn call_now(&self, req: &Request, keys: &[ScopedKey]) -> Result<Reply, ConnectorError> {
        let mut guard = self.conn.lock().await;
        // The connection is taken out while it is used and put back only after a whole answer, so a
        // call cancelled half-way (its caller gave up) leaves none holding half an answer behind.
        let (mut read, mut write) = match guard.take() {
            Some(conn) => conn,
            None => {
                let s = TcpStream::connect(self.addr)
                    .await
                    .map_err(|e| self.err(format!("cannot connect: {e}")))?;
                let _ = s.set_nodelay(true);
                let (r, w) = s.into_split();
                let (mut r, mut w) = (BufReader::new(RecheckedRead::new(r)), w);
                auth::consumer(&mut r, &mut w, &self.identity)
                    .await
                    .map_err(|e| self.err(e))?;
                (r, w)
            }
        };
        let io = async {
            frame::write(&mut write, req, &hashes(keys))
                .await
                .map_err(|e| FrameError::Closed(e.to_string()))?;
            frame::read(&mut read).await
        };
        let answer = match io.await {
            Ok(Some(answer)) => answer,
            Ok(None) => return Err(self.err("connection lost: closed by the producer")),
            Err(e) => return Err(self.err(e.to_string())),
        };
        *guard = Some((read, write));
        let reply: Reply = answer.head().map_err(|e| self.err(e))?;
        match reply {
            Reply::Error {
                message,
                kind: Some(ErrorKind::Pairing),
            } => Err(ConnectorError::TensorParallel(format!(
                "producer at {}: {message}",
                self.addr
            ))),
            Reply::Error {
                message,
                kind: None,
            } => Err(self.err(message)),
            reply => Ok(reply),
        }
    }

    /// How many leading blocks of `keys` the producer can serve (stored whole only, with `whole`), and
    /// how many of those only its disk tier holds.
    pub(crate) async fn lookup(
        &self,
        keys: &[ScopedKey],
        tp: RankKv,
        whole: bool,
    ) -> Result<(usize, usize), ConnectorError> {
        let Some(first) = keys.first() else {
            return Ok((0, 0));
        };
        match self
            .call(
                &Request::Lookup {
                    ns: first.ns.0,
                    tp,
                    whole,
                },
                keys,
            )
            .await?
        {
            Reply::Found { blocks, disk } => {
                let blocks = blocks.min(keys.len());
                Ok((blocks, disk.min(blocks)))
            }
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
            .call(
                &Request::Load {
                    ns: first.ns.0,
                    engine_addr: to.main.to_string(),
                    blocks: blocks.to_vec(),
                    class: class_code(class),
                    request,
                    tp,
                    same_host: to.same_host,
                },
                keys,
            )
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
