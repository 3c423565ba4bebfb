"""A throwaway etcd server on free 127.0.0.1 ports, for the tests that need a registry (Debian's
``etcd-server``, which ``scripts/install-deps.sh`` installs); ``ETCD_ENDPOINT`` names one instead."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager

from ports import free_port


@contextmanager
def etcd_server():
    """Yields ``"127.0.0.1:PORT"`` of a running etcd; stops and removes it afterwards. Fails (never skips)
    when no etcd binary is installed."""
    if os.environ.get("ETCD_ENDPOINT"):
        yield os.environ["ETCD_ENDPOINT"].split("://")[-1]
        return
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    assert os.path.exists(binary), "no etcd: install Debian's etcd-server (scripts/install-deps.sh)"
    client, peer = free_port(), free_port()
    data = tempfile.mkdtemp(prefix="etcd-py-test-")
    proc = subprocess.Popen(
        [
            binary, "--name", "py-test", "--data-dir", data,
            f"--listen-client-urls=http://127.0.0.1:{client}", f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=py-test=http://127.0.0.1:{peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", client), timeout=0.5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "etcd did not start within 20 s"
                assert proc.poll() is None, f"etcd exited with {proc.returncode}"
                time.sleep(0.1)
        yield f"127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)
