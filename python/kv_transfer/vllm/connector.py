"""The connector vLLM loads: a thin facade over the scheduler half or the worker half, whichever vLLM made
it for (see the package docs)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from .._native import ConnectorSettings
from ..errors import ConfigurationError
from .options import Options, parse
from .scheduler import SchedulerSide
from .stats import KvTransferPromMetrics, KvTransferStats
from .worker import KvTransferHandshake, WorkerSide, dtype_name

logger = logging.getLogger("kv_transfer.vllm")

__all__ = ["KvTransferConnector", "KvTransferMetadata"]

_ROLES = {"kv_producer": "producer", "kv_consumer": "consumer", "kv_both": "both"}


class KvTransferMetadata(KVConnectorMetadata):
    """The scheduler's plan for one step, as the bytes the workers read (picklable)."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def _cache_shape(kv_cache_config: Any) -> tuple[int, int]:
    """Attention layers and bytes of one block of one layer, from vLLM's KV cache plan."""
    if kv_cache_config is None or not kv_cache_config.kv_cache_groups:
        return 1, 1 << 16
    names = [n for g in kv_cache_config.kv_cache_groups for n in g.layer_names]
    page = kv_cache_config.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    return len(names), int(page)


class KvTransferConnector(KVConnectorBase_V1):
    """vLLM's ``KVConnectorBase_V1`` over the transfer engine (see the module docs): a facade over the
    scheduler half or the worker half, whichever vLLM made it for."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        tc = self._kv_transfer_config
        if tc.kv_role not in _ROLES:
            raise ConfigurationError(f"kv_role {tc.kv_role!r}: use one of {', '.join(_ROLES)}")
        self._opts: Options = parse(dict(tc.kv_connector_extra_config or {}))
        self._kv_role = _ROLES[tc.kv_role]
        port = int(tc.kv_port)
        self._tp_size = int(vllm_config.parallel_config.tensor_parallel_size)
        self._block_size = int(vllm_config.cache_config.block_size)
        self._model = str(vllm_config.model_config.model)
        self._dtype = dtype_name(vllm_config.model_config.dtype)
        kv_events = getattr(vllm_config, "kv_events_config", None)
        self._kv_events = bool(kv_events is not None and kv_events.enable_kv_cache_events)
        self._events: list[Any] = []
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            layers, block_bytes = _cache_shape(kv_cache_config)
            settings = self._settings(layers, block_bytes, 0, {})
            self._scheduler = SchedulerSide(
                settings, self._opts, self._kv_role, port, self._namespace_key(),
                kv_events=self._kv_events and self._kv_role != "consumer",
            )
        else:
            self._worker = WorkerSide(self._opts, self._kv_role, port, self._tp_size, self._settings,
                                      self._namespace_key())

    # ---- settings ----

    def _settings(self, layers: int, block_bytes: int, rank: int, heads: dict[str, Any]) -> ConnectorSettings:
        s = dict(self._opts.tuning())
        s.update(
            role=self._kv_role,
            model=self._model,
            block_size=self._block_size,
            dtype=self._dtype,
            layers=layers,
            block_bytes=block_bytes,
            tp_rank=rank,
            tp_size=self._tp_size,
            kv_events=self._kv_events and self._kv_role != "consumer",
        )
        if self._kv_role == "consumer":
            s["store_blocks"] = 0
        if self._opts.disk_path and self._kv_role != "consumer":
            import os

            s["disk_path"] = os.path.join(self._opts.disk_path, f"rank{rank}")
            s["disk_bytes"] = self._opts.disk_bytes
        s.update(heads)
        return ConnectorSettings(**s)

    def _namespace_key(self) -> str:
        """What an instance announces itself under: only instances that could share KV find each other."""
        return (
            f"kv-transfer model={self._model} weights={self._opts.weight_version} "
            f"block={self._block_size} dtype={self._dtype}"
        )

    def _sched(self) -> SchedulerSide:
        if self._scheduler is None:
            raise ConfigurationError("a scheduler call on a worker-role connector")
        return self._scheduler

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._sched().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict[Any, int]:
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        names = {"host": CacheHitSource.HOST, "disk": CacheHitSource.DISK, "p2p": CacheHitSource.P2P}
        found = self._sched().hit_sources(request, num_external_tokens)
        return {names[k]: n for k, n in found.items() if n}

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KvTransferMetadata(self._sched().build_connector_meta(scheduler_output))

    def update_connector_output(self, connector_output: Any) -> None:
        self._sched().update_connector_output(connector_output)
        events = getattr(connector_output, "kv_cache_events", None)
        if self._kv_events and events is not None:
            from .events import KvTransferKVEvents

            if isinstance(events, KvTransferKVEvents):
                self._events.extend(events.aggregate().get_all_events())

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._sched().request_finished(request)

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        handshakes = [
            {"rank": m.rank, "size": m.size, "control": m.control}
            for m in metadata.values()
            if isinstance(m, KvTransferHandshake) and m.control is not None
        ]
        if handshakes and self._scheduler is not None and self._kv_role != "consumer":
            self._scheduler.set_rank_handshakes(handshakes)

    def take_events(self) -> Iterable[Any]:
        """The host and disk tiers' KV events the workers reported since the last call (see
        :mod:`kv_transfer.vllm.events`)."""
        events, self._events = self._events, []
        return events

    # ---- worker side ----

    def _work(self) -> WorkerSide:
        if self._worker is None:
            raise ConfigurationError("a worker call on a scheduler-role connector")
        return self._worker

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._work().register_kv_caches(kv_caches)

    def get_handshake_metadata(self) -> KvTransferHandshake | None:
        return self._worker.handshake() if self._worker is not None else None

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, KvTransferMetadata):
            self._worker.bind(connector_metadata.data)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.clear()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self._worker is not None and isinstance(kv_connector_metadata, KvTransferMetadata):
            self._worker.handle_preemptions(kv_connector_metadata.data)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._work().start_load_kv()

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._work().wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        self._work().save_kv_layer(layer_name)

    def wait_for_save(self) -> None:
        self._work().wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker.get_finished() if self._worker is not None else (None, None)

    def get_kv_connector_kv_cache_events(self) -> Any:
        if self._worker is None or not self._kv_events:
            return None
        from .events import worker_events

        return worker_events(self._worker.take_kv_events(), self._block_size, self._tp_size)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.failed_blocks() if self._worker is not None else set()

    # ---- stats ----

    def get_kv_connector_stats(self) -> KvTransferStats | None:
        """What this half did since the last call (vLLM sums the workers' and the scheduler's)."""
        half = self._worker if self._worker is not None else self._scheduler
        delta = half.stats() if half is not None else {}
        if not any(delta.values()):
            return None
        return KvTransferStats(data=delta)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KvTransferStats | None:
        return KvTransferStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KvTransferPromMetrics:
        return KvTransferPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        self._worker = None
        self._scheduler = None
