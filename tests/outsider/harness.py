"""Starting `te-bench serve` and reading what it prints (PROTOCOL.md section 15)."""

import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def te_bench():
    return os.environ.get("TE_BENCH") or str(REPO / "target" / "debug" / "te-bench")


class Server:
    """`te-bench serve --verify` on a free port; .addr is what it printed."""

    def __init__(self, *extra, verify=True, start_timeout=20.0):
        exe = te_bench()
        if not os.path.exists(exe):
            raise FileNotFoundError("te-bench not found at %s (set TE_BENCH)" % exe)
        args = [exe, "serve", "--listen", "127.0.0.1:0"] + (["--verify"] if verify else []) + list(extra)
        self.errlog = tempfile.NamedTemporaryFile(prefix="te-bench-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.errlog,
                                     stdin=subprocess.DEVNULL)
        self.lines = []
        self.cond = threading.Condition()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        m = self.wait_for(r"listening on (\d+\.\d+\.\d+\.\d+):(\d+)", start_timeout)
        if not m:
            self.stop()
            raise RuntimeError("te-bench serve printed no address: %r" % self.lines)
        self.addr = (m.group(1), int(m.group(2)))

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)   # EOF marker
            self.cond.notify_all()

    def wait_for(self, regex, timeout, start=0):
        """The first match of regex in a printed line (from line index `start`), or None."""
        rx = re.compile(regex)
        end = time.monotonic() + timeout
        i = start
        with self.cond:
            while True:
                while i < len(self.lines):
                    line = self.lines[i]
                    i += 1
                    if line is None:
                        return None
                    m = rx.search(line)
                    if m:
                        return m
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def verdict(self, session, timeout=15.0):
        """What --verify printed for `session`: 'verified', 'MISMATCH', 'not checked: ...'."""
        pat = r"session (?:%s|%#x|0x%016x):\s+(verified.*|MISMATCH.*|not checked.*)" % (
            session, session, session)
        m = self.wait_for(pat, timeout)
        return m.group(1) if m else None

    def output(self):
        with self.cond:
            return "\n".join(l for l in self.lines if l is not None)

    def log(self):
        try:
            with open(self.errlog.name, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.errlog.close()
        try:
            os.unlink(self.errlog.name)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
