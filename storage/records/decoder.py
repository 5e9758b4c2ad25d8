"""Decode Kafka RecordBatch v2 bytes into one Arrow RecordBatch (the columns Spark's Kafka source has).

Batch headers are checked with numpy, CRCs and decompression run once per batch, and a numba kernel
frames every record of every batch in one call; Arrow arrays are then assembled from buffers.
"""

from __future__ import annotations

import crc32c as _crc32c
import numpy as np
import pyarrow as pa

from ..errors import CorruptRecordError, RecordTooLargeError
from . import _record_kernels as K
from .compression import decompress_many
from .record_batch import (
    ATTRIBUTES_OFFSET,
    COMPRESSION_CODEC_MASK,
    CONTROL_FLAG_MASK,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    SCAN_BAD_LENGTH,
    TIMESTAMP_TYPE_MASK,
    BatchScan,
    CompressionType,
    as_uint8,
    scan_batches,
)

DEFAULT_MAX_MESSAGE_BYTES = 1048588  # Kafka's max.message.bytes default

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
RECORD_SCHEMA = pa.schema([
    ("offset", pa.int64()),
    ("timestamp", pa.int64()),
    ("timestampType", pa.int32()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", HEADER_TYPE),
])

ERROR_MESSAGES = {
    K.E_TRUNCATED: "record runs past the end of the batch's records",
    K.E_VARINT: "varint longer than its maximum size",
    K.E_RECORD_LENGTH: "record length below the minimum record size",
    K.E_KEY_LENGTH: "invalid key length",
    K.E_VALUE_LENGTH: "invalid value length",
    K.E_HEADER_COUNT: "header count negative or larger than the record can hold",
    K.E_HEADER_KEY_LENGTH: "invalid header key length (header keys cannot be null)",
    K.E_HEADER_VALUE_LENGTH: "invalid header value length",
    K.E_RECORD_SIZE: "record fields do not end where the record length says",
    K.E_OFFSET_DELTA: "offsetDelta negative, not increasing, or above lastOffsetDelta",
    K.E_TRAILING: "bytes left after recordCount records",
}

_INT64_MIN = np.iinfo(np.int64).min
_INT64_MAX = np.iinfo(np.int64).max


def _clamp(value, default) -> int:
    return default if value is None else min(max(int(value), _INT64_MIN), _INT64_MAX)


def empty_records() -> pa.RecordBatch:
    """A RecordBatch with RECORD_SCHEMA and no rows."""
    return pa.RecordBatch.from_pylist([], schema=RECORD_SCHEMA)


def _validity_buffer(valid: np.ndarray):
    """(buffer or None, null_count) for a boolean validity vector."""
    nulls = int(valid.size - np.count_nonzero(valid))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _binary_array(typ, lens, offsets, data):
    vbuf, nulls = _validity_buffer(lens >= 0)
    return pa.Array.from_buffers(typ, lens.size, [vbuf, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def decode_batches(buf, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, verify_crc: bool = True,
                   source=None, base_position: int = 0, skip_control: bool = True,
                   min_offset: int | None = None, max_offset: int | None = None,
                   scan: BatchScan | None = None) -> pa.RecordBatch:
    """Decode every record of every complete batch in `buf` into a RECORD_SCHEMA RecordBatch.

    Records outside [min_offset, max_offset) are dropped; control batches are skipped when
    skip_control. Bad bytes raise CorruptRecordError naming `source`, the absolute byte position
    (base_position + position in buf) and the batch's base offset.
    """
    arr = as_uint8(buf)
    if scan is None:
        scan = scan_batches(arr)
    if scan.reason == SCAN_BAD_LENGTH:
        length = int.from_bytes(arr[scan.end + 8:scan.end + 12].tobytes(), "big", signed=True)
        if length >= RECORD_BATCH_OVERHEAD - 12:
            raise RecordTooLargeError(f"batch of {length + 12} bytes above the scan limit"
                                      f" ({source}, position {scan.end + base_position})")
        raise CorruptRecordError(f"invalid batchLength {length}", source=source, position=scan.end + base_position)
    if not len(scan):
        return empty_records()
    h = scan.headers
    positions = scan.positions.astype(np.int64)
    sizes = scan.sizes
    base = h["base_offset"].astype(np.int64)
    deltas = h["last_offset_delta"].astype(np.int64)
    counts = h["record_count"].astype(np.int64)
    attrs = h["attributes"].astype(np.int64)

    def fail(i, message):
        return CorruptRecordError(f"{message} in batch at offset {int(base[i])}", source=source,
                                  position=int(positions[i]) + base_position)

    bad = np.flatnonzero(h["magic"] != MAGIC_V2)
    if bad.size:
        i = int(bad[0])
        raise fail(i, f"unsupported magic {int(h['magic'][i])} (only v2 batches are supported)")
    sel = np.ones(len(scan), bool)
    if min_offset is not None:
        sel &= base + deltas >= min_offset
    if max_offset is not None:
        sel &= base < max_offset
    in_range = np.flatnonzero(sel)
    bad = in_range[(deltas[in_range] < 0) | (counts[in_range] < 0) | (counts[in_range] > deltas[in_range] + 1)]
    if bad.size:
        i = int(bad[0])
        raise fail(i, f"inconsistent batch: recordCount {int(counts[i])}, lastOffsetDelta {int(deltas[i])}")
    view = memoryview(arr)
    if verify_crc and in_range.size:
        starts = (positions[in_range] + ATTRIBUTES_OFFSET).tolist()
        ends = (positions[in_range] + sizes[in_range]).tolist()
        actual = np.fromiter((_crc32c.crc32c(view[a:b]) for a, b in zip(starts, ends)),  # one C call per batch
                             np.uint32, in_range.size)
        bad = np.flatnonzero(actual != h["crc"][in_range])
        if bad.size:
            i = int(in_range[bad[0]])
            raise fail(i, f"CRC mismatch: stored {int(h['crc'][i])}, computed {int(actual[bad[0]])}")
    if skip_control:
        sel &= (attrs & CONTROL_FLAG_MASK) == 0
    idx = np.flatnonzero(sel)
    if idx.size == 0:
        return empty_records()

    codecs = attrs[idx] & COMPRESSION_CODEC_MASK
    rec_start = positions[idx] + RECORD_BATCH_OVERHEAD
    rec_end = positions[idx] + sizes[idx]
    compressed = np.flatnonzero(codecs != 0)
    if compressed.size == 0:
        src, area_start, area_end = arr, rec_start, rec_end
    else:
        pieces = [arr[rec_start[j]:rec_end[j]] for j in range(idx.size)]
        bad = compressed[codecs[compressed] > CompressionType.ZSTD]
        if bad.size:
            raise fail(int(idx[bad[0]]), f"unknown compression codec {int(codecs[bad[0]])}")
        work = [(CompressionType(int(codecs[j])), view[int(rec_start[j]):int(rec_end[j])],
                 int(positions[idx[j]]) + base_position) for j in compressed.tolist()]
        # one bounded decompression per compressed batch
        for j, out in zip(compressed.tolist(), decompress_many(work, max_bytes=max_message_bytes, source=source)):
            pieces[j] = np.frombuffer(out, np.uint8)
        lengths = np.array([p.size for p in pieces], np.int64)
        area_end = np.cumsum(lengths)
        area_start = area_end - lengths
        if len(pieces) == 1:
            src = pieces[0]
        else:  # one buffer for the kernel, from Arrow's pool (it reuses memory; fresh pages are slow)
            src = np.frombuffer(pa.allocate_buffer(int(area_end[-1])), np.uint8)
            for j, piece in enumerate(pieces):
                src[area_start[j]:area_end[j]] = piece
    bad = np.flatnonzero(counts[idx] * K.MIN_RECORD_BYTES > area_end - area_start)
    if bad.size:  # checked before the kernel allocates by recordCount
        j = int(bad[0])
        raise fail(int(idx[j]), f"recordCount {int(counts[idx[j]])} cannot fit in"
                                f" {int(area_end[j] - area_start[j])} bytes of records")

    ts_override = np.where((attrs[idx] & TIMESTAMP_TYPE_MASK) != 0, h["max_timestamp"][idx].astype(np.int64),
                           _INT64_MIN)
    recs, hdrs, n, m, err, err_pos, err_batch = K.frame_records(
        src, area_start, area_end, counts[idx], deltas[idx], base[idx], h["base_timestamp"][idx].astype(np.int64),
        ts_override, _clamp(min_offset, _INT64_MIN), _clamp(max_offset, _INT64_MAX))
    if err:
        i = int(idx[err_batch])
        message = ERROR_MESSAGES.get(int(err), f"record error {err}")
        offset_in = int(err_pos - area_start[err_batch])
        if codecs[err_batch] == 0:  # the records are the file's own bytes: name the exact position
            raise CorruptRecordError(f"{message} in batch at offset {int(base[i])}", source=source,
                                     position=int(rec_start[err_batch]) + offset_in + base_position)
        raise fail(i, f"{message} at byte {offset_in} of the decompressed records")
    if n == 0:
        return empty_records()

    ok, ko, kd, vo, vd, hko, hkd, hvo, hvd, lo = K.gather_records(src, recs, n, hdrs, m)
    if not ok:
        raise RecordTooLargeError(f"decoded records exceed 2 GiB in one column ({source}); decode fewer batches")
    recs = recs[:, :n]
    hdrs = hdrs[:, :m]
    ts_type = ((attrs[idx] & TIMESTAMP_TYPE_MASK) != 0).astype(np.int32)[recs[2]]
    key = _binary_array(pa.binary(), recs[4], ko, kd)
    value = _binary_array(pa.binary(), recs[6], vo, vd)
    hk = _binary_array(pa.string(), hdrs[1], hko, hkd)
    if m:
        try:
            hk.validate(full=True)
        except pa.ArrowInvalid:
            raise CorruptRecordError("a header key is not valid UTF-8", source=source) from None
    entries = pa.StructArray.from_arrays([hk, _binary_array(pa.binary(), hdrs[3], hvo, hvd)],
                                         fields=list(HEADER_TYPE.value_type))
    vbuf, nulls = _validity_buffer(recs[7] > 0)  # no headers -> null, as Spark's Kafka source gives
    headers = pa.Array.from_buffers(HEADER_TYPE, n, [vbuf, pa.py_buffer(lo)], null_count=nulls, children=[entries])
    return pa.RecordBatch.from_arrays(
        [pa.array(recs[0].copy()), pa.array(recs[1].copy()), pa.array(ts_type), key, value, headers],
        schema=RECORD_SCHEMA)  # copies: the framing scratch (8 int64 per record) is not kept alive
