"""The sink commit's adopt path: big staging logs are renamed into the partition, not copied.

Checked against kafka-python's parse of the files, Kafka's index rebuild rule and a plain model
of which values each partition must hold, including crashes in the middle of an adoption."""

import os
import struct

import pyarrow as pa
import pytest

from storage.log_manager import LogManager
from storage.records.record_batch import CompressionType
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kafka_recovery_entries, kp_parse

TP = TopicPartition("t", 0)
CONFIG = {"segment.bytes": "4000", "index.interval.bytes": "300"}


def rows(lo, hi, ts0=1_700_000_000_000):
    return pa.table(
        {
            "key": pa.array([b"k"] * (hi - lo), pa.binary()),
            "value": [f"value-{i:06d}".encode() * 3 for i in range(lo, hi)],
            "timestamp": pa.array([ts0 + (i * 37) % 1000 for i in range(lo, hi)], pa.timestamp("ms")),
        }
    )


def stage(lm, rows_, task=0, writer=5):
    st = RecordStager(lm, writer, topic="t", compression=CompressionType.NONE, task_index=task, max_batch_bytes=700)
    st.add(rows_)
    return st.finish()


def partition_files(root):
    d = os.path.join(root, "t-0")
    bases = sorted(int(f[:-4]) for f in os.listdir(d) if f.endswith(".log"))
    read = lambda base, sfx: open(os.path.join(d, f"{base:020d}{sfx}"), "rb").read()  # noqa: E731
    return [(base, read(base, ".log"), read(base, ".index"), read(base, ".timeindex")) for base in bases]


def check_kafka_shape(root, expected_values):
    """kafka-python reads every segment; offsets are dense from 0; batches sit in the segment named by
    their offsets; every .index is Kafka's recovery rebuild and every .timeindex a valid one."""
    values, next_offset = [], 0
    files = partition_files(root)
    for i, (base, data, index, timeindex) in enumerate(files):
        batches = kp_parse(data)
        assert batches and batches[0]["base_offset"] == base
        for b in batches:
            offs = [r[0] for r in b["records"]]
            assert offs == list(range(next_offset, next_offset + len(offs)))
            next_offset += len(offs)
            values += [r[3] for r in b["records"]]
        if i + 1 < len(files):
            assert files[i + 1][0] == next_offset
        ref_index, ref_time, (max_ts, max_off) = kafka_recovery_entries(batches, 300, base)
        assert index == ref_index
        assert timeindex in (ref_time, ref_time + struct.pack(">qi", max_ts, max_off - base))
    assert values == expected_values
    return files


def values(lo, hi):
    return [f"value-{i:06d}".encode() * 3 for i in range(lo, hi)]


def test_big_staging_logs_are_adopted_and_read_as_kafka_wrote_them(root):
    lm = LogManager(root)
    lm.create_topic("t", 1, CONFIG)
    small = stage(lm, rows(0, 5))
    assert not small.partitions[0].adopt
    commit_staged(lm, 5, 0, [small])
    big1, big2 = stage(lm, rows(5, 205), task=0), stage(lm, rows(205, 405), task=1)
    assert big1.partitions[0].adopt and len(big1.partitions[0].segments) > 1
    staged_names = {f.name for f in os.scandir(os.path.join(root, big1.name, "t-0"))}
    r = commit_staged(lm, 5, 1, [big2, big1])  # task order, not message order
    assert r.appended[TP] == (5, 404)
    files = check_kafka_shape(root, values(0, 405))
    assert files[1][0] == 5  # the small commit's segment rolled; the adopted ones follow
    assert not os.path.exists(os.path.join(root, big1.name))  # staging dirs are gone
    assert staged_names  # (the adopted files were there before)
    commit_staged(lm, 5, 2, [stage(lm, rows(405, 410))])  # small again: copied into the adopted active segment
    files = check_kafka_shape(root, values(0, 410))
    with lm.open_log(TP) as log:
        got = pa.concat_tables([pa.Table.from_batches([b]) for b in log.read_records(0)])
        assert got.column("value").to_pylist() == values(0, 410)
        ts = got.column("timestamp").cast(pa.int64()).to_pylist()
        for target in (1_700_000_000_000, 1_700_000_000_500, 1_700_000_000_999, 1_700_000_001_000):
            want = next((i for i, t in enumerate(ts) if t >= target), None)
            assert log.offset_for_timestamp(target) == want


def test_replayed_adopted_batch_is_skipped(root):
    lm = LogManager(root)
    lm.create_topic("t", 1, CONFIG)
    commit_staged(lm, 5, 0, [stage(lm, rows(0, 200))])
    r = commit_staged(lm, 5, 0, [stage(lm, rows(0, 200))])
    assert r.skipped == [TP]
    check_kafka_shape(root, values(0, 200))


def _commit_and_die(root, after_renames):
    """Child process: commit batch 1, and exit hard (no cleanup, like kill -9) at the Nth rename."""
    lm = LogManager(root)
    f = stage(lm, rows(50, 300))
    assert f.partitions[0].adopt and len(f.partitions[0].segments) >= 3
    real_rename, count = lm.fs.rename, [0]

    def rename(src, dst):
        if count[0] == after_renames:
            os._exit(17)
        count[0] += 1
        real_rename(src, dst)

    lm.fs.rename = rename
    commit_staged(lm, 5, 1, [f])
    os._exit(0)


@pytest.mark.parametrize("after_renames", [0, 1, 2, 3, 4, 5, 7, 100])
def test_kill_in_the_middle_of_an_adoption_recovers_and_replays_once(root, after_renames):
    lm = LogManager(root)
    lm.create_topic("t", 1, CONFIG)
    commit_staged(lm, 5, 0, [stage(lm, rows(0, 50))])
    pid = os.fork()
    if pid == 0:
        try:
            _commit_and_die(root, after_renames)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == (0 if after_renames == 100 else 17)
    r = commit_staged(lm, 5, 1, [stage(lm, rows(50, 300))])  # Spark replays batch 1 (recovery runs first)
    if after_renames == 100:
        assert r.skipped == [TP]
    else:
        # a crash after every .log was renamed in completes the commit; otherwise it is rolled back
        assert r.skipped == [TP] or r.appended[TP] == (50, 299)
    check_kafka_shape(root, values(0, 300))


def test_staging_goes_to_each_partitions_log_dir(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    lm = LogManager([a, b])
    lm.create_topic("t", 2, CONFIG)
    dirs = {p: os.path.dirname(lm.partition_dir(TopicPartition("t", p))) for p in (0, 1)}
    assert set(dirs.values()) == {a, b}  # one partition per log dir
    t = rows(0, 400).append_column("partition", pa.array([i % 2 for i in range(400)], pa.int32()))
    f = stage(lm, t)
    assert all(p.adopt for p in f.partitions)
    for p in f.partitions:
        assert os.path.dirname(os.path.dirname(p.segments[0].dir)) == dirs[p.partition]
    commit_staged(lm, 5, 0, [f])
    for p in (0, 1):
        with lm.open_log(TopicPartition("t", p)) as log:
            got = [v for batch in log.read_records(0) for v in batch.column("value").to_pylist()]
        assert got == values(0, 400)[p::2]
    assert not [n for d in (a, b) for n in os.listdir(d) if n.startswith(".kafkalog-staged-")]
