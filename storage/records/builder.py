"""Encode an Arrow table of records into Kafka RecordBatch v2 bytes.

Arrow buffers go to numba kernels as numpy views (no per-record Python): one pass sizes the
records and splits rows into batches, a second writes them; headers, compression and CRC-32C are
then done once per batch.
"""

from __future__ import annotations

from typing import Any

import crc32c as _crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..common.constants import INT32_MAX, INT64_MAX
from ..common.time import SYSTEM_TIME
from ..errors import InvalidConfigError, InvalidRecordError, RecordTooLargeError
from . import _record_kernels as K
from .compression import compress_many
from .record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_FLAG_MASK,
    HEADER_DTYPE,
    LOG_OVERHEAD,
    MAGIC_V2,
    MIN_BATCH_BYTES,
    RECORD_BATCH_OVERHEAD,
    SCAN_OK,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG_MASK,
    BatchScan,
    CompressionType,
    TimestampType,
)

DEFAULT_MAX_BATCH_BYTES = 1048576
_NO_SPLIT_LIMIT = INT32_MAX
_EMPTY_U8 = np.empty(0, np.uint8)
_EMPTY_I64 = np.empty(0, np.int64)
_TS_TO_MS = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1_000_000)}


def _scratch(size: int) -> np.ndarray:
    """A writable byte buffer from Arrow's memory pool, which reuses freed memory (fresh pages are
    costly to fault in, and these buffers are large and short-lived)."""
    return np.frombuffer(pa.allocate_buffer(size), np.uint8)


def _column(data, name: str):
    """A column of a Table or RecordBatch as one Array (None if absent)."""
    if name not in data.schema.names:
        return None
    col = data.column(name)
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks == 1:
            return col.chunk(0)
        return pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], col.type)
    return col


def _validity(arr: pa.Array, n: int) -> np.ndarray | None:
    """Boolean validity of `arr` (None when nothing is null)."""
    if arr.null_count == 0:
        return None
    if pa.types.is_null(arr.type):
        return np.zeros(n, bool)
    bits = np.frombuffer(arr.buffers()[0], np.uint8)
    return np.unpackbits(bits, bitorder="little", count=arr.offset + n)[arr.offset :].astype(bool)


def _binary_parts(arr: pa.Array, name: str):
    """(starts, lengths with -1 for null, data) of a binary-like array, zero-copy where possible."""
    n = len(arr)
    t = arr.type
    if pa.types.is_null(t):
        return np.zeros(n, np.int64), np.full(n, -1, np.int64), _EMPTY_U8
    if pa.types.is_string(t):
        arr = arr.view(pa.binary())
    elif pa.types.is_large_string(t):
        arr = arr.view(pa.large_binary())
    elif not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        try:
            arr = pc.cast(arr, pa.large_binary())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TypeError(f"column {name!r} must be binary or string, not {t}") from exc
    bufs = arr.buffers()
    otype = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = (
        np.frombuffer(bufs[1], otype)[arr.offset : arr.offset + n + 1].astype(np.int64) if n else np.zeros(1, np.int64)
    )
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else _EMPTY_U8
    starts = offsets[:-1]
    lens = np.diff(offsets)
    valid = _validity(arr, n)
    if valid is not None:
        lens[~valid] = -1
    return starts, lens, data


def _timestamps(arr: pa.Array | None, n: int, now_ms: int) -> np.ndarray:
    """Record timestamps as int64 epoch ms; nulls (or no column) become now_ms."""
    if arr is None:
        return np.full(n, now_ms, np.int64)
    t = arr.type
    if pa.types.is_timestamp(t):
        mul, div = _TS_TO_MS[t.unit]
        arr = arr.view(pa.int64())
    elif pa.types.is_integer(t):
        mul, div = 1, 1
        if t != pa.int64():
            arr = pc.cast(arr, pa.int64())
    else:
        raise TypeError(f"column 'timestamp' must be int64 milliseconds or a timestamp, not {t}")
    ts = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + n]
    if mul != 1:
        ts = ts * mul
    elif div != 1:
        ts = ts // div  # floor, as Instant.toEpochMilli does for times before 1970
    valid = _validity(arr, n)
    if valid is not None:
        ts = np.where(valid, ts, now_ms)
    return np.ascontiguousarray(ts, np.int64)


