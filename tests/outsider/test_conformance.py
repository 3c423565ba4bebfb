"""Conformance of the outsider peer (peer.py) with docs/PROTOCOL.md and with `te-bench serve`.

Run: python3 -m unittest discover -s tests/outsider -v   (or pytest tests/outsider)
The server binary comes from $TE_BENCH (default <repo>/target/debug/te-bench).
"""

import os
import re
import socket
import struct
import sys
import time
import unittest
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
import peer  # noqa: E402
from peer import (ACK, BULK_KV, CLOSE, CLOSE_ACK, DATA, EXCLUSIVE, NACK, OPEN, OPEN_ACK,  # noqa: E402
                  PACKETIZED, PROGRESS, REJECT, AUTO, Layout, OpenRequest)

DOC = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"

# A small served region: 2 layers x 16 blocks x 64 KiB = 2 MiB.
SMALL = Layout.layer_major(2, 16, 64 << 10)


# --------------------------------------------------------------------------- reading the document


def doc_section(title_prefix):
    """The text of the section whose heading starts with title_prefix, up to the next heading."""
    out, inside = [], False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            if inside:
                break
            inside = line.lstrip("#").strip().startswith(title_prefix)
            continue
        if inside:
            out.append(line)
    if not out:
        raise AssertionError("section %r not found in %s" % (title_prefix, DOC))
    return "\n".join(out)


def doc_dumps(title_prefix):
    """The hex dumps (```text blocks) of a section, as bytes, in order."""
    sec = doc_section(title_prefix)
    dumps = []
    for block in re.findall(r"```text\n(.*?)```", sec, re.S):
        data = bytearray()
        expect = 0
        for line in block.splitlines():
            m = re.match(r"^([0-9a-f]{2}):\s(.*)$", line)
            if not m:
                continue
            addr = int(m.group(1), 16)
            assert addr == expect, "dump line %r at %#x, expected %#x" % (line, addr, expect)
            hexpart = re.split(r"\s{3,}", m.group(2).strip())[0]
            bs = bytes(int(t, 16) for t in hexpart.split())
            data += bs
            expect += len(bs)
        dumps.append(bytes(data))
    return dumps


def doc_hex_after(sec, words):
    m = re.search(words + r"[\s=`]*0x([0-9A-Fa-f]+)", sec, re.S)
    assert m, "no %r in section" % words
    return int(m.group(1), 16)


def example_request():
    """The transfer of section 14.1."""
    lay = Layout.layer_major(2, 8, 4096, 16, peer.BF16)
    return OpenRequest(lay, lay, 1, 0x1122334455667788, PACKETIZED, 1024, 0, BULK_KV, 0, 2,
                       10_000_000, [0, 1], [5, 6])


SESSION = 0x0000000100000002


