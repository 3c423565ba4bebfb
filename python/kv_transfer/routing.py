"""Which ``vllm serve`` instance the proxy sends a request to: in turn, the least loaded, the one holding the
longest prefix of the prompt, or the one with the least expected time to first token (cache and load).

The cache-aware policies read the cluster index (``ClusterIndex``, Redis or Valkey) the instances' connectors
publish to (extra config ``"index"``): the proxy tokenizes the prompt with vLLM's own ``/tokenize`` on one of
the instances (so the tokens are the ones the instance will hash, chat template included), makes the block
keys as every connector does (``sha256_cbor`` prefix hashes in the namespace of model, weight version, block
size and dtype: give the proxy the values the instances run with), and asks the index, in one round trip, who
holds how long a prefix. The index names an instance by its connector's control address (``kv_ip:kv_port``),
so each instance is given as ``URL=KV_ADDRESS``.

Load is what the proxy itself has sent and not seen answered (requests, and the blocks of their prompts
that were to be computed), plus what each instance's ``/metrics`` says it runs and queues beyond that
(``vllm:num_requests_running`` and ``vllm:num_requests_waiting``, scraped every ``metrics_interval``
seconds). An instance whose ``/metrics`` does not answer, or that refused a connection, is not routed to
until it answers again.

Expected time to first token, in units of one block's compute: the work queued there (each request one
unit, plus its blocks to compute), plus the prompt's blocks neither it nor the pool holds, plus
``transfer_cost`` for each block it would pull from another instance (``cluster::route``'s model, run in
Rust by ``Router``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ._native import ClusterIndex, Router

logger = logging.getLogger("kv_transfer.proxy")

__all__ = ["POLICIES", "Instance", "Pool", "Ticket", "parse_instance"]

#: The routing policies, by name.
POLICIES = ("round-robin", "least-loaded", "cache", "cache-load")
_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[0-9.]+|[A-Za-z0-9.-]+):\d+$")
_LOAD = re.compile(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)


@dataclass
class Instance:
    """One ``vllm serve`` instance as the proxy sees it."""

    url: str
    #: Its connector's control address, as the cluster index names it (``None``: not in the index).
    kv: str | None = None
    timeout: aiohttp.ClientTimeout = field(default_factory=lambda: aiohttp.ClientTimeout(total=600.0))
    #: Requests sent there and not yet answered whole.
    in_flight: int = 0
    #: Blocks of those requests' prompts that were to be computed there.
    queued_blocks: int = 0
    #: Requests running or waiting there, as its ``/metrics`` last said.
    reported: int = 0
    #: Whether it answered its last ``/metrics`` scrape and took its last connection.
    up: bool = True
    #: Requests routed there.
    routed: int = 0

    def queued(self) -> float:
        """Work ahead of a new request, in blocks of compute."""
        return float(self.queued_blocks + max(self.in_flight, self.reported))

    def view(self) -> dict[str, Any]:
        return {
            "url": self.url, "kv": self.kv, "up": self.up, "in_flight": self.in_flight,
            "queued_blocks": self.queued_blocks, "reported": self.reported, "routed": self.routed,
        }


def parse_instance(spec: str, timeout: float) -> Instance:
    """An instance from ``URL`` or ``URL=KV_ADDRESS`` (``http://10.0.0.1:8000=10.0.0.1:14579``)."""
    url, kv = spec, None
    head, sep, tail = spec.rpartition("=")
    if sep and _ADDRESS.match(tail):
        url, kv = head, tail
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"{spec!r} is not an http:// or https:// URL (optionally =KV_ADDRESS)")
    return Instance(url.rstrip("/"), kv, aiohttp.ClientTimeout(total=timeout))


@dataclass
class Ticket:
    """A request routed to ``instance``: handed back to :meth:`Pool.done` when its answer has gone out."""

    instance: Instance
    blocks: int
    held: int