def _headers(arr: pa.Array | None, n: int):
    """Per-record (start, count) into flat header arrays, and each header's key/value parts."""
    if arr is None or arr.null_count == n:
        zeros = np.zeros(n, np.int64)
        return zeros, zeros, (_EMPTY_I64, _EMPTY_I64, _EMPTY_U8), (_EMPTY_I64, _EMPTY_I64, _EMPTY_U8)
    t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        raise TypeError(f"column 'headers' must be list<struct<key, value>>, not {t}")
    offsets = arr.offsets.to_numpy().astype(np.int64)
    hstart = offsets[:-1]
    hcount = np.diff(offsets)
    valid = _validity(arr, n)
    if valid is not None:
        hcount[~valid] = 0  # a null list may still span child elements
    child = arr.values
    names = [child.type.field(i).name for i in range(child.type.num_fields)]
    if "key" not in names or "value" not in names:
        raise TypeError(f"header structs need fields 'key' and 'value', got {names}")
    key = child.field("key")
    if not (pa.types.is_string(key.type) or pa.types.is_large_string(key.type)):
        try:  # header keys are Java Strings: their bytes must be UTF-8
            pc.cast(key, pa.large_string())
        except pa.ArrowInvalid:
            raise InvalidRecordError("header keys must be valid UTF-8") from None
    hk = _binary_parts(key, "headers.key")
    hv = _binary_parts(child.field("value"), "headers.value")
    struct_valid = _validity(child, len(child))
    if struct_valid is not None:  # a null header struct has no key: reported like a null key
        hk[1][~struct_valid] = -1
    return hstart, hcount, hk, hv


def _prepare(table, now_ms):
    if not isinstance(table, (pa.Table, pa.RecordBatch)):
        raise TypeError(f"expected a pyarrow Table or RecordBatch, not {type(table).__name__}")
    n = table.num_rows
    value = _column(table, "value")
    if value is None:
        raise InvalidRecordError("records need a 'value' column (binary or string; null for a tombstone)")
    key = _column(table, "key")
    vparts = _binary_parts(value, "value")
    kparts = (
        _binary_parts(key, "key") if key is not None else (np.zeros(n, np.int64), np.full(n, -1, np.int64), _EMPTY_U8)
    )
    ts = _timestamps(_column(table, "timestamp"), n, now_ms)
    headers = _headers(_column(table, "headers"), n)
    return n, ts, kparts, vparts, headers


