"""What the connector reports to vLLM: ``KvTransferStats`` (vLLM logs it as "KV Transfer metrics" and
aggregates it across the workers and the scheduler) and ``KvTransferPromMetrics`` (the same figures on
vLLM's own ``/metrics`` endpoint, as ``vllm:kv_transfer_*`` counters with vLLM's labels, so operators
scrape them where they already scrape vLLM)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

#: The engine's counters a worker or the scheduler reports (deltas per interval), with what each counts.
STAT_COUNTERS: dict[str, str] = {
    "lookup_blocks": "Blocks of prompts looked up for KV held elsewhere (scheduler).",
    "lookup_hits": "Blocks of those found loadable (scheduler).",
    "loads": "Loads finished (consumer workers).",
    "load_us": "Microseconds those loads took, in all.",
    "bytes_in": "KV bytes loaded into this instance's caches.",
    "bytes_out": "KV bytes this instance's store served to others.",
    "local_tier_bytes": "KV bytes copied from this instance's own store (a kv_both instance).",
    "recompute_blocks": "Blocks handed back to vLLM to recompute.",
    "saved_blocks": "Blocks saved whole into the store.",
    "save_dropped_blocks": "Blocks a save could not store.",
    "retransmits": "Frames the transfer engine sent again.",
    "same_host_loads": "Loads served over shared memory to a consumer on this host.",
    "hold_expired_blocks": "Blocks held for a decode that never came.",
    "index_lookups": "Cluster-index lookups answered (scheduler).",
    "index_lookup_failures": "Cluster-index lookups that failed or timed out; the peers were asked instead.",
    "index_stale_entries": "Index entries skipped: their instance's lease lapsed (it left or stalled).",
    "index_published": "Block events published to the cluster index (rank 0).",
    "index_publish_dropped": "Block events dropped (queue full, Redis failing); a re-sync repairs them.",
    "index_renew_failures": "Lease renewals that failed: past the lease the index stops naming this instance.",
    "index_resyncs": "Full re-syncs of this instance's store into the index.",
    "kv_events_dropped": "KV events of the host and disk tiers dropped, not taken in time.",
}


@dataclass
class KvTransferStats(KVConnectorStats):
    """This connector's figures for one logging interval, summed over the workers and the scheduler:
    lookups and their hits, loads and their time, KV bytes in and out, blocks recomputed and saved, and
    the seconds vLLM's step spent in the connector's own calls (``call_seconds``; waits for loads apart,
    in ``load_wait_seconds``; the scheduler's, in ``scheduler_seconds``)."""

    data: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KvTransferStats:
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, Any]:
        d = self.data
        out: dict[str, Any] = {k: d[k] for k in sorted(d) if k != "load_us"}
        loads = d.get("loads", 0)
        out["avg_load_ms"] = round(d.get("load_us", 0) / loads / 1e3, 3) if loads else 0.0
        calls = d.get("calls", 0)
        out["avg_call_us"] = round(d.get("call_seconds", 0) / calls * 1e6, 1) if calls else 0.0
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


#: Figures kept in seconds on the Prometheus side (the stats carry them in other units or as sums).
_SECONDS = {"load_us": ("load_seconds", 1e-6)}
_TIMES = {
    "call_seconds": "Seconds vLLM's steps spent in the connector's worker calls (load waits apart).",
    "load_wait_seconds": "Seconds vLLM's forward passes waited for layers to load.",
    "scheduler_seconds": "Seconds vLLM's scheduler thread spent in the connector's calls.",
}


class KvTransferPromMetrics(KVConnectorPromMetrics):
    """Every connector counter as a ``vllm:kv_transfer_<name>`` Prometheus counter, labelled as vLLM
    labels its own (model name, engine index), fed from the aggregated stats."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters: dict[str, dict[int, Any]] = {}
        self.scale: dict[str, float] = {}
        named = {k: (_SECONDS.get(k, (k, 1.0))[0], doc) for k, doc in STAT_COUNTERS.items()}
        named.update({k: (k, doc) for k, doc in _TIMES.items()})
        for key, (name, doc) in named.items():
            counter = self._counter_cls(name=f"vllm:kv_transfer_{name}", documentation=doc, labelnames=labelnames)
            self.counters[key] = {i: counter.labels(*v) for i, v in per_engine_labelvalues.items()}
            self.scale[key] = _SECONDS.get(key, ("", 1.0))[1]

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, by_engine in self.counters.items():
            value = transfer_stats_data.get(key, 0)
            if value and engine_idx in by_engine:
                by_engine[engine_idx].inc(value * self.scale[key])
