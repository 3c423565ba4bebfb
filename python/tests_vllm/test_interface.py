"""The rest of vLLM 0.33's connector interface, through its real scheduler, its Prometheus logger and its
handshake path (``harness.py``): the connector's metrics on vLLM's ``/metrics`` with vLLM's labels
(``build_prom_metrics``), where the tokens loaded came from (``get_external_cache_hit_sources``), the
ranks' control addresses through vLLM's handshake metadata, and preemption with a KV cache too small for
the requests running (``handle_preemptions``, ``preempted_req_ids``)."""

import re

from kv_transfer.vllm.stats import STAT_COUNTERS

from instances import BLOCK, Instance, free_port

PROMPT = [(13 * i + 5) % 4000 + 3 for i in range(3 * BLOCK + 5)]


def samples(report, name):
    """``{labels: value}`` of metric `name` in the report's Prometheus samples."""
    out = {}
    for key, value in report["prom"].items():
        m = re.fullmatch(re.escape(name) + r"\{(.*)\}", key)
        if m:
            out[m.group(1)] = value
    return out


def test_the_connectors_counters_reach_vllms_prometheus_endpoint_and_hits_are_p2p():
    port = free_port()
    producer, consumer = Instance("producer", "LBNHC", port), Instance("consumer", "LBNHC", free_port())
    try:
        made = producer.ask(id="p", prompt=PROMPT, kv_transfer_params={"do_remote_decode": True})
        got = consumer.ask(id="c", prompt=PROMPT, kv_transfer_params=made["kv_transfer_params"])
        assert got["loaded_tokens"] == 3 * BLOCK and got["blocks_hold_the_prompt"], got
        # Every counter is there, labelled as vLLM labels its own (model name, engine index).
        for key in STAT_COUNTERS:
            name = "vllm:kv_transfer_load_seconds_total" if key == "load_us" else f"vllm:kv_transfer_{key}_total"
            found = samples(got, name)
            assert len(found) == 1, (name, sorted(got["prom"]))
            labels = next(iter(found))
            assert 'engine="0"' in labels and "model_name=" in labels, labels
        one = lambda name: next(iter(samples(got, name).values()))  # noqa: E731
        assert one("vllm:kv_transfer_bytes_in_total") == got["stats"]["bytes_in"] > 0
        assert one("vllm:kv_transfer_loads_total") == 1
        assert one("vllm:kv_transfer_lookup_hits_total") == 3
        assert 0 < one("vllm:kv_transfer_load_seconds_total") < 20
        assert one("vllm:kv_transfer_scheduler_seconds_total") > 0
        # The producer's side: the bytes it served.
        served = producer.ask(id="p2", prompt=[7] * 5)
        assert next(iter(samples(served, "vllm:kv_transfer_bytes_out_total").values())) == got["stats"]["bytes_in"]
        # The loaded tokens came from another instance: vLLM counts them as p2p.
        assert got["hits_by_source"] == {"p2p": 3 * BLOCK}, got["hits_by_source"]
        by_source = samples(got, "vllm:prompt_tokens_cached_by_source_total")
        assert [v for k, v in by_source.items() if 'source="p2p"' in k] == [3 * BLOCK], by_source
    finally:
        consumer.close()
        producer.close()


def test_hits_from_an_instances_own_store_are_host_or_disk(tmp_path):
    # Four blocks of host store, a disk tier below: of three prompts of three blocks, the last is found
    # in host memory, the first (pushed out by the others) on disk.
    extra = {"store_blocks": 4, "disk_path": str(tmp_path), "disk_bytes": 1 << 20}
    both = Instance("both", "LBNHC", free_port(), extra)
    others = [[(29 * j + 101 * i) % 4000 + 3 for j in range(3 * BLOCK + 1)] for i in range(2)]
    try:
        for rid, prompt in (("a", PROMPT), ("b", others[0]), ("c", others[1])):
            assert both.ask(id=rid, prompt=prompt)["loaded_tokens"] == 0
        last = both.ask(id="c2", prompt=others[1])
        assert last["loaded_tokens"] == 3 * BLOCK and last["blocks_hold_the_prompt"], last
        assert last["hits_by_source"] == {"host": 3 * BLOCK}, last["hits_by_source"]
        first = both.ask(id="a2", prompt=PROMPT)
        assert first["loaded_tokens"] == 3 * BLOCK and first["blocks_hold_the_prompt"], first
        assert first["hits_by_source"].get("disk", 0) > 0, first["hits_by_source"]
        assert sum(first["hits_by_source"].values()) == 3 * BLOCK, first["hits_by_source"]
    finally:
        both.close()


