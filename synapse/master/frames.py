"""The Raft transport's framing: small messages as stored zlib streams, built without zlib's deflate.

pysyncobj's TcpConnection sends each message as `zlib.compress(pickle.dumps(message), 3)` and
reads it with `zlib.decompress`. On a loaded replica that cost far more than the work: zlib lets go
of Python's lock around every deflate and inflate, and with the event loop, gRPC's threads and the
tick thread all wanting the lock, getting it back costs a switch. `bench/lock_handoff.py` (thread
CPU per call, beside one busy Python thread): zlib.compress of 1.5 KB ~80 us against ~15 alone;
framing it here ~1 us either way. A one-off trace under bench/ha.py's load put a leader's zlib at
~0.018 ms per submission.

Here a message of up to STORED_MAX bytes goes out as one *stored* deflate block inside a normal
zlib stream (header, block, Adler-32), assembled in Python: no lock let go, a copy and a checksum.
Every zlib reader takes it, so a replica of an older release reads it as before; a larger message
(a catch-up batch, a snapshot's part) is deflated as pysyncobj did. `decompress` reads a stored
stream itself and hands anything else (an older replica's deflated messages) to zlib, which checks
the stream as it always has. Small messages travel about three times larger than deflated (a 1.3
KB AppendEntries instead of ~400 bytes): between replicas on one network, bytes are not what is
short.

`install` points pysyncobj's transport module at these two functions (it calls nothing else of zlib).
"""

from __future__ import annotations

import types
import zlib

#: The largest message sent stored (not deflated): Adler-32 over at most ADLER_CHUNK bytes at a
#: time keeps Python's lock (CPython's zlib lets it go above 5 KiB), and one stored block holds
#: up to 65,535 bytes.
STORED_MAX = 32 * 1024
ADLER_CHUNK = 5 * 1024
#: What pysyncobj deflates larger messages with.
DEFLATE_LEVEL = 3
#: A zlib stream's header (deflate, 32 KiB window, the fastest level: as zlib's level 0 writes it)
#: and a final stored block's first byte.
_HEADER = b"\x78\x01"
_FINAL_STORED = b"\x01"
_STORED_START = _HEADER + _FINAL_STORED


def _adler32(data: bytes) -> int:
    if len(data) <= ADLER_CHUNK:
        return zlib.adler32(data)
    value = 1
    view = memoryview(data)
    for start in range(0, len(data), ADLER_CHUNK):
        value = zlib.adler32(view[start:start + ADLER_CHUNK], value)
    return value


def compress(data: bytes, level: int = DEFLATE_LEVEL) -> bytes:
    """`data` as a zlib stream: one stored block up to STORED_MAX bytes, deflated beyond."""
    size = len(data)
    if size > STORED_MAX:
        return zlib.compress(data, level)
    return b"".join((_HEADER, _FINAL_STORED, size.to_bytes(2, "little"), (size ^ 0xFFFF).to_bytes(2, "little"),
                     data, _adler32(data).to_bytes(4, "big")))


def decompress(data: bytes) -> bytes:
    """The bytes of a zlib stream; zlib.error if it is damaged. A stream of one stored block (what
    `compress` writes) is read here, any other by zlib."""
    if data[:3] == _STORED_START and len(data) >= 11:
        size = int.from_bytes(data[3:5], "little")
        if len(data) == size + 11 and int.from_bytes(data[5:7], "little") == size ^ 0xFFFF:
            body = data[7:7 + size]
            if _adler32(body) != int.from_bytes(data[-4:], "big"):
                raise zlib.error("Error -3 while decompressing data: incorrect data check")
            return body
    return zlib.decompress(data)


def install() -> None:
    """Have pysyncobj's transport frame its messages with `compress` and `decompress` (idempotent)."""
    from pysyncobj import tcp_connection

    current = tcp_connection.zlib
    if getattr(current, "compress", None) is compress:
        return
    if current is not zlib:
        raise RuntimeError("pysyncobj.tcp_connection.zlib is not the zlib module: a pysyncobj this code does "
                           "not know (see synapse.master.safesyncobj)")
    tcp_connection.zlib = types.SimpleNamespace(compress=compress, decompress=decompress)