class DocumentExamples(unittest.TestCase):
    """Section 14 and the other values the document states, against this encoder."""

    def test_crc32c_check_values(self):
        self.assertEqual(peer.crc32c(b"123456789"), 0xE3069283)
        self.assertEqual(peer.crc32c(b""), 0)
        # chaining equals one pass
        self.assertEqual(peer.crc32c(b"6789", peer.crc32c(b"12345")), 0xE3069283)

    def test_open_example(self):
        sec = doc_section("14.2")
        payload_doc, header_doc = doc_dumps("14.2")
        req = example_request()
        payload = req.encode()
        self.assertEqual(len(payload), 202)
        self.assertEqual(payload, payload_doc)
        self.assertEqual(peer.crc32c(payload), doc_hex_after(sec, r"CRC-32C"))
        hdr = peer.frame(OPEN, SESSION, payload)[:48]
        self.assertEqual(hdr, header_doc)
        self.assertEqual(struct.unpack_from("<I", hdr, 44)[0], doc_hex_after(sec, r"hcrc"))
        # and the codecs round-trip
        back = OpenRequest.decode(payload_doc)
        self.assertEqual(back, req)
        h = peer.decode_header(header_doc)
        self.assertEqual((h.kind, h.session, h.length, h.crc), (OPEN, SESSION, 202, 0x4AAD1FE4))

    def test_plan_example(self):
        req = example_request()
        units = peer.build_plan(req.src_layout, req.dst_layout, 0, 2, req.src_blocks,
                                req.dst_blocks, PACKETIZED, 1024)
        self.assertEqual(len(units), 16)
        got = [(u.layer, req.dst_blocks[u.first], u.offset, u.len) for u in units]
        want = [(l, b, o, 1024) for l in (0, 1) for b in (5, 6) for o in (0, 1024, 2048, 3072)]
        self.assertEqual(got, want)
        # the table in 14.1 says the same
        table = re.findall(r"^\| (\d+)–(\d+) \| (\d) \| (\d) \| ([\d, ]+) \| (\d+) \|$",
                           doc_section("14.1"), re.M)
        self.assertEqual(len(table), 4)
        for a, b, layer, block, offs, length in table:
            for k, seq in enumerate(range(int(a), int(b) + 1)):
                self.assertEqual(got[seq], (int(layer), int(block),
                                            [int(x) for x in offs.split(",")][k], int(length)))

    def test_data_example(self):
        sec = doc_section("14.3")
        (header_doc,) = doc_dumps("14.3")
        req = example_request()
        units = peer.build_plan(req.src_layout, req.dst_layout, 0, 2, req.src_blocks,
                                req.dst_blocks, PACKETIZED, 1024)
        u = units[9]
        payload = bytes([7]) * 1024
        self.assertEqual(peer.crc32c(payload), 0x7F689E92)
        hdr = peer.encode_header(DATA, SESSION, 0, u.layer, req.dst_blocks[u.first], u.offset,
                                 u.len, 9, peer.crc32c(payload))
        self.assertEqual(hdr, header_doc)
        self.assertEqual(struct.unpack_from("<I", hdr, 44)[0], doc_hex_after(sec, r"hcrc"))
        where = req.dst_layout.byte_offset(u.layer, req.dst_blocks[u.first], u.offset)
        self.assertEqual(where, int(re.search(r"= (\d+)` of region", sec).group(1)))

    def test_ack_nack_progress_close_examples(self):
        sec = doc_section("14.4")
        ack_payload, ack_hdr, nack, progress, close = doc_dumps("14.4")
        payload = peer.encode_ranges([(0, 4), (5, 10)])
        self.assertEqual(payload, ack_payload)
        self.assertEqual(peer.crc32c(payload), doc_hex_after(sec, r"CRC-32C"))
        self.assertEqual(peer.frame(ACK, SESSION, payload, layer=0, offset=0)[:48], ack_hdr)
        self.assertEqual(peer.encode_header(NACK, SESSION, attempt=0, sequence=9), nack)
        self.assertEqual(peer.encode_header(PROGRESS, SESSION, layer=1, offset=1), progress)
        self.assertEqual(peer.encode_header(CLOSE, SESSION), close)
        self.assertEqual(peer.decode_ranges(ack_payload), [(0, 4), (5, 10)])

    def test_pattern_example(self):
        sec = doc_section("15.")
        m = re.search(r"offset 0 begins\s+`([0-9a-f ]+)`.*?offset 1048576 begins\s+`([0-9a-f ]+)`",
                      sec, re.S)
        self.assertIsNotNone(m)
        p = peer.pattern(7, (1 << 20) + 64)
        first, second = (bytes(int(t, 16) for t in g.split()) for g in m.groups())
        self.assertEqual(p[:len(first)], first)
        self.assertEqual(p[1 << 20:(1 << 20) + len(second)], second)

    def test_header_decode_order(self):
        good = peer.encode_header(DATA, 1, length=8, crc=5)
        bad = bytearray(good)
        bad[0] = 0
        with self.assertRaises(peer.WireError) as e:
            peer.decode_header(bytes(bad))
        self.assertEqual(e.exception.what, "BadMagic")
        bad = bytearray(good)
        bad[2] = 4   # version flipped: reported as a version, not a checksum failure (note, 2.1)
        with self.assertRaises(peer.WireError) as e:
            peer.decode_header(bytes(bad))
        self.assertEqual(e.exception.what, "UnsupportedVersion")
        for raw, what in (({"kind": 10}, "UnknownKind"), ({"reserved": 1}, "Reserved")):
            with self.assertRaises(peer.WireError) as e:
                peer.decode_header(peer.encode_header(raw.pop("kind", DATA), 1, **raw))
            self.assertEqual(e.exception.what, what)
        with self.assertRaises(peer.WireError) as e:
            peer.decode_header(peer.encode_header(CLOSE, 1, length=1))
        self.assertEqual(e.exception.what, "Oversized")
        with self.assertRaises(peer.WireError) as e:
            peer.decode_header(peer.encode_header(DATA, 1, hcrc=1))
        self.assertEqual(e.exception.what, "HeaderChecksum")

    def test_handshake_codecs_round_trip(self):
        h = peer.Hello(77, listen="127.0.0.1:9", want=SMALL, token=b"t" * 16)
        body = h.encode()
        self.assertEqual(len(body), 99 + len("default") + len("127.0.0.1:9") + 70)
        self.assertEqual(peer.Hello.decode(body), h)
        w = peer.Welcome(b"x" * 16, [peer.Segment("served", 1, 2, 3, SMALL),
                                     peer.Segment("n", 4, 5, 6, None)])
        self.assertEqual(peer.Welcome.decode(w.encode()), w)

    def test_auto_plan_rules(self):
        lay = Layout.layer_major(1, 16, 64 << 10)
        blocks = [0, 1, 2, 3, 4, 5, 6, 7, 9, 8, 10, 11, 12, 13, 14, 15]
        units = peer.build_plan(lay, lay, 0, 1, blocks, blocks, AUTO, 16 << 10, 256 << 10)
        # run 0..8 (8 blocks, 512 KiB) exclusive, merged up to 1 MiB; 9 alone and 8 then a
        # run of 6 (10..16: 384 KiB >= 256 KiB) ... but [8, 10] is not contiguous.
        excl = [(u.first, u.blocks) for u in units if u.exclusive]
        self.assertEqual(excl[0], (0, 8))
        sliced_firsts = sorted({u.first for u in units if not u.exclusive})
        self.assertEqual(sliced_firsts, [8, 9])
        self.assertIn((10, 6), excl)
        # exclusive_min 0: every block exclusive; small blocks merge up to 1 MiB
        lay = Layout.layer_major(1, 384, 4096)
        units = peer.build_plan(lay, lay, 0, 1, list(range(384)), list(range(384)), AUTO, 1024, 0)
        self.assertEqual([(u.first, u.blocks, u.len) for u in units],
                         [(0, 256, 1 << 20), (256, 128, 128 * 4096)])


# --------------------------------------------------------------------------- against the server


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
            ("block out of range", dict(dst_blocks=list(range(1, 17))), "invalid transfer request"),
            ("block twice", dict(dst_blocks=[0] * 16), "invalid transfer request"),
            ("layer_end past the layout", dict(layer_end=3), "invalid transfer request"),
            ("slice too small", dict(slice_bytes=255), "invalid transfer request"),
            ("layout mismatch", dict(src_layout=Layout.layer_major(2, 16, 32 << 10)), ""),
        ]
        for name, change, text in cases:
            with self.subTest(name):
                sid = c.next_session()
                req = OpenRequest(**dict(base, **change))
                lane.send_frame(OPEN, sid, req.encode())
                f = self._wait_kind(c, REJECT, sid)
                self.assertIsNotNone(f, name)
                self.assertIn(text, f.payload.decode())
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
            # and the honest client still transfers
            with peer.Client(srv.addr, 54, want=SMALL, secret=b"s3cret") as c:
                res = c.transfer(PACKETIZED, slice_bytes=64 << 10)
                self.assertTrue(res.complete)
                self.assertTrue(srv.verdict(res.session).startswith("verified"))


if __name__ == "__main__":
    unittest.main()
