"""What a hostile client would try against `te-bench serve` (PROTOCOL.md sections 10-12), continued:
session takeover, half-open handshakes, idle lanes and garbage, each with an honest peer beside it.

Each test starts its own server (`te-bench serve --verify`, port 0).
"""

import os
import struct
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peer  # noqa: E402
from attack_case import SMALL, AttackCase, read_frames  # noqa: E402
from peer import (CLOSE, CLOSE_ACK, DATA, EXCLUSIVE, OPEN, PACKETIZED, REJECT,  # noqa: E402
                  OpenRequest)


class SessionTakeover(AttackCase):
    """(c) Another connection claiming an honest client's engine id, or its session id."""

    def test_takeover_is_refused_and_session_unaffected(self):
        c = peer.Client(self.srv.addr, 77, want=SMALL)
        self.addCleanup(c.close)
        sid = c.next_session()
        out = {}
        th = threading.Thread(target=lambda: out.update(res=c.transfer(
            PACKETIZED, slice_bytes=16 << 10, coalesce_bytes=0, session=sid, pause=(40, 1.5))))
        th.start()
        time.sleep(0.5)
        # 1. the same engine id from a new connection group: refused at the handshake (11.6)
        s = peer.dial(self.srv.addr)
        self.addCleanup(s.close)
        with self.assertRaises(peer.HandshakeRejected) as e:
            peer.handshake(s, 77, want=SMALL)
        self.assertIn("engine 77 is already connected here from another connection group",
                      e.exception.reason)
        # ... also with a made-up token
        s = peer.dial(self.srv.addr)
        self.addCleanup(s.close)
        with self.assertRaises(peer.HandshakeRejected) as e:
            peer.handshake(s, 77, token=os.urandom(16))
        self.assertIn("another connection group", e.exception.reason)
        # 2. another engine id naming the session: an unknown session (keyed by peer), not
        #    answered, not fatal (6.1, 10)
        att, welcome = self.raw_lane(78, want=SMALL)
        seg = welcome.segments[0]
        garbage = b"\xee" * (16 << 10)
        att.sendall(peer.frame(DATA, sid, garbage, layer=0, block=0, offset=0, sequence=0))
        att.sendall(peer.frame(DATA, sid, garbage, layer=1, block=15, offset=48 << 10,
                               sequence=127))
        att.sendall(peer.frame(CLOSE, sid))
        # an Open with the victim's live session id: check 1 of 9.1, not fatal
        victim = c.served()
        req = OpenRequest(SMALL, SMALL, victim.region, victim.key, EXCLUSIVE, 0, 0, peer.BULK_KV,
                          0, 2, 10_000_000, list(range(16)), list(range(16)))
        att.sendall(peer.frame(OPEN, sid, req.encode()))
        frames, how = read_frames(att, 1.0)
        self.assertEqual(how, "timeout")
        rejects = [(h.session, p.decode()) for h, p in frames if h.kind == REJECT]
        self.assertEqual(rejects, [(sid, "session %#x is already open "
                                         "here from peer 77: session ids are unique per engine"
                                    % sid)], frames)
        # an Open of its own into the victim's region, even with its key: NotOwner, fatal
        own = (78 << 32) | 1
        att.sendall(peer.frame(OPEN, own, req.encode()))
        frames, how = read_frames(att, 5)
        rejects = [(h.session, p.decode()) for h, p in frames if h.kind == REJECT]
        self.assertEqual(len(rejects), 1, frames)
        self.assertEqual(rejects[0][0], own)
        self.assertIn("region #%d belongs to another peer" % victim.region, rejects[0][1])
        self.assertTrue(rejects[0][1].startswith("lane closed: peer 78 sent a refused frame"))
        self.assertIn(how, ("eof", "reset"))
        self.assertNotEqual(seg.region, victim.region)
        th.join(20)
        res = out["res"]
        self.assertTrue(res.complete, res)
        v = self.srv.verdict(sid)
        self.assertTrue(v and v.startswith("verified"), v)
        self.assertIsNone(self.srv.wait_for(r"session %#x ended early" % sid, 0.1))

    def test_claim_after_lanes_down_cannot_write_or_close(self):
        """With the victim's lanes down, a new group ends its sessions; it cannot use them."""
        c = peer.Client(self.srv.addr, 79, want=SMALL)
        res = c.transfer(EXCLUSIVE, stop_after_units=8)
        sid = res.session
        victim = c.served()
        c.close()
        time.sleep(0.3)
        s, welcome = self.raw_lane(79, want=SMALL)   # a new group for engine 79
        v = self.srv.verdict(sid, 5)
        self.assertTrue(v and v.startswith("not checked"), v)
        self.assertIsNotNone(self.srv.wait_for(r"session %#x ended early" % sid, 5))
        # same layout asked again by "engine 79", but as a new connection group: a fresh region, not
        # the victim's (11.7: the earlier group's regions are freed with its sessions)
        seg = welcome.segments[0]
        self.assertNotEqual((seg.region, seg.key), (victim.region, victim.key))
        # Data is discarded, Close answered with CloseAck, an Open with the id refused (9.6)
        s.sendall(peer.frame(DATA, sid, b"\xee" * (64 << 10), layer=0, block=8, sequence=8))
        s.sendall(peer.frame(CLOSE, sid))
        req = OpenRequest(SMALL, SMALL, seg.region, seg.key, EXCLUSIVE, 0, 0, peer.BULK_KV, 0, 2,
                          10_000_000, list(range(16)), list(range(16)))
        s.sendall(peer.frame(OPEN, sid, req.encode()))
        frames, how = read_frames(s, 1.0)
        kinds = [(h.kind, h.session) for h, p in frames]
        self.assertIn((CLOSE_ACK, sid), kinds)
        rej = [p.decode() for h, p in frames if h.kind == REJECT]
        self.assertTrue(rej and "already used and closed" in rej[0], frames)
        self.assertEqual(how, "timeout")   # the lane stays up
        s.close()
        # being "engine 79" now, the claimant writes only into a region of its own, never the victim's
        time.sleep(0.3)
        with peer.Client(self.srv.addr, 79, want=SMALL) as claimant:
            self.assertNotEqual(claimant.served().region, victim.region)
            res = claimant.transfer(EXCLUSIVE)
            self.assertTrue(res.complete)
            self.assertTrue(self.srv.verdict(res.session).startswith("verified"))
        self.honest(80)


