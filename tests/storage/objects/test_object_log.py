"""The log on immutable segments (no append, no rename, no locks), on ObjectStoreFileSystem over fsspec's
memory store: appends, reads, reopens and timestamp lookups against a brute-force model; every object
parsed by kafka-python and its indexes checked against Kafka's rebuild rule; lost races; missing
indexes; and the sink's exactly-once commit against a model with stale, lost and garbage hints."""

import json
import random
import uuid

import fsspec
import pyarrow as pa
import pytest
from kafka.record import MemoryRecords

import storage.objects.immutable_segment as immutable_segment
import storage.staging.record_stager as record_stager
from storage.errors import ConcurrentAppendError, KafkaStorageError, RecordTooLargeError
from storage.fs.local import LocalFileSystem
from storage.fs.memory import MemoryFileSystem
from storage.log import Log
from storage.log_manager import LogManager
from storage.objects.object_producer_state import ObjectProducerStateManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.records.builder import build_records
from storage.records.record_batch import CompressionType
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.writer_state import STATE_FILE
from tests.helpers.index_checks import expected_indexes
from tests.helpers.kafka_reference import kp_batch, kp_parse

TP = TopicPartition("t", 0)
TS0 = 1_700_000_000_000


def objstore():
    fs = ObjectStoreFileSystem(fsspec.filesystem("memory"))
    return fs, f"/obj-{uuid.uuid4().hex}"


def manager(config=None, partitions=1):
    fs, root = objstore()
    lm = LogManager(root, fs=fs)
    lm.create_topic("t", partitions, config or {})
    return lm


def objects(lm, tp=TP):
    """{base offset: (.log, .index, .timeindex)} of a partition, index objects None when missing."""
    d = lm.partition_dir(tp)
    names = {f.name for f in lm.fs.listdir(d)}
    out = {}
    for name in sorted(names):
        if name.endswith(".log"):
            base = int(name[:-4])
            paths = [f"{base:020d}{sfx}" for sfx in (".log", ".index", ".timeindex")]
            out[base] = tuple(lm.fs.read(lm.fs.join(d, n)) if n in names else None for n in paths)
    return out


def check_objects(lm, interval, model_records, tp=TP):
    """Every segment object parses with kafka-python, starts at its name, offsets are dense across objects,
    the records are the model's, and the index objects are what Kafka's recovery would build."""
    objs = objects(lm, tp)
    got = []
    expected_base = 0
    for base, (log_bytes, index, timeindex) in objs.items():
        assert base == expected_base
        batches = kp_parse(log_bytes)
        assert batches and all(b["crc_ok"] for b in batches)
        assert batches[0]["base_offset"] == base
        assert sum(b["size"] for b in batches) == len(log_bytes)
        assert (index, timeindex) == expected_indexes(log_bytes, base, interval), base
        got += [(r[0], r[1], r[2], r[3]) for b in batches for r in b["records"]]
        expected_base = batches[-1]["last_offset"] + 1
    assert [g[0] for g in got] == list(range(len(got)))
    assert got == [(i, ts, k, v) for i, (ts, k, v) in enumerate(model_records)]
    return objs


# ------------------------------------------------------------------ appends, reads, reopens vs a model


def random_append(rng, n0):
    """(encoded batches, [(timestamp, key, value)]) of one append: our builder or kafka-python's."""
    n = rng.randint(1, 60)
    ts = [TS0 + rng.randint(-5000, 5000) for _ in range(n)]  # timestamps go backwards too
    keys = [None if rng.random() < 0.2 else b"k%d" % rng.randint(0, 9) for _ in range(n)]
    vals = [b"value-%d-" % (n0 + i) + b"x" * rng.randint(0, 80) for i in range(n)]
    if rng.random() < 0.3:
        codec = rng.choice(["none", "gzip", "zstd"])
        data = b"".join(kp_batch([(t, k, v, [])], codec=codec) for t, k, v in zip(ts, keys, vals, strict=False))
    else:
        codec = rng.choice(list(CompressionType))
        table = pa.table(
            {"key": pa.array(keys, pa.binary()), "value": vals, "timestamp": pa.array(ts, pa.timestamp("ms"))}
        )
        data = build_records(table, compression=codec, max_batch_bytes=rng.choice([200, 700, 100_000]))
    return data, list(zip(ts, keys, vals, strict=False))


