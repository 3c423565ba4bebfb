"""What ``kv_transfer.proxy`` costs a request: time to first token (TTFT) through it against a direct
request to the decode server, at 1, 8 and 32 concurrent streams, with upstream servers that answer at
once (so the difference is the proxy's: its prefill hop and its forwarding).

The upstreams are one process of their own speaking vLLM's OpenAI completions in its P/D convention: on
the prefill port, a request with ``kv_transfer_params.do_remote_decode`` gets one token and transfer
parameters back; on the decode port, a streamed request gets ``--tokens`` server-sent events
``--itl-ms`` apart, the first at once. The proxy is ``python -m kv_transfer.proxy`` (another process;
with ``--proxy-path DIR`` first on its ``PYTHONPATH``, another build of it), the client this process
(aiohttp, every stream sending its requests one after another).

    python python/bench/proxy_bench.py [--requests 200] [--streams 1,8,32] [--proxy-path DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import aiohttp
from aiohttp import web

PROMPT = " ".join(f"w{i}" for i in range(256))


# ---- the upstreams (run as `proxy_bench.py --upstreams TOKENS ITL_MS`) ----


async def _upstreams(tokens: int, itl_ms: float) -> None:
    async def prefill(request: web.Request) -> web.Response:
        body = await request.json()
        assert body.get("kv_transfer_params", {}).get("do_remote_decode"), body
        params = {"producer": "127.0.0.1:1", "do_remote_prefill": True}
        return web.json_response({"choices": [{"text": "x", "index": 0}], "kv_transfer_params": params})

    async def decode(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"choices": [{"text": "x" * tokens, "index": 0}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(tokens):
            if i:
                await asyncio.sleep(itl_ms / 1e3)
            await resp.write(b'data: {"choices": [{"text": "t", "index": 0}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    ports = []
    for handler in (prefill, decode):
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    print(json.dumps(ports), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    os._exit(0)


# ---- the client ----


async def _stream(session: aiohttp.ClientSession, url: str) -> float:
    """One streamed completion: seconds to its first token (the whole answer read)."""
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 16, "stream": True}
    start = time.perf_counter()
    first = None
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status} {await resp.text()}")
        async for line in resp.content:
            if first is None and line.startswith(b"data: {"):
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError(f"{url}: no token")
    return first


async def _batch(url: str, streams: int, requests: int) -> dict[str, float]:
    ttfts: list[float] = []
    left = [requests]

    async def stream(session: aiohttp.ClientSession) -> None:
        while left[0] > 0:
            left[0] -= 1
            ttfts.append(await _stream(session, url))

    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(stream(session) for _ in range(min(streams, 4))))  # warm the connections
        ttfts.clear()
        left[0] = requests
        start = time.perf_counter()
        await asyncio.gather(*(stream(session) for _ in range(streams)))
        wall = time.perf_counter() - start
    ms = sorted(t * 1e3 for t in ttfts)
    return {
        "ttft_ms_p50": round(statistics.median(ms), 2),
        "ttft_ms_p90": round(ms[int(0.9 * (len(ms) - 1))], 2),
        "req_per_s": round(len(ms) / wall, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    here = os.path.abspath(__file__)
    up = subprocess.Popen([sys.executable, here, "--upstreams", str(args.tokens), str(args.itl_ms)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert up.stdout is not None and up.stdin is not None
    prefill_port, decode_port = json.loads(up.stdout.readline())
    env = dict(os.environ)
    if args.proxy_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(args.proxy_path), env.get("PYTHONPATH")) if p)
    proxy = subprocess.Popen(
        [sys.executable, "-m", "kv_transfer.proxy", "--port", "0",
         "--prefill", f"http://127.0.0.1:{prefill_port}", "--decode", f"http://127.0.0.1:{decode_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert proxy.stdout is not None
    line = proxy.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError("the proxy did not start: " + line)
    proxy_url, direct_url = line.split()[-1], f"http://127.0.0.1:{decode_port}"
    out: dict[str, Any] = {"proxy_path": args.proxy_path, "requests": args.requests, "tokens": args.tokens,
                           "itl_ms": args.itl_ms, "rows": []}
    try:
        for streams in args.streams:
            direct = asyncio.run(_batch(direct_url, streams, args.requests))
            through = asyncio.run(_batch(proxy_url, streams, args.requests))
            out["rows"].append({"streams": streams, "direct": direct, "proxy": through})
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
        up.stdin.close()
        up.wait(timeout=30)
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--upstreams":
        asyncio.run(_upstreams(int(sys.argv[2]), float(sys.argv[3])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="requests at each level of concurrency")
    ap.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--tokens", type=int, default=16, help="tokens the decode streams back")
    ap.add_argument("--itl-ms", type=float, default=5.0, help="milliseconds between two streamed tokens")
    ap.add_argument("--proxy-path", help="a folder put first on the proxy's PYTHONPATH (another build)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"proxy from {args.proxy_path or 'this environment'}; {args.requests} requests a level, "
          f"{args.tokens} tokens {args.itl_ms:g} ms apart")
    print("| streams | direct TTFT p50 / p90 ms | through the proxy p50 / p90 ms | added p50 ms | req/s direct / proxy |")
    print("| --- | --- | --- | --- | --- |")
    for r in out["rows"]:
        d, p = r["direct"], r["proxy"]
        print(f"| {r['streams']} | {d['ttft_ms_p50']} / {d['ttft_ms_p90']} | {p['ttft_ms_p50']} / {p['ttft_ms_p90']} "
              f"| {round(p['ttft_ms_p50'] - d['ttft_ms_p50'], 2)} | {d['req_per_s']} / {p['req_per_s']} |")


if __name__ == "__main__":
    main()
