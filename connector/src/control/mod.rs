//! The control channel between a consumer and a producer over TCP: lookups and load requests in frames
//! of their own ([`frame`]: a JSON head, and the keys as raw 32-byte hashes), on a connection of their
//! own (the KV itself travels on the transfer engine's transport). `docs/CONTROL.md` is the document.
//!
//! ```text
//! consumer                                        producer
//!   lookup {"op":"lookup","ns":..,"tp":{"rank":0,"size":1,"mla":false}} + keys        ->
//!                                              <-  {"reply":"found","blocks":n}
//!   load {"op":"load","ns":..,"engine_addr":"ip:port","blocks":[..],"class":1,"request":r,"tp":{..},
//!    "same_host":{"host":h,"addr":"shm:/path"}} + keys                                 ->
//!                                              <-  {"reply":"started","session":s,"served":n,"via":"same_host"}
//! ```
//! `same_host` (optional) is the consumer's same-host endpoint: a producer whose own same-host transport
//! runs on host `h` sends over it, and over the main transport otherwise (or when it cannot reach that
//! address); `via` says which carries the session (`main` when absent).
//! `tp` is the consumer's tensor-parallel rank and whether its KV is MLA: a producer rank answers only
//! the consumer rank of its own number in an instance of its own size (any rank, for MLA on both sides),
//! and refuses others with an error naming both ([`crate::tp`]).
//! A lookup counts blocks stored whole and blocks being saved now (a load streams their layers as they
//! are saved). A load's reply names the sending session; the consumer waits on it layer by layer. A frame
//! longer than [`frame::MAX_HEAD`] or [`frame::MAX_KEY_BYTES`] ends the connection (memory stays
//! bounded); a malformed head is answered with an error.

mod auth;
mod client;
pub mod frame;
mod rechecked;
mod server;

use policy::NamespaceId;
use serde::{Deserialize, Serialize};
use transfer_engine::TrafficClass;

use crate::data_plane::{SameHostEndpoint, Via};
use crate::keys::{BlockHash, ScopedKey};
use crate::tp::RankKv;

pub(crate) use auth::ControlIdentity;
pub(crate) use client::ControlClient;
pub(crate) use server::serve;

/// The segment name a consumer offers its KV pool under.
pub const KV_SEGMENT: &str = "kv";

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Request {
    /// The consumer's first frame ([`auth`]); its key part is the consumer's nonce.
    Hello {
        ns: u64,
        engines: Vec<u32>,
        authenticated: bool,
    },
    /// The consumer's answer to the challenge; its key part is the consumer's MAC.
    Auth,
    Lookup {
        ns: u64,
        tp: RankKv,
        /// Count blocks stored whole only, not those being saved now (an instance asking its own store).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        whole: bool,
    },
    Load {
        ns: u64,
        engine_addr: String,
        blocks: Vec<u32>,
        class: u8,
        request: u64,
        tp: RankKv,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        same_host: Option<SameHostEndpoint>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub(crate) enum Reply {
    /// The producer's answer to a hello; its key part is the producer's nonce and MAC.
    Challenge { authenticated: bool },
    /// The handshake passed.
    Welcome,
    Found {
        blocks: usize,
        /// Of those, how many only the producer's disk tier holds.
        #[serde(default, skip_serializing_if = "is_zero")]
        disk: usize,
    },
    Started {
        session: Option<u64>,
        served: usize,
        #[serde(default)]
        via: Via,
    },
    Error {
        message: String,
        /// What kind of refusal: `pairing` when the asker's tensor-parallel place cannot be served by
        /// this producer (a configuration mistake on one side), absent otherwise.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kind: Option<ErrorKind>,
    },
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A kind of [`Reply::Error`] the asker acts on differently from a plain failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ErrorKind {
    /// The two instances' tensor-parallel places do not pair (see [`crate::tp`]).
    Pairing,
}

impl Reply {
    /// An error reply saying `message`.
    pub(crate) fn error(message: impl Into<String>) -> Reply {
        Reply::Error {
            message: message.into(),
            kind: None,
        }
    }
}

/// The keys of `ns` a frame carried.
pub(crate) fn scoped_keys(ns: u64, hashes: Vec<BlockHash>) -> Vec<ScopedKey> {
    hashes
        .into_iter()
        .map(|hash| ScopedKey {
            ns: NamespaceId(ns),
            hash,
        })
        .collect()
}

/// The hashes of `keys`, as a frame carries them.
pub(crate) fn hashes(keys: &[ScopedKey]) -> Vec<BlockHash> {
    keys.iter().map(|k| k.hash).collect()
}

pub(crate) fn class_code(c: TrafficClass) -> u8 {
    c.index() as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every JSON example in `docs/CONTROL.md` is a request's or reply's head this code reads, and writes
    /// back the same.
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
            (6, 7),
            "the examples were not all found"
        );
    }

    #[test]
    fn a_reply_without_via_is_main_and_a_load_without_same_host_has_none() {
        let r: Reply =
            serde_json::from_str(r#"{"reply":"started","session":1,"served":2}"#).unwrap();
        assert!(matches!(r, Reply::Started { via: Via::Main, .. }));
        let load = r#"{"op":"load","ns":1,"engine_addr":"a","blocks":[],"class":2,"request":0,"tp":{"rank":0,"size":1,"mla":false}}"#;
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