@pytest.mark.parametrize("seed", range(6))
def test_appends_reads_reopens_and_timestamp_lookups_match_a_model(seed):
    rng = random.Random(seed)
    interval = rng.choice([0, 150, 600, 4096])
    lm = manager({"index.interval.bytes": str(interval), "segment.bytes": "1000"})
    model: list[tuple[int, bytes | None, bytes]] = []
    appends: list[int] = []
    log = lm.open_log(TP, writable=True)
    try:
        for _step in range(25):
            op = rng.random()
            if op < 0.6:
                if not log.writable:
                    log.close()
                    log = lm.open_log(TP, writable=True)
                data, recs = random_append(rng, len(model))
                appends.append(len(model))
                info = log.append(data)
                assert (info.first_offset, info.last_offset) == (len(model), len(model) + len(recs) - 1)
                model += recs
            elif op < 0.75:  # reopen, for writing or for reading
                log.close()
                # (a reader needs an object in the partition: object stores have no empty directories)
                log = lm.open_log(TP, writable=not model or rng.random() < 0.5)
            if not model:
                continue
            assert log.log_end_offset == len(model)
            lo = rng.randint(0, len(model) - 1)
            hi = rng.randint(lo + 1, len(model))
            got = pa.Table.from_batches(list(log.read_records(lo, hi)))
            assert got.column("offset").to_pylist() == list(range(lo, hi))
            assert (
                list(
                    zip(
                        got.column("timestamp").cast(pa.int64()).to_pylist(),
                        got.column("key").to_pylist(),
                        got.column("value").to_pylist(),
                        strict=False,
                    )
                )
                == model[lo:hi]
            )
            for t in [TS0 - 6000, TS0 + rng.randint(-5000, 5000), TS0 + 6000]:
                want = next((i for i, (ts, _, _) in enumerate(model) if ts >= t), None)
                assert log.offset_for_timestamp(t) == want, t
    finally:
        log.close()
    objs = check_objects(lm, interval, model)
    assert sorted(objs) == appends  # one object per append, named by the offset it started at


def test_each_append_is_one_object_named_by_the_log_end_offset():
    lm = manager({"segment.bytes": "200", "index.interval.bytes": "100"})
    with lm.open_log(TP, writable=True) as log:
        sizes = [5, 1, 40]
        for n in sizes:
            log.append(build_records(pa.table({"value": [b"v" * 30] * n}), max_batch_bytes=300))
    objs = objects(lm)
    assert list(objs) == [0, 5, 6]
    assert [sum(len(b["records"]) for b in kp_parse(o[0])) for o in objs.values()] == sizes
    assert len(objs[6][0]) > 200  # larger than segment.bytes, still one object
    names = {f.name for f in lm.fs.listdir(lm.partition_dir(TP))}
    assert not any(n.endswith((".swap", ".cleaned", ".tmp", ".lock")) for n in names)


def test_local_and_memory_filesystems_keep_the_locked_append_protocol(tmp_path):
    for fs, root in [(LocalFileSystem(), str(tmp_path / "r")), (MemoryFileSystem(), f"/m-{uuid.uuid4().hex}")]:
        lm = LogManager(root, fs=fs)
        lm.create_topic("t", 1)
        with lm.open_log(TP, writable=True) as log:
            assert not log.immutable and type(log.producer_state).__name__ == "ProducerStateManager"
            log.append(build_records(pa.table({"value": [b"a"]})))
            log.append(build_records(pa.table({"value": [b"b"]})))
        assert [f.name for f in fs.listdir(fs.join(root, "t-0")) if f.name.endswith(".log")] == [
            "00000000000000000000.log"
        ]  # appended in place, not one file per append


def test_a_lost_race_appends_nothing_and_needs_a_reopen():
    lm = manager()
    a = lm.open_log(TP, writable=True)
    b = lm.open_log(TP, writable=True)
    a.append(build_records(pa.table({"value": [b"from-a"] * 3})))
    with pytest.raises(ConcurrentAppendError) as e:
        b.append(build_records(pa.table({"value": [b"from-b"] * 2})))
    assert (e.value.topic, e.value.partition, e.value.offset) == ("t", 0, 0)
    assert "t-0" in str(e.value) and "offset 0" in str(e.value)
    with pytest.raises(KafkaStorageError, match="reopen"):
        b.append(build_records(pa.table({"value": [b"again"]})))
    b.close()
    a.close()
    assert [r[3] for bt in kp_parse(objects(lm)[0][0]) for r in bt["records"]] == [b"from-a"] * 3
    with lm.open_log(TP, writable=True) as c:
        assert c.append(build_records(pa.table({"value": [b"from-b"] * 2}))).first_offset == 3
    got = [(r[0], r[3]) for o in objects(lm).values() for bt in kp_parse(o[0]) for r in bt["records"]]
    assert got == list(enumerate([b"from-a"] * 3 + [b"from-b"] * 2))


