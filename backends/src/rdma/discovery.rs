//! RDMA nodes in the discovery registry: a node announces its endpoint address (as text, with its
//! provider), and a peer looks it up and connects by engine id, as TCP nodes do with their listen address.
//!
//! The address text is `ofi+<provider>:<hex of the endpoint address>`, for example
//! `ofi+shm:66692d...`: readable in etcdctl, and a peer on another provider is refused with a clear error
//! instead of handing libfabric an address it cannot use.

use super::{PeerInfo, RdmaError, RdmaNode};
use crate::discovery::{Discovery, DiscoveryError, Lease, PeerRecord};

/// `node`'s endpoint address as text (what [`announce`] registers and `te-bench serve --backend rdma`
/// prints).
#[must_use]
pub fn endpoint_text(node: &RdmaNode) -> String {
    let hex: String = node.address().iter().map(|b| format!("{b:02x}")).collect();
    format!("ofi+{}:{hex}", node.provider().provider)
}

/// The provider and endpoint address in `text` (as [`endpoint_text`] writes it).
pub fn parse_endpoint(text: &str) -> Result<(String, Vec<u8>), RdmaError> {
    let bad = || {
        RdmaError::Config(format!(
            "'{text}' is not an RDMA endpoint address (ofi+<provider>:<hex>)"
        ))
    };
    let rest = text.trim().strip_prefix("ofi+").ok_or_else(bad)?;
    let (provider, hex) = rest.rsplit_once(':').ok_or_else(bad)?;
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    Ok((provider.to_string(), bytes))
}

/// Registers `node` (its endpoint address and namespace) under `lease`.
pub async fn announce<D: Discovery>(
    discovery: &D,
    node: &RdmaNode,
    namespace: &transfer_engine::Namespace,
    lease: Lease,
) -> Result<(), DiscoveryError> {
    discovery
        .put_peer(
            &PeerRecord {
                engine_id: node.engine_id(),
                addr: endpoint_text(node),
                namespace: namespace.to_string(),
            },
            lease,
        )
        .await
}

/// Looks up engine `engine_id` and connects `node` to it.
pub async fn connect<D: Discovery>(
    discovery: &D,
    node: &RdmaNode,
    engine_id: u32,
) -> Result<PeerInfo, DiscoveryError> {
    let rec = discovery
        .peer(engine_id)
        .await?
        .ok_or(DiscoveryError::NotFound(engine_id))?;
    let (provider, address) = parse_endpoint(&rec.addr).map_err(|e| DiscoveryError::Malformed {
        key: format!("peer {engine_id}"),
        reason: e.to_string(),
    })?;
    let ours = &node.provider().provider;
    if provider != *ours {
        return Err(DiscoveryError::Rdma(RdmaError::Config(format!(
            "engine {engine_id} is on provider {provider}, this node on {ours}: start both on one provider"
        ))));
    }
    Ok(node.connect(&address).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_text_parses_back_and_garbage_is_refused() {
        assert_eq!(
            parse_endpoint("ofi+tcp;ofi_rxm:00ff10").unwrap(),
            ("tcp;ofi_rxm".to_string(), vec![0, 0xff, 0x10])
        );
        for bad in [
            "",
            "ofi+shm:",
            "ofi+shm:abc",
            "ofi+shm:zz",
            "tcp:0011",
            "ofi+shm",
        ] {
            assert!(parse_endpoint(bad).is_err(), "{bad:?}");
        }
    }
}
