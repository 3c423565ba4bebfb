"""The registry of producers (``Registry.etcd``) against a real etcd server: an announcement is found in
its namespace only, renewed while it lasts, gone when withdrawn and expired when its process stops
renewing it; a scheduler that follows the registry asks what is announced in its namespace. A build
without feature ``etcd`` refuses with the way to build one."""

import subprocess
import sys
import time

import pytest

import kv_transfer as kt

from etcd_server import etcd_server

NS = "kv-transfer model=m weights=1 block=16 dtype=bf16"


def test_without_etcd_support_a_registry_is_refused_with_the_way_to_build_one():
    if "etcd" in kt.FEATURES:
        with pytest.raises(kt.KvTransferError, match="did not answer|etcd"):
            kt.Registry.etcd(["127.0.0.1:1"])  # nothing listens on port 1
        return
    with pytest.raises(kt.KvTransferError, match="--features etcd"):
        kt.Registry.etcd(["127.0.0.1:2379"])


@pytest.fixture(scope="module")
def etcd():
    if "etcd" not in kt.FEATURES:
        pytest.fail("this build of kv_transfer has no etcd support: scripts/python-env.sh builds it with it")
    with etcd_server() as endpoint:
        yield endpoint


def test_an_announcement_is_found_in_its_namespace_only_and_gone_when_withdrawn(etcd):
    registry = kt.Registry.etcd([etcd], prefix="test-one")
    lease = registry.announce(7, "127.0.0.1:14579", NS, ttl=5.0)
    other = registry.announce(8, "127.0.0.1:14600", NS.replace("weights=1", "weights=2"), ttl=5.0)
    assert registry.producers(NS) == ["127.0.0.1:14579"]
    assert registry.producers(NS, exclude="127.0.0.1:14579") == []
    # Renewed past its time to live while the registry lives.
    time.sleep(6.5)
    assert registry.producers(NS) == ["127.0.0.1:14579"]
    registry.withdraw(lease)
    assert registry.producers(NS) == []
    assert registry.producers(NS.replace("weights=1", "weights=2")) == ["127.0.0.1:14600"]
    registry.withdraw(other)


ANNOUNCER = """
import sys, time, kv_transfer as kt
registry = kt.Registry.etcd([sys.argv[1]], prefix="test-two")
registry.announce(9, "127.0.0.1:14700", sys.argv[2], ttl=2.0)
print("announced", flush=True)
time.sleep(60)
"""


def test_the_announcement_of_a_process_that_is_gone_expires_with_its_lease(etcd):
    proc = subprocess.Popen([sys.executable, "-c", ANNOUNCER, etcd, NS], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "announced"
        registry = kt.Registry.etcd([etcd], prefix="test-two")
        assert registry.producers(NS) == ["127.0.0.1:14700"]
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 15
    while registry.producers(NS):
        assert time.monotonic() < deadline, "the dead process's announcement outlived its lease"
        time.sleep(0.5)


def peers_become(scheduler, want, limit=15.0):
    deadline = time.monotonic() + limit
    while scheduler.peers() != want:
        assert time.monotonic() < deadline, f"peers {scheduler.peers()}, not {want}, after {limit} s"
        time.sleep(0.05)


def test_a_scheduler_following_the_registry_asks_what_is_announced_in_its_namespace(etcd):
    registry = kt.Registry.etcd([etcd], prefix="test-three")
    settings = kt.ConnectorSettings(role="both", model="m", weight_version=1, block_size=16, layers=2, block_bytes=4096)
    scheduler = kt.Scheduler(settings, peers=["127.0.0.1:15000"])
    assert scheduler.peers() == ["127.0.0.1:15000"]
    # Followed, what the registry announces is asked beside the peers given: its own address apart, its
    # namespace only.
    scheduler.follow(registry, NS, exclude="127.0.0.1:14801", every=0.1)
    own = registry.announce(10, "127.0.0.1:14801", NS, ttl=5.0)
    other = registry.announce(11, "127.0.0.1:14802", NS, ttl=5.0)
    elsewhere = registry.announce(12, "127.0.0.1:14803", NS.replace("weights=1", "weights=2"), ttl=5.0)
    peers_become(scheduler, ["127.0.0.1:15000", "127.0.0.1:14802"])
    registry.withdraw(other)
    peers_become(scheduler, ["127.0.0.1:15000"])
    for lease in (own, elsewhere):
        registry.withdraw(lease)


def test_with_a_secret_file_only_announcements_sealed_with_it_are_found(etcd, tmp_path):
    key, other = tmp_path / "key", tmp_path / "other"
    key.write_text("cluster secret\n")
    other.write_text("another secret\n")
    cluster = kt.Registry.etcd([etcd], prefix="test-sealed", secret_file=str(key))
    stranger = kt.Registry.etcd([etcd], prefix="test-sealed", secret_file=str(other))
    open_registry = kt.Registry.etcd([etcd], prefix="test-sealed")
    leases = [
        (cluster, cluster.announce(7, "127.0.0.1:14579", NS, ttl=5.0)),
        (stranger, stranger.announce(8, "10.6.6.6:1", NS, ttl=5.0)),
        (open_registry, open_registry.announce(9, "10.6.6.6:2", NS, ttl=5.0)),
    ]
    # A holder of the secret finds only the holder's announcement; a registry with another secret finds
    # only its own.
    assert cluster.producers(NS) == ["127.0.0.1:14579"]
    assert stranger.producers(NS) == ["10.6.6.6:1"]
    with pytest.raises(kt.ConfigurationError, match='"secret_file": cannot read'):
        kt.Registry.etcd([etcd], secret_file=str(tmp_path / "missing"))
    for registry, lease in leases:
        registry.withdraw(lease)
