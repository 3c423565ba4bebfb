"""A proxy in front of ``vllm serve`` instances running this package's connector: prefill/decode, or a pool of
``kv_both`` instances routed by cache and load.

    python -m kv_transfer.proxy --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --port 8000
    python -m kv_transfer.proxy --instance http://10.0.0.1:8000=10.0.0.1:14579 --instance ... \
        --index redis://10.0.0.9:6379 --route cache-load --model /models/llama --block-size 16 --dtype bfloat16

It speaks the OpenAI API (``/v1/completions`` and ``/v1/chat/completions``, streaming and not).

**P/D** (``--prefill`` and ``--decode``), in vLLM's convention, the one its NIXL and Mooncake connectors use:
each request goes first to a prefill server (``kv_role: kv_producer``) with
``kv_transfer_params={"do_remote_decode": true}``, ``stream: false`` and one output token; the
``kv_transfer_params`` of its answer go with the original request to a decode server (``kv_role:
kv_consumer``), which loads the prompt's KV instead of computing it; the decode's answer, streamed or whole,
is the client's. A prefill server that answers with an error has that error passed to the client; one that
answers without ``kv_transfer_params`` leaves the decode to compute the prompt itself (logged).

**A pool** (``--instance``, ``kv_role: kv_both``): each request goes to one instance, which loads what
another holds through the cluster index.

Which server: ``--route`` (see :mod:`kv_transfer.routing`): ``round-robin`` (the default), ``least-loaded``,
``cache`` or ``cache-load`` (least expected time to first token; these two read ``--index`` and need each
instance as ``URL=KV_ADDRESS`` and the namespace its connectors run in: ``--model``, ``--block-size``,
``--dtype``, ``--weight-version``). In P/D the prefill is chosen so; the decode, which loads the whole
prompt anyway, by load. A server that refuses a connection, or whose ``/metrics`` does not answer, is not
routed to until it answers again; a request it refused goes to another server of its kind if there is one,
else it is a ``502`` naming it. ``GET`` requests (``/v1/models``, ``/health``) go to a decode or pool
server; ``GET /kv_transfer/routes`` is the proxy's own view (each server's load, state and requests
routed, index lookups and their failures).

It runs on asyncio with aiohttp (which vLLM's own environment carries): one event loop serves every client,
and upstream connections are pooled and kept alive (``--connections`` per upstream server), so a request
costs the proxy no connect and no thread. ``pip install kv-transfer[proxy]`` brings aiohttp elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from .routing import POLICIES, Instance, Pool, Ticket, parse_instance

logger = logging.getLogger("kv_transfer.proxy")

__all__ = ["Instance", "Pool", "Proxy", "ProxyServer", "main"]

#: The POST paths the proxy splits into prefill and decode.
ROUTES = ("/v1/completions", "/v1/chat/completions")
# Request headers passed to both servers (the rest, such as Host and Content-Length, are the proxy's own).
_PASSED = ("authorization", "x-request-id", "accept")


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


_UNREACHABLE = (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError)


class Proxy:
    """The proxy's routes over pooled upstream connections: each OpenAI request to a server of ``serve``
    (a ``kv_both`` pool, or the decode side), after one of ``prefill`` when that is given (P/D)."""

    def __init__(
        self, serve: Pool, prefill: Pool | None = None, connections: int = 256, metrics_interval: float = 1.0
    ) -> None:
        self._serve = serve
        self._prefill = prefill
        self._connections = connections
        self._metrics_interval = metrics_interval
        self._session: aiohttp.ClientSession | None = None
        self._scraper: asyncio.Task[None] | None = None

    def pools(self) -> list[Pool]:
        return [p for p in (self._prefill, self._serve) if p is not None]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("GET", "/kv_transfer/routes", self._routes)
        app.router.add_route("GET", "/{tail:.*}", self._get)
        app.router.add_route("POST", "/{tail:.*}", self._post)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        # Kept-alive connections, at most `connections` per upstream server.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=self._connections, keepalive_timeout=60)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        if self._metrics_interval > 0:
            self._scraper = asyncio.create_task(self._scrape())

    async def _close(self, _: web.Application) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
        if self._session is not None:
            await self._session.close()

    async def _scrape(self) -> None:
        assert self._session is not None
        while True:
            for pool in self.pools():
                await pool.scrape(self._session)
            await asyncio.sleep(self._metrics_interval)

    @staticmethod
    def _headers(request: web.Request) -> dict[str, str]:
        h = {k: v for k, v in request.headers.items() if k.lower() in _PASSED}
        if not any(k.lower() == "x-request-id" for k in h):
            h["X-Request-Id"] = uuid.uuid4().hex
        h["Content-Type"] = "application/json"
        return h

    async def _routes(self, _: web.Request) -> web.Response:
        return web.json_response({"serve": self._serve.view(), "prefill": self._prefill and self._prefill.view()})

    async def _get(self, request: web.Request) -> web.StreamResponse:
        ticket = await self._serve.choose(None)
        assert self._session is not None
        try:
            resp = await self._session.get(
                ticket.instance.url + request.path_qs, headers=self._headers(request), timeout=ticket.instance.timeout
            )
        except _UNREACHABLE as e:
            Pool.done(ticket)
            return _error(502, f"{ticket.instance.url}: {e}")
        try:
            return await self._relay(request, resp)
        finally:
            Pool.done(ticket)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        if request.path not in ROUTES:
            return _error(404, f"{request.path}: the proxy serves {', '.join(ROUTES)}")
        try:
            body = json.loads(await request.read())
        except ValueError as e:
            return _error(400, f"the request body is not JSON: {e}")
        if not isinstance(body, dict):
            return _error(400, "the request body is not a JSON object")
        headers = self._headers(request)
        assert self._session is not None
        params = None
        if self._prefill is not None:
            async with self._sent(self._prefill, request, prefill_request(body), headers, "prefill") as pre:
                if isinstance(pre, web.Response):
                    return pre
                answer = await pre.read()
                if pre.status != 200:
                    ctype = pre.headers.get("Content-Type", "application/json")
                    return web.Response(status=pre.status, body=answer, headers={"Content-Type": ctype})
            try:
                params = json.loads(answer).get("kv_transfer_params")
            except (ValueError, AttributeError):
                pass
            if not params:
                logger.warning("a prefill returned no kv_transfer_params: the decode computes the prompt")
            body = decode_request(body, params)
        what = "decode" if self._prefill is not None else "server"
        async with self._sent(self._serve, request, body, headers, what, routed=self._prefill is None) as resp:
            if isinstance(resp, web.Response):
                return resp
            return await self._relay(request, resp)

    @contextlib.asynccontextmanager
    async def _sent(
        self, pool: Pool, request: web.Request, body: dict[str, Any], headers: dict[str, str], what: str,
        routed: bool = True,
    ) -> AsyncIterator[aiohttp.ClientResponse | web.Response]:
        """``body`` posted to a server of ``pool`` (chosen by the prompt when ``routed``, else by load): its
        response, or the ``502`` the proxy answers when no server of the pool took it. A server that
        refuses the connection is marked down and the next is tried."""
        assert self._session is not None
        tokens = await pool.tokens(self._session, request.path, body) if routed and pool.needs_tokens() else None
        tried: set[str] = set()
        while True:
            ticket: Ticket = await pool.choose(tokens)
            inst = ticket.instance
            try:
                resp = await self._session.post(
                    inst.url + request.path_qs, data=json.dumps(body), headers=headers, timeout=inst.timeout
                )
            except _UNREACHABLE as e:
                Pool.done(ticket)
                tried.add(inst.url)
                if isinstance(e, aiohttp.ClientConnectorError):
                    Pool.refused(inst)
                    if any(i.url not in tried for i in pool.live()):
                        continue
                yield _error(502, f"{what} {inst.url}: {e}")
                return
            try:
                yield resp
            finally:
                resp.release()
                Pool.done(ticket)
            return

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

    def __init__(self, address: tuple[str, int], proxy: Proxy) -> None:
        self._proxy = proxy
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


def _index(args: argparse.Namespace) -> Any:
    """The cluster index ``--index`` names, keyed as the instances' connectors key it."""
    from ._native import ClusterIndex, ConnectorSettings

    settings = ConnectorSettings(
        role="consumer", model=args.model, block_size=args.block_size, dtype=args.dtype,
        weight_version=args.weight_version,
    )
    return ClusterIndex(args.index, settings, timeout=args.index_timeout)


