"""What a lookup costs vLLM's scheduler thread: the seconds its calls to the connector's
``get_num_new_matched_tokens`` take, summed over every call one request needs until it has its answer,
with 1, 4 and 16 producers to ask, all quick or one of them slow (its answers held back by ``--slow-ms``).

One producer instance (``python/tests_vllm/harness.py``: vLLM 0.33's scheduler, fake forward) computes the
prompts and serves their KV; every producer the consumer asks is a TCP forwarder in front of it (in a
process of their own, so they take nothing from the thread measured), the slow one delaying what it
forwards to the consumer. The consumer is the connector's scheduler half alone, built by vLLM's own
``KVConnectorFactory`` in this process, called as vLLM's scheduler calls it: once a step (a step every
``--step-ms``) until it answers (``None``: the lookup still runs). Run it in the vLLM 0.33 environment
(``scripts/vllm-env.sh`` prints its path); with ``PYTHONPATH`` naming another build of the package (say
one installed with ``pip install --no-deps --target DIR``) it measures that one.

    python python/bench/lookup_bench.py [--requests N] [--producers 1,4,16] [--slow-ms 200] [--json]
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

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_VLLM = os.path.join(HERE, "..", "tests_vllm")
sys.path.insert(0, TESTS_VLLM)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from ports import free_port  # noqa: E402

#: Prompts the producer computes (each looked up by many requests), and their length in tokens.
PROMPTS, PROMPT_TOKENS = 8, 200


def prompt(i: int) -> list[int]:
    return [(7919 * i + 31 * j) % 4000 + 3 for j in range(PROMPT_TOKENS)]


# ---- the forwarders (run as `lookup_bench.py --forward TARGET_PORT SLOW_MS N`) ----


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while data := await reader.read(1 << 16):
            if delay:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _forward(target: int, slow_ms: float, count: int) -> None:
    async def serve(delay: float, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(_pipe(r, uw, 0.0), _pipe(ur, w, delay))

    ports = []
    for i in range(count):
        delay = slow_ms / 1e3 if i == 0 else 0.0
        server = await asyncio.start_server(lambda r, w, d=delay: serve(d, r, w), "127.0.0.1", 0)
        ports.append(server.sockets[0].getsockname()[1])
    print(json.dumps(ports), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    os._exit(0)  # stdin closed: the bench is done with them, connections and all


class Forwarders:
    """`count` forwarders to the producer's control port, the first delaying by `slow_ms` (0: none)."""

    def __init__(self, target: int, slow_ms: float, count: int) -> None:
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--forward", str(target), str(slow_ms), str(count)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.p.stdout is not None
        self.ports: list[int] = json.loads(self.p.stdout.readline())

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=30)


# ---- the producer ----


class Producer:
    """The harness as a producer, holding the prompts' KV once it has computed them."""

    def __init__(self, port: int) -> None:
        self.p = subprocess.Popen(
            [sys.executable, os.path.join(TESTS_VLLM, "harness.py"), "producer", "LBNHC", str(port)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.p.stdin is not None and self.p.stdout is not None
        for i in range(PROMPTS):
            self.p.stdin.write(json.dumps({"id": f"p{i}", "prompt": prompt(i)}) + "\n")
            self.p.stdin.flush()
            if not self.p.stdout.readline():
                raise RuntimeError("the producer ended early")

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=60)


# ---- the consumer's scheduler half ----


def scheduler_half(peers: list[int]) -> Any:
    """The connector vLLM's scheduler would make for a consumer asking `peers`."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from instance_config import instance_config

    extra = {"peers": [f"127.0.0.1:{p}" for p in peers]}
    config, _, sched_plan, _ = instance_config("consumer", free_port(), extra)
    return KVConnectorFactory.create_connector(config, KVConnectorRole.SCHEDULER, sched_plan)


def requests(n: int, tag: str) -> list[Any]:
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from instance_config import BLOCK

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    sp = SamplingParams(max_tokens=1)
    sp.update_from_generation_config({}, 2)
    return [
        Request(request_id=f"{tag}-{i}", prompt_token_ids=prompt(i % PROMPTS), sampling_params=sp,
                pooling_params=None, block_hasher=hasher)
        for i in range(n)
    ]


def measure(connector: Any, reqs: list[Any], step_s: float) -> dict[str, float]:
    """Each request asked once a step until it answers, one after another: the scheduler thread's
    seconds in those calls per request (median, p90, max), the wall time to the answer, the hits."""
    spent, waited, calls, hits = [], [], [], 0
    for r in reqs:
        inside, began, asked = 0.0, time.perf_counter(), 0
        while True:
            t = time.perf_counter()
            n, _ = connector.get_num_new_matched_tokens(r, 0)
            inside += time.perf_counter() - t
            asked += 1
            if n is not None:
                break
            time.sleep(step_s)
        waited.append(time.perf_counter() - began)
        spent.append(inside)
        calls.append(asked)
        hits += n > 0
        connector.request_finished(r, [])
    spent.sort()
    return {
        "requests": len(reqs),
        "hits": hits,
        "thread_ms_median": round(statistics.median(spent) * 1e3, 3),
        "thread_ms_p90": round(spent[int(0.9 * (len(spent) - 1))] * 1e3, 3),
        "thread_ms_max": round(spent[-1] * 1e3, 3),
        "answer_ms_median": round(statistics.median(waited) * 1e3, 2),
        "calls_median": statistics.median(calls),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import kv_transfer

    port = free_port()
    producer = Producer(port)
    out: dict[str, Any] = {"package": os.path.dirname(kv_transfer.__file__), "slow_ms": args.slow_ms,
                           "step_ms": args.step_ms, "prompt_tokens": PROMPT_TOKENS, "rows": []}
    try:
        for count in args.producers:
            for slow in (0.0, args.slow_ms):
                fwd = Forwarders(port, slow, count)
                try:
                    connector = scheduler_half(fwd.ports)
                    measure(connector, requests(PROMPTS, f"warm{count}-{slow}"), args.step_ms / 1e3)
                    row = measure(connector, requests(args.requests, f"r{count}-{slow}"), args.step_ms / 1e3)
                    connector.shutdown()
                finally:
                    fwd.close()
                out["rows"].append({"producers": count, "slow": bool(slow), **row})
    finally:
        producer.close()
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--forward":
        asyncio.run(_forward(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--producers", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16])
    ap.add_argument("--slow-ms", type=float, default=200.0, help="how long the slow producer's answers are held")
    ap.add_argument("--step-ms", type=float, default=2.0, help="time between two of vLLM's scheduler steps")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = run(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"package {out['package']}; {PROMPT_TOKENS}-token prompts; slow producer +{args.slow_ms:g} ms")
    print("| producers | one slow | scheduler-thread ms/request (median) | p90 | max | answer after ms | calls | hits |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in out["rows"]:
        print(f"| {r['producers']} | {'yes' if r['slow'] else 'no'} | {r['thread_ms_median']} | {r['thread_ms_p90']} "
              f"| {r['thread_ms_max']} | {r['answer_ms_median']} | {r['calls_median']:g} | {r['hits']}/{r['requests']} |")


if __name__ == "__main__":
    main()
