"""The vLLM connector's ``kv_connector_extra_config`` keys: their defaults and the checks a start-up runs
(kept apart from ``kv_transfer.vllm``, which imports vLLM, so tools and tests read them without it; the
keys are documented in ``kv_transfer.vllm``'s module docs and docs/CONFIGURATION.md)."""

from __future__ import annotations

import ipaddress
import math
from typing import Any, Dict

#: Every ``kv_connector_extra_config`` key, with its default.
EXTRA_CONFIG: Dict[str, Any] = {
    "kv_ip": "127.0.0.1",
    "weight_version": 0,
    "store_blocks": 1024,
    "load_timeout": 10.0,
    "hold_timeout": 60.0,
    "prefetch_depth": 2,
    "async_loads": False,
    "kv_bandwidth_gbps": 0.0,
    "peers": [],
    "discovery": [],
    "discovery_ttl": 10.0,
    "backend": "tcp",
    "rdma_provider": "auto-local",
    "rdma_domain": "",
    "shm_socket_dir": "",
    "shm_same_host": False,
    "disk_path": "",
    "disk_bytes": 0,
    "disk_min_sharers": 1,
}

#: The least value of each numeric key (a float key's must also be finite); ``load_timeout`` and
#: ``discovery_ttl`` must be above theirs.
_LEAST: Dict[str, float] = {
    "weight_version": 0,
    "store_blocks": 0,
    "load_timeout": 0.0,
    "hold_timeout": 0.0,
    "prefetch_depth": 0,
    "kv_bandwidth_gbps": 0.0,
    "discovery_ttl": 0.0,
    "disk_bytes": 0,
    "disk_min_sharers": 1,
}
_ABOVE_LEAST = ("load_timeout", "discovery_ttl")


def _options(extra: Dict[str, Any]) -> Dict[str, Any]:
    unknown = sorted(set(extra) - set(EXTRA_CONFIG))
    if unknown:
        raise ValueError(
            f"kv_connector_extra_config: unknown key {unknown[0]!r}; known: {', '.join(EXTRA_CONFIG)}"
        )
    opts = dict(EXTRA_CONFIG)
    opts.update(extra)
    for key in ("peers", "discovery"):
        addrs = opts[key]
        if not isinstance(addrs, (list, tuple)) or not all(
            isinstance(p, str) and p.rpartition(":")[2].isdigit() for p in addrs
        ):
            raise ValueError(f"kv_connector_extra_config[{key!r}] = {addrs!r} is not a list of 'host:port' strings")
    if opts["backend"] not in ("tcp", "shm", "rdma"):
        raise ValueError(f"kv_connector_extra_config['backend'] = {opts['backend']!r}: use 'tcp', 'shm' or 'rdma'")
    if bool(opts["disk_path"]) != (int(opts["disk_bytes"] or 0) > 0):
        raise ValueError(
            "kv_connector_extra_config['disk_path'] and ['disk_bytes'] go together: a directory and a size in bytes"
        )
    if opts["shm_same_host"] is True and opts["backend"] != "tcp":
        raise ValueError(
            f"kv_connector_extra_config['shm_same_host'] goes with backend 'tcp' (shm beside it), not {opts['backend']!r}"
        )
    for key, default in EXTRA_CONFIG.items():
        if key in ("peers", "discovery"):
            continue
        if isinstance(default, bool):
            if not isinstance(opts[key], bool):
                raise ValueError(f"kv_connector_extra_config[{key!r}] = {opts[key]!r} is not true or false")
            continue
        kind = float if isinstance(default, float) else type(default)
        try:
            opts[key] = kind(opts[key])
        except (TypeError, ValueError):
            raise ValueError(f"kv_connector_extra_config[{key!r}] = {opts[key]!r} is not a {kind.__name__}")
    for key, least in _LEAST.items():
        value = opts[key]
        strict = key in _ABOVE_LEAST
        if not math.isfinite(value) or value < least or (strict and value == least):
            bound = f"above {least}" if strict else f"at least {least}"
            raise ValueError(f"kv_connector_extra_config[{key!r}] = {value!r}: must be finite and {bound}")
    try:
        ipaddress.ip_address(opts["kv_ip"])
    except ValueError:
        raise ValueError(
            f"kv_connector_extra_config['kv_ip'] = {opts['kv_ip']!r} is not an IP address (host names are not resolved)"
        ) from None
    return opts


def _socket_address(ip: str, port: int) -> str:
    """``ip:port``, with an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
