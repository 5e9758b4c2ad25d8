"""FileRecords: the batches of one `.log` file, read in growing chunks and checked before use.

Kafka's FileRecords walks a log file batch by batch. Here a walk reads chunks of whole batches and
checks every batch header it hands out: magic 2, a known codec, a batchLength within [49, max.message.bytes], a
baseOffset above the previous batch's last offset and inside the segment's offset range [segment
base offset, next segment's base offset), a lastOffsetDelta and recordCount that agree. CRCs are
checked where the records are used (decoder, recovery, cleaner), since they cost a pass over the bytes.
A batch that runs past the end of the file is a torn tail only where one may be (the active segment);
anywhere else it is corruption.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import crc32c as _crc32c
import numpy as np

from .common.constants import INT32_MAX, INT64_MIN
from .errors import CorruptRecordError
from .records.record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CRC_OFFSET,
    HEADER_DTYPE,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    SCAN_BAD_LENGTH,
    BatchScan,
    as_uint8,
    scan_batches,
)

MAX_CODEC = 4  # zstd: attribute bits 0-2 above it name no codec
FIRST_CHUNK_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 8 * 1024 * 1024
RESYNC_WINDOW = 4 * 1024 * 1024  # a resync search reads the rest of a file this much at a time


@dataclass
class BatchChunk:
    """Complete batches read from a segment: `buf[scan.positions[i]:]` is at file position base_position + that."""

    buf: bytes | memoryview | np.ndarray  # any buffer of the file's bytes
    scan: BatchScan
    base_position: int
    source: str


def read_batch_headers(fs, path: str, positions) -> np.ndarray:
    """The 61-byte headers of the batches at `positions` of a file (HEADER_DTYPE), one read each: for a
    caller that knows where its batches start (a staged segment) and needs no records. Unchecked."""
    positions = np.asarray(positions, np.int64)
    out = np.zeros(len(positions), HEADER_DTYPE)
    raw = out.view(np.uint8).reshape(len(positions), RECORD_BATCH_OVERHEAD)
    reader = fs.open_reader(path)
    try:
        for i, pos in enumerate(positions.tolist()):  # per batch, not per record
            data = reader.read(pos, pos + RECORD_BATCH_OVERHEAD)
            if len(data) != RECORD_BATCH_OVERHEAD:
                raise CorruptRecordError(
                    f"a batch header at position {pos} is cut short ({len(data)} bytes)",
                    source=fs.url(path),
                    position=pos,
                )
            raw[i] = np.frombuffer(data, np.uint8)
    finally:
        reader.close()
    return out


def select_batches(chunk: BatchChunk, first: int, stop: int) -> BatchChunk:
    """A chunk holding batches [first, stop) of another, sharing nothing mutable with it."""
    s = chunk.scan
    start = int(s.positions[first])
    end = int(s.positions[stop - 1] + s.sizes[stop - 1])
    sub = BatchScan(
        positions=s.positions[first:stop] - start, headers=s.headers[first:stop].copy(), end=end - start, reason=0
    )
    return BatchChunk(chunk.buf[start:end], sub, chunk.base_position + start, chunk.source)


def head(chunk: BatchChunk, n: int) -> BatchChunk:
    """The first n batches of a chunk."""
    return select_batches(chunk, 0, n) if n < len(chunk.scan) else chunk


def bad_length_error(buf, at: int, base: int, max_batch_size: int, source: str) -> CorruptRecordError:
    length = struct.unpack_from(">i", buf, at + 8)[0] if len(buf) - at >= LOG_OVERHEAD else None
    return CorruptRecordError(
        f"batch length {length} is outside [{RECORD_BATCH_OVERHEAD - LOG_OVERHEAD}, "
        f"{max_batch_size - LOG_OVERHEAD}] (max.message.bytes)",
        source=source,
        position=base + at,
    )


def iter_chunks(
    read: Callable[[int, int], bytes],
    start: int,
    end: int,
    *,
    max_batch_size: int,
    source: str,
    first_chunk: int = FIRST_CHUNK_BYTES,
    keep_tail: bool = False,
    tail_ok: bool = True,
) -> Iterator[BatchChunk]:
    """Complete batches of the file bytes [start, end), read with `read(a, b)` in growing chunks.

    A batch length outside the limits raises. A batch that runs past `end` stops the walk quietly
    when `tail_ok` (a writer may be appending), else raises. With `keep_tail` (each read is a
    request) the cut-off batch a chunk ends with is kept for the next, so each byte is fetched once."""
    pos = start
    chunk = first_chunk
    carry = b""
    while pos < end:
        buf = _read_on(read, carry, pos, min(end, pos + max(chunk, len(carry) + 1)))
        scan = scan_batches(buf, max_batch_size=max_batch_size)
        if not len(scan):
            if scan.reason == SCAN_BAD_LENGTH:
                raise bad_length_error(buf, scan.end, pos, max_batch_size, source)
            whole = None
            if len(buf) >= LOG_OVERHEAD:
                (length,) = struct.unpack_from(">i", buf, 8)
                if pos + LOG_OVERHEAD + length <= end:
                    buf = _read_on(read, buf, pos, pos + LOG_OVERHEAD + length)
                    scan = scan_batches(buf, max_batch_size=max_batch_size)
                    whole = len(scan) > 0 and len(buf) == LOG_OVERHEAD + length
            if not whole:
                if tail_ok:
                    return  # a partial batch at the end: a torn tail, or a writer still appending
                raise CorruptRecordError(
                    f"partial batch: the file ends {end - pos} bytes into a batch, in a segment "
                    f"that is not the active one",
                    source=source,
                    position=pos,
                )
        yield BatchChunk(buf, scan, pos, source)
        if scan.reason == SCAN_BAD_LENGTH:
            raise bad_length_error(buf, scan.end, pos, max_batch_size, source)
        carry = buf[scan.end :] if keep_tail else b""
        pos += scan.end
        chunk = min(chunk * 4, MAX_CHUNK_BYTES)


def _read_on(read, have: bytes, pos: int, end: int) -> bytes:
    """Bytes [pos, end) of the file when `have` already holds those from pos on: only the rest is read."""
    if not have:
        return read(pos, end)
    if pos + len(have) >= end:
        return have[: end - pos]
    return have + read(pos + len(have), end)


def check_headers(
    chunk: BatchChunk, *, prev_last: int | None, base_offset: int, upper: int | None = None
) -> int | None:
    """Check the headers of a chunk's batches (not their CRCs): magic 2, offsets increasing from
    prev_last and inside [base_offset, upper), lastOffsetDelta and recordCount consistent. Raises
    CorruptRecordError at the first bad batch; returns the chunk's last offset (prev_last if empty)."""
    scan = chunk.scan
    if not len(scan):
        return prev_last
    h = scan.headers
    base = h["base_offset"].astype(np.int64)
    deltas = h["last_offset_delta"].astype(np.int64)
    counts = h["record_count"].astype(np.int64)
    last = base + deltas
    prev = np.empty_like(base)
    prev[0] = INT64_MIN if prev_last is None else prev_last
    prev[1:] = last[:-1]
    codecs = h["attributes"].astype(np.int64) & COMPRESSION_CODEC_MASK
    problems = [
        (h["magic"] != MAGIC_V2, lambda i: f"unsupported magic {int(h['magic'][i])} (only v2 batches are supported)"),
        (codecs > MAX_CODEC, lambda i: f"unknown compression codec {int(codecs[i])}"),
        (
            (deltas < 0) | (counts < 0) | (counts > deltas + 1),
            lambda i: f"inconsistent batch: recordCount {int(counts[i])}, lastOffsetDelta {int(deltas[i])}",
        ),
        (
            base <= prev,
            lambda i: f"offsets out of order: batch {int(base[i])}..{int(last[i])} after offset {int(prev[i])}",
        ),
        (
            (base < base_offset) | (last - base_offset > INT32_MAX) | (last < base),
            lambda i: (
                f"batch offsets {int(base[i])}..{int(last[i])} do not fit the segment with base offset {base_offset}"
            ),
        ),
    ]
    if upper is not None:
        problems.append(
            (
                last >= upper,
                lambda i: f"batch offsets {int(base[i])}..{int(last[i])} reach the next segment's base offset {upper}",
            )
        )
    first = None
    for mask, _ in problems:
        bad = np.flatnonzero(mask)
        if bad.size and (first is None or bad[0] < first):
            first = int(bad[0])
    if first is not None:
        message = next(m(first) for mask, m in problems if mask[first])
        raise CorruptRecordError(
            message, source=chunk.source, position=chunk.base_position + int(scan.positions[first])
        )
    return int(last[-1])


