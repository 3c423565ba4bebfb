"""A lane (socket + reader thread) and a sending client (PROTOCOL.md sections 8, 12)."""

import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from handshake import ZERO16, dial, handshake, recv_exact
from plan import build_plan, pattern
from wire import (ACK, BULK_KV, CLOSE, CLOSE_ACK, DATA, EXCLUSIVE, HEADER_LEN,
                  MAX_COALESCED_SLICES, NACK, OPEN, OPEN_ACK, PACKETIZED, PROGRESS, REJECT,
                  Header, OpenRequest, WireError, crc32c, decode_header, decode_ranges,
                  encode_header, frame)

# --------------------------------------------------------------------------- lanes


@dataclass
class Frame:
    header: Header
    payload: bytes
    lane: "Lane"
    at: float


class Lane:
    """One TCP connection after its Welcome: a reader thread puts every frame on `inbox`."""

    def __init__(self, sock, inbox=None, name="lane"):
        self.sock = sock
        self.sock.settimeout(None)
        self.inbox = inbox if inbox is not None else queue.Queue()
        self.name = name
        self.wlock = threading.Lock()
        self.closed = threading.Event()
        self.close_reason = None  # "eof", "reset", or a decode error
        self.frames: List[Frame] = []
        self._t = threading.Thread(target=self._read, daemon=True, name=name)
        self._t.start()

    def _read(self):
        try:
            while True:
                try:
                    hb = recv_exact(self.sock, HEADER_LEN)
                except ConnectionError as e:
                    self.close_reason = "eof" if "EOF after 0 " in str(e) else "eof mid-frame"
                    return
                h = decode_header(hb)
                payload = recv_exact(self.sock, h.length) if h.length else b""
                f = Frame(h, payload, self, time.monotonic())
                self.frames.append(f)
                self.inbox.put(f)
        except (ConnectionResetError, BrokenPipeError):
            self.close_reason = "reset"
        except OSError as e:
            self.close_reason = "oserror: %s" % e
        except WireError as e:
            self.close_reason = "bad frame from server: %s" % e
        finally:
            self.closed.set()
            self.inbox.put(None)

    def send(self, data):
        with self.wlock:
            self.sock.sendall(data)

    def send_frame(self, kind, session=0, payload=b"", **fields):
        self.send(frame(kind, session, payload, **fields))

    def rejects(self):
        return [(f.header.session, f.payload.decode("utf-8", "replace"))
                for f in self.frames if f.header.kind == REJECT]

    def wait_closed(self, timeout):
        return self.closed.wait(timeout)

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# --------------------------------------------------------------------------- the client


@dataclass
class TransferResult:
    session: int
    opened: bool = False
    reject: Optional[str] = None
    acked: int = 0
    units: int = 0
    nacks: int = 0
    resends: int = 0
    frames_sent: int = 0
    close_acked: bool = False
    given_up: int = 0
    elapsed: float = 0.0
    progress: List[Tuple[int, int]] = field(default_factory=list)
    other_rejects: List[str] = field(default_factory=list)

    @property
    def complete(self):
        return self.opened and self.acked == self.units and self.close_acked


