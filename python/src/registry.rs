//! `Registry`: where KV producers announce their control address and consumers find them (an etcd
//! cluster, the package's feature `etcd`), so instances can share KV without a list of peers.
//!
//! A record is `backends::discovery`'s peer record under the engine id with
//! [`connector::discovery::CONTROL_ID_BIT`] set, bound to a lease that a task of the package's runtime
//! renews every third of its time to live until the announcement is withdrawn (or the process ends: then
//! the lease expires and the record with it).

use std::collections::HashMap;
use std::sync::Mutex;

use pyo3::prelude::*;

/// A registry of producers' control addresses (etcd): `Registry.etcd(["127.0.0.1:2379"])`.
#[pyclass(name = "Registry", module = "kv_transfer", frozen)]
pub(crate) struct PyRegistry {
    #[cfg(feature = "etcd")]
    etcd: backends::discovery::Etcd,
    /// Announcements still renewed, by lease id: dropping the sender ends the renewing task.
    renewing: Mutex<HashMap<i64, tokio::sync::oneshot::Sender<()>>>,
}

#[pymethods]
impl PyRegistry {
    /// Connects to the etcd cluster at `endpoints` (`"host:port"` or URLs); keys live under `prefix`.
    /// With `secret_file` (the cluster's shared secret, as the connector setting of that name) every
    /// record it writes is sealed with a MAC and only sealed records are read, so whoever can write to
    /// etcd without the secret cannot announce a producer. Needs a build with feature `etcd`; without it
    /// the error says how to build one.
    #[staticmethod]
    #[pyo3(signature = (endpoints, prefix = "kv-transfer", secret_file = None))]
    fn etcd(
        py: Python<'_>,
        endpoints: Vec<String>,
        prefix: &str,
        secret_file: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let secret = secret_file
            .map(|path| crate::settings::read_secret(&path))
            .transpose()?;
        etcd_registry(py, endpoints, prefix, secret)
    }

    /// Registers `control_addr` (`"host:port"`) as producer `engine_id` in `namespace` for `ttl` seconds,
    /// renewed until [`PyRegistry::withdraw`] or the end of the process; returns the lease id.
    #[pyo3(signature = (engine_id, control_addr, namespace, ttl = 10.0))]
    fn announce(
        &self,
        py: Python<'_>,
        engine_id: u32,
        control_addr: &str,
        namespace: &str,
        ttl: f64,
    ) -> PyResult<i64> {
        self.announce_impl(py, engine_id, control_addr, namespace, ttl)
    }

    /// The control addresses of the producers announced in `namespace`, skipping `exclude`.
    #[pyo3(signature = (namespace, exclude = None))]
    fn producers(
        &self,
        py: Python<'_>,
        namespace: &str,
        exclude: Option<&str>,
    ) -> PyResult<Vec<String>> {
        self.producers_impl(py, namespace, exclude)
    }

    /// Stops renewing the announcement under `lease` and revokes it: the record is gone at once.
    fn withdraw(&self, py: Python<'_>, lease: i64) -> PyResult<()> {
        self.renewing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&lease);
        self.revoke_impl(py, lease)
    }
}

#[cfg(feature = "etcd")]
fn etcd_registry(
    py: Python<'_>,
    endpoints: Vec<String>,
    prefix: &str,
    secret: Option<backends::tcp::Secret>,
) -> PyResult<PyRegistry> {
    let urls: Vec<String> = endpoints
        .into_iter()
        .map(|e| {
            if e.contains("://") {
                e
            } else {
                format!("http://{e}")
            }
        })
        .collect();
    // The client connects lazily: one lookup proves the cluster answers, so a wrong endpoint fails here.
    let etcd = crate::block_on(py, async {
        use backends::discovery::Discovery;
        let mut etcd = backends::discovery::Etcd::connect(&urls, prefix).await?;
        if let Some(secret) = secret {
            etcd = etcd.with_secret(secret);
        }
        match tokio::time::timeout(std::time::Duration::from_secs(5), etcd.peers()).await {
            Ok(Ok(_)) => Ok(etcd),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(backends::discovery::DiscoveryError::Unavailable(format!(
                "etcd at {urls:?} did not answer within 5 s"
            ))),
        }
    })
    .map_err(crate::err)?;
    Ok(PyRegistry {
        etcd,
        renewing: Mutex::default(),
    })
}

#[cfg(not(feature = "etcd"))]
fn etcd_registry(
    _py: Python<'_>,
    endpoints: Vec<String>,
    _prefix: &str,
    _secret: Option<backends::tcp::Secret>,
) -> PyResult<PyRegistry> {
    Err(crate::errors::config(format!(
        "an etcd registry at {endpoints:?}: {}",
        no_etcd().value(_py)
    )))
}