def crc_failures(buf, scan: BatchScan) -> np.ndarray:
    """Indexes of the batches whose stored CRC is not the CRC-32C of their bytes."""
    view = as_uint8(buf).data
    sizes = scan.sizes
    crcs = scan.headers["crc"]
    bad = [
        i
        for i, p in enumerate(scan.positions.tolist())  # one C call per batch
        if _crc32c.crc32c(view[p + ATTRIBUTES_OFFSET : p + int(sizes[i])]) != int(crcs[i])
    ]
    return np.asarray(bad, np.int64)


def find_valid_batch(
    read: Callable[[int, int], bytes], start: int, end: int, *, max_batch_size: int, after_offset: int | None
) -> int | None:
    """The file position of the first whole batch in (start, end) whose CRC holds and whose baseOffset
    is above after_offset, searching every byte position; None if there is none. Recovery uses it to
    tell a torn tail (nothing valid follows) from damage in the middle of committed data."""
    pos = start + 1
    while pos < end:
        window_end = min(end, pos + RESYNC_WINDOW + max_batch_size)
        buf = as_uint8(read(pos, window_end))
        n = len(buf) - RECORD_BATCH_OVERHEAD
        if n <= 0:
            return None
        cand = np.flatnonzero(buf[MAGIC_OFFSET : MAGIC_OFFSET + n] == MAGIC_V2)
        cand = cand[cand < min(n, RESYNC_WINDOW)]
        if cand.size:
            lengths = (
                (buf[cand + 8].astype(np.int64) << 24)
                | (buf[cand + 9].astype(np.int64) << 16)
                | (buf[cand + 10].astype(np.int64) << 8)
                | buf[cand + 11].astype(np.int64)
            )
            ok = (
                (lengths >= RECORD_BATCH_OVERHEAD - LOG_OVERHEAD)
                & (lengths + LOG_OVERHEAD <= max_batch_size)
                & (cand + LOG_OVERHEAD + lengths <= len(buf))
            )
            for c, length in zip(cand[ok].tolist(), lengths[ok].tolist(), strict=False):
                batch = buf[c : c + LOG_OVERHEAD + length]
                stored = int.from_bytes(batch[CRC_OFFSET : CRC_OFFSET + 4].tobytes(), "big")
                if _crc32c.crc32c(batch[ATTRIBUTES_OFFSET:].data) != stored:
                    continue
                base = int.from_bytes(batch[:8].tobytes(), "big", signed=True)
                if after_offset is None or base > after_offset:
                    return pos + c
        if window_end >= end:
            return None
        pos += RESYNC_WINDOW
    return None
