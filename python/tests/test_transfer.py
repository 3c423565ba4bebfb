"""Nodes, regions over Python buffers, transfers and the receiving side, on loopback, TCP, same-host
shared memory and RDMA (libfabric's tcp and shm providers, which run without an RDMA device)."""

import threading

import numpy as np
import pytest

import kv_transfer as kt

LAYERS, BLOCKS, BLOCK = 4, 16, 4096


def layout():
    return kt.KvLayout(LAYERS, BLOCKS, BLOCK)


def pattern(n, seed):
    return (np.arange(n, dtype=np.uint64) * 2654435761 + seed).astype(np.uint8)


def block(buf, layer, blk, lay=None):
    lay = lay or layout()
    raw = memoryview(buf).cast("B")
    return b"".join(bytes(raw[o : o + n]) for o, n in lay.chunks(layer, blk))


@pytest.fixture(params=["loopback", "tcp", "shm", "rdma-tcp", "rdma-shm"])
def pair(request, tmp_path):
    """(sender, receiver, receiver's address as the sender connects to it)."""
    if request.param.startswith("rdma"):
        if "rdma" not in kt.FEATURES:
            pytest.skip("not run: this build has no rdma (scripts/python-env.sh builds the package with it)")
        provider, domain = ("tcp", "lo") if request.param == "rdma-tcp" else ("shm", None)
        b = kt.Node.rdma(2, provider, domain)
        a = kt.Node.rdma(1, provider, domain)
        assert b.backend == "rdma" and b.address.startswith("rdma:"), b.address
        yield a, b, b.address
    elif request.param == "loopback":
        a, b = kt.Node.loopback_pair()
        yield a, b, "loopback"
    elif request.param == "shm":
        b = kt.Node.shm(2, str(tmp_path / "receiver.sock"))
        a = kt.Node.shm(1)
        assert (b.backend, b.address) == ("shm", "shm:" + str(tmp_path / "receiver.sock"))
        yield a, b, b.address
    else:
        b = kt.Node.tcp(2)
        a = kt.Node.tcp(1, listen=None)
        yield a, b, b.address
    a.shutdown()
    b.shutdown()


def test_a_numpy_array_arrives_in_a_bytearray_in_every_mode(pair):
    sender, receiver, address = pair
    src_buf = pattern(LAYERS * BLOCKS * BLOCK, 7)
    dst_buf = bytearray(LAYERS * BLOCKS * BLOCK)
    src = sender.register(layout(), src_buf)
    dst = receiver.register(layout(), dst_buf)
    receiver.publish("kv", dst)
    peer, segments = sender.connect(address)
    assert peer == receiver.engine_id
    target = dict(segments)["kv"]
    assert target.layout == layout()
    for mode in ["exclusive", "packetized", "auto"]:
        dst_buf[:] = bytes(len(dst_buf))
        session = sender.submit(peer, src, target, mode=mode)
        out = sender.wait(session, timeout=30)
        assert out.recompute == [] and out.reason is None, mode
        assert receiver.wait_received(session, timeout=30).recompute == []
        assert bytes(dst_buf) == src_buf.tobytes(), mode


def test_blocks_land_pair_by_pair_layer_by_layer(pair):
    sender, receiver, address = pair
    src_buf = pattern(LAYERS * BLOCKS * BLOCK, 3)
    dst_buf = np.zeros(LAYERS * BLOCKS * BLOCK, dtype=np.uint8)
    src = sender.register(layout(), src_buf)
    dst = receiver.register(layout(), dst_buf)
    receiver.publish("kv", dst)
    peer, segments = sender.connect(address)
    session = sender.submit(
        peer, src, dict(segments)["kv"], src_blocks=[1, 5, 9], dst_blocks=[12, 0, 3], prefetch_depth=1
    )
    incoming = receiver.next_incoming(timeout=30)
    assert incoming.session == session and incoming.blocks == [12, 0, 3]
    assert incoming.layers == (0, LAYERS)
    for layer in range(LAYERS):
        receiver.consume_layer(session, layer)
        receiver.wait_layer(session, layer, timeout=30)
        for s, d in [(1, 12), (5, 0), (9, 3)]:
            assert block(dst_buf, layer, d) == block(src_buf, layer, s), (layer, d)
    assert sender.wait(session, timeout=30).recompute == []
    untouched = set(range(BLOCKS)) - {12, 0, 3}
    assert all(block(dst_buf, 0, b) == bytes(BLOCK) for b in untouched)
    assert dict(sender.counters())["blocks_delivered"] >= 3 * LAYERS


