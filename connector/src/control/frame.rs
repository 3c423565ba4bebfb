//! The control channel's frames (protocol version [`VERSION`]): a version byte, a small JSON head (what a
//! request or reply says), and the keys it names as raw 32-byte hashes, in prompt order.
//!
//! ```text
//! | version u8 = 2 | J: u32 LE | head: J bytes of JSON | K: u32 LE | keys: K bytes (K = 32 x keys) |
//! ```
//! A peer of protocol 1 (JSON lines, keys in hex) starts with `{`: it is told, in its own protocol, to
//! upgrade, and the connection ends.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::keys::BlockHash;

/// The control protocol version this build speaks (1: JSON lines with hex keys; 2: these frames).
pub const VERSION: u8 = 3;
/// Longest head accepted (1 MiB).
pub const MAX_HEAD: u32 = 1 << 20;
/// Longest key part accepted (16 MiB: 524,288 keys, a prompt of 8 million tokens in 16-token blocks).
pub const MAX_KEY_BYTES: u32 = 16 << 20;
/// Bytes of one key.
const KEY: usize = 32;

/// Why a frame could not be read.
#[derive(Debug)]
pub(crate) enum FrameError {
    /// The connection ended (between frames or inside one) or failed.
    Closed(String),
    /// The peer speaks protocol 1 (its first byte is `{`).
    Version1,
    /// The peer speaks another version.
    Version(u8),
    /// A part is longer than this side accepts, or the key part is not whole keys.
    Malformed(String),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed(why) => write!(f, "connection lost: {why}"),
            FrameError::Version1 => write!(
                f,
                "the peer speaks control protocol 1 (JSON lines), this build {VERSION}: run the same \
                 kv-transfer release on both sides"
            ),
            FrameError::Version(v) => write!(
                f,
                "the peer speaks control protocol {v}, this build {VERSION}: run the same kv-transfer \
                 release on both sides"
            ),
            FrameError::Malformed(why) => write!(f, "malformed control frame: {why}"),
        }
    }
}

/// One frame as read: its head, still JSON, and its keys.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) head: Vec<u8>,
    pub(crate) keys: Vec<BlockHash>,
}

impl Frame {
    /// The head as `T`; the error says what is wrong with it.
    pub(crate) fn head<T: DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_slice(&self.head).map_err(|e| format!("malformed control head: {e}"))
    }
}

/// The bytes of a frame of `head` and `keys`.
pub(crate) fn encode(head: &impl Serialize, keys: &[BlockHash]) -> Vec<u8> {
    encode_raw(&serde_json::to_vec(head).expect("heads serialise"), keys)
}

