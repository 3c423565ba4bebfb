//! The lane handshake: protocol version, engine identity, KV namespace, optional shared-secret
//! authentication, then the segments the accepting node offers.
//!
//! ```text
//! dialer                                   acceptor
//!   Hello(version, engine, namespace, nonce_d, ...)  ->
//!                                          <-  Hello(..., nonce_a) + HMAC(secret, "acceptor" nonce_d nonce_a)
//!   Auth(HMAC(secret, "dialer" nonce_a nonce_d))     ->
//!                                          <-  Welcome(segments)
//! ```
//! Either side answers a mismatch with `Reject(reason)` and closes; the other side reports the reason.
//! Messages are length-prefixed (u32 little-endian, at most 64 KiB) and decoding never panics.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use transfer_engine::wire::VERSION as WIRE_VERSION;
use transfer_engine::{AccessKey, Dtype, KvLayout, Namespace, RegionHandle, RegionId};

use super::TcpError;

/// Version of the handshake and lane protocol this build speaks.
pub const PROTOCOL_VERSION: u16 = 3;
/// Bytes of a connection group's token.
pub const TOKEN_LEN: usize = 16;
/// The token a peer's first lane presents (it has no group yet).
pub const NO_TOKEN: [u8; TOKEN_LEN] = [0; TOKEN_LEN];
const MAGIC: &[u8; 8] = b"KVTE-LN\0";
const MAX_MESSAGE: usize = 64 << 10;
const MAC_LEN: usize = 32;

const TAG_HELLO: u8 = 1;
const TAG_AUTH: u8 = 2;
const TAG_WELCOME: u8 = 3;
const TAG_REJECT: u8 = 4;

/// A registered region a node offers to its peers: what a sender needs to address it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Name under which it is offered.
    pub name: String,
    /// The region as registered on its owner (id, access key, length, layout).
    pub handle: RegionHandle,
}

/// What a node says about itself in the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Handshake protocol version.
    pub protocol: u16,
    /// Frame wire-format version.
    pub wire: u8,
    /// The engine id (peers name each other by it; session ids start with it).
    pub engine_id: u32,
    /// The KV namespace served.
    pub namespace: Namespace,
    /// Address the node listens on, if any, so a peer can dial it back.
    pub listen: Option<String>,
    /// Whether this side authenticates with a shared secret.
    pub authenticated: bool,
    /// A KV region the dialer asks the acceptor to provide (offered back as segment `served`).
    pub want: Option<KvLayout>,
    /// Fresh random challenge.
    pub nonce: [u8; 16],
    /// The connection group this lane belongs to: [`NO_TOKEN`] on a peer's first lane, then the token the
    /// acceptor of that first lane issued in its [`Message::Welcome`].
    pub token: [u8; TOKEN_LEN],
}