def test_vllm_views_block_major_to_layer_major(pair):
    sender, receiver, address = pair
    heads, tokens, head = 2, 16, 64  # bf16: a block is 4096 bytes
    elems = heads * tokens * head

    def views(block_major):
        out = []
        for layer in range(LAYERS):
            stride0, offset = (LAYERS * elems, layer * elems) if block_major else (elems, layer * BLOCKS * elems)
            out.append(([BLOCKS, heads, tokens, head], [stride0, head, heads * head, 1], offset))
        return out

    src_layout = kt.KvLayout.from_vllm(views(True), 2, "bf16")
    dst_layout = kt.KvLayout.from_vllm(views(False), 2, "bf16")
    assert src_layout.kind == "kv_together"
    src_buf = pattern(src_layout.total_bytes, 11)
    dst_buf = bytearray(dst_layout.total_bytes)
    src = sender.register(src_layout, src_buf)
    receiver.publish("kv", receiver.register(dst_layout, dst_buf))
    peer, segments = sender.connect(address)
    session = sender.submit(peer, src, dict(segments)["kv"], mode="packetized")
    assert sender.wait(session, timeout=30).recompute == []
    receiver.wait_received(session, timeout=30)
    for layer in range(LAYERS):
        for b in range(BLOCKS):
            assert block(dst_buf, layer, b, dst_layout) == block(src_buf, layer, b, src_layout)


def test_bad_input_is_a_clear_exception():
    a, b = kt.Node.loopback_pair()
    with pytest.raises(ValueError, match="read-only"):
        a.register(layout(), bytes(LAYERS * BLOCKS * BLOCK))
    with pytest.raises(ValueError, match="smaller than the layout"):
        a.register(layout(), bytearray(100))
    with pytest.raises(TypeError):
        a.register(layout(), 42)
    with pytest.raises(kt.KvTransferError, match="zero dimension"):
        kt.KvLayout(0, 1, 4096)
    with pytest.raises(ValueError, match="unknown dtype"):
        kt.KvLayout(1, 1, 4096, dtype="int3")
    src = a.register(layout(), bytearray(LAYERS * BLOCKS * BLOCK))
    dst = b.register(layout(), bytearray(LAYERS * BLOCKS * BLOCK))
    with pytest.raises(kt.KvTransferError):
        a.submit(b.engine_id, src, dst.handle, src_blocks=[BLOCKS], dst_blocks=[0])
    with pytest.raises(ValueError, match="unknown mode"):
        a.submit(b.engine_id, src, dst.handle, mode="fast")
    with pytest.raises(kt.KvTransferError, match="no answer within"):
        b.next_incoming(timeout=0.05)


def test_a_registered_buffer_cannot_be_resized():
    a, _ = kt.Node.loopback_pair()
    buf = bytearray(LAYERS * BLOCKS * BLOCK)
    region = a.register(layout(), buf)
    with pytest.raises(BufferError):
        buf.extend(b"x")
    assert region.nbytes == len(buf)


def test_waits_release_the_gil():
    _a, b = kt.Node.loopback_pair()
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.005)

    t = threading.Thread(target=tick)
    t.start()
    with pytest.raises(kt.KvTransferError):
        b.next_incoming(timeout=0.5)  # Rust waits half a second; Python threads keep running meanwhile.
    stop.set()
    t.join()
    assert len(ticks) > 20, len(ticks)
