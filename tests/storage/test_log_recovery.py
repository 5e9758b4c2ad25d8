"""Loading and recovery: torn tails, missing and corrupt indexes, CRC damage, leftover files."""

import os
import struct
import time

import pytest

from storage.errors import CorruptIndexError, CorruptRecordError, InvalidOffsetError
from storage.index import OffsetIndex
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kafka_recovery_entries, kp_batch, kp_parse

TP = TopicPartition("t", 0)


def records(n, ts0=0):
    return [(ts0 + i, b"key-%d" % i, b"value" * 10, []) for i in range(n)]


def write(root, batches=30, per=3, **config):
    lm = LogManager(root)
    lm.create_topic("t", 1, {k.replace("_", "."): str(v) for k, v in config.items()})
    with lm.open_log(TP, writable=True) as log:
        for j in range(batches):
            log.append(kp_batch(records(per, ts0=j * 10)))
    return lm


def path(root, base, suffix):
    return os.path.join(root, "t-0", f"{base:020d}{suffix}")


def read_file(p):
    with open(p, "rb") as f:
        return f.read()


def offsets(lm):
    with lm.open_log(TP) as log:
        data = b"".join(c.buf for c in log.read(log.log_start_offset))
    return [r[0] for b in kp_parse(data) for r in b["records"]]


def test_torn_tail_is_cut_at_the_last_whole_batch_and_indexes_rebuilt(root):
    lm = write(root, index_interval_bytes=200)
    p = path(root, 0, ".log")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size - 17)  # a crash in the middle of the last batch
    with lm.open_log(TP) as reader:  # a reader only looks: it stops at the partial batch
        assert reader.log_end_offset == 87
    assert os.path.getsize(p) == size - 17
    with lm.open_log(TP, writable=True) as log:
        assert log.log_end_offset == 87
        log.append(kp_batch(records(3, ts0=999)))
    assert offsets(lm) == list(range(90))
    data = read_file(p)
    assert read_file(path(root, 0, ".index")) == kafka_recovery_entries(kp_parse(data), 200, 0)[0]


def test_torn_tail_after_a_stale_recovery_point_is_found(root):
    lm = write(root, batches=10)
    with open(os.path.join(root, "recovery-point-offset-checkpoint"), "w") as f:
        f.write("0\n1\nt 0 9\n")  # the checkpoint says only offsets < 9 were flushed
    with open(path(root, 0, ".log"), "ab") as f:
        f.write(b"\x00" * 7)
    with lm.open_log(TP, writable=True) as log:
        assert log.log_end_offset == 30
    assert os.path.getsize(path(root, 0, ".log")) == sum(b["size"] for b in kp_parse(read_file(path(root, 0, ".log"))))


@pytest.mark.parametrize("damage", ["missing", "garbage", "pointing-past-end"])
def test_bad_index_is_rebuilt_equal_to_kafka(root, damage):
    lm = write(root, index_interval_bytes=150, segment_bytes=2500)
    with lm.open_log(TP) as log:
        bases = [s.base_offset for s in log.segments]
    base = bases[0]
    good = read_file(path(root, base, ".index"))
    assert good
    if damage == "missing":
        os.remove(path(root, base, ".index"))
        os.remove(path(root, base, ".timeindex"))
    elif damage == "garbage":
        with open(path(root, base, ".index"), "wb") as f:
            f.write(b"\x01\x02\x03")
    else:
        with open(path(root, base, ".index"), "wb") as f:
            f.write(struct.pack(">ii", 1, 10**6))
    with lm.open_log(TP, writable=True):
        pass
    assert read_file(path(root, base, ".index")) == good
    assert offsets(lm) == list(range(90))


def test_an_out_of_order_index_append_is_the_callers_mistake_not_damage(root):
    """Kafka's InvalidOffsetException: appending an offset no larger than the last entry is refused as
    InvalidOffsetError, which no rebuild path takes for a damaged index; the index stays as it was."""
    lm = write(root, index_interval_bytes=150)
    with lm.open_log(TP, writable=True) as log:
        seg = log.segments[-1]
        idx, tidx = seg.offset_index, seg.time_index
        last, entries, last_time = idx.last_offset, idx.entries, tidx.last_entry
        for bad in (lambda: idx.append(last, 0), lambda: tidx.maybe_append(last_time.timestamp + 1, last - 1)):
            with pytest.raises(InvalidOffsetError) as ei:
                bad()
            assert isinstance(ei.value, ValueError) and not isinstance(ei.value, CorruptIndexError)
        assert idx.entries == entries and tidx.last_entry == last_time and not seg.needs_rebuild
    assert offsets(lm) == list(range(90))
    full = OffsetIndex(lm.fs, os.path.join(root, "one-entry.index"), 0, max_index_size=8)
    full.append(0, 0)
    with pytest.raises(ValueError, match="full index") as ei:
        full.append(1, 100)
    assert not isinstance(ei.value, CorruptIndexError)


