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

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::TransportError;
pub use crate::node::handshake::auth_mac;
use crate::node::handshake::{Mismatch, verify_mac};

mod message;

pub use message::{Hello, Message, NO_TOKEN, PROTOCOL_VERSION, Segment, TOKEN_LEN};
use message::{MAC_LEN, MAX_MESSAGE};

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

/// Writes one message.
pub async fn send(stream: &mut TcpStream, msg: &Message) -> Result<(), TransportError> {
    stream.write_all(&msg.encode()).await.map_err(io)
}

/// A socket error of the handshake.
fn io(e: std::io::Error) -> TransportError {
    TransportError::io("tcp", &e)
}

/// A handshake message the peer should not have sent.
fn broken(message: String) -> TransportError {
    TransportError::protocol("tcp", message)
}

/// Reads one message.
pub async fn recv(stream: &mut TcpStream) -> Result<Message, TransportError> {
    let body = recv_body(stream).await?;
    Message::decode(&body).map_err(broken)
}

/// Reads one message's body, undecoded. The buffer grows as bytes arrive, so a peer that declares a
/// long message and sends little of it holds little memory.
pub(crate) async fn recv_body(stream: &mut TcpStream) -> Result<Vec<u8>, TransportError> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.map_err(io)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(broken(format!(
            "handshake message of {len} bytes is larger than {MAX_MESSAGE}: the peer does not speak this protocol"
        )));
    }
    let mut body = Vec::new();
    (&mut *stream)
        .take(len as u64)
        .read_to_end(&mut body)
        .await
        .map_err(io)?;
    if body.len() < len {
        return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(body)
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
) -> Result<Accepted, TransportError> {
    let run = async {
        send(
            stream,
            &Message::Hello(Box::new(hello.clone()), [0; MAC_LEN]),
        )
        .await?;
        let (peer, mac) = match recv(stream).await? {
            Message::Hello(peer, mac) => (peer, mac),
            Message::Reject(reason) => {
                return Err(TransportError::Refused(reason));
            }
            other => return Err(unexpected(&other)),
        };
        let mut problem = hello.mismatch(&peer);
        if let Some(expected) = expect_engine.filter(|e| problem.is_none() && *e != peer.engine_id)
        {
            problem = Some(Mismatch::UnexpectedEngine {
                expected,
                found: peer.engine_id,
            });
        }
        let covered = transcript(hello, &peer);
        if problem.is_none() && !verify_mac(secret, "acceptor", &covered, &mac) {
            problem = Some(Mismatch::Authentication { role: "acceptor" });
        }
        if let Some(mismatch) = problem {
            let _ = send(stream, &Message::Reject(mismatch.to_string())).await;
            return Err(mismatch.into());
        }
        let mac = auth_mac(secret, "dialer", &covered);
        send(stream, &Message::Auth(mac)).await?;
        match recv(stream).await? {
            Message::Welcome(token, segments) => Ok(Accepted {
                peer: *peer,
                token,
                segments,
            }),
            Message::Reject(reason) => Err(TransportError::Refused(reason)),
            other => Err(unexpected(&other)),
        }
    };
    tokio::time::timeout(limit, run)
        .await
        .map_err(|_| TransportError::Timeout {
            what: "the handshake".into(),
            waited: limit,
        })?
}

/// The acceptor's side, part one: checks the dialer's first message (`first`, a body read by
/// [`recv_body`]) and answers with our hello. Returns the dialer's hello and the transcript its Auth
/// must cover. On a mismatch the reason is sent to the dialer and returned.
pub(crate) async fn answer_hello(
    stream: &mut TcpStream,
    first: &[u8],
    hello: &Hello,
    secret: Option<&[u8]>,
) -> Result<(Hello, Vec<u8>), TransportError> {
    let peer = match Message::decode(first) {
        Ok(Message::Hello(peer, _)) => peer,
        decoded => {
            let err = decoded.map_or_else(broken, |other| unexpected(&other));
            let _ = send(stream, &Message::Reject(err.to_string())).await;
            return Err(err);
        }
    };
    if let Some(mismatch) = hello.mismatch(&peer) {
        let _ = send(stream, &Message::Reject(mismatch.to_string())).await;
        return Err(mismatch.into());
    }
    let covered = transcript(&peer, hello);
    let mac = auth_mac(secret, "acceptor", &covered);
    send(stream, &Message::Hello(Box::new(hello.clone()), mac)).await?;
    Ok((*peer, covered))
}

/// The acceptor's side, part two: checks the dialer's Auth (`body`, read by [`recv_body`]) against the
/// transcript. On a failure the reason is sent to the dialer and returned.
pub(crate) async fn check_auth(
    stream: &mut TcpStream,
    body: &[u8],
    covered: &[u8],
    secret: Option<&[u8]>,
) -> Result<(), TransportError> {
    match Message::decode(body).map_err(broken)? {
        Message::Auth(mac) if verify_mac(secret, "dialer", covered, &mac) => Ok(()),
        Message::Auth(_) => {
            let mismatch = Mismatch::Authentication { role: "dialer" };
            let _ = send(stream, &Message::Reject(mismatch.to_string())).await;
            Err(mismatch.into())
        }
        Message::Reject(reason) => Err(TransportError::Refused(reason)),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(msg: &Message) -> TransportError {
    let name = match msg {
        Message::Hello(..) => "Hello",
        Message::Auth(_) => "Auth",
        Message::Welcome(..) => "Welcome",
        Message::Reject(_) => "Reject",
    };
    broken(format!("unexpected {name} message during the handshake"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use transfer_engine::{AccessKey, Dtype, KvLayout, Namespace, RegionHandle, RegionId};

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
    fn a_hello_is_checked_by_its_identity() {
        let a = Hello::new(1, Namespace::default()).unwrap();
        let mut b = Hello::new(2, Namespace::default()).unwrap();
        assert_eq!(a.mismatch(&b), None);
        b.namespace.weight_version = 2;
        assert!(matches!(a.mismatch(&b), Some(Mismatch::Namespace { .. })));
        b.namespace.weight_version = 0;
        b.protocol = 9;
        assert!(matches!(
            a.mismatch(&b),
            Some(Mismatch::Version { theirs: (9, _), .. })
        ));
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