impl Hello {
    /// A hello of this build for `engine_id` in `namespace`, with a fresh nonce.
    pub fn new(engine_id: u32, namespace: Namespace) -> Result<Self, TcpError> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce)
            .map_err(|e| TcpError::Io(std::io::Error::other(format!("no randomness: {e}"))))?;
        Ok(Self {
            protocol: PROTOCOL_VERSION,
            wire: WIRE_VERSION,
            engine_id,
            namespace,
            listen: None,
            authenticated: false,
            want: None,
            nonce,
            token: NO_TOKEN,
        })
    }

    /// Why `peer` cannot talk to `self`, if it cannot.
    pub fn mismatch(&self, peer: &Hello) -> Option<String> {
        if peer.protocol != PROTOCOL_VERSION || peer.wire != WIRE_VERSION {
            return Some(format!(
                "protocol version {}/{} is not supported (this build speaks {PROTOCOL_VERSION}/{WIRE_VERSION}): \
                 upgrade the older side",
                peer.protocol, peer.wire
            ));
        }
        if peer.engine_id == self.engine_id {
            return Some(format!(
                "both ends have engine id {}: give every engine a distinct engine_id",
                peer.engine_id
            ));
        }
        if peer.namespace != self.namespace {
            return Some(format!(
                "KV namespace mismatch: the peer serves {}, this node {}: connect engines of the same model, \
                 weights and block size",
                peer.namespace, self.namespace
            ));
        }
        if peer.authenticated != self.authenticated {
            return Some(if self.authenticated {
                "this node requires shared-secret authentication and the peer has no secret: configure the same \
                 secret on both sides"
                    .into()
            } else {
                "the peer requires shared-secret authentication and this node has no secret: configure the same \
                 secret on both sides"
                    .into()
            });
        }
        None
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.protocol.to_le_bytes());
        out.push(self.wire);
        out.extend_from_slice(&self.engine_id.to_le_bytes());
        put_str(out, &self.namespace.model);
        out.extend_from_slice(&self.namespace.weight_version.to_le_bytes());
        out.extend_from_slice(&self.namespace.block_size.to_le_bytes());
        out.push(self.namespace.dtype.code());
        put_str(out, self.listen.as_deref().unwrap_or(""));
        out.push(u8::from(self.authenticated));
        match &self.want {
            Some(layout) => {
                out.push(1);
                put_layout(out, layout);
            }
            None => out.push(0),
        }
        out.extend_from_slice(&self.nonce);
        out.extend_from_slice(&self.token);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, String> {
        if r.take(8)? != MAGIC {
            return Err("the peer does not speak the KV transfer lane protocol (bad magic)".into());
        }
        let protocol = r.u16()?;
        let wire = r.u8()?;
        if protocol != PROTOCOL_VERSION || wire != WIRE_VERSION {
            // Later fields may differ between versions: report the version, not a parse error.
            return Ok(Self {
                protocol,
                wire,
                engine_id: 0,
                namespace: Namespace::default(),
                listen: None,
                authenticated: false,
                want: None,
                nonce: [0; 16],
                token: NO_TOKEN,
            });
        }
        let engine_id = r.u32()?;
        let namespace = Namespace {
            model: r.str()?,
            weight_version: r.u64()?,
            block_size: r.u32()?,
            dtype: Dtype::from_code(r.u8()?).ok_or("unknown dtype code in the namespace")?,
        };
        let listen = Some(r.str()?).filter(|s| !s.is_empty());
        let authenticated = r.u8()? != 0;
        let want = match r.u8()? {
            0 => None,
            _ => Some(get_layout(r)?),
        };
        let nonce = r.take(16)?.try_into().map_err(|_| "short nonce")?;
        let token = r.take(TOKEN_LEN)?.try_into().map_err(|_| "short token")?;
        Ok(Self {
            protocol,
            wire,
            engine_id,
            namespace,
            listen,
            authenticated,
            want,
            nonce,
            token,
        })
    }
}

/// A handshake message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Who I am (with the acceptor's MAC over the challenge, or zeros without a secret).
    Hello(Box<Hello>, [u8; MAC_LEN]),
    /// The dialer's MAC over the acceptor's challenge.
    Auth([u8; MAC_LEN]),
    /// Accepted: the token of the connection group the lane joined, and the segments the acceptor offers.
    Welcome([u8; TOKEN_LEN], Vec<Segment>),
    /// Refused, with the reason.
    Reject(String),
}

