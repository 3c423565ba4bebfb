"""The connector under vLLM 0.33's real scheduler and worker plumbing (fake forward, CPU): a producer
instance computes a prompt and serves its KV; a consumer instance, given the producer's
kv_transfer_params, loads the prompt's KV into its own blocks instead of computing it, under either of
vLLM's KV layouts on either side."""

import json
import os
import socket
import subprocess
import sys

import pytest

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")
BLOCK = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Instance:
    def __init__(self, role, layout, port):
        self.p = subprocess.Popen(
            [sys.executable, HARNESS, role, layout, str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def ask(self, **request):
        self.p.stdin.write(json.dumps(request) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            self.p.kill()
            raise AssertionError("the instance ended early:\n" + self.p.stderr.read()[-6000:])
        return json.loads(line)

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()


@pytest.mark.parametrize("producer_layout,consumer_layout", [("LBNHC", "LBNHC"), ("BLNHC", "LBNHC"), ("LBNHC", "BLNHC")])
def test_the_consumer_loads_the_prompt_the_producer_computed(producer_layout, consumer_layout):
    port = free_port()
    producer = Instance("producer", producer_layout, port)
    consumer = Instance("consumer", consumer_layout, free_port())
    try:
        prompt = [(13 * i + 5) % 4000 + 3 for i in range(3 * BLOCK + 7)]  # 3 full blocks and a tail
        made = producer.ask(id="p1", prompt=prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        params = made["kv_transfer_params"]
        assert params["producer"] == f"127.0.0.1:{port}" and params["do_remote_prefill"], made
        assert made["pickled_steps"] >= 1 and made["free_blocks"] == made["all_blocks"] - 1, made
        got = consumer.ask(id="d1", prompt=prompt, max_tokens=2, kv_transfer_params=params)
        # The decode computed only the tail: the 3 full blocks came from the producer, into its own
        # block ids, and hold exactly what the producer computed for those tokens.
        assert got["loaded_tokens"] == 3 * BLOCK, got
        assert got["blocks_hold_the_prompt"], got
        assert got["invalid_blocks"] == 0, got
        assert got["free_blocks"] == got["all_blocks"] - 1, got
        # Another prompt: nothing stored, nothing loaded, no error.
        other = consumer.ask(id="d2", prompt=[9] * (2 * BLOCK + 1), max_tokens=1, kv_transfer_params=params)
        assert other["loaded_tokens"] == 0 and other["invalid_blocks"] == 0, other
    finally:
        consumer.close()
        producer.close()


def test_a_producer_gone_before_the_load_costs_only_recompute():
    port = free_port()
    producer = Instance("producer", "LBNHC", port)
    consumer = Instance("consumer", "LBNHC", free_port())
    try:
        prompt = [(7 * i + 1) % 4000 + 3 for i in range(2 * BLOCK + 3)]
        params = producer.ask(id="p1", prompt=prompt, kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
        producer.close()
        got = consumer.ask(id="d1", prompt=prompt, max_tokens=1, kv_transfer_params=params)
        assert got["loaded_tokens"] == 0, got  # the lookup found nobody: the consumer computed it all
        assert got["free_blocks"] == got["all_blocks"] - 1, got
    finally:
        consumer.close()


def test_a_bad_extra_config_key_fails_start_up_naming_it():
    import vllm  # noqa: F401  (the connector module imports vLLM's base class)
    from kv_transfer.vllm import _options

    with pytest.raises(ValueError, match="unknown key 'peer'"):
        _options({"peer": "x"})
    with pytest.raises(ValueError, match="store_blocks"):
        _options({"store_blocks": "many"})
    assert _options({})["kv_ip"] == "127.0.0.1"