#[cfg(feature = "etcd")]
impl PyRegistry {
    fn announce_impl(
        &self,
        py: Python<'_>,
        engine_id: u32,
        control_addr: &str,
        namespace: &str,
        ttl: f64,
    ) -> PyResult<i64> {
        use backends::discovery::{Discovery, PeerRecord};
        let ttl = crate::duration(ttl)?.max(std::time::Duration::from_secs(1));
        let record = PeerRecord {
            engine_id: engine_id | connector::discovery::CONTROL_ID_BIT,
            addr: control_addr.to_string(),
            namespace: namespace.to_string(),
        };
        let etcd = self.etcd.clone();
        let lease = crate::block_on(py, async {
            let lease = etcd.grant(ttl).await?;
            etcd.put_peer(&record, lease).await?;
            Ok::<_, backends::discovery::DiscoveryError>(lease)
        })
        .map_err(crate::err)?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        crate::runtime().spawn(async move {
            let every = ttl / 3;
            let mut current = lease;
            loop {
                tokio::select! {
                    // Withdrawn: a lease taken since the first goes too (the first is revoked by
                    // `withdraw` itself).
                    _ = &mut stopped => {
                        if current != lease {
                            let _ = etcd.revoke(current).await;
                        }
                        return;
                    }
                    () = tokio::time::sleep(every) => {}
                }
                match etcd.keep_alive(current).await {
                    Ok(()) => {}
                    // Expired (the registry was unreachable past the ttl): announce again under a
                    // fresh lease, renewed from then on.
                    Err(backends::discovery::DiscoveryError::UnknownLease(_)) => {
                        if let Ok(fresh) = etcd.grant(ttl).await
                            && etcd.put_peer(&record, fresh).await.is_ok()
                        {
                            current = fresh;
                        }
                    }
                    // Unreachable for now: try again at the next turn.
                    Err(_) => {}
                }
            }
        });
        self.renewing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(lease.0, stop);
        Ok(lease.0)
    }

    fn producers_impl(
        &self,
        py: Python<'_>,
        namespace: &str,
        exclude: Option<&str>,
    ) -> PyResult<Vec<String>> {
        use backends::discovery::Discovery;
        let etcd = self.etcd.clone();
        let peers = crate::block_on(py, async move { etcd.peers().await }).map_err(crate::err)?;
        Ok(peers
            .into_iter()
            .filter(|p| p.engine_id & connector::discovery::CONTROL_ID_BIT != 0)
            .filter(|p| p.namespace == namespace && Some(p.addr.as_str()) != exclude)
            .map(|p| p.addr)
            .collect())
    }

    /// Hands `found` the producers announced in `namespace` (`exclude` apart) every `every`, on the
    /// package's runtime, until it answers `false`; a registry that does not answer is asked again at the
    /// next turn.
    pub(crate) fn follow(
        &self,
        namespace: String,
        exclude: Option<String>,
        every: std::time::Duration,
        found: impl Fn(Vec<std::net::SocketAddr>) -> bool + Send + 'static,
    ) -> PyResult<()> {
        use backends::discovery::Discovery;
        let etcd = self.etcd.clone();
        crate::runtime().spawn(async move {
            loop {
                if let Ok(Ok(peers)) =
                    tokio::time::timeout(every.max(std::time::Duration::from_secs(1)), etcd.peers())
                        .await
                {
                    let addrs = peers
                        .into_iter()
                        .filter(|p| p.engine_id & connector::discovery::CONTROL_ID_BIT != 0)
                        .filter(|p| p.namespace == namespace && Some(&p.addr) != exclude.as_ref())
                        .filter_map(|p| p.addr.parse().ok())
                        .collect();
                    if !found(addrs) {
                        return;
                    }
                }
                tokio::time::sleep(every).await;
            }
        });
        Ok(())
    }

    fn revoke_impl(&self, py: Python<'_>, lease: i64) -> PyResult<()> {
        use backends::discovery::{Discovery, Lease};
        let etcd = self.etcd.clone();
        crate::block_on(py, async move { etcd.revoke(Lease(lease)).await }).map_err(crate::err)
    }
}

/// Without the feature no registry is ever made; these answer as its constructor does.
#[cfg(not(feature = "etcd"))]
impl PyRegistry {
    fn announce_impl(&self, _: Python<'_>, _: u32, _: &str, _: &str, _: f64) -> PyResult<i64> {
        Err(no_etcd())
    }
    fn producers_impl(&self, _: Python<'_>, _: &str, _: Option<&str>) -> PyResult<Vec<String>> {
        Err(no_etcd())
    }
    fn revoke_impl(&self, _: Python<'_>, _: i64) -> PyResult<()> {
        Err(no_etcd())
    }
    pub(crate) fn follow(
        &self,
        _: String,
        _: Option<String>,
        _: std::time::Duration,
        _: impl Fn(Vec<std::net::SocketAddr>) -> bool + Send + 'static,
    ) -> PyResult<()> {
        Err(no_etcd())
    }
}

#[cfg(not(feature = "etcd"))]
fn no_etcd() -> PyErr {
    crate::errors::config(
        "this build of kv_transfer has no etcd support; build it with \
         MATURIN_PEP517_ARGS=\"--features etcd\" pip install ./python",
    )
}