impl Message {
    /// Encodes the message with its length prefix.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; 4];
        match self {
            Message::Hello(h, mac) => {
                out.push(TAG_HELLO);
                h.encode(&mut out);
                out.extend_from_slice(mac);
            }
            Message::Auth(mac) => {
                out.push(TAG_AUTH);
                out.extend_from_slice(mac);
            }
            Message::Welcome(token, segments) => {
                out.push(TAG_WELCOME);
                out.extend_from_slice(token);
                out.extend_from_slice(&(segments.len() as u16).to_le_bytes());
                for s in segments {
                    put_str(&mut out, &s.name);
                    out.extend_from_slice(&s.handle.id.0.to_le_bytes());
                    out.extend_from_slice(&s.handle.key.0.to_le_bytes());
                    out.extend_from_slice(&s.handle.len.to_le_bytes());
                    match &s.handle.layout {
                        Some(l) => {
                            out.push(1);
                            put_layout(&mut out, l);
                        }
                        None => out.push(0),
                    }
                }
            }
            Message::Reject(reason) => {
                out.push(TAG_REJECT);
                put_str(&mut out, reason);
            }
        }
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_le_bytes());
        out
    }

    /// Decodes a message body (without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut r = Reader(body);
        let msg = match r.u8()? {
            TAG_HELLO => {
                let hello = Hello::decode(&mut r)?;
                if hello.protocol != PROTOCOL_VERSION || hello.wire != WIRE_VERSION {
                    return Ok(Message::Hello(Box::new(hello), [0; MAC_LEN]));
                }
                let mac = r.take(MAC_LEN)?.try_into().map_err(|_| "short mac")?;
                Message::Hello(Box::new(hello), mac)
            }
            TAG_AUTH => Message::Auth(r.take(MAC_LEN)?.try_into().map_err(|_| "short mac")?),
            TAG_WELCOME => {
                let token = r.take(TOKEN_LEN)?.try_into().map_err(|_| "short token")?;
                let n = r.u16()?;
                let mut segments = Vec::with_capacity(usize::from(n).min(256));
                for _ in 0..n {
                    let name = r.str()?;
                    let id = RegionId(r.u32()?);
                    let key = AccessKey(r.u64()?);
                    let len = r.u64()?;
                    let layout = match r.u8()? {
                        0 => None,
                        _ => Some(get_layout(&mut r)?),
                    };
                    segments.push(Segment {
                        name,
                        handle: RegionHandle {
                            id,
                            key,
                            len,
                            layout,
                        },
                    });
                }
                Message::Welcome(token, segments)
            }
            TAG_REJECT => Message::Reject(r.str()?),
            tag => return Err(format!("unknown handshake message {tag}")),
        };
        if !r.0.is_empty() {
            return Err(format!(
                "{} unexpected bytes after a handshake message",
                r.0.len()
            ));
        }
        Ok(msg)
    }
}

/// What both MACs cover: the dialer's and the acceptor's Hello, byte for byte as sent (nonces, engine
/// ids, namespace, listening address, the region asked for and the group token), so that nothing a peer
/// says about itself can be changed on the way without failing authentication.
#[must_use]
pub fn transcript(dialer: &Hello, acceptor: &Hello) -> Vec<u8> {
    let mut out = Vec::new();
    dialer.encode(&mut out);
    acceptor.encode(&mut out);
    out
}

/// HMAC-SHA256 over a role label and the handshake `transcript`; all zeros without a secret.
#[must_use]
pub fn auth_mac(secret: Option<&[u8]>, role: &str, transcript: &[u8]) -> [u8; MAC_LEN] {
    match keyed(secret, role, transcript) {
        Some(mac) => mac.finalize().into_bytes().into(),
        None => [0; MAC_LEN],
    }
}

fn verify_mac(secret: Option<&[u8]>, role: &str, transcript: &[u8], got: &[u8; MAC_LEN]) -> bool {
    keyed(secret, role, transcript).is_none_or(|mac| mac.verify_slice(got).is_ok())
}

fn keyed(secret: Option<&[u8]>, role: &str, transcript: &[u8]) -> Option<Hmac<Sha256>> {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret?).expect("HMAC takes keys of any length");
    mac.update(b"kvte-lane-auth:");
    mac.update(role.as_bytes());
    mac.update(b":");
    mac.update(transcript);
    Some(mac)
}

/// Writes one message.
pub async fn send(stream: &mut TcpStream, msg: &Message) -> Result<(), TcpError> {
    stream.write_all(&msg.encode()).await?;
    Ok(())
}

/// Reads one message.
pub async fn recv(stream: &mut TcpStream) -> Result<Message, TcpError> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(TcpError::Handshake(format!(
            "handshake message of {len} bytes is larger than {MAX_MESSAGE}: the peer does not speak this protocol"
        )));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await?;
    Message::decode(&body).map_err(TcpError::Handshake)
}

