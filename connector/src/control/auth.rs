//! The control channel's handshake, the first frames of every connection: the consumer's Hello (its
//! lane namespace, the engines it receives on, a fresh nonce), the producer's Challenge (its own nonce
//! and a MAC), the consumer's Auth (its MAC), the producer's Welcome. The MACs are the lanes' HMAC-SHA256
//! ([`backends::node::handshake::auth_mac`]) under the shared secret, over the Hello's head byte for byte
//! and both nonces, with a role label each way, so each side proves it holds the secret, a recorded
//! handshake cannot be replayed (the other side's nonce is new), and nothing the Hello says can be
//! changed on the way. Without a secret on either side the MACs are zeros and only the namespace and the
//! engines are told; one side with a secret and the other without is refused, as on the lanes.
//!
//! ```text
//! consumer                                                        producer
//!   {"op":"hello","ns":n,"engines":[e],"authenticated":true} + [nonce_c]  ->
//!                             <-  {"reply":"challenge","authenticated":true} + [nonce_p, mac_p]
//!   {"op":"auth"} + [mac_c]                                               ->
//!                             <-  {"reply":"welcome"}
//! ```

use backends::node::handshake::{MAC_LEN, auth_mac, verify_mac};
use backends::tcp::Secret;
use tokio::io::{AsyncRead, AsyncWrite};

use super::frame::{self, Frame};
use super::{Reply, Request};
use crate::keys::BlockHash;

/// Role labels of the two MACs.
const CONSUMER: &str = "control-consumer";
const PRODUCER: &str = "control-producer";

/// What one side of a control connection says of itself and checks of the other.
#[derive(Debug, Clone)]
pub(crate) struct ControlIdentity {
    /// The shared secret, if this side authenticates.
    pub(crate) secret: Option<Secret>,
    /// The lane namespace (model, block size, dtype; weight versions are told apart by the keys).
    pub(crate) ns: u64,
    /// The engines a consumer receives loads on (its transports' engine ids); empty for a side that
    /// only asks lookups, or serves.
    pub(crate) engines: Vec<u32>,
}

/// What a producer knows of the consumer at the other end once its handshake passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Consumer {
    /// The engines it said it receives on: a load may go to these only.
    pub(crate) engines: Vec<u32>,
}

fn secret(id: &ControlIdentity) -> Option<&[u8]> {
    id.secret.as_ref().map(Secret::as_bytes)
}

fn nonce() -> Result<BlockHash, String> {
    backends::node::handshake::fresh::<MAC_LEN>("a control nonce").map(BlockHash)
}

fn transcript(hello_head: &[u8], nonce_c: &BlockHash, nonce_p: &BlockHash) -> Vec<u8> {
    let mut t = Vec::with_capacity(hello_head.len() + 2 * MAC_LEN);
    t.extend_from_slice(hello_head);
    t.extend_from_slice(&nonce_c.0);
    t.extend_from_slice(&nonce_p.0);
    t
}

/// Why the two sides do not agree on authentication, if they do not (whether the producer, and the
/// consumer, have a secret).
fn secret_mismatch(producer: bool, consumer: bool) -> Option<String> {
    (producer != consumer).then(|| {
        let (has, lacks) = if producer {
            ("producer", "consumer")
        } else {
            ("consumer", "producer")
        };
        format!(
            "control channel: the {has} authenticates with a shared secret and the {lacks} has none: \
             configure the same secret on both"
        )
    })
}

async fn read_frame(r: &mut (impl AsyncRead + Unpin), what: &str) -> Result<Frame, String> {
    match frame::read(r).await {
        Ok(Some(f)) => Ok(f),
        Ok(None) => Err(format!("the connection closed before the {what}")),
        Err(e) => Err(e.to_string()),
    }
}

/// The reply head of a frame, with an error reply turned into its message.
fn reply_of(f: &Frame) -> Result<Reply, String> {
    match f.head::<Reply>()? {
        Reply::Error { message, .. } => Err(message),
        reply => Ok(reply),
    }
}

