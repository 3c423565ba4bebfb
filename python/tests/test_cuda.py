"""CUDA arrays as regions and KV caches, in place.

Everywhere: how a CUDA array is read (by the native module) and that GPU memory a build or machine cannot
use is refused with the reason. With torch on a CUDA GPU and a build with ``"cuda"`` in ``FEATURES``
(``scripts/gpu-check.sh`` runs them there): torch CUDA tensors on every route of every backend
and as a connector's KV caches, byte for byte.
"""

import pytest

import kv_transfer as kt

LAYERS, BLOCKS, BLOCK = 4, 16, 4096
NBYTES = LAYERS * BLOCKS * BLOCK


class FakeCudaArray:
    """An object that says it is a CUDA array at a made-up address (never dereferenced)."""

    def __init__(self, shape=(NBYTES,), typestr="|u1", strides=None, readonly=False, address=0x7F0000001000):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (address, readonly),
            "strides": strides,
            "version": 3,
        }


class OnDevice(FakeCudaArray):
    """A fake CUDA array that names its GPU, as CuPy's do."""

    class device:
        id = 1


def _refusal(node, array):
    """What registering `array` raised."""
    with pytest.raises(kt.KvTransferError) as e:
        node.register(kt.KvLayout(4, 1, 8), array)
    return e.value


def test_a_cuda_array_is_read_from_its_interface():
    """The native module reads ``__cuda_array_interface__`` itself: a malformed array is the caller's
    mistake (a ``ConfigurationError``, a ``ValueError`` too), found before any GPU is asked for; a good one
    reaches the GPU it names (here refused for want of GPU support, a driver, or a real allocation)."""
    a, _ = kt.Node.loopback_pair()
    for bad, why in [
        (FakeCudaArray(shape=(4, 8), typestr="<f4", strides=(4, 16)), "not C-contiguous"),
        (FakeCudaArray(readonly=True), "read-only"),
        (FakeCudaArray(shape=(0, 8)), "empty"),
    ]:
        e = _refusal(a, bad)
        assert isinstance(e, kt.ConfigurationError) and isinstance(e, ValueError), e
        assert why in str(e), e
        assert e.fault == "caller"
    for good in (FakeCudaArray(shape=(4, 8), typestr="<f2"), FakeCudaArray(shape=(4, 8), typestr="<f4", strides=(32, 4))):
        e = _refusal(a, good)
        assert "not C-contiguous" not in str(e) and "empty" not in str(e), e
    if "cuda" not in kt.FEATURES:
        assert "CUDA GPU 0" in str(_refusal(a, FakeCudaArray(shape=(4, 8), typestr="<f2")))
        assert "CUDA GPU 1" in str(_refusal(a, OnDevice(shape=(4, 8), typestr="<f2")))


def test_gpu_memory_that_cannot_be_used_is_refused_with_the_reason():
    """No GPU support in the build: how to build it. No driver: says so. A driver: the made-up address
    is in no allocation of the GPU. Nothing is registered in any case."""
    a, _ = kt.Node.loopback_pair()
    producer, _ = kt.Worker.loopback_pair(
        kt.ConnectorSettings(role="producer", model="m", weight_version=1, block_size=16, layers=LAYERS, block_bytes=BLOCK),
        kt.ConnectorSettings(role="consumer", model="m", weight_version=1, block_size=16, layers=LAYERS, block_bytes=BLOCK),
    )
    if "cuda" not in kt.FEATURES:
        why = "--features cuda"
    elif not _driver_present():
        why = "no CUDA driver"
    else:
        why = "cuMemGetAddressRange|not inside one allocation"
    with pytest.raises(kt.KvTransferError, match=why):
        a.register(kt.KvLayout(LAYERS, BLOCKS, BLOCK), FakeCudaArray())
    with pytest.raises(kt.KvTransferError, match=why):
        producer.register_kv_caches(FakeCudaArray(), blocks=BLOCKS)


