"""Planning over many partitions: LogManager.snapshot() and the stream reader's LogOffsetsCache.

The reference is a model of each partition's offsets kept by the test (records appended, truncations,
delete-records), not the code under test. File ages are set with os.utime instead of waiting, so the
cache's "settled" rule is exercised with the real clock and no sleep.
"""

from __future__ import annotations

import os
import random
import time

import pytest

import storage.metadata.checkpoint as checkpoint_module
from python_datasource.reader import KafkaLogBatchReader, KafkaLogStreamReader
from python_datasource.source_options import SourceOptions
from storage.errors import UnknownTopicOrPartitionError
from storage.log_manager import LogManager
from storage.log_offsets import SETTLE_NS, LogOffsetsCache
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kp_batch

PARTS = 3


def append(lm: LogManager, tp: TopicPartition, n: int, roll: bool = False) -> None:
    with lm.open_log(tp, writable=True) as log:
        if roll:
            log.roll()
        now = int(time.time() * 1000)  # recent: retention.ms must not take them
        log.append(kp_batch([(now, b"k%d" % i, b"v", []) for i in range(n)]))


def age(path: str, seconds: int) -> None:
    """Make every file and directory under path look `seconds` old (mtime), as if time had passed."""
    stamp = os.stat(path).st_mtime_ns - seconds * 1_000_000_000
    for d, _, files in os.walk(path):
        for name in files + [""]:
            p = os.path.join(d, name) if name else d
            try:
                os.utime(p, ns=(stamp, stamp))
            except FileNotFoundError:
                pass


def test_offsets_cache_follows_every_change(root):
    """Appends, rolls, truncation, delete-records with retention, and topic deletion: after each, the cache
    answers what the model says; partitions nobody touched are answered without reopening them."""
    rng = random.Random(16)
    lm = LogManager(root)
    lm.create_topic("t", PARTS)
    tps = [TopicPartition("t", p) for p in range(PARTS)]
    end = {tp: 0 for tp in tps}
    start = {tp: 0 for tp in tps}
    bases = {tp: [] for tp in tps}  # each append is one batch
    cache = LogOffsetsCache()
    for step in range(60):
        age(root, 10 + step)  # everything settled, then cached: the change below must still show
        for q in tps:
            cache.offsets(lm, q)
        tp = rng.choice(tps)
        op = rng.choice(["append", "append", "roll", "truncate", "delete_records", "none"])
        if op in ("append", "roll"):
            n = rng.randint(1, 5)
            append(lm, tp, n, roll=op == "roll")
            bases[tp].append(end[tp])
            end[tp] += n
        elif op == "truncate" and bases[tp] and bases[tp][-1] >= start[tp]:
            with lm.open_log(tp, writable=True) as log:  # the last batch goes whole
                log.truncate_to(bases[tp][-1])
            end[tp] = bases[tp].pop()
        elif op == "delete_records" and end[tp] > start[tp]:
            target = rng.randint(start[tp], end[tp])
            lm.delete_records(tp, target)
            lm.apply_retention(tp)
            start[tp] = target
        for q in tps:
            snap = cache.offsets(lm, q)
            assert (snap.log_start_offset, snap.log_end_offset) == (start[q], end[q]), (step, op, q)
        hits = cache.hits
        for q in tps:  # partitions the step did not touch: answered from the cache
            assert cache.offsets(lm, q).log_end_offset == end[q]
        assert cache.hits - hits >= PARTS - 1
    lm.delete_topic("t")
    with pytest.raises(UnknownTopicOrPartitionError):
        cache.offsets(lm, tps[0])


def test_fresh_files_are_not_trusted(root):
    """A version younger than SETTLE_NS may hide a second change in the same timestamp tick: such a
    partition is reopened on every ask until its files settle."""
    lm = LogManager(root)
    lm.create_topic("t", 1)
    tp = TopicPartition("t", 0)
    append(lm, tp, 3)
    written = os.stat(lm.partition_dir(tp)).st_mtime_ns
    now = [written + 1]
    cache = LogOffsetsCache(clock_ns=lambda: now[0])
    for _ in range(3):
        assert cache.offsets(lm, tp).log_end_offset == 3
    assert (cache.hits, cache.misses) == (0, 3)
    now[0] = (
        max(written, os.stat(os.path.join(lm.partition_dir(tp), "00000000000000000000.log")).st_mtime_ns)
        + SETTLE_NS
        + 1
    )
    cache.offsets(lm, tp)
    cache.offsets(lm, tp)
    assert (cache.hits, cache.misses) == (1, 4)