def test_too_large_append_is_refused_and_writes_nothing(monkeypatch):
    lm = manager()
    monkeypatch.setattr(immutable_segment, "MAX_SEGMENT_OBJECT_BYTES", 1000)
    with lm.open_log(TP, writable=True) as log:
        with pytest.raises(RecordTooLargeError, match="int32"):
            log.append(build_records(pa.table({"value": [b"v" * 100] * 20}), max_batch_bytes=500))
        assert log.log_end_offset == 0
    assert objects(lm) == {}


def test_empty_segment_object_is_ignored_and_named_when_it_blocks():
    lm = manager()
    d = lm.partition_dir(TP)
    with lm.open_log(TP, writable=True) as log:
        log.append(build_records(pa.table({"value": [b"a", b"b"]})))
    lm.fs.write_atomic(lm.fs.join(d, "00000000000000000002.log"), b"")  # a tool's empty active segment
    with lm.open_log(TP) as log:
        assert log.log_end_offset == 2
    with lm.open_log(TP, writable=True) as log:
        with pytest.raises(KafkaStorageError, match="empty segment object .*00000000000000000002.log"):
            log.append(build_records(pa.table({"value": [b"c"]})))


def test_missing_index_objects_are_rebuilt_in_memory_and_written_by_writers():
    interval = 120
    lm = manager({"index.interval.bytes": str(interval)})
    with lm.open_log(TP, writable=True) as log:
        for i in range(3):
            log.append(
                build_records(
                    pa.table(
                        {
                            "value": [b"v%03d" % j * 8 for j in range(40)],
                            "timestamp": pa.array([TS0 + i * 100 + j for j in range(40)], pa.timestamp("ms")),
                        }
                    ),
                    max_batch_bytes=250,
                )
            )
    before = objects(lm)
    d = lm.partition_dir(TP)
    for sfx in (".index", ".timeindex"):
        lm.fs.delete(lm.fs.join(d, f"{40:020d}{sfx}"))
    with lm.open_log(TP) as reader:  # a reader rebuilds in memory and writes nothing
        assert reader.offset_for_timestamp(TS0 + 120) == 60
        assert [b.num_rows for b in reader.read_records(55, 70)] and reader.log_end_offset == 120
        assert reader.segment_for(40).offset_index.entries == len(before[40][1]) // 8 > 0
    assert objects(lm)[40][1:] == (None, None)
    with lm.open_log(TP, writable=True):  # a writer writes them back, byte for byte
        pass
    assert objects(lm) == before


def test_a_damaged_segment_object_is_reported_not_cut():
    lm = manager()
    with lm.open_log(TP, writable=True) as log:
        log.append(build_records(pa.table({"value": [b"a" * 50] * 5}), max_batch_bytes=200))
    d = lm.partition_dir(TP)
    path = lm.fs.join(d, f"{0:020d}.log")
    data = bytearray(lm.fs.read(path))
    data[-3] ^= 0xFF
    lm.fs.write_atomic(path, bytes(data))
    lm.fs.delete(lm.fs.join(d, f"{0:020d}.index"))
    with pytest.raises(Exception, match=r"00000000000000000000\.log.*position"):
        lm.open_log(TP, writable=True)
    assert len(lm.fs.read(path)) == len(data)


def test_no_lock_is_ever_taken(monkeypatch):
    lm = manager()
    calls = []
    monkeypatch.setattr(ObjectStoreFileSystem, "lock", lambda self, path, timeout=None: calls.append(path))
    lm.create_topic("u", 2)
    with lm.open_log(TopicPartition("u", 1), writable=True) as log:
        log.append(build_records(pa.table({"value": [b"a"] * 4})))
    assert lm.delete_records(TopicPartition("u", 1), 3) == 3
    with lm.open_log(TopicPartition("u", 1)) as log:
        assert log.log_start_offset == 3  # recorded in the checkpoint file (a hint, written whole)
    f = stage(lm, 9, 0, 5, topic="u")
    commit_staged(lm, 9, 0, [f])
    lm.delete_topic("u")
    assert calls == []


