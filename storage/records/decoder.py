"""Decode Kafka RecordBatch v2 bytes into one Arrow RecordBatch (the columns Spark's Kafka source has).

Batch headers are checked with numpy, CRCs and decompression run once per batch, and a numba kernel
frames every record of every batch in one call; Arrow arrays are then assembled from buffers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import crc32c as _crc32c
import numpy as np
import pyarrow as pa

from ..common.constants import INT64_MAX, INT64_MIN
from ..errors import CorruptRecordError, KafkaLogError, RecordTooLargeError
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
RECORD_SCHEMA = pa.schema(
    [
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("timestampType", pa.int32()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADER_TYPE),
    ]
)

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


def _clamp(value, default) -> int:
    return default if value is None else min(max(int(value), INT64_MIN), INT64_MAX)


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
    return pa.Array.from_buffers(typ, lens.size, [vbuf, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


# Decompressed record bytes (plus PER_RECORD_BYTES a record) decoded in one group. A group's peak is
# about four times this (the decompressed pieces, their joined copy, the Arrow columns built from it,
# and the caller's previous group): 64 MiB, plus one batch of at most max.message.bytes.
DECODE_BUDGET_BYTES = 16 * 1024 * 1024
PER_RECORD_BYTES = 96  # framing scratch and Arrow columns per record, beyond its key, value and headers
MAX_WAVE = 64  # compressed batches decompressed together (in parallel), budget permitting


def decode_batches(buf, **options: Any) -> pa.RecordBatch:
    """Every record of every complete batch in `buf` as one RECORD_SCHEMA RecordBatch: iter_decoded's
    output (same keyword options) joined. For data of any size prefer iter_decoded, whose memory is
    bounded by a budget."""
    parts = list(iter_decoded(buf, **options))
    if not parts:
        return empty_records()
    if len(parts) == 1:
        return parts[0]
    return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]


def iter_decoded(
    buf,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    verify_crc: bool = True,
    source=None,
    base_position: int = 0,
    skip_control: bool = True,
    min_offset: int | None = None,
    max_offset: int | None = None,
    scan: BatchScan | None = None,
    budget: int = DECODE_BUDGET_BYTES,
    keep: np.ndarray | None = None,
) -> Iterator[pa.RecordBatch]:
    """Decode the records of the complete batches in `buf` as RECORD_SCHEMA RecordBatches, a group of
    batches at a time: a group holds at most `budget` bytes of decompressed records (each record
    counted PER_RECORD_BYTES more), plus one batch, so memory stays bounded whatever the batches
    decompress to (each is bounded by max_message_bytes).

    Records outside [min_offset, max_offset) are dropped; control batches are skipped when skip_control, and
    batch i when `keep` (a boolean per batch of the scan) is False (read_committed's aborted batches).
    At a bad batch, the records of the batches before it are yielded first, then CorruptRecordError
    (or RecordTooLargeError) names `source`, the absolute byte position (base_position + position in
    buf) and the batch's base offset.
    """
    arr = as_uint8(buf)
    if scan is None:
        scan = scan_batches(arr)
    stop_error: KafkaLogError | None = None
    if scan.reason == SCAN_BAD_LENGTH:
        length = int.from_bytes(arr[scan.end + 8 : scan.end + 12].tobytes(), "big", signed=True)
        if length >= RECORD_BATCH_OVERHEAD - 12:
            stop_error = RecordTooLargeError(
                f"batch of {length + 12} bytes above the scan limit ({source}, position {scan.end + base_position})"
            )
        else:
            stop_error = CorruptRecordError(
                f"invalid batchLength {length}", source=source, position=scan.end + base_position
            )
    if not len(scan):
        if stop_error is not None:
            raise stop_error
        return
    d = _Batches(arr, scan, source, base_position)
    sel = np.ones(len(scan), bool)
    if min_offset is not None:
        sel &= d.base + d.deltas >= min_offset
    if max_offset is not None:
        sel &= d.base < max_offset
    stop, error = d.first_bad(np.flatnonzero(sel), verify_crc)
    if error is not None:
        sel[stop:] = False
        stop_error = error
    if skip_control:
        sel &= (d.attrs & CONTROL_FLAG_MASK) == 0
    if keep is not None:
        if len(keep) != len(scan):
            raise ValueError(f"keep has {len(keep)} entries for {len(scan)} batches")
        sel &= np.asarray(keep, bool)
    idx = np.flatnonzero(sel)
    lo = _clamp(min_offset, INT64_MIN)
    hi = INT64_MAX if max_offset is None else _clamp(max_offset, INT64_MAX) - 1  # the last offset kept
    i = 0
    while i < idx.size:
        group, pieces, i, error = d.next_group(idx, i, budget, max_message_bytes)
        if group:
            yield from d.decode(np.asarray(group, np.int64), pieces, lo, hi)
        if error is not None:
            raise error
    if stop_error is not None:
        raise stop_error


class _Batches:
    """The batches of one buffer being decoded: their headers, and how to decode groups of them."""

    def __init__(self, arr: np.ndarray, scan: BatchScan, source, base_position: int):
        self.arr, self.view, self.scan = arr, arr.data, scan
        self.source, self.base_position = source, base_position
        h = scan.headers
        self.h = h
        self.positions = scan.positions.astype(np.int64)
        self.sizes = scan.sizes
        self.base = h["base_offset"].astype(np.int64)
        self.deltas = h["last_offset_delta"].astype(np.int64)
        self.counts = h["record_count"].astype(np.int64)
        self.attrs = h["attributes"].astype(np.int64)
        self.codecs = self.attrs & COMPRESSION_CODEC_MASK

    def fail(self, i: int, message: str) -> CorruptRecordError:
        return CorruptRecordError(
            f"{message} in batch at offset {int(self.base[i])}",
            source=self.source,
            position=int(self.positions[i]) + self.base_position,
        )

    def first_bad(self, in_range: np.ndarray, verify_crc: bool) -> tuple[int, CorruptRecordError | None]:
        """(index, error) of the first batch in range failing the header checks or its CRC; (n, None)."""
        h, n = self.h, len(self.scan)
        checks = [
            (
                h["magic"] != MAGIC_V2,
                lambda i: f"unsupported magic {int(h['magic'][i])} (only v2 batches are supported)",
            ),
            (
                (self.deltas < 0) | (self.counts < 0) | (self.counts > self.deltas + 1),
                lambda i: (
                    f"inconsistent batch: recordCount {int(self.counts[i])}, lastOffsetDelta {int(self.deltas[i])}"
                ),
            ),
            (self.codecs > CompressionType.ZSTD, lambda i: f"unknown compression codec {int(self.codecs[i])}"),
        ]
        first, message = n, None
        for mask, text in checks:
            bad = in_range[mask[in_range]]
            if bad.size and bad[0] < first:
                first, message = int(bad[0]), text
        if verify_crc and in_range.size:
            todo = in_range[in_range < first]
            starts = (self.positions[todo] + ATTRIBUTES_OFFSET).tolist()
            ends = (self.positions[todo] + self.sizes[todo]).tolist()
            actual = np.fromiter(
                (_crc32c.crc32c(self.view[a:b]) for a, b in zip(starts, ends, strict=False)),  # one C call per batch
                np.uint32,
                todo.size,
            )
            bad = np.flatnonzero(actual != h["crc"][todo])
            if bad.size:
                i, got = int(todo[bad[0]]), int(actual[bad[0]])
                return i, self.fail(i, f"CRC mismatch: stored {int(h['crc'][i])}, computed {got}")
        if message is None:
            return n, None
        return first, self.fail(first, message(first))

    def next_group(self, idx: np.ndarray, i: int, budget: int, max_bytes: int):
        """Batches idx[i:...] up to the budget with their record areas, decompressing as it goes:
        (batch indexes, pieces, next i, error at the batch after the group or None)."""
        group: list[int] = []
        pieces: list[np.ndarray | None] = []
        cost = 0
        while i < idx.size and cost < budget:
            j = int(idx[i])
            start = int(self.positions[j]) + RECORD_BATCH_OVERHEAD
            end = int(self.positions[j] + self.sizes[j])
            if self.codecs[j] == 0:
                group.append(j)
                pieces.append(None)  # the file's own bytes
                cost += end - start + PER_RECORD_BYTES * int(self.counts[j])
                i += 1
                continue
            room = max(1, min(MAX_WAVE, (budget - cost) // max(1, max_bytes)))
            wave: list[int] = []
            while i < idx.size and len(wave) < room and self.codecs[int(idx[i])] != 0:
                wave.append(int(idx[i]))
                i += 1
            work = [
                (
                    CompressionType(int(self.codecs[k])),
                    self.view[int(self.positions[k]) + RECORD_BATCH_OVERHEAD : int(self.positions[k] + self.sizes[k])],
                    int(self.positions[k]) + self.base_position,
                )
                for k in wave
            ]
            try:
                outs = decompress_many(work, max_bytes=max_bytes, source=self.source)
            except (CorruptRecordError, RecordTooLargeError):
                outs = []
                for item in work:  # find the batch at fault; keep the ones before it
                    try:
                        outs.append(decompress_many([item], max_bytes=max_bytes, source=self.source)[0])
                    except (CorruptRecordError, RecordTooLargeError) as e:
                        for kk, out in zip(wave, outs, strict=False):
                            group.append(kk)
                            pieces.append(np.frombuffer(out, np.uint8))
                        return group, pieces, idx.size, e
            for k, out in zip(wave, outs, strict=False):
                group.append(k)
                pieces.append(np.frombuffer(out, np.uint8))
                cost += len(out) + PER_RECORD_BYTES * int(self.counts[k])
        return group, pieces, i, None

    def decode(self, group: np.ndarray, pieces: list, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        """The records of one group; at a bad batch, those of the batches before it, then the error."""
        arr = self.arr
        rec_start = self.positions[group] + RECORD_BATCH_OVERHEAD
        rec_end = self.positions[group] + self.sizes[group]
        if all(p is None for p in pieces):
            src, area_start, area_end = arr, rec_start, rec_end
        else:
            parts = [arr[int(rec_start[j]) : int(rec_end[j])] if p is None else p for j, p in enumerate(pieces)]
            lengths = np.array([p.size for p in parts], np.int64)
            area_end = np.cumsum(lengths)
            area_start = area_end - lengths
            if len(parts) == 1:
                src = parts[0]
            else:  # one buffer for the kernel, from Arrow's pool (it reuses memory; fresh pages are slow)
                src = np.frombuffer(pa.allocate_buffer(int(area_end[-1])), np.uint8)
                for j, part in enumerate(parts):
                    src[area_start[j] : area_end[j]] = part
                    parts[j] = None
                    if pieces[j] is not None:  # in place: the decompressed copy is freed, a view of src stays
                        pieces[j] = src[area_start[j] : area_end[j]]
            del parts
        counts = self.counts[group]
        bad = np.flatnonzero(counts * K.MIN_RECORD_BYTES > area_end - area_start)
        if bad.size:  # checked before the kernel allocates by recordCount
            j = int(bad[0])
            yield from self._prefix(group, pieces, j, lo, hi)
            raise self.fail(
                int(group[j]),
                f"recordCount {int(counts[j])} cannot fit in {int(area_end[j] - area_start[j])} bytes of records",
            )
        attrs = self.attrs[group]
        ts_override = np.where(
            (attrs & TIMESTAMP_TYPE_MASK) != 0, self.h["max_timestamp"][group].astype(np.int64), INT64_MIN
        )
        recs, hdrs, n, m, err, err_pos, err_batch = K.frame_records(
            src,
            area_start,
            area_end,
            counts,
            self.deltas[group],
            self.base[group],
            self.h["base_timestamp"][group].astype(np.int64),
            ts_override,
            lo,
            hi,
        )
        if err:
            j = int(err_batch)
            yield from self._prefix(group, pieces, j, lo, hi)
            message = ERROR_MESSAGES.get(int(err), f"record error {err}")
            offset_in = int(err_pos - area_start[j])
            i = int(group[j])
            if pieces[j] is None:  # the records are the file's own bytes: name the exact position
                raise CorruptRecordError(
                    f"{message} in batch at offset {int(self.base[i])}",
                    source=self.source,
                    position=int(rec_start[j]) + offset_in + self.base_position,
                )
            raise self.fail(i, f"{message} at byte {offset_in} of the decompressed records")
        if n == 0:
            return
        ok, ko, kd, vo, vd, hko, hkd, hvo, hvd, lo_ = K.gather_records(src, recs, n, hdrs, m)
        if not ok:
            raise RecordTooLargeError(
                f"decoded records exceed 2 GiB in one column ({self.source}); decode fewer batches"
            )
        recs = recs[:, :n]
        hdrs = hdrs[:, :m]
        hk = _binary_array(pa.string(), hdrs[1], hko, hkd)
        if m:
            try:
                hk.validate(full=True)
            except pa.ArrowInvalid:
                j = self._bad_header_key_batch(hkd, hko, lo_, recs[2])
                yield from self._prefix(group, pieces, j, lo, hi)
                raise self.fail(int(group[j]), "a header key is not valid UTF-8") from None
        ts_type = ((attrs & TIMESTAMP_TYPE_MASK) != 0).astype(np.int32)[recs[2]]
        key = _binary_array(pa.binary(), recs[4], ko, kd)
        value = _binary_array(pa.binary(), recs[6], vo, vd)
        entries = pa.StructArray.from_arrays(
            [hk, _binary_array(pa.binary(), hdrs[3], hvo, hvd)], fields=list(HEADER_TYPE.value_type)
        )
        vbuf, nulls = _validity_buffer(recs[7] > 0)  # no headers -> null, as Spark's Kafka source gives
        headers = pa.Array.from_buffers(HEADER_TYPE, n, [vbuf, pa.py_buffer(lo_)], null_count=nulls, children=[entries])
        yield pa.RecordBatch.from_arrays(
            [pa.array(recs[0].copy()), pa.array(recs[1].copy()), pa.array(ts_type), key, value, headers],
            schema=RECORD_SCHEMA,
        )  # copies: the framing scratch (8 int64 per record) is not kept alive

    def _prefix(self, group: np.ndarray, pieces: list, j: int, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        """The records of the first j batches of a group (before a bad one)."""
        if j:
            yield from self.decode(group[:j], pieces[:j], lo, hi)

    @staticmethod
    def _bad_header_key_batch(data, offsets, list_offsets, record_batch) -> int:
        """The group position of the batch holding the first header key that is not UTF-8 (error path only)."""
        raw = bytes(data)
        for k in range(len(offsets) - 1):  # per header, only when one is bad
            try:
                raw[int(offsets[k]) : int(offsets[k + 1])].decode("utf-8")
            except UnicodeDecodeError:
                r = int(np.searchsorted(np.asarray(list_offsets), k, side="right")) - 1
                return int(record_batch[r])
        return 0
