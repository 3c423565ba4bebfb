"""Routing by cache and load: ``ClusterIndex`` and ``Router`` against a real Redis the connector's workers
publish to, and ``kv_transfer.proxy`` routing a ``kv_both`` pool of stand-in servers by them (the pool of
real ``vllm serve`` instances is in tests_e2e)."""

import http.client
import json
import socket
import threading
import time

import numpy as np
import pytest
from test_proxy import _Fake, decode_answer, post

import kv_transfer as kt
from kv_transfer.proxy import Pool, Proxy, ProxyServer, main, proxy_from
from kv_transfer.routing import parse_instance

from redis_server import redis_server
from test_connector import BLOCK, LAYERS, POOL, TOKENS, settings

PROMPT = list(range(3, 3 + 4 * TOKENS + 1))  # 4 full blocks


def holding(url, tokens):
    """A ``both`` worker publishing to the index at ``url``, its store holding ``tokens``' full blocks."""
    worker = kt.Worker.tcp(settings("both"), 1)
    worker.publish_to_index(url)
    worker.register_kv_caches((np.arange(LAYERS * POOL * BLOCK) % 11).astype(np.uint8), blocks=POOL)
    own = kt.Scheduler(settings("both"), own=worker.control_addr)
    assert own.wait_matched_tokens("made", tokens) == (0, False)
    blocks = len(tokens) // TOKENS
    own.update_state_after_alloc("made", list(range(blocks + 1)), 0)
    worker.bind_connector_metadata(own.build_connector_meta())
    for layer in range(LAYERS):
        worker.save_kv_layer(layer)
    worker.wait_for_save()
    return worker


def published(index, tokens, holder, blocks, limit=20.0):
    """The index's answer for ``tokens`` once it names ``holder`` with ``blocks`` blocks."""
    deadline = time.monotonic() + limit
    while True:
        found = index.lookup(tokens)
        if found.holders.get(holder) == blocks:
            return found
        assert time.monotonic() < deadline, f"the index never named {holder}: {found}"
        time.sleep(0.05)


def test_the_index_says_who_holds_how_long_a_prefix_and_the_router_weighs_it_against_load():
    with redis_server() as url:
        worker = holding(url, PROMPT)
        index = kt.ClusterIndex(url, settings("consumer"))
        found = published(index, PROMPT, worker.control_addr, 4)
        assert (found.blocks, found.pooled, found.stale, found.block_size) == (4, 4, 0, TOKENS)
        assert worker.control_addr in index.live()
        # A prompt that shares the first two blocks only, and one that shares none.
        other = PROMPT[: 2 * TOKENS] + [9] * (2 * TOKENS)
        assert index.lookup(other).holders == {worker.control_addr: 2}
        assert index.lookup([9] * (3 * TOKENS)).holders == {}
        # Another namespace (another weight version) sees nothing.
        assert kt.ClusterIndex(url, settings("consumer", weight_version=2)).lookup(PROMPT).holders == {}

        held = [(0, 0.0), (4, 0.0), (0, 0.0)]
        assert kt.Router("cache").choose(held, 4, 4, 1.0, 0.1) == 1
        # Queued work at the holder: pulling its 4 blocks elsewhere (0.4) beats waiting 3 there.
        busy = [(0, 0.0), (4, 3.0), (0, 0.0)]
        assert kt.Router("cache-load").choose(busy, 4, 4, 1.0, 0.1) in (0, 2)
        assert kt.Router("cache-load").choose([(0, 0.0), (4, 0.2)], 4, 4, 1.0, 0.1) == 1
        assert kt.Router("least-loaded").choose(busy) == 0
        assert kt.Router("round-robin").policy == "round-robin"
        with pytest.raises(kt.ConfigurationError, match="cache-load"):
            kt.Router("random")
        del worker


def test_an_index_that_does_not_answer_is_an_unreachable_error_within_its_timeout():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}"
    index = kt.ClusterIndex(dead, settings("consumer"), timeout=0.05)
    started = time.monotonic()
    with pytest.raises(kt.PeerUnreachableError):
        index.lookup(PROMPT)
    assert time.monotonic() - started < 5
    with pytest.raises(kt.ConfigurationError):
        kt.ClusterIndex("http://127.0.0.1:1", settings("consumer"))


