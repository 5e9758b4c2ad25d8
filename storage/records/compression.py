"""Compression of a batch's record area, in the framings Kafka's Java readers expect.

gzip and zstd are standard frames. snappy uses xerial framing (what Java's SnappyOutputStream
writes). lz4 uses the LZ4 frame format with *independent* blocks: Java's Lz4BlockInputStream
rejects linked blocks, and pyarrow's 'lz4' frame codec writes linked ones (FLG 0x40), so the frame
is assembled here around pyarrow's raw 'lz4_raw' blocks, byte for byte what Java writes.

Decompression is bounded: no codec may produce (or allocate) more than ``max_bytes``.
"""

from __future__ import annotations

import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from ..errors import CorruptRecordError, RecordTooLargeError
from .record_batch import CompressionType

# Kafka's default levels (KIP-390): gzip -1 (zlib's 6), zstd 3. lz4 uses the fast compressor.
_DEFAULT_LEVEL = {CompressionType.GZIP: 6, CompressionType.ZSTD: 3}
_ARROW_NAME = {CompressionType.GZIP: "gzip", CompressionType.LZ4: "lz4", CompressionType.ZSTD: "zstd"}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_CHUNK = 32 * 1024  # SnappyOutputStream's default block size

LZ4_MAGIC = b"\x04\x22\x4d\x18"
# FLG 0x60: version 01, independent blocks, no checksums, no content size. BD 0x40: 64 KiB blocks.
# 0x82 is the header checksum byte, (xxh32(b"\x60\x40", seed=0) >> 8) & 0xff.
LZ4_FRAME_HEADER = LZ4_MAGIC + b"\x60\x40\x82"
LZ4_BLOCK = 64 * 1024
LZ4_END_MARK = b"\x00\x00\x00\x00"
_LZ4_UNCOMPRESSED = 0x80000000

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

_local = threading.local()  # pa.Codec objects keep stream state (gzip): one set per thread

# Batches are compressed independently, and pyarrow's codecs release the GIL: several batches of
# one call are (de)compressed on a small thread pool. set_threads(1) turns this off.
_threads = min(4, os.cpu_count() or 1)
_pool: ThreadPoolExecutor | None = None
_MIN_PARALLEL_BYTES = 256 * 1024


def set_threads(n: int) -> None:
    """Threads used by compress_many / decompress_many (1 = in the calling thread only)."""
    global _threads, _pool
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    if _pool is not None:
        _pool.shutdown(wait=False)
        _pool = None
    _threads = n


def _drop_pool() -> None:  # a forked child (Spark's Python workers) must not reuse the parent's threads
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_pool)


