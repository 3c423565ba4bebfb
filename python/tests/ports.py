"""Ports for servers a test starts in another process: below the kernel's ephemeral range, so no port the
kernel hands out in the meantime (an outgoing connection, or a ``bind`` to port 0 such as the ports vLLM
picks for its own processes) can take one before its server binds it, and never the same one twice in a
test process. Shared by python/tests, tests_vllm and tests_e2e."""

import random
import socket

_given = set()
_rng = random.Random()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A 127.0.0.1 TCP port nothing listens on, outside the ephemeral range, not given before here."""
    high = _ephemeral_low()
    low = max(1024, high - 12000)
    for _ in range(1000):
        port = _rng.randrange(low, high)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise AssertionError(f"no free port in {low}..{high}")
