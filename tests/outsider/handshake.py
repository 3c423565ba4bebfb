"""The TCP lane handshake (PROTOCOL.md section 11): Hello, Auth, Welcome, Reject, the
section 11.5 HMAC, and the socket helpers to dial and run the dialer's side."""

import hashlib
import hmac
import os
import socket
import struct
from dataclasses import dataclass, field
from typing import List, Optional

from wire import BF16, VERSION, Layout

# --------------------------------------------------------------------------- handshake

HELLO, AUTH, WELCOME, HS_REJECT = 1, 2, 3, 4
HELLO_MAGIC = b"KVTE-LN\x00"
PROTOCOL = 4
MAX_HS_LEN = 64 << 10
ZERO16 = bytes(16)
ZERO32 = bytes(32)


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<H", len(b)) + b


@dataclass
class Hello:
    engine_id: int
    model: str = "default"
    weight_version: int = 0
    block_size: int = 16
    dtype: int = BF16
    listen: str = ""
    authenticated: bool = False
    want: Optional[Layout] = None
    nonce: bytes = field(default_factory=lambda: os.urandom(16))
    token: bytes = ZERO16
    mac: bytes = ZERO32
    protocol: int = PROTOCOL
    wire: int = VERSION
    magic: bytes = HELLO_MAGIC

    def encode(self):
        """The body (tag first), without the u32 length prefix."""
        return (bytes([HELLO]) + self.magic + struct.pack("<HBI", self.protocol, self.wire,
                                                          self.engine_id)
                + _str(self.model) + struct.pack("<QIB", self.weight_version, self.block_size,
                                                 self.dtype)
                + _str(self.listen) + bytes([1 if self.authenticated else 0])
                + (b"\x01" + self.want.encode() if self.want is not None else b"\x00")
                + self.nonce + self.token + self.mac)

    @classmethod
    def decode(cls, body):
        r = _Reader(body)
        if r.u8() != HELLO:
            raise ValueError("not a Hello")
        magic = r.take(8)
        if magic != HELLO_MAGIC:
            raise ValueError("bad magic")
        protocol, wire = r.u16(), r.u8()
        if protocol != PROTOCOL or wire != VERSION:
            return cls(0, protocol=protocol, wire=wire)
        h = cls(r.u32())
        h.model = r.string()
        h.weight_version, h.block_size, h.dtype = r.u64(), r.u32(), r.u8()
        h.listen = r.string()
        h.authenticated = r.u8() != 0
        h.want = Layout.decode(r.take(70)) if r.u8() else None
        h.nonce, h.token, h.mac = r.take(16), r.take(16), r.take(32)
        r.end()
        return h


def hello_transcript(body):
    """hello_body(h) of section 11.5: everything but the tag and the mac."""
    return body[1:-32]


def auth_mac(secret, role, dialer_body, acceptor_body):
    t = hello_transcript(dialer_body) + hello_transcript(acceptor_body)
    msg = b"kvte-lane-auth:" + role.encode() + b":" + t
    return hmac.new(secret, msg, hashlib.sha256).digest()


class _Reader:
    def __init__(self, b):
        self.b, self.i = bytes(b), 0

    def take(self, n):
        if self.i + n > len(self.b):
            raise ValueError("truncated")
        out = self.b[self.i:self.i + n]
        self.i += n
        return out

    def u8(self):
        return self.take(1)[0]

    def u16(self):
        return struct.unpack("<H", self.take(2))[0]

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return self.take(self.u16()).decode("utf-8")

    def end(self):
        if self.i != len(self.b):
            raise ValueError("%d bytes left over" % (len(self.b) - self.i))


@dataclass
class Segment:
    name: str
    region: int
    key: int
    length: int
    layout: Optional[Layout]


@dataclass
class Welcome:
    token: bytes
    segments: List[Segment]

    def encode(self):
        out = [bytes([WELCOME]), self.token, struct.pack("<H", len(self.segments))]
        for s in self.segments:
            out.append(_str(s.name) + struct.pack("<IQQ", s.region, s.key, s.length))
            out.append(b"\x01" + s.layout.encode() if s.layout else b"\x00")
        return b"".join(out)

    @classmethod
    def decode(cls, body):
        r = _Reader(body)
        if r.u8() != WELCOME:
            raise ValueError("not a Welcome")
        token = r.take(16)
        segs = []
        for _ in range(r.u16()):
            name = r.string()
            region, key, length = r.u32(), r.u64(), r.u64()
            lay = Layout.decode(r.take(70)) if r.u8() else None
            segs.append(Segment(name, region, key, length, lay))
        r.end()
        return cls(token, segs)


def encode_auth(mac):
    return bytes([AUTH]) + mac


def encode_hs_reject(reason):
    return bytes([HS_REJECT]) + _str(reason)


def send_msg(sock, body):
    sock.sendall(struct.pack("<I", len(body)) + body)


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("EOF after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)


def recv_msg(sock):
    (n,) = struct.unpack("<I", recv_exact(sock, 4))
    if n > MAX_HS_LEN or n < 1:
        raise ValueError("handshake message of %d bytes" % n)
    return recv_exact(sock, n)


class HandshakeRejected(Exception):
    def __init__(self, reason):
        super().__init__("peer refused: %s" % reason)
        self.reason = reason


def decode_reject_msg(body):
    r = _Reader(body)
    if r.u8() != HS_REJECT:
        raise ValueError("not a Reject")
    reason = r.string()
    r.end()
    return reason


def dial(addr, timeout=5.0, source_ip=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if source_ip:
        s.bind((source_ip, 0))
    s.connect(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def handshake(sock, engine_id, want=None, token=ZERO16, secret=None, model="default",
              weight_version=0, block_size=16, dtype=BF16, expect_engine=None,
              verify_acceptor=True):
    """The dialer's side of section 11.4. Returns (acceptor Hello, Welcome)."""
    if isinstance(secret, str):
        secret = secret.encode()
    mine = Hello(engine_id, model, weight_version, block_size, dtype, "", secret is not None,
                 want, token=token)
    my_body = mine.encode()
    send_msg(sock, my_body)
    body = recv_msg(sock)
    if body[0] == HS_REJECT:
        raise HandshakeRejected(decode_reject_msg(body))
    theirs = Hello.decode(body)
    if theirs.protocol != PROTOCOL or theirs.wire != VERSION:
        raise ValueError("acceptor speaks %d/%d" % (theirs.protocol, theirs.wire))
    if expect_engine is not None and theirs.engine_id != expect_engine:
        raise ValueError("expected engine %d, got %d" % (expect_engine, theirs.engine_id))
    if secret is not None:
        want_mac = auth_mac(secret, "acceptor", my_body, body)
        if verify_acceptor and not hmac.compare_digest(want_mac, theirs.mac):
            send_msg(sock, encode_hs_reject("the peer failed shared-secret authentication"))
            raise ValueError("acceptor failed authentication")
        send_msg(sock, encode_auth(auth_mac(secret, "dialer", my_body, body)))
    else:
        send_msg(sock, encode_auth(ZERO32))
    body = recv_msg(sock)
    if body[0] == HS_REJECT:
        raise HandshakeRejected(decode_reject_msg(body))
    return theirs, Welcome.decode(body)
