"""Compression framing and bounded decompression, checked against independent libraries."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
import textwrap

import cramjam
import lz4.block
import lz4.frame
import numpy as np
import pyarrow as pa
import pytest
import zstandard
from kafka import codec as kp_codec

from storage.errors import CorruptRecordError, RecordTooLargeError
from storage.records.compression import compress, decompress, zstd_content_size
from storage.records.record_batch import CompressionType as C
from tests.helpers import REPO

ALL = list(C)
COMPRESSED = [c for c in C if c is not C.NONE]


def payload(size: int, seed: int = 1) -> bytes:
    """Compressible bytes (random words from a small vocabulary)."""
    rng = np.random.default_rng(seed)
    words = [b"kafka", b"log", b"segment", b"offset", b"batch", b"record", b" ", b"\x00\x01"]
    out = b"".join(words[i] for i in rng.integers(0, len(words), size))
    return out[:size]


SIZES = [0, 1, 100, 32 * 1024 - 1, 32 * 1024, 32 * 1024 + 1, 64 * 1024, 64 * 1024 + 1, 300_000]


@pytest.mark.parametrize("codec", ALL)
@pytest.mark.parametrize("size", SIZES)
def test_round_trip(codec, size):
    data = payload(size)
    assert decompress(codec, compress(codec, data), max_bytes=size) == data


@pytest.mark.parametrize("codec", ALL)
def test_round_trip_incompressible(codec):
    data = np.random.default_rng(3).integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    assert decompress(codec, compress(codec, data), max_bytes=len(data)) == data


def test_gzip_is_standard():
    data = payload(100_000)
    out = compress(C.GZIP, data)
    assert out[:2] == b"\x1f\x8b"
    assert gzip.decompress(out) == data


def test_zstd_is_standard_frame():
    data = payload(100_000)
    out = compress(C.ZSTD, data)
    assert out[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.ZstdDecompressor().decompress(out) == data
    assert zstd_content_size(out) == len(data)


def test_snappy_xerial_framing():
    data = payload(100_000)
    out = compress(C.SNAPPY, data)
    assert out[:16] == bytes.fromhex("82534e41505059000000000100000001")
    # walk the chunks ourselves: int32 length + raw snappy block of at most 32 KiB each
    pos, chunks = 16, []
    while pos < len(out):
        (n,) = struct.unpack_from(">i", out, pos)
        chunks.append(bytes(cramjam.snappy.decompress_raw(out[pos + 4 : pos + 4 + n])))
        pos += 4 + n
    assert pos == len(out)
    assert [len(c) for c in chunks] == [32768, 32768, 32768, 100_000 - 3 * 32768]
    assert b"".join(chunks) == data
    assert kp_codec.snappy_decode(out) == data  # kafka-python's xerial reader


def test_lz4_frame_is_javas_independent_block_frame():
    data = payload(200_000)
    out = compress(C.LZ4, data)
    # magic, FLG 0x60 (v01, block independence, no checksums, no content size), BD 0x40 (64 KiB), HC
    assert out[:7] == bytes.fromhex("04224d18604082")
    assert lz4.frame.decompress(out) == data  # the lz4 library verifies the header checksum
    # every block decodes on its own, which is what Java's Lz4BlockInputStream requires
    pos, blocks = 7, []
    while True:
        (n,) = struct.unpack_from("<I", out, pos)
        pos += 4
        if n == 0:
            break
        raw, size = bool(n & 0x80000000), n & 0x7FFFFFFF
        body = out[pos : pos + size]
        blocks.append(body if raw else lz4.block.decompress(body, uncompressed_size=65536))
        pos += size
    assert pos == len(out)
    assert [len(b) for b in blocks][:3] == [65536, 65536, 65536]
    assert b"".join(blocks) == data


def test_lz4_incompressible_blocks_are_stored():
    data = np.random.default_rng(5).integers(0, 256, 70_000, dtype=np.uint8).tobytes()
    out = compress(C.LZ4, data)
    (first,) = struct.unpack_from("<I", out, 7)
    assert first == 65536 | 0x80000000
    assert lz4.frame.decompress(out) == data


def _zstd_stream(d: bytes) -> bytes:
    obj = zstandard.ZstdCompressor().compressobj()
    return obj.compress(d) + obj.flush()


FOREIGN = {
    "gzip": (C.GZIP, lambda d: gzip.compress(d)),
    "gzip-multi-member": (C.GZIP, lambda d: gzip.compress(d[:1000]) + gzip.compress(d[1000:])),
    "xerial-kafka-python": (C.SNAPPY, lambda d: kp_codec.snappy_encode(d)),
    "snappy-unframed": (C.SNAPPY, lambda d: bytes(cramjam.snappy.compress_raw(d))),
    "lz4-linked-checksummed": (C.LZ4, lambda d: lz4.frame.compress(d, block_linked=True, content_checksum=True)),
    "lz4-content-size": (
        C.LZ4,
        lambda d: lz4.frame.compress(d, store_size=True, block_size=lz4.frame.BLOCKSIZE_MAX4MB),
    ),
    "zstd-one-shot": (C.ZSTD, lambda d: zstandard.ZstdCompressor().compress(d)),
    "zstd-streamed-no-size": (C.ZSTD, _zstd_stream),
    "zstd-two-frames": (
        C.ZSTD,
        lambda d: zstandard.ZstdCompressor().compress(d[:500]) + zstandard.ZstdCompressor().compress(d[500:]),
    ),
}


@pytest.mark.parametrize("name", sorted(FOREIGN))
def test_decompress_other_producers(name):
    codec, fn = FOREIGN[name]
    data = payload(150_000, seed=9)
    blob = fn(data)
    if name == "zstd-streamed-no-size":
        assert zstd_content_size(blob) is None
    assert decompress(codec, blob, max_bytes=len(data)) == data


@pytest.mark.parametrize("codec", ALL)
def test_limit_is_exact(codec):
    data = payload(50_000)
    blob = compress(codec, data)
    assert decompress(codec, blob, max_bytes=50_000) == data
    with pytest.raises(RecordTooLargeError, match=r"seg\.log, position 1234"):
        decompress(codec, blob, max_bytes=49_999, source="seg.log", position=1234)


def _bomb(codec: C, size: int) -> bytes:
    """`size` zero bytes compressed, built without holding them in memory."""
    if codec is C.SNAPPY:
        chunk = bytes(cramjam.snappy.compress_raw(b"\0" * 32768))
        return compress(C.SNAPPY, b"")[:16] + (struct.pack(">i", len(chunk)) + chunk) * (size // 32768)
    sink = pa.BufferOutputStream()
    name = {C.GZIP: "gzip", C.LZ4: "lz4", C.ZSTD: "zstd"}[codec]
    with pa.CompressedOutputStream(sink, name) as out:
        block = b"\0" * (1 << 20)
        for _ in range(size >> 20):
            out.write(block)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("codec", COMPRESSED)
def test_bomb_raises_too_large(codec):
    blob = _bomb(codec, 64 << 20)
    with pytest.raises(RecordTooLargeError, match="above the limit of 1048588"):
        decompress(codec, blob, max_bytes=1048588, source="bomb", position=0)


def test_bomb_does_not_allocate():
    """A 1 GiB bomb per codec, in a fresh process: peak RSS must stay far below the bomb size."""
    script = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {REPO!r})
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_compression import _bomb
        from storage.records.compression import decompress
        from storage.records.record_batch import CompressionType as C
        from storage.errors import RecordTooLargeError
        bombs = {{c: _bomb(c, 1 << 30) for c in (C.GZIP, C.SNAPPY, C.LZ4, C.ZSTD)}}
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        raised = 0
        for c, blob in bombs.items():
            try:
                decompress(c, blob, max_bytes=1048588)
            except RecordTooLargeError:
                raised += 1
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(raised, (after - before) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    raised, grown_mb = map(int, out.stdout.split())
    assert raised == 4
    assert grown_mb < 64, f"peak RSS grew by {grown_mb} MiB while refusing 1 GiB bombs"


def test_snappy_declared_size_checked_before_decompressing():
    # one raw block whose preamble claims 4 GiB - 1: refused from the preamble alone
    blob = compress(C.SNAPPY, b"")[:16] + struct.pack(">i", 6) + bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x00])
    with pytest.raises(RecordTooLargeError):
        decompress(C.SNAPPY, blob, max_bytes=1 << 20)


@pytest.mark.parametrize(
    "codec, blob",
    [
        (C.GZIP, b"\x1f\x8b\x08\x00garbage-garbage"),
        (C.GZIP, compress(C.GZIP, payload(10_000))[:-20]),
        (C.SNAPPY, compress(C.SNAPPY, payload(10_000))[:-5]),
        (C.SNAPPY, compress(C.SNAPPY, b"")[:16] + struct.pack(">i", 1000) + b"short"),
        (C.SNAPPY, compress(C.SNAPPY, b"")[:16] + b"\x00\x00"),
        (C.SNAPPY, b"\x05\xffnot snappy"),
        (C.LZ4, compress(C.LZ4, payload(100_000))[:-30]),
        (C.LZ4, b"\x04\x22\x4d\x18\x60\x40\x00junk"),
        (C.ZSTD, compress(C.ZSTD, payload(100_000))[:-10]),
        (C.ZSTD, b"\x28\xb5\x2f\xfdjunkjunkjunk"),
    ],
)
def test_malformed_raises_corrupt(codec, blob):
    with pytest.raises(CorruptRecordError, match=r"malformed .*\(seg\.log, position 77\)"):
        decompress(codec, blob, max_bytes=1 << 20, source="seg.log", position=77)


def test_zstd_lying_content_size_is_caught():
    data = payload(10_000)
    blob = bytearray(compress(C.ZSTD, data))
    # the frame declares its size; make it claim one byte more
    fhd = blob[4]
    assert fhd >> 6 == 1 and fhd & 0x20  # 2-byte size field, single segment
    size = struct.unpack_from("<H", blob, 5)[0] + 256
    assert size == len(data)
    struct.pack_into("<H", blob, 5, size + 1 - 256)
    with pytest.raises(CorruptRecordError):
        decompress(C.ZSTD, bytes(blob), max_bytes=1 << 20)


def test_none_codec_is_identity_and_bounded():
    assert compress(C.NONE, b"abc") == b"abc"
    assert decompress(C.NONE, b"abc", max_bytes=3) == b"abc"
    with pytest.raises(RecordTooLargeError):
        decompress(C.NONE, b"abcd", max_bytes=3)


def test_accepts_buffers_of_any_kind():
    data = payload(70_000)
    for codec in COMPRESSED:
        for form in (data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint8), pa.py_buffer(data)):
            blob = compress(codec, form)
            assert decompress(codec, pa.py_buffer(blob), max_bytes=len(data)) == data
