"""The connector's worker half, in each vLLM worker process: its KV caches registered in place, its
transport node, and for a role that saves the host tier store and the control server, which serves
consumers on threads of its own whatever vLLM's steps do."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorHandshakeMetadata

from .._native import ConnectorMetadata, ConnectorSettings, KvLayout, Registry, Worker
from ..errors import ConfigurationError, KvTransferError
from .options import Options, socket_address
from .stats import STAT_COUNTERS

logger = logging.getLogger("kv_transfer.vllm")

_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def dtype_name(dtype: Any) -> str:
    """The connector's name for a torch dtype of KV caches."""
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise ConfigurationError(f"KV caches of dtype {name} are not supported: use float32, float16 or bfloat16")
    return _DTYPES[name]


@dataclass
class KvTransferHandshake(KVConnectorHandshakeMetadata):
    """What a worker tells the scheduler through vLLM's own handshake: its rank and control address."""

    rank: int
    size: int
    control: str | None


def _stream_sync(device: Any) -> Callable[[], None] | None:
    """For GPU KV caches, a call that waits for the current stream of their device (the kernels that
    wrote them); ``None`` for host caches."""
    if device.type != "cuda":
        return None
    import torch

    def sync() -> None:
        torch.cuda.current_stream(device).synchronize()

    return sync


