"""What the serving benchmark reads off a running ``vllm serve``: its Prometheus counters (vLLM's own and
this connector's), its KV cache usage sampled while a batch runs, and the peak memory of its processes."""

from __future__ import annotations

import os
import re
import threading
import urllib.request

_SAMPLE = re.compile(r"^(vllm:[a-zA-Z_:]+)(?:\{[^}]*\})? ([0-9.e+-]+)$", re.MULTILINE)


def scrape(url: str) -> dict[str, float]:
    """Every ``vllm:`` sample on ``url``'s ``/metrics``, summed over its labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for name, value in _SAMPLE.findall(text):
        out[name] = out.get(name, 0.0) + float(value)
    return out


def delta(after: dict[str, float], before: dict[str, float], name: str) -> float | None:
    """How much counter `name` grew (``None`` if the server has no such counter)."""
    if name not in after:
        return None
    return after[name] - before.get(name, 0.0)


class UsageWatch:
    """Samples the server's ``vllm:kv_cache_usage_perc`` every `every` seconds until stopped: its peak."""

    def __init__(self, url: str, every: float = 0.2) -> None:
        self.url, self.every, self.peak = url, every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.peak = max(self.peak, scrape(self.url).get("vllm:kv_cache_usage_perc", 0.0))
            except OSError:
                pass

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def peak_rss_mib(pid: int) -> float:
    """The peak resident memory (``VmHWM``) of process `pid` and every descendant alive now, summed, MiB."""
    total = 0
    for p in [pid, *_descendants(pid)]:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out
