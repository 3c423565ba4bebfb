"""The vLLM connector's ``kv_connector_extra_config``: every key with its default, read once into a typed,
frozen :class:`Options`. The keys that tune the connector itself (store size, timeouts, prefetch, disk
tier) are checked by the native ``ConnectorSettings``, the one place they are checked, and a mistake is
reported under its extra-config name; the keys of the deployment (addresses, backend, peers, discovery)
are checked here. No vLLM import, so tools and tests read it without vLLM.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, fields
from typing import Any

from .._native import ConnectorSettings
from ..errors import ConfigurationError

#: Every ``kv_connector_extra_config`` key, with its default.
EXTRA_CONFIG: dict[str, Any] = {
    "kv_ip": "127.0.0.1",
    "weight_version": 0,
    "store_blocks": 1024,
    "load_timeout": 10.0,
    "lookup_timeout": 1.0,
    "hold_timeout": 60.0,
    "prefetch_depth": 2,
    "async_loads": False,
    "kv_bandwidth_gbps": 0.0,
    "peers": [],
    "discovery": [],
    "discovery_ttl": 10.0,
    "index": "",
    "index_timeout": 0.05,
    "backend": "tcp",
    "rdma_provider": "auto-local",
    "rdma_domain": "",
    "shm_socket_dir": "",
    "shm_same_host": False,
    "disk_path": "",
    "disk_bytes": 0,
    "disk_min_sharers": 1,
    "secret_file": "",
}

#: The keys that are connector settings of the same name (checked by ``ConnectorSettings``).
TUNING = (
    "weight_version",
    "store_blocks",
    "load_timeout",
    "lookup_timeout",
    "hold_timeout",
    "prefetch_depth",
    "async_loads",
    "disk_min_sharers",
)

_BACKENDS = ("tcp", "shm", "rdma")


@dataclass(frozen=True)
class Options:
    """The extra config, read and checked once (see the module docs)."""

    kv_ip: str
    weight_version: int
    store_blocks: int
    load_timeout: float
    lookup_timeout: float
    hold_timeout: float
    prefetch_depth: int
    async_loads: bool
    kv_bandwidth_gbps: float
    peers: tuple[str, ...]
    discovery: tuple[str, ...]
    discovery_ttl: float
    index: str
    index_timeout: float
    backend: str
    rdma_provider: str
    rdma_domain: str
    shm_socket_dir: str
    shm_same_host: bool
    disk_path: str
    disk_bytes: int
    disk_min_sharers: int
    secret_file: str

    def tuning(self) -> dict[str, Any]:
        """The connector settings these options give (beside the model's shape and the rank)."""
        s: dict[str, Any] = {k: getattr(self, k) for k in TUNING}
        s["kv_bandwidth"] = int(self.kv_bandwidth_gbps * 1e9 / 8)
        if self.secret_file:
            s["secret_file"] = self.secret_file
        return s

    def control(self, port: int) -> str:
        """The control address ``kv_ip:port`` (an IPv6 address in brackets)."""
        return socket_address(self.kv_ip, port)


def _bad(key: str, value: Any, why: str) -> ConfigurationError:
    return ConfigurationError(f"kv_connector_extra_config[{key!r}] = {value!r}{why}")


def _addresses(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(p, str) and p.rpartition(":")[2].isdigit() for p in value
    ):
        raise _bad(key, value, " is not a list of 'host:port' strings")
    return tuple(value)


def _number(key: str, value: Any, kind: type, least: float, strict: bool = False) -> Any:
    if isinstance(value, bool):
        raise _bad(key, value, f" is not a {kind.__name__}")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise _bad(key, value, f" is not a {kind.__name__}") from None
    if not math.isfinite(number) or number < least or (strict and number == least):
        bound = f"above {least}" if strict else f"at least {least}"
        raise _bad(key, value, f": must be finite and {bound}")
    return number


def parse(extra: dict[str, Any]) -> Options:
    """The options ``extra`` gives, every key not given at its default; an unknown key or a bad value is a
    ``ConfigurationError`` (a ``ValueError`` too) naming it."""
    unknown = sorted(set(extra) - set(EXTRA_CONFIG))
    if unknown:
        raise ConfigurationError(
            f"kv_connector_extra_config: unknown key {unknown[0]!r}; known: {', '.join(EXTRA_CONFIG)}"
        )
    o = dict(EXTRA_CONFIG)
    o.update(extra)
    for key in ("async_loads", "shm_same_host"):
        if not isinstance(o[key], bool):
            raise _bad(key, o[key], " is not true or false")
    for key in ("kv_ip", "index", "backend", "rdma_provider", "rdma_domain", "shm_socket_dir", "disk_path",
                "secret_file"):
        if not isinstance(o[key], str):
            raise _bad(key, o[key], " is not a string")
    o["peers"] = _addresses("peers", o["peers"])
    o["discovery"] = _addresses("discovery", o["discovery"])
    o["discovery_ttl"] = _number("discovery_ttl", o["discovery_ttl"], float, 0.0, strict=True)
    o["kv_bandwidth_gbps"] = _number("kv_bandwidth_gbps", o["kv_bandwidth_gbps"], float, 0.0)
    o["disk_bytes"] = _number("disk_bytes", o["disk_bytes"], int, 0)
    o["index_timeout"] = _number("index_timeout", o["index_timeout"], float, 0.0, strict=True)
    if o["index"] and not o["index"].startswith(("redis://", "rediss://", "valkey://", "valkeys://")):
        raise _bad("index", o["index"], ": use a Redis or Valkey URL such as 'redis://127.0.0.1:6379'")
    if o["backend"] not in _BACKENDS:
        raise _bad("backend", o["backend"], ": use 'tcp', 'shm' or 'rdma'")
    if bool(o["disk_path"]) != (o["disk_bytes"] > 0):
        raise ConfigurationError(
            "kv_connector_extra_config['disk_path'] and ['disk_bytes'] go together: a directory and a size in bytes"
        )
    if o["shm_same_host"] and o["backend"] != "tcp":
        raise ConfigurationError(
            f"kv_connector_extra_config['shm_same_host'] goes with backend 'tcp' (shm beside it), not {o['backend']!r}"
        )
    try:
        ipaddress.ip_address(o["kv_ip"])
    except ValueError:
        raise _bad("kv_ip", o["kv_ip"], " is not an IP address (host names are not resolved)") from None
    options = Options(**{f.name: o[f.name] for f in fields(Options)})
    check_tuning(options)
    return options


_SETTING = re.compile(r'connector setting "(\w+)": ')
#: A check of the whole configuration that names its key ("load_timeout must be above zero ...").
_NAMED = re.compile(r"\b(\w+) must be ")


def check_tuning(options: Options) -> None:
    """Checks the tuning keys where every connector setting is checked (``ConnectorSettings``), reporting a
    mistake under its extra-config name."""
    try:
        ConnectorSettings(role="both", **options.tuning())
    except ConfigurationError as e:
        found = _SETTING.search(str(e)) or _NAMED.search(str(e))
        key = found.group(1) if found else None
        if key == "kv_bandwidth":
            key = "kv_bandwidth_gbps"
        if key in EXTRA_CONFIG:
            raise ConfigurationError(
                f"kv_connector_extra_config[{key!r}] = {getattr(options, key)!r}: "
                f"{_SETTING.sub('', str(e)).replace('invalid connector configuration: ', '')}"
            ) from None
        raise ConfigurationError(f"kv_connector_extra_config: {e}") from None


def socket_address(ip: str, port: int) -> str:
    """``ip:port``, with an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"

