"""The KV-cache transfer engine from Python.

Nodes (``Node.loopback_pair()``, ``Node.tcp(...)``) move KV blocks between regions registered over
caller memory: any writable, C-contiguous Python buffer (``bytearray``, numpy arrays, ``memoryview``,
CPU torch tensors through ``tensor.numpy()``), registered in place with :func:`register`. ``Connector``
is the KV connector shaped after vLLM's v1 connector.

Registered memory is shared with the engine: while a session that reads a region (sending) or writes it
(receiving) is live, Python code must not write those blocks, nor read the blocks still arriving. Read a
received block after its layer is whole (``Node.wait_layer``) or the session is over. The buffer is kept
exported while its region lives, so it cannot be resized or freed underneath the engine.

Every failure of the engine is a :class:`KvTransferError` carrying the engine's reason. Calls that wait
or move bytes release the GIL.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

from ._native import (
    Connector,
    ConnectorMetadata,
    Incoming,
    KvLayout,
    KvTransferError,
    Node,
    Outcome,
    Region,
    RegionHandle,
)

__all__ = [
    "Connector",
    "ConnectorMetadata",
    "Incoming",
    "KvLayout",
    "KvTransferError",
    "Node",
    "Outcome",
    "Region",
    "RegionHandle",
    "buffer_of",
    "register",
    "register_kv_caches",
]


def buffer_of(obj: Any) -> Tuple[int, int, Any]:
    """``(address, nbytes, keepalive)`` of a writable, C-contiguous buffer.

    ``keepalive`` holds the buffer exported: while it lives the object cannot be resized or freed. A
    read-only or non-contiguous buffer is a ``ValueError``; an object without the buffer protocol a
    ``TypeError``.
    """
    view = memoryview(obj)
    if view.readonly:
        raise ValueError("the buffer is read-only: the engine writes into registered memory")
    if not view.c_contiguous:
        raise ValueError("the buffer is not C-contiguous")
    view = view.cast("B")
    if view.nbytes == 0:
        raise ValueError("the buffer is empty")
    array = (ctypes.c_char * view.nbytes).from_buffer(view)
    return ctypes.addressof(array), view.nbytes, (array, view, obj)


def register(node: Node, layout: KvLayout, buffer: Any) -> Region:
    """Registers ``buffer`` (its memory, in place) on ``node`` as a KV region of ``layout``."""
    address, nbytes, keepalive = buffer_of(buffer)
    if nbytes < layout.total_bytes:
        raise ValueError(f"a buffer of {nbytes} bytes is smaller than the layout's {layout.total_bytes}")
    return node._register(layout, address, nbytes, keepalive)


def register_kv_caches(
    connector: Connector,
    buffer: Any,
    layout: Optional[KvLayout] = None,
    blocks: Optional[int] = None,
) -> None:
    """Registers a worker's KV caches (``buffer``, in place) with ``connector``.

    Give ``layout`` for caches as the serving engine placed them (``KvLayout.from_vllm(...)``), or
    ``blocks`` for a layer-major pool of that many blocks per layer.
    """
    address, nbytes, keepalive = buffer_of(buffer)
    connector._register_kv_caches(address, nbytes, keepalive, layout=layout, blocks=blocks)