/// The consumer's half: says who it is and checks the producer holds the same secret.
pub(crate) async fn consumer(
    r: &mut (impl AsyncRead + Unpin),
    w: &mut (impl AsyncWrite + Unpin),
    id: &ControlIdentity,
) -> Result<(), String> {
    let hello = Request::Hello {
        ns: id.ns,
        engines: id.engines.clone(),
        authenticated: id.secret.is_some(),
    };
    let head = serde_json::to_vec(&hello).expect("requests serialise");
    let nonce_c = nonce()?;
    frame::write_raw(w, &head, &[nonce_c])
        .await
        .map_err(|e| e.to_string())?;
    let challenge = read_frame(r, "producer's challenge").await?;
    let Reply::Challenge { authenticated } = reply_of(&challenge)? else {
        return Err("the producer answered the hello with something else than a challenge".into());
    };
    if let Some(why) = secret_mismatch(authenticated, id.secret.is_some()) {
        return Err(why);
    }
    let [nonce_p, mac_p] = challenge.keys[..] else {
        return Err("the producer's challenge is not a nonce and a MAC".into());
    };
    let t = transcript(&head, &nonce_c, &nonce_p);
    if !verify_mac(secret(id), PRODUCER, &t, &mac_p.0) {
        return Err(
            "the producer failed shared-secret authentication: configure the same secret on both \
             sides"
                .into(),
        );
    }
    let mac_c = BlockHash(auth_mac(secret(id), CONSUMER, &t));
    frame::write(w, &Request::Auth, &[mac_c])
        .await
        .map_err(|e| e.to_string())?;
    match reply_of(&read_frame(r, "producer's welcome").await?)? {
        Reply::Welcome => Ok(()),
        other => Err(format!(
            "the producer answered the auth with {other:?}, not a welcome"
        )),
    }
}

/// The producer's half, from the connection's first frame (`hello`): checks the consumer's namespace
/// and secret. A refusal is told to the consumer (an error reply) and returned; the caller closes the
/// connection.
pub(crate) async fn producer(
    hello: Frame,
    r: &mut (impl AsyncRead + Unpin),
    w: &mut (impl AsyncWrite + Unpin),
    id: &ControlIdentity,
) -> Result<Consumer, String> {
    let outcome = check_consumer(hello, r, w, id).await;
    if let Err(why) = &outcome {
        let _ = frame::write(w, &Reply::error(why.clone()), &[]).await;
    }
    outcome
}

async fn check_consumer(
    hello: Frame,
    r: &mut (impl AsyncRead + Unpin),
    w: &mut (impl AsyncWrite + Unpin),
    id: &ControlIdentity,
) -> Result<Consumer, String> {
    let Request::Hello {
        ns,
        engines,
        authenticated,
    } = hello.head::<Request>()?
    else {
        return Err("control channel: the first frame must be a hello (control protocol 3)".into());
    };
    if ns != id.ns {
        return Err(format!(
            "control channel: KV namespace mismatch (the consumer's lanes serve {ns:#x}, this \
             producer's {:#x}): connect instances of the same model, block size and dtype",
            id.ns
        ));
    }
    if let Some(why) = secret_mismatch(id.secret.is_some(), authenticated) {
        return Err(why);
    }
    let [nonce_c] = hello.keys[..] else {
        return Err("the hello carries no nonce".into());
    };
    let nonce_p = nonce()?;
    let t = transcript(&hello.head, &nonce_c, &nonce_p);
    let mac_p = BlockHash(auth_mac(secret(id), PRODUCER, &t));
    frame::write(
        w,
        &Reply::Challenge {
            authenticated: id.secret.is_some(),
        },
        &[nonce_p, mac_p],
    )
    .await
    .map_err(|e| e.to_string())?;
    let auth = read_frame(r, "consumer's auth").await?;
    let (Ok(Request::Auth), [mac_c]) = (auth.head::<Request>(), &auth.keys[..]) else {
        return Err("control channel: the challenge must be answered with an auth".into());
    };
    if !verify_mac(secret(id), CONSUMER, &t, &mac_c.0) {
        return Err(
            "control channel: the consumer failed shared-secret authentication: configure the same \
             secret on both sides"
                .into(),
        );
    }
    frame::write(w, &Reply::Welcome, &[])
        .await
        .map_err(|e| e.to_string())?;
    Ok(Consumer { engines })
}

#[cfg(test)]
#[path = "auth_tests.rs"]
mod tests;
