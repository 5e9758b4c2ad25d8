"""RecordBatch v2 header: layout, attributes, CRC, and a vectorized walk over a buffer of batches.

Layout (big-endian), 61 bytes before the records:
baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 | crc u32 | attributes i16 |
lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64 | producerId i64 | producerEpoch i16 |
baseSequence i32 | recordCount i32.  The CRC (CRC-32C) covers attributes to the end of the batch.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import crc32c as _crc32c
import numpy as np

from ..common.constants import INT32_MAX, INT64_MIN
from ..common.jit import lazy_kernel
from ..errors import CorruptRecordError

MAGIC_V2 = 2
LOG_OVERHEAD = 12  # baseOffset + batchLength: the part of a batch not counted by batchLength
RECORD_BATCH_OVERHEAD = 61
MIN_BATCH_BYTES = RECORD_BATCH_OVERHEAD + 7  # a header and one record with null key and value, no headers
BASE_OFFSET_OFFSET = 0
LENGTH_OFFSET = 8
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
BASE_TIMESTAMP_OFFSET = 27
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43  # producerId int64, producerEpoch int16, baseSequence int32 (inside the CRC)
RECORDS_COUNT_OFFSET = 57

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1
NO_PARTITION_LEADER_EPOCH = -1

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG_MASK = 0x10
CONTROL_FLAG_MASK = 0x20
DELETE_HORIZON_FLAG_MASK = 0x40

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
assert HEADER_STRUCT.size == RECORD_BATCH_OVERHEAD

#: The 61-byte header as a numpy record, for reading many headers at once.
HEADER_DTYPE = np.dtype(
    [
        ("base_offset", ">i8"),
        ("batch_length", ">i4"),
        ("partition_leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("record_count", ">i4"),
    ]
)
assert HEADER_DTYPE.itemsize == RECORD_BATCH_OVERHEAD
HEADER_FIELDS: tuple[str, ...] = HEADER_DTYPE.names or ()

#: A writable run of batches: a bytearray, or a uint8 array the caller hands over (no copy).
MutableBytes = bytearray | np.ndarray


class CompressionType(enum.IntEnum):
    """Codec ids in attribute bits 0-2, with the names Kafka's tools print."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def kafka_name(self) -> str:
        return self.name.lower()

    @classmethod
    def for_name(cls, name: str) -> CompressionType:
        """Producer-side names: none, gzip, snappy, lz4, zstd ('uncompressed' accepted too)."""
        key = name.strip().lower()
        if key == "uncompressed":
            key = "none"
        for member in cls:
            if member.kafka_name == key:
                return member
        raise ValueError(f"unknown compression type {name!r}: expected one of none, gzip, snappy, lz4, zstd")


class TimestampType(enum.IntEnum):
    """Attribute bit 3. Values match Spark's Kafka source `timestampType` column."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @property
    def kafka_name(self) -> str:
        return "CreateTime" if self is TimestampType.CREATE_TIME else "LogAppendTime"


@dataclass(frozen=True)
class RecordBatchHeader:
    """One decoded batch header, plus the batch's byte position in its file or buffer."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    position: int = field(default=0, kw_only=True)

    @classmethod
    def read(cls, buf, pos: int = 0, *, source: str | None = None) -> RecordBatchHeader:
        if len(buf) - pos < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(
                f"truncated batch header: {len(buf) - pos} bytes, need {RECORD_BATCH_OVERHEAD}",
                source=source,
                position=pos,
            )
        return cls(*HEADER_STRUCT.unpack_from(buf, pos), position=pos)

    @property
    def size_in_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> CompressionType:
        return CompressionType(self.attributes & COMPRESSION_CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & TIMESTAMP_TYPE_MASK else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG_MASK)

    @property
    def delete_horizon_ms(self) -> int | None:
        """KIP-534: with bit 6 set, baseTimestamp holds the tombstone delete horizon."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_FLAG_MASK else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def compute_crc(batch) -> int:
    """CRC-32C of a whole batch's bytes from attributes to the end (what the crc field holds)."""
    return _crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:])


def stored_crc(batch) -> int:
    return struct.unpack_from(">I", batch, CRC_OFFSET)[0]


