"""What a hostile client would try against `te-bench serve`, and that an honest peer beside it
still completes a verified transfer promptly (PROTOCOL.md sections 10-12): floods, lane exhaustion,
engines per address. Sessions, handshakes, idle lanes and garbage are in test_attacks_sessions.py.

Each test starts its own server (`te-bench serve --verify`, port 0).
"""

import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402
from attack_case import HONEST_BOUND_S, TINY, AttackCase, read_frames  # noqa: E402
from peer import CLOSE, OPEN  # noqa: E402


class ControlFlood(AttackCase):
    """(a) Open/Close pairs of a finished session as fast as possible, never reading."""

    def test_flood_of_control_frames(self):
        raw, welcome = self.raw_lane(41, want=TINY)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sid, req = self.finished_session(raw, 41, welcome.segments[0])
        time.sleep(0.2)
        blob = (peer.frame(OPEN, sid, req.encode()) + peer.frame(CLOSE, sid)) * 200
        stop = threading.Event()
        sent = [0]
        ended = []

        def flood():
            raw.settimeout(None)
            try:
                while not stop.is_set():
                    raw.sendall(blob)
                    sent[0] += 400
            except OSError as e:
                ended.append((time.monotonic(), e))

        t0 = time.monotonic()
        th = threading.Thread(target=flood, daemon=True)
        th.start()
        try:
            time.sleep(0.5)
            self.assertGreater(sent[0], 1000, "the flood did not get going")
            for k in range(3):
                self.honest(60 + k)
            self.assertFalse(ended, "the flooder's lane closed before its write stall")
            # The node reads at most ~100 000 control frames a second from the lane (12.1): it
            # stops reading instead of dropping, so TCP holds the flooder back.
            rate = sent[0] / (time.monotonic() - t0)
            self.assertLess(rate, 300_000, "control frames read at %.0f/s" % rate)
            # The answers (Rejects, CloseAcks) it cannot write, the flooder never reading, stall
            # its writes: the lane closes after the 10 s write stall (12.2), without a frame.
            th.join(25)
            self.assertTrue(ended, "the flooder's lane was never closed")
            took = ended[0][0] - t0
            self.assertGreater(took, 8, "closed after %.1f s, before the 10 s stall" % took)
            self.assertIsInstance(ended[0][1], (ConnectionResetError, BrokenPipeError))
        finally:
            stop.set()
        self.honest(70)


class LaneExhaustion(AttackCase):
    """(b) Many engine ids from one address."""
    # Engines per address above connections per address: the connection bound is met first here.
    extra_args = ("--peers-per-address", "256")

    def test_connections_per_address_are_bounded(self):
        held = []
        for k in range(128):
            s = peer.dial(self.srv.addr)
            held.append(s)
            self.addCleanup(s.close)
            peer.handshake(s, 1000 + k)
        refused = []
        for k in range(5):
            s = peer.dial(self.srv.addr)
            self.addCleanup(s.close)
            try:
                peer.handshake(s, 2000 + k)
                self.fail("connection %d beyond the per-address bound was admitted" % (129 + k))
            except peer.HandshakeRejected as e:
                refused.append(e.reason)
            except (ConnectionError, OSError) as e:
                refused.append("closed: %s" % e)
        self.assertTrue(all("127.0.0.1 already holds 128 connections here" in r for r in refused),
                        refused)
        # one address cannot take every lane: an honest client from another address is served
        self.honest(3000, source_ip="127.0.0.2")
        # and freeing one lets the address connect again
        held.pop().close()
        time.sleep(0.3)
        self.honest(3001, bound=HONEST_BOUND_S + 1)

    def test_refusal_flood_is_answered_or_closed(self):
        """More refused connects at once than the 64 answered refusals (11.3a)."""
        for k in range(128):
            s = peer.dial(self.srv.addr)
            self.addCleanup(s.close)
            peer.handshake(s, 1000 + k)
        socks = []
        for k in range(80):
            s = peer.dial(self.srv.addr)
            self.addCleanup(s.close)
            socks.append(s)
        for k, s in enumerate(socks):
            try:
                peer.send_msg(s, peer.Hello(2000 + k).encode())
            except OSError:
                pass
        answered = closed = 0
        for s in socks:
            s.settimeout(5)
            try:
                body = peer.recv_msg(s)
                self.assertIn("already holds 128 connections", peer.decode_reject_msg(body))
                answered += 1
            except (ConnectionError, OSError):
                closed += 1
        self.assertEqual(answered + closed, 80)
        self.assertGreater(answered, 0)
        self.honest(3000, source_ip="127.0.0.2")


class EnginesPerAddress(AttackCase):
    """(b) Many engine ids from one address, each with one lane: at most 64 connected (15)."""

    def test_engines_per_address_are_bounded(self):
        held = []
        for k in range(64):
            s = peer.dial(self.srv.addr)
            held.append(s)
            self.addCleanup(s.close)
            _, welcome = peer.handshake(s, 1000 + k)
            if k == 0:
                token = welcome.token
        # a further lane of an engine already connected (in its group) is admitted: its bound is 2
        s = peer.dial(self.srv.addr)
        self.addCleanup(s.close)
        peer.handshake(s, 1000, token=token)
        s = peer.dial(self.srv.addr)
        self.addCleanup(s.close)
        with self.assertRaises(peer.HandshakeRejected) as refused:
            peer.handshake(s, 2000)
        self.assertIn("127.0.0.1 already has 64 engines connected here", refused.exception.reason)
        # another address is served; and once one engine leaves, the address may connect another
        self.honest(3000, source_ip="127.0.0.2")
        held.pop().close()
        time.sleep(0.3)
        self.honest(3001, bound=HONEST_BOUND_S + 1)


class LanesAcrossAddresses(AttackCase):
    """(c) Engine ids from four addresses fill the node's 256 lanes (within every per-address
    limit); a host from a fifth still gets in: the address holding the most gives up its idlest
    lane, told why in a Reject (11.3a), and a node at its bound never holds more than 256."""

    def test_a_full_node_sheds_the_biggest_holder_for_a_newcomer(self):
        held = {}
        for a in range(4):
            ip = "127.0.0.%d" % (2 + a)
            for k in range(64):
                s = peer.dial(self.srv.addr, source_ip=ip)
                self.addCleanup(s.close)
                peer.handshake(s, 4000 + 64 * a + k)
                held[(ip, k)] = s
        # Full, and every address holds 64: one more from any of them is refused with the reason.
        s = peer.dial(self.srv.addr, source_ip="127.0.0.2")
        self.addCleanup(s.close)
        with self.assertRaises(peer.HandshakeRejected) as refused:
            peer.handshake(s, 4999)
        self.assertIn("already has 256 lanes, its most", refused.exception.reason)
        # A newcomer is served promptly, on a lane the busiest address gave up.
        self.honest(5000, source_ip="127.0.0.9")
        # The lane shed for it was the idlest (the oldest) of the lowest of the biggest addresses;
        # its peer was told why.
        frames, how = read_frames(held[("127.0.0.2", 0)], 2.0)
        self.assertEqual(how, "eof", frames)
        self.assertTrue(frames, "the shed lane was closed without a Reject")
        self.assertEqual(frames[0][0].kind, peer.REJECT)
        self.assertIn("lane shed: this node is at its lane bound and address 127.0.0.2 held the "
                      "most lanes (64)", frames[0][1].decode(errors="replace"))
        # The others kept theirs.
        frames, how = read_frames(held[("127.0.0.3", 0)], 0.2)
        self.assertEqual((frames, how), ([], "timeout"))


if __name__ == "__main__":
    unittest.main()