/// What the dialing side learns from a completed handshake.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// The acceptor's hello.
    pub peer: Hello,
    /// The token of the connection group the lane joined.
    pub token: [u8; TOKEN_LEN],
    /// The segments it offers.
    pub segments: Vec<Segment>,
}

/// Runs the dialer's side of the handshake on `stream`. `expect_engine` is checked if given.
pub async fn dial(
    stream: &mut TcpStream,
    hello: &Hello,
    secret: Option<&[u8]>,
    expect_engine: Option<u32>,
    limit: Duration,
) -> Result<Accepted, TcpError> {
    let run = async {
        send(
            stream,
            &Message::Hello(Box::new(hello.clone()), [0; MAC_LEN]),
        )
        .await?;
        let (peer, mac) = match recv(stream).await? {
            Message::Hello(peer, mac) => (peer, mac),
            Message::Reject(reason) => {
                return Err(TcpError::Handshake(format!("peer refused: {reason}")));
            }
            other => return Err(unexpected(&other)),
        };
        let mut problem = hello.mismatch(&peer);
        if let Some(want) = expect_engine.filter(|e| problem.is_none() && *e != peer.engine_id) {
            problem = Some(format!(
                "expected engine {want} at this address but engine {} answered: the address is stale",
                peer.engine_id
            ));
        }
        let covered = transcript(hello, &peer);
        if problem.is_none() && !verify_mac(secret, "acceptor", &covered, &mac) {
            problem = Some("the peer failed shared-secret authentication: configure the same secret on both sides".into());
        }
        if let Some(reason) = problem {
            let _ = send(stream, &Message::Reject(reason.clone())).await;
            return Err(TcpError::Handshake(reason));
        }
        let mac = auth_mac(secret, "dialer", &covered);
        send(stream, &Message::Auth(mac)).await?;
        match recv(stream).await? {
            Message::Welcome(token, segments) => Ok(Accepted {
                peer: *peer,
                token,
                segments,
            }),
            Message::Reject(reason) => Err(TcpError::Handshake(format!("peer refused: {reason}"))),
            other => Err(unexpected(&other)),
        }
    };
    tokio::time::timeout(limit, run)
        .await
        .map_err(|_| TcpError::Handshake(format!("no handshake answer within {limit:?}")))?
}

