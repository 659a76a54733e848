"""The Raft transport's framing (synapse.master.frames): stored zlib streams for small messages,
read by zlib itself (an older release), reading zlib's own (an older release's), refusing damage."""

from __future__ import annotations

import pickle
import random
import zlib

import pytest
from pysyncobj import tcp_connection

from synapse.master import frames

SIZES = [0, 1, 190, frames.ADLER_CHUNK - 1, frames.ADLER_CHUNK, frames.ADLER_CHUNK + 1, 3 * frames.ADLER_CHUNK + 7,
         frames.STORED_MAX, frames.STORED_MAX + 1, 200_000]


def _data(size: int, seed: int = 1) -> bytes:
    rng = random.Random(seed)
    return bytes(rng.getrandbits(8) for _ in range(size // 2)) + b"synapse " * ((size - size // 2) // 8 + 1)


@pytest.mark.parametrize("size", SIZES)
def test_a_frame_is_a_zlib_stream_that_both_readers_take(size):
    data = _data(size)[:size]
    framed = frames.compress(data)
    assert zlib.decompress(framed) == data  # what a replica of an older release does with it
    assert frames.decompress(framed) == data
    stored = size <= frames.STORED_MAX
    assert (len(framed) == size + 11) is stored  # stored small, deflated large


@pytest.mark.parametrize("level", [1, 3, 9, 0])
def test_zlibs_own_streams_are_read_as_before(level):
    for size in (0, 190, 4000, 70_000):
        data = _data(size, seed=size)[:size]
        assert frames.decompress(zlib.compress(data, level)) == data


def test_zlib_level_0_writes_the_same_stream_for_a_small_message():
    data = pickle.dumps({"type": "apnd_entry_response", "term": 3, "next_node_idx": 102})
    assert frames.compress(data) == zlib.compress(data, 0)


def test_damage_is_refused_never_read_as_other_bytes():
    data = pickle.dumps({"type": "append_entries", "entries": [(b"x" * 300, 7, 2)], "commit_index": 6})
    framed = frames.compress(data)
    read_anyway = []
    for i in range(len(framed)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(framed)
            damaged[i] ^= flip
            try:
                out = frames.decompress(bytes(damaged))
            except zlib.error:
                continue
            assert out == data, (i, flip)
            read_anyway.append((i, flip))
    # Only the stored block's padding bits (the rest of its first byte), which no reader looks at.
    assert read_anyway == [(2, 0x80)]
    for cut in range(len(framed)):
        with pytest.raises(zlib.error):
            frames.decompress(framed[:cut])
    # Bytes after the stream's end are left alone, as zlib leaves them (a message's length is the
    # transport's own prefix, and the seal covers every byte).
    assert frames.decompress(framed + b"\x00") == zlib.decompress(framed + b"\x00") == data


def test_install_points_pysyncobj_at_the_frames_once():
    frames.install()
    frames.install()
    assert tcp_connection.zlib.compress is frames.compress
    assert tcp_connection.zlib.decompress is frames.decompress
