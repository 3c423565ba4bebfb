"""kv_transfer.proxy against stand-in servers that record what they are sent (the proxy in front of real
`vllm serve` processes is tested in tests_e2e)."""

import http.client
import http.server
import json
import socket
import threading

import pytest

from kv_transfer.proxy import Pool, Proxy, ProxyServer
from kv_transfer.routing import parse_instance


class _Fake(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, answer):
        self.seen = []
        self.peers = set()
        self.answer = answer
        self.tokenized = []
        self.scrapes = 0
        self.load = 0  # what its /metrics says runs and waits
        super().__init__(("127.0.0.1", 0), _FakeHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class _FakeHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/metrics":
            self.server.scrapes += 1
            text = f'vllm:num_requests_running{{engine="0"}} {self.server.load}\nvllm:num_requests_waiting{{engine="0"}} 0\n'
            data = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.server.seen.append(("GET", self.path, None, dict(self.headers)))
        self.server.peers.add(self.client_address)
        self._json(200, {"object": "list", "data": [{"id": "m"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":  # vLLM's: here token i is the word "w<i>"
            self.server.tokenized.append(body)
            text = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
            self._json(200, {"tokens": [int(w[1:]) for w in text.split()]})
            return
        self.server.seen.append(("POST", self.path, body, dict(self.headers)))
        self.server.peers.add(self.client_address)
        status, payload = self.server.answer(body)
        if isinstance(payload, list):  # server-sent events, one chunk each
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in payload:
                data = f"data: {event}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._json(status, payload)

    def _json(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


PARAMS = {"do_remote_prefill": True, "producer": "127.0.0.1:14579"}


def prefill_ok(body):
    return 200, {"choices": [{"text": "x"}], "kv_transfer_params": PARAMS}


def decode_answer(body):
    if body.get("stream"):
        return 200, ['{"choices":[{"text":"a"}]}', '{"choices":[{"text":"b"}]}', "[DONE]"]
    return 200, {"choices": [{"text": "ab"}], "usage": {"completion_tokens": 2}}


def start(prefill, decode, metrics_interval=0):
    """A P/D proxy (no ``/metrics`` reads unless asked: the fakes record every request)."""
    pre = Pool([parse_instance(u, 10) for u in prefill]) if prefill else None
    proxy = Proxy(Pool([parse_instance(u, 10) for u in decode]), pre, metrics_interval=metrics_interval)
    server = ProxyServer(("127.0.0.1", 0), proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def post(server, path, body, raw=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer k"}
    conn.request("POST", path, body=raw if raw is not None else json.dumps(body), headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.getheader("Content-Type"), resp.read()


def test_a_request_is_prefilled_then_decoded_with_the_prefills_parameters():
    pre, dec = _Fake(prefill_ok), _Fake(decode_answer)
    proxy = start([pre.url], [dec.url])
    body = {"model": "m", "prompt": "hello", "max_tokens": 16, "stream_options": {"include_usage": True}}
    status, _, data = post(proxy, "/v1/completions", body)
    assert status == 200 and json.loads(data)["choices"][0]["text"] == "ab"
    (_, path, sent, headers), = pre.seen
    assert path == "/v1/completions"
    assert sent["kv_transfer_params"] == {"do_remote_decode": True}
    assert sent["max_tokens"] == 1 and sent["stream"] is False and "stream_options" not in sent
    assert sent["prompt"] == "hello" and headers["Authorization"] == "Bearer k"
    (_, _, decoded, dheaders), = dec.seen
    assert decoded["kv_transfer_params"] == PARAMS
    assert decoded["max_tokens"] == 16 and decoded["stream_options"] == {"include_usage": True}
    # Both servers see the same request id.
    assert headers["X-Request-Id"] == dheaders["X-Request-Id"]


def test_a_chat_request_limits_the_prefill_to_one_token_whichever_field_it_uses():
    pre, dec = _Fake(prefill_ok), _Fake(decode_answer)
    proxy = start([pre.url], [dec.url])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
    assert post(proxy, "/v1/chat/completions", body)[0] == 200
    sent = pre.seen[0][2]
    assert sent["max_completion_tokens"] == 1 and sent["max_tokens"] == 1
    assert dec.seen[0][2]["max_completion_tokens"] == 9


def test_a_streamed_answer_is_passed_on_event_by_event():
    pre, dec = _Fake(prefill_ok), _Fake(decode_answer)
    proxy = start([pre.url], [dec.url])
    status, ctype, data = post(proxy, "/v1/completions", {"prompt": "p", "stream": True})
    assert status == 200 and ctype == "text/event-stream"
    events = [line[len("data: "):] for line in data.decode().split("\n\n") if line]
    assert events == ['{"choices":[{"text":"a"}]}', '{"choices":[{"text":"b"}]}', "[DONE]"]
    assert pre.seen[0][2]["stream"] is False and dec.seen[0][2]["stream"] is True


def test_a_prefill_error_reaches_the_client_and_no_decode_runs():
    pre = _Fake(lambda body: (400, {"error": {"message": "prompt too long"}}))
    dec = _Fake(decode_answer)
    proxy = start([pre.url], [dec.url])
    status, _, data = post(proxy, "/v1/completions", {"prompt": "p"})
    assert status == 400 and b"prompt too long" in data
    assert dec.seen == []


def test_a_prefill_without_parameters_leaves_the_decode_to_compute():
    pre = _Fake(lambda body: (200, {"choices": [{"text": "x"}]}))
    dec = _Fake(decode_answer)
    proxy = start([pre.url], [dec.url])
    assert post(proxy, "/v1/completions", {"prompt": "p", "kv_transfer_params": {"stale": 1}})[0] == 200
    assert "kv_transfer_params" not in dec.seen[0][2]


def test_servers_are_taken_in_turn_and_get_goes_to_a_decode():
    pres = [_Fake(prefill_ok), _Fake(prefill_ok)]
    decs = [_Fake(decode_answer), _Fake(decode_answer)]
    proxy = start([p.url for p in pres], [d.url for d in decs])
    for _ in range(4):
        assert post(proxy, "/v1/completions", {"prompt": "p"})[0] == 200
    assert [len(p.seen) for p in pres] == [2, 2] and [len(d.seen) for d in decs] == [2, 2]
    conn = http.client.HTTPConnection("127.0.0.1", proxy.server_address[1], timeout=10)
    conn.request("GET", "/v1/models")
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["data"][0]["id"] == "m"


def test_bad_requests_and_unreachable_servers_are_clear_errors():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    dec = _Fake(decode_answer)
    proxy = start([dead], [dec.url])
    status, _, data = post(proxy, "/v1/completions", {"prompt": "p"})
    assert status == 502 and dead.encode() in data
    assert post(proxy, "/v1/completions", None, raw="{not json")[0] == 400
    assert post(proxy, "/v1/completions", None, raw="[1]")[0] == 400
    status, _, data = post(proxy, "/v1/embeddings", {"input": "x"})
    assert status == 404 and b"/v1/completions" in data
    with pytest.raises(ValueError, match="not an http"):
        parse_instance("localhost:8000", 1)


def test_upstream_connections_are_pooled_and_kept_alive():
    pre, dec = _Fake(prefill_ok), _Fake(decode_answer)
    proxy = start([pre.url], [dec.url])
    for _ in range(6):
        assert post(proxy, "/v1/completions", {"prompt": "p"})[0] == 200
    # Six requests in turn, one connection to each server (not one per request).
    assert len(pre.peers) == 1 and len(dec.peers) == 1, (pre.peers, dec.peers)