def test_a_store_without_create_only_writes_is_read_only():
    fs = ObjectStoreFileSystem(fsspec.filesystem("memory"), atomic_create=False)
    root = f"/obj-{uuid.uuid4().hex}"
    fs.write_atomic(
        fs.join(root, "t.kafkalog-topic.json"),
        json.dumps({"version": 1, "topic": "t", "partitions": 1, "config": {}}).encode(),
    )
    fs.write_atomic(fs.join(root, "t-0", f"{0:020d}.log"), kp_batch([(TS0, None, b"x", [])]))  # no index objects
    lm = LogManager(root, fs=fs)
    with lm.open_log(TP) as log:
        assert log.log_end_offset == 1 and [b.num_rows for b in log.read_records(0)] == [1]
    with pytest.raises(KafkaStorageError, match="create-only"):
        lm.open_log(TP, writable=True)


# ------------------------------------------------------------------ the sink's commit


def stage(lm, writer, lo, hi, task=0, topic="t", **kw):
    st = RecordStager(lm, writer, topic=topic, compression=CompressionType.NONE, task_index=task, **kw)
    for a in range(lo, hi, 10):  # several adds, as Spark hands a task several Arrow batches
        b = min(hi, a + 10)
        st.add(
            pa.table(
                {
                    "key": pa.array([None] * (b - a), pa.binary()),
                    "value": [b"w%d-%d" % (writer, i) for i in range(a, b)],
                }
            )
        )
    return st.finish()


def producer_fields(log_bytes):
    out = []
    recs = MemoryRecords(bytes(log_bytes))
    while recs.has_next():
        b = recs.next_batch()
        out.append((b.producer_id, b.producer_epoch, b.base_sequence))
    return out


def test_commit_is_one_object_per_partition_carrying_writer_and_batch(monkeypatch):
    monkeypatch.setattr(record_stager, "STAGE_OBJECT_BYTES", 300)  # several staging objects per partition
    monkeypatch.setattr(record_stager, "COALESCE_ROWS", 10)  # each add() encoded on its own
    lm = manager(partitions=2)
    files = [stage(lm, 77, 0, 60, task=0, max_batch_bytes=200), stage(lm, 77, 60, 100, task=1, max_batch_bytes=200)]
    assert max(len(p.segments) for f in files for p in f.partitions) > 1
    r = commit_staged(lm, 77, 5, files)
    assert r.records == 100
    values = []
    for p in (0, 1):
        objs = objects(lm, TopicPartition("t", p))
        assert list(objs) == [0]  # the whole commit of a partition is one object
        assert set(producer_fields(objs[0][0])) == {(77, 0, 5)}
        values += [rec[3] for b in kp_parse(objs[0][0]) for rec in b["records"]]
    assert sorted(values) == sorted(b"w77-%d" % i for i in range(100))
    assert not [f for f in lm.fs.listdir(lm.root) if f.name.startswith(".kafkalog-staged-")]
    hint = json.loads(lm.fs.read(lm.fs.join(lm.partition_dir(TP), STATE_FILE)))
    assert hint["writers"] == {"77": [5, 0]} and hint["asOf"] == r.appended[TP][1] + 1
    again = commit_staged(lm, 77, 5, [stage(lm, 77, 0, 100)])
    assert sorted(again.skipped) == [TopicPartition("t", 0), TopicPartition("t", 1)] and not again.appended


class Crash(Exception):
    pass


@pytest.mark.parametrize("seed", range(8))
def test_exactly_once_against_a_model_with_stale_lost_and_garbage_hints(seed, monkeypatch):
    """Three writers commit and replay batches in random order; commits die right after their commit
    point; the hint file is rolled back to older versions (last writer wins), deleted or garbled. Every
    (writer, batch) must be in the log exactly once, and a replay skipped exactly when it is in."""
    rng = random.Random(seed)
    lm = manager()
    hint_path = lm.fs.join(lm.partition_dir(TP), STATE_FILE)
    committed = {w: -1 for w in (11, 22, 33)}
    expected = []
    hints = []
    for step in range(40):
        w = rng.choice(list(committed))
        op = rng.random()
        if op < 0.15 and lm.fs.exists(hint_path):
            hints.append(lm.fs.read(hint_path))
            choice = rng.random()
            if choice < 0.4 and hints:
                lm.fs.write_atomic(hint_path, rng.choice(hints))  # an older hint wins the race
            elif choice < 0.7:
                lm.fs.delete(hint_path)
            else:
                lm.fs.write_atomic(hint_path, b"{not json")
            continue
        replay = committed[w] >= 0 and rng.random() < 0.35
        batch = committed[w] if replay else committed[w] + 1
        lo = batch * 10
        f = stage(lm, w, lo, lo + rng.randint(1, 10))
        n = f.records
        dies = not replay and rng.random() < 0.25
        if dies:

            def dies_after_commit_point(self, writer_id):
                raise Crash()

            monkeypatch.setattr(ObjectProducerStateManager, "complete", dies_after_commit_point)
            with pytest.raises(Crash):
                commit_staged(lm, w, batch, [f])
            monkeypatch.undo()
        else:
            r = commit_staged(lm, w, batch, [f])
            assert bool(r.skipped) == replay, (step, w, batch)
        if not replay:
            committed[w] = batch
            expected.append((w, batch, [b"w%d-%d" % (w, i) for i in range(lo, lo + n)]))
        if lm.fs.exists(hint_path) and rng.random() < 0.3:
            hints.append(lm.fs.read(hint_path))
    objs = objects(lm)
    got = []
    for o in objs.values():
        ((writer, _, batch),) = set(producer_fields(o[0]))
        got.append((writer, batch, [r[3] for b in kp_parse(o[0]) for r in b["records"]]))
    assert got == expected
    offsets = [r[0] for o in objs.values() for b in kp_parse(o[0]) for r in b["records"]]
    assert offsets == list(range(len(offsets)))


