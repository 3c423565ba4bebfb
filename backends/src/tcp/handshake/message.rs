//! The handshake's messages and their byte layout: a length-prefixed body that starts with a tag; decoding
//! never panics and refuses anything truncated, oversized or unknown.

use transfer_engine::wire::VERSION as WIRE_VERSION;
use transfer_engine::{Dtype, KvLayout, Namespace};

use crate::TransportError;
use crate::codec::{ByteReader, put_bytes, put_named_handle};
use crate::node::handshake::{Identity, Mismatch};

/// Version of the handshake and lane protocol this build speaks.
pub const PROTOCOL_VERSION: u16 = 4;
/// Bytes of a connection group's token.
pub const TOKEN_LEN: usize = 16;
/// The token a peer's first lane presents (it has no group yet).
pub const NO_TOKEN: [u8; TOKEN_LEN] = [0; TOKEN_LEN];
const MAGIC: &[u8; 8] = b"KVTE-LN\0";
pub(super) const MAX_MESSAGE: usize = 64 << 10;
pub(super) use crate::node::handshake::MAC_LEN;

const TAG_HELLO: u8 = 1;
const TAG_AUTH: u8 = 2;
const TAG_WELCOME: u8 = 3;
const TAG_REJECT: u8 = 4;

pub use crate::transport::Segment;

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
    pub fn new(engine_id: u32, namespace: Namespace) -> Result<Self, TransportError> {
        let nonce = crate::node::handshake::fresh::<16>("a nonce").map_err(|message| {
            TransportError::Io {
                backend: "tcp",
                message,
            }
        })?;
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

    /// What this hello says about its node that a peer must agree with.
    #[must_use]
    pub fn identity(&self) -> Identity {
        Identity {
            protocol: self.protocol,
            wire: self.wire,
            engine_id: self.engine_id,
            namespace: self.namespace.clone(),
            authenticated: self.authenticated,
        }
    }

    /// Why `peer` cannot talk to `self`, if it cannot (see [`Identity::mismatch`]).
    #[must_use]
    pub fn mismatch(&self, peer: &Hello) -> Option<Mismatch> {
        self.identity().mismatch(&peer.identity())
    }

    /// Appends the Hello's bytes (what the MACs cover, and the body of a Hello message).
    pub(super) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.protocol.to_le_bytes());
        out.push(self.wire);
        out.extend_from_slice(&self.engine_id.to_le_bytes());
        put_bytes(out, self.namespace.model.as_bytes());
        out.extend_from_slice(&self.namespace.weight_version.to_le_bytes());
        out.extend_from_slice(&self.namespace.block_size.to_le_bytes());
        out.push(self.namespace.dtype.code());
        put_bytes(out, self.listen.as_deref().unwrap_or("").as_bytes());
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

    fn decode(r: &mut ByteReader<'_>) -> Result<Self, String> {
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
                    put_named_handle(&mut out, &s.name, &s.handle);
                }
            }
            Message::Reject(reason) => {
                out.push(TAG_REJECT);
                put_bytes(&mut out, reason.as_bytes());
            }
        }
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_le_bytes());
        out
    }

    /// Decodes a message body (without its length prefix).
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let mut r = ByteReader::new(body, "handshake message");
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
                    let (name, handle) = r.named_handle()?;
                    segments.push(Segment { name, handle });
                }
                Message::Welcome(token, segments)
            }
            TAG_REJECT => Message::Reject(r.str()?),
            tag => return Err(format!("unknown handshake message {tag}")),
        };
        if r.remaining() > 0 {
            return Err(format!(
                "{} unexpected bytes after a handshake message",
                r.remaining()
            ));
        }
        Ok(msg)
    }
}

/// What both MACs cover: the dialer's and the acceptor's Hello, byte for byte as sent (nonces, engine
/// ids, namespace, listening address, the region asked for and the group token), so that nothing a peer
fn put_layout(out: &mut Vec<u8>, l: &KvLayout) {
    l.encode_into(out);
}

fn get_layout(r: &mut ByteReader<'_>) -> Result<KvLayout, String> {
    let layout = KvLayout::decode_from(r.take(KvLayout::ENCODED_LEN)?)
        .ok_or("unknown dtype or KV kind code")?;
    layout.validate().map_err(|e| e.to_string())?;
    Ok(layout)
}
