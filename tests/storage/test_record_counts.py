"""Log.count_records: data records and transaction markers in an offset range, at both isolation levels,
against kafka-python's parse of the segment files and a brute-force read_committed model (kp_committed)."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest

from storage.errors import CorruptRecordError
from storage.log_manager import LogManager
from storage.records.builder import build_batch
from storage.records.record_batch import CompressionType
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kp_committed, kp_parse
from tests.storage.transactions.test_read_committed_hints import build

TP = TopicPartition("t", 0)


def parsed(d: str) -> list[dict]:
    out = []
    for name in sorted(n for n in os.listdir(d) if n.endswith(".log")):
        with open(os.path.join(d, name), "rb") as f:
            out += kp_parse(f.read())
    return out


def model(batches: list[dict], start: int, end: int, committed: bool) -> tuple[int, int]:
    """(data records, markers) a consumer at that level meets in [start, end), by brute force."""
    markers = [r[0] for b in batches if b["is_control"] for r in b["records"]]
    if committed:
        given, still_open = kp_committed(batches)
        lso = min([r[0] for r in still_open], default=batches[-1]["last_offset"] + 1)
        end = min(end, lso)
        data = [r[0] for r in given]
    else:
        data = [r[0] for b in batches if not b["is_control"] for r in b["records"]]
    return sum(start <= o < end for o in data), sum(start <= o < end for o in markers)


@pytest.mark.parametrize("leave_open", [False, True])
def test_counts_equal_kafka_pythons_at_both_levels(tmp_path, leave_open):
    d = build(str(tmp_path), leave_open=leave_open)
    batches = parsed(d)
    end = batches[-1]["last_offset"] + 1
    rng = random.Random(7)
    ranges = [(0, end), (0, 10**9)] + [tuple(sorted(rng.sample(range(end + 1), 2))) for _ in range(150)]
    with LogManager(str(tmp_path)).open_log(TP) as log:
        for level in ("read_uncommitted", "read_committed"):
            for a, b in ranges:
                got = log.count_records(a, b, isolation_level=level)
                assert (got.records, got.markers) == model(batches, a, b, level == "read_committed"), (level, a, b)
        whole = log.count_records()
        assert (whole.start, whole.end) == (0, end) and whole.offsets == end


def test_a_batch_straddling_the_range_counts_only_its_records_inside(tmp_path):
    """A compressed batch of 10 records at offsets 0-9: a range starting or ending inside it is decoded."""
    lm = LogManager(str(tmp_path))
    lm.create_topic("t", 1, {})
    t = pa.table({"key": pa.array([None] * 10, pa.binary()), "value": pa.array([b"v%d" % i for i in range(10)])})
    with lm.open_log(TP, writable=True) as log:
        log.append(build_batch(t, compression=CompressionType.ZSTD, base_offset=0))
        assert [log.count_records(a, b).records for a, b in [(0, 10), (3, 10), (0, 4), (2, 5), (9, 10)]] == [
            10,
            7,
            4,
            3,
            1,
        ]


def test_a_bad_crc_is_refused_naming_the_file(tmp_path):
    d = build(str(tmp_path), leave_open=False)
    first = sorted(n for n in os.listdir(d) if n.endswith(".log"))[0]
    path = os.path.join(d, first)
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF  # inside the last batch's records
    open(path, "wb").write(bytes(data))
    with LogManager(str(tmp_path)).open_log(TP) as log, pytest.raises(CorruptRecordError, match=first):
        log.count_records()
