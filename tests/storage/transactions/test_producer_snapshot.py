"""Producer state snapshots against hand-built bytes of the layout in Kafka's ProducerSnapshot.json: int16 version 1,
uint32 CRC-32C of everything after it, int32 entry count, 46-byte big-endian entries. Kafka's own files and tool are
held to in test_kafka_producer_snapshots.py."""

from __future__ import annotations

import struct
import tracemalloc

import crc32c
import numpy as np
import pytest

from storage.common.constants import INT32_MAX
from storage.errors import CorruptSnapshotError
from storage.log_dirs import open_filesystem
from storage.transactions import producer_snapshot as ps

# producerId, epoch, lastSequence, lastOffset, offsetDelta, timestamp, coordinatorEpoch, currentTxnFirstOffset
ENTRY = struct.Struct(">qhiqiqiq")
ENTRIES = [
    (1000, 3, 41, 199, 4, 1_700_000_000_123, -1, -1),  # idempotent: its last batch, no transaction
    (1001, 0, 7, 220, 7, 1_700_000_000_456, 2, 213),  # a transaction open since 213
    (1002, 5, -1, -1, 0, 1_700_000_000_789, 4, -1),  # epoch bumped by a marker: no batch retained
    (2**62, 32767, INT32_MAX, 2**63 - 1, INT32_MAX, -(2**63), -(2**31), 2**63 - 1),  # the extremes
]


def snapshot_bytes(entries, *, version: int = 1, count: int | None = None, crc: int | None = None, tail=b"") -> bytes:
    body = struct.pack(">i", len(entries) if count is None else count) + b"".join(ENTRY.pack(*e) for e in entries)
    body += tail
    return struct.pack(">hI", version, crc32c.crc32c(body) if crc is None else crc) + body


def corrupt(data: bytes) -> CorruptSnapshotError:
    with pytest.raises(CorruptSnapshotError) as info:
        ps.decode_snapshot(data, source="/p/00000000000000000042.snapshot")
    assert "/p/00000000000000000042.snapshot" in str(info.value)
    return info.value


@pytest.fixture
def fs_dir(any_root):
    fs, path = open_filesystem(any_root)
    d = fs.join(path, "t-0")
    fs.mkdirs(d)
    return fs, d


def test_entry_is_46_bytes_in_the_schema_order():
    assert ENTRY.size == ps.ENTRY_SIZE == 46
    assert ps.PRODUCER_ENTRY_DTYPE.names == ps.ProducerStateEntry._fields


def test_decode_hand_built_bytes():
    arr = ps.decode_snapshot(snapshot_bytes(ENTRIES))
    assert ps.entries_of(arr) == [ps.ProducerStateEntry(*e) for e in ENTRIES]
    assert not arr.flags.writeable  # a view of the file's bytes: nobody changes it behind the reader
    assert ps.decode_snapshot(snapshot_bytes([])).shape == (0,)


def test_encode_is_the_hand_built_bytes():
    assert ps.encode_snapshot([ps.ProducerStateEntry(*e) for e in ENTRIES]) == snapshot_bytes(ENTRIES)
    assert ps.encode_snapshot(ENTRIES) == snapshot_bytes(ENTRIES)
    little = np.array(ENTRIES, dtype=ps.PRODUCER_ENTRY_DTYPE.newbyteorder("<"))  # any byte order goes in
    assert ps.encode_snapshot(little) == snapshot_bytes(ENTRIES)
    assert ps.encode_snapshot([]) == snapshot_bytes([])


def test_encode_refuses_values_that_do_not_fit():
    with pytest.raises(ValueError, match="out of range"):
        ps.encode_snapshot([(1, 2**15, 0, 0, 0, 0, 0, -1)])  # epoch is an int16
    wide = np.zeros(1, [(n, "i8") for n in ps.PRODUCER_ENTRY_DTYPE.names])
    wide["last_sequence"] = 2**31
    with pytest.raises(ValueError, match="last_sequence"):
        ps.encode_snapshot(wide)
    with pytest.raises(ValueError, match="fields"):
        ps.encode_snapshot(np.zeros(1, [("producer_id", "i8")]))


def test_bad_crc():
    data = bytearray(snapshot_bytes(ENTRIES))
    data[30] ^= 0x01  # a bit of the first entry
    e = corrupt(bytes(data))
    assert e.position == ps.CRC_OFFSET and "CRC-32C" in str(e)
    stored = struct.unpack_from(">I", data, 2)[0]
    assert e.position == 2 and f"stored {stored}" in str(e)


@pytest.mark.parametrize("version", [0, 2, -1])
def test_bad_version(version):
    e = corrupt(snapshot_bytes(ENTRIES, version=version))
    assert e.position == 0 and f"unknown version {version}" in str(e)


