"""A vLLM KV connector over the transfer engine.

vLLM (0.32, 0.33) loads it by module path::

    kv_transfer_config={"kv_connector": "KvTransferConnector",
                        "kv_connector_module_path": "kv_transfer.vllm",
                        "kv_role": "kv_producer" | "kv_consumer",
                        "kv_buffer_device": "cpu",
                        "kv_port": 14579}

The scheduler half runs in vLLM's engine-core process (lookups, plans; no KV moved), the worker half in
each worker process (its KV caches registered in place, its TCP or RDMA node, and for a producer the host tier
store and the control server that serves consumers on threads of its own, whatever vLLM's steps do).
Metadata travels from one to the other as a JSON string.

Disaggregated prefill and decode in vLLM's proxy convention: a request to a producer whose
``kv_transfer_params`` ask ``do_remote_decode`` returns, in its output's ``kv_transfer_params``, where its
KV waits (``producer``, and every tensor-parallel rank's control address under ``ranks``); the same prompt
sent to a consumer with those parameters loads the prompt's KV from the producer instead of computing it.
A producer copies each layer into its tier store in the step that computes it (a prompt prefilled in
chunks is saved chunk by chunk), so vLLM frees the request's blocks as usual (``request_finished`` never
delays vLLM's free); instead the store holds the request's blocks for the decode, never dropping them
(a disk tier may take them) until a decode's load of them completes, or ``hold_timeout`` seconds after
their save if none comes; without a disk tier, a save that finds every slot held is dropped. Other
blocks stay loadable until the store evicts them (``store_blocks``, least valuable first).
``python -m kv_transfer.proxy`` puts this convention in front of ``vllm serve`` instances.

``kv_connector_extra_config`` keys (a key not listed, or a bad value, fails start-up naming it):

- ``kv_ip`` (``"127.0.0.1"``): the address a producer's workers serve on, at ``kv_port`` + rank; a
  consumer's workers listen there too, on a free port;
- ``weight_version`` (``0``): part of the key namespace, with the model, block size and dtype;
- ``store_blocks`` (``1024``): blocks a producer keeps in its host tier store;
- ``load_timeout`` (``10.0``): seconds a load may take before its blocks are recomputed;
- ``hold_timeout`` (``60.0``): seconds a producer holds a ``do_remote_decode`` request's blocks in its
  store when no decode loads them (``0``: no hold); ``hold_expired_blocks`` in the stats counts holds
  that ran out;
- ``prefetch_depth`` (``2``): layers a load may run ahead of the forward pass;
- ``async_loads`` (``false``): load between vLLM's steps instead of inside the forward pass: the request
  waits (vLLM's ``WAITING_FOR_REMOTE_KVS``) until a worker reports its load over, and the step never
  waits for it;
- ``kv_bandwidth_gbps`` (``0``, no cap): the most a producer serves KV at, in Gbit/s (the engine's token
  bucket);
- ``backend`` (``"tcp"``): how KV moves, ``"tcp"``, ``"shm"`` (producer and consumer on one host, Linux:
  the consumer's workers copy each block straight out of the producer's KV caches, once) or ``"rdma"``
  (libfabric; a build with feature ``rdma``, see the README); the control channel is TCP either way;
- ``shm_same_host`` (``false``): with ``backend: "tcp"``, the same-host backend beside TCP: a producer
  whose consumer runs on its host (same kernel boot and host name) copies through shared memory, other
  consumers get TCP, and one that cannot be reached over shm (another container, say) falls back to TCP;
  ``same_host_loads`` in the stats counts the loads served over shm;
- ``shm_socket_dir`` (``""``: the system's temporary directory): where a consumer's workers make their
  Unix sockets with ``backend: "shm"`` or ``shm_same_host`` (mode 0600; only the same user's processes
  may connect);
- ``rdma_provider`` (``"auto-local"``): libfabric's provider with ``backend: "rdma"``: ``"auto"``
  (``efa``, then ``verbs``, then ``tcp``), ``"auto-local"`` (``shm`` too, for peers on this host), or a
  name (``"verbs"``, ``"efa"``, ``"tcp"``, ``"shm"``);
- ``rdma_domain`` (``""``: the provider's first): the device or interface (``"mlx5_0"``, ``"lo"``);
- ``peers`` (``[]``): control addresses (``"host:port"``, a ``kv_producer`` or ``kv_both`` instance's
  ``kv_ip:kv_port``) a consumer or ``kv_both`` instance asks for the longest stored prefix of each prompt
  whose request names no producer: cross-instance prefix reuse;
- ``discovery`` (``[]``: none): etcd endpoints (``"host:port"``) where instances find each other instead
  of (or beside) ``peers``: a ``kv_producer`` or ``kv_both`` instance announces its control address
  there under its namespace (model, weight version, block size, dtype), and a ``kv_consumer`` or
  ``kv_both`` instance asks every instance announced in its own namespace, as it asks ``peers``; a build
  with feature ``etcd`` (``MATURIN_PEP517_ARGS="--features etcd"``); an etcd that cannot be reached at
  start-up fails it;
- ``discovery_ttl`` (``10.0``): seconds an announcement outlives its instance (renewed every third of
  that while it runs);
- ``disk_path`` (``""``: none) and ``disk_bytes`` (``0``): a disk tier below a producer's host store, in
  ``disk_path/rank<r>`` for each worker (one directory per instance: two instances must not share one),
  at most ``disk_bytes`` per worker; blocks leaving host memory are written there, lookups and loads cover
  it, and a restarted producer serves what it recovered (each block checksummed; one that fails is
  recomputed);
- ``disk_min_sharers`` (``1``): requests that must have used a block for it to move to disk rather than
  be dropped when it leaves host memory (``2`` keeps one-off prompts off the disk).

By default a load is synchronous: the request is scheduled at once and its layers stream during the forward
pass (``wait_for_layer_load`` waits for layer *l* while the next ones are on their way). A block that
cannot arrive intact, within ``load_timeout`` or at all, is reported by ``get_block_ids_with_load_errors``
for vLLM to recompute (``kv_load_failure_policy="recompute"``), and a load given up on never writes
another byte into vLLM's blocks. Workers report ``KvTransferStats`` (``get_kv_connector_stats``), which
vLLM logs as "KV Transfer metrics": loads, bytes, recomputed and saved blocks, and the seconds its steps
spent in the connector's calls.

KV caches in GPU memory (vLLM on a GPU) are registered in place like host ones, in a build with GPU
support (``"cuda" in kv_transfer.FEATURES``; ``kv_buffer_device`` is ignored: the caches are used where
vLLM put them). The engine copies them on its own CUDA stream; ``save_kv_layer`` first waits for the
stream that computed the layer. Not built yet: tensor parallelism proven under vLLM.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from . import Connector, ConnectorMetadata, KvLayout, KvTransferError, Registry
from ._vllm_options import EXTRA_CONFIG, _options, _socket_address

logger = logging.getLogger(__name__)

__all__ = ["KvTransferConnector", "KvTransferMetadata", "KvTransferStats", "EXTRA_CONFIG"]

_ROLES = {"kv_producer": "producer", "kv_consumer": "consumer", "kv_both": "both"}
_DTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


#: The engine's counters a worker reports in vLLM's connector stats (deltas per interval).
_STAT_COUNTERS = (
    "loads",
    "load_us",
    "bytes_in",
    "bytes_out",
    "local_tier_bytes",
    "recompute_blocks",
    "saved_blocks",
    "save_dropped_blocks",
    "retransmits",
    "same_host_loads",
    "hold_expired_blocks",
)


@dataclass
class KvTransferStats(KVConnectorStats):
    """This connector's figures for one logging interval, summed over the workers: loads and their time,
    KV bytes in and out, blocks recomputed and saved, and the seconds vLLM's step spent in the
    connector's own calls (``call_seconds``; waits for loads apart, in ``load_wait_seconds``)."""

    data: Dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: "KVConnectorStats") -> "KvTransferStats":
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, Any]:
        d = self.data
        out: Dict[str, Any] = {k: d[k] for k in sorted(d) if k not in ("load_us",)}
        loads = d.get("loads", 0)
        out["avg_load_ms"] = round(d.get("load_us", 0) / loads / 1e3, 3) if loads else 0.0
        calls = d.get("calls", 0)
        out["avg_call_us"] = round(d.get("call_seconds", 0) / calls * 1e6, 1) if calls else 0.0
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KvTransferMetadata(KVConnectorMetadata):
    """The scheduler's plan for one step, as the JSON the workers read (picklable)."""

    def __init__(self, json: str) -> None:
        self.json = json


