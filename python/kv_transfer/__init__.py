"""The KV-cache transfer engine from Python.

Nodes (``Node.loopback_pair()``, ``Node.tcp(...)``, ``Node.shm(...)``, ``Node.rdma(...)``) move KV
blocks between regions registered over caller memory (``Node.register(layout, buffer)``): any writable,
C-contiguous Python buffer (``bytearray``, numpy arrays, ``memoryview``), a torch tensor on the host or,
in a build with GPU support (``"cuda" in FEATURES``), on a GPU, or any contiguous CUDA array
(``__cuda_array_interface__``), registered in place. The native module reads the object itself and
holds it (with its buffer export) while the region lives.

The KV connector comes in vLLM's two halves: a :class:`Scheduler` (lookups, in the background; plans) and
a :class:`Worker` (KV caches, transport, store), both made of one :class:`ConnectorSettings`, checked
once; the plan crosses from one to the other as :class:`ConnectorMetadata` bytes.
``kv_transfer.vllm`` is the connector vLLM loads by module path. A router reads the cluster index the
connectors publish to through :class:`ClusterIndex` (who holds how long a prefix of a prompt) and chooses
an instance with :class:`Router`; ``python -m kv_transfer.proxy`` is such a router.

Registered memory is shared with the engine: while a session that reads a region (sending) or writes it
(receiving) is live, Python code must not write those blocks, nor read the blocks still arriving. Read a
received block after its layer is whole (``Node.wait_layer``) or the session is over. GPU memory is read
and written on the engine's own CUDA stream: finish the kernels that write a block (synchronize their
stream) before saving or sending it; blocks the engine loads are complete on the GPU when the call that
reports them returns.

Every failure is an exception of :mod:`kv_transfer.errors` (all under :class:`KvTransferError`), whose
class and ``fault`` say who must act. Calls that wait or move bytes release the GIL.
"""

from __future__ import annotations

from ._native import (
    FEATURES,
    ClusterIndex,
    ConnectorMetadata,
    ConnectorSettings,
    Incoming,
    IndexAnswer,
    KvLayout,
    Node,
    Outcome,
    Region,
    RegionHandle,
    Registry,
    Router,
    Scheduler,
    Worker,
)
from .errors import (
    ConfigurationError,
    DeviceError,
    KvTransferError,
    LayerLostError,
    NamespaceMismatchError,
    PeerRefusedError,
    PeerUnreachableError,
)

__all__ = [
    "FEATURES",
    "ClusterIndex",
    "ConfigurationError",
    "ConnectorMetadata",
    "ConnectorSettings",
    "DeviceError",
    "Incoming",
    "IndexAnswer",
    "KvLayout",
    "KvTransferError",
    "LayerLostError",
    "NamespaceMismatchError",
    "Node",
    "Outcome",
    "PeerRefusedError",
    "PeerUnreachableError",
    "Region",
    "RegionHandle",
    "Registry",
    "Router",
    "Scheduler",
    "Worker",
]
