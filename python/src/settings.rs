//! `ConnectorSettings`: a connector's settings from Python, keyword arguments of known names, each checked
//! once, here, into the [`ConnectorConfig`] both halves are made of.

use connector::{ConnectorConfig, KvRole, TpRank, namespace};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use transfer_engine::{KvKind, ShapingConfig};

use crate::errors::{config as invalid, err};
use crate::layout::dtype;

/// A connector's settings, checked once when made: `ConnectorSettings(role="producer", model=..., ...)`
/// with the keys below (an unknown key, or a bad value, is a `ConfigurationError` naming it).
#[pyclass(name = "ConnectorSettings", module = "kv_transfer", frozen)]
pub(crate) struct PySettings(ConnectorConfig);

impl PySettings {
    pub(crate) fn config(&self) -> &ConnectorConfig {
        &self.0
    }
}

#[pymethods]
impl PySettings {
    #[new]
    #[pyo3(signature = (**settings))]
    fn new(py: Python<'_>, settings: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let empty = PyDict::new(py);
        config(settings.unwrap_or(&empty)).map(Self)
    }

    /// The keys `ConnectorSettings` takes.
    #[classattr]
    #[pyo3(name = "KEYS")]
    fn keys() -> Vec<&'static str> {
        KEYS.to_vec()
    }

    /// `"producer"`, `"consumer"` or `"both"`.
    #[getter]
    fn role(&self) -> &'static str {
        self.0.role.name()
    }

    fn __repr__(&self) -> String {
        format!("ConnectorSettings({:?})", self.0)
    }
}

/// Settings keys a connector takes, with what each means (the package docs list their defaults).
const KEYS: [&str; 25] = [
    "role",
    "model",
    "weight_version",
    "block_size",
    "dtype",
    "layers",
    "block_bytes",
    "store_blocks",
    "prefetch_depth",
    "load_timeout",
    "lookup_timeout",
    "hold_timeout",
    "async_loads",
    "kv_bandwidth",
    "tp_rank",
    "tp_size",
    "python_hash_seed",
    "kv_heads",
    "head_size",
    "kv_kind",
    "disk_path",
    "disk_bytes",
    "disk_min_sharers",
    "kv_events",
    "secret_file",
];