def _driver_present():
    import ctypes

    for name in ("libcuda.so", "libcuda.so.1"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


def _torch_gpu():
    """torch, when it is installed and sees a CUDA GPU; else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@pytest.fixture
def torch():
    t = _torch_gpu()
    if t is None:
        pytest.skip("not run: needs torch with a CUDA GPU (scripts/gpu-check.sh runs it on one)")
    if "cuda" not in kt.FEATURES:
        pytest.fail("a CUDA GPU is here but this build has no GPU support: build with --features cuda")
    return t


def pattern(torch, n, seed, device):
    return ((torch.arange(n, dtype=torch.int64, device=device) * 2654435761 + seed) % 251).to(torch.uint8)


@pytest.fixture(params=["loopback", "tcp"])
def pair(request):
    if request.param == "loopback":
        a, b = kt.Node.loopback_pair()
        yield a, b, "loopback"
    else:
        b = kt.Node.tcp(2)
        a = kt.Node.tcp(1, listen=None)
        yield a, b, b.address
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize("route", ["gpu-gpu", "gpu-host", "host-gpu"])
def test_torch_cuda_tensors_move_on_every_route_byte_for_byte(torch, pair, route):
    sender, receiver, address = pair
    src_dev, dst_dev = {"gpu-gpu": ("cuda", "cuda"), "gpu-host": ("cuda", "cpu"), "host-gpu": ("cpu", "cuda")}[route]
    src_t = pattern(torch, NBYTES, 7, src_dev)
    dst_t = torch.zeros(NBYTES, dtype=torch.uint8, device=dst_dev)
    torch.cuda.synchronize()
    lay = kt.KvLayout(LAYERS, BLOCKS, BLOCK)
    src = sender.register(lay, src_t if src_dev == "cuda" else src_t.numpy())
    dst = receiver.register(lay, dst_t if dst_dev == "cuda" else dst_t.numpy())
    receiver.publish("kv", dst)
    peer, segments = sender.connect(address)
    for mode in ["exclusive", "packetized", "auto"]:
        dst_t.zero_()
        torch.cuda.synchronize()
        session = sender.submit(peer, src, dict(segments)["kv"], mode=mode)
        out = sender.wait(session, timeout=60)
        assert out.recompute == [] and out.reason is None, (route, mode)
        assert receiver.wait_received(session, timeout=60).recompute == []
        assert torch.equal(dst_t.cpu(), src_t.cpu()), (route, mode)


# The sending process of the same-host test: CUDA IPC opens a GPU allocation only in another process than
# the one that exported it, as serving engines' producer and consumer are.
SHM_SENDER = """
import sys, torch, kv_transfer as kt
address, src_dev, layers, blocks, block = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
n = layers * blocks * block
src_t = ((torch.arange(n, dtype=torch.int64, device=src_dev) * 2654435761 + 5) % 251).to(torch.uint8)
torch.cuda.synchronize()
node = kt.Node.shm(1)
src = node.register(kt.KvLayout(layers, blocks, block), src_t if src_dev == "cuda" else src_t.numpy())
peer, segments = node.connect(address)
for i, mode in enumerate(["exclusive", "packetized", "auto"]):
    out = node.wait(node.submit(peer, src, dict(segments)[f"kv{i}"], mode=mode), timeout=60)
    if out.recompute or out.reason:
        sys.exit(f"{mode}: {len(out.recompute)} blocks to recompute, {out.reason}")
node.shutdown()
"""


@pytest.mark.parametrize("route", ["gpu-gpu", "gpu-host", "host-gpu"])
def test_torch_cuda_tensors_move_between_two_processes_on_one_host(torch, tmp_path, route):
    import os
    import subprocess
    import sys

    src_dev, dst_dev = {"gpu-gpu": ("cuda", "cuda"), "gpu-host": ("cuda", "cpu"), "host-gpu": ("cpu", "cuda")}[route]
    receiver = kt.Node.shm(2, str(tmp_path / "receiver.sock"))
    lay = kt.KvLayout(LAYERS, BLOCKS, BLOCK)
    dsts = [torch.zeros(NBYTES, dtype=torch.uint8, device=dst_dev) for _ in range(3)]
    torch.cuda.synchronize()
    for i, d in enumerate(dsts):
        receiver.publish(f"kv{i}", receiver.register(lay, d if dst_dev == "cuda" else d.numpy()))
    args = [receiver.address, src_dev, str(LAYERS), str(BLOCKS), str(BLOCK)]
    done = subprocess.run(
        [sys.executable, "-c", SHM_SENDER, *args], env=dict(os.environ), capture_output=True, text=True, timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    expected = pattern(torch, NBYTES, 5, "cpu")
    for i, d in enumerate(dsts):
        assert torch.equal(d.cpu(), expected), (route, ["exclusive", "packetized", "auto"][i])
    receiver.shutdown()


def test_a_registered_tensor_stays_alive_without_the_callers_reference(torch):
    sender, receiver = kt.Node.loopback_pair()
    lay = kt.KvLayout(LAYERS, BLOCKS, BLOCK)
    src_t = pattern(torch, NBYTES, 11, "cuda")
    expected = src_t.cpu()
    src = sender.register(lay, src_t)
    del src_t
    # The caching allocator would hand the freed block to the next tensor of its size, and the engine would
    # then send that tensor's bytes: the region's reference must keep it.
    decoy = torch.full((NBYTES,), 0xAB, dtype=torch.uint8, device="cuda")
    dst_t = torch.zeros(NBYTES, dtype=torch.uint8, device="cuda")
    dst = receiver.register(lay, dst_t)
    receiver.publish("kv", dst)
    peer, segments = sender.connect("loopback")
    session = sender.submit(peer, src, dict(segments)["kv"])
    assert sender.wait(session, timeout=60).recompute == []
    assert torch.equal(dst_t.cpu(), expected)
    assert int(decoy[0]) == 0xAB


def test_bfloat16_kv_caches_on_the_gpu_save_and_load_through_the_connector(torch):
    pool = 32

    def settings(role):
        s = {"role": role, "model": "gpu-model", "weight_version": 1, "block_size": 16, "layers": LAYERS, "block_bytes": BLOCK}
        s["store_blocks"] = 64 if role != "consumer" else 0
        return kt.ConnectorSettings(**s)

    from instance import loopback_pair, made

    for make in ("loopback", "tcp"):
        if make == "loopback":
            producer, consumer = loopback_pair(settings("producer"), settings("consumer"))
        else:
            producer = made(settings("producer"), kt.Worker.tcp, 1, listen=None)
            consumer = made(settings("consumer"), kt.Worker.tcp, 2)
        elems = LAYERS * pool * BLOCK // 2
        prefill = torch.randn(elems, device="cuda").to(torch.bfloat16)
        decode = torch.zeros(elems, dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        producer.register_kv_caches(prefill, blocks=pool)
        consumer.register_kv_caches(decode, blocks=pool)
        tokens = list(range(50))  # 3 full blocks
        producer.get_num_new_matched_tokens("r1", tokens)
        producer.update_state_after_alloc("r1", [0, 1, 2, 3], 0)
        producer.bind_connector_metadata(producer.build_connector_meta())
        for layer in range(LAYERS):
            producer.save_kv_layer(layer)
        producer.wait_for_save()
        _, params = producer.request_finished("r1")
        n, _ = consumer.get_num_new_matched_tokens("r1", tokens, 0, params if make == "tcp" else None)
        assert n == 48, make
        consumer.update_state_after_alloc("r1", [7, 8, 9, 10], n)
        consumer.bind_connector_metadata(consumer.build_connector_meta())
        consumer.start_load_kv()
        per_block = BLOCK // 2
        got, want = decode.view(LAYERS, pool, per_block), prefill.view(LAYERS, pool, per_block)
        for layer in range(LAYERS):
            consumer.wait_for_layer_load(layer)
            for s, d in [(0, 7), (1, 8), (2, 9)]:
                assert torch.equal(got[layer, d].cpu(), want[layer, s].cpu()), (make, layer, d)
        assert consumer.failed_blocks() == []
        assert not torch.any(got[:, 10].cpu()), make  # the partial last block was not loaded