class HalfOpenHandshakes(AttackCase):
    """(d) 100 connections that never send a byte."""

    def test_silent_connections_do_not_delay_an_honest_handshake(self):
        silent = []
        for _ in range(100):
            s = peer.dial(self.srv.addr)
            self.addCleanup(s.close)
            silent.append(s)
        time.sleep(0.2)
        t0 = time.monotonic()
        s = peer.dial(self.srv.addr)
        self.addCleanup(s.close)
        peer.handshake(s, 90, want=SMALL)
        took = time.monotonic() - t0
        self.assertLess(took, 1.0, "handshake took %.2f s beside 100 silent connections" % took)
        s.close()
        self.honest(91)
        # each silent connection is refused after handshake_timeout (5 s) with a Reject
        for k in (0, 50, 99):
            silent[k].settimeout(10)
            reason = peer.decode_reject_msg(peer.recv_msg(silent[k]))
            self.assertIn("no handshake within", reason)
        self.assertGreater(time.monotonic() - t0, 3.5)

    def test_stalled_hello_is_refused(self):
        """A Hello that stops midway is refused with a reason when the handshake times out (11.3a)."""
        s = peer.dial(self.srv.addr)
        self.addCleanup(s.close)
        body = peer.Hello(92).encode()
        s.sendall(struct.pack("<I", len(body)) + body[:10])
        t0 = time.monotonic()
        s.settimeout(10)
        reason = peer.decode_reject_msg(peer.recv_msg(s))
        self.assertIn("no handshake within", reason)
        self.assertTrue(4 < time.monotonic() - t0 < 8)

    def test_half_open_handshakes_of_the_clients_own_address_do_not_delay_it(self):
        """100 connections from the honest client's own address, half stopping mid-Hello and half
        after a whole Hello (never sending Auth): none holds a handshake turn while it waits (11.3a)."""
        held = []
        for k in range(100):
            s = peer.dial(self.srv.addr)
            self.addCleanup(s.close)
            held.append(s)
            body = peer.Hello(500 + k).encode()
            msg = struct.pack("<I", len(body)) + body
            s.sendall(msg[:5] if k % 2 else msg)
        time.sleep(0.3)
        t0 = time.monotonic()
        s = peer.dial(self.srv.addr)
        self.addCleanup(s.close)
        peer.handshake(s, 93, want=SMALL)
        took = time.monotonic() - t0
        self.assertLess(took, 1.0, "handshake took %.2f s beside 100 half-open ones" % took)


class IdleLane(AttackCase):
    """(e) A lane that says nothing after Welcome."""

    def test_idle_lane_is_not_closed_early(self):
        """Waiting between frames is not a stall (12.2): 2 s of silence keeps the lane."""
        s, _ = self.raw_lane(96)
        frames, how = read_frames(s, 2.0)
        self.assertEqual((frames, how), ([], "timeout"))
        s.sendall(peer.frame(CLOSE, 12345))   # unknown session: counted, lane stays
        frames, how = read_frames(s, 0.5)
        self.assertEqual((frames, how), ([], "timeout"))


class IdleLaneClosed(AttackCase):
    """(e) A lane idle past the configured time (12.2 inbound_idle_timeout; `--idle-ms`) is closed."""
    extra_args = ("--idle-ms", "1500")

    def test_idle_lane_is_closed_after_inbound_idle_timeout(self):
        s, _ = self.raw_lane(95)
        t0 = time.monotonic()
        frames, how = read_frames(s, 15)
        took = time.monotonic() - t0
        self.assertEqual(frames, [])
        self.assertIn(how, ("eof", "reset"))
        self.assertTrue(1.2 < took < 8, took)
        # an honest client is served as before
        self.honest(97)