def test_crc_damage_with_valid_batches_after_it_is_reported_never_truncated(root):
    """Damage after the recovery point with whole, valid batches behind it is not a torn tail: Kafka would
    cut the log there (it has replicas); with no replica, the records after it are kept and the writer
    refuses to open, naming the file and position."""
    lm = write(root, batches=10)
    p = path(root, 0, ".log")
    batches = kp_parse(read_file(p))
    victim = batches[6]
    with open(os.path.join(root, "recovery-point-offset-checkpoint"), "w") as f:
        f.write("0\n1\nt 0 12\n")
    with open(p, "r+b") as f:
        f.seek(victim["position"] + victim["size"] - 3)
        f.write(b"\xff")
    before = read_file(p)
    with lm.open_log(TP) as log:  # a reader serves what comes before the damage, then reports it
        served = []
        with pytest.raises(CorruptRecordError, match=f"position {victim['position']}"):
            for batch in log.read_records(0):
                served += batch.column("offset").to_pylist()
        assert served == list(range(victim["base_offset"]))
    with pytest.raises(CorruptRecordError, match=f"position {victim['position']}.*not a torn tail"):
        lm.open_log(TP, writable=True)
    assert read_file(p) == before


def test_crc_damage_in_the_last_batch_is_a_torn_tail_and_is_cut(root, caplog):
    lm = write(root, batches=10)
    p = path(root, 0, ".log")
    victim = kp_parse(read_file(p))[-1]
    with open(os.path.join(root, "recovery-point-offset-checkpoint"), "w") as f:
        f.write("0\n1\nt 0 12\n")  # a crash: the last batch was written after the last checkpoint
    with open(p, "r+b") as f:
        f.seek(victim["position"] + victim["size"] - 3)
        f.write(b"\xff")
    with lm.open_log(TP, writable=True) as log:
        assert log.log_end_offset == victim["base_offset"]
    assert any(f"position {victim['position']}" in r.getMessage() for r in caplog.records)
    assert offsets(lm) == list(range(victim["base_offset"]))


def test_damage_before_the_recovery_point_is_not_rewritten_but_is_reported_on_read(root):
    lm = write(root, batches=10)
    p = path(root, 0, ".log")
    victim = kp_parse(read_file(p))[2]
    with open(p, "r+b") as f:
        f.seek(victim["position"] + 40)
        f.write(b"\xee")
    with lm.open_log(TP, writable=True) as log:  # recovery point is the log end: nothing truncated
        assert log.log_end_offset == 30
    from storage.records.decoder import decode_batches

    with lm.open_log(TP) as log:
        with pytest.raises(CorruptRecordError, match="CRC"):
            for c in log.read(0):
                decode_batches(c.buf, scan=c.scan, source=c.source, base_position=c.base_position)


def test_leftover_files_are_handled(root):
    lm = write(root, batches=6, segment_bytes=600)
    d = os.path.join(root, "t-0")
    with lm.open_log(TP) as log:
        bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3
    # .cleaned output of an interrupted compaction: removed
    open(path(root, 999, ".log.cleaned"), "wb").close()
    # temp file of an interrupted atomic write: removed
    open(os.path.join(d, "x.1234abcd.tmp"), "wb").close()
    # .deleted files: removed once file.delete.delay.ms has passed, kept before
    old = path(root, 500, ".log.deleted")
    open(old, "wb").close()
    os.utime(old, (time.time() - 120, time.time() - 120))
    fresh = path(root, 501, ".log.deleted")
    open(fresh, "wb").close()
    # an orphaned index: removed
    open(path(root, 777, ".index"), "wb").close()
    with lm.open_log(TP, writable=True):
        pass
    names = set(os.listdir(d))
    assert f"{999:020d}.log.cleaned" not in names and "x.1234abcd.tmp" not in names
    assert f"{500:020d}.log.deleted" not in names and f"{501:020d}.log.deleted" in names
    assert f"{777:020d}.index" not in names
    assert offsets(lm) == list(range(18))


