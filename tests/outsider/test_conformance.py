"""Conformance of the outsider peer (peer.py) with `te-bench serve` (docs/PROTOCOL.md); the document's
own worked examples are checked in test_document.py.

Run: python3 -m unittest discover -s tests/outsider -v   (or pytest tests/outsider)
The server binary comes from $TE_BENCH (default <repo>/target/debug/te-bench).
"""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import peer  # noqa: E402
from peer import (ACK, BULK_KV, CLOSE, CLOSE_ACK, DATA, EXCLUSIVE, OPEN, OPEN_ACK,  # noqa: E402
                  PACKETIZED, REJECT, AUTO, Layout, OpenRequest)

# A small served region: 2 layers x 16 blocks x 64 KiB = 2 MiB.
SMALL = Layout.layer_major(2, 16, 64 << 10)


def kv_apart_layout(layers, blocks, block_bytes):
    """Kind 3 (K/V apart): all K halves of a layer, then all V halves."""
    half = block_bytes // 2
    heads = block_bytes // (16 * 2 * 256)
    return Layout(layers, blocks, block_bytes, 16, peer.BF16, peer.KIND_KV_APART, heads, 256,
                  0, 2 * blocks * half, half, half, blocks * half)


class ServerConformance(unittest.TestCase):
    """Transfers into `te-bench serve --verify`, judged by what it prints."""

    @classmethod
    def setUpClass(cls):
        cls.srv = harness.Server()
        cls.next_engine = 100

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def engine(self):
        type(self).next_engine += 1
        return type(self).next_engine

    def client(self, want=SMALL, lanes=1, **kw):
        c = peer.Client(self.srv.addr, self.engine(), want=want, lanes=lanes, **kw)
        self.addCleanup(c.close)
        return c

    def assertVerified(self, res, timeout=15.0):
        self.assertTrue(res.opened, "not opened: %s" % res.reject)
        self.assertEqual(res.acked, res.units, "acked %d of %d" % (res.acked, res.units))
        self.assertTrue(res.close_acked, "no CloseAck")
        v = self.srv.verdict(res.session, timeout)
        self.assertIsNotNone(v, "no verdict for %#x; server printed:\n%s" % (
            res.session, self.srv.output()))
        self.assertTrue(v.startswith("verified"), v)
        m = self.srv.wait_for(r"session %#x: (\S+ \S+) received, (\d+) blocks delivered, (\d+) to "
                              r"recompute" % res.session, 5)
        self.assertIsNotNone(m)
        self.assertEqual(m.group(3), "0")
        return v

    def test_served_region_is_the_wanted_layout(self):
        c = self.client()
        seg = c.served()
        self.assertEqual(seg.layout, SMALL)
        self.assertEqual(seg.length, SMALL.extent())
        self.assertEqual(c.server_hello.engine_id, 2)
        self.assertGreaterEqual(seg.region, 1)

    def test_packetized_coalesced_two_lanes(self):
        c = self.client(lanes=2)
        res = c.transfer(PACKETIZED, slice_bytes=16 << 10)
        self.assertLess(res.frames_sent, res.units)   # coalescing really happened
        self.assertVerified(res)
        m = self.srv.wait_for(r"session %#x from engine %d: layers 0..2 of 16 blocks into region #?%d"
                              % (res.session, c.engine_id, c.served().region), 5)
        self.assertIsNotNone(m, self.srv.output())

    def test_packetized_one_slice_per_frame(self):
        c = self.client()
        res = c.transfer(PACKETIZED, slice_bytes=8 << 10, coalesce_bytes=0)
        self.assertEqual(res.frames_sent, res.units)
        self.assertVerified(res)

    def test_packetized_odd_slice_size(self):
        # 64 KiB blocks sliced by 1000 bytes: the last slice of each block is 536 bytes
        c = self.client()
        res = c.transfer(PACKETIZED, slice_bytes=1000, coalesce_bytes=64 << 10)
        self.assertEqual(res.units, 32 * 66)
        self.assertVerified(res)

    def test_exclusive(self):
        c = self.client()
        res = c.transfer(EXCLUSIVE)
        self.assertEqual(res.units, 32)
        self.assertVerified(res)

    def test_auto_mixed_runs_and_slices(self):
        c = self.client()
        blocks = [0, 1, 2, 3, 4, 5, 6, 7, 9, 8, 10, 11, 12, 13, 14, 15]
        res = c.transfer(AUTO, slice_bytes=16 << 10, exclusive_min_bytes=256 << 10,
                         src_blocks=blocks)
        self.assertVerified(res)

    def test_auto_small_blocks_merge_into_1mib_units(self):
        lay = Layout.layer_major(2, 384, 4096)
        c = self.client(want=lay)
        res = c.transfer(AUTO, slice_bytes=1024, exclusive_min_bytes=0)
        self.assertEqual(res.units, 4)
        self.assertVerified(res)

    def test_two_chunk_layout_all_modes(self):
        lay = kv_apart_layout(2, 8, 64 << 10)
        c = self.client(want=lay)
        self.assertEqual(c.served().layout, lay)
        for mode in (PACKETIZED, EXCLUSIVE, AUTO):
            with self.subTest(mode=mode):
                res = c.transfer(mode, slice_bytes=12 << 10, exclusive_min_bytes=0)
                self.assertVerified(res)

    def test_auto_threshold_counts_whole_blocks_even_with_cuts(self):
        # 64 KiB blocks of two 32 KiB chunks, exclusive_min 48 KiB: the threshold is compared
        # with run * block_bytes (7.2), not with a piece, so every piece goes exclusive
        lay = kv_apart_layout(2, 8, 64 << 10)
        c = self.client(want=lay)
        res = c.transfer(AUTO, slice_bytes=12 << 10, exclusive_min_bytes=48 << 10)
        self.assertEqual(res.units, 2 * 8 * 2)
        self.assertVerified(res)

    def test_corrupted_payload_is_nacked_and_resent(self):
        c = self.client()
        res = c.transfer(PACKETIZED, slice_bytes=16 << 10, coalesce_bytes=0, corrupt={3, 70})
        self.assertEqual(res.nacks, 2)
        self.assertGreaterEqual(res.resends, 2)
        self.assertVerified(res)

    def test_corrupted_coalesced_frame_nacks_every_unit(self):
        c = self.client()
        res = c.transfer(PACKETIZED, slice_bytes=16 << 10, coalesce_bytes=64 << 10, corrupt={4})
        # units 4..7 travelled in one frame of 4 slices: a nack for each
        self.assertEqual(res.nacks, 4)
        self.assertVerified(res)

    def test_wrong_pattern_is_a_mismatch(self):
        """The verdict can fail: a region filled with another engine's pattern."""
        c = self.client()
        res = c.transfer(EXCLUSIVE, seed=c.engine_id + 1)
        self.assertTrue(res.complete)
        v = self.srv.verdict(res.session)
        self.assertIsNotNone(v)
        self.assertTrue(v.startswith("MISMATCH"), v)

    def test_partial_transfer_not_checked(self):
        c = self.client()
        res = c.transfer(EXCLUSIVE, stop_after_units=10)
        # every sent unit acknowledged, then Close
        t_end = time.monotonic() + 5
        while res.acked < 10 and time.monotonic() < t_end:
            f = c.inbox.get(timeout=1)
            if f and f.header.kind == ACK and f.header.session == res.session:
                res.acked += sum(b - a for a, b in peer.decode_ranges(f.payload))
        self.assertEqual(res.acked, 10)
        c.lanes[0].send_frame(CLOSE, res.session)
        f = self._wait_kind(c, CLOSE_ACK, res.session)
        self.assertIsNotNone(f)
        v = self.srv.verdict(res.session)
        self.assertEqual(v, "not checked: 22 blocks to recompute")

    def _wait_kind(self, c, kind, session, timeout=5.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                f = c.inbox.get(timeout=max(0.01, end - time.monotonic()))
            except Exception:
                return None
            if f is None:
                return None
            if f.header.kind == kind and f.header.session == session:
                return f
        return None

    def test_duplicates_and_finished_session(self):
        c = self.client()
        res = c.transfer(EXCLUSIVE, src_blocks=list(range(16)), layer_end=2)
        self.assertVerified(res)
        lane = c.lanes[0]
        # Close of the finished session: CloseAck (9.6)
        lane.send_frame(CLOSE, res.session)
        self.assertIsNotNone(self._wait_kind(c, CLOSE_ACK, res.session))
        # Open of the finished session: Reject (session id reused), lane stays up
        seg = c.served()
        req = OpenRequest(SMALL, SMALL, seg.region, seg.key, EXCLUSIVE, 0, 0, BULK_KV, 0, 2,
                          10_000_000, list(range(16)), list(range(16)))
        lane.send_frame(OPEN, res.session, req.encode())
        f = self._wait_kind(c, REJECT, res.session)
        self.assertIsNotNone(f)
        self.assertIn("already used and closed", f.payload.decode())
        # Data of the finished session: read and discarded, nothing sent, lane up
        data = peer.pattern(c.engine_id, SMALL.extent())[:64 << 10]
        lane.send_frame(DATA, res.session, data, layer=0, block=0, offset=0, sequence=0)
        # Data of an unknown session: also no answer
        lane.send_frame(DATA, res.session + 1000, data, layer=0, block=0, offset=0, sequence=0)
        time.sleep(0.3)
        self.assertFalse(lane.closed.is_set())
        res2 = c.transfer(EXCLUSIVE)
        self.assertVerified(res2)

    def test_duplicate_data_is_reacked_and_duplicate_open_reacked(self):
        c = self.client()
        lane = c.lanes[0]
        seg = c.served()
        sid = c.next_session()
        req = OpenRequest(SMALL, SMALL, seg.region, seg.key, EXCLUSIVE, 0, 0, BULK_KV, 0, 2,
                          10_000_000, list(range(16)), list(range(16)))
        lane.send_frame(OPEN, sid, req.encode())
        self.assertIsNotNone(self._wait_kind(c, OPEN_ACK, sid))
        lane.send_frame(OPEN, sid, req.encode())                # duplicate: OpenAck again
        self.assertIsNotNone(self._wait_kind(c, OPEN_ACK, sid))
        src = peer.pattern(c.engine_id, SMALL.extent())
        units = peer.build_plan(SMALL, SMALL, 0, 2, list(range(16)), list(range(16)), EXCLUSIVE)
        acked = []

        def send(seq, attempt=0):
            u = units[seq]
            a = SMALL.byte_offset(u.layer, u.first, 0)
            lane.send_frame(DATA, sid, src[a:a + u.len], attempt=attempt, layer=u.layer,
                            block=u.first, offset=0, sequence=seq)

        send(0)
        f = self._wait_kind(c, ACK, sid)
        self.assertIsNotNone(f)
        self.assertEqual(peer.decode_ranges(f.payload), [(0, 1)])
        self.assertEqual((f.header.layer, f.header.offset), (0, 0))
        send(0, attempt=1)   # a duplicate of a verified unit is acknowledged again (9.2)
        f = self._wait_kind(c, ACK, sid)
        self.assertIsNotNone(f)
        self.assertEqual(peer.decode_ranges(f.payload), [(0, 1)])
        for s in range(1, len(units)):
            send(s)
        end = time.monotonic() + 10
        got = set()
        while len(got) < len(units) - 1 and time.monotonic() < end:
            f = self._wait_kind(c, ACK, sid, end - time.monotonic())
            if f is None:
                break
            for a, b in peer.decode_ranges(f.payload):
                got.update(range(a, b))
        self.assertEqual(got, set(range(1, len(units))))
        lane.send_frame(CLOSE, sid)
        self.assertIsNotNone(self._wait_kind(c, CLOSE_ACK, sid))
        self.assertTrue(self.srv.verdict(sid).startswith("verified"))
        del acked

    def test_non_fatal_open_refusals_keep_the_lane(self):
        c = self.client()
        lane = c.lanes[0]
        seg = c.served()
        base = dict(dst_layout=SMALL, src_layout=SMALL, dst_region=seg.region, dst_key=seg.key,
                    mode=PACKETIZED, slice_bytes=16 << 10, exclusive_min_bytes=0, klass=BULK_KV,
                    layer_start=0, layer_end=2, deadline_us=10_000_000,
                    src_blocks=list(range(16)), dst_blocks=list(range(16)))
        cases = [
            ("block out of range", dict(dst_blocks=list(range(1, 17))), "invalid block list: "),
            ("block twice", dict(dst_blocks=[0] * 16), "invalid block list: "),
            ("layer_end past the layout", dict(layer_end=3), "invalid block list: "),
            ("slice too small", dict(slice_bytes=255), "cannot cut the transfer into units: "),
            ("layout mismatch", dict(src_layout=Layout.layer_major(2, 16, 32 << 10)), ""),
        ]
        for name, change, text in cases:
            with self.subTest(name):
                sid = c.next_session()
                req = OpenRequest(**dict(base, **change))
                lane.send_frame(OPEN, sid, req.encode())
                f = self._wait_kind(c, REJECT, sid)
                self.assertIsNotNone(f, name)
                self.assertTrue(f.payload.decode().startswith(text), (name, f.payload))
        time.sleep(0.2)
        self.assertFalse(lane.closed.is_set())
        self.assertVerified(c.transfer(PACKETIZED, slice_bytes=32 << 10))

    def test_wrong_key_is_fatal_for_the_lane(self):
        c = self.client()
        seg = c.served()
        res = c.transfer(EXCLUSIVE, key=seg.key ^ 1, region=seg.region, dst_layout=SMALL)
        self.assertFalse(res.opened)
        self.assertIn("wrong access key", res.reject)
        self.assertTrue(c.lanes[0].wait_closed(5))
        texts = [t for s, t in c.lanes[0].rejects() if s == res.session]
        self.assertTrue(texts)
        self.assertTrue(all(t.startswith("lane closed: peer %d sent a refused frame: wrong access key"
                                         % c.engine_id) for t in texts), texts)

    def test_unknown_region_is_fatal(self):
        c = self.client()
        res = c.transfer(EXCLUSIVE, key=1, region=999, dst_layout=SMALL)
        self.assertFalse(res.opened)
        self.assertRegex(res.reject, r"^lane closed: peer %d sent a refused frame: region #999 is "
                                     r"not registered" % c.engine_id)
        self.assertTrue(c.lanes[0].wait_closed(5))

    def test_namespace_and_version_mismatch_are_refused_in_the_handshake(self):
        for kw, text in ((dict(model="other"), "namespace"), (dict(block_size=32), ""),
                         (dict(dtype=peer.F16), "")):
            with self.subTest(kw=kw):
                s = peer.dial(self.srv.addr)
                with self.assertRaises(peer.HandshakeRejected) as e:
                    peer.handshake(s, self.engine(), **kw)
                s.close()
                self.assertIn(text, e.exception.reason)
        s = peer.dial(self.srv.addr)
        peer.send_msg(s, peer.Hello(self.engine(), protocol=5).encode())
        reason = peer.decode_reject_msg(peer.recv_msg(s))
        s.close()
        self.assertIn("protocol version 5/3 is not supported", reason)
        # same engine id as the server
        s = peer.dial(self.srv.addr)
        with self.assertRaises(peer.HandshakeRejected) as e:
            peer.handshake(s, 2)
        s.close()
        self.assertIn("both ends have engine id 2", e.exception.reason)
        # a dialer claiming a secret the server has not got
        s = peer.dial(self.srv.addr)
        with self.assertRaises(peer.HandshakeRejected) as e:
            peer.handshake(s, self.engine(), secret=b"x")
        s.close()
        self.assertIn("the peer requires shared-secret authentication and this node has no "
                      "secret", e.exception.reason)

    def test_lanes_per_peer_and_group_token(self):
        c = self.client(lanes=2)
        # a third lane: refused (--lanes 2)
        with self.assertRaises(peer.HandshakeRejected) as e:
            c.add_lane()
        self.assertIn("already has 2 lanes here", e.exception.reason)
        self.assertVerified(c.transfer(PACKETIZED, slice_bytes=64 << 10))


class SecretConformance(unittest.TestCase):
    """`--secret`: the HMAC handshake of section 11.5."""

    def test_secret_handshake_and_transfer(self):
        with harness.Server("--secret", "s3cret") as srv:
            with peer.Client(srv.addr, 50, want=SMALL, secret=b"s3cret") as c:
                res = c.transfer(EXCLUSIVE)
                self.assertTrue(res.complete)
                v = srv.verdict(res.session)
                self.assertTrue(v and v.startswith("verified"), v)
            s = peer.dial(srv.addr)
            with self.assertRaises((peer.HandshakeRejected, ValueError)) as e:
                peer.handshake(s, 51, secret=b"wrong")
            s.close()
            # the acceptor's MAC (over our transcript) does not verify under our wrong
            # secret, so the dialer refuses it first
            self.assertIn("authentication", str(e.exception))
            # a dialer that goes on regardless: the acceptor refuses its Auth
            s = peer.dial(srv.addr)
            with self.assertRaises(peer.HandshakeRejected) as e:
                peer.handshake(s, 53, secret=b"wrong", verify_acceptor=False)
            s.close()
            self.assertIn("the dialer failed shared-secret authentication", e.exception.reason)
            s = peer.dial(srv.addr)
            with self.assertRaises(peer.HandshakeRejected) as e:
                peer.handshake(s, 52)   # no secret
            s.close()
            self.assertIn("requires shared-secret authentication and the peer has no secret",
                          e.exception.reason)
            # a recorded handshake replayed: the dialer's Hello and Auth, sent again on a new
            # connection, do not verify, since the acceptor's nonce is fresh (11.5)
            s = peer.dial(srv.addr)
            mine = peer.Hello(55, authenticated=True)
            hello_body = mine.encode()
            peer.send_msg(s, hello_body)
            challenge = peer.recv_msg(s)
            auth = peer.encode_auth(peer.auth_mac(b"s3cret", "dialer", hello_body, challenge))
            peer.send_msg(s, auth)
            self.assertNotEqual(peer.recv_msg(s)[0], peer.HS_REJECT)
            s2 = peer.dial(srv.addr)
            peer.send_msg(s2, hello_body)
            peer.recv_msg(s2)
            peer.send_msg(s2, auth)
            answer = peer.recv_msg(s2)
            self.assertEqual(answer[0], peer.HS_REJECT)
            self.assertIn("the dialer failed shared-secret authentication",
                          peer.decode_reject_msg(answer))
            s.close()
            s2.close()
            # and the honest client still transfers
            with peer.Client(srv.addr, 54, want=SMALL, secret=b"s3cret") as c:
                res = c.transfer(PACKETIZED, slice_bytes=64 << 10)
                self.assertTrue(res.complete)
                self.assertTrue(srv.verdict(res.session).startswith("verified"))


if __name__ == "__main__":
    unittest.main()
