//! Where a node is reached, in one type for every backend, with a text form that travels in control
//! messages (`127.0.0.1:5000`, as control messages carried TCP addresses before this type, or with a
//! `tcp:` prefix; `rdma:`, the libfabric provider, `:` and the endpoint name in hex (`rdma:` and the hex
//! alone where the provider is not known); `shm:` and a socket path; `loopback`).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// Where a node is reached: what [`super::Transport::address`] gives and [`super::Transport::connect`]
/// takes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerAddress {
    /// A TCP node's listening address.
    Tcp(SocketAddr),
    /// A libfabric endpoint: the provider it runs on (`tcp;ofi_rxm`, `shm`, `verbs;ofi_rxm`, ...), when
    /// known, and its name (provider-specific bytes, exchanged out of band). A node on another provider
    /// refuses it with a clear error instead of handing libfabric a name it cannot use.
    Rdma {
        /// The provider, as libfabric names it.
        provider: Option<String>,
        /// The endpoint's name.
        name: Vec<u8>,
    },
    /// A same-host node's Unix socket path.
    Shm(std::path::PathBuf),
    /// The other end of an in-process loopback pair.
    Loopback,
}

impl fmt::Display for PeerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerAddress::Tcp(addr) => write!(f, "{addr}"),
            PeerAddress::Rdma { provider, name } => {
                f.write_str("rdma:")?;
                if let Some(provider) = provider {
                    write!(f, "{provider}:")?;
                }
                name.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
            PeerAddress::Shm(path) => write!(f, "shm:{}", path.display()),
            PeerAddress::Loopback => f.write_str("loopback"),
        }
    }
}

/// A text that is no [`PeerAddress`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a peer address (IP:PORT, tcp:IP:PORT, rdma:PROVIDER:HEX, rdma:HEX, shm:PATH or loopback)"
)]
pub struct BadAddress(pub String);

impl FromStr for PeerAddress {
    type Err = BadAddress;

    /// Parses the [`fmt::Display`] form; a TCP address may also carry a `tcp:` prefix.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadAddress(s.chars().take(200).collect());
        if s == "loopback" {
            return Ok(PeerAddress::Loopback);
        }
        if let Some(path) = s.strip_prefix("shm:") {
            if path.is_empty() {
                return Err(bad());
            }
            return Ok(PeerAddress::Shm(path.into()));
        }
        if let Some(rest) = s.strip_prefix("rdma:") {
            let (provider, hex) = match rest.rsplit_once(':') {
                Some((provider, hex)) if !provider.is_empty() => (Some(provider.to_owned()), hex),
                Some(_) => return Err(bad()),
                None => (None, rest),
            };
            if hex.is_empty() {
                return Err(bad());
            }
            let name = crate::codec::from_hex(hex).ok_or_else(bad)?;
            return Ok(PeerAddress::Rdma { provider, name });
        }
        let tcp = s.strip_prefix("tcp:").unwrap_or(s);
        tcp.parse().map(PeerAddress::Tcp).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        for a in [
            PeerAddress::Tcp("127.0.0.1:5000".parse().unwrap()),
            PeerAddress::Tcp("[::1]:7".parse().unwrap()),
            PeerAddress::Rdma {
                provider: None,
                name: vec![0, 1, 0xab, 0xff],
            },
            PeerAddress::Rdma {
                provider: Some("tcp;ofi_rxm".into()),
                name: vec![0, 0xff, 0x10],
            },
            PeerAddress::Shm("/run/user/1000/kv.sock".into()),
            PeerAddress::Loopback,
        ] {
            assert_eq!(a.to_string().parse::<PeerAddress>(), Ok(a));
        }
        assert_eq!(
            "10.0.0.1:80".parse::<PeerAddress>(),
            Ok(PeerAddress::Tcp("10.0.0.1:80".parse().unwrap()))
        );
        assert_eq!(
            "rdma:tcp;ofi_rxm:00ff10".to_string(),
            PeerAddress::Rdma {
                provider: Some("tcp;ofi_rxm".into()),
                name: vec![0, 0xff, 0x10]
            }
            .to_string()
        );
        assert_eq!(
            "tcp:10.0.0.1:80".parse::<PeerAddress>(),
            Ok(PeerAddress::Tcp("10.0.0.1:80".parse().unwrap()))
        );
    }

    #[test]
    fn malformed_text_is_refused() {
        for s in [
            "",
            "rdma:",
            "rdma:abc",
            "rdma:zz",
            "rdma::00ff",
            "rdma:shm:",
            "rdma:shm:abc",
            "tcp:nowhere",
            "udp:1.2.3.4:5",
        ] {
            assert!(s.parse::<PeerAddress>().is_err(), "{s:?}");
        }
    }
}