def test_snapshot_reads_checkpoints_once_and_sees_its_own_changes(root, monkeypatch):
    lm = LogManager(root)
    lm.create_topic("t", 20)
    tps = [TopicPartition("t", p) for p in range(20)]
    for tp in tps:
        append(lm, tp, 2)
    parses = []
    real = checkpoint_module.parse_checkpoint
    monkeypatch.setattr(checkpoint_module, "parse_checkpoint", lambda *a, **k: parses.append(1) or real(*a, **k))
    with lm.snapshot():
        for tp in tps:
            with lm.open_log(tp) as log:
                assert log.log_end_offset == 2
        assert len(parses) <= 2  # recovery points and log start offsets, once each
        lm.delete_records(tps[0], 1)  # a change made through this LogManager is seen at once
        with lm.open_log(tps[0]) as log:
            assert log.log_start_offset == 1
    monkeypatch.undo()
    without = []
    monkeypatch.setattr(checkpoint_module, "parse_checkpoint", lambda *a, **k: without.append(1) or real(*a, **k))
    for tp in tps:
        lm.open_log(tp).close()
    assert len(without) >= 20  # outside a snapshot every open reads them: the counter can see it


def test_planning_reads_each_partition_once_and_triggers_reopen_only_changed(root, monkeypatch):
    lm = LogManager(root)
    lm.create_topic("a", 30)
    lm.create_topic("b", 30)
    for t in ("a", "b"):
        for p in range(30):
            append(lm, TopicPartition(t, p), 1)
    age(root, 60)
    opened = []
    real_open = LogManager.open_log
    monkeypatch.setattr(LogManager, "open_log", lambda self, tp, **k: opened.append(tp) or real_open(self, tp, **k))
    batch = KafkaLogBatchReader(
        SourceOptions.parse({"path": root, "subscribepattern": ".*"}, streaming=False), ("value",)
    )
    assert len(batch.partitions()) == 60
    assert len(opened) == 60

    stream = KafkaLogStreamReader(SourceOptions.parse({"path": root, "subscribe": "a,b"}, streaming=True), ("value",))
    first = stream.latestOffset(stream.initialOffset(), None)
    opened.clear()
    latest = stream.latestOffset(first, None)
    assert stream.partitions(latest, latest) == []
    assert opened == []  # nothing changed: no partition reopened
    append(lm, TopicPartition("b", 7), 4)
    age(lm.partition_dir(TopicPartition("b", 7)), 30)
    opened.clear()
    latest = stream.latestOffset(latest, None)
    assert latest["b"]["7"] == 5
    assert opened == [TopicPartition("b", 7)]
    looked = stream._offsets.hits + stream._offsets.misses
    assert stream.reportLatestOffset() == latest  # Spark's progress report, right after: no second look
    assert stream.partitions(latest, latest) == []
    assert stream._offsets.hits + stream._offsets.misses == looked


def test_maintenance_pass_never_lowers_a_log_start_offset(root):
    """The pass records log start offsets it read earlier; a delete-records made meanwhile must stay."""
    lm = LogManager(root)
    lm.create_topic("t", 1)
    tp = TopicPartition("t", 0)
    append(lm, tp, 10)
    lm.delete_records(tp, 6)
    lm.update_checkpoints({}, {tp: 2})  # a stale value from a pass
    assert lm.checkpoint_file("log-start-offset-checkpoint").read()[tp] == 6
    lm.update_checkpoints({}, {tp: 8})
    assert lm.checkpoint_file("log-start-offset-checkpoint").read()[tp] == 8


def test_a_commit_over_many_partitions_rewrites_the_checkpoints_once(root, monkeypatch):
    """A micro-batch committed to 40 partitions: the recovery-point file is rewritten once at the end
    (it was rewritten, and reparsed, once per partition), and every record is where it belongs."""
    import pyarrow as pa

    from storage.records.record_batch import CompressionType
    from storage.staging.record_stager import RecordStager
    from storage.staging.staged_commit import commit_staged

    lm = LogManager(root)
    lm.create_topic("t", 40)
    rows = pa.table(
        {"key": pa.array([b"k%d" % i for i in range(400)], pa.binary()), "value": [b"v%d" % i for i in range(400)]}
    )
    st = RecordStager(lm, 3, topic="t", compression=CompressionType.NONE, task_index=0)
    st.add(rows)
    staged = st.finish()
    writes, parses = [], []
    real_write = type(lm.fs).write_atomic
    monkeypatch.setattr(
        type(lm.fs),
        "write_atomic",
        lambda self, path, data, **k: writes.append(os.path.basename(path)) or real_write(self, path, data, **k),
    )
    real_parse = checkpoint_module.parse_checkpoint
    monkeypatch.setattr(checkpoint_module, "parse_checkpoint", lambda *a, **k: parses.append(1) or real_parse(*a, **k))
    result = commit_staged(lm, 3, 0, [staged])
    monkeypatch.undo()
    assert len(result.appended) == 40 and result.records == 400
    assert writes.count("recovery-point-offset-checkpoint") == 1
    assert len(parses) <= 3
    total = 0
    for p in range(40):
        with LogManager(root).open_log(TopicPartition("t", p)) as log:
            total += log.log_end_offset
    assert total == 400


