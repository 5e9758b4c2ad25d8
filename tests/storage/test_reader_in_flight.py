"""A reader that listed a log keeps reading what it listed while retention deletes segments or a
cleaner swap puts a new file under a segment's name (Kafka readers hold open file handles)."""

import os

import pytest

from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kp_batch

TP = TopicPartition("t", 0)


def fill(root, **config):
    lm = LogManager(root)
    lm.create_topic("t", 1, {"segment.bytes": "600", "retention.ms": "-1", **config})
    values = []
    with lm.open_log(TP, writable=True) as log:
        for i in range(40):
            v = f"value-{i:04d}".encode()
            log.append(kp_batch([(1_700_000_000_000 + i, None, v, [])]))
            values.append(v)
        assert len(log.segments) >= 5
    return lm, values


def test_retention_under_a_reader_in_flight(root):
    lm, values = fill(root)
    with lm.open_log(TP) as reader:
        it = reader.read_records(0)
        got = next(it).column("value").to_pylist()
        with lm.open_log(TP, writable=True) as writer:  # delete-records, then retention removes segments
            writer.maybe_increment_log_start_offset(30)
        lm.apply_retention(TP)
        d = os.path.join(root, "t-0")
        assert any(f.endswith(".log.deleted") for f in os.listdir(d))
        for batch in it:
            got += batch.column("value").to_pylist()
    assert got == values


def test_cleaner_swap_under_a_reader_in_flight(root):
    lm, values = fill(root)
    d = os.path.join(root, "t-0")
    with lm.open_log(TP) as reader:
        second = reader.segments[1]
        assert second.size > 0
        # a swap: the old files go to .deleted, a different (smaller) segment takes the name
        base = f"{second.base_offset:020d}"
        for sfx in (".log", ".index", ".timeindex"):
            os.rename(os.path.join(d, base + sfx), os.path.join(d, base + sfx + ".deleted"))
        last_batch = kp_batch([(1_700_000_000_000, None, b"compacted", [])])
        data = bytearray(last_batch)
        data[0:8] = (second.base_offset + 3).to_bytes(8, "big")
        for sfx, content in ((".log", bytes(data)), (".index", b""), (".timeindex", b"")):
            with open(os.path.join(d, base + sfx), "wb") as f:
                f.write(content)
        got = [v for b in reader.read_records(0) for v in b.column("value").to_pylist()]
    assert got == values
    with lm.open_log(TP) as fresh:  # a new listing sees the new file
        seg = fresh.segment_for(second.base_offset + 3)
        assert [
            v for b in fresh.read_records(seg.base_offset, seg.base_offset + 4) for v in b.column("value").to_pylist()
        ] == [b"compacted"]


def test_a_segment_gone_for_good_is_a_clear_error(root):
    lm, values = fill(root)
    d = os.path.join(root, "t-0")
    with lm.open_log(TP) as reader:
        base = f"{reader.segments[1].base_offset:020d}"
        os.remove(os.path.join(d, base + ".log"))
        with pytest.raises(Exception, match=r"removed while being read.*"):
            list(reader.read_records(0))
