//! The native module of the `kv_transfer` Python package: the engine's nodes (loopback, TCP), KV layouts,
//! regions over Python buffers, transfers and the receiving side, and the KV connector. The pure-Python
//! part of the package (`kv_transfer/__init__.py`) wraps what needs Python's own machinery (buffers).
//!
//! Every call that waits or moves bytes releases the GIL while Rust works; every Rust error reaches Python
//! as an exception of `kv_transfer/errors.py`'s hierarchy, its class and `fault` saying who must act.

mod buffer;
mod connector;
mod errors;
mod index;
mod layout;
mod node;
mod objects;
mod registry;
mod scheduler;
mod settings;
mod worker;

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::prelude::*;

pub(crate) use errors::err;

/// The runtime every node and connector of this process runs its tasks on.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kv-transfer")
            .enable_all()
            .build()
            .expect("a tokio runtime starts")
    })
}

/// Runs `f` to completion on the runtime with the GIL released.
fn block_on<F>(py: Python<'_>, f: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    py.detach(|| runtime().block_on(f))
}

/// `f` within `seconds`, or a `PeerUnreachableError` naming `what`.
fn within<T, F>(py: Python<'_>, seconds: f64, what: &str, f: F) -> PyResult<T>
where
    F: Future<Output = PyResult<T>> + Send,
    T: Send,
{
    let limit = duration(seconds)?;
    block_on(py, async { tokio::time::timeout(limit, f).await }).unwrap_or_else(|_| {
        Err(errors::failed(format!(
            "{what}: no answer within {seconds} s"
        )))
    })
}

/// Seconds from Python as a duration; negative or not finite is a `ConfigurationError`.
fn duration(seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| errors::config(format!("{seconds} is not a number of seconds")))
}

/// libfabric settings for engine `engine_id`: `provider` as [`backends::rdma::Provider::parse`] reads it,
/// `domain` the device or interface (`None`: the provider's first).
#[cfg(feature = "rdma")]
fn rdma_config(
    engine_id: u32,
    provider: &str,
    domain: Option<String>,
) -> backends::rdma::RdmaConfig {
    let mut cfg =
        backends::rdma::RdmaConfig::new(engine_id, backends::rdma::Provider::parse(provider));
    cfg.domain = domain;
    cfg
}

/// What an RDMA call answers in a build without feature `rdma`: how to get one.
#[cfg(not(feature = "rdma"))]
fn no_rdma() -> PyErr {
    errors::config(
        "this kv_transfer build has no RDMA: reinstall it with MATURIN_PEP517_ARGS=\"--features rdma\" \
         pip install ./python (needs libfabric's headers and libclang)",
    )
}

/// The optional features this build has (`cuda`: GPU memory; `rdma`: libfabric nodes and connectors;
/// `etcd`: a registry of producers).
const FEATURES: &[&str] = &[
    #[cfg(feature = "cuda")]
    "cuda",
    #[cfg(feature = "rdma")]
    "rdma",
    #[cfg(feature = "etcd")]
    "etcd",
];

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FEATURES", FEATURES.to_vec())?;
    m.add_class::<layout::PyKvLayout>()?;
    m.add_class::<node::PyNode>()?;
    m.add_class::<node::PyRegion>()?;
    m.add_class::<node::PyRegionHandle>()?;
    m.add_class::<node::PyOutcome>()?;
    m.add_class::<node::PyIncoming>()?;
    m.add_class::<settings::PySettings>()?;
    m.add_class::<scheduler::PyScheduler>()?;
    m.add_class::<worker::PyWorker>()?;
    m.add_class::<connector::PyConnectorMetadata>()?;
    m.add_class::<registry::PyRegistry>()?;
    m.add_class::<index::PyClusterIndex>()?;
    m.add_class::<index::PyIndexAnswer>()?;
    m.add_class::<index::PyRouter>()?;
    Ok(())
}
