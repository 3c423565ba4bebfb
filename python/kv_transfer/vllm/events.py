"""The connector's KV events in vLLM's shape: its host store and disk tier as ``BlockStored`` and
``BlockRemoved`` with their medium (``"CPU"``, ``"STORAGE"``), so that vLLM's KV event publisher
(``--kv-events-config``) carries them beside its own GPU events to KV-aware routers (llm-d, Dynamo).

Each worker hands its store's events to vLLM (``get_kv_connector_kv_cache_events``); vLLM gathers the
workers' into one :class:`KvTransferKVEvents` per step, which the scheduler's connector receives in
``update_connector_output``. With tensor parallelism only the events every worker reported are kept (a
block is loadable from this instance only when every rank holds its shard), as vLLM's
``KVEventAggregator`` does. ``take_events`` then yields them to the publisher.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.distributed.kv_events import (
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVConnectorKVEvents,
    KVEventAggregator,
)
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

#: One event as the native worker gives it: kind, hash, parent, tokens, medium.
RawEvent = tuple[str, bytes, "bytes | None", list[int], str]


class KvTransferKVEvents(KVConnectorKVEvents):
    """The events of one step from the workers that reported them (picklable: it crosses processes)."""

    def __init__(self, num_workers: int = 1) -> None:
        self._aggregator = KVEventAggregator(num_workers)

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self._aggregator.add_events(events)

    def aggregate(self) -> KvTransferKVEvents:
        """Keeps only the events every worker reported."""
        common = self._aggregator.get_common_events()
        self._aggregator.clear_events()
        self._aggregator.add_events(common)
        self._aggregator.reset_workers()
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._aggregator.increment_workers(count)

    def get_all_events(self) -> list[KVCacheEvent]:
        return list(self._aggregator.get_all_events())

    def get_number_of_workers(self) -> int:
        return int(self._aggregator.get_number_of_workers())

    def clear_events(self) -> None:
        self._aggregator.clear_events()
        self._aggregator.reset_workers()

    def __repr__(self) -> str:
        return f"<KvTransferKVEvents {self._aggregator!r}>"


def _hash(h: bytes) -> Any:
    return maybe_convert_block_hash(h)


def vllm_events(raw: Sequence[RawEvent], block_size: int) -> list[KVCacheEvent]:
    """vLLM events of the native worker's: consecutive stores of one chain on one medium become one
    ``BlockStored`` of several blocks, as vLLM's own are."""
    out: list[KVCacheEvent] = []
    last: tuple[str, bytes] | None = None  # (medium, hash) of the last block of out[-1], a chain's store
    for kind, h, parent, tokens, medium in raw:
        if kind == "removed":
            out.append(BlockRemoved(block_hashes=[_hash(h)], medium=medium))
            last = None
            continue
        prev = out[-1] if out else None
        if (
            last is not None and isinstance(prev, BlockStored) and parent is not None
            and last == (medium, parent) and tokens and len(prev.token_ids) == block_size * len(prev.block_hashes)
        ):
            prev.block_hashes.append(_hash(h))
            prev.token_ids.extend(tokens)
        else:
            out.append(BlockStored(
                block_hashes=[_hash(h)], parent_block_hash=None if parent is None else _hash(parent),
                token_ids=list(tokens), block_size=block_size, lora_id=None, medium=medium, lora_name=None,
            ))
        last = (medium, h)
    return out


def worker_events(raw: Sequence[RawEvent], block_size: int, tp_size: int) -> KvTransferKVEvents | None:
    """One worker's events of a step, for vLLM: ``None`` when there are none, unless the instance has
    several ranks (then every rank reports, empty or not, so that vLLM counts it among the workers an
    event must come from)."""
    if not raw and tp_size == 1:
        return None
    events = KvTransferKVEvents(num_workers=1)
    events.add_events(vllm_events(raw, block_size))
    return events
