//! How the index lies in Redis: key names, and what an entry and a lease hold.
//!
//! For a namespace `ns` (16 hex digits) under the configured prefix `p`:
//! - `p:b:<ns><key>`, one hash per block (`<key>` 16 hex digits): field = an instance's address, value =
//!   `<tier>:<epoch>` (`h` host, `d` disk). Hex, not raw bytes: a raw key could hold `{` and `}` and so
//!   name a Redis Cluster hash tag by accident; block keys spread over every slot of a cluster.
//! - `p:{<ns>}:leases`, one hash per namespace: field = address, value = `<deadline>:<epoch>` (deadline
//!   in milliseconds of the Redis server's clock). The braces are a hash tag: one slot, small (one field an
//!   instance).
//!
//! An entry counts only while its instance's lease is live and its epoch is at least the lease's: a
//! re-sync publishes everything under a new epoch and then moves the lease to it, so an entry a lost
//! removal left behind stops counting.

use transfer_engine::NamespaceId;
use transfer_engine::policy::BlockKey;

/// Which of an instance's tiers holds a block, as the index records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IndexTier {
    /// Host memory (the connector's tier store).
    Host,
    /// The instance's local disk tier.
    Disk,
}

impl IndexTier {
    fn code(self) -> char {
        match self {
            IndexTier::Host => 'h',
            IndexTier::Disk => 'd',
        }
    }

    fn from_code(c: char) -> Option<IndexTier> {
        match c {
            'h' => Some(IndexTier::Host),
            'd' => Some(IndexTier::Disk),
            _ => None,
        }
    }
}

/// The Redis key of a block's entries.
pub(crate) fn block_key(prefix: &str, ns: NamespaceId, key: BlockKey) -> String {
    format!("{prefix}:b:{:016x}{:016x}", ns.0, key.0)
}

/// The Redis key of a namespace's leases.
pub(crate) fn leases_key(prefix: &str, ns: NamespaceId) -> String {
    format!("{prefix}:{{{:016x}}}:leases", ns.0)
}

/// An entry's value.
pub(crate) fn entry_value(tier: IndexTier, epoch: u64) -> String {
    format!("{}:{epoch}", tier.code())
}

/// An entry's tier and epoch, or `None` for bytes this crate did not write.
pub(crate) fn parse_entry(value: &[u8]) -> Option<(IndexTier, u64)> {
    let text = std::str::from_utf8(value).ok()?;
    let (tier, epoch) = text.split_once(':')?;
    let mut chars = tier.chars();
    let tier = IndexTier::from_code(chars.next()?)?;
    if chars.next().is_some() {
        return None;
    }
    Some((tier, epoch.parse().ok()?))
}

/// A lease's value.
pub(crate) fn lease_value(deadline_ms: u64, epoch: u64) -> String {
    format!("{deadline_ms}:{epoch}")
}

/// A lease's deadline and epoch, or `None` for bytes this crate did not write.
pub(crate) fn parse_lease(value: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(value).ok()?;
    let (deadline, epoch) = text.split_once(':')?;
    Some((deadline.parse().ok()?, epoch.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_hold_no_accidental_hash_tag_and_values_round_trip() {
        let key = block_key("kvt", NamespaceId(0x7b7d), BlockKey(u64::MAX));
        assert_eq!(key, "kvt:b:0000000000007b7dffffffffffffffff");
        assert!(!key.contains('{'));
        assert_eq!(
            leases_key("kvt", NamespaceId(1)),
            "kvt:{0000000000000001}:leases"
        );
        for tier in [IndexTier::Host, IndexTier::Disk] {
            let v = entry_value(tier, 42);
            assert_eq!(parse_entry(v.as_bytes()), Some((tier, 42)));
        }
        assert_eq!(parse_lease(lease_value(9, 3).as_bytes()), Some((9, 3)));
        for bad in ["", "h", "x:1", "hh:1", "h:-1", "h:1:2", "\u{ff}"] {
            assert_eq!(parse_entry(bad.as_bytes()), None, "{bad:?}");
        }
        for bad in ["", "1", "a:1", "1:b"] {
            assert_eq!(parse_lease(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
