//! Choosing a libfabric provider by name, or automatically.

use std::fmt;

use super::ffi::{ProviderInfo, providers};
use crate::TransportError;
use crate::rdma::no_provider;

/// Which libfabric provider a node uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// The fastest one found that can reach peers: `efa`, then `verbs` (InfiniBand, RoCE), then `shm` when
    /// `same_host` (it reaches only this machine), then `tcp`.
    Auto {
        /// Whether every peer runs on this machine (lets `shm` qualify).
        same_host: bool,
    },
    /// A provider by name: `tcp`, `shm`, `verbs`, `efa`, or any full libfabric name (`tcp;ofi_rxm`).
    Named(String),
}

impl Provider {
    /// Parses `auto`, `auto-local` (auto with `same_host`) or a provider name.
    #[must_use]
    pub fn parse(name: &str) -> Self {
        match name {
            "auto" => Provider::Auto { same_host: false },
            "auto-local" => Provider::Auto { same_host: true },
            other => Provider::Named(other.to_owned()),
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provider::Auto { same_host: false } => f.write_str("auto"),
            Provider::Auto { same_host: true } => f.write_str("auto-local"),
            Provider::Named(n) => f.write_str(n),
        }
    }
}

/// libfabric's name for a short one: `tcp` and `verbs` reach RDM endpoints through the `ofi_rxm` layer.
fn full_name(short: &str) -> String {
    match short {
        "tcp" | "verbs" => format!("{short};ofi_rxm"),
        other => other.to_owned(),
    }
}

/// Every provider offering reliable datagram endpoints with messages and RMA writes here.
pub fn available_providers() -> Result<Vec<ProviderInfo>, TransportError> {
    providers(None, None, false)
}

fn describe(found: &[ProviderInfo], hmem: bool) -> String {
    if found.is_empty() {
        return format!(
            "libfabric lists no provider with FI_EP_RDM, FI_MSG and FI_RMA{} here",
            if hmem {
                " and FI_HMEM (GPU memory)"
            } else {
                ""
            }
        );
    }
    let mut names: Vec<String> = found
        .iter()
        .map(|p| format!("{} (domain {})", p.provider, p.domain))
        .collect();
    names.dedup();
    format!("found {}", names.join(", "))
}

/// The provider's full name and domain to open for `choice` (with `hmem`: among those that register
/// device memory), or an error naming what was found.
pub(crate) fn resolve(
    choice: &Provider,
    domain: Option<&str>,
    hmem: bool,
) -> Result<(String, Option<String>), TransportError> {
    let found = providers(None, None, hmem)?;
    let fits = |name: &str| {
        found
            .iter()
            .any(|p| p.provider == name && domain.is_none_or(|d| p.domain == d))
    };
    match choice {
        Provider::Named(short) => {
            let name = full_name(short);
            if fits(&name) {
                Ok((name, domain.map(str::to_owned)))
            } else {
                Err(no_provider(format!(
                    "{name}{} does not offer reliable datagram endpoints with RMA{} here; {}",
                    domain
                        .map(|d| format!(" on domain {d}"))
                        .unwrap_or_default(),
                    if hmem {
                        " and GPU memory registration (FI_HMEM)"
                    } else {
                        ""
                    },
                    describe(&found, hmem)
                )))
            }
        }
        Provider::Auto { same_host } => {
            let mut order = vec!["efa", "verbs;ofi_rxm"];
            if *same_host {
                order.push("shm");
            }
            order.push("tcp;ofi_rxm");
            order
                .into_iter()
                .find(|n| fits(n))
                .map(|n| (n.to_owned(), domain.map(str::to_owned)))
                .ok_or_else(|| {
                    no_provider(format!(
                        "none of efa, verbs, {}tcp fits{}; {}",
                        if *same_host { "shm, " } else { "" },
                        domain
                            .map(|d| format!(" on domain {d}"))
                            .unwrap_or_default(),
                        describe(&found, hmem)
                    ))
                })
        }
    }
}
