//! Rust errors as the package's exceptions (`kv_transfer/errors.py`: one hierarchy under
//! `KvTransferError`, each class saying who must act), with `fault` set from the Rust error's `fault()`
//! and, for a lost layer, `blocks`.

use backends::{Fault, TransportError};
use connector::ConnectorError;
use pyo3::prelude::*;

// The classes are Python's (`kv_transfer/errors.py`): one of them is a `ValueError` too, which a class
// made here could not be.
pyo3::import_exception!(kv_transfer.errors, KvTransferError);
pyo3::import_exception!(kv_transfer.errors, ConfigurationError);
pyo3::import_exception!(kv_transfer.errors, PeerRefusedError);
pyo3::import_exception!(kv_transfer.errors, NamespaceMismatchError);
pyo3::import_exception!(kv_transfer.errors, PeerUnreachableError);
pyo3::import_exception!(kv_transfer.errors, LayerLostError);
pyo3::import_exception!(kv_transfer.errors, DeviceError);

/// What a Rust error says of itself: whose fault, whether a namespace mismatch, and the blocks a lost
/// layer hands back.
pub(crate) struct Classified {
    fault: Fault,
    namespace: bool,
    lost: Option<Vec<(u32, u32)>>,
    message: String,
}

impl Classified {
    /// `fault`'s, saying `message`; no namespace mismatch, no lost layer.
    pub(crate) fn new(fault: Fault, message: String) -> Classified {
        Classified {
            fault,
            namespace: false,
            lost: None,
            message,
        }
    }
}

/// A Rust error that knows whose fault it is.
pub(crate) trait Classify: std::fmt::Display {
    fn classify(&self) -> Classified;
}

impl Classify for TransportError {
    fn classify(&self) -> Classified {
        use backends::node::handshake::Mismatch;
        Classified {
            fault: self.fault(),
            namespace: matches!(self, TransportError::Mismatch(Mismatch::Namespace { .. }))
                || matches!(self, TransportError::Refused(m) if m.contains("KV namespace mismatch")),
            lost: self
                .lost_blocks()
                .map(|b| b.iter().map(|id| (id.layer, id.block)).collect()),
            message: self.to_string(),
        }
    }
}

impl Classify for ConnectorError {
    fn classify(&self) -> Classified {
        match self {
            ConnectorError::Transport(e) => e.classify(),
            _ => Classified {
                fault: self.fault(),
                namespace: false,
                lost: None,
                message: self.to_string(),
            },
        }
    }
}

impl Classify for transfer_engine::Error {
    fn classify(&self) -> Classified {
        Classified {
            fault: self.fault(),
            namespace: false,
            lost: None,
            message: self.to_string(),
        }
    }
}

impl Classify for backends::discovery::DiscoveryError {
    fn classify(&self) -> Classified {
        Classified {
            fault: Fault::Transport,
            namespace: false,
            lost: None,
            message: self.to_string(),
        }
    }
}

#[cfg(feature = "cuda")]
impl Classify for backends::cuda::CudaError {
    fn classify(&self) -> Classified {
        Classified {
            fault: Fault::Device,
            namespace: false,
            lost: None,
            message: self.to_string(),
        }
    }
}

/// Errors that are always the caller's: a bad argument.
macro_rules! callers {
    ($($t:ty),*) => {$(
        impl Classify for $t {
            fn classify(&self) -> Classified {
                Classified {
                    fault: Fault::Caller,
                    namespace: false,
                    lost: None,
                    message: self.to_string(),
                }
            }
        }
    )*};
}
callers!(std::num::TryFromIntError, backends::transport::BadAddress);

/// `e` as the exception of its class, with `fault` (and `blocks` for a lost layer) set.
pub(crate) fn err(e: impl Classify) -> PyErr {
    let c = e.classify();
    let py_err = match (c.fault, c.namespace, &c.lost) {
        (_, true, _) => NamespaceMismatchError::new_err(c.message),
        (_, _, Some(_)) => LayerLostError::new_err(c.message),
        (Fault::Caller, ..) => ConfigurationError::new_err(c.message),
        (Fault::Peer, ..) => PeerRefusedError::new_err(c.message),
        (Fault::Transport, ..) => PeerUnreachableError::new_err(c.message),
        (Fault::Device, ..) => DeviceError::new_err(c.message),
        _ => KvTransferError::new_err(c.message),
    };
    Python::attach(|py| {
        let value = py_err.value(py);
        let _ = value.setattr("fault", c.fault.name());
        if let Some(lost) = c.lost
            && let Ok(blocks) = pyo3::types::PyTuple::new(py, lost)
        {
            let _ = value.setattr("blocks", blocks);
        }
    });
    py_err
}

/// A failure of this package's own (no Rust error to classify): the transport's.
pub(crate) fn failed(message: impl Into<String>) -> PyErr {
    let e = PeerUnreachableError::new_err(message.into());
    Python::attach(|py| {
        let _ = e.value(py).setattr("fault", "transport");
    });
    e
}

/// A configuration mistake found here (a setting, an argument).
pub(crate) fn config(message: impl Into<String>) -> PyErr {
    let e = ConfigurationError::new_err(message.into());
    Python::attach(|py| {
        let _ = e.value(py).setattr("fault", "caller");
    });
    e
}
