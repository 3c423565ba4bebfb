"""An outsider's peer for the KV transfer wire protocol (docs/PROTOCOL.md).

Written from the document alone: standard library only, Python 3.9+.

This module only gathers the public names of the modules that hold the code, so that
`import peer` / `peer.X` reach all of them:
  * wire.py      -- CRC-32C, frame header, kinds, control payload codecs (sections 1, 2, 5)
  * plan.py      -- the unit plan (section 7) and the te-bench pattern (section 15)
  * handshake.py -- Hello/Auth/Welcome/Reject, the HMAC, dial and handshake (section 11)
  * client.py    -- a lane (socket + reader thread) and a sending client (sections 8, 12)
"""

from wire import (  # noqa: F401
    ACK, AUTO, BF16, BULK_KV, CLOSE, CLOSE_ACK, COLLECTIVE, DATA, DTYPE_SIZE, EXCLUSIVE, F16, F32,
    FP8, HEADER_LEN, KIND_BYTES, KIND_HEAD_MAJOR, KIND_KV_APART, KIND_KV_TOGETHER, KIND_MLA,
    KIND_NAMES, MAGIC, MAX_ACK_RANGES, MAX_COALESCED_SLICES, MAX_CONTROL_PAYLOAD, MAX_LEN,
    MAX_PAYLOAD, MIN_SLICE_BYTES, NACK, OPEN, OPEN_ACK, PACKETIZED, PROGRESS, REJECT, URGENT_KV,
    VERSION, Header, Layout, OpenRequest, WireError, crc32c, decode_header, decode_ranges,
    encode_header, encode_ranges, frame, to_ranges)
from plan import (  # noqa: F401
    PlanError, Unit, build_plan, pattern)
from handshake import (  # noqa: F401
    AUTH, HELLO, HELLO_MAGIC, HS_REJECT, MAX_HS_LEN, PROTOCOL, WELCOME, ZERO16, ZERO32,
    HandshakeRejected, Hello, Segment, Welcome, auth_mac, decode_reject_msg, dial, encode_auth,
    encode_hs_reject, handshake, hello_transcript, recv_exact, recv_msg, send_msg)
from client import (  # noqa: F401
    Client, Frame, Lane, TransferResult)