def _encode(
    table,
    *,
    max_batch_bytes: int,
    split: bool,
    compression=CompressionType.NONE,
    base_offset=0,
    timestamp_type=TimestampType.CREATE_TIME,
    producer_id=-1,
    producer_epoch=-1,
    base_sequence=-1,
    partition_leader_epoch=-1,
    is_transactional=False,
    control=False,
    delete_horizon_ms=None,
    now_ms=None,
    compression_level=None,
    rows=None,
) -> tuple[np.ndarray, BatchScan]:
    """The encoder behind encode_records and build_batch; its keyword arguments, with their defaults, are
    the options both take. `rows`: the row numbers to encode, in this order (default: all, as they are), so a
    caller that routes rows to partitions encodes each partition's rows without first gathering them."""
    compression = (
        CompressionType.for_name(compression) if isinstance(compression, str) else CompressionType(compression)
    )
    timestamp_type = TimestampType(timestamp_type)
    if is_transactional and producer_id == -1:
        raise InvalidRecordError("transactional batches need a producer id")
    if now_ms is None:
        now_ms = SYSTEM_TIME.milliseconds()
    n, ts, (ks, kl, kd), (vs, vl, vd), (hstart, hcount, (hks, hkl, hkd), (hvs, hvl, hvd)) = _prepare(table, now_ms)
    if rows is not None:  # the kernels read each record's bytes where its starts point: permute those, not data
        rows = np.asarray(rows, np.int64)
        if len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= n):
            raise IndexError(f"rows to encode must be in [0, {n})")
        n = len(rows)
        ts, ks, kl, vs, vl, hstart, hcount = (a[rows] for a in (ts, ks, kl, vs, vl, hstart, hcount))
    if n == 0:
        return _EMPTY_U8, BatchScan(np.zeros(0, np.int64), np.zeros(0, HEADER_DTYPE), 0, SCAN_OK)
    use_fixed = delete_horizon_ms is not None
    fixed_base = int(delete_horizon_ms) if use_fixed else 0
    body, rec_bytes, bounds, nb, err, row = K.plan_batches(
        ts, kl, vl, hstart, hcount, hkl, hvl, use_fixed, fixed_base, max_batch_bytes, split, RECORD_BATCH_OVERHEAD
    )
    if err == K.P_NULL_HEADER_KEY:
        raise InvalidRecordError(f"row {row}: header keys cannot be null")
    if err == K.P_TOO_LARGE:
        raise RecordTooLargeError(f"the record alone exceeds the batch limit of {max_batch_bytes} bytes", row=int(row))
    if err == K.P_BATCH_TOO_LARGE:
        raise RecordTooLargeError(f"the batch would exceed {max_batch_bytes} bytes", row=int(row))
    bounds = bounds[: nb + 1]
    cum = np.concatenate(([0], np.cumsum(rec_bytes)))
    area = cum[bounds[1:]] - cum[bounds[:-1]]  # record bytes per batch
    counts = np.diff(bounds)
    max_ts = np.maximum.reduceat(ts, bounds[:-1])
    base_ts = np.full(nb, fixed_base, np.int64) if use_fixed else ts[bounds[:-1]]
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        max_ts[:] = now_ms
    attributes = (
        int(compression)
        | (TIMESTAMP_TYPE_MASK if timestamp_type is TimestampType.LOG_APPEND_TIME else 0)
        | (TRANSACTIONAL_FLAG_MASK if is_transactional else 0)
        | (CONTROL_FLAG_MASK if control else 0)
        | (DELETE_HORIZON_FLAG_MASK if use_fixed else 0)
    )
    if not 0 <= base_offset <= INT64_MAX + 1 - n:
        raise InvalidRecordError(f"base_offset {base_offset} out of range for {n} records")
    if not -1 <= base_sequence <= INT32_MAX:
        raise InvalidRecordError(f"base_sequence {base_sequence} out of range")
    heads = np.zeros(nb, HEADER_DTYPE)  # all 61-byte headers at once; the CRC is filled in last
    try:
        heads["base_offset"] = base_offset + bounds[:-1]
        heads["partition_leader_epoch"] = partition_leader_epoch
        heads["magic"] = MAGIC_V2
        heads["attributes"] = attributes
        heads["last_offset_delta"] = counts - 1
        heads["base_timestamp"] = base_ts
        heads["max_timestamp"] = max_ts
        heads["producer_id"] = producer_id
        heads["producer_epoch"] = producer_epoch
        # sequences wrap to 0 past Int.MaxValue, as Kafka's DefaultRecordBatch.incrementSequence does
        heads["base_sequence"] = -1 if base_sequence == -1 else (base_sequence + bounds[:-1]) & 0x7FFFFFFF
        heads["record_count"] = counts
    except OverflowError as exc:
        raise InvalidRecordError(f"batch header field out of range: {exc}") from None
    head_bytes = heads.view(np.uint8).reshape(nb, RECORD_BATCH_OVERHEAD)

    args = (body, ts, use_fixed, fixed_base, ks, kl, kd, vs, vl, vd, hstart, hcount, hks, hkl, hkd, hvs, hvl, hvd)
    if compression is CompressionType.NONE:
        heads["batch_length"] = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + area
        pos = np.concatenate(([0], np.cumsum(area + RECORD_BATCH_OVERHEAD)))
        out = _scratch(int(pos[-1]))
        K.write_records(out, pos[:-1] + RECORD_BATCH_OVERHEAD, bounds, nb, *args)
        K.put_rows(out, pos[:-1], head_bytes)
        view = out.data
        crcs = np.fromiter(
            (
                _crc32c.crc32c(view[a:b])
                for a, b in zip(  # one C call per batch
                    (pos[:-1] + ATTRIBUTES_OFFSET).tolist(), pos[1:].tolist(), strict=False
                )
            ),
            np.uint32,
            nb,
        )
        K.put_rows(out, pos[:-1] + CRC_OFFSET, crcs.astype(">u4").view(np.uint8).reshape(nb, 4))
        heads["crc"] = crcs
        return out, BatchScan(pos[:-1], heads, int(pos[-1]), SCAN_OK)

    scratch = _scratch(int(cum[-1]))
    starts = cum[bounds[:-1]]
    K.write_records(scratch, starts, bounds, nb, *args)
    view = scratch.data
    compressed = compress_many(
        compression,
        [view[a:b] for a, b in zip(starts.tolist(), (starts + area).tolist(), strict=True)],
        level=compression_level,
    )
    sizes = np.fromiter((memoryview(data).nbytes for data in compressed), np.int64, nb)
    if sizes.max() > _NO_SPLIT_LIMIT - RECORD_BATCH_OVERHEAD:
        raise RecordTooLargeError(f"a batch compresses to {int(sizes.max())} bytes, beyond a batch's int32 length")
    heads["batch_length"] = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + sizes
    tail = RECORD_BATCH_OVERHEAD - ATTRIBUTES_OFFSET
    tails = memoryview(head_bytes[:, ATTRIBUTES_OFFSET:].tobytes())  # CRC = crc32c(header tail + records)
    heads["crc"] = [
        _crc32c.crc32c(data, _crc32c.crc32c(tails[i * tail : (i + 1) * tail])) for i, data in enumerate(compressed)
    ]
    pos = np.concatenate(([0], np.cumsum(sizes + RECORD_BATCH_OVERHEAD)))
    out = _scratch(int(pos[-1]))
    K.put_rows(out, pos[:-1], head_bytes)
    for i, data in enumerate(compressed):  # per batch
        a = int(pos[i]) + RECORD_BATCH_OVERHEAD
        out[a : a + int(sizes[i])] = np.frombuffer(data, np.uint8)
    return out, BatchScan(pos[:-1], heads, int(pos[-1]), SCAN_OK)


