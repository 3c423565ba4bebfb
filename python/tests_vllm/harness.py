"""One vLLM instance with this package's connector, driven on CPU: vLLM 0.33's real v1 scheduler, its KV
cache planning and allocation, and its worker-side connector plumbing (the connector built by
``ensure_kv_transfer_initialized``, ``register_kv_caches`` through ``get_kv_connector``, every layer run
through ``unified_attention_with_output``, which calls ``wait_for_layer_load`` and ``save_kv_layer``),
with a fake forward pass that writes known K and V into the paged cache.

Run as ``python harness.py ROLE LAYOUT PORT [EXTRA [BATCH]]`` (ROLE producer or consumer, LAYOUT LBNHC or
BLNHC, EXTRA a JSON object added to ``kv_connector_extra_config``, BATCH vLLM's
``max_num_batched_tokens``: below a prompt's length, the prompt is prefilled in chunks). It reads
one JSON object per line on stdin, ``{"id": ..., "prompt": [...], "kv_transfer_params": ...}``, runs the
request to its end, and prints one JSON line with what happened. A producer then keeps serving its KV
until stdin closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROLE, LAYOUT, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
EXTRA = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
BATCH = int(sys.argv[5]) if len(sys.argv) > 5 else 256
os.environ["VLLM_KV_CACHE_LAYOUT"] = LAYOUT
BLOCK, HEADS, HEAD, LAYERS = 16, 2, 16, 2
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
POOL = 64

from vllm import SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)

# One model path for every instance: the model is part of the keys' namespace.
model_dir = os.path.join(tempfile.gettempdir(), f"kvt-harness-model-{os.getuid()}")
os.makedirs(model_dir, exist_ok=True)
with open(os.path.join(model_dir, "config.json"), "w") as f:
    json.dump(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": HEADS * 2 * HEAD,
            "intermediate_size": 128,
            "num_attention_heads": HEADS * 2,
            "num_key_value_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "max_position_embeddings": 2048,
            "vocab_size": 4096,
            "rms_norm_eps": 1e-6,
            "torch_dtype": "float32",
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        f,
    )

config = VllmConfig(
    model_config=ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype="float32", seed=0, max_model_len=256),
    scheduler_config=SchedulerConfig(
        max_num_seqs=8, max_num_batched_tokens=BATCH, max_model_len=256, enable_chunked_prefill=True,
        is_encoder_decoder=False, async_scheduling=False,
    ),
    cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
    kv_transfer_config=KVTransferConfig(
        kv_connector="KvTransferConnector",
        kv_connector_module_path="kv_transfer.vllm",
        kv_role=f"kv_{ROLE}",
        kv_buffer_device="cpu",
        kv_port=PORT,
        kv_connector_extra_config={"load_timeout": 20.0, **EXTRA},
    ),
    device_config=DeviceConfig("cpu"),
)

# KV cache planning and allocation, as the engine core and the worker do.
from vllm.v1.attention.backends.utils import _DEFAULT_LAYOUT_PREFERENCE, resolve_kv_cache_layout  # noqa: E402
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs  # noqa: E402
from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache  # noqa: E402

specs = {n: FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float32) for n in NAMES}
layout = resolve_kv_cache_layout(config, [[p.name for p in _DEFAULT_LAYOUT_PREFERENCE]], list(specs.values()))
page = specs[NAMES[0]].page_size_bytes
plans = get_kv_cache_configs(config, [specs], [page * LAYERS * POOL], get_global_kv_cache_groups(config, [specs]))
for p in plans:
    p.kv_cache_layout = config.cache_config.kv_cache_layout
worker_plan, sched_plan = plans[0], generate_scheduler_kv_cache_config(plans)
config.cache_config.num_gpu_blocks = sched_plan.num_blocks

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
    "clear_connector_metadata", "get_kv_connector_stats",
):
    _cls = connector_module.KvTransferConnector
    setattr(_cls, _name, recorded(_name, getattr(_cls, _name)))

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

scheduler = Scheduler(
    vllm_config=config, kv_cache_config=sched_plan, structured_output_manager=StructuredOutputManager(config),
    block_size=BLOCK, log_stats=True,
)

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
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

init_none_hash(sha256)
hasher = get_request_block_hasher(BLOCK, sha256)
tables: dict[str, list[int]] = {}


def step(report: dict) -> list:
    """One engine step: schedule, ship the plan as the engine does (pickled), fake forward, update."""
    planned = scheduler.schedule()
    so = pickle.loads(pickle.dumps(planned))  # what a worker process receives
    report["pickled_steps"] += 1
    for nr in so.scheduled_new_reqs:
        tables[nr.req_id] = list(nr.block_ids[0])
        report["computed_from"] = scheduler.requests[nr.req_id].num_computed_tokens - so.num_scheduled_tokens[nr.req_id]
    for rid, nb in zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.new_block_ids):
        if nb is not None:
            tables[rid].extend(nb[0])
    waiting = [r for r in scheduler.requests.values() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
    report["waiting_steps"] += bool(waiting)
    if so.total_num_scheduled_tokens == 0:
        out = runner.no_forward(so)
        observe(report, out.kv_connector_output)
        if not waiting:
            report["idle_steps"] += 1
        time.sleep(0.001)
        return list(scheduler.update_from_output(planned, out).items())
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
    with set_forward_context({n: Metadata(slot_mapping=sm) for n in NAMES}, config, num_tokens=len(slots), slot_mapping={n: sm for n in NAMES}):
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
    out = ModelRunnerOutput(req_ids=order, req_id_to_index={r: i for i, r in enumerate(order)}, sampled_token_ids=sampled, kv_connector_output=kv_out)
    if kv_out is not None and kv_out.invalid_block_ids:
        report["invalid_blocks"] += len(kv_out.invalid_block_ids)
    return list(scheduler.update_from_output(planned, out).items())


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


for line in sys.stdin:
    if not line.strip():
        continue
    ask = json.loads(line)
    rid, prompt = ask["id"], ask["prompt"]
    extra = {"kv_transfer_params": ask["kv_transfer_params"]} if ask.get("kv_transfer_params") else None
    sp = SamplingParams(max_tokens=ask.get("max_tokens", 1), ignore_eos=True, extra_args=extra)
    sp.update_from_generation_config({}, 2)
    scheduler.add_request(Request(request_id=rid, prompt_token_ids=prompt, sampling_params=sp, pooling_params=None, block_hasher=hasher))
    CALLS.clear()
    report = {
        "id": rid, "pickled_steps": 0, "invalid_blocks": 0, "computed_from": None, "kv_transfer_params": None,
        "stats": {}, "finished_recving": 0, "waiting_steps": 0, "idle_steps": 0,
    }
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for _, outs in step(report):
            for o in outs.outputs:
                if o.finish_reason is not None and o.request_id == rid:
                    report["kv_transfer_params"] = o.kv_transfer_params
        if not scheduler.has_requests():
            break
    loaded = report["computed_from"] or 0
    report["loaded_tokens"] = loaded
    report["blocks_hold_the_prompt"] = loaded_blocks_hold_the_prompt(rid, prompt, loaded or len(prompt) - 1)
    # The calls of this request's steps, runs of one call collapsed.
    report["calls"] = [c for i, c in enumerate(CALLS) if i == 0 or CALLS[i - 1] != c]
    report["allocated"] = ALLOCATED.get(rid)
    report["block_table"] = tables.get(rid)
    pool = scheduler.kv_cache_manager.block_pool
    report["free_blocks"], report["all_blocks"] = pool.get_num_free_blocks(), pool.num_gpu_blocks
    print(json.dumps(report), flush=True)

scheduler.shutdown()
kv_transfer_state.ensure_kv_transfer_shutdown()