def test_a_replay_that_won_the_race_is_not_appended_again(monkeypatch):
    """Two committers of the same (writer, batch): the loser's retry finds the winner's commit and skips."""
    lm = manager()
    f1, f2 = stage(lm, 5, 0, 10), stage(lm, 5, 0, 10)
    real_append = Log.append
    state = {"raced": False}

    def append_after_rival(self, records, **kw):
        if not state["raced"]:
            state["raced"] = True
            commit_staged(LogManager(lm.root, fs=lm.fs), 5, 0, [f2])  # the rival commits first
        return real_append(self, records, **kw)

    monkeypatch.setattr(Log, "append", append_after_rival)
    r = commit_staged(lm, 5, 0, [f1])
    # Staged in the same millisecond, both commits are byte-identical, and a create-only write that
    # meets its own bytes counts as done (a retried PUT whose answer was lost): appended, not skipped.
    # Either way the batch is in the log once.
    assert (r.skipped == [TP] and not r.appended) or (r.appended == {TP: (0, 9)} and not r.skipped)
    assert list(objects(lm)) == [0]


def test_bounded_retries_end_in_a_clear_error(monkeypatch):
    lm = manager()
    rival = {"n": 0}
    real_append = Log.append

    def always_beaten(self, records, **kw):
        rival["n"] += 1
        with LogManager(lm.root, fs=lm.fs).open_log(TP, writable=True) as other:
            real_append(other, build_records(pa.table({"value": [b"rival-%d" % rival["n"]]})))
        return real_append(self, records, **kw)

    monkeypatch.setattr(Log, "append", always_beaten)
    with pytest.raises(ConcurrentAppendError, match=r"t-0: batch 0 of writer 5 lost the race .* 3 times") as e:
        commit_staged(lm, 5, 0, [stage(lm, 5, 0, 10)], conflict_retries=3)
    assert e.value.partition == 0 and rival["n"] == 3
    monkeypatch.undo()
    assert [r[3] for r in (x for o in objects(lm).values() for b in kp_parse(o[0]) for x in b["records"])] == [
        b"rival-1",
        b"rival-2",
        b"rival-3",
    ]


def test_the_check_reads_only_the_headers_after_the_hint(monkeypatch):
    lm = manager()
    for b in range(6):
        commit_staged(lm, 1, b, [stage(lm, 1, b * 3, b * 3 + 3)])
    commit_staged(lm, 2, 0, [stage(lm, 2, 0, 3)])
    reads = []
    real = ObjectStoreFileSystem.read

    def counted(self, path, start=0, end=None):
        reads.append((path, start, end))
        return real(self, path, start, end)

    monkeypatch.setattr(ObjectStoreFileSystem, "read", counted)
    with lm.open_log(TP, writable=True) as log:
        reads.clear()
        assert log.producer_state.entry(1).committed_batch_id == 5  # from the hint: no segment after asOf
        assert reads == []
    hint_path = lm.fs.join(lm.partition_dir(TP), STATE_FILE)
    lm.fs.delete(hint_path)
    with lm.open_log(TP, writable=True) as log:
        reads.clear()
        assert log.producer_state.entry(1).committed_batch_id == 5
        assert [(s, e) for _, s, e in reads] == [(0, 61), (0, 61)]  # newest first, until writer 1's commit
        assert log.producer_state.entry(3).committed_batch_id == -1
