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

mod client;
mod server;

use policy::NamespaceId;
use serde::{Deserialize, Serialize};
use transfer_engine::TrafficClass;

use crate::data_plane::{SameHostEndpoint, Via};
use crate::keys::{BlockHash, ScopedKey};
use crate::tp::RankKv;

pub(crate) use client::ControlClient;
pub(crate) use server::serve;

/// Longest control line accepted (16 MiB: about 250,000 keys).
pub const MAX_LINE: u64 = 16 << 20;
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
