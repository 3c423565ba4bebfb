//! Fixtures shared by the integration tests.
#![allow(unsafe_code)] // one fixture: host bytes presented as GPU memory, never dereferenced.
#![allow(dead_code)] // each test file uses part of it

pub(crate) mod tcp_client;

use transfer_engine::{MemoryKind, RawMemory};

/// Host bytes that claim to be memory of GPU 0: the host side of the engine never reads memory of that
/// kind, so the claim only decides how a driver routes the bytes.
pub(crate) struct ClaimsToBeGpu(pub(crate) Box<[u8]>);

// SAFETY: the pointer and length are the boxed slice's, which this value owns and never moves or frees
// while it lives; nothing writes through the pointer (kind Device is never dereferenced by the host).
unsafe impl RawMemory for ClaimsToBeGpu {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr().cast_mut()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device { ordinal: 0 }
    }
}

/// A runtime of two worker threads with I/O and time, for tests that drive nodes from plain `#[test]`s.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `len` pseudo-random bytes of `seed` (xorshift), the same for the same seed.
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes a line to stderr past the test harness's capture, so a "not run" shows in every run.
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The one rule RDMA tests follow for whether they run: whether libfabric here lists `provider` (a short
/// name, `tcp` or `shm`, or a full one) on `domain` (any domain when `None`) among the providers offering
/// what the backend needs ([`backends::rdma::available_providers`], i.e. `fi_getinfo`). Only when it does
/// not may a test say "not run" (said here) and pass; a failing `fi_getinfo` is an error, not a reason to
/// skip.
#[cfg(feature = "rdma")]
pub(crate) fn rdma_provider_listed(provider: &str, domain: Option<&str>) -> bool {
    // libfabric's names for RDM endpoints over tcp and verbs go through the ofi_rxm layer.
    let full = match provider {
        "tcp" | "verbs" => format!("{provider};ofi_rxm"),
        other => other.to_owned(),
    };
    let found = backends::rdma::available_providers()
        .unwrap_or_else(|e| panic!("libfabric is linked but fi_getinfo failed: {e}"));
    let listed = found
        .iter()
        .any(|p| p.provider == full && domain.is_none_or(|d| p.domain == d));
    if !listed {
        let found: std::collections::BTreeSet<String> = found
            .iter()
            .map(|p| format!("{} (domain {})", p.provider, p.domain))
            .collect();
        say(&format!(
            "not run: libfabric lists no {full}{} here (found: {found:?})",
            domain
                .map(|d| format!(" on domain {d}"))
                .unwrap_or_default()
        ));
    }
    listed
}

/// Sets up what a test needs on `provider` (a node, a probe) under [`rdma_provider_listed`]'s rule: `None`
/// (after a "not run") when libfabric does not list the provider here; otherwise `start`'s value, and a
/// panic with its error if it fails, since a provider that is listed must be usable.
#[cfg(feature = "rdma")]
pub(crate) fn on_listed_provider<T, E: std::fmt::Display>(
    provider: &str,
    domain: Option<&str>,
    start: impl FnOnce() -> Result<T, E>,
) -> Option<T> {
    if !rdma_provider_listed(provider, domain) {
        return None;
    }
    match start() {
        Ok(started) => Some(started),
        Err(e) => panic!(
            "libfabric lists {provider}{} here, but setting up on it failed: {e}",
            domain
                .map(|d| format!(" on domain {d}"))
                .unwrap_or_default()
        ),
    }
}