/// The bytes of a frame of a head already serialised (`json`) and `keys`.
fn encode_raw(json: &[u8], keys: &[BlockHash]) -> Vec<u8> {
    let mut out = Vec::with_capacity(9 + json.len() + keys.len() * KEY);
    out.push(VERSION);
    out.extend_from_slice(&u32::try_from(json.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(json);
    out.extend_from_slice(
        &u32::try_from(keys.len() * KEY)
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    for k in keys {
        out.extend_from_slice(&k.0);
    }
    out
}

/// Writes one frame.
pub(crate) async fn write(
    w: &mut (impl AsyncWrite + Unpin),
    head: &impl Serialize,
    keys: &[BlockHash],
) -> std::io::Result<()> {
    w.write_all(&encode(head, keys)).await
}

/// Writes one frame whose head is serialised already (a handshake MACs those bytes).
pub(crate) async fn write_raw(
    w: &mut (impl AsyncWrite + Unpin),
    json: &[u8],
    keys: &[BlockHash],
) -> std::io::Result<()> {
    w.write_all(&encode_raw(json, keys)).await
}

/// Reads one frame; `Ok(None)` when the connection ended cleanly between frames.
pub(crate) async fn read(r: &mut (impl AsyncRead + Unpin)) -> Result<Option<Frame>, FrameError> {
    let closed = |e: std::io::Error| FrameError::Closed(e.to_string());
    let mut version = [0u8; 1];
    match r.read(&mut version).await {
        Ok(0) => return Ok(None),
        Ok(_) => {}
        Err(e) => return Err(closed(e)),
    }
    match version[0] {
        VERSION => {}
        b'{' => return Err(FrameError::Version1),
        v => return Err(FrameError::Version(v)),
    }
    let head = read_part(r, MAX_HEAD, "head").await?;
    let keys = read_part(r, MAX_KEY_BYTES, "key part").await?;
    if keys.len() % KEY != 0 {
        return Err(FrameError::Malformed(format!(
            "a key part of {} bytes is not whole 32-byte keys",
            keys.len()
        )));
    }
    let keys = keys
        .chunks_exact(KEY)
        .map(|c| BlockHash(c.try_into().expect("chunks of 32")))
        .collect();
    Ok(Some(Frame { head, keys }))
}

/// The frame that `bytes` holds, whole and nothing after it (a frame kept in memory: the metadata a
/// scheduler hands its workers).
pub(crate) fn decode(bytes: &[u8]) -> Result<Frame, FrameError> {
    use std::task::{Context, Poll, Waker};
    let mut rest = bytes;
    let result = {
        let read = std::pin::pin!(read(&mut rest));
        // Reading from memory never waits.
        match std::future::Future::poll(read, &mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => result,
            Poll::Pending => return Err(FrameError::Closed("a frame in memory waited".into())),
        }
    };
    match result? {
        Some(frame) if rest.is_empty() => Ok(frame),
        Some(_) => Err(FrameError::Malformed(format!(
            "{} bytes after the frame",
            rest.len()
        ))),
        None => Err(FrameError::Closed("no frame".into())),
    }
}

/// A length-prefixed part of at most `max` bytes. The buffer grows as bytes arrive, so a peer that
/// declares a long part and sends little of it holds little memory.
async fn read_part(
    r: &mut (impl AsyncRead + Unpin),
    max: u32,
    what: &str,
) -> Result<Vec<u8>, FrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)
        .await
        .map_err(|e| FrameError::Closed(e.to_string()))?;
    let len = u32::from_le_bytes(len);
    if len > max {
        return Err(FrameError::Malformed(format!(
            "a {what} of {len} bytes is longer than the {max} accepted"
        )));
    }
    let mut part = Vec::new();
    r.take(u64::from(len))
        .read_to_end(&mut part)
        .await
        .map_err(|e| FrameError::Closed(e.to_string()))?;
    if part.len() < len as usize {
        return Err(FrameError::Closed(format!("inside a {what}")));
    }
    Ok(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn frames_round_trip_and_bad_ones_are_refused() {
        let keys = vec![BlockHash([7; 32]), BlockHash([9; 32])];
        let bytes = encode(&serde_json::json!({"op": "lookup"}), &keys);
        assert_eq!(bytes.len(), 1 + 4 + 15 + 4 + 64);
        let frame = block_on(read(&mut &bytes[..])).unwrap().unwrap();
        assert_eq!(frame.keys, keys);
        assert_eq!(frame.head::<serde_json::Value>().unwrap()["op"], "lookup");
        // Cut anywhere: never a frame, never a panic.
        for cut in 1..bytes.len() {
            assert!(block_on(read(&mut &bytes[..cut])).is_err(), "cut at {cut}");
        }
        assert!(block_on(read(&mut &b""[..])).unwrap().is_none());
        assert_eq!(decode(&bytes).unwrap().keys, keys);
        assert!(decode(&[bytes.clone(), vec![0]].concat()).is_err());
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(matches!(
            block_on(read(&mut &b"{\"op\":\"lookup\"}\n"[..])),
            Err(FrameError::Version1)
        ));
        assert!(matches!(
            block_on(read(&mut &[4u8, 0, 0][..])),
            Err(FrameError::Version(4))
        ));
        let mut long = vec![VERSION];
        long.extend_from_slice(&(MAX_HEAD + 1).to_le_bytes());
        assert!(matches!(
            block_on(read(&mut &long[..])),
            Err(FrameError::Malformed(_))
        ));
        let mut ragged = vec![VERSION, 2, 0, 0, 0, b'{', b'}'];
        ragged.extend_from_slice(&5u32.to_le_bytes());
        ragged.extend_from_slice(&[0; 5]);
        assert!(matches!(
            block_on(read(&mut &ragged[..])),
            Err(FrameError::Malformed(_))
        ));
    }
}
