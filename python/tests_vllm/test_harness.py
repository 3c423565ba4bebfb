"""The connector under vLLM 0.33's real scheduler and worker plumbing (fake forward, CPU): a producer
instance computes a prompt and serves its KV; a consumer instance, given the producer's
kv_transfer_params, loads the prompt's KV into its own blocks instead of computing it, under either of
vLLM's KV layouts on either side."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from instances import BLOCK, Instance, free_port, in_order


@pytest.mark.parametrize("producer_layout,consumer_layout", [("LBNHC", "LBNHC"), ("BLNHC", "LBNHC"), ("LBNHC", "BLNHC")])
def test_the_consumer_loads_the_prompt_the_producer_computed(producer_layout, consumer_layout):
    port = free_port()
    producer = Instance("producer", producer_layout, port)
    consumer = Instance("consumer", consumer_layout, free_port())
    try:
        prompt = [(13 * i + 5) % 4000 + 3 for i in range(3 * BLOCK + 7)]  # 3 full blocks and a tail
        made = producer.ask(id="p1", prompt=prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        params = made["kv_transfer_params"]
        assert params["producer"] == f"127.0.0.1:{port}" and params["do_remote_prefill"], made
        assert made["pickled_steps"] >= 1 and made["free_blocks"] == made["all_blocks"] - 1, made
        # vLLM's calls in the order the connector relies on, with the block ids vLLM allocated.
        in_order(made["calls"], "get_num_new_matched_tokens:p1", "update_state_after_alloc:p1", "build_connector_meta",
                 "bind_connector_metadata", "save_kv_layer", "wait_for_save", "request_finished:p1")
        assert made["allocated"]["external_tokens"] == 0, made
        assert made["allocated"]["blocks"] == made["block_table"][: len(made["allocated"]["blocks"])], made
        got = consumer.ask(id="d1", prompt=prompt, max_tokens=2, kv_transfer_params=params)
        in_order(got["calls"], "get_num_new_matched_tokens:d1", "update_state_after_alloc:d1", "build_connector_meta",
                 "bind_connector_metadata", "start_load_kv", "wait_for_layer_load", "get_block_ids_with_load_errors",
                 "request_finished:d1")
        # The loaded tokens went into the first three of the blocks vLLM allocated for the request.
        assert got["allocated"]["external_tokens"] == 3 * BLOCK, got
        assert got["allocated"]["blocks"][:3] == got["block_table"][:3], got
        # The decode computed only the tail: the 3 full blocks came from the producer, into its own
        # block ids, and hold exactly what the producer computed for those tokens.
        assert got["loaded_tokens"] == 3 * BLOCK, got
        assert got["blocks_hold_the_prompt"], got
        assert got["invalid_blocks"] == 0, got
        assert got["free_blocks"] == got["all_blocks"] - 1, got
        # Another prompt: nothing stored, nothing loaded, no error.
        other = consumer.ask(id="d2", prompt=[9] * (2 * BLOCK + 1), max_tokens=1, kv_transfer_params=params)
        assert other["loaded_tokens"] == 0 and other["invalid_blocks"] == 0, other
    finally:
        consumer.close()
        producer.close()


def test_an_asynchronous_load_waits_outside_the_forward_pass_and_lands_whole():
    port = free_port()
    producer = Instance("producer", "LBNHC", port)
    consumer = Instance("consumer", "BLNHC", free_port(), extra={"async_loads": True})
    try:
        prompt = [(5 * i + 9) % 4000 + 3 for i in range(3 * BLOCK + 2)]
        params = producer.ask(id="p1", prompt=prompt, kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
        got = consumer.ask(id="d1", prompt=prompt, max_tokens=2, kv_transfer_params=params)
        # vLLM parked the request (WAITING_FOR_REMOTE_KVS) until a worker reported its load, then
        # computed only the tail.
        assert got["waiting_steps"] >= 1 and got["finished_recving"] == 1, got
        assert got["loaded_tokens"] == 3 * BLOCK and got["blocks_hold_the_prompt"], got
        assert got["invalid_blocks"] == 0 and got["free_blocks"] == got["all_blocks"] - 1, got
        # The worker's stats reached vLLM: one load of 3 blocks x 2 layers x (2 heads x 16 tokens x 32 floats).
        stats = got["stats"]
        assert stats["loads"] == 1 and stats["bytes_in"] == 3 * 2 * 2 * 16 * 32 * 4, stats
        assert stats["calls"] > 0 and stats["call_seconds"] > 0 and stats["recompute_blocks"] == 0, stats
    finally:
        consumer.close()
        producer.close()


def test_a_prompt_prefilled_in_chunks_is_served_as_each_chunk_computed_it():
    port = free_port()
    # 20 tokens a step: the producer prefills the prompt over three steps.
    producer = Instance("producer", "LBNHC", port, batch=20)
    consumer = Instance("consumer", "LBNHC", free_port())
    try:
        prompt = [(3 * i + 4) % 4000 + 3 for i in range(3 * BLOCK + 7)]
        made = producer.ask(id="p1", prompt=prompt, kv_transfer_params={"do_remote_decode": True})
        assert made["stats"]["saved_blocks"] == 3, made
        got = consumer.ask(id="d1", prompt=prompt, max_tokens=1, kv_transfer_params=made["kv_transfer_params"])
        assert got["loaded_tokens"] == 3 * BLOCK and got["blocks_hold_the_prompt"], got
    finally:
        consumer.close()
        producer.close()


@pytest.mark.parametrize("hold_timeout", [60.0, 0.0])
def test_a_decodes_blocks_stay_held_while_other_prompts_fill_the_store(hold_timeout):
    port = free_port()
    # A 4-block store: the P/D request's 3 blocks, then another prompt of 3 blocks that needs room.
    producer = Instance("producer", "LBNHC", port, extra={"store_blocks": 4, "hold_timeout": hold_timeout})
    consumer = Instance("consumer", "LBNHC", free_port())
    try:
        prompt = [(11 * i + 2) % 4000 + 3 for i in range(3 * BLOCK + 5)]
        params = producer.ask(id="p1", prompt=prompt, kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
        other = producer.ask(id="p2", prompt=[(17 * i + 8) % 4000 + 3 for i in range(3 * BLOCK + 1)])
        got = consumer.ask(id="d1", prompt=prompt, max_tokens=1, kv_transfer_params=params)
        if hold_timeout:
            # Held: the other prompt's save found one free slot and dropped the rest; the decode loads all.
            assert other["stats"].get("saved_blocks", 0) <= 1, other
            assert got["loaded_tokens"] == 3 * BLOCK and got["blocks_hold_the_prompt"], got
        else:
            # No hold: the other prompt pushed the request's tail out, and the decode computes it.
            assert other["stats"].get("saved_blocks", 0) == 3, other
            assert got["loaded_tokens"] < 3 * BLOCK and got["invalid_blocks"] == 0, got
        assert got["free_blocks"] == got["all_blocks"] - 1, got
    finally:
        consumer.close()
        producer.close()


def test_a_producer_gone_before_the_load_costs_only_recompute():
    port = free_port()
    producer = Instance("producer", "LBNHC", port)
    consumer = Instance("consumer", "LBNHC", free_port())
    try:
        prompt = [(7 * i + 1) % 4000 + 3 for i in range(2 * BLOCK + 3)]
        params = producer.ask(id="p1", prompt=prompt, kv_transfer_params={"do_remote_decode": True})["kv_transfer_params"]
        producer.close()
        got = consumer.ask(id="d1", prompt=prompt, max_tokens=1, kv_transfer_params=params)
        assert got["loaded_tokens"] == 0, got  # the lookup found nobody: the consumer computed it all
        assert got["free_blocks"] == got["all_blocks"] - 1, got
    finally:
        consumer.close()


def test_a_bad_extra_config_key_fails_start_up_naming_it():
    from kv_transfer.errors import ConfigurationError
    from kv_transfer.vllm.options import parse

    with pytest.raises(ConfigurationError, match="unknown key 'peer'"):
        parse({"peer": "x"})
    with pytest.raises(ValueError, match="store_blocks"):
        parse({"store_blocks": "many"})
    with pytest.raises(ValueError, match="async_loads"):
        parse({"async_loads": "yes"})
    with pytest.raises(ValueError, match="shm_same_host.*'rdma'"):
        parse({"shm_same_host": True, "backend": "rdma"})
    assert parse({"shm_same_host": True}).shm_same_host is True
    assert parse({}).kv_ip == "127.0.0.1"
    with pytest.raises(ValueError, match="'discovery'.*'host:port'"):
        parse({"discovery": "127.0.0.1:2379"})
    with pytest.raises(ValueError, match="discovery_ttl"):
        parse({"discovery_ttl": "long"})
    assert parse({"discovery": ["127.0.0.1:2379"]}).discovery == ("127.0.0.1:2379",)
    assert parse({}).index_timeout == 0.05 and parse({"index_timeout": 2}).index_timeout == 2.0
    with pytest.raises(ValueError, match=r"\['kv_ip'\] = 'localhost' is not an IP address"):
        parse({"kv_ip": "localhost"})
    assert parse({"kv_ip": "::1"}).kv_ip == "::1"
    # Keys of the deployment are checked here; those that are connector settings where every setting is
    # (the native ConnectorSettings): either way the error names the extra-config key.
    for key, value in [("kv_bandwidth_gbps", -2.5), ("discovery_ttl", float("inf")), ("disk_bytes", -1),
                       ("index_timeout", 0.0)]:
        with pytest.raises(ValueError, match=rf"\['{key}'\] = .*must be finite and"):
            parse({key: value})
    for key, value in [("store_blocks", -1), ("load_timeout", 0), ("lookup_timeout", 0.0),
                       ("disk_min_sharers", 0), ("prefetch_depth", -1)]:
        with pytest.raises(ConfigurationError, match=rf"kv_connector_extra_config\[?'?{key}"):
            parse({key: value})


def test_a_bad_extra_config_value_fails_vllm_start_up_naming_the_key():
    instance = Instance("producer", "LBNHC", free_port(), extra={"kv_ip": "localhost"})
    _, err = instance.p.communicate(input="", timeout=300)  # no request: a healthy instance would just end
    assert instance.p.returncode != 0, err[-3000:]
    assert "kv_connector_extra_config['kv_ip'] = 'localhost' is not an IP address" in err, err[-3000:]


def test_a_disk_tier_takes_a_directory_and_a_size_together():
    import vllm  # noqa: F401  (the connector module imports vLLM's base class)

    from kv_transfer.vllm.options import parse

    opts = parse({"disk_path": "/var/cache/kv", "disk_bytes": 1 << 30, "disk_min_sharers": 2})
    assert (opts.disk_path, opts.disk_bytes, opts.disk_min_sharers) == ("/var/cache/kv", 1 << 30, 2)
    for half in ({"disk_path": "/var/cache/kv"}, {"disk_bytes": 1 << 30}):
        with pytest.raises(ValueError, match="disk_path"):
            parse(half)
