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
reached is a ``502`` naming it.

It runs on asyncio with aiohttp (which vLLM's own environment carries): one event loop serves every client,
and upstream connections are pooled and kept alive (``--connections`` per upstream server), so a request
costs the proxy no connect and no thread. ``pip install kv-transfer[proxy]`` brings aiohttp elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import socket
import urllib.parse
import uuid
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

logger = logging.getLogger("kv_transfer.proxy")

__all__ = ["Proxy", "ProxyServer", "Upstream", "main"]

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
        self.timeout = aiohttp.ClientTimeout(total=timeout)


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
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


def decode_request(body: dict[str, Any], params: dict[str, Any] | None) -> dict[str, Any]:
    """The request a decode server gets: the client's, with the prefill's ``kv_transfer_params``."""
    dec = dict(body)
    if params:
        dec["kv_transfer_params"] = params
    else:
        dec.pop("kv_transfer_params", None)
    return dec


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "proxy_error", "code": status}}, status=status)


class Proxy:
    """The proxy's routes over pooled upstream connections: each OpenAI request to a prefill, then a decode
    server, taking them in turn."""

    def __init__(self, prefill: Sequence[Upstream], decode: Sequence[Upstream], connections: int = 256) -> None:
        if not prefill or not decode:
            raise ValueError("the proxy needs at least one prefill and one decode server")
        self._prefill = itertools.cycle(list(prefill))
        self._decode = itertools.cycle(list(decode))
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("GET", "/{tail:.*}", self._get)
        app.router.add_route("POST", "/{tail:.*}", self._post)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        # Kept-alive connections, at most `connections` per upstream server.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=self._connections, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def _close(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    @staticmethod
    def _headers(request: web.Request) -> dict[str, str]:
        h = {k: v for k, v in request.headers.items() if k.lower() in _PASSED}
        if not any(k.lower() == "x-request-id" for k in h):
            h["X-Request-Id"] = uuid.uuid4().hex
        h["Content-Type"] = "application/json"
        return h

    async def _get(self, request: web.Request) -> web.StreamResponse:
        up = next(self._decode)
        assert self._session is not None
        try:
            resp = await self._session.get(up.url + request.path_qs, headers=self._headers(request), timeout=up.timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return _error(502, f"{up.url}: {e}")
        return await self._relay(request, resp)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        if request.path not in ROUTES:
            return _error(404, f"{request.path}: the proxy serves {', '.join(ROUTES)}")
        try:
            body = json.loads(await request.read())
        except ValueError as e:
            return _error(400, f"the request body is not JSON: {e}")
        if not isinstance(body, dict):
            return _error(400, "the request body is not a JSON object")
        prefill, decode = next(self._prefill), next(self._decode)
        headers = self._headers(request)
        assert self._session is not None
        try:
            async with self._session.post(
                prefill.url + request.path_qs, data=json.dumps(prefill_request(body)), headers=headers,
                timeout=prefill.timeout,
            ) as pre:
                answer = await pre.read()
                status, ctype = pre.status, pre.headers.get("Content-Type", "application/json")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return _error(502, f"prefill {prefill.url}: {e}")
        if status != 200:
            return web.Response(status=status, body=answer, headers={"Content-Type": ctype})
        params = None
        try:
            params = json.loads(answer).get("kv_transfer_params")
        except (ValueError, AttributeError):
            pass
        if not params:
            logger.warning("prefill %s returned no kv_transfer_params: the decode computes the prompt", prefill.url)
        try:
            resp = await self._session.post(
                decode.url + request.path_qs, data=json.dumps(decode_request(body, params)), headers=headers,
                timeout=decode.timeout,
            )
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return _error(502, f"decode {decode.url}: {e}")
        return await self._relay(request, resp)

    @staticmethod
    async def _relay(request: web.Request, resp: aiohttp.ClientResponse) -> web.StreamResponse:
        """Passes an upstream answer on: whole, or chunk by chunk as it arrives (server-sent events)."""
        try:
            ctype = resp.headers.get("Content-Type", "application/json")
            if "text/event-stream" not in ctype:
                return web.Response(status=resp.status, body=await resp.read(), headers={"Content-Type": ctype})
            out = web.StreamResponse(status=resp.status, headers={"Content-Type": ctype, "Cache-Control": "no-cache"})
            await out.prepare(request)
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            # The client left, or the upstream broke mid-answer: nothing more can be sent on this connection.
            logger.warning("answer not passed on whole: %s", e)
            raise
        finally:
            resp.release()


class ProxyServer:
    """The proxy on a socket bound at once (``server_address`` names it), served by ``serve_forever`` on
    an event loop of its own (a thread may run it)."""

    def __init__(
        self, address: tuple[str, int], prefill: Sequence[Upstream], decode: Sequence[Upstream], connections: int = 256
    ) -> None:
        self._proxy = Proxy(prefill, decode, connections)
        self._socket = socket.create_server(address, reuse_port=False)
        self.server_address: tuple[str, int] = self._socket.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None

    def serve_forever(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        runner = web.AppRunner(self._proxy.app(), access_log=None)
        await runner.setup()
        await web.SockSite(runner, self._socket).start()
        self._stop = asyncio.Event()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def shutdown(self) -> None:
        """Stops ``serve_forever`` (from another thread)."""
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kv_transfer.proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", action="append", required=True, metavar="URL", help="a prefill (kv_producer) server; repeatable")
    ap.add_argument("--decode", action="append", required=True, metavar="URL", help="a decode (kv_consumer) server; repeatable")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free port)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds an upstream may take to answer (default 600)")
    ap.add_argument("--connections", type=int, default=256, help="pooled connections per upstream server (default 256)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        prefill = [Upstream(u, args.timeout) for u in args.prefill]
        decode = [Upstream(u, args.timeout) for u in args.decode]
    except ValueError as e:
        ap.error(str(e))
    server = ProxyServer((args.host, args.port), prefill, decode, args.connections)
    host, port = server.server_address
    # The one line a script waits for (with --port 0, it names the port).
    print(f"kv_transfer.proxy listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