def _map(fn, items: list, nbytes: int) -> list:
    """[fn(x) for x in items], split into one contiguous run of items per thread when there is enough
    work (a task per item would cost more than a small batch's compression)."""
    global _pool
    k = min(_threads, len(items))
    if k < 2 or nbytes < _MIN_PARALLEL_BYTES:
        return [fn(item) for item in items]
    if _pool is None:
        _pool = ThreadPoolExecutor(_threads, thread_name_prefix="kafkalog-codec")
    cuts = [len(items) * i // k for i in range(k + 1)]
    spans = zip(cuts, cuts[1:], strict=False)
    runs = [_pool.submit(lambda lo, hi: [fn(item) for item in items[lo:hi]], lo, hi) for lo, hi in spans]
    out = []
    for run in runs:  # in order: the first failing item's error is the one raised
        out.extend(run.result())
    return out


def _codec(name: str, level: int | None = None) -> pa.Codec:
    codecs = getattr(_local, "codecs", None)
    if codecs is None:
        codecs = _local.codecs = {}
    key = (name, level)
    codec = codecs.get(key)
    if codec is None:
        codec = codecs[key] = pa.Codec(name, compression_level=level)
    return codec


def _u8(data) -> memoryview:
    """A flat byte view of any buffer. (len(memoryview(pa.Buffer)) can report the capacity, not the size.)"""
    return np.frombuffer(data, np.uint8).data


def compress_buffer(codec: CompressionType, data, *, level: int | None = None):
    """Like `compress`, returning a buffer-protocol object (saves a copy for callers that join)."""
    codec = CompressionType(codec)
    if codec is CompressionType.NONE:
        return data
    if codec is CompressionType.SNAPPY:
        return _xerial_compress(data)
    if codec is CompressionType.LZ4:
        return _lz4_frame_compress(data)
    return _codec(_ARROW_NAME[codec], level if level is not None else _DEFAULT_LEVEL[codec]).compress(data)


def compress(codec: CompressionType, data, *, level: int | None = None) -> bytes:
    """Compress a record area with `codec`, framed as Kafka's Java clients frame it."""
    out = compress_buffer(codec, data, level=level)
    return out if isinstance(out, bytes) else bytes(out)


def compress_many(codec: CompressionType, items: list, *, level: int | None = None) -> list:
    """compress_buffer over several record areas, on the thread pool when they are large enough."""
    nbytes = sum(memoryview(data).nbytes for data in items)
    return _map(lambda data: compress_buffer(codec, data, level=level), items, nbytes)


def decompress_many(items: list, *, max_bytes: int, source=None) -> list:
    """decompress_buffer over (codec, data, position) items, on the thread pool when large enough."""
    nbytes = sum(memoryview(item[1]).nbytes for item in items)
    return _map(
        lambda item: decompress_buffer(item[0], item[1], max_bytes=max_bytes, source=source, position=item[2]),
        items,
        nbytes,
    )


def _xerial_compress(data) -> bytes:
    raw = _codec("snappy")
    view = _u8(data)
    parts = [XERIAL_HEADER]
    for start in range(0, len(view), XERIAL_CHUNK):  # one C call per 32 KiB chunk
        block = raw.compress(view[start : start + XERIAL_CHUNK])
        parts.append(struct.pack(">i", block.size))
        parts.append(block)
    return b"".join(parts)


def _lz4_frame_compress(data) -> bytes:
    raw = _codec("lz4_raw")
    view = _u8(data)
    parts: list[bytes | memoryview | pa.Buffer] = [LZ4_FRAME_HEADER]
    for start in range(0, len(view), LZ4_BLOCK):  # one C call per 64 KiB block
        chunk = view[start : start + LZ4_BLOCK]
        block = raw.compress(chunk)
        if block.size >= len(chunk):  # incompressible: stored as is, high bit of the size set
            parts.append(struct.pack("<I", len(chunk) | _LZ4_UNCOMPRESSED))
            parts.append(chunk)
        else:
            parts.append(struct.pack("<I", block.size))
            parts.append(block)
    parts.append(LZ4_END_MARK)
    return b"".join(parts)


def _where(source, position) -> str:
    where = [str(source)] if source is not None else []
    if position is not None:
        where.append(f"position {position}")
    return f" ({', '.join(where)})" if where else ""


def _too_large(codec, max_bytes, source, position, size=None) -> RecordTooLargeError:
    got = f"{size} bytes" if size is not None else f"more than {max_bytes} bytes"
    return RecordTooLargeError(
        f"{codec.kafka_name} records decompress to {got}, above the limit of {max_bytes} (max.message.bytes)"
        + _where(source, position)
    )


def _corrupt(codec, detail, source, position) -> CorruptRecordError:
    return CorruptRecordError(f"malformed {codec.kafka_name} data: {detail}", source=source, position=position)


def decompress_buffer(codec: CompressionType, data, *, max_bytes: int, source=None, position=None):
    """Like `decompress`, returning a buffer-protocol object (bytes or pa.Buffer) without a final copy."""
    codec = CompressionType(codec)
    if codec is CompressionType.NONE:
        size = _u8(data).nbytes
        if size > max_bytes:
            raise _too_large(codec, max_bytes, source, position, size)
        return data
    if codec is CompressionType.SNAPPY:
        return _snappy_decompress(data, max_bytes, source, position)
    if codec is CompressionType.ZSTD:
        out = _zstd_one_shot(data, max_bytes, source, position)
        if out is not None:
            return out
    try:
        stream = pa.CompressedInputStream(pa.BufferReader(data), _ARROW_NAME[codec])
        out = stream.read_buffer(max_bytes + 1)  # never more than the limit plus one byte
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _corrupt(codec, exc, source, position) from None
    if out.size > max_bytes:
        raise _too_large(codec, max_bytes, source, position)
    return out


def decompress(codec: CompressionType, data, *, max_bytes: int, source=None, position=None) -> bytes:
    """Decompress a record area, producing at most `max_bytes` bytes.

    Raises RecordTooLargeError when the output would exceed `max_bytes` and CorruptRecordError on
    malformed input, both naming `source` and `position`.
    """
    out = decompress_buffer(codec, data, max_bytes=max_bytes, source=source, position=position)
    return out if isinstance(out, bytes) else bytes(out)


def _zstd_one_shot(data, max_bytes, source, position):
    """Single-frame zstd with a declared content size: decompress in one call into exactly that size.

    zstd verifies the declared size against what it decodes, so a lie fails rather than overflows.
    Returns None (caller streams) when the frame declares no size or decoding does not fit.
    """
    size = zstd_content_size(data)
    if size is None:
        return None
    if size > max_bytes:
        raise _too_large(CompressionType.ZSTD, max_bytes, source, position, size)
    try:
        return _codec("zstd").decompress(data, decompressed_size=size)
    except (pa.ArrowException, OSError, ValueError):
        return None  # several frames, or corrupt: the streaming path decides and reports


def zstd_content_size(data) -> int | None:
    """Frame_Content_Size from a zstd frame header (RFC 8878 section 3.1.1.1), or None if absent."""
    view = _u8(data)
    if len(view) < 6 or view[:4] != _ZSTD_MAGIC:
        return None
    fhd = view[4]
    fcs_flag = fhd >> 6
    single_segment = (fhd >> 5) & 1
    did_size = (0, 1, 2, 4)[fhd & 3]
    pos = 5 + (0 if single_segment else 1) + did_size
    fcs_size = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if fcs_size == 0 or len(view) < pos + fcs_size:
        return None
    size = int.from_bytes(view[pos : pos + fcs_size], "little")
    return size + 256 if fcs_size == 2 else size


def _uvarint(view, pos: int, end: int):
    """Unsigned LEB128 of at most 5 bytes (snappy's length preamble); (value, next) or (None, pos)."""
    value = 0
    for i in range(5):
        if pos + i >= end:
            return None, pos
        b = view[pos + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return value, pos + i + 1
    return None, pos


def _snappy_decompress(data, max_bytes, source, position):
    codec = CompressionType.SNAPPY
    raw = _codec("snappy")
    view = _u8(data)
    end = len(view)
    if end < len(XERIAL_MAGIC) or view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        blocks = [(0, end)]  # plain snappy, as Java's SnappyInputStream also accepts
    else:
        blocks = []
        pos = 0
        while pos < end:
            if view[pos : pos + len(XERIAL_MAGIC)] == XERIAL_MAGIC:  # a (possibly concatenated) stream header
                if end - pos < len(XERIAL_HEADER):
                    raise _corrupt(codec, f"truncated xerial header at byte {pos}", source, position)
                pos += len(XERIAL_HEADER)
                continue
            if end - pos < 4:
                raise _corrupt(codec, f"truncated xerial chunk length at byte {pos}", source, position)
            (length,) = struct.unpack_from(">i", view, pos)
            if length < 0 or pos + 4 + length > end:
                raise _corrupt(
                    codec, f"xerial chunk length {length} at byte {pos} runs past the data", source, position
                )
            blocks.append((pos + 4, pos + 4 + length))
            pos += 4 + length
    sizes = []
    total = 0
    for start, stop in blocks:  # check every declared size before decompressing anything
        size, _ = _uvarint(view, start, stop)
        if size is None:
            raise _corrupt(codec, f"bad snappy length preamble at byte {start}", source, position)
        total += size
        if total > max_bytes:
            raise _too_large(codec, max_bytes, source, position)
        sizes.append(size)
    try:
        pairs = zip(blocks, sizes, strict=True)
        parts = [raw.decompress(view[start:stop], decompressed_size=size) for (start, stop), size in pairs]
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _corrupt(codec, exc, source, position) from None
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)