class WorkerSide:
    """What vLLM's worker-role connector does, over a native :class:`Worker` made at
    ``register_kv_caches``."""

    def __init__(self, opts: Options, role: str, port: int, tp_size: int, settings: Callable[..., ConnectorSettings],
                 namespace: str) -> None:
        self.opts, self.role, self.port, self.tp_size = opts, role, port, tp_size
        self.make_settings, self.namespace = settings, namespace
        self.native: Worker | None = None
        self.layers: list[str] = []
        self.index: dict[str, int] = {}
        self.sync: Callable[[], None] | None = None
        self.registry: Registry | None = None
        self.lease: int | None = None
        self.call_seconds = 0.0
        self.wait_seconds = 0.0
        self.calls = 0
        self.reported: dict[str, float] = {}

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        import torch

        if not kv_caches:
            raise ConfigurationError("register_kv_caches: no KV caches")
        names = sorted(kv_caches, key=lambda n: kv_caches[n].storage_offset())
        first = kv_caches[names[0]]
        storage = first.untyped_storage()
        device = first.device
        if device.type not in ("cpu", "cuda"):
            raise ConfigurationError(f"{names[0]}: KV caches on {device} are not supported (cpu or cuda)")
        for n in names:
            t = kv_caches[n]
            if t.device != device:
                raise ConfigurationError(f"{n}: KV caches on {t.device} beside others on {device}")
            if t.untyped_storage().data_ptr() != storage.data_ptr():
                raise ConfigurationError(f"{n}: the KV caches are not views over one buffer")
            if t.dim() != 4:
                raise ConfigurationError(f"{n}: a KV cache of shape {tuple(t.shape)}; expected 4 dimensions")
        views = [(list(kv_caches[n].shape), list(kv_caches[n].stride()), kv_caches[n].storage_offset()) for n in names]
        layout = KvLayout.from_vllm(views, first.element_size(), dtype_name(first.dtype))
        heads = {"kv_heads": int(first.shape[1]), "head_size": int(first.shape[3]), "kv_kind": layout.kind}
        rank = self._tp_rank()
        settings = self.make_settings(len(names), layout.block_bytes, rank, heads)
        engine_id = zlib.crc32(f"{self.role}:{self.port}:{rank}:{os.getpid()}".encode()) & 0x7FFFFFFF
        # A role that loads listens (producers dial it); a role that saves serves at kv_port + rank.
        listen = socket_address(self.opts.kv_ip, 0) if self.role != "producer" else None
        control = self.opts.control(self.port + rank) if self.role != "consumer" else None
        opts = self.opts
        if opts.backend == "rdma":
            conn = Worker.rdma(settings, engine_id, opts.rdma_provider, opts.rdma_domain or None, control_listen=control)
        elif opts.backend == "shm":
            conn = Worker.shm(settings, engine_id, socket=self._shm_socket(engine_id), control_listen=control)
        elif opts.shm_same_host:
            conn = Worker.tcp_with_shm(
                settings, engine_id, listen=listen, socket=self._shm_socket(engine_id), control_listen=control
            )
        else:
            conn = Worker.tcp(settings, engine_id, listen=listen, control_listen=control)
        # The whole buffer the views lie in, as one uint8 tensor the native module reads (and holds).
        whole = torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),))
        conn.register_kv_caches(whole, layout=layout)
        # GPU caches are read on the engine's own stream: a save first waits for the kernels that wrote them.
        self.sync = _stream_sync(device)
        self.layers, self.index = names, {n: i for i, n in enumerate(names)}
        self.native = conn
        self._announce(rank)

    def _shm_socket(self, engine_id: int) -> str | None:
        """The Unix socket a worker that loads listens on for same-host producers (none for a producer)."""
        if self.role == "producer":
            return None
        folder = self.opts.shm_socket_dir or tempfile.gettempdir()
        return os.path.join(folder, f"kv-transfer-{engine_id:08x}.sock")

    def _tp_rank(self) -> int:
        if self.tp_size == 1:
            return 0
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())

    def _announce(self, rank: int) -> None:
        """A worker of rank 0 that serves KV announces its control address, and publishes what its
        store holds to the cluster index."""
        if self.role == "consumer" or rank != 0:
            return
        if self.opts.index and self.native is not None:
            self.native.publish_to_index(self.opts.index, instance=self.opts.control(self.port))
        if not self.opts.discovery:
            return
        self.registry = Registry.etcd(list(self.opts.discovery), secret_file=self.opts.secret_file or None)
        control = self.opts.control(self.port)
        engine_id = zlib.crc32(control.encode()) & 0x7FFFFFFF
        self.lease = self.registry.announce(engine_id, control, self.namespace, self.opts.discovery_ttl)

    def handshake(self) -> KvTransferHandshake | None:
        if self.native is None:
            return None
        h = self.native.rank_handshake()
        return KvTransferHandshake(rank=int(h["rank"]), size=int(h["size"]), control=h["control"])

    def require(self, call: str) -> Worker:
        if self.native is None:
            raise ConfigurationError(f"{call} before register_kv_caches")
        return self.native

    def _spent(self, since: float) -> None:
        self.call_seconds += time.perf_counter() - since
        self.calls += 1

    def bind(self, data: bytes) -> None:
        if self.native is not None:
            self.native.bind_connector_metadata(ConnectorMetadata.from_bytes(data))

    def clear(self) -> None:
        if self.native is not None:
            self.native.clear_connector_metadata()

    def handle_preemptions(self, data: bytes) -> None:
        if self.native is not None:
            self.native.handle_preemptions(ConnectorMetadata.from_bytes(data))

    def start_load_kv(self) -> None:
        if self.role != "producer":
            t = time.perf_counter()
            self.require("start_load_kv").start_load_kv()
            self._spent(t)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self.role != "producer" and self.native is not None:
            t = time.perf_counter()
            self.native.wait_for_layer_load(self.index[layer_name])
            self.wait_seconds += time.perf_counter() - t

    def save_kv_layer(self, layer_name: str) -> None:
        if self.role != "consumer":
            t = time.perf_counter()
            if self.sync is not None:
                self.sync()
            self.require("save_kv_layer").save_kv_layer(self.index[layer_name])
            self._spent(t)

    def wait_for_save(self) -> None:
        if self.role != "consumer" and self.native is not None:
            t = time.perf_counter()
            self.native.wait_for_save()
            self._spent(t)

    def get_finished(self) -> tuple[set[str] | None, set[str] | None]:
        # Blocks are never held past a step (no sends to report); loads are reported to vLLM only when
        # they are asynchronous (a synchronous one ended inside the forward pass).
        if self.native is None:
            return None, None
        t = time.perf_counter()
        _, received = self.native.get_finished()
        self._spent(t)
        if self.opts.async_loads and received:
            return None, set(received)
        return None, None

    def take_kv_events(self) -> list[tuple[str, bytes, bytes | None, list[int], str]]:
        """The store's KV events since the last call (none before registration or for a consumer)."""
        if self.native is None or self.role == "consumer":
            return []
        return self.native.take_kv_events()

    def failed_blocks(self) -> set[int]:
        if self.native is None:
            return set()
        for reason in self.native.take_load_errors():
            if not isinstance(reason, KvTransferError) or reason.fault == "caller":
                logger.error("kv_transfer: a load could not start, a configuration mistake: %s", reason)
            else:
                logger.warning("kv_transfer: a load could not start (its blocks are recomputed): %s", reason)
        return set(self.native.failed_blocks())

    def stats(self) -> dict[str, float]:
        """What this worker did since the last call (vLLM sums the workers' and logs the interval)."""
        if self.native is None:
            return {}
        now: dict[str, float] = {k: float(v) for k, v in self.native.metrics().items() if k in STAT_COUNTERS}
        for scheduler_side in ("lookup_blocks", "lookup_hits", "index_lookups", "index_lookup_failures", "index_stale_entries"):
            now.pop(scheduler_side, None)
        now["call_seconds"] = self.call_seconds
        now["load_wait_seconds"] = self.wait_seconds
        now["calls"] = float(self.calls)
        delta = {k: v - self.reported.get(k, 0.0) for k, v in now.items()}
        self.reported = now
        return delta

    def shutdown(self) -> None:
        if self.registry is not None and self.lease is not None:
            try:
                self.registry.withdraw(self.lease)
            except KvTransferError as e:
                logger.warning("kv_transfer: the announcement was not withdrawn (it expires): %s", e)
            self.lease = None
        self.native = None