def _stream_sync(device: Any) -> Optional[Callable[[], None]]:
    """For GPU KV caches, a call that waits for the current stream of their device (the kernels that
    wrote them); ``None`` for host caches."""
    if device.type != "cuda":
        return None
    import torch

    def sync() -> None:
        torch.cuda.current_stream(device).synchronize()

    return sync


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError(f"KV caches of dtype {name} are not supported: use float32, float16 or bfloat16")
    return _DTYPES[name]


class KvTransferConnector(KVConnectorBase_V1):
    """vLLM's ``KVConnectorBase_V1`` over the transfer engine (see the module docs)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        tc = self._kv_transfer_config
        if tc.kv_role not in _ROLES:
            raise ValueError(f"kv_role {tc.kv_role!r}: use one of {', '.join(_ROLES)}")
        self._opts = _options(dict(tc.kv_connector_extra_config or {}))
        self._role = _ROLES[tc.kv_role]
        self._port = int(tc.kv_port)
        self._tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._model = str(vllm_config.model_config.model)
        self._dtype = _dtype_name(vllm_config.model_config.dtype)
        self._layers: List[str] = []
        self._index: Dict[str, int] = {}
        self._worker: Optional[Connector] = None
        self._sync: Optional[Callable[[], None]] = None
        self._scheduler: Optional[Connector] = None
        # Scheduler side: requests waiting for an asynchronous load, since when; loads seen to finish.
        self._async_waiting: Dict[str, float] = {}
        self.async_loads_done = 0
        self.async_wait_seconds = 0.0
        # Worker side: seconds spent in this connector's calls (waits for loads apart), and the
        # engine's counters at the last stats report.
        self._call_seconds = 0.0
        self._wait_seconds = 0.0
        self._calls = 0
        self._reported: Dict[str, float] = {}
        # Discovery: the registry, the announcement a worker of rank 0 keeps (its lease), and what the
        # scheduler last found there (and when).
        self._registry: Optional[Registry] = None
        self._lease: Optional[int] = None
        self._found: Tuple[float, List[str]] = (0.0, [])
        if role == KVConnectorRole.SCHEDULER:
            layers, block_bytes = self._cache_shape(kv_cache_config)
            self._scheduler = Connector.scheduler(self._settings(layers, block_bytes, 0, {}))
            if self._role != "producer":
                self._registry = self._connect_registry()

    # ---- settings ----

    @staticmethod
    def _cache_shape(kv_cache_config: Any) -> Tuple[int, int]:
        """Attention layers and bytes of one block of one layer, from vLLM's KV cache plan."""
        if kv_cache_config is None or not kv_cache_config.kv_cache_groups:
            return 1, 1 << 16
        names = [n for g in kv_cache_config.kv_cache_groups for n in g.layer_names]
        page = kv_cache_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes
        return len(names), int(page)

    def _settings(self, layers: int, block_bytes: int, rank: int, heads: Dict[str, Any]) -> Dict[str, Any]:
        s = dict(
            role=self._role,
            model=self._model,
            weight_version=self._opts["weight_version"],
            block_size=self._block_size,
            dtype=self._dtype,
            layers=layers,
            block_bytes=block_bytes,
            store_blocks=self._opts["store_blocks"] if self._role != "consumer" else 0,
            prefetch_depth=self._opts["prefetch_depth"],
            load_timeout=self._opts["load_timeout"],
            hold_timeout=self._opts["hold_timeout"],
            async_loads=self._opts["async_loads"],
            kv_bandwidth=int(self._opts["kv_bandwidth_gbps"] * 1e9 / 8),
            tp_rank=rank,
            tp_size=self._tp_size,
        )
        if self._opts["disk_path"] and self._role != "consumer":
            s["disk_path"] = os.path.join(self._opts["disk_path"], f"rank{rank}")
            s["disk_bytes"] = self._opts["disk_bytes"]
            s["disk_min_sharers"] = self._opts["disk_min_sharers"]
        s.update(heads)
        return s

    def _control(self, rank: int) -> str:
        return _socket_address(self._opts["kv_ip"], self._port + rank)

    # ---- discovery ----

    def _namespace_key(self) -> str:
        """What an instance announces itself under: only instances that could share KV find each other."""
        return (
            f"kv-transfer model={self._model} weights={self._opts['weight_version']} "
            f"block={self._block_size} dtype={self._dtype}"
        )

    def _connect_registry(self) -> Optional[Registry]:
        endpoints = list(self._opts["discovery"])
        if not endpoints:
            return None
        try:
            return Registry.etcd(endpoints)
        except KvTransferError as e:
            raise ValueError(f"kv_connector_extra_config['discovery'] = {endpoints!r}: {e}") from e

    def _announce(self, rank: int) -> None:
        """A worker of rank 0 that serves KV announces its control address."""
        if self._role == "consumer" or rank != 0:
            return
        self._registry = self._connect_registry()
        if self._registry is not None:
            control = self._control(0)
            engine_id = zlib.crc32(control.encode()) & 0x7FFFFFFF
            self._lease = self._registry.announce(
                engine_id, control, self._namespace_key(), self._opts["discovery_ttl"]
            )

    def _peer_list(self) -> List[str]:
        """``peers``, then the instances announced in this namespace (looked up at most once a second),
        this instance apart."""
        peers = list(self._opts["peers"])
        if self._registry is None:
            return peers
        at, found = self._found
        now = time.monotonic()
        if now - at >= 1.0:
            own = self._control(0) if self._role != "consumer" else None
            try:
                found = self._registry.producers(self._namespace_key(), own)
            except KvTransferError as e:
                logger.warning("kv_transfer: discovery did not answer (using what it said last): %s", e)
            self._found = (now, found)
        return peers + [p for p in found if p not in peers]

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Tuple[int, bool]:
        params = getattr(request, "kv_transfer_params", None) or {}
        producer = None
        if isinstance(params, dict) and params.get("producer"):
            producer = {"producer": params["producer"]}
            if params.get("ranks"):
                producer["ranks"] = list(params["ranks"])
        assert self._scheduler is not None
        tokens = list(request.prompt_token_ids)
        if producer is None and self._role != "producer":
            peers = self._peer_list()
            if peers:
                producer = self._best_peer(request.request_id, tokens, num_computed_tokens, peers)
        try:
            n, load_async = self._scheduler.get_num_new_matched_tokens(
                request.request_id, tokens, num_computed_tokens, producer
            )
        except KvTransferError as e:
            # A producer that cannot answer (or refuses this instance) costs this request its KV, never
            # the engine: it computes the prompt itself.
            logger.warning("kv_transfer: request %s computes its prompt: %s", request.request_id, e)
            self._scheduler.get_num_new_matched_tokens(
                request.request_id, list(request.prompt_token_ids), num_computed_tokens, None
            )
            n, load_async = 0, False
        if self._role != "consumer" and isinstance(params, dict) and params.get("do_remote_decode"):
            self._scheduler.hold_for_decode(request.request_id)
        return n, load_async

    def _best_peer(
        self, request_id: str, tokens: List[int], num_computed: int, peers: List[str]
    ) -> Optional[Dict[str, Any]]:
        """The peer holding the longest prefix of ``tokens`` (``None`` if none holds any)."""
        assert self._scheduler is not None
        best, best_n = None, 0
        for peer in peers:
            try:
                n, _ = self._scheduler.get_num_new_matched_tokens(request_id, tokens, num_computed, {"producer": peer})
            except KvTransferError as e:
                logger.warning("kv_transfer: peer %s did not answer: %s", peer, e)
                continue
            if n > best_n:
                best, best_n = {"producer": peer}, n
        return best

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self._scheduler is not None
        block_ids = blocks.get_block_ids()[0]
        self._scheduler.update_state_after_alloc(request.request_id, list(block_ids), num_external_tokens)
        if self._opts["async_loads"] and num_external_tokens > 0:
            self._async_waiting[request.request_id] = time.monotonic()

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self._scheduler is not None
        if self._role != "consumer" and scheduler_output is not None:
            self._record_steps(scheduler_output)
        return KvTransferMetadata(self._scheduler.build_connector_meta().to_json())

    def _record_steps(self, so: Any) -> None:
        """Tells the scheduler half what this step computes, so a save covers only computed blocks (a
        prompt prefilled in chunks is saved chunk by chunk)."""
        assert self._scheduler is not None
        scheduled = so.num_scheduled_tokens
        for r in so.scheduled_new_reqs:
            self._scheduler.record_step(r.req_id, [], False, r.num_computed_tokens + scheduled.get(r.req_id, 0))
        cached = so.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None) or set()
        for i, rid in enumerate(cached.req_ids):
            new = cached.new_block_ids[i]
            blocks = list(new[0]) if new else []
            self._scheduler.record_step(rid, blocks, rid in resumed, cached.num_computed_tokens[i] + scheduled.get(rid, 0))

    def update_connector_output(self, connector_output: Any) -> None:
        # The workers' finished loads end the requests' waits (vLLM moves them on); kept as figures.
        now = time.monotonic()
        for rid in getattr(connector_output, "finished_recving", None) or ():
            started = self._async_waiting.pop(rid, None)
            if started is not None:
                self.async_loads_done += 1
                self.async_wait_seconds += now - started

    def request_finished(self, request: Any, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        assert self._scheduler is not None
        self._scheduler.request_finished(request.request_id)
        self._async_waiting.pop(request.request_id, None)
        if self._role == "consumer":
            return False, None
        params: Dict[str, Any] = {"do_remote_prefill": True, "producer": self._control(0)}
        if self._tp_size > 1:
            params["ranks"] = [self._control(r) for r in range(self._tp_size)]
        return False, params

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: Dict[str, Any]) -> None:
        if not kv_caches:
            raise ValueError("register_kv_caches: no KV caches")
        names = sorted(kv_caches, key=lambda n: kv_caches[n].storage_offset())
        first = kv_caches[names[0]]
        storage = first.untyped_storage()
        device = first.device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"{names[0]}: KV caches on {device} are not supported (cpu or cuda)")
        for n in names:
            t = kv_caches[n]
            if t.device != device:
                raise ValueError(f"{n}: KV caches on {t.device} beside others on {device}")
            if t.untyped_storage().data_ptr() != storage.data_ptr():
                raise ValueError(f"{n}: the KV caches are not views over one buffer")
            if t.dim() != 4:
                raise ValueError(f"{n}: a KV cache of shape {tuple(t.shape)}; expected 4 dimensions")
        views = [(list(kv_caches[n].shape), list(kv_caches[n].stride()), kv_caches[n].storage_offset()) for n in names]
        elem = first.element_size()
        layout = KvLayout.from_vllm(views, elem, _dtype_name(first.dtype))
        heads = {"kv_heads": int(first.shape[1]), "head_size": int(first.shape[3]), "kv_kind": layout.kind}
        rank = self._tp_rank()
        settings = self._settings(len(names), layout.block_bytes, rank, heads)
        engine_id = zlib.crc32(f"{self._role}:{self._port}:{rank}:{os.getpid()}".encode()) & 0x7FFFFFFF
        # A role that loads listens (producers dial it); a role that saves serves at kv_port + rank.
        listen = _socket_address(self._opts["kv_ip"], 0) if self._role != "producer" else None
        control = self._control(rank) if self._role != "consumer" else None
        if self._opts["backend"] == "rdma":
            domain = self._opts["rdma_domain"] or None
            conn = Connector.rdma(settings, engine_id, self._opts["rdma_provider"], domain, control_listen=control)
        elif self._opts["backend"] == "shm":
            conn = Connector.shm(settings, engine_id, socket=self._shm_socket(engine_id), control_listen=control)
        elif self._opts["shm_same_host"]:
            socket = self._shm_socket(engine_id)
            conn = Connector.tcp_with_shm(settings, engine_id, listen=listen, socket=socket, control_listen=control)
        else:
            conn = Connector.tcp(settings, engine_id, listen=listen, control_listen=control)
        ordinal = int(device.index or 0) if device.type == "cuda" else None
        conn._register_kv_caches(
            storage.data_ptr(), storage.nbytes(), (storage, kv_caches), layout=layout, device=ordinal
        )
        # GPU caches are read on the engine's own stream: a save first waits for the kernels that wrote them.
        self._sync = _stream_sync(device)
        self._layers, self._index = names, {n: i for i, n in enumerate(names)}
        self._worker = conn
        self._announce(rank)

    def _shm_socket(self, engine_id: int) -> Optional[str]:
        """The Unix socket a worker that loads listens on for same-host producers (none for a producer)."""
        if self._role == "producer":
            return None
        folder = self._opts["shm_socket_dir"] or tempfile.gettempdir()
        return os.path.join(folder, f"kv-transfer-{engine_id:08x}.sock")

    def _tp_rank(self) -> int:
        if self._tp_size == 1:
            return 0
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())

    def _require_worker(self, call: str) -> Connector:
        if self._worker is None:
            raise RuntimeError(f"{call} before register_kv_caches")
        return self._worker

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, KvTransferMetadata):
            self._worker.bind_connector_metadata(ConnectorMetadata.from_json(connector_metadata.json))

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.clear_connector_metadata()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._role != "producer":
            t = time.perf_counter()
            self._require_worker("start_load_kv").start_load_kv()
            self._spent(t)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._role != "producer" and self._worker is not None:
            t = time.perf_counter()
            self._worker.wait_for_layer_load(self._index[layer_name])
            self._wait_seconds += time.perf_counter() - t

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        if self._role != "consumer":
            t = time.perf_counter()
            if self._sync is not None:
                self._sync()
            self._require_worker("save_kv_layer").save_kv_layer(self._index[layer_name])
            self._spent(t)

    def wait_for_save(self) -> None:
        if self._role != "consumer" and self._worker is not None:
            t = time.perf_counter()
            self._worker.wait_for_save()
            self._spent(t)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        # Blocks are never held past a step (no sends to report); loads are reported to vLLM only when
        # they are asynchronous (a synchronous one ended inside the forward pass).
        if self._worker is None:
            return None, None
        t = time.perf_counter()
        _, received = self._worker.get_finished()
        self._spent(t)
        if self._opts["async_loads"] and received:
            return None, set(received)
        return None, None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        if self._worker is None:
            return set()
        for reason in self._worker.take_load_errors():
            logger.warning("kv_transfer: a load could not start (its blocks are recomputed): %s", reason)
        return set(self._worker.failed_blocks())

    def _spent(self, since: float) -> None:
        self._call_seconds += time.perf_counter() - since
        self._calls += 1

    # ---- stats ----

    def get_kv_connector_stats(self) -> Optional["KvTransferStats"]:
        """What this worker did since the last call (vLLM sums the workers' and logs the interval)."""
        if self._worker is None:
            return None
        now: Dict[str, float] = {k: float(v) for k, v in self._worker.metrics().items() if k in _STAT_COUNTERS}
        now["call_seconds"] = self._call_seconds
        now["load_wait_seconds"] = self._wait_seconds
        now["calls"] = float(self._calls)
        delta = {k: v - self._reported.get(k, 0.0) for k, v in now.items()}
        self._reported = now
        if not any(delta.values()):
            return None
        return KvTransferStats(data=delta)

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> Optional["KvTransferStats"]:
        return KvTransferStats(data=dict(data) if data else {})

    def shutdown(self) -> None:
        if self._registry is not None and self._lease is not None:
            try:
                self._registry.withdraw(self._lease)
            except KvTransferError as e:
                logger.warning("kv_transfer: the announcement was not withdrawn (it expires): %s", e)
            self._lease = None
        self._worker = None
        self._scheduler = None