def pool_proxy(fakes, kvs, route, index, metrics_interval=0.0):
    instances = [parse_instance(f"{f.url}={kv}", 10) for f, kv in zip(fakes, kvs)]
    server = ProxyServer(("127.0.0.1", 0), Proxy(Pool(instances, route, index), metrics_interval=metrics_interval))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def routes(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    conn.request("GET", "/kv_transfer/routes")
    return json.loads(conn.getresponse().read())["serve"]


def words(tokens):
    return " ".join(f"w{t}" for t in tokens)


@pytest.mark.parametrize("route", ["cache", "cache-load"])
def test_the_proxy_sends_a_prompt_to_the_instance_that_holds_it(route):
    with redis_server() as url:
        worker = holding(url, PROMPT)
        index = kt.ClusterIndex(url, settings("consumer"))
        published(index, PROMPT, worker.control_addr, 4)
        fakes = [_Fake(decode_answer) for _ in range(3)]
        kvs = ["127.0.0.1:1", worker.control_addr, "127.0.0.1:2"]
        proxy = pool_proxy(fakes, kvs, route, index)
        # Token ids as the prompt: no tokenizing. A string: vLLM's /tokenize on one of the pool.
        for prompt in (PROMPT, words(PROMPT), [PROMPT]):
            assert post(proxy, "/v1/completions", {"model": "m", "prompt": prompt})[0] == 200
        chat = {"model": "m", "messages": [{"role": "user", "content": words(PROMPT)}]}
        assert post(proxy, "/v1/chat/completions", chat)[0] == 200
        assert [len(f.seen) for f in fakes] == [0, 4, 0]
        # The pool's request went on as the client sent it.
        assert fakes[1].seen[0][2] == {"model": "m", "prompt": PROMPT}
        assert sum(len(f.tokenized) for f in fakes) == 2
        # A prompt nobody holds goes round (cache) or to the idle (cache-load): not only to the holder.
        for _ in range(3):
            assert post(proxy, "/v1/completions", {"model": "m", "prompt": [7] * (2 * TOKENS)})[0] == 200
        assert len(fakes[0].seen) + len(fakes[2].seen) >= 2
        view = routes(proxy)
        assert view["policy"] == route and view["lookups"] == 7 and view["lookup_failures"] == 0
        assert [i["in_flight"] for i in view["instances"]] == [0, 0, 0]
        proxy.shutdown()
        del worker


def test_without_an_answer_from_the_index_the_proxy_routes_on_load_and_counts_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}"
    fakes = [_Fake(decode_answer) for _ in range(2)]
    proxy = pool_proxy(fakes, ["127.0.0.1:1", "127.0.0.1:2"], "cache-load", kt.ClusterIndex(dead, settings("consumer")))
    for _ in range(4):
        assert post(proxy, "/v1/completions", {"model": "m", "prompt": PROMPT})[0] == 200
    assert [len(f.seen) for f in fakes] == [2, 2]
    view = routes(proxy)
    assert view["lookups"] == 4 and view["lookup_failures"] == 4
    proxy.shutdown()


def test_a_server_that_refuses_is_skipped_until_its_metrics_answer_and_load_comes_from_them():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    live = [_Fake(decode_answer), _Fake(decode_answer)]
    instances = [parse_instance(u, 10) for u in (dead, live[0].url, live[1].url)]
    server = ProxyServer(("127.0.0.1", 0), Proxy(Pool(instances, "least-loaded"), metrics_interval=0.05))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # vLLM's /metrics says the first live one is busy: the least loaded is the other.
    live[0].load = 5
    deadline = time.monotonic() + 10
    while routes(server)["instances"][1]["reported"] != 5:
        assert time.monotonic() < deadline, routes(server)
        time.sleep(0.05)
    for _ in range(4):
        assert post(server, "/v1/completions", {"prompt": "p"})[0] == 200
    assert [len(f.seen) for f in live] == [0, 4]
    view = routes(server)["instances"]
    assert view[0]["up"] is False and view[0]["routed"] == 0 and view[2]["routed"] == 4
    assert live[0].scrapes > 0
    server.shutdown()


def test_the_command_line_refuses_what_cannot_route(capsys):
    def parse(*argv):
        import argparse

        ns = argparse.Namespace(
            prefill=[], decode=[], instance=[], route="round-robin", index="", index_timeout=0.05, model="",
            block_size=0, dtype="bfloat16", weight_version=0, transfer_cost=0.1, metrics_interval=0.0,
            timeout=10.0, connections=4,
        )
        for k, v in argv:
            setattr(ns, k, v)
        return proxy_from(ns)

    with pytest.raises(ValueError, match="not both"):
        parse(("instance", ["http://a:1"]), ("decode", ["http://b:1"]))
    with pytest.raises(ValueError, match="--index"):
        parse(("instance", ["http://a:1"]), ("route", "cache"))
    with pytest.raises(ValueError, match="KV address"):
        parse(("instance", ["http://a:1"]), ("route", "cache"), ("index", "redis://127.0.0.1:1"),
              ("model", "m"), ("block_size", 16))
    assert isinstance(parse(("instance", ["http://a:1=10.0.0.1:14579"])), Proxy)
    with pytest.raises(SystemExit):
        main(["--instance", "http://a:1", "--route", "nope"])
    assert "invalid choice" in capsys.readouterr().err
