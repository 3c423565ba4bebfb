"""One serving instance as the package's tests drive it: its scheduler half and its worker half in one
process, the plan handed from one to the other as bytes (as vLLM hands it between its processes). Worker
calls go to the worker; the scheduler's calls are its own, each lookup waited for."""
from __future__ import annotations

from typing import Any

import kv_transfer as kt


class Instance:
    def __init__(self, settings: kt.ConnectorSettings, worker: kt.Worker, producer: str | None = None):
        self.worker = worker
        self.scheduler = kt.Scheduler(settings, producer=producer, own=worker.control_addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.worker, name)

    def get_num_new_matched_tokens(self, request_id, tokens, num_computed=0, transfer_params=None):
        return self.scheduler.wait_matched_tokens(request_id, tokens, num_computed, transfer_params)

    def update_state_after_alloc(self, request_id, blocks, num_external_tokens):
        self.scheduler.update_state_after_alloc(request_id, blocks, num_external_tokens)

    def record_step(self, request_id, new_blocks, replace, computed_tokens):
        return self.scheduler.record_step(request_id, new_blocks, replace, computed_tokens)

    def build_connector_meta(self) -> kt.ConnectorMetadata:
        return kt.ConnectorMetadata.from_bytes(self.scheduler.build_connector_meta().to_bytes())

    def request_finished(self, request_id):
        return self.scheduler.request_finished(request_id)

    def prometheus(self) -> str:
        return self.scheduler.prometheus() + self.worker.prometheus()

    def metrics(self):
        merged = dict(self.worker.metrics())
        for k, v in self.scheduler.metrics().items():
            merged[k] = merged.get(k, 0) + v
        return merged


def loopback_pair(producer: kt.ConnectorSettings, consumer: kt.ConnectorSettings) -> tuple[Instance, Instance]:
    p, c = kt.Worker.loopback_pair(producer, consumer)
    return Instance(producer, p), Instance(consumer, c, producer=p.control_addr)


def made(settings: kt.ConnectorSettings, make, *args, producer: str | None = None, **kwargs) -> Instance:
    """An instance whose worker is ``make(settings, *args, **kwargs)`` (``kt.Worker.tcp``, say)."""
    return Instance(settings, make(settings, *args, **kwargs), producer=producer)