/// The acceptor's side, part one: reads the dialer's hello, checks it and answers with ours.
/// On a mismatch the reason is sent to the dialer and returned.
pub(crate) async fn accept_hello(
    stream: &mut TcpStream,
    hello: &Hello,
    secret: Option<&[u8]>,
) -> Result<Hello, TcpError> {
    let peer = match recv(stream).await {
        Ok(Message::Hello(peer, _)) => peer,
        Ok(other) => {
            let err = unexpected(&other);
            let _ = send(stream, &Message::Reject(err.to_string())).await;
            return Err(err);
        }
        Err(e) => {
            let _ = send(stream, &Message::Reject(e.to_string())).await;
            return Err(e);
        }
    };
    if let Some(reason) = hello.mismatch(&peer) {
        let _ = send(stream, &Message::Reject(reason.clone())).await;
        return Err(TcpError::Handshake(reason));
    }
    let covered = transcript(&peer, hello);
    let mac = auth_mac(secret, "acceptor", &covered);
    send(stream, &Message::Hello(Box::new(hello.clone()), mac)).await?;
    match recv(stream).await? {
        Message::Auth(mac) if verify_mac(secret, "dialer", &covered, &mac) => Ok(*peer),
        Message::Auth(_) => {
            let reason = "the dialer failed shared-secret authentication: configure the same secret on both sides";
            let _ = send(stream, &Message::Reject(reason.into())).await;
            Err(TcpError::Handshake(reason.into()))
        }
        Message::Reject(reason) => Err(TcpError::Handshake(format!("peer refused: {reason}"))),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(msg: &Message) -> TcpError {
    let name = match msg {
        Message::Hello(..) => "Hello",
        Message::Auth(_) => "Auth",
        Message::Welcome(..) => "Welcome",
        Message::Reject(_) => "Reject",
    };
    TcpError::Handshake(format!("unexpected {name} message during the handshake"))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let bytes = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_layout(out: &mut Vec<u8>, l: &KvLayout) {
    l.encode_into(out);
}

fn get_layout(r: &mut Reader<'_>) -> Result<KvLayout, String> {
    let layout = KvLayout::decode_from(r.take(KvLayout::ENCODED_LEN)?).ok_or("unknown dtype")?;
    layout.validate().map_err(|e| e.to_string())?;
    Ok(layout)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("truncated handshake message".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| "short")?,
        ))
    }
    fn str(&mut self) -> Result<String, String> {
        let n = usize::from(self.u16()?);
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "string is not UTF-8".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::Dtype;

    #[test]
    fn messages_round_trip_and_garbage_never_panics() {
        let mut hello = Hello::new(7, Namespace::default()).unwrap();
        hello.listen = Some("127.0.0.1:4000".into());
        hello.want = Some(KvLayout::new(2, 3, 4096, 16, Dtype::Bf16).unwrap());
        hello.token = [5; TOKEN_LEN];
        let msgs = [
            Message::Hello(Box::new(hello), [9; MAC_LEN]),
            Message::Auth([1; MAC_LEN]),
            Message::Welcome(
                [3; TOKEN_LEN],
                vec![Segment {
                    name: "kv".into(),
                    handle: RegionHandle {
                        id: RegionId(4),
                        key: AccessKey(99),
                        len: 10,
                        layout: None,
                    },
                }],
            ),
            Message::Reject("no".into()),
        ];
        for m in msgs {
            let bytes = m.encode();
            assert_eq!(Message::decode(&bytes[4..]), Ok(m.clone()));
            for cut in 0..bytes.len() - 4 {
                let _ = Message::decode(&bytes[4..4 + cut]);
            }
        }
        for seed in 0u32..2000 {
            let junk: Vec<u8> = (0..(seed % 90))
                .map(|i| (seed.wrapping_mul(31) ^ (i * 17)) as u8)
                .collect();
            let _ = Message::decode(&junk);
        }
    }

    #[test]
    fn mismatches_are_explained() {
        let a = Hello::new(1, Namespace::default()).unwrap();
        let mut b = Hello::new(2, Namespace::default()).unwrap();
        assert_eq!(a.mismatch(&b), None);
        b.namespace.weight_version = 2;
        assert!(a.mismatch(&b).unwrap().contains("namespace"));
        b.namespace.weight_version = 0;
        b.namespace.dtype = Dtype::F16;
        assert!(a.mismatch(&b).unwrap().contains("F16"));
        b.namespace.dtype = Dtype::Bf16;
        b.protocol = 9;
        assert!(a.mismatch(&b).unwrap().contains("protocol version 9"));
        b.protocol = PROTOCOL_VERSION;
        b.engine_id = 1;
        assert!(a.mismatch(&b).unwrap().contains("engine id"));
    }

    #[test]
    fn macs_bind_secret_role_and_everything_each_side_said() {
        let d = Hello::new(1, Namespace::default()).unwrap();
        let a = Hello::new(2, Namespace::default()).unwrap();
        let covered = transcript(&d, &a);
        let m = auth_mac(Some(b"s3cret"), "dialer", &covered);
        assert!(verify_mac(Some(b"s3cret"), "dialer", &covered, &m));
        assert!(!verify_mac(Some(b"other"), "dialer", &covered, &m));
        assert!(!verify_mac(Some(b"s3cret"), "acceptor", &covered, &m));
        assert!(!verify_mac(
            Some(b"s3cret"),
            "dialer",
            &transcript(&a, &d),
            &m
        ));
        // An engine id changed on the way no longer verifies.
        let mut forged = d.clone();
        forged.engine_id = 9;
        assert!(!verify_mac(
            Some(b"s3cret"),
            "dialer",
            &transcript(&forged, &a),
            &m
        ));
        assert!(verify_mac(None, "dialer", &covered, &[0; MAC_LEN]));
    }
}