def proxy_from(args: argparse.Namespace) -> Proxy:
    """The proxy the command line asks for (a ``ValueError`` says what is wrong)."""
    if args.instance and (args.prefill or args.decode):
        raise ValueError("give --instance (a kv_both pool) or --prefill and --decode (P/D), not both")
    if not args.instance and not (args.prefill and args.decode):
        raise ValueError("give --instance servers, or at least one --prefill and one --decode server")
    cached = args.route in ("cache", "cache-load")
    if cached and not (args.index and args.model and args.block_size):
        raise ValueError(f"--route {args.route} reads the cluster index: give --index, --model and --block-size")
    index = _index(args) if cached else None

    def pool(specs: list[str], route: str) -> Pool:
        return Pool([parse_instance(u, args.timeout) for u in specs], route, index, args.transfer_cost)

    if args.instance:
        return Proxy(pool(args.instance, args.route), None, args.connections, args.metrics_interval)
    decode_route = "least-loaded" if cached else args.route
    return Proxy(
        pool(args.decode, decode_route), pool(args.prefill, args.route), args.connections, args.metrics_interval
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m kv_transfer.proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", action="append", default=[], metavar="URL", help="a prefill (kv_producer) server; repeatable")
    ap.add_argument("--decode", action="append", default=[], metavar="URL", help="a decode (kv_consumer) server; repeatable")
    ap.add_argument("--instance", action="append", default=[], metavar="URL[=KV]",
                    help="a kv_both server, with its connector's kv_ip:kv_port; repeatable")
    ap.add_argument("--route", default="round-robin", choices=POLICIES, help="how a server is chosen (default round-robin)")
    ap.add_argument("--index", default="", metavar="URL", help="the cluster index (redis://host:port) the instances publish to")
    ap.add_argument("--index-timeout", type=float, default=0.05, help="seconds an index lookup may take (default 0.05)")
    ap.add_argument("--model", default="", help="the model as the instances' --model names it (the KV namespace)")
    ap.add_argument("--block-size", type=int, default=0, help="the instances' --block-size (the KV namespace)")
    ap.add_argument("--dtype", default="bfloat16", help="the instances' model dtype: float32, float16 or bfloat16 (default)")
    ap.add_argument("--weight-version", type=int, default=0, help="the instances' extra-config weight_version (default 0)")
    ap.add_argument("--transfer-cost", type=float, default=0.1,
                    help="pulling a block from another instance, in blocks of compute (default 0.1)")
    ap.add_argument("--metrics-interval", type=float, default=1.0,
                    help="seconds between reads of each server's /metrics (default 1; 0: never)")
    ap.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free port)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds an upstream may take to answer (default 600)")
    ap.add_argument("--connections", type=int, default=256, help="pooled connections per upstream server (default 256)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        proxy = proxy_from(args)
    except ValueError as e:
        ap.error(str(e))
    server = ProxyServer((args.host, args.port), proxy)
    host, port = server.server_address
    # The one line a script waits for (with --port 0, it names the port).
    print(f"kv_transfer.proxy listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
