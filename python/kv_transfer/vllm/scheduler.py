"""The connector's scheduler half, in vLLM's engine-core process: lookups (in Rust, in the background: no
call here waits on the network), plans for the workers, transfer parameters. It moves no KV.

While a lookup runs, vLLM asks again on every step; a step that schedules nothing waits (at most
``IDLE_STEP_WAIT``) for a lookup to end instead, or vLLM's loop would spin through empty steps, and on a
small host starve the very producers the lookup waits for (seen on two cores: a holder's answer was late by
seconds)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from .._native import ConnectorSettings, Registry, Scheduler
from ..errors import ConfigurationError, KvTransferError
from .options import Options

logger = logging.getLogger("kv_transfer.vllm")

#: Seconds between two warnings about the same producer not answering.
_WARN_EVERY = 10.0
#: Seconds a step that schedules nothing waits, at most, for a running lookup to end.
IDLE_STEP_WAIT = 0.01


class SchedulerSide:
    """What vLLM's scheduler-role connector does, over a native :class:`Scheduler`."""

    def __init__(
        self, settings: ConnectorSettings, opts: Options, role: str, port: int, namespace: str, kv_events: bool = False
    ) -> None:
        self.opts, self.role, self.kv_events = opts, role, kv_events
        own = opts.control(port) if role != "consumer" else None
        self.native = Scheduler(settings, peers=list(opts.peers), own=own)
        self.registry: Registry | None = None
        if role != "producer" and opts.discovery:
            try:
                self.registry = Registry.etcd(list(opts.discovery), secret_file=opts.secret_file or None)
            except KvTransferError as e:
                raise ConfigurationError(f"kv_connector_extra_config['discovery'] = {list(opts.discovery)!r}: {e}") from e
            # Refreshed in Rust, in the background: a registry that is slow costs vLLM's thread nothing.
            self.native.follow(self.registry, namespace, exclude=own)
        if role != "producer" and opts.index:
            # Asked in the lookup's background task: one round trip names the holders, only they are asked.
            self.native.use_index(opts.index, instance=own, timeout=opts.index_timeout)
        # Whether vLLM's own block hashes are this connector's keys, byte for byte (found on the first
        # request with a full block; then prompts are not hashed again).
        self.hashes_usable: bool | None = None
        self.async_waiting: dict[str, float] = {}
        self.async_loads_done = 0
        self.async_wait_seconds = 0.0
        self.seconds = 0.0
        self.warned: dict[str, float] = {}
        self.reported: dict[str, float] = {}

    def _hashes(self, request: Any, tokens: Sequence[int]) -> Sequence[bytes] | None:
        hashes = getattr(request, "block_hashes", None)
        if not hashes:
            return None
        if self.hashes_usable is None:
            self.hashes_usable = self.native.keys_match(tokens, [bytes(h) for h in hashes])
            logger.info(
                "kv_transfer: vLLM's block hashes %s this connector's keys",
                "are" if self.hashes_usable else "are not (prompts are hashed here)",
            )
        return [bytes(h) for h in hashes] if self.hashes_usable else None

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        started = time.perf_counter()
        try:
            if self.native.lookup_running(request.request_id):
                return None, False  # vLLM asks again on a later step; the prompt need not cross again
            params = getattr(request, "kv_transfer_params", None) or {}
            producer = None
            if isinstance(params, dict) and params.get("producer"):
                producer = {"producer": params["producer"]}
                if params.get("ranks"):
                    producer["ranks"] = list(params["ranks"])
            tokens = list(request.prompt_token_ids)
            answer = self.native.get_num_new_matched_tokens(
                request.request_id, tokens, num_computed_tokens, producer, self._hashes(request, tokens)
            )
            self._warn_lookup_errors()
            if answer is None:
                return None, False  # the lookup runs; vLLM asks again on a later step
            if self.role != "consumer" and isinstance(params, dict) and params.get("do_remote_decode"):
                self.native.hold_for_decode(request.request_id)
            if self.kv_events and not self.hashes_usable:
                # The KV events of its saves then name its blocks as vLLM's own events do.
                theirs = [bytes(h) for h in getattr(request, "block_hashes", None) or ()]
                if theirs and all(len(h) == 32 for h in theirs):
                    self.native.set_engine_hashes(request.request_id, theirs)
            return answer
        finally:
            self.seconds += time.perf_counter() - started

    def _warn_lookup_errors(self) -> None:
        now = time.monotonic()
        for e in self.native.take_lookup_errors():
            key = str(e).split(":")[0]
            if now - self.warned.get(key, -_WARN_EVERY) >= _WARN_EVERY:
                self.warned[key] = now
                logger.warning("kv_transfer: a lookup found nothing there (the prompt is computed): %s", e)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        block_ids = blocks.get_block_ids()[0]
        self.native.update_state_after_alloc(request.request_id, list(block_ids), num_external_tokens)
        if self.opts.async_loads and num_external_tokens > 0:
            self.async_waiting[request.request_id] = time.monotonic()

    def hit_sources(self, request: Any, num_external_tokens: int) -> dict[str, int]:
        return self.native.hit_sources(request.request_id, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> bytes:
        started = time.perf_counter()
        if scheduler_output is not None:
            for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
                self.native.request_preempted(rid)
            if self.role != "consumer":
                self._record_steps(scheduler_output)
            if getattr(scheduler_output, "total_num_scheduled_tokens", 1) == 0:
                waited = time.perf_counter()
                self.native.wait_for_lookups(IDLE_STEP_WAIT)
                started += time.perf_counter() - waited  # idle, not the connector's work
        data = self.native.build_connector_meta().to_bytes()
        self.seconds += time.perf_counter() - started
        return data

    def _record_steps(self, so: Any) -> None:
        """Tells the scheduler half what this step computes, so a save covers only computed blocks (a
        prompt prefilled in chunks is saved chunk by chunk)."""
        scheduled = so.num_scheduled_tokens
        for r in so.scheduled_new_reqs:
            self.native.record_step(r.req_id, [], False, r.num_computed_tokens + scheduled.get(r.req_id, 0))
        cached = so.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", None) or set()
        for i, rid in enumerate(cached.req_ids):
            new = cached.new_block_ids[i]
            blocks = list(new[0]) if new else []
            self.native.record_step(rid, blocks, rid in resumed, cached.num_computed_tokens[i] + scheduled.get(rid, 0))

    def update_connector_output(self, connector_output: Any) -> None:
        # The workers' finished loads end the requests' waits (vLLM moves them on); kept as figures.
        now = time.monotonic()
        for rid in getattr(connector_output, "finished_recving", None) or ():
            began = self.async_waiting.pop(rid, None)
            if began is not None:
                self.async_loads_done += 1
                self.async_wait_seconds += now - began

    def request_finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        _, params = self.native.request_finished(request.request_id)
        self.async_waiting.pop(request.request_id, None)
        if self.role == "consumer" or params is None:
            return False, None
        return False, dict(params, do_remote_prefill=True)

    def set_rank_handshakes(self, handshakes: Sequence[dict[str, Any]]) -> None:
        self.native.set_rank_handshakes(list(handshakes))

    def stats(self) -> dict[str, float]:
        """What the scheduler half did since the last call (lookups, and its own time)."""
        mine = ("lookup_blocks", "lookup_hits", "index_lookups", "index_lookup_failures", "index_stale_entries")
        now = {k: float(v) for k, v in self.native.metrics().items() if k in mine}
        now["scheduler_seconds"] = self.seconds
        delta = {k: v - self.reported.get(k, 0.0) for k, v in now.items()}
        self.reported = now
        return delta
