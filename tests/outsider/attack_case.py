"""What every attack test of the outsider suite shares: the layouts, the honest peer's bound, reading
frames off a raw lane, and the test case that starts a server and runs an honest transfer beside an attack.
"""

import os
import socket
import time
import unittest

import harness
import peer
from peer import CLOSE, CLOSE_ACK, DATA, EXCLUSIVE, OPEN, PACKETIZED, Layout, OpenRequest

SMALL = Layout.layer_major(2, 16, 64 << 10)      # 2 MiB
TINY = Layout.layer_major(1, 1, 4096)
# An honest 2 MiB transfer takes ~0.3 s on the 2-core VM against a debug build.
HONEST_BOUND_S = float(os.environ.get("TE_OUTSIDER_HONEST_BOUND_S", "4"))


def read_frames(sock, timeout):
    """Every frame the server writes until it closes (or `timeout`); (frames, how it ended)."""
    sock.settimeout(timeout)
    buf = b""
    how = "timeout"
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            b = sock.recv(65536)
            if not b:
                how = "eof"
                break
            buf += b
    except socket.timeout:
        how = "timeout"
    except ConnectionResetError:
        how = "reset"
    out = []
    while len(buf) >= 48:
        h = peer.decode_header(buf[:48])
        out.append((h, buf[48:48 + h.length]))
        buf = buf[48 + h.length:]
    return out, how


def expect_frame(sock, kind, session, timeout=5.0):
    """Read frames off a raw lane until one of `kind` for `session` arrives."""
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise AssertionError("no %s for %#x" % (peer.KIND_NAMES[kind], session))
        sock.settimeout(left)
        h = peer.decode_header(peer.recv_exact(sock, 48))
        p = peer.recv_exact(sock, h.length) if h.length else b""
        if h.kind == kind and h.session == session:
            return h, p


class AttackCase(unittest.TestCase):
    extra_args = ()

    def setUp(self):
        self.srv = harness.Server(*self.extra_args)
        self.addCleanup(self.srv.stop)

    def honest(self, engine_id, source_ip=None, bound=HONEST_BOUND_S, mode=PACKETIZED):
        """A whole verified 2 MiB transfer (handshake included) within `bound` seconds."""
        t0 = time.monotonic()
        with peer.Client(self.srv.addr, engine_id, want=SMALL, source_ip=source_ip) as c:
            res = c.transfer(mode, slice_bytes=64 << 10, timeout=bound * 3)
        took = time.monotonic() - t0
        self.assertTrue(res.complete, "honest transfer incomplete: %r" % res)
        v = self.srv.verdict(res.session, 10)
        self.assertTrue(v and v.startswith("verified"), "verdict %r\n%s" % (v, self.srv.output()))
        self.assertLess(took, bound, "honest transfer took %.2f s" % took)
        return took

    def raw_lane(self, engine_id, want=None, **kw):
        s = peer.dial(self.srv.addr, **kw)
        self.addCleanup(s.close)
        _, welcome = peer.handshake(s, engine_id, want=want)
        return s, welcome

    def finished_session(self, sock, engine_id, seg, counter=5):
        """Run a one-block session by hand on a raw lane; returns its id."""
        sid = (engine_id << 32) | counter
        req = OpenRequest(TINY, TINY, seg.region, seg.key, EXCLUSIVE, 0, 0, peer.BULK_KV, 0, 1,
                          10_000_000, [0], [0])
        # Data only after OpenAck, Close only after the Ack (6.2): frames of one lane are not
        # necessarily handled in the order they were read
        sock.sendall(peer.frame(OPEN, sid, req.encode()))
        expect_frame(sock, peer.OPEN_ACK, sid)
        sock.sendall(peer.frame(DATA, sid, peer.pattern(engine_id, 4096), layer=0, block=0,
                                sequence=0))
        expect_frame(sock, peer.ACK, sid)
        sock.sendall(peer.frame(CLOSE, sid))
        expect_frame(sock, CLOSE_ACK, sid)
        v = self.srv.verdict(sid, 5)
        self.assertTrue(v and v.startswith("verified"), v)
        return sid, req
