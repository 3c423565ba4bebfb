"""One vLLM instance with this package's connector, driven on CPU: vLLM 0.33's real v1 scheduler, its KV
cache planning and allocation, and its worker-side connector plumbing (the connector built by
``ensure_kv_transfer_initialized``, ``register_kv_caches`` through ``get_kv_connector``, every layer run
through ``unified_attention_with_output``, which calls ``wait_for_layer_load`` and ``save_kv_layer``),
with a fake forward pass that writes known K and V into the paged cache.

Run as ``python harness.py ROLE LAYOUT PORT [EXTRA [BATCH [POOL]]]`` (ROLE producer, consumer or both,
LAYOUT LBNHC or BLNHC, EXTRA a JSON object added to ``kv_connector_extra_config``, BATCH vLLM's
``max_num_batched_tokens``: below a prompt's length, the prompt is prefilled in chunks; POOL the blocks of
KV cache: few enough, and vLLM preempts). It reads one JSON object per line on stdin, ``{"id": ...,
"prompt": [...], "max_tokens": ..., "kv_transfer_params": ...}``, runs the request to its end, and prints
one JSON line with what happened; ``{"batch": [request, ...]}`` runs them together, the line then
naming each one's outcome under ``finished``. Every step's stats also go through vLLM's own Prometheus
logger (the line's ``prom``: the connector's samples as ``/metrics`` shows them), and the worker's
handshake goes to the scheduler as vLLM's engine core hands it over. A producer then keeps serving its
KV until stdin closes.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

ROLE, LAYOUT, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
EXTRA = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
BATCH = int(sys.argv[5]) if len(sys.argv) > 5 else 256
POOL = int(sys.argv[6]) if len(sys.argv) > 6 else None
KV_EVENTS = os.environ.get("HARNESS_KV_EVENTS") == "1"
os.environ["VLLM_KV_CACHE_LAYOUT"] = LAYOUT

from vllm import SamplingParams  # noqa: E402
from vllm.config import set_current_vllm_config  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

from instance_config import BLOCK, HEAD, HEADS, NAMES, instance_config  # noqa: E402

config, worker_plan, sched_plan, layout = instance_config(ROLE, PORT, EXTRA, BATCH, POOL, KV_EVENTS)

# Every call vLLM makes to the connector, in order (`name` or `name:request id`), and the block ids each
# request was allocated with: what the tests check the call order and block ids against.
import kv_transfer.vllm as connector_module  # noqa: E402

CALLS: list[str] = []
ALLOCATED: dict[str, dict] = {}


def recorded(name, method):
    def call(self, *args, **kwargs):
        rid = getattr(args[0], "request_id", None) if args else None
        CALLS.append(name if rid is None else f"{name}:{rid}")
        if name == "update_state_after_alloc":
            ALLOCATED[rid] = {"blocks": list(args[1].get_block_ids()[0]), "external_tokens": args[2]}
        return method(self, *args, **kwargs)

    return call


for _name in (
    "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished",
    "update_connector_output", "bind_connector_metadata", "start_load_kv", "wait_for_layer_load",
    "save_kv_layer", "wait_for_save", "get_finished", "get_block_ids_with_load_errors",
    "clear_connector_metadata", "get_kv_connector_stats", "handle_preemptions", "set_xfer_handshake_metadata",
):
    _cls = connector_module.KvTransferConnector
    setattr(_cls, _name, recorded(_name, getattr(_cls, _name)))

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

scheduler = Scheduler(
    vllm_config=config, kv_cache_config=sched_plan, structured_output_manager=StructuredOutputManager(config),
    block_size=BLOCK, log_stats=True,
)
# vLLM's own Prometheus logger, fed what the engine core's stats carry: the connector's metrics
# (`build_prom_metrics`) and the hits by source (`get_external_cache_hit_sources`) as `/metrics` shows them.
import prometheus_client  # noqa: E402
from vllm.v1.metrics.loggers import PrometheusStatLogger  # noqa: E402

prom = PrometheusStatLogger(config, [0])

# What vLLM's KV event publisher is handed (with HARNESS_KV_EVENTS=1), as its ZMQ publisher encodes it
# (msgpack) and a router decodes it: each batch ``[ts, [event, ...], dp_rank]``, an event a map with its
# ``type``.
import msgspec  # noqa: E402

PUBLISHED: list = []
_encode = msgspec.msgpack.Encoder().encode
_publish = scheduler.kv_event_publisher.publish
scheduler.kv_event_publisher.publish = lambda batch: (PUBLISHED.append(msgspec.msgpack.decode(_encode(batch))),
                                                      _publish(batch))[1]

from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: E402
from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment  # noqa: E402

caches = allocate_kv_cache(worker_plan, torch.device("cpu"), layout)
with set_current_vllm_config(config):
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, distributed_init_method=f"tcp://127.0.0.1:{PORT + 1000}", backend="gloo"
    )
    ensure_model_parallel_initialized(1, 1)
    kv_transfer_state.ensure_kv_transfer_initialized(config, worker_plan)

from vllm.v1.worker.gpu.kv_connector import get_kv_connector  # noqa: E402

runner = get_kv_connector(config, caches)  # registers the caches with the worker connector
# The handshake as vLLM's engine core makes it after registration: every worker's metadata, keyed by
# (pp rank, tp rank), shipped to the engine core, handed to the scheduler's connector.
_handshake = kv_transfer_state.get_kv_transfer_group().get_handshake_metadata()
HANDSHAKE = None if _handshake is None else {"rank": _handshake.rank, "control": _handshake.control}
if _handshake is not None:
    scheduler.get_kv_connector().set_xfer_handshake_metadata_pp_aware({(0, 0): pickle.loads(pickle.dumps(_handshake))})

from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention.attention import unified_attention_with_output  # noqa: E402
from vllm.v1.attention.backend import AttentionMetadata  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402


def kv_value(layer: int, token: int, position: int) -> float:
    """What the fake forward writes for a token: its id and position, so a loaded block can be checked."""
    return float(layer * 100000 + token * 10 + position % 10)


@dataclass
class Metadata(AttentionMetadata):
    slot_mapping: torch.Tensor


class Impl:
    def forward(self, layer, q, k, v, kv_cache, attn_metadata, output=None, **kw):
        sm = attn_metadata.slot_mapping
        kv_cache[sm // BLOCK, :, sm % BLOCK, :HEAD] = k
        kv_cache[sm // BLOCK, :, sm % BLOCK, HEAD:] = v
        output.zero_()


class Layer(torch.nn.Module):
    def __init__(self, name):
        super().__init__()
        self.layer_name, self.kv_cache, self.impl = name, caches[name], Impl()


for n in NAMES:
    config.compilation_config.static_forward_context[n] = Layer(n)

from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash, maybe_convert_block_hash  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

init_none_hash(sha256)
hasher = get_request_block_hasher(BLOCK, sha256)
tables: dict[str, list[int]] = {}


def step(report: dict) -> list:
    """One engine step: schedule, ship the plan as the engine does (pickled), fake forward, update."""
    planned = scheduler.schedule()
    so = pickle.loads(pickle.dumps(planned))  # what a worker process receives
    report["pickled_steps"] += 1
    report["preempted"].extend(sorted(so.preempted_req_ids or ()))
    for nr in so.scheduled_new_reqs:
        tables[nr.req_id] = list(nr.block_ids[0])
        computed = scheduler.requests[nr.req_id].num_computed_tokens
        report["computed_from"][nr.req_id] = computed - so.num_scheduled_tokens[nr.req_id]
    cached = so.scheduled_cached_reqs
    for rid, nb in zip(cached.req_ids, cached.new_block_ids):
        if rid in cached.resumed_req_ids:  # a preempted request again: its table anew
            tables[rid] = list(nb[0])
            report["computed_from"][rid] = scheduler.requests[rid].num_computed_tokens - so.num_scheduled_tokens[rid]
        elif nb is not None:
            tables[rid].extend(nb[0])
    waiting = [r for r in scheduler.requests.values() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
    report["waiting_steps"] += bool(waiting)
    if so.total_num_scheduled_tokens == 0:
        out = runner.no_forward(so)
        observe(report, out.kv_connector_output)
        if not waiting:
            report["idle_steps"] += 1
        time.sleep(0.001)
        return updated(report, planned, out)
    order = list(so.num_scheduled_tokens)
    slots, toks, positions = [], [], []
    for rid in order:
        req = scheduler.requests[rid]
        end = req.num_computed_tokens
        for p in range(end - so.num_scheduled_tokens[rid], end):
            slots.append(tables[rid][p // BLOCK] * BLOCK + p % BLOCK)
            toks.append(req.all_token_ids[p])
            positions.append(p)
    sm = torch.tensor(slots, dtype=torch.int64)
    metadata = {n: Metadata(slot_mapping=sm) for n in NAMES}
    with set_forward_context(metadata, config, num_tokens=len(slots), slot_mapping={n: sm for n in NAMES}):
        runner.pre_forward(so)
        for li, n in enumerate(NAMES):
            vals = torch.tensor([kv_value(li, t, p) for t, p in zip(toks, positions)])
            k = vals[:, None, None].expand(len(slots), HEADS, HEAD).contiguous()
            v = (-k).contiguous()
            q = torch.zeros(len(slots), HEADS, HEAD)
            unified_attention_with_output(q, k, v, torch.empty_like(q), n)
    runner.finish_forward()
    kv_out = runner.post_forward(so.finished_req_ids)
    observe(report, kv_out)
    sampled = [[7] if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens else [] for r in order]
    out = ModelRunnerOutput(
        req_ids=order, req_id_to_index={r: i for i, r in enumerate(order)}, sampled_token_ids=sampled,
        kv_connector_output=kv_out,
    )
    if kv_out is not None and kv_out.invalid_block_ids:
        report["invalid_blocks"] += len(kv_out.invalid_block_ids)
    return updated(report, planned, out)


def updated(report: dict, planned, out) -> list:
    """The scheduler's update from a step's output, its stats recorded as vLLM's Prometheus logger does."""
    outputs = scheduler.update_from_output(planned, out)
    for eco in outputs.values():
        stats = eco.scheduler_stats
        if stats is None:
            continue
        prom.record(stats, None, engine_idx=0)
        if stats.connector_prefix_cache_stats is not None:
            for source, n in stats.connector_prefix_cache_stats.hits_by_source.items():
                report["hits_by_source"][source.value] = report["hits_by_source"].get(source.value, 0) + n
    return list(outputs.items())


