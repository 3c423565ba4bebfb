"""A vLLM KV connector over the transfer engine.

vLLM (0.32, 0.33) loads it by module path::

    kv_transfer_config={"kv_connector": "KvTransferConnector",
                        "kv_connector_module_path": "kv_transfer.vllm",
                        "kv_role": "kv_producer" | "kv_consumer",
                        "kv_buffer_device": "cpu",
                        "kv_port": 14579}

The connector is built as vLLM's own are: :class:`KvTransferConnector` is a thin facade over a scheduler
half (:mod:`.scheduler`, in vLLM's engine-core process: lookups in Rust, in the background, every
candidate producer asked at once, so vLLM's scheduler thread never waits on the network; plans; no KV
moved) and a worker half (:mod:`.worker`, in each worker process: its KV caches registered in place, its
TCP, shm or RDMA node, and for a producer the host tier store and the control server that serves
consumers on threads of its own, whatever vLLM's steps do), one of them ``None`` by role. The plan
travels from one to the other as a few bytes (the keys raw). The extra config is read once
(:mod:`.options`).

Disaggregated prefill and decode in vLLM's proxy convention: a request to a producer whose
``kv_transfer_params`` ask ``do_remote_decode`` returns, in its output's ``kv_transfer_params``, where its
KV waits (``producer``, and every tensor-parallel rank's control address under ``ranks``); the same prompt
sent to a consumer with those parameters loads the prompt's KV from the producer instead of computing it.
A producer copies each layer into its tier store in the step that computes it (a prompt prefilled in
chunks is saved chunk by chunk), so vLLM frees the request's blocks as usual (``request_finished`` never
delays vLLM's free); instead the store holds the request's blocks for the decode, never dropping them
(a disk tier may take them) until a decode's load of them completes, or ``hold_timeout`` seconds after
their save if none comes; without a disk tier, a save that finds every slot held is dropped. Other
blocks stay loadable until the store evicts them (``store_blocks``, least valuable first).
``python -m kv_transfer.proxy`` puts this convention in front of ``vllm serve`` instances.

``kv_connector_extra_config`` keys (a key not listed, or a bad value, fails start-up naming it):

- ``kv_ip`` (``"127.0.0.1"``): the address a producer's workers serve on, at ``kv_port`` + rank; a
  consumer's workers listen there too, on a free port;
- ``weight_version`` (``0``): part of the key namespace, with the model, block size and dtype;
- ``store_blocks`` (``1024``): blocks a producer keeps in its host tier store;
- ``load_timeout`` (``10.0``): seconds a load may take before its blocks are recomputed;
- ``lookup_timeout`` (``1.0``): seconds each producer is given to answer a lookup (all are asked at
  once; one that has not answered holds nothing, so a slow peer costs a lookup this much at most, and
  nothing when a quicker one holds the whole prompt);
- ``hold_timeout`` (``60.0``): seconds a producer holds a ``do_remote_decode`` request's blocks in its
  store when no decode loads them (``0``: no hold); ``hold_expired_blocks`` in the stats counts holds
  that ran out;
- ``prefetch_depth`` (``2``): layers a load may run ahead of the forward pass;
- ``async_loads`` (``false``): load between vLLM's steps instead of inside the forward pass: the request
  waits (vLLM's ``WAITING_FOR_REMOTE_KVS``) until a worker reports its load over, and the step never
  waits for it;
- ``kv_bandwidth_gbps`` (``0``, no cap): the most a producer serves KV at, in Gbit/s (the engine's token
  bucket);
- ``backend`` (``"tcp"``): how KV moves, ``"tcp"``, ``"shm"`` (producer and consumer on one host, Linux:
  the consumer's workers copy each block straight out of the producer's KV caches, once) or ``"rdma"``
  (libfabric; a build with feature ``rdma``, see the README); the control channel is TCP either way;
- ``shm_same_host`` (``false``): with ``backend: "tcp"``, the same-host backend beside TCP: a producer
  whose consumer runs on its host (same kernel boot and host name) copies through shared memory, other
  consumers get TCP, and one that cannot be reached over shm (another container, say) falls back to TCP;
  ``same_host_loads`` in the stats counts the loads served over shm;
- ``shm_socket_dir`` (``""``: the system's temporary directory): where a consumer's workers make their
  Unix sockets with ``backend: "shm"`` or ``shm_same_host`` (mode 0600; only the same user's processes
  may connect);
- ``rdma_provider`` (``"auto-local"``): libfabric's provider with ``backend: "rdma"``: ``"auto"``
  (``efa``, then ``verbs``, then ``tcp``), ``"auto-local"`` (``shm`` too, for peers on this host), or a
  name (``"verbs"``, ``"efa"``, ``"tcp"``, ``"shm"``);
- ``rdma_domain`` (``""``: the provider's first): the device or interface (``"mlx5_0"``, ``"lo"``);
- ``peers`` (``[]``): control addresses (``"host:port"``, a ``kv_producer`` or ``kv_both`` instance's
  ``kv_ip:kv_port``) a consumer or ``kv_both`` instance asks for the longest stored prefix of each prompt
  whose request names no producer: cross-instance prefix reuse;
- ``discovery`` (``[]``: none): etcd endpoints (``"host:port"``) where instances find each other instead
  of (or beside) ``peers``: a ``kv_producer`` or ``kv_both`` instance announces its control address
  there under its namespace (model, weight version, block size, dtype), and a ``kv_consumer`` or
  ``kv_both`` instance asks every instance announced in its own namespace, as it asks ``peers``; a build
  with feature ``etcd`` (``MATURIN_PEP517_ARGS="--features etcd"``); an etcd that cannot be reached at
  start-up fails it;
- ``discovery_ttl`` (``10.0``): seconds an announcement outlives its instance (renewed every third of
  that while it runs);
- ``index`` (``""``): a cluster index on Redis or Valkey (``redis://host:port``): a role that saves
  publishes what its store holds there; a role that loads asks it who holds a prompt and asks only
  them, instead of every peer (the peers when the index does not answer);
- ``disk_path`` (``""``: none) and ``disk_bytes`` (``0``): a disk tier below a producer's host store, in
  ``disk_path/rank<r>`` for each worker (one directory per instance: two instances must not share one),
  at most ``disk_bytes`` per worker; blocks leaving host memory are written there, lookups and loads cover
  it, and a restarted producer serves what it recovered (each block checksummed; one that fails is
  recomputed);
- ``disk_min_sharers`` (``1``): requests that must have used a block for it to move to disk rather than
  be dropped when it leaves host memory (``2`` keeps one-off prompts off the disk).
- ``secret_file`` (``""``: none): a file holding the cluster's shared secret (a trailing newline is not
  part of it). With it every control connection and every TCP lane is authenticated (HMAC-SHA256 both
  ways), an instance answers only instances with the same secret, sends KV only to the engines of the
  one that asked, and ``kv_ip`` may be an address other hosts reach; without it ``kv_ip`` must be a
  loopback address and a load's KV goes only to the host its control connection came from.

By default a load is synchronous: the request is scheduled at once and its layers stream during the forward
pass (``wait_for_layer_load`` waits for layer *l* while the next ones are on their way). A block that
cannot arrive intact, within ``load_timeout`` or at all, is reported by ``get_block_ids_with_load_errors``
for vLLM to recompute (``kv_load_failure_policy="recompute"``), and a load given up on never writes
another byte into vLLM's blocks. Workers and the scheduler report ``KvTransferStats``
(``get_kv_connector_stats``), which vLLM logs as "KV Transfer metrics" and exports on its ``/metrics``
endpoint as ``vllm:kv_transfer_*`` counters (``build_prom_metrics``): lookups and hits, loads, bytes,
recomputed and saved blocks, and the seconds its steps and its scheduler thread spent in the connector's
calls. ``get_external_cache_hit_sources`` says where each request's loaded tokens came from (``host`` or
``disk`` of this instance's own store, ``p2p`` from another); ``handle_preemptions`` ends a preempted
request's running load before its blocks go to another; ranks find each other through vLLM's own
handshake metadata (``get_handshake_metadata``, ``set_xfer_handshake_metadata``).

Failures come as :mod:`kv_transfer.errors`: a producer that cannot be reached or refuses costs a request
its KV (the prompt is computed), a configuration mistake stops start-up (or the request) naming it.

KV caches in GPU memory (vLLM on a GPU) are registered in place like host ones, in a build with GPU
support (``"cuda" in kv_transfer.FEATURES``; ``kv_buffer_device`` is ignored: the caches are used where
vLLM put them). The engine copies them on its own CUDA stream; ``save_kv_layer`` first waits for the
stream that computed the layer.

With KV cache events on (vLLM's ``--kv-events-config '{"enable_kv_cache_events": true, ...}'``), the
workers report their host store and disk tier as vLLM's ``BlockStored`` and ``BlockRemoved`` events
(medium ``"CPU"`` and ``"STORAGE"``, with each block's tokens and parent;
``get_kv_connector_kv_cache_events``), and ``take_events`` hands them to vLLM's publisher beside its own
GPU events: see :mod:`kv_transfer.vllm.events`.

Optional methods of vLLM's interface left at their defaults: the hybrid-allocator calls
(``request_finished_all_groups``, ``get_loaded_kv_cache_group_ids``: one group of full attention is
supported), ``get_mem_pool_context``, sleep mode and ``reset_cache``.
"""

from __future__ import annotations

from typing import Any

from .options import EXTRA_CONFIG

__all__ = [
    "EXTRA_CONFIG",
    "KvTransferConnector",
    "KvTransferHandshake",
    "KvTransferMetadata",
    "KvTransferPromMetrics",
    "KvTransferStats",
]

# What imports vLLM is loaded when first asked for (vLLM asks for `KvTransferConnector` by name), so the
# options read without vLLM installed.
_LAZY = {
    "KvTransferConnector": "connector",
    "KvTransferMetadata": "connector",
    "KvTransferHandshake": "worker",
    "KvTransferPromMetrics": "stats",
    "KvTransferStats": "stats",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
