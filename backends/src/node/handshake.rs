//! What a handshake checks of a peer, written once for every backend: the protocol versions, the engine
//! id, the KV namespace and whether both sides authenticate ([`Identity::mismatch`]); and the
//! shared-secret MACs over a handshake's transcript ([`auth_mac`], [`verify_mac`]). A backend encodes its
//! own messages; what makes two nodes fit to talk is decided here.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use transfer_engine::Namespace;

/// Bytes of a MAC.
pub const MAC_LEN: usize = 32;

/// What a node says about itself that a peer must agree with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The backend's handshake protocol version.
    pub protocol: u16,
    /// The frame wire-format version.
    pub wire: u8,
    /// The engine id.
    pub engine_id: u32,
    /// The KV namespace served.
    pub namespace: Namespace,
    /// Whether this side authenticates with a shared secret.
    pub authenticated: bool,
}

/// Why a peer cannot talk to this node, found in the handshake. Each says which side must change what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Mismatch {
    /// The peer speaks another protocol or wire version.
    #[error(
        "protocol version {}/{} is not supported (this build speaks {}/{}): upgrade the older side",
        theirs.0, theirs.1, ours.0, ours.1
    )]
    Version {
        /// The peer's (protocol, wire) versions.
        theirs: (u16, u8),
        /// This node's.
        ours: (u16, u8),
    },
    /// Both ends have one engine id.
    #[error("both ends have engine id {0}: give every engine a distinct engine_id")]
    SameEngineId(u32),
    /// Another engine answered at an address than the one expected there.
    #[error(
        "expected engine {expected} at this address but engine {found} answered: the address is stale"
    )]
    UnexpectedEngine {
        /// The engine expected.
        expected: u32,
        /// The engine that answered.
        found: u32,
    },
    /// The peer serves another KV namespace.
    #[error(
        "KV namespace mismatch: the peer serves {theirs}, this node {ours}: connect engines of the same \
         model, weights and block size"
    )]
    Namespace {
        /// The peer's namespace.
        theirs: Box<Namespace>,
        /// This node's.
        ours: Box<Namespace>,
    },
    /// One side authenticates with a shared secret and the other has none.
    #[error(
        "{} requires shared-secret authentication and {} has no secret: configure the same secret on both \
         sides",
        if *.ours { "this node" } else { "the peer" },
        if *.ours { "the peer" } else { "this node" }
    )]
    SecretMissing {
        /// Whether it is this node that authenticates.
        ours: bool,
    },
    /// The peer's MAC did not verify: it has another secret, or the handshake was altered on the way.
    #[error(
        "the {role} failed shared-secret authentication: configure the same secret on both sides"
    )]
    Authentication {
        /// The role of the side that failed (`dialer` or `acceptor`).
        role: &'static str,
    },
}

impl Identity {
    /// Why `peer` cannot talk to this node, if it cannot.
    #[must_use]
    pub fn mismatch(&self, peer: &Identity) -> Option<Mismatch> {
        if (peer.protocol, peer.wire) != (self.protocol, self.wire) {
            return Some(Mismatch::Version {
                theirs: (peer.protocol, peer.wire),
                ours: (self.protocol, self.wire),
            });
        }
        if peer.engine_id == self.engine_id {
            return Some(Mismatch::SameEngineId(peer.engine_id));
        }
        if peer.namespace != self.namespace {
            return Some(Mismatch::Namespace {
                theirs: Box::new(peer.namespace.clone()),
                ours: Box::new(self.namespace.clone()),
            });
        }
        if peer.authenticated != self.authenticated {
            return Some(Mismatch::SecretMissing {
                ours: self.authenticated,
            });
        }
        None
    }
}

/// `N` fresh random bytes (a handshake's nonce or a group's token); the error names `what` they were for.
pub fn fresh<const N: usize>(what: &str) -> Result<[u8; N], String> {
    let mut bytes = [0u8; N];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for {what}: {e}"))?;
    Ok(bytes)
}

/// HMAC-SHA256 over a role label and a handshake `transcript`; all zeros without a secret.
#[must_use]
pub fn auth_mac(secret: Option<&[u8]>, role: &str, transcript: &[u8]) -> [u8; MAC_LEN] {
    match keyed(secret, role, transcript) {
        Some(mac) => mac.finalize().into_bytes().into(),
        None => [0; MAC_LEN],
    }
}

/// Whether `got` is the MAC of `role` over `transcript` under `secret` (any MAC passes without one).
#[must_use]
pub fn verify_mac(
    secret: Option<&[u8]>,
    role: &str,
    transcript: &[u8],
    got: &[u8; MAC_LEN],
) -> bool {
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

#[cfg(test)]
mod tests {
    use transfer_engine::Dtype;

    use super::*;

    fn identity(engine_id: u32) -> Identity {
        Identity {
            protocol: 4,
            wire: 1,
            engine_id,
            namespace: Namespace::default(),
            authenticated: false,
        }
    }

    #[test]
    fn mismatches_are_typed_and_explained() {
        let a = identity(1);
        let mut b = identity(2);
        assert_eq!(a.mismatch(&b), None);
        b.namespace.dtype = Dtype::F16;
        let m = a.mismatch(&b).unwrap();
        assert!(matches!(m, Mismatch::Namespace { .. }), "{m}");
        assert!(m.to_string().contains("F16"), "{m}");
        b.namespace.dtype = Dtype::Bf16;
        b.protocol = 9;
        let m = a.mismatch(&b).unwrap();
        assert!(m.to_string().contains("protocol version 9/1"), "{m}");
        b.protocol = 4;
        b.engine_id = 1;
        assert_eq!(a.mismatch(&b), Some(Mismatch::SameEngineId(1)));
        b.engine_id = 2;
        b.authenticated = true;
        let m = a.mismatch(&b).unwrap();
        assert!(m.to_string().starts_with("the peer requires"), "{m}");
        assert!(
            b.mismatch(&a)
                .unwrap()
                .to_string()
                .starts_with("this node requires")
        );
    }

    #[test]
    fn macs_bind_secret_role_and_transcript() {
        let m = auth_mac(Some(b"s3cret"), "dialer", b"abc");
        assert!(verify_mac(Some(b"s3cret"), "dialer", b"abc", &m));
        assert!(!verify_mac(Some(b"other"), "dialer", b"abc", &m));
        assert!(!verify_mac(Some(b"s3cret"), "acceptor", b"abc", &m));
        assert!(!verify_mac(Some(b"s3cret"), "dialer", b"abd", &m));
        assert!(verify_mac(None, "dialer", b"abc", &[0; MAC_LEN]));
    }
}