def scraped() -> dict[str, float]:
    """The connector's samples on the Prometheus endpoint, and the hits by source: ``name{labels}`` -> value."""
    out = {}
    for line in prometheus_client.generate_latest().decode().splitlines():
        if line.startswith(("vllm:kv_transfer_", "vllm:prompt_tokens_cached_by_source")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def observe(report: dict, kv_out) -> None:
    """What a step's connector output says: stats (summed as vLLM's logger does) and finished loads."""
    if kv_out is None:
        return
    stats = getattr(kv_out, "kv_connector_stats", None)
    if stats is not None and not stats.is_empty():
        for k, v in stats.data.items():
            report["stats"][k] = report["stats"].get(k, 0) + v
    report["finished_recving"] += len(kv_out.finished_recving or ())


def loaded_blocks_hold_the_prompt(rid: str, prompt: list[int], upto: int) -> bool:
    """Whether the first `upto` tokens of `rid`'s blocks hold what the fake forward writes for them."""
    for li, n in enumerate(NAMES):
        cache = caches[n]
        for p in range(upto):
            b, off = tables[rid][p // BLOCK], p % BLOCK
            want = kv_value(li, prompt[p], p)
            if not (torch.all(cache[b, :, off, :HEAD] == want) and torch.all(cache[b, :, off, HEAD:] == -want)):
                return False
    return True


def request(ask: dict) -> Request:
    extra = {"kv_transfer_params": ask["kv_transfer_params"]} if ask.get("kv_transfer_params") else None
    sp = SamplingParams(max_tokens=ask.get("max_tokens", 1), ignore_eos=True, extra_args=extra)
    sp.update_from_generation_config({}, 2)
    return Request(
        request_id=ask["id"], prompt_token_ids=ask["prompt"], sampling_params=sp, pooling_params=None, block_hasher=hasher
    )


def run(asks: list[dict]) -> dict:
    """Adds every request at once and steps until all are finished: what the steps did, and each
    request's transfer parameters and whether its blocks held its prompt when it finished."""
    for ask in asks:
        scheduler.add_request(request(ask))
    CALLS.clear()
    PUBLISHED.clear()
    report = {
        "pickled_steps": 0, "invalid_blocks": 0, "computed_from": {}, "stats": {}, "finished_recving": 0,
        "waiting_steps": 0, "idle_steps": 0, "preempted": [], "hits_by_source": {}, "finished": {},
    }
    prompts = {a["id"]: a["prompt"] for a in asks}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for _, outs in step(report):
            for o in outs.outputs:
                rid = o.request_id
                if o.finish_reason is not None and rid in prompts and rid not in report["finished"]:
                    # Checked now: its blocks are free from the next step on.
                    loaded = report["computed_from"].get(rid) or 0
                    upto = loaded or len(prompts[rid]) - 1
                    report["finished"][rid] = {
                        "kv_transfer_params": o.kv_transfer_params,
                        "loaded_tokens": loaded,
                        "blocks_hold_the_prompt": loaded_blocks_hold_the_prompt(rid, prompts[rid], upto),
                        "block_table": tables.get(rid),
                        "allocated": ALLOCATED.get(rid),
                    }
        if not scheduler.has_requests():
            break
    # The calls of these steps, runs of one call collapsed.
    report["calls"] = [c for i, c in enumerate(CALLS) if i == 0 or CALLS[i - 1] != c]
    pool = scheduler.kv_cache_manager.block_pool
    report["free_blocks"], report["all_blocks"] = pool.get_num_free_blocks(), pool.num_gpu_blocks
    report["prom"], report["handshake"] = scraped(), HANDSHAKE
    report["kv_events"] = [e for batch in PUBLISHED for e in batch[1]]
    # Each prompt's block hashes as vLLM's own events give them.
    report["block_hashes"] = {a["id"]: [maybe_convert_block_hash(h) for h in request(a).block_hashes] for a in asks}
    return report


for line in sys.stdin:
    if not line.strip():
        continue
    ask = json.loads(line)
    if "batch" in ask:
        print(json.dumps(run(ask["batch"])), flush=True)
        continue
    report = run([ask])
    none = {"kv_transfer_params": None, "loaded_tokens": 0, "blocks_hold_the_prompt": False}
    mine = report.pop("finished").get(ask["id"], none)
    report.update(mine, id=ask["id"], computed_from=report["computed_from"].get(ask["id"]))
    print(json.dumps(report), flush=True)

scheduler.shutdown()
kv_transfer_state.ensure_kv_transfer_shutdown()