def test_the_host_and_disk_tiers_reach_vllms_kv_event_publisher_as_routers_decode_them(tmp_path):
    # KV cache events on: what vLLM's publisher is handed, msgpack-encoded and decoded as a router does.
    extra = {"store_blocks": 4, "disk_path": str(tmp_path), "disk_bytes": 1 << 20}
    both = Instance("both", "LBNHC", free_port(), extra, kv_events=True)
    others = [[(29 * j + 101 * i) % 4000 + 3 for j in range(3 * BLOCK + 1)] for i in range(2)]
    try:
        a = both.ask(id="a", prompt=PROMPT)
        mine = [e for e in a["kv_events"] if e["medium"] != "GPU"]
        # One store of the prompt's chain: vLLM's own block hashes, the blocks' tokens, host memory.
        assert mine == [{
            "type": "BlockStored", "block_hashes": a["block_hashes"]["a"], "parent_block_hash": None,
            "token_ids": PROMPT[: 3 * BLOCK], "block_size": BLOCK, "lora_id": None, "medium": "CPU", "lora_name": None,
        }], mine
        later = []
        for rid, prompt in (("b", others[0]), ("c", others[1])):
            later += [e for e in both.ask(id=rid, prompt=prompt)["kv_events"] if e["medium"] != "GPU"]
        # Replayed as a router keeps them: where each block is, by medium.
        held = {"CPU": set(a["block_hashes"]["a"]), "STORAGE": set()}
        for e in later:
            for h in e["block_hashes"]:
                if e["type"] == "BlockStored":
                    assert h not in held[e["medium"]], e
                    held[e["medium"]].add(h)
                    assert len(e["token_ids"]) == BLOCK * len(e["block_hashes"]), e
                else:
                    assert e["type"] == "BlockRemoved" and h in held[e["medium"]], e
                    held[e["medium"]].discard(h)
        # The first prompt's blocks went down to disk (reported there before they left host memory), the
        # last prompt's are in host memory, and no more than the store's four blocks are.
        down = [i for i, e in enumerate(later) if e["type"] == "BlockStored" and e["medium"] == "STORAGE"]
        gone = [i for i, e in enumerate(later) if e["type"] == "BlockRemoved" and e["medium"] == "CPU"]
        assert down and gone and min(down) < min(gone), later
        assert set(a["block_hashes"]["a"]) & held["STORAGE"] and not set(a["block_hashes"]["a"]) & held["CPU"], held
        c = both.ask(id="c2", prompt=others[1])
        assert set(c["block_hashes"]["c2"]) <= held["CPU"] and len(held["CPU"]) <= 4, held
    finally:
        both.close()


def test_ranks_reach_the_scheduler_through_vllms_handshake_metadata():
    port = free_port()
    producer = Instance("producer", "LBNHC", port)
    try:
        made = producer.ask(id="p", prompt=PROMPT, kv_transfer_params={"do_remote_decode": True})
        assert made["handshake"] == {"rank": 0, "control": f"127.0.0.1:{port}"}, made["handshake"]
        assert made["kv_transfer_params"]["ranks"] == [f"127.0.0.1:{port}"], made["kv_transfer_params"]
    finally:
        producer.close()


def test_requests_preempted_for_a_tiny_kv_cache_load_again_and_save_whole():
    # Two requests of four blocks each start together in 8 usable blocks of KV cache and grow as they
    # decode: vLLM preempts one (its blocks go to the other) and runs it again from the start once the
    # other is done, on the producer (which has saved the prompt) and on the consumer (which loaded it).
    # Every block the consumer loads holds its prompt (the producer saved nothing out of blocks given to
    # the other request), none is reported lost, and the preempted request loads again when it resumes.
    prompts = [[(37 * j + 7 * i) % 4000 + 3 for j in range(3 * BLOCK + 1)] for i in range(2)]
    port = free_port()
    producer = Instance("producer", "LBNHC", port, pool=9)
    consumer = Instance("consumer", "LBNHC", free_port(), pool=9)
    try:
        made = producer.ask(batch=[
            {"id": f"p{i}", "prompt": p, "max_tokens": 3 * BLOCK, "kv_transfer_params": {"do_remote_decode": True}}
            for i, p in enumerate(prompts)
        ])
        assert made["preempted"], made["calls"]
        assert sorted(made["finished"]) == ["p0", "p1"]
        params = [made["finished"][f"p{i}"]["kv_transfer_params"] for i in range(2)]
        got = consumer.ask(batch=[
            {"id": f"c{i}", "prompt": p, "max_tokens": 3 * BLOCK, "kv_transfer_params": params[i]}
            for i, p in enumerate(prompts)
        ])
        assert got["preempted"], got["calls"]
        assert "handle_preemptions" in got["calls"]
        assert got["invalid_blocks"] == 0, got
        assert sorted(got["finished"]) == ["c0", "c1"]
        for rid, r in got["finished"].items():
            assert r["loaded_tokens"] == 3 * BLOCK and r["blocks_hold_the_prompt"], (rid, r)
        # The preempted request looked its prompt up again when it resumed, and loaded it twice.
        again = got["preempted"][0]
        assert got["calls"].count(f"update_state_after_alloc:{again}") == 2, got["calls"]
        assert got["stats"]["loads"] == 3, got["stats"]
    finally:
        consumer.close()
        producer.close()


def test_with_the_cluster_index_a_consumer_finds_the_instance_holding_a_prompt_without_peers():
    from redis_server import redis_server

    with redis_server() as url:
        holder = Instance("both", "LBNHC", free_port(), extra={"index": url})
        # No producer named, no peers: only the index says where the prompt is.
        asking = Instance("consumer", "LBNHC", free_port(), extra={"index": url})
        try:
            made = holder.ask(id="made", prompt=PROMPT)
            assert made["loaded_tokens"] == 0, made
            # The holder publishes in the background: until its blocks are in the index, the consumer
            # finds nothing and computes (storing nothing: it is a consumer).
            for attempt in range(100):
                got = asking.ask(id=f"ask{attempt}", prompt=PROMPT)
                if got["loaded_tokens"]:
                    break
            assert got["loaded_tokens"] == 3 * BLOCK and got["blocks_hold_the_prompt"], got
            assert got["hits_by_source"] == {"p2p": 3 * BLOCK}, got["hits_by_source"]
        finally:
            asking.close()
            holder.close()
