"""Kafka's producer state snapshot file, `<20-digit offset>.snapshot` beside a partition's segments.

Kafka (ProducerStateManager.writeSnapshot, schema storage/src/main/resources/message/ProducerSnapshot.json)
writes the producer table as of the offset in the file name (exclusive: it covers every batch below it) at each
segment roll and at a clean shutdown; a loader starts from the latest one instead of replaying the whole log.
"""

from __future__ import annotations

import logging
import struct
from typing import NamedTuple

import crc32c as _crc32c
import numpy as np

from ..common.constants import INT32_MAX
from ..errors import CorruptSnapshotError
from ..fs.filesystem import LogFileSystem
from ..topic_partition import PRODUCER_SNAPSHOT_FILE_SUFFIX, parse_segment_file, segment_file_name

logger = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1  # ProducerSnapshot's only valid version
VERSION_OFFSET = 0
CRC_OFFSET = VERSION_OFFSET + 2
PRODUCER_ENTRIES_OFFSET = CRC_OFFSET + 4  # the CRC covers the file from here to its end
HEADER_SIZE = PRODUCER_ENTRIES_OFFSET + 4  # version, CRC, the entry array's int32 count
_HEADER = struct.Struct(">hIi")

#: One producer, in the schema's field order (big-endian, packed: 46 bytes).
PRODUCER_ENTRY_DTYPE = np.dtype(
    [
        ("producer_id", ">i8"),
        ("epoch", ">i2"),
        ("last_sequence", ">i4"),
        ("last_offset", ">i8"),  # -1: no batch retained (the entry has no BatchMetadata)
        ("offset_delta", ">i4"),  # lastOffset - baseOffset of that batch
        ("timestamp", ">i8"),  # the entry's lastTimestamp (a batch's max timestamp, or its last marker's)
        ("coordinator_epoch", ">i4"),
        ("current_txn_first_offset", ">i8"),  # -1 (any negative): no transaction open
    ]
)
ENTRY_SIZE = PRODUCER_ENTRY_DTYPE.itemsize  # 46

#: Refuse larger files before reading them (about 5.8 million producers on one partition); a hostile file
#: must not make us allocate without bound.
MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024


