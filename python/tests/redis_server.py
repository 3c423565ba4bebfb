"""A throwaway Redis server on a free 127.0.0.1 port, for the tests of the cluster index (Debian's
``redis-server``, which ``scripts/install-deps.sh`` installs)."""

import shutil
import socket
import subprocess
import time
from contextlib import contextmanager

from ports import free_port


@contextmanager
def redis_server():
    """Yields ``"redis://127.0.0.1:PORT"`` of a running Redis without persistence; kills it afterwards.
    Fails (never skips) when no ``redis-server`` is installed."""
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    assert shutil.which(binary), "no redis-server: install Debian's redis-server (scripts/install-deps.sh)"
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start within 20 s"
                assert proc.poll() is None, f"redis-server exited with {proc.returncode}"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
