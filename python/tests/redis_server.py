"""A throwaway Redis server on a free 127.0.0.1 port, for the tests of the cluster index (Debian's
``redis-server``, which ``scripts/install-deps.sh`` installs)."""

import shutil
import socket
import subprocess
import time
from contextlib import contextmanager

from ports import free_port


class RedisServer:
    """A Redis without persistence on a port of its own, which a test may kill and start again there
    (empty, as a Redis restarted without persistence is)."""

    def __init__(self):
        self.binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        assert shutil.which(self.binary), "no redis-server: install Debian's redis-server (scripts/install-deps.sh)"
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        """Starts it and waits (at most 20 s) until it takes connections. Fails, never skips."""
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start within 20 s"
                assert self.proc.poll() is None, f"redis-server exited with {self.proc.returncode}"
                time.sleep(0.05)

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@contextmanager
def redis_server():
    """Yields ``"redis://127.0.0.1:PORT"`` of a running Redis without persistence; kills it afterwards.
    Fails (never skips) when no ``redis-server`` is installed."""
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.kill()