def test_truncated_header():
    for n in range(10):
        e = corrupt(snapshot_bytes(ENTRIES)[:n])
        assert e.position == n and "header" in str(e)


def test_truncated_entry():
    data = snapshot_bytes(ENTRIES)
    e = corrupt(data[: 10 + 46 + 20])  # the second entry is cut
    assert e.position == 10 + 46 and "4 entries" in str(e) and "1 whole entries" in str(e)


def test_count_more_than_the_entries():
    e = corrupt(snapshot_bytes(ENTRIES, count=5))
    assert e.position == 10 + 4 * 46


def test_count_fewer_than_the_entries():
    e = corrupt(snapshot_bytes(ENTRIES, count=3))  # the CRC covers the fourth: Kafka would ignore it
    assert e.position == 10 + 3 * 46 and "46 bytes follow" in str(e)
    e = corrupt(snapshot_bytes(ENTRIES, tail=b"\x00"))
    assert e.position == 10 + 4 * 46


def test_negative_count():
    e = corrupt(snapshot_bytes([], count=-1))
    assert e.position == 6 and "negative" in str(e)


def test_huge_count_in_a_small_file_allocates_nothing():
    data = snapshot_bytes([], count=INT32_MAX)  # 10 bytes, a valid CRC, 2**31-1 entries claimed (98 GB)
    tracemalloc.start()
    try:
        e = corrupt(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert e.position == 10 and f"{INT32_MAX} entries" in str(e)
    assert peak < 64 * 1024


def test_read_bounds_the_size_before_reading(fs_dir, monkeypatch):
    fs, d = fs_dir
    path = ps.write_snapshot(fs, d, 7, ENTRIES)
    monkeypatch.setattr(ps, "MAX_SNAPSHOT_BYTES", 10 + 4 * 46 - 1)

    def no_read(*a, **k):
        raise AssertionError("read before the size was checked")

    monkeypatch.setattr(fs, "read", no_read)
    with pytest.raises(CorruptSnapshotError, match="limit") as info:
        ps.read_snapshot(fs, path)
    assert info.value.position == 0 and fs.url(path) in str(info.value)


def test_read_names_the_file(fs_dir):
    fs, d = fs_dir
    path = fs.join(d, ps.snapshot_file_name(9))
    fs.write_atomic(path, snapshot_bytes(ENTRIES, version=2))
    with pytest.raises(CorruptSnapshotError) as info:
        ps.read_snapshot(fs, path)
    assert info.value.path == fs.url(path) and info.value.position == 0


def test_write_round_trip_atomic_and_named_by_offset(fs_dir, monkeypatch):
    fs, d = fs_dir
    calls = []
    real = fs.write_atomic
    monkeypatch.setattr(fs, "write_atomic", lambda p, data, **k: (calls.append(p), real(p, data, **k)))
    path = ps.write_snapshot(fs, d, 42, [ps.ProducerStateEntry(*e) for e in ENTRIES])
    assert fs.basename(path) == "00000000000000000042.snapshot" and calls == [path]
    assert fs.read(path) == snapshot_bytes(ENTRIES)
    assert ps.entries_of(ps.read_snapshot(fs, path)) == [ps.ProducerStateEntry(*e) for e in ENTRIES]
    with pytest.raises(ValueError):
        ps.write_snapshot(fs, d, -1, ENTRIES)


def test_list_latest_and_delete_before(fs_dir):
    fs, d = fs_dir
    for off in (120, 0, 37, 2**63 - 1):
        ps.write_snapshot(fs, d, off, ENTRIES[:1])
    fs.write_atomic(fs.join(d, "00000000000000000010.snapshot.deleted"), b"")
    fs.write_atomic(fs.join(d, "00000000000000000010.log"), b"")
    fs.write_atomic(fs.join(d, "5.snapshot"), b"")  # not Kafka's 20-digit name
    fs.mkdirs(fs.join(d, "00000000000000000011.snapshot"))
    assert [s.offset for s in ps.list_snapshots(fs, d)] == [0, 37, 120, 2**63 - 1]
    assert ps.latest_snapshot(fs, d) == (2**63 - 1, fs.join(d, "09223372036854775807.snapshot"))
    gone = ps.delete_snapshots_before(fs, d, 120)
    assert [s.offset for s in gone] == [0, 37]
    assert [s.offset for s in ps.list_snapshots(fs, d)] == [120, 2**63 - 1]
    assert ps.delete_snapshots_before(fs, d, 120) == []
    empty = fs.join(fs.dirname(d), "t-1")
    fs.mkdirs(empty)
    assert ps.latest_snapshot(fs, empty) is None