class Garbage(AttackCase):
    """(f) Malformed handshakes and headers."""

    def first_message(self, data):
        s = peer.dial(self.srv.addr)
        self.addCleanup(s.close)
        s.sendall(data)
        s.settimeout(5)
        return peer.decode_reject_msg(peer.recv_msg(s))

    def test_garbage_handshakes_are_answered_with_reject(self):
        self.assertIn("larger than 65536",
                      self.first_message(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
        self.assertIn("unexpected Auth message during the handshake",
                      self.first_message(struct.pack("<I", 33) + peer.encode_auth(bytes(32))))
        h = peer.Hello(70)
        h.magic = b"XXXXXXXX"
        body = h.encode()
        self.assertIn("the peer does not speak the KV transfer lane protocol (bad magic)",
                      self.first_message(struct.pack("<I", len(body)) + body))
        body = peer.Hello(71).encode() + b"\x00"
        self.assertIn("unexpected bytes", self.first_message(struct.pack("<I", len(body)) + body))
        self.assertIn("unknown", self.first_message(struct.pack("<I", 4) + b"\x09abc"))
        self.honest(72)

    def test_bad_headers_get_reject_on_session_0_and_close(self):
        cases = [
            ("bad magic", b"\x00" * 48, "not a KV transfer frame (magic 0x0000)"),
            ("version", peer.encode_header(CLOSE, 5, version=2), "version 2 is not supported"),
            ("hcrc", peer.encode_header(CLOSE, 5, hcrc=0), "header checksum mismatch"),
            ("kind 0", peer.encode_header(0, 5), "unknown frame kind 0"),
            ("kind 10", peer.encode_header(10, 5), "unknown frame kind 10"),
            ("reserved", peer.encode_header(CLOSE, 5, reserved=1), "reserved header bytes"),
            ("oversized close", peer.encode_header(CLOSE, 5, length=1), "exceeds the limit of 0"),
            ("oversized data", peer.encode_header(DATA, 5, length=(1 << 30) + 1),
             "exceeds the limit of 1073741824"),
            ("oversized open", peer.encode_header(OPEN, 5, length=(4 << 20) + 1),
             "exceeds the limit of 4194304"),
        ]
        for k, (name, data, text) in enumerate(cases):
            with self.subTest(name):
                s, _ = self.raw_lane(200 + k)
                s.sendall(data)
                frames, how = read_frames(s, 5)
                self.assertIn(how, ("eof", "reset"), name)
                self.assertEqual(len(frames), 1, frames)
                h, p = frames[0]
                self.assertEqual((h.kind, h.session), (REJECT, 0))
                self.assertTrue(p.decode().startswith(
                    "lane closed: peer %d sent a refused frame: " % (200 + k)), p)
                self.assertIn(text, p.decode())
        self.honest(73)

    def test_bad_control_payloads_get_reject_on_their_session(self):
        cases = [
            ("empty payload, crc 1", peer.frame(CLOSE, 5, crc=1), "control payload checksum"),
            ("ack crc", peer.frame(peer.ACK, 6, peer.encode_ranges([(0, 1)]), crc=1),
             "control payload checksum"),
            ("malformed open", peer.frame(OPEN, 7, b"xx"), "malformed open payload"),
        ]
        for k, (name, data, text) in enumerate(cases):
            with self.subTest(name):
                s, _ = self.raw_lane(300 + k)
                s.sendall(data)
                frames, how = read_frames(s, 5)
                self.assertIn(how, ("eof", "reset"))
                self.assertEqual(len(frames), 1, frames)
                h, p = frames[0]
                self.assertEqual(h.kind, REJECT)
                self.assertEqual(h.session, peer.decode_header(data[:48]).session)
                self.assertIn(text, p.decode())
        # a malformed ack of an unknown session: not even decoded, lane stays (10)
        s, _ = self.raw_lane(310)
        s.sendall(peer.frame(peer.ACK, 8, b"xx"))
        frames, how = read_frames(s, 1.0)
        self.assertEqual((frames, how), ([], "timeout"))
        self.honest(74)

    def test_data_that_does_not_fit_the_plan_is_fatal(self):
        with peer.Client(self.srv.addr, 320, want=SMALL) as c:
            res = c.transfer(EXCLUSIVE, stop_after_units=1)
            lane = c.lanes[0]
            src = peer.pattern(320, SMALL.extent())
            # unit 1 is layer 0 block 1; claim block 2
            lane.send_frame(DATA, res.session, src[:64 << 10], layer=0, block=2, sequence=1)
            self.assertTrue(lane.wait_closed(5))
            rej = [t for s, t in lane.rejects() if s == res.session]
            self.assertEqual(len(rej), 1, lane.rejects())
            self.assertIn("frame does not fit session %#x" % res.session, rej[0])
        with peer.Client(self.srv.addr, 321, want=SMALL) as c:
            res = c.transfer(EXCLUSIVE, stop_after_units=1)
            c.lanes[0].send_frame(DATA, res.session, b"x" * 256, layer=0, block=0, sequence=10 ** 6)
            self.assertTrue(c.lanes[0].wait_closed(5))
            self.assertTrue(any("frame does not fit" in t for s, t in c.lanes[0].rejects()))
        self.honest(75)


if __name__ == "__main__":
    unittest.main()