def test_swap_file_completes_the_replacement(root):
    """A crash after `.cleaned` became `.swap`: the swap replaces the segments it covers."""
    lm = write(root, batches=6, segment_bytes=600)
    with lm.open_log(TP) as log:
        bases = [s.base_offset for s in log.segments]
    # merge the first two segments into one swap file at the first base offset
    merged = read_file(path(root, bases[0], ".log")) + read_file(path(root, bases[1], ".log"))
    with open(path(root, bases[0], ".log.swap"), "wb") as f:
        f.write(merged)
    with lm.open_log(TP, writable=True) as log:
        assert [s.base_offset for s in log.segments] == [bases[0]] + bases[2:]
    assert not os.path.exists(path(root, bases[1], ".log"))
    assert offsets(lm) == list(range(18))


def test_directory_written_by_another_kafka_implementation(root):
    """Only .log files (offsets assigned by the writer), no indexes, no checkpoints, no topic file."""
    d = os.path.join(root, "events-0")
    os.makedirs(d)
    data = bytearray()
    next_offset = 0
    for j in range(40):
        b = bytearray(kp_batch(records(2, ts0=j)))
        struct.pack_into(">q", b, 0, next_offset)
        next_offset += 2
        data += b
    with open(os.path.join(d, f"{0:020d}.log"), "wb") as f:
        f.write(data)
    lm = LogManager(root)
    assert lm.topics() == ["events"]
    tp = TopicPartition("events", 0)
    with lm.open_log(tp, writable=True) as log:
        assert log.log_end_offset == 80
    ref = kafka_recovery_entries(kp_parse(bytes(data)), 4096, 0)[0]
    assert read_file(os.path.join(d, f"{0:020d}.index")) == ref and ref


def test_corrupt_batch_length_in_tail_is_cut(root):
    lm = write(root, batches=5)
    with open(path(root, 0, ".log"), "ab") as f:
        f.write(struct.pack(">qi", 15, 2**30) + b"\x00" * 100)  # claims a 1 GiB batch
    with lm.open_log(TP, writable=True) as log:
        assert log.log_end_offset == 15
    assert offsets(lm) == list(range(15))


