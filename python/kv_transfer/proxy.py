"""A prefill/decode proxy in front of ``vllm serve`` instances running this package's connector.

    python -m kv_transfer.proxy --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --port 8000

It speaks the OpenAI API (``/v1/completions`` and ``/v1/chat/completions``, streaming and not) in vLLM's
P/D convention, the one its NIXL and Mooncake connectors use: each request goes first to a prefill server
(``kv_role: kv_producer``) with ``kv_transfer_params={"do_remote_decode": true}``, ``stream: false`` and one
output token; the ``kv_transfer_params`` of its answer go with the original request to a decode server
(``kv_role: kv_consumer``), which loads the prompt's KV instead of computing it; the decode's answer, streamed
or whole, is the client's. With several ``--prefill`` or ``--decode`` servers, requests take them in turn.
``GET`` requests (``/v1/models``, ``/health``) go to a decode server.

A prefill server that answers with an error has that error passed to the client; one that answers without
``kv_transfer_params`` leaves the decode to compute the prompt itself (logged). An upstream that cannot be
reached is a ``502`` naming it. Standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import itertools
import json
import logging
import sys
import threading
import urllib.parse
import uuid
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

logger = logging.getLogger("kv_transfer.proxy")

__all__ = ["Upstream", "ProxyServer", "main"]

#: The POST paths the proxy splits into prefill and decode.
ROUTES = ("/v1/completions", "/v1/chat/completions")
# Request headers passed to both servers (the rest, such as Host and Content-Length, are the proxy's own).
_PASSED = ("authorization", "x-request-id", "accept")


class Upstream:
    """One ``vllm serve`` server, by its base URL (``http://host:port``, optionally with a path prefix)."""

    def __init__(self, url: str, timeout: float) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        self.url = url.rstrip("/")
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")
        self._timeout = timeout

    def request(self, method: str, path: str, body: Optional[bytes], headers: Dict[str, str]) -> http.client.HTTPResponse:
        """Sends one request; the response is open for reading (its connection closes with it)."""
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = kind(self._host, self._port, timeout=self._timeout)
        try:
            conn.request(method, self._prefix + path, body=body, headers=headers)
            return conn.getresponse()
        except OSError as e:
            conn.close()
            raise UpstreamError(f"{self.url}: {e}") from e


class UpstreamError(Exception):
    """A server the proxy could not reach or read."""


def prefill_request(body: Dict[str, Any]) -> Dict[str, Any]:
    """The request a prefill server gets: the client's, computing the prompt and one token, not streamed,
    asking to keep its KV for a decode."""
    pre = dict(body)
    pre["kv_transfer_params"] = {"do_remote_decode": True}
    pre["stream"] = False
    pre.pop("stream_options", None)
    pre["max_tokens"] = 1
    if "max_completion_tokens" in pre:
        pre["max_completion_tokens"] = 1
    pre["n"] = 1
    return pre


def decode_request(body: Dict[str, Any], params: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The request a decode server gets: the client's, with the prefill's ``kv_transfer_params``."""
    dec = dict(body)
    if params:
        dec["kv_transfer_params"] = params
    else:
        dec.pop("kv_transfer_params", None)
    return dec


class ProxyServer(http.server.ThreadingHTTPServer):
    """The proxy: an HTTP server that sends each OpenAI request to a prefill, then a decode server."""

    daemon_threads = True

    def __init__(self, address: Tuple[str, int], prefill: Sequence[Upstream], decode: Sequence[Upstream]) -> None:
        if not prefill or not decode:
            raise ValueError("the proxy needs at least one prefill and one decode server")
        self._prefill = itertools.cycle(list(prefill))
        self._decode = itertools.cycle(list(decode))
        self._turn = threading.Lock()
        super().__init__(address, _Handler)

    def next_pair(self) -> Tuple[Upstream, Upstream]:
        """The next prefill and decode servers, in turn."""
        with self._turn:
            return next(self._prefill), next(self._decode)

    def next_decode(self) -> Upstream:
        with self._turn:
            return next(self._decode)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ProxyServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        logger.debug("%s " + format, self.address_string(), *args)

    def _headers(self) -> Dict[str, str]:
        h = {k: v for k, v in self.headers.items() if k.lower() in _PASSED}
        h.setdefault("X-Request-Id", uuid.uuid4().hex)
        h["Content-Type"] = "application/json"
        return h

    def _error(self, status: int, message: str) -> None:
        data = json.dumps({"error": {"message": message, "type": "proxy_error", "code": status}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        up = self.server.next_decode()
        try:
            resp = up.request("GET", self.path, None, self._headers())
        except UpstreamError as e:
            self._error(502, str(e))
            return
        self._relay(resp)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path.split("?")[0] not in ROUTES:
            self._error(404, f"{self.path}: the proxy serves {', '.join(ROUTES)}")
            return
        try:
            body = json.loads(raw)
        except ValueError as e:
            self._error(400, f"the request body is not JSON: {e}")
            return
        if not isinstance(body, dict):
            self._error(400, "the request body is not a JSON object")
            return
        prefill, decode = self.server.next_pair()
        headers = self._headers()
        try:
            pre = prefill.request("POST", self.path, json.dumps(prefill_request(body)).encode(), headers)
            answer = pre.read()
            pre.close()
        except (UpstreamError, OSError, http.client.HTTPException) as e:
            self._error(502, f"prefill {prefill.url}: {e}")
            return
        if pre.status != 200:
            self._send(pre.status, pre.getheader("Content-Type") or "application/json", answer)
            return
        params = None
        try:
            params = json.loads(answer).get("kv_transfer_params")
        except (ValueError, AttributeError):
            pass
        if not params:
            logger.warning("prefill %s returned no kv_transfer_params: the decode computes the prompt", prefill.url)
        try:
            resp = decode.request("POST", self.path, json.dumps(decode_request(body, params)).encode(), headers)
        except UpstreamError as e:
            self._error(502, f"decode {decode.url}: {e}")
            return
        self._relay(resp)

    def _send(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _relay(self, resp: http.client.HTTPResponse) -> None:
        """Passes an upstream answer on: whole, or chunk by chunk as it arrives (server-sent events)."""
        try:
            content_type = resp.getheader("Content-Type") or "application/json"
            if "text/event-stream" not in content_type:
                self._send(resp.status, content_type, resp.read())
                return
            self.send_response(resp.status)
            self.send_header("Content-Type", content_type)
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in _chunks(resp):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException) as e:
            # The client left, or the upstream broke mid-answer: nothing more can be sent on this connection.
            logger.warning("answer not passed on whole: %s", e)
            self.close_connection = True
        finally:
            resp.close()


def _chunks(resp: http.client.HTTPResponse) -> Iterator[bytes]:
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            return
        yield chunk


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kv_transfer.proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", action="append", required=True, metavar="URL", help="a prefill (kv_producer) server; repeatable")
    ap.add_argument("--decode", action="append", required=True, metavar="URL", help="a decode (kv_consumer) server; repeatable")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free port)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds an upstream may take to answer (default 600)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        prefill = [Upstream(u, args.timeout) for u in args.prefill]
        decode = [Upstream(u, args.timeout) for u in args.decode]
    except ValueError as e:
        ap.error(str(e))
    server = ProxyServer((args.host, args.port), prefill, decode)
    host, port = server.server_address[:2]
    # The one line a script waits for (with --port 0, it names the port).
    print(f"kv_transfer.proxy listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
