"""The cluster index from Python, against a real Redis: a worker publishes what its store holds, and a
scheduler using the index asks only the holders it names (a silent peer listed beside them is never
asked); a bad index URL is refused with the key named."""

import socket
import time

import numpy as np
import pytest

import kv_transfer as kt
from kv_transfer.vllm.options import parse

from redis_server import redis_server
from test_connector import BLOCK, LAYERS, POOL, settings


def wait_answer(scheduler, request_id, tokens, limit=20.0):
    deadline = time.monotonic() + limit
    answer = scheduler.get_num_new_matched_tokens(request_id, tokens)
    while answer is None:
        assert time.monotonic() < deadline, f"the lookup did not end in {limit} s"
        time.sleep(0.01)
        answer = scheduler.get_num_new_matched_tokens(request_id, tokens)
    return answer


def test_a_scheduler_with_the_index_loads_from_the_holder_it_names_and_asks_no_one_else():
    with redis_server() as url:
        holder = kt.Worker.tcp(settings("both"), 1)
        holder.publish_to_index(url)
        holder.register_kv_caches((np.arange(LAYERS * POOL * BLOCK) % 11).astype(np.uint8), blocks=POOL)
        own = kt.Scheduler(settings("both"), own=holder.control_addr)
        tokens = list(range(4 * 16 + 1))  # 4 full blocks, all usable
        assert own.wait_matched_tokens("made", tokens) == (0, False)
        own.update_state_after_alloc("made", [0, 1, 2, 3, 4], 0)
        holder.bind_connector_metadata(own.build_connector_meta())
        for layer in range(LAYERS):
            holder.save_kv_layer(layer)
        holder.wait_for_save()

        # A peer that listens and never answers: asked, it would hold the lookup its whole timeout.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        peer = f"127.0.0.1:{silent.getsockname()[1]}"
        asking = kt.Scheduler(settings("consumer", lookup_timeout=30.0), peers=[peer])
        asking.use_index(url)
        deadline = time.monotonic() + 20
        while True:
            # Until the holder's publisher has published, the index names nobody: nothing is found at
            # once (the silent peer is not asked), and the lookup is asked again afresh.
            started = time.monotonic()
            answer = wait_answer(asking, "r", tokens)
            assert time.monotonic() - started < 10, "the silent peer was asked"
            asking.request_finished("r")
            if answer == (64, False):
                break
            assert answer == (0, False), answer
            assert time.monotonic() < deadline, "the index never named the holder"
            time.sleep(0.05)
        assert asking.take_lookup_errors() == []
        silent.close()


def test_the_extra_config_index_key_takes_a_redis_url_only():
    assert parse({"index": "redis://10.0.0.5:6379"}).index == "redis://10.0.0.5:6379"
    assert parse({}).index == ""
    with pytest.raises(kt.ConfigurationError, match=r"\['index'\]"):
        parse({"index": "10.0.0.5:6379"})