class Pool:
    """Instances of one kind (a ``kv_both`` pool, or a P/D side) and how to choose among them."""

    def __init__(
        self,
        instances: Sequence[Instance],
        policy: str = "round-robin",
        index: ClusterIndex | None = None,
        transfer_cost: float = 0.1,
    ) -> None:
        if not instances:
            raise ValueError("a pool needs at least one instance")
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}: use {', '.join(POLICIES)}")
        if policy in ("cache", "cache-load"):
            if index is None:
                raise ValueError(f"routing policy {policy!r} reads the cluster index: give --index")
            missing = [i.url for i in instances if i.kv is None]
            if missing:
                raise ValueError(
                    f"routing policy {policy!r} needs each instance's KV address (URL=KV_ADDRESS): {missing[0]}"
                )
        self.instances = list(instances)
        self.policy = policy
        self._router = Router(policy)
        self._index = index if policy in ("cache", "cache-load") else None
        self._transfer_cost = transfer_cost
        self._tokenizer_turn = 0
        #: Index lookups made, failed (routed on load alone), and tokenizations that failed.
        self.lookups = 0
        self.lookup_failures = 0
        self.tokenize_failures = 0

    def needs_tokens(self) -> bool:
        return self._index is not None

    def live(self) -> list[Instance]:
        """The instances to route to now: those up, or every one when none is."""
        up = [i for i in self.instances if i.up]
        return up or list(self.instances)

    async def tokens(self, session: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> list[int] | None:
        """The prompt's token ids, as vLLM tokenizes it (``/tokenize`` on a live instance), or ``None``."""
        prompt = body.get("prompt")
        if path.endswith("/completions") and "messages" not in body:
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
                prompt = prompt[0]  # a batch: routed by its first prompt
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return list(prompt)
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
                prompt = prompt[0]
            if not isinstance(prompt, str):
                return None
            ask: dict[str, Any] = {"model": body.get("model"), "prompt": prompt}
        else:
            ask = {
                k: body[k]
                for k in ("model", "messages", "tools", "chat_template", "chat_template_kwargs",
                          "add_generation_prompt", "continue_final_message", "add_special_tokens")
                if k in body
            }
        live = self.live()
        up = live[self._tokenizer_turn % len(live)]
        self._tokenizer_turn += 1
        try:
            async with session.post(up.url + "/tokenize", json=ask, timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status != 200:
                    raise ValueError(f"status {r.status}")
                answer = await r.json()
            tokens = answer["tokens"]
            if not isinstance(tokens, list):
                raise TypeError("no token list")
            return [int(t) for t in tokens]
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError, TypeError) as e:
            self.tokenize_failures += 1
            logger.warning("could not tokenize at %s (%s): routing on load alone", up.url, e)
            return None

    async def choose(self, tokens: list[int] | None) -> Ticket:
        """Routes a request whose prompt is ``tokens`` (``None``: unknown)."""
        live = self.live()
        blocks, pooled, held = 0, 0, {}
        if self._index is not None and tokens is not None:
            self.lookups += 1
            try:
                found = await asyncio.get_running_loop().run_in_executor(None, self._index.lookup, tokens)
                blocks, pooled, held = found.blocks, found.pooled, found.holders
            except Exception as e:  # noqa: BLE001 (any index failure: route on load alone)
                self.lookup_failures += 1
                logger.warning("cluster index lookup failed (%s): routing on load alone", e)
        candidates = [(held.get(i.kv or "", 0), i.queued()) for i in live]
        pick = self._router.choose(candidates, blocks, pooled, 1.0, self._transfer_cost)
        inst = live[pick]
        mine = candidates[pick][0]
        ticket = Ticket(inst, max(0, blocks - max(mine, pooled)), mine)
        inst.in_flight += 1
        inst.queued_blocks += ticket.blocks
        inst.routed += 1
        return ticket

    @staticmethod
    def done(ticket: Ticket) -> None:
        """The ticket's answer went out (or failed)."""
        ticket.instance.in_flight -= 1
        ticket.instance.queued_blocks -= ticket.blocks

    @staticmethod
    def refused(inst: Instance) -> None:
        """A connection to ``inst`` failed: not routed to until its ``/metrics`` answers again."""
        if inst.up:
            logger.warning("%s refused a connection: not routed to until it answers", inst.url)
        inst.up = False

    async def scrape(self, session: aiohttp.ClientSession) -> None:
        """Reads each instance's ``/metrics`` once: its load, and whether it is up."""

        async def one(inst: Instance) -> None:
            try:
                async with session.get(inst.url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
                    text = await r.text() if r.status == 200 else None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                text = None
            if text is None:
                if inst.up:
                    logger.warning("%s does not answer /metrics: not routed to", inst.url)
                inst.up = False
                return
            if not inst.up:
                logger.info("%s answers again: routed to", inst.url)
            inst.up = True
            inst.reported = int(sum(float(v) for v in _LOAD.findall(text)))

        await asyncio.gather(*(one(i) for i in self.instances))

    def view(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "lookups": self.lookups, "lookup_failures": self.lookup_failures,
            "tokenize_failures": self.tokenize_failures, "instances": [i.view() for i in self.instances],
        }