@pytest.mark.parametrize("damage", ["flipped-byte", "truncated"])
def test_damaged_swap_is_set_aside_and_the_originals_stay(root, damage, caplog):
    """A `.swap` is checked whole before it replaces anything: a damaged one replaces nothing, and the
    segments after it are never touched."""
    lm = write(root, batches=6, segment_bytes=600)
    with lm.open_log(TP) as log:
        bases = [s.base_offset for s in log.segments]
    merged = bytearray(read_file(path(root, bases[0], ".log")) + read_file(path(root, bases[1], ".log")))
    if damage == "flipped-byte":
        merged[len(merged) // 2] ^= 0x10
    else:
        merged = merged[:-20]
    with open(path(root, bases[0], ".log.swap"), "wb") as f:
        f.write(merged)
    assert offsets(lm) == list(range(18))  # a reader passes over the damaged swap
    with lm.open_log(TP, writable=True) as log:
        assert [s.base_offset for s in log.segments] == bases
    names = os.listdir(os.path.join(root, "t-0"))
    assert f"{bases[0]:020d}.log.swap.damaged" in names and f"{bases[0]:020d}.log.swap" not in names
    assert any("set aside" in r.getMessage() for r in caplog.records)
    assert offsets(lm) == list(range(18))


def test_damaged_swap_brings_back_the_originals_it_had_moved(root):
    """A crash in the middle of a swap whose output is damaged: originals already renamed to `.deleted`
    are read from there by readers and renamed back by the next writer."""
    lm = write(root, batches=6, segment_bytes=600)
    with lm.open_log(TP) as log:
        bases = [s.base_offset for s in log.segments]
    merged = bytearray(read_file(path(root, bases[0], ".log")) + read_file(path(root, bases[1], ".log")))
    merged[100] ^= 0xFF
    with open(path(root, bases[0], ".log.swap"), "wb") as f:
        f.write(merged)
    for suffix in (".log", ".index", ".timeindex"):
        os.rename(path(root, bases[1], suffix), path(root, bases[1], suffix + ".deleted"))
    old = os.path.join(root, "t-0", f"{bases[1]:020d}.log.deleted")
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # past file.delete.delay.ms: still not removed
    assert offsets(lm) == list(range(18))
    with lm.open_log(TP, writable=True) as log:
        assert [s.base_offset for s in log.segments] == bases
    assert os.path.exists(path(root, bases[1], ".log")) and not os.path.exists(old)
    assert offsets(lm) == list(range(18))


@pytest.mark.parametrize("segments", [1, 3])
def test_index_files_preallocated_as_a_live_broker_leaves_them(root, segments, caplog):
    """A broker preallocates its active segment's indexes (10 MiB of zeros) and trims them only on roll
    and clean shutdown: readers use the entries before the zeros, silently, and find what the full
    indexes find; a writer trims the zeros."""
    lm = write(root, batches=30, segment_bytes=3000 if segments == 3 else 1 << 20, index_interval_bytes=300)
    bases = sorted(int(f[:20]) for f in os.listdir(os.path.join(root, "t-0")) if f.endswith(".log"))
    assert len(bases) == segments
    with lm.open_log(TP) as log:
        want = [(o, log.offset_for_timestamp(o * 10 // 3 + 1)) for o in range(0, 90, 7)]
        want_ts = log.offset_for_timestamp(-1)
        want_largest = log.segments[-1].largest_timestamp
    active = bases[-1]
    full = {sfx: read_file(path(root, active, sfx)) for sfx in (".index", ".timeindex")}
    assert len(full[".index"]) >= 16 and len(full[".timeindex"]) >= 24
    for sfx, size in ((".index", 10 << 20), (".timeindex", (10 << 20) // 12 * 12)):
        with open(path(root, active, sfx), "ab") as f:
            f.truncate(size)
    caplog.clear()
    with lm.open_log(TP) as log:
        seg = log.segments[-1]
        assert seg.offset_index.entries == len(full[".index"]) // 8
        assert seg.time_index.entries == len(full[".timeindex"]) // 12
        assert [(o, log.offset_for_timestamp(o * 10 // 3 + 1)) for o in range(0, 90, 7)] == want
        assert log.offset_for_timestamp(-1) == want_ts
        assert [r[0] for r in kp_parse(b"".join(c.buf for c in log.read(50)))[0]["records"]][:1] <= [50]
        assert seg.largest_timestamp == want_largest == 292
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    assert offsets(lm) == list(range(90))
    with lm.open_log(TP, writable=True):
        pass
    assert {sfx: read_file(path(root, active, sfx)) for sfx in full} == full


def test_an_empty_segment_with_preallocated_zero_indexes_has_no_entries(root, caplog):
    lm = LogManager(root)
    lm.create_topic("t", 1)
    for sfx, size in ((".index", 10 << 20), (".timeindex", (10 << 20) // 12 * 12)):
        with open(path(root, 0, sfx), "wb") as f:
            f.truncate(size)
    with lm.open_log(TP) as log:
        assert log.segments[0].offset_index.entries == 0 and log.segments[0].time_index.entries == 0
        assert log.segments[0].largest_timestamp == -1
        assert log.offset_for_timestamp(0) is None
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text


@pytest.mark.parametrize(
    ("suffix", "fmt"),
    [(".index", ">ii"), (".timeindex", ">qi")],  # OffsetIndex (offset, position), TimeIndex (timestamp, offset)
)
def test_truncating_into_unflushed_entries_writes_them_big_endian(root, suffix, fmt):
    """Entries appended after a flush and kept by a truncation are written from the in-memory cache: its rows must
    stay big-endian (numpy 2's concatenate made them native-order, and the file got little-endian entries)."""
    from storage.index import TimeIndex
    from storage.log_dirs import open_filesystem

    fs, d = open_filesystem(root)
    fs.mkdirs(d)
    path = fs.join(d, "00000000000000000000" + suffix)
    if suffix == ".index":
        index = OffsetIndex(fs, path, 0, 1024)
        add = index.append  # (offset, position)
    else:
        index = TimeIndex(fs, path, 0, 1024)
        add = index.maybe_append  # (timestamp, offset)
    add(1, 10)
    index.flush()
    add(2, 20)
    add(3, 30)
    index.truncate_to_entries(2)
    index.flush()
    assert fs.read(path) == struct.pack(fmt, 1, 10) + struct.pack(fmt, 2, 20)
