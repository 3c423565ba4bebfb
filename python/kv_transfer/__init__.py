"""The KV-cache transfer engine from Python.

Nodes (``Node.loopback_pair()``, ``Node.tcp(...)``, ``Node.shm(...)``, ``Node.rdma(...)``) move KV
blocks between regions registered over caller memory: any writable, C-contiguous Python buffer
(``bytearray``, numpy arrays, ``memoryview``, CPU torch tensors through ``tensor.numpy()``) or, in a build with GPU support (``"cuda" in FEATURES``),
any contiguous CUDA array (torch CUDA tensors, CuPy arrays: ``__cuda_array_interface__``), registered in
place with :func:`register`. ``Connector`` is the KV connector shaped after vLLM's v1 connector.

Registered memory is shared with the engine: while a session that reads a region (sending) or writes it
(receiving) is live, Python code must not write those blocks, nor read the blocks still arriving. Read a
received block after its layer is whole (``Node.wait_layer``) or the session is over. The buffer is kept
exported while its region lives, so it cannot be resized or freed underneath the engine. GPU memory is
read and written on the engine's own CUDA stream: finish the kernels that write a block (synchronize
their stream) before saving or sending it; blocks the engine loads are complete on the GPU when the call
that reports them returns.

Every failure of the engine is a :class:`KvTransferError` carrying the engine's reason. Calls that wait
or move bytes release the GIL.
"""

from __future__ import annotations

import ctypes
from typing import Any, Optional, Tuple

from ._native import (
    FEATURES,
    Connector,
    ConnectorMetadata,
    Incoming,
    KvLayout,
    KvTransferError,
    Node,
    Outcome,
    Region,
    RegionHandle,
    Registry,
)

__all__ = [
    "FEATURES",
    "Connector",
    "ConnectorMetadata",
    "Incoming",
    "KvLayout",
    "KvTransferError",
    "Node",
    "Outcome",
    "Region",
    "RegionHandle",
    "Registry",
    "buffer_of",
    "cuda_buffer_of",
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


def cuda_buffer_of(obj: Any) -> Optional[Tuple[int, int, int]]:
    """``(device address, nbytes, CUDA ordinal)`` of a CUDA array, or ``None`` for anything else.

    A CUDA array is a torch CUDA tensor (any dtype, bfloat16 included) or an object with
    ``__cuda_array_interface__`` (CuPy arrays, Numba device arrays); its GPU comes from its ``device``
    (``.index`` for torch, ``.id`` for CuPy), GPU 0 when it has none. A read-only, non-contiguous or
    empty one is a ``ValueError``.
    """
    if getattr(obj, "is_cuda", False) and hasattr(obj, "data_ptr"):
        # torch: its interface refuses bfloat16, the usual KV dtype, so the tensor is asked directly.
        if not obj.is_contiguous():
            raise ValueError("the CUDA tensor is not contiguous")
        nbytes = obj.numel() * obj.element_size()
        if nbytes == 0:
            raise ValueError("the CUDA tensor is empty")
        return int(obj.data_ptr()), nbytes, int(obj.device.index or 0)
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        return None
    address, readonly = cai["data"]
    if readonly:
        raise ValueError("the CUDA array is read-only: the engine writes into registered memory")
    shape = tuple(int(n) for n in cai["shape"])
    itemsize = int(cai["typestr"][2:])
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], itemsize
        for n in reversed(shape):
            expected.append(step)
            step *= n
        if any(n > 1 and s != e for n, s, e in zip(shape, strides, reversed(expected))):
            raise ValueError("the CUDA array is not C-contiguous")
    if nbytes == 0:
        raise ValueError("the CUDA array is empty")
    device = getattr(obj, "device", None)
    ordinal = getattr(device, "index", None)
    if ordinal is None:
        ordinal = getattr(device, "id", None)
    return int(address), nbytes, int(ordinal or 0)


def _memory_of(buffer: Any) -> Tuple[int, int, Any, Optional[int]]:
    """``(address, nbytes, keepalive, CUDA ordinal or None)`` of a CUDA array or a host buffer."""
    cuda = cuda_buffer_of(buffer)
    if cuda is not None:
        address, nbytes, device = cuda
        return address, nbytes, buffer, device
    address, nbytes, keepalive = buffer_of(buffer)
    return address, nbytes, keepalive, None


def register(node: Node, layout: KvLayout, buffer: Any) -> Region:
    """Registers ``buffer`` (its memory, in place) on ``node`` as a KV region of ``layout``.

    ``buffer`` is a writable, C-contiguous host buffer or, in a build with ``"cuda"`` in ``FEATURES``, a
    contiguous CUDA array (kept alive while the region lives).
    """
    address, nbytes, keepalive, device = _memory_of(buffer)
    if nbytes < layout.total_bytes:
        raise ValueError(f"a buffer of {nbytes} bytes is smaller than the layout's {layout.total_bytes}")
    return node._register(layout, address, nbytes, keepalive, device)


def register_kv_caches(
    connector: Connector,
    buffer: Any,
    layout: Optional[KvLayout] = None,
    blocks: Optional[int] = None,
) -> None:
    """Registers a worker's KV caches (``buffer``, in place) with ``connector``.

    ``buffer`` is host memory or, in a build with ``"cuda"`` in ``FEATURES``, a contiguous CUDA array.
    Give ``layout`` for caches as the serving engine placed them (``KvLayout.from_vllm(...)``), or
    ``blocks`` for a layer-major pool of that many blocks per layer.
    """
    address, nbytes, keepalive, device = _memory_of(buffer)
    connector._register_kv_caches(address, nbytes, keepalive, layout=layout, blocks=blocks, device=device)
