"""Harness instances (``harness.py``) for the tests: one process each, asked one request per line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from ports import free_port  # noqa: F401 (the package tests' port picker, for the tests here)

HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness.py")
BLOCK = 16


class Instance:
    """``harness.py ROLE LAYOUT PORT EXTRA BATCH [POOL]`` in a process of its own (KV cache events on
    with `kv_events`)."""

    def __init__(self, role, layout, port, extra=None, batch=256, pool=None, kv_events=False):
        args = [sys.executable, HARNESS, role, layout, str(port), json.dumps(extra or {}), str(batch)]
        if pool is not None:
            args.append(str(pool))
        env = dict(os.environ, HARNESS_KV_EVENTS="1" if kv_events else "0")
        self.p = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )

    def ask(self, **request):
        """Runs one request (or, given ``batch=[...]``, several together): the harness's report."""
        self.p.stdin.write(json.dumps(request) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            self.p.kill()
            raise AssertionError("the instance ended early:\n" + self.p.stderr.read()[-6000:])
        return json.loads(line)

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()


def in_order(calls, *names):
    """Checks that `names` were called in this order: each one's first call after the previous name's
    (a lookup that runs in the background answers on a later call, so a call may come again earlier)."""
    at = -1
    for name in names:
        hits = [i for i, c in enumerate(calls) if i > at and (c == name or c.startswith(name + ":"))]
        assert hits, f"{name} never called after {calls[at] if at >= 0 else 'the start'}: {calls}"
        at = hits[0]
