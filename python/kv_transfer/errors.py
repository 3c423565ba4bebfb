"""The package's exceptions: one hierarchy under :class:`KvTransferError`, each class saying who must act
(the Rust error's ``fault()``), so code catches what means "recompute" and lets a configuration mistake
surface::

    KvTransferError                 .fault: "caller" | "peer" | "transport" | "device"
    ├── ConfigurationError          (also a ValueError) the call or the configuration is wrong
    ├── PeerRefusedError            the peer refused this node or broke the protocol
    │   └── NamespaceMismatchError  the peer serves another model, weights, block size or dtype
    ├── PeerUnreachableError        the peer cannot be reached, or did not answer in time
    │   └── LayerLostError          a layer never arrived; .blocks are (layer, block) to recompute
    └── DeviceError                 the GPU failed

The native module raises these classes (it looks them up here), so they are plain Python classes that
pickle and subclass as any other.
"""

from __future__ import annotations

__all__ = [
    "RECOMPUTE",
    "ConfigurationError",
    "DeviceError",
    "KvTransferError",
    "LayerLostError",
    "NamespaceMismatchError",
    "PeerRefusedError",
    "PeerUnreachableError",
]


class KvTransferError(Exception):
    """An engine, transport or connector call failed; ``fault`` says who must act (``"caller"``,
    ``"peer"``, ``"transport"``, ``"device"``) and the message what to do."""

    fault: str = "transport"


class ConfigurationError(KvTransferError, ValueError):
    """The call or the configuration is wrong: change it, retrying will not help."""

    fault = "caller"


class PeerRefusedError(KvTransferError):
    """The peer refused this node, or broke the protocol: another peer may serve."""

    fault = "peer"


class NamespaceMismatchError(PeerRefusedError):
    """The peer serves another KV namespace (model, weights, block size or dtype)."""


class PeerUnreachableError(KvTransferError):
    """The peer cannot be reached or did not answer in time: recompute, or try again later."""

    fault = "transport"


class LayerLostError(PeerUnreachableError):
    """A layer never arrived whole; ``blocks`` lists the ``(layer, block)`` pairs to recompute."""

    #: Set on each raised instance (the native module sets it).
    blocks: tuple[tuple[int, int], ...] = ()


class DeviceError(KvTransferError):
    """The GPU (its driver, or a device copy) failed."""

    fault = "device"


#: What a serving engine recomputes for instead of failing: the peer's or the path's fault.
RECOMPUTE = (PeerRefusedError, PeerUnreachableError)