class Client:
    """A sending engine with one or more lanes to one te-bench serve node."""

    def __init__(self, addr, engine_id, want=None, lanes=1, secret=None, source_ip=None,
                 counter=None):
        self.addr, self.engine_id, self.want, self.secret = addr, engine_id, want, secret
        self.source_ip = source_ip
        self.inbox = queue.Queue()
        self.lanes: List[Lane] = []
        self.token = ZERO16
        self.welcome = None
        self.server_hello = None
        self.counter = counter if counter is not None else int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        self.source: Optional[bytes] = None
        for _ in range(lanes):
            self.add_lane()

    def add_lane(self):
        s = dial(self.addr, source_ip=self.source_ip)
        try:
            hello, welcome = handshake(s, self.engine_id, self.want, self.token, self.secret)
        except BaseException:
            s.close()
            raise
        self.server_hello = hello
        self.token = welcome.token
        if self.welcome is None:
            self.welcome = welcome
        lane = Lane(s, self.inbox, "lane-%d-%d" % (self.engine_id, len(self.lanes)))
        self.lanes.append(lane)
        return lane

    def served(self):
        for s in self.welcome.segments:
            if s.name == "served":
                return s
        raise LookupError("no served segment in %r" % (self.welcome,))

    def next_session(self):
        self.counter = (self.counter + 1) & 0xFFFFFFFF
        return (self.engine_id << 32) | self.counter

    def close(self):
        for lane in self.lanes:
            lane.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------- transfer
    def transfer(self, mode=PACKETIZED, slice_bytes=64 << 10, exclusive_min_bytes=0,
                 src_blocks=None, dst_blocks=None, layer_start=0, layer_end=None, seed=None,
                 corrupt=(), coalesce_bytes=512 << 10, window=64 << 20, deadline_s=10.0,
                 timeout=30.0, rto=0.5, max_retries=8, klass=BULK_KV, session=None,
                 stop_after_units=None, pause=None, src_layout=None, dst_layout=None,
                 region=None, key=None, send_close=True):
        """Send the whole served region (by default) filled with the seed's pattern.

        corrupt: unit indices whose first transmission carries damaged bytes (the receiver
        must Nack them). stop_after_units: stop sending new units after this many (returns
        without Close). pause: (units, seconds) sleep once after sending that many units.
        """
        seg = self.served() if region is None else None
        dst = dst_layout or (seg.layout if seg else None)
        src = src_layout or dst
        region = region if region is not None else seg.region
        key = key if key is not None else seg.key
        seed = self.engine_id if seed is None else seed
        nblk = dst.blocks_per_layer
        src_blocks = list(range(nblk)) if src_blocks is None else list(src_blocks)
        dst_blocks = list(src_blocks) if dst_blocks is None else list(dst_blocks)
        layer_end = dst.layers if layer_end is None else layer_end
        if mode == EXCLUSIVE:
            slice_bytes, exclusive_min_bytes = 0, 0
        elif mode == PACKETIZED:
            exclusive_min_bytes = 0
        units = build_plan(src, dst, layer_start, layer_end, src_blocks, dst_blocks, mode,
                           slice_bytes, exclusive_min_bytes)
        srcmem = pattern(seed, src.extent())
        cuts = {lay.first_len for lay in (src, dst) if lay.first_len}
        sid = self.next_session() if session is None else session
        req = OpenRequest(dst, src, region, key, mode, slice_bytes, exclusive_min_bytes, klass,
                          layer_start, layer_end, int(deadline_s * 1e6), src_blocks, dst_blocks)
        res = TransferResult(sid, units=len(units))
        t0 = time.monotonic()
        end_by = t0 + timeout
        open_frame = frame(OPEN, sid, req.encode())

        def payload_of(u, count=1, first=None):
            idx = first
            out = []
            for k in range(count):
                uu = units[idx + k]
                a = src.byte_offset(uu.layer, src_blocks[uu.first], uu.offset)
                out.append(srcmem[a:a + uu.len])
            return b"".join(out)

        state = ["new"] * len(units)   # new, flight, acked, failed
        attempt = [0] * len(units)
        sent_at = [0.0] * len(units)
        tries = [0] * len(units)
        group_of: Dict[int, Tuple[int, ...]] = {}
        resend_q: List[int] = []
        unacked = 0
        lane_rr = [0]

        def pick_lane():
            live = [ln for ln in self.lanes if not ln.closed.is_set()]
            if not live:
                raise ConnectionError("every lane to the server is closed")
            lane_rr[0] += 1
            return live[lane_rr[0] % len(live)]

        def send_data(seqs, att):
            u = units[seqs[0]]
            data = payload_of(u, len(seqs), seqs[0])
            crc = crc32c(data)
            if att == 0 and any(s in corrupt for s in seqs):
                data = bytes([data[0] ^ 0xFF]) + data[1:]   # damaged in transit; crc is the true one
            hdr = encode_header(DATA, sid, attempt=att, layer=u.layer, block=dst_blocks[u.first],
                                offset=u.offset, length=len(data), sequence=seqs[0], crc=crc)
            pick_lane().send(hdr + data)
            res.frames_sent += 1
            now = time.monotonic()
            for s in seqs:
                state[s] = "flight"
                attempt[s] = att
                sent_at[s] = now
                tries[s] += 1
                group_of[s] = tuple(seqs)

        def handle(f):
            nonlocal unacked
            h = f.header
            if h.session != sid:
                if h.kind == REJECT:
                    res.other_rejects.append(f.payload.decode("utf-8", "replace"))
                return None
            if h.kind == OPEN_ACK:
                return "openack"
            if h.kind == REJECT:
                if not res.opened:
                    res.reject = f.payload.decode("utf-8", "replace")
                    return "reject"
                res.other_rejects.append(f.payload.decode("utf-8", "replace"))
            elif h.kind == ACK:
                res.progress.append((h.layer, h.offset))
                for a, b in decode_ranges(f.payload):
                    if b > len(units):
                        raise AssertionError("ack past the plan: %d..%d" % (a, b))
                    for s in range(a, b):
                        if state[s] in ("flight", "queued"):
                            state[s] = "acked"
                            res.acked += 1
                            unacked -= units[s].len
                        elif state[s] == "new":
                            raise AssertionError("ack of unit %d never sent" % s)
            elif h.kind == NACK:
                res.nacks += 1
                s = h.sequence
                if s < len(units) and state[s] == "flight" and attempt[s] == h.attempt:
                    if tries[s] > max_retries:
                        state[s] = "failed"
                        res.given_up += 1
                        unacked -= units[s].len
                    else:
                        resend_q.append(s)
                        state[s] = "queued"
            elif h.kind == PROGRESS:
                res.progress.append((h.layer, h.offset))
            elif h.kind == CLOSE_ACK:
                return "closeack"
            return None

        def pump(wait):
            """Handle queued frames; block up to `wait` seconds for the first."""
            out = []
            try:
                f = self.inbox.get(timeout=wait) if wait > 0 else self.inbox.get_nowait()
            except queue.Empty:
                return out
            while True:
                if f is None:
                    if not out and all(ln.closed.is_set() for ln in self.lanes):
                        raise ConnectionError("every lane to the server closed: %s" %
                                              [ln.close_reason for ln in self.lanes])
                else:
                    r = handle(f)
                    if r:
                        out.append(r)
                try:
                    f = self.inbox.get_nowait()
                except queue.Empty:
                    return out

        # -- open
        pick_lane().send(open_frame)
        next_open = time.monotonic() + rto
        opens = 1
        while not res.opened:
            got = pump(min(0.05, max(0.0, next_open - time.monotonic())))
            if "reject" in got:
                res.elapsed = time.monotonic() - t0
                return res
            if "openack" in got:
                res.opened = True
                break
            if time.monotonic() >= next_open:
                if opens > max_retries or time.monotonic() > end_by:
                    res.elapsed = time.monotonic() - t0
                    return res
                pick_lane().send(open_frame)
                opens += 1
                next_open = time.monotonic() + rto * (2 ** min(opens, 4))

        # -- data
        nxt = 0
        paused = False
        limit = len(units) if stop_after_units is None else min(stop_after_units, len(units))
        while True:
            pump(0)
            # resends first, one unit a frame
            while resend_q:
                s = resend_q.pop(0)
                if state[s] == "queued":
                    send_data([s], attempt[s] + 1)
                    res.resends += 1
            # new units within the window
            sent_any = False
            while nxt < limit and (unacked == 0 or unacked + units[nxt].len <= window):
                if pause and not paused and nxt >= pause[0]:
                    paused = True
                    time.sleep(pause[1])
                    pump(0)
                u = units[nxt]
                seqs = [nxt]
                total = u.len
                if not u.exclusive and coalesce_bytes:
                    while (len(seqs) < MAX_COALESCED_SLICES and nxt + len(seqs) < limit):
                        v = units[nxt + len(seqs)]
                        prev = units[nxt + len(seqs) - 1]
                        if (v.exclusive or v.layer != u.layer or v.first != u.first
                                or v.offset != prev.offset + prev.len
                                or v.offset in cuts
                                or total + v.len > coalesce_bytes
                                or unacked + total + v.len > window):
                            break
                        seqs.append(nxt + len(seqs))
                        total += v.len
                send_data(seqs, 0)
                unacked += total
                nxt += len(seqs)
                sent_any = True
                if len(seqs) > 0:
                    pump(0)
            if nxt >= limit and stop_after_units is not None:
                res.elapsed = time.monotonic() - t0
                return res
            done = all(st in ("acked", "failed") for st in state)
            if done:
                break
            if time.monotonic() > end_by:
                res.elapsed = time.monotonic() - t0
                return res
            # timers
            now = time.monotonic()
            for s in range(len(units)):
                if state[s] == "flight" and now - sent_at[s] > rto * (2 ** min(tries[s] - 1, 2)):
                    if tries[s] > max_retries:
                        state[s] = "failed"
                        res.given_up += 1
                        unacked -= units[s].len
                    else:
                        state[s] = "queued"
                        resend_q.append(s)
            if not sent_any and not resend_q:
                pump(0.02)

        # -- close
        if not send_close:
            res.elapsed = time.monotonic() - t0
            return res
        close_frame = frame(CLOSE, sid)
        for k in range(max_retries + 1):
            pick_lane().send(close_frame)
            deadline = time.monotonic() + rto * (2 ** min(k, 3))
            while time.monotonic() < deadline and not res.close_acked:
                if "closeack" in pump(0.05):
                    res.close_acked = True
            if res.close_acked:
                break
        res.elapsed = time.monotonic() - t0
        return res