def test_a_writer_that_waited_for_the_lock_does_not_undo_delete_records(root, monkeypatch):
    """A writer reads the log start offset, then waits for the partition lock; the holder raises the log
    start offset (delete-records) and closes. The waiting writer's close must keep the new offset."""
    import threading

    from storage.fs.local import LocalFileSystem

    tp = TopicPartition("t", 0)
    LogManager(root).create_topic("t", 1)
    append(LogManager(root), tp, 10)
    holder = LogManager(root).open_log(tp, writable=True)
    waiting = threading.Event()
    real_lock = LocalFileSystem.lock

    def lock(self, path, **k):
        if threading.current_thread().name == "writer":
            waiting.set()
        return real_lock(self, path, **k)

    monkeypatch.setattr(LocalFileSystem, "lock", lock)
    writer = threading.Thread(target=append, args=(LogManager(root), tp, 2), name="writer")
    writer.start()
    assert waiting.wait(600)  # the writer has read the checkpoints and asks for the lock
    holder.maybe_increment_log_start_offset(7)
    holder.close()
    writer.join(600)
    with LogManager(root).open_log(tp) as log:
        assert (log.log_start_offset, log.log_end_offset) == (7, 12)


def test_a_subscribed_trigger_never_lists_the_whole_root(root, monkeypatch):
    """subscribe names its topics: a trigger looks them up by name, so its cost does not grow with the
    other topics under ROOT (subscribePattern must list them, and does)."""
    from storage.fs.local import LocalFileSystem

    lm = LogManager(root)
    for t in ("a", "b", "c"):
        lm.create_topic(t, 4)
    append(lm, TopicPartition("a", 1), 3)
    listed = []
    real = LocalFileSystem.listdir
    monkeypatch.setattr(LocalFileSystem, "listdir", lambda self, path: listed.append(path) or real(self, path))
    stream = KafkaLogStreamReader(SourceOptions.parse({"path": root, "subscribe": "a"}, streaming=True), ("value",))
    start = stream.initialOffset()
    latest = stream.latestOffset(start, None)
    assert latest == {"a": {"0": 0, "1": 3, "2": 0, "3": 0}}
    stream.partitions(start, latest)
    assert os.path.abspath(root) not in [os.path.abspath(p) for p in listed]
    pattern = KafkaLogStreamReader(
        SourceOptions.parse({"path": root, "subscribepattern": "^a$"}, streaming=True), ("value",)
    )
    assert pattern.latestOffset(pattern.initialOffset(), None) == latest
    assert os.path.abspath(root) in [os.path.abspath(p) for p in listed]  # the counter sees a root listing


def test_an_s3_trigger_with_nothing_new_lists_each_partition_once_and_reads_nothing(s3_server, s3_root):
    """On an object store the partition's listing is its version: a trigger (latestOffset, then partitions)
    with nothing new makes one LIST per partition and no GET of a segment object."""
    import json as _json

    url, storage = s3_root
    lm = LogManager(url, storage)
    lm.create_topic("t", 4)
    for p in (0, 2):
        append(lm, TopicPartition("t", p), 3)
    options = {"path": url, "subscribe": "t"}
    options.update({f"fs.{k}": v if isinstance(v, str) else _json.dumps(v) for k, v in storage.items()})
    stream = KafkaLogStreamReader(SourceOptions.parse(options, streaming=True), ("value",))
    first = stream.latestOffset(stream.initialOffset(), None)
    stream.partitions(first, first)
    stream._log_manager().fs.invalidate_listings()  # every listing must really be asked for again
    mark = s3_server.log.mark()
    latest = stream.latestOffset(first, None)
    assert stream.partitions(latest, latest) == []
    assert latest == {"t": {"0": 3, "1": 0, "2": 3, "3": 0}}
    reqs = s3_server.log.since(mark)
    lists = [r for r in reqs if r.method == "GET" and "list-type" in r.query or "prefix=" in r.query]
    segment_reads = [r for r in reqs if r.method == "GET" and r.path.endswith((".log", ".index", ".timeindex"))]
    for p in range(4):
        assert sum(f"t-{p}%2F" in r.query or f"t-{p}/" in r.query for r in lists) <= 1, [r.query for r in lists]
    assert segment_reads == []


def test_a_snapshot_sees_topics_created_and_deleted_through_it(root):
    lm = LogManager(root)
    with lm.snapshot():
        assert lm.topics() == []
        lm.get_or_create_topic("new", 2)
        assert lm.topics() == ["new"] and lm.topic("new").partitions == 2
        assert all(p.log_dir is not None for p in lm.describe().topics[0].partitions)  # its directories are seen
        lm.open_log(TopicPartition("new", 1)).close()
        lm.delete_topic("new")
        assert lm.topics() == []
        with pytest.raises(UnknownTopicOrPartitionError):
            lm.topic("new")