def build_records(table, **options: Any) -> bytes:
    """encode_records (same keyword options) as bytes: rows as consecutive v2 batches, b"" for no rows."""
    return encode_records(table, **options)[0].tobytes()


def encode_records(
    table, *, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, **options: Any
) -> tuple[np.ndarray, BatchScan]:
    """Rows (columns value, key, timestamp, headers) as consecutive v2 batches of at most max_batch_bytes
    uncompressed each; batch i gets baseOffset (and baseSequence, unless -1) advanced by the rows before
    it. Returns the encoded buffer (a writable uint8 array) and its BatchScan, which
    Log.append(..., built=scan) takes over instead of re-scanning and re-checking CRCs. `options`: those
    of _encode (compression, base_offset, timestamp_type, producer fields, is_transactional, control: the
    control bit, for batches of control records such as transaction markers, delete_horizon_ms, now_ms,
    compression_level: Kafka's compression.<codec>.level, None for its default; rows: which rows, in which
    order)."""
    if max_batch_bytes < MIN_BATCH_BYTES:
        raise InvalidConfigError(
            f"max_batch_bytes {max_batch_bytes} is below the smallest batch, {MIN_BATCH_BYTES} bytes "
            f"(a {RECORD_BATCH_OVERHEAD}-byte header and one empty record)"
        )
    return _encode(table, max_batch_bytes=min(int(max_batch_bytes), _NO_SPLIT_LIMIT), split=True, **options)


def build_batch(table, **options: Any) -> bytes:
    """All rows as exactly one v2 batch (no splitting), with encode_records' options. Empty input -> b""."""
    return _encode(table, max_batch_bytes=_NO_SPLIT_LIMIT, split=False, **options)[0].tobytes()