class ProducerStateEntry(NamedTuple):
    """One entry as written, fields in file order (Kafka's ProducerSnapshot.ProducerEntry)."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int
    current_txn_first_offset: int


class SnapshotFile(NamedTuple):
    """A snapshot found in a partition directory: the offset its name carries, and its path."""

    offset: int
    path: str


# ---------------------------------------------------------------- bytes


def encode_snapshot(entries) -> bytes:
    """The file's bytes: version 1, CRC-32C of the rest, the entry count, the entries.

    `entries` is a structured array with PRODUCER_ENTRY_DTYPE's field names (any integer types, any byte
    order) or an iterable of ProducerStateEntry-shaped tuples; a value that does not fit its field raises.
    """
    arr = _as_entries(entries)
    body = bytearray(HEADER_SIZE + arr.nbytes)
    _HEADER.pack_into(body, 0, SNAPSHOT_VERSION, 0, len(arr))
    body[HEADER_SIZE:] = arr.tobytes()
    struct.pack_into(">I", body, CRC_OFFSET, _crc32c.crc32c(memoryview(body)[PRODUCER_ENTRIES_OFFSET:]))
    return bytes(body)


def decode_snapshot(data: bytes, *, source: str = "<snapshot>") -> np.ndarray:
    """The entries of a snapshot file's bytes, as a read-only array of PRODUCER_ENTRY_DTYPE, in file order.

    Checked before use: the header is whole, the version is 1, the count is what the size holds (no partial
    entry, no trailing bytes) and the CRC-32C matches. Kafka's reader ignores bytes after the last entry (the
    CRC covers them); its writer never leaves any, so here they are an error.
    """
    size = len(data)
    if size < HEADER_SIZE:
        raise CorruptSnapshotError(
            f"the file is {size} bytes, shorter than the {HEADER_SIZE}-byte header", path=source, position=size
        )
    version, stored_crc, count = _HEADER.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(
            f"unknown version {version} (expected {SNAPSHOT_VERSION})", path=source, position=VERSION_OFFSET
        )
    if count < 0:
        raise CorruptSnapshotError(f"negative entry count {count}", path=source, position=HEADER_SIZE - 4)
    whole = (size - HEADER_SIZE) // ENTRY_SIZE
    if count > whole:
        raise CorruptSnapshotError(
            f"the header counts {count} entries but the file holds {whole} whole entries "
            f"({size - HEADER_SIZE} bytes after the header; an entry is {ENTRY_SIZE})",
            path=source,
            position=HEADER_SIZE + whole * ENTRY_SIZE,
        )
    end = HEADER_SIZE + count * ENTRY_SIZE
    if size != end:
        raise CorruptSnapshotError(
            f"{size - end} bytes follow the last of the {count} entries", path=source, position=end
        )
    computed = _crc32c.crc32c(memoryview(data)[PRODUCER_ENTRIES_OFFSET:])
    if computed != stored_crc:
        raise CorruptSnapshotError(
            f"CRC-32C mismatch: stored {stored_crc}, computed {computed}", path=source, position=CRC_OFFSET
        )
    return np.frombuffer(data, PRODUCER_ENTRY_DTYPE, count=count, offset=HEADER_SIZE)


def _as_entries(entries) -> np.ndarray:
    if isinstance(entries, np.ndarray):
        if entries.dtype.names is None or set(entries.dtype.names) != set(PRODUCER_ENTRY_DTYPE.names or ()):
            raise ValueError(f"producer entries need the fields {PRODUCER_ENTRY_DTYPE.names}, got {entries.dtype}")
        out = np.empty(len(entries), PRODUCER_ENTRY_DTYPE)
        for name in PRODUCER_ENTRY_DTYPE.names or ():
            col = entries[name]
            info = np.iinfo(PRODUCER_ENTRY_DTYPE[name])
            if col.dtype.kind not in "iu" or (len(col) and (col.min() < info.min or col.max() > info.max)):
                raise ValueError(f"producer entry field {name} must hold integers that fit {info.dtype}")
            out[name] = col
    else:
        try:
            out = np.array([tuple(e) for e in entries], dtype=PRODUCER_ENTRY_DTYPE)
        except OverflowError as e:
            raise ValueError(f"a producer entry field is out of range: {e}") from None
    if len(out) > INT32_MAX:
        raise ValueError(f"{len(out)} producer entries exceed the int32 count")
    return out


# ---------------------------------------------------------------- files


def snapshot_file_name(offset: int) -> str:
    """`00000000000000000042.snapshot`: the name of the snapshot taken at `offset`."""
    return segment_file_name(offset, PRODUCER_SNAPSHOT_FILE_SUFFIX)


def read_snapshot(fs: LogFileSystem, path: str) -> np.ndarray:
    """The entries of the snapshot file at `path` (see decode_snapshot); the size is bounded before reading."""
    url = fs.url(path)
    size = fs.size(path)
    if size > MAX_SNAPSHOT_BYTES:
        raise CorruptSnapshotError(
            f"the file is {size} bytes, over the {MAX_SNAPSHOT_BYTES}-byte limit", path=url, position=0
        )
    return decode_snapshot(fs.read(path), source=url)


def write_snapshot(fs: LogFileSystem, dir: str, offset: int, entries, *, durable: bool = True) -> str:
    """Write the snapshot at `offset` into partition directory `dir` in one step (tmp + rename where the
    store has it, so no reader sees a partial file); returns its path."""
    path = fs.join(dir, snapshot_file_name(offset))
    fs.write_atomic(path, encode_snapshot(entries), durable=durable)
    return path


def list_snapshots(fs: LogFileSystem, dir: str) -> list[SnapshotFile]:
    """The snapshots in `dir` by offset, lowest first (Kafka's listSnapshotFiles; `.deleted` ones left out)."""
    out = []
    for info in fs.listdir(dir):
        parsed = None if info.is_dir else parse_segment_file(info.name)
        if parsed is not None and parsed.suffix == PRODUCER_SNAPSHOT_FILE_SUFFIX and not parsed.extra:
            out.append(SnapshotFile(parsed.base_offset, fs.join(dir, info.name)))
    return sorted(out)


def latest_snapshot(fs: LogFileSystem, dir: str) -> SnapshotFile | None:
    """The snapshot with the highest offset, the one a loader starts from (None when there is none)."""
    snapshots = list_snapshots(fs, dir)
    return snapshots[-1] if snapshots else None


def latest_valid_snapshot(fs: LogFileSystem, dir: str, start: int, end: int) -> tuple[SnapshotFile, np.ndarray] | None:
    """The latest snapshot whose offset lies in [start, end] (a partition's log start and end) and that reads
    back whole, with its entries; a bad one is logged and an older one tried (Kafka's loader). None: none."""
    for snap in reversed(list_snapshots(fs, dir)):
        if not start <= snap.offset <= end:
            continue
        try:
            return snap, read_snapshot(fs, snap.path)
        except (CorruptSnapshotError, OSError) as e:
            logger.warning("ignoring producer snapshot %s (%s); trying an older one", fs.url(snap.path), e)
    return None


def delete_snapshots_before(fs: LogFileSystem, dir: str, offset: int) -> list[SnapshotFile]:
    """Delete the snapshots below `offset` (exclusive, Kafka's deleteSnapshotsBefore: called with the log
    start offset, so the snapshots of deleted segments go and the latest stays); returns those deleted."""
    gone = [s for s in list_snapshots(fs, dir) if s.offset < offset]
    fs.delete_many([s.path for s in gone])
    return gone


def entries_of(arr: np.ndarray) -> list[ProducerStateEntry]:
    """The entries of a decoded array as ProducerStateEntry tuples (for callers that want Python ints)."""
    return [ProducerStateEntry(*row) for row in arr.tolist()]
