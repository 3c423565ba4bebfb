"""Frames of the KV transfer wire protocol (docs/PROTOCOL.md): the codecs, no sockets.

  * CRC-32C (table driven)                                   -- PROTOCOL.md section 1
  * frame header encode/decode, kinds, limits                -- section 2
  * control payload codecs: layout, open request, ack ranges -- section 5
"""

import struct
from dataclasses import dataclass
from typing import List

# --------------------------------------------------------------------------- CRC-32C


def _make_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _make_table()


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli), reflected, init/xorout 0xFFFFFFFF. Chainable via crc=."""
    c = crc ^ 0xFFFFFFFF
    t = _CRC_TABLE
    for b in bytes(data):
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# --------------------------------------------------------------------------- frame header

MAGIC = 0x4B56
VERSION = 3
HEADER_LEN = 48

OPEN, OPEN_ACK, REJECT, DATA, ACK, NACK, CLOSE, CLOSE_ACK, PROGRESS = range(1, 10)
KIND_NAMES = {OPEN: "Open", OPEN_ACK: "OpenAck", REJECT: "Reject", DATA: "Data", ACK: "Ack",
              NACK: "Nack", CLOSE: "Close", CLOSE_ACK: "CloseAck", PROGRESS: "Progress"}

MAX_PAYLOAD = 1 << 30
MAX_CONTROL_PAYLOAD = 4 << 20
MAX_LEN = {DATA: MAX_PAYLOAD, OPEN: MAX_CONTROL_PAYLOAD, ACK: MAX_CONTROL_PAYLOAD,
           REJECT: MAX_CONTROL_PAYLOAD}
MAX_COALESCED_SLICES = 64
MAX_ACK_RANGES = 8192
MIN_SLICE_BYTES = 256

_HDR = struct.Struct("<HBBHHQIIQIII")  # the first 44 bytes
assert _HDR.size == 44


class WireError(Exception):
    """A header that fails to decode; .what is the section 2.1 name."""

    def __init__(self, what, msg=""):
        super().__init__("%s: %s" % (what, msg) if msg else what)
        self.what = what


@dataclass
class Header:
    kind: int
    session: int = 0
    attempt: int = 0
    layer: int = 0
    block: int = 0
    offset: int = 0
    length: int = 0
    sequence: int = 0
    crc: int = 0
    hcrc: int = 0
    magic: int = MAGIC
    version: int = VERSION
    reserved: int = 0

    def encode(self, fix_hcrc=True):
        head = _HDR.pack(self.magic, self.version, self.kind, self.attempt, self.reserved,
                         self.session, self.layer, self.block, self.offset, self.length,
                         self.sequence, self.crc)
        h = crc32c(head) if fix_hcrc else self.hcrc
        return head + struct.pack("<I", h)


def encode_header(kind, session=0, attempt=0, layer=0, block=0, offset=0, length=0,
                  sequence=0, crc=0, **raw):
    """The 48 header bytes; raw= may override magic/version/reserved/hcrc (for attacks)."""
    hdr = Header(kind, session, attempt, layer, block, offset, length, sequence, crc)
    hcrc = raw.pop("hcrc", None)
    for k, v in raw.items():
        setattr(hdr, k, v)
    if hcrc is None:
        return hdr.encode()
    hdr.hcrc = hcrc
    return hdr.encode(fix_hcrc=False)


def decode_header(b):
    """Decode 48 bytes, checking in the order of section 2.1."""
    if len(b) != HEADER_LEN:
        raise WireError("Truncated", "%d bytes" % len(b))
    (magic, version, kind, attempt, reserved, session, layer, block, offset, length,
     sequence, crc) = _HDR.unpack_from(b)
    (hcrc,) = struct.unpack_from("<I", b, 44)
    if magic != MAGIC:
        raise WireError("BadMagic", "not a KV transfer frame (magic 0x%04x)" % magic)
    if version != VERSION:
        raise WireError("UnsupportedVersion", str(version))
    if crc32c(b[:44]) != hcrc:
        raise WireError("HeaderChecksum")
    if kind not in KIND_NAMES:
        raise WireError("UnknownKind", str(kind))
    if reserved != 0:
        raise WireError("Reserved")
    if length > MAX_LEN.get(kind, 0):
        raise WireError("Oversized", "%s of %d bytes" % (KIND_NAMES[kind], length))
    return Header(kind, session, attempt, layer, block, offset, length, sequence, crc, hcrc,
                  magic, version, reserved)


def frame(kind, session=0, payload=b"", **fields):
    """A whole frame: header (length, crc from the payload unless given) + payload."""
    fields.setdefault("length", len(payload))
    fields.setdefault("crc", crc32c(payload) if payload else 0)
    return encode_header(kind, session, **fields) + bytes(payload)


# --------------------------------------------------------------------------- enumerations

F16, BF16, F32, FP8 = 1, 2, 3, 4
DTYPE_SIZE = {F16: 2, BF16: 2, F32: 4, FP8: 1}
EXCLUSIVE, PACKETIZED, AUTO = 1, 2, 3
COLLECTIVE, URGENT_KV, BULK_KV = 0, 1, 2
KIND_BYTES, KIND_KV_TOGETHER, KIND_KV_APART, KIND_MLA, KIND_HEAD_MAJOR = 1, 2, 3, 4, 5

# --------------------------------------------------------------------------- layout (70 bytes)

_LAYOUT = struct.Struct("<IIQIBBIIQQQQQ")
assert _LAYOUT.size == 70


@dataclass
class Layout:
    layers: int
    blocks_per_layer: int
    block_bytes: int
    tokens_per_block: int = 16
    dtype: int = BF16
    kind: int = KIND_BYTES
    kv_heads: int = 0
    head_size: int = 0
    base: int = 0
    layer_stride: int = 0
    block_stride: int = 0
    first_len: int = 0
    second_offset: int = 0

    @classmethod
    def layer_major(cls, layers, blocks_per_layer, block_bytes, tokens_per_block=16, dtype=BF16):
        return cls(layers, blocks_per_layer, block_bytes, tokens_per_block, dtype, KIND_BYTES, 0, 0,
                   0, blocks_per_layer * block_bytes, block_bytes, 0, 0)

    def encode(self):
        return _LAYOUT.pack(self.layers, self.blocks_per_layer, self.block_bytes,
                            self.tokens_per_block, self.dtype, self.kind, self.kv_heads,
                            self.head_size, self.base, self.layer_stride, self.block_stride,
                            self.first_len, self.second_offset)

    @classmethod
    def decode(cls, b, off=0):
        return cls(*_LAYOUT.unpack_from(b, off))

    def logical(self):
        return (self.layers, self.tokens_per_block, self.dtype, self.block_bytes)

    def two_chunks(self):
        return self.first_len > 0

    def block_start(self, layer, block):
        return self.base + layer * self.layer_stride + block * self.block_stride

    def byte_offset(self, layer, block, logical):
        """Region offset of logical byte `logical` of block (layer, block)."""
        s = self.block_start(layer, block)
        if self.first_len and logical >= self.first_len:
            return s + self.second_offset + (logical - self.first_len)
        return s + logical

    def extent(self):
        """The end of the last chunk (the layout's total bytes)."""
        last = self.block_start(self.layers - 1, self.blocks_per_layer - 1)
        if self.first_len:
            return max(last + self.first_len,
                       last + self.second_offset + self.block_bytes - self.first_len)
        return last + self.block_bytes

    def runs(self):
        return self.first_len == 0 and self.block_stride == self.block_bytes


# --------------------------------------------------------------------------- open request

_OPEN_FIXED = struct.Struct("<IQBIQBIIQI")
assert 140 + _OPEN_FIXED.size == 186


@dataclass
class OpenRequest:
    dst_layout: Layout
    src_layout: Layout
    dst_region: int
    dst_key: int
    mode: int
    slice_bytes: int
    exclusive_min_bytes: int
    klass: int
    layer_start: int
    layer_end: int
    deadline_us: int
    src_blocks: List[int]
    dst_blocks: List[int]

    def encode(self):
        n = len(self.src_blocks)
        assert len(self.dst_blocks) == n
        return (self.dst_layout.encode() + self.src_layout.encode()
                + _OPEN_FIXED.pack(self.dst_region, self.dst_key, self.mode, self.slice_bytes,
                                   self.exclusive_min_bytes, self.klass, self.layer_start,
                                   self.layer_end, self.deadline_us, n)
                + struct.pack("<%dI" % n, *self.src_blocks)
                + struct.pack("<%dI" % n, *self.dst_blocks))

    @classmethod
    def decode(cls, b):
        if len(b) < 186:
            raise ValueError("open payload ends early")
        dst, src = Layout.decode(b, 0), Layout.decode(b, 70)
        (region, key, mode, slice_bytes, emin, klass, ls, le, dl, n) = _OPEN_FIXED.unpack_from(b, 140)
        if len(b) - 186 != 8 * n:
            raise ValueError("open payload: %d bytes after n=%d" % (len(b) - 186, n))
        if mode not in (EXCLUSIVE, PACKETIZED, AUTO) or klass not in (0, 1, 2):
            raise ValueError("open payload: bad mode or class")
        for lay in (dst, src):
            if lay.dtype not in DTYPE_SIZE:
                raise ValueError("open payload: bad dtype")
        srcb = list(struct.unpack_from("<%dI" % n, b, 186))
        dstb = list(struct.unpack_from("<%dI" % n, b, 186 + 4 * n))
        return cls(dst, src, region, key, mode, slice_bytes, emin, klass, ls, le, dl, srcb, dstb)


# --------------------------------------------------------------------------- ack ranges


def encode_ranges(ranges):
    out = [struct.pack("<I", len(ranges))]
    for s, e in ranges:
        out.append(struct.pack("<II", s, e))
    return b"".join(out)


def decode_ranges(b):
    if len(b) < 4:
        raise ValueError("ack payload too short")
    (k,) = struct.unpack_from("<I", b)
    if len(b) != 4 + 8 * k:
        raise ValueError("ack payload length %d for k=%d" % (len(b), k))
    ranges = [struct.unpack_from("<II", b, 4 + 8 * i) for i in range(k)]
    for s, e in ranges:
        if s >= e:
            raise ValueError("empty ack range")
    return ranges


def to_ranges(indices):
    """Sorted, disjoint half-open ranges of a set of unit indices."""
    out = []
    for i in sorted(set(indices)):
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return [tuple(r) for r in out]
