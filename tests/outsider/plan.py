"""The unit plan (PROTOCOL.md section 7) and the te-bench pattern (section 15)."""

import sys
from array import array
from dataclasses import dataclass
from functools import lru_cache

from wire import AUTO, EXCLUSIVE, MAX_PAYLOAD, MIN_SLICE_BYTES, PACKETIZED


# --------------------------------------------------------------------------- unit plan


@dataclass
class Unit:
    layer: int
    first: int
    blocks: int
    offset: int
    len: int
    exclusive: bool


class PlanError(ValueError):
    pass


def build_plan(src_layout, dst_layout, layer_start, layer_end, src_blocks, dst_blocks, mode,
               slice_bytes=0, exclusive_min_bytes=0):
    """Plan::build of section 7 (with the block shape of both layouts)."""
    bb = dst_layout.block_bytes
    cuts = sorted({lay.first_len for lay in (src_layout, dst_layout) if lay.first_len})
    runs = src_layout.runs() and dst_layout.runs()
    n = len(src_blocks)
    if mode in (PACKETIZED, AUTO) and not MIN_SLICE_BYTES <= slice_bytes <= MAX_PAYLOAD:
        raise PlanError("slice size %d out of range" % slice_bytes)
    if mode in (EXCLUSIVE, AUTO) and bb > MAX_PAYLOAD:
        raise PlanError("block too large for exclusive units")
    if n != len(dst_blocks) or n == 0 or layer_start >= layer_end:
        raise PlanError("bad block lists or layer range")
    bounds = [0] + cuts + [bb]
    pieces = list(zip(bounds[:-1], bounds[1:]))

    def contiguous_run(i):
        if not runs:
            return 1
        r = 1
        while (i + r < n and src_blocks[i + r] == src_blocks[i + r - 1] + 1
               and dst_blocks[i + r] == dst_blocks[i + r - 1] + 1):
            r += 1
        return r

    units = []
    for layer in range(layer_start, layer_end):
        i = 0
        while i < n:
            if mode == EXCLUSIVE:
                run = 1
            elif mode == PACKETIZED:
                run = 0
            else:
                r = contiguous_run(i)
                run = r if r * bb >= exclusive_min_bytes else 0
            if run == 0:
                for a, b in pieces:
                    off = a
                    while off < b:
                        ln = min(b - off, slice_bytes)
                        units.append(Unit(layer, i, 1, off, ln, False))
                        off += ln
                i += 1
            elif len(pieces) > 1:
                # runs are false with cuts, so run == 1: one exclusive unit per piece
                for a, b in pieces:
                    units.append(Unit(layer, i, 1, a, b - a, True))
                i += 1
            else:
                per_unit = max(1, min((1 << 20) // bb, (1 << 32) - 1))
                done = 0
                while done < run:
                    b = min(per_unit, run - done)
                    units.append(Unit(layer, i + done, b, 0, b * bb, True))
                    done += b
                i += run
    if len(units) >= 1 << 32:
        raise PlanError("too many units")
    return units


# --------------------------------------------------------------------------- the te-bench pattern


@lru_cache(maxsize=16)
def pattern(seed, size):
    """The bytes `te-bench connect` fills a region of `size` bytes with, for seed `seed`."""
    M = 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    piece = 1 << 20
    for o in range(0, size, piece):
        plen = min(piece, size - o)
        x = 0x9E3779B97F4A7C15 ^ ((seed * 0xD1B54A32D192ED03) & M) ^ o
        words = array("Q")
        for _ in range((plen + 7) // 8):
            x ^= (x << 13) & M
            x ^= x >> 7
            x ^= (x << 17) & M
            words.append(x)
        if sys.byteorder != "little":
            words.byteswap()
        out += words.tobytes()[:plen]
    return bytes(out)