def set_base_offset(batch: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Assign offsets to an encoded batch: baseOffset is outside the CRC, so 8 bytes change."""
    struct.pack_into(">q", batch, pos + BASE_OFFSET_OFFSET, base_offset)


def set_partition_leader_epoch(batch: bytearray | memoryview, pos: int, epoch: int) -> None:
    struct.pack_into(">i", batch, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(batch: MutableBytes | memoryview, pos: int, size: int, now_ms: int) -> None:
    """Stamp LogAppendTime: set attribute bit 3 and maxTimestamp, then recompute the CRC."""
    view = as_uint8(batch).data[pos : pos + size]
    (attributes,) = struct.unpack_from(">h", view, ATTRIBUTES_OFFSET)
    struct.pack_into(">h", view, ATTRIBUTES_OFFSET, attributes | TIMESTAMP_TYPE_MASK)
    struct.pack_into(">q", view, MAX_TIMESTAMP_OFFSET, now_ms)
    struct.pack_into(">I", view, CRC_OFFSET, compute_crc(view))


# Stop reasons of the batch walk.
SCAN_OK = 0  # reached the end of the buffer exactly
SCAN_PARTIAL = 1  # the buffer ends inside a batch (a torn tail, or a read that stopped mid-batch)
SCAN_BAD_LENGTH = 2  # a batchLength below the minimum or above the limit


SMALL_WALK = 32  # a scan walks this many batches in plain Python before it loads the numba kernel


def _walk_batches(buf, start, end, max_batch_size, max_batches):
    """The batch walk: plain Python here (also for the first SMALL_WALK batches of any scan, so a process
    that only looks at a few batches never loads numba); `_walk_kernel()` is the same code compiled."""
    positions = np.empty(max_batches, np.int64)
    n = 0
    pos = start
    reason = 0
    while n < max_batches:
        if pos == end:
            reason = 0
            break
        if end - pos < LOG_OVERHEAD:
            reason = 1
            break
        length = (
            (np.int64(buf[pos + 8]) << 24)
            | (np.int64(buf[pos + 9]) << 16)
            | (np.int64(buf[pos + 10]) << 8)
            | np.int64(buf[pos + 11])
        )
        if length >= 2147483648:
            length -= 4294967296
        size = length + LOG_OVERHEAD
        if length < RECORD_BATCH_OVERHEAD - LOG_OVERHEAD or size > max_batch_size:
            reason = 2
            break
        if pos + size > end:
            reason = 1
            break
        positions[n] = pos
        n += 1
        pos += size
    return positions[:n], pos, reason


_walk_kernel = lazy_kernel(_walk_batches, nogil=True)  # compiled by numba (cached on disk) on first use


def _walk(arr, start: int, end: int, max_batch_size: int, max_batches: int):
    """Positions of the complete batches in arr[start:end]: up to SMALL_WALK in Python, the rest compiled."""
    positions, stop, reason = _walk_batches(arr, start, end, max_batch_size, min(max_batches, SMALL_WALK))
    if len(positions) < SMALL_WALK or max_batches <= SMALL_WALK or stop >= end:
        return positions, stop, reason
    more, stop, reason = _walk_kernel()(arr, stop, end, max_batch_size, max_batches - len(positions))
    return np.concatenate((positions, more)), stop, reason


@dataclass
class BatchScan:
    """Where the complete batches in a buffer are, and why the walk stopped."""

    positions: np.ndarray  # int64 start of each complete batch, relative to the buffer
    headers: np.ndarray  # HEADER_DTYPE records, one per position
    end: int  # buffer position just past the last complete batch
    reason: int  # SCAN_OK, SCAN_PARTIAL or SCAN_BAD_LENGTH (at `end`)

    def __len__(self) -> int:
        return len(self.positions)

    @property
    def sizes(self) -> np.ndarray:
        return self.headers["batch_length"].astype(np.int64) + LOG_OVERHEAD

    @property
    def last_offsets(self) -> np.ndarray:
        return self.headers["base_offset"].astype(np.int64) + self.headers["last_offset_delta"].astype(np.int64)

    def header(self, i: int, base_position: int = 0) -> RecordBatchHeader:
        row = self.headers[i]
        return RecordBatchHeader(
            *(int(row[name]) for name in HEADER_FIELDS), position=int(self.positions[i]) + base_position
        )


def as_uint8(buf) -> np.ndarray:
    """Any buffer (bytes, bytearray, memoryview, array) as a flat uint8 array over the same memory."""
    if isinstance(buf, np.ndarray):
        return buf.view(np.uint8).reshape(-1)
    return np.frombuffer(buf, dtype=np.uint8)


def scan_batches(
    buf, start: int = 0, end: int | None = None, *, max_batch_size: int = INT32_MAX, max_batches: int | None = None
) -> BatchScan:
    """Find the complete batches in `buf[start:end]` by walking batchLength fields (no CRC check).

    Headers are gathered into one numpy array; `reason` tells whether the walk hit the end, a
    partial batch, or a length outside [49, max_batch_size].
    """
    arr = as_uint8(buf)
    end = len(arr) if end is None else end
    if max_batches is None:
        max_batches = max(1, (end - start) // RECORD_BATCH_OVERHEAD + 1)
    positions, stop, reason = _walk(arr, start, end, max_batch_size, max_batches)
    if reason == SCAN_OK and stop != end:
        reason = SCAN_PARTIAL if end - stop > 0 else SCAN_OK
    if len(positions) and end - start >= 0:
        windows = np.lib.stride_tricks.sliding_window_view(arr, RECORD_BATCH_OVERHEAD)  # a view, no copy
        headers = windows[positions].copy().view(HEADER_DTYPE).reshape(-1)
    else:
        headers = np.empty(0, HEADER_DTYPE)
    return BatchScan(positions=positions, headers=headers, end=int(stop), reason=int(reason))


def _raise_at_first(
    bad: np.ndarray, describe: Callable[[int], str], scan: BatchScan, source: str | None, base_position: int
) -> None:
    """CorruptRecordError at the first scanned batch `bad` marks, naming its file position; describe(i) says
    what is wrong with batch i."""
    hits = np.flatnonzero(bad)
    if hits.size:
        i = int(hits[0])
        raise CorruptRecordError(describe(i), source=source, position=int(scan.positions[i]) + base_position)


def validate_batches(
    buf,
    scan: BatchScan,
    *,
    source: str | None = None,
    base_position: int = 0,
    check_crc: bool = True,
    check_offsets: bool = True,
    expected_first_offset: int | None = None,
) -> None:
    """Check magic, CRC, record counts and offset order of scanned batches; raise at the first bad one.

    An append's input carries placeholder offsets: check_offsets=False skips the order check.

    Offsets must increase batch to batch (compaction makes them sparse, never out of order).
    """
    if not len(scan):
        return
    h = scan.headers
    magic = h["magic"]
    _raise_at_first(
        magic != MAGIC_V2,
        lambda i: f"unsupported magic {int(magic[i])} (only v2 batches are supported)",
        scan,
        source,
        base_position,
    )
    codecs = h["attributes"].astype(np.int64) & COMPRESSION_CODEC_MASK
    _raise_at_first(
        codecs > CompressionType.ZSTD,
        lambda i: f"unknown compression codec {int(codecs[i])} in batch at offset {int(h['base_offset'][i])}",
        scan,
        source,
        base_position,
    )
    deltas = h["last_offset_delta"].astype(np.int64)
    counts = h["record_count"].astype(np.int64)
    # recordCount may be below lastOffsetDelta + 1 (compaction leaves gaps, even empty batches)
    _raise_at_first(
        (deltas < 0) | (counts < 0) | (counts > deltas + 1),
        lambda i: f"inconsistent batch: recordCount {int(counts[i])}, lastOffsetDelta {int(deltas[i])}",
        scan,
        source,
        base_position,
    )
    base = h["base_offset"].astype(np.int64)
    last = base + deltas
    prev_last = np.concatenate(
        ([(expected_first_offset - 1) if expected_first_offset is not None else INT64_MIN], last[:-1])
    )
    if check_offsets:
        _raise_at_first(
            base <= prev_last,
            lambda i: f"offsets out of order: batch baseOffset {int(base[i])} after lastOffset {int(prev_last[i])}",
            scan,
            source,
            base_position,
        )
    if check_crc:
        view = as_uint8(buf).data
        sizes = scan.sizes
        crcs = h["crc"]
        for i in range(len(scan)):  # one C call per batch, not per record
            p = int(scan.positions[i])
            actual = _crc32c.crc32c(view[p + ATTRIBUTES_OFFSET : p + int(sizes[i])])
            if actual != int(crcs[i]):
                raise CorruptRecordError(
                    f"CRC mismatch in batch at offset {int(base[i])}: stored {int(crcs[i])}, computed {actual}",
                    source=source,
                    position=p + base_position,
                )
