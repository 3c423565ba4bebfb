"""The vLLM configuration of one test instance (vLLM 0.33, CPU, a tiny Llama that is never loaded), and its
KV cache plans as the engine core and the worker make them: shared by ``harness.py`` and
``python/bench/lookup_bench.py``, so both speak in one namespace (model path, block size, dtype)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch

BLOCK, HEADS, HEAD, LAYERS = 16, 2, 16, 2
NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
#: Blocks of KV cache an instance has.
POOL = 64


def model_dir() -> str:
    """One model path for every instance (the model is part of the keys' namespace): a config only."""
    path = os.path.join(tempfile.gettempdir(), f"kvt-harness-model-{os.getuid()}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
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
    return path


def instance_config(
    role: str, port: int, extra: dict[str, Any], batch: int = 256, pool: int | None = None, kv_events: bool = False
) -> tuple[Any, Any, Any, Any]:
    """``(config, worker_plan, scheduler_plan, layout)`` of an instance of `role` (``producer``,
    ``consumer``, ``both``) with this package's connector on `port`, `extra` its extra config, `batch`
    vLLM's ``max_num_batched_tokens``, `pool` its blocks of KV cache (``POOL`` if ``None``; the layout
    comes from ``VLLM_KV_CACHE_LAYOUT``), with KV cache events on (the null publisher) if `kv_events`."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVEventsConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.attention.backends.utils import _DEFAULT_LAYOUT_PREFERENCE, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    path = model_dir()
    # vLLM refuses a cache that cannot hold one request of the longest length (one block is its null block).
    longest = min(256, ((pool or POOL) - 1) * BLOCK)
    config = VllmConfig(
        model_config=ModelConfig(
            model=path, tokenizer=path, skip_tokenizer_init=True, dtype="float32", seed=0, max_model_len=longest
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=batch, max_model_len=longest, enable_chunked_prefill=True,
            is_encoder_decoder=False, async_scheduling=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KvTransferConnector",
            kv_connector_module_path="kv_transfer.vllm",
            kv_role=f"kv_{role}",
            kv_buffer_device="cpu",
            kv_port=port,
            kv_connector_extra_config={"load_timeout": 20.0, **extra},
        ),
        device_config=DeviceConfig("cpu"),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events else None,
    )
    specs = {
        n: FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float32) for n in NAMES
    }
    layout = resolve_kv_cache_layout(config, [[p.name for p in _DEFAULT_LAYOUT_PREFERENCE]], list(specs.values()))
    page = specs[NAMES[0]].page_size_bytes
    plans = get_kv_cache_configs(config, [specs], [page * LAYERS * (pool or POOL)], get_global_kv_cache_groups(config, [specs]))
    for p in plans:
        p.kv_cache_layout = config.cache_config.kv_cache_layout
    worker_plan, sched_plan = plans[0], generate_scheduler_kv_cache_config(plans)
    config.cache_config.num_gpu_blocks = sched_plan.num_blocks
    return config, worker_plan, sched_plan, layout