/// A connector's settings from a dict of [`KEYS`]; an unknown key or a bad value names itself.
fn config(settings: &Bound<'_, PyDict>) -> PyResult<ConnectorConfig> {
    let bad = |key: &str, e: PyErr| invalid(format!("connector setting {key:?}: {e}"));
    for key in settings.keys() {
        let key: String = key.extract()?;
        if !KEYS.contains(&key.as_str()) {
            return Err(invalid(format!(
                "unknown connector setting {key:?}; known: {}",
                KEYS.join(", ")
            )));
        }
    }
    fn get<'py, T: FromPyObjectOwned<'py>>(
        settings: &Bound<'py, PyDict>,
        key: &str,
    ) -> PyResult<Option<T>> {
        settings
            .get_item(key)?
            .map(|v| v.extract::<T>().map_err(Into::into))
            .transpose()
    }
    let role = match get::<String>(settings, "role")
        .map_err(|e| bad("role", e))?
        .as_deref()
    {
        Some("producer") => KvRole::Producer,
        Some("consumer") => KvRole::Consumer,
        Some("both") => KvRole::Both,
        other => {
            return Err(invalid(format!(
                "connector setting \"role\" is {other:?}: use producer, consumer or both"
            )));
        }
    };
    let model: String = get(settings, "model")
        .map_err(|e| bad("model", e))?
        .unwrap_or_else(|| "model".into());
    let version: u64 = get(settings, "weight_version")
        .map_err(|e| bad("weight_version", e))?
        .unwrap_or(0);
    let block_size: u32 = get(settings, "block_size")
        .map_err(|e| bad("block_size", e))?
        .unwrap_or(16);
    let mut ns = namespace(&model, version, block_size);
    if let Some(d) = get::<String>(settings, "dtype").map_err(|e| bad("dtype", e))? {
        ns.dtype = dtype(&d).map_err(|e| bad("dtype", e))?;
    }
    let mut cfg = ConnectorConfig::new(role, ns);
    macro_rules! set {
        ($key:literal, $field:expr) => {
            if let Some(v) = get(settings, $key).map_err(|e| bad($key, e))? {
                $field = v;
            }
        };
    }
    set!("layers", cfg.layers);
    set!("block_bytes", cfg.block_bytes);
    set!("store_blocks", cfg.store_blocks);
    set!("prefetch_depth", cfg.prefetch_depth);
    set!("async_loads", cfg.async_loads);
    set!("kv_events", cfg.kv_events);
    let rate: u64 = get(settings, "kv_bandwidth")
        .map_err(|e| bad("kv_bandwidth", e))?
        .unwrap_or(0);
    if rate > 0 {
        // A cap on KV alone (no collectives share this engine), with a burst of a tenth of a second
        // (at least 256 KiB, at most the engine's default 16 MiB).
        cfg.shaping = Some({
            let mut cfg = ShapingConfig::default();
            cfg.link_bytes_per_sec = Some(rate);
            cfg.kv_share = 1.0;
            cfg.burst_bytes = (rate / 10).clamp(256 << 10, 16 << 20);
            cfg
        });
    }
    if let Some(s) = get::<f64>(settings, "load_timeout").map_err(|e| bad("load_timeout", e))? {
        cfg.load_timeout = crate::duration(s).map_err(|e| bad("load_timeout", e))?;
    }
    if let Some(s) = get::<f64>(settings, "lookup_timeout").map_err(|e| bad("lookup_timeout", e))? {
        cfg.lookup_timeout = crate::duration(s).map_err(|e| bad("lookup_timeout", e))?;
    }
    if let Some(s) = get::<f64>(settings, "hold_timeout").map_err(|e| bad("hold_timeout", e))? {
        cfg.hold_timeout = crate::duration(s).map_err(|e| bad("hold_timeout", e))?;
    }
    let rank: u32 = get(settings, "tp_rank")
        .map_err(|e| bad("tp_rank", e))?
        .unwrap_or(0);
    let size: u32 = get(settings, "tp_size")
        .map_err(|e| bad("tp_size", e))?
        .unwrap_or(1);
    cfg.tp = TpRank::new(rank, size).map_err(err)?;
    cfg.python_hash_seed =
        get(settings, "python_hash_seed").map_err(|e| bad("python_hash_seed", e))?;
    set!("kv_heads", cfg.heads.kv_heads);
    set!("head_size", cfg.heads.head_size);
    if let Some(kind) = get::<String>(settings, "kv_kind").map_err(|e| bad("kv_kind", e))? {
        cfg.heads.kind = match kind.as_str() {
            "bytes" => KvKind::Bytes,
            "kv_together" => KvKind::KvTogether,
            "kv_together_head_major" => KvKind::KvTogetherHeadMajor,
            "kv_apart" => KvKind::KvApart,
            "mla" => KvKind::Mla,
            _ => {
                return Err(invalid(format!(
                    "connector setting \"kv_kind\" is {kind:?}: use bytes, kv_together, kv_together_head_major, kv_apart or mla"
                )));
            }
        };
    }
    let secret_file: Option<std::path::PathBuf> =
        get(settings, "secret_file").map_err(|e| bad("secret_file", e))?;
    if let Some(path) = secret_file {
        cfg.secret = Some(read_secret(&path)?);
    }
    let disk_path: Option<std::path::PathBuf> =
        get(settings, "disk_path").map_err(|e| bad("disk_path", e))?;
    let disk_bytes: Option<u64> = get(settings, "disk_bytes").map_err(|e| bad("disk_bytes", e))?;
    match (disk_path, disk_bytes) {
        (Some(path), Some(bytes)) => {
            cfg.disk = Some(connector::disk::DiskConfig::new(path, bytes));
        }
        (None, None) => {}
        _ => {
            return Err(invalid(
                "connector settings \"disk_path\" and \"disk_bytes\" go together (a disk tier's directory and size)",
            ));
        }
    }
    set!("disk_min_sharers", cfg.disk_min_sharers);
    cfg.validate().map_err(err)?;
    Ok(cfg)
}

/// The shared secret in the file at `path` (a trailing newline is not part of it). Named by path so that
/// the secret itself is in no command line, configuration dump or log.
pub(crate) fn read_secret(path: &std::path::Path) -> PyResult<backends::tcp::Secret> {
    let mut bytes = std::fs::read(path).map_err(|e| {
        invalid(format!(
            "connector setting \"secret_file\": cannot read {}: {e}",
            path.display()
        ))
    })?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(invalid(format!(
            "connector setting \"secret_file\": {} is empty",
            path.display()
        )));
    }
    Ok(backends::tcp::Secret::new(bytes))
}
