"""The maintenance job on object stores (no append, no rename, no locks; create-only writes): the merge of
small segments, retention and delete-records, compaction, readers in flight, a live appender racing the
job, the lease that keeps a second job out, and the CLI on a real S3 endpoint (moto server).

References are independent: kafka-python parses every segment object; Kafka's groupSegmentsBySize rule
and its index rebuild (tests/helpers/kafka_reference.py) say what the merged objects and indexes must be;
brute-force models say which records remain (retention rules, latest record per key).
"""

from __future__ import annotations

import io
import random
import sys
import threading
import time
import uuid

import fsspec
import pyarrow as pa
import pytest

from kafkalog_ds.maintenance.__main__ import main as maintenance_main
from storage.errors import CorruptRecordError, KafkaStorageError, MaintenanceLeaseError
from storage.log_maintenance import run_once
from storage.log_manager import LogManager
from storage.metadata.checkpoint import LOG_START_OFFSET_CHECKPOINT_FILE
from storage.objects.maintenance_lease import MaintenanceLease
from storage.objects.object_store import ObjectStoreFileSystem
from storage.topic_partition import TopicPartition, parse_segment_file
from tests.helpers.compaction_model import Model
from tests.helpers.index_checks import expected_indexes
from tests.helpers.kafka_reference import kp_batch, kp_parse

TP = TopicPartition("t", 0)
TS0 = 1_700_000_000_000
FAST = {"kafkalog.segment.merge.min.age.ms": "0"}


def later(ms=0):
    """A pass's clock: now plus ms (delays such as file.delete.delay.ms are counted from it)."""
    return int(time.time() * 1000) + ms


def objstore():
    return ObjectStoreFileSystem(fsspec.filesystem("memory")), f"/obj-{uuid.uuid4().hex}"


def manager(config=None, fs=None, root=None):
    if fs is None:
        fs, root = objstore()
    lm = LogManager(root, fs=fs)
    lm.create_topic("t", 1, config or {})
    return lm


def append(lm, recs, codec="none") -> int:
    """One commit: a writable Log opened for it (as the sink opens one per commit); returns its base offset."""
    with lm.open_log(TP, writable=True) as log:
        return log.append(kp_batch(recs, codec=codec)).first_offset


def run(lm, now, **settings):
    """One pass at `now`, its lease on that fixed clock (short lease TTLs never race a busy machine)."""
    reps = run_once(lm.root, fs=lm.fs, now_ms=now, cleaner_settings={**FAST, **settings}, clock=lambda: now)
    assert all(not r.errors for r in reps), [r.errors for r in reps]
    return reps


def files(lm) -> dict[str, bytes]:
    d = lm.partition_dir(TP)
    lm.fs.invalidate_listings(d)
    return {f.name: lm.fs.read(lm.fs.join(d, f.name)) for f in lm.fs.listdir(d) if not f.is_dir}


def live_logs(lm) -> dict[int, bytes]:
    out = {}
    for name, data in files(lm).items():
        p = parse_segment_file(name)
        if p is not None and p.suffix == ".log" and not p.extra:
            out[p.base_offset] = data
    return dict(sorted(out.items()))


def parsed(lm) -> list[tuple]:
    """(offset, timestamp, key, value) of every record in the live segment objects, by kafka-python."""
    out = []
    for base, data in live_logs(lm).items():
        batches = kp_parse(data)
        assert batches and all(b["crc_ok"] for b in batches) and batches[0]["base_offset"] >= base
        out += [r[:4] for b in batches for r in b["records"]]
    return out


def read_all(log, start=None) -> list[tuple]:
    batches = list(log.read_records(log.log_start_offset if start is None else start))
    if not batches:
        return []
    t = pa.Table.from_batches(batches)
    return list(
        zip(
            t.column("offset").to_pylist(),
            t.column("timestamp").cast(pa.int64()).to_pylist(),
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            strict=False,
        )
    )


def check_indexes(lm, interval):
    """Every live segment's .index and .timeindex are what Kafka's rebuild gives (plus the roll entry)."""
    fl = files(lm)
    for base, data in live_logs(lm).items():
        want = expected_indexes(data, base, interval)
        assert (fl[f"{base:020d}.index"], fl[f"{base:020d}.timeindex"]) == want, base


def kafka_groups(segs, segment_bytes, index_bytes, interval):
    """Kafka's LogCleaner.groupSegmentsBySize over [(base, bytes)] (the last one excluded by the caller):
    runs whose log bytes, offset index and time index bytes fit, offsets relative to the run's base in int32."""
    sizes = []
    for base, data in segs:
        index, timeindex = expected_indexes(data, base, interval)
        sizes.append((base, len(data), len(index), len(timeindex), kp_parse(data)[-1]["last_offset"]))
    groups, i = [], 0
    while i < len(sizes):
        g = [sizes[i]]
        size, idx, tidx = sizes[i][1], sizes[i][2], sizes[i][3]
        i += 1
        while i < len(sizes):
            b, s, x, t, last = sizes[i]
            if (
                size + s > segment_bytes
                or idx + x > index_bytes
                or tidx + t > index_bytes
                or last - g[0][0] > 2**31 - 1
            ):
                break
            g.append(sizes[i])
            size, idx, tidx = size + s, idx + x, tidx + t
            i += 1
        groups.append([x[0] for x in g])
    return groups


# ------------------------------------------------------------------ merging small segments


@pytest.mark.parametrize("seed", range(6))
def test_merge_concatenates_the_groups_kafka_would_form(seed):
    rng = random.Random(seed)
    interval = rng.choice([0, 100, 300, 4096])
    seg_bytes = rng.choice([400, 1000, 3000])
    index_bytes = rng.choice([24, 48, 10_485_760])  # small index limits end groups too
    lm = manager(
        {
            "segment.bytes": str(seg_bytes),
            "index.interval.bytes": str(interval),
            "retention.ms": "-1",
            "segment.index.bytes": str(index_bytes),
        }
    )
    model = []
    for _ in range(rng.randint(2, 25)):
        n = rng.randint(1, 4)
        recs = [
            (TS0 + rng.randint(-50, 50), b"k%d" % rng.randint(0, 5), b"v" * rng.randint(0, 120), []) for _ in range(n)
        ]
        base = append(lm, recs, codec=rng.choice(["none", "gzip", "zstd"]))
        model += [(base + i, ts, k, v) for i, (ts, k, v, _) in enumerate(recs)]
    before = live_logs(lm)
    segs = list(before.items())
    groups = kafka_groups(segs[:-1], seg_bytes, index_bytes, interval)
    reps = run(lm, later())
    after = live_logs(lm)
    expected = {g[0]: b"".join(before[b] for b in g) for g in groups}
    expected[segs[-1][0]] = segs[-1][1]  # the last segment object is never rewritten
    assert after == expected
    assert reps[0].merged_groups == sum(len(g) > 1 for g in groups)
    assert parsed(lm) == model
    check_indexes(lm, interval)
    fl = files(lm)
    for g in groups:
        if len(g) > 1:  # the replaced objects stay as .deleted twins, with their old bytes
            assert all(fl[f"{b:020d}.log.deleted"] == before[b] for b in g)
    assert not [n for n in fl if ".swap" in n or ".cleaned" in n]
    with lm.open_log(TP) as log:
        assert read_all(log) == model
    with lm.open_log(TP, writable=True) as log:  # a writer appends after the merged segments
        assert log.append(kp_batch([(TS0, b"x", b"y", [])])).first_offset == len(model)


def test_a_merged_head_is_not_rewritten_again_before_its_twin_expires():
    lm = manager({"segment.bytes": "100000", "retention.ms": "-1", "file.delete.delay.ms": "60000"})
    for i in range(4):
        append(lm, [(TS0 + i, b"k", b"v%d" % i, [])])
    now = later()
    run(lm, now)
    assert list(live_logs(lm)) == [0, 3]
    for i in range(4, 8):
        append(lm, [(TS0 + i, b"k", b"v%d" % i, [])])
    run(lm, now + 1000)  # 0.log.deleted is still there: segment 0 stays as it is
    assert list(live_logs(lm)) == [0, 3, 7]
    run(lm, now + 120_000)  # the twins expired: removed first, then segment 0 grows
    assert list(live_logs(lm)) == [0, 7]
    assert [r[3] for r in parsed(lm)] == [b"v%d" % i for i in range(8)]


def test_young_segments_and_the_last_one_are_left_alone():
    lm = manager({"retention.ms": "-1"})
    for i in range(5):
        append(lm, [(TS0 + i, b"k", b"v%d" % i, [])])
    reps = run_once(lm.root, fs=lm.fs, now_ms=later())  # default min age: 60 s
    assert not reps[0].errors and reps[0].merged_groups == 0 and list(live_logs(lm)) == [0, 1, 2, 3, 4]
    run(lm, later(120_000), **{"kafkalog.segment.merge.min.age.ms": "60000"})
    assert list(live_logs(lm)) == [0, 4]


# ------------------------------------------------------------------ retention and delete-records


def retention_model(segments, log_start, now, retention_ms, retention_bytes):
    """Kafka 3.x's passes over [(base, size, largest timestamp)] with the last segment active: which stay,
    and the log start offset. Object stores keep the last object even when it expired."""
    segs = list(segments)
    start = log_start
    k = 0  # below the log start: the next segment's base <= log start
    while k + 1 < len(segs) and segs[k + 1][0] <= start:
        k += 1
    segs = segs[k:]
    if retention_bytes >= 0:
        diff = sum(s[1] for s in segs) - retention_bytes
        k = 0
        while k < len(segs) and diff - segs[k][1] >= 0:
            diff -= segs[k][1]
            k += 1
        segs, start = (segs[k:], segs[k][0]) if k < len(segs) else ([segs[-1]], None)
    if start is not None and retention_ms >= 0:
        k = 0
        while k < len(segs) and now - segs[k][2] > retention_ms:
            k += 1
        segs, start = (segs[k:], segs[k][0]) if k < len(segs) else ([segs[-1]], None)
    return segs, start


@pytest.mark.parametrize("seed", range(8))
def test_retention_and_delete_records_match_the_model(seed):
    rng = random.Random(seed)
    now = later()
    ret_ms = rng.choice([-1, 3_600_000, 7_200_000])
    ret_bytes = rng.choice([-1, 200, 600])
    lm = manager({"retention.ms": str(ret_ms), "retention.bytes": str(ret_bytes), "segment.bytes": "50"})
    model = []
    for _ in range(rng.randint(1, 8)):
        ts = now - rng.choice([10, 3, 1.5, 0.5]) * 3_600_000
        recs = [(int(ts), b"k", b"v" * 20, [])] * rng.randint(1, 3)
        base = append(lm, recs)
        model += [(base + j, int(ts), b"k", b"v" * 20) for j in range(len(recs))]
    leo = len(model)
    start = 0
    if rng.random() < 0.5:
        start = rng.randint(0, leo)
        lm.delete_records(TP, start)
    before = live_logs(lm)
    segs = [(b, len(d), max(x["max_timestamp"] for x in kp_parse(d))) for b, d in before.items()]
    kept, new_start = retention_model(segs, start, now, ret_ms, ret_bytes)
    rep = run(lm, now, **{"kafkalog.segment.merge.min.age.ms": str(10**12)})[0]  # no merges here
    assert list(live_logs(lm)) == [s[0] for s in kept]
    want_start = leo if new_start is None else max(start, new_start)
    assert rep.log_start_offset == want_start
    assert lm.checkpoint_file(LOG_START_OFFSET_CHECKPOINT_FILE).read().get(("t", 0), 0) == want_start
    fl = files(lm)
    for b in before:
        if b not in dict((s[0], s) for s in kept):
            assert fl[f"{b:020d}.log.deleted"] == before[b]  # kept for readers in flight
    with lm.open_log(TP) as log:
        assert (log.log_start_offset, log.log_end_offset) == (want_start, leo)
        assert read_all(log) == [r for r in model if r[0] >= want_start]
    run(
        lm,
        now + 120_000,
        **{"kafkalog.segment.merge.min.age.ms": str(10**12), "kafkalog.maintenance.lease.ttl.ms": "1000"},
    )
    assert not [n for n in files(lm) if n.endswith(".deleted")]  # removed after file.delete.delay.ms
    with lm.open_log(TP, writable=True) as log:  # the log end survives even when every segment expired
        assert log.append(kp_batch([(now, b"k", b"new", [])])).first_offset == leo


def test_the_log_start_offset_is_checkpointed_before_any_segment_goes(monkeypatch):
    lm = manager({"retention.ms": "1000"})
    for i in range(3):
        append(lm, [(TS0, b"k", b"v%d" % i, [])])
    seen = []
    real = ObjectStoreFileSystem.copy

    def copy(self, src, dst):
        seen.append(self.read(self.join(lm.root, LOG_START_OFFSET_CHECKPOINT_FILE)))
        raise KafkaStorageError("injected: the job dies at its first copy")

    monkeypatch.setattr(ObjectStoreFileSystem, "copy", copy)
    reps = run_once(lm.root, fs=lm.fs, now_ms=later(), cleaner_settings=FAST)
    assert reps[0].errors and b"t 0 3" in seen[0]
    monkeypatch.setattr(ObjectStoreFileSystem, "copy", real)
    with lm.open_log(TP) as log:  # the segments below it are still there, but unreadable
        assert log.log_start_offset == 3 and read_all(log) == []
    run(lm, later(3_600_000), **{"kafkalog.maintenance.lease.ttl.ms": "1000"})  # the next pass deletes them
    assert list(live_logs(lm)) == [2]


# ------------------------------------------------------------------ readers in flight


@pytest.mark.parametrize("policy", ["compact,delete", "delete"])
def test_a_reader_in_flight_reads_the_old_segments_through_merge_retention_and_compaction(policy):
    lm = manager(
        {
            "cleanup.policy": policy,
            "retention.bytes": "700",
            "retention.ms": "-1",
            "min.cleanable.dirty.ratio": "0.01",
            "segment.bytes": "250",
            "file.delete.delay.ms": "60000",
        }
    )
    model = []
    for i in range(12):
        recs = [(TS0 + i, b"k%d" % (i % 2), b"v%02d" % i + b"x" * 30, [])]
        base = append(lm, recs)
        model.append((base, TS0 + i, recs[0][1], recs[0][2]))
    reader = lm.open_log(TP)  # lists the 12 objects, reads nothing yet
    half = lm.open_log(TP)
    assert read_all(half, 0)[:3] == model[:3]  # this one has read its first segments already
    late = LogManager(lm.root, fs=ObjectStoreFileSystem(fsspec.filesystem("memory"))).open_log(TP)
    now = later()
    rep = run(lm, now)[0]
    assert rep.segments_deleted and (rep.cleaned if policy != "delete" else rep.merged_groups)
    assert read_all(reader, 0) == model  # the old records: the replaced head by version, the rest from twins
    assert read_all(half, 0) == model
    with lm.open_log(TP) as fresh:  # a new reader sees the new state
        assert read_all(fresh) == [r for r in parsed(lm) if r[0] >= fresh.log_start_offset]
        assert 0 < len(read_all(fresh)) < len(model)
    twins = {n for n in files(lm) if n.endswith(".deleted")}
    run(lm, now + 120_000, **{"kafkalog.maintenance.lease.ttl.ms": "1000"})  # the twins go
    assert "00000000000000000000.log.deleted" in twins and "00000000000000000000.log.deleted" not in files(lm)
    with pytest.raises(CorruptRecordError, match="replaced or removed while being read"):
        read_all(late, 0)  # listed before the rewrite, read after the twins went: an error, never fewer records


# ------------------------------------------------------------------ compaction


@pytest.mark.parametrize("seed", range(4))
def test_compaction_on_an_object_store_matches_the_model(seed):
    rng = random.Random(seed)
    retention = rng.choice([0, 1000])
    lm = manager(
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.01",
            "segment.bytes": "700",
            "delete.retention.ms": str(retention),
            "index.interval.bytes": "0",
        }
    )
    model = Model(retention)
    for _ in range(rng.randint(3, 14)):
        recs = [
            (
                TS0 + rng.randint(0, 99),
                rng.choice([b"a", b"b", b"c", b"d"]),
                None if rng.random() < 0.2 else b"v" * rng.randint(1, 50),
                [],
            )
            for _ in range(rng.randint(1, 4))
        ]
        model.append(append(lm, recs), recs)
    with lm.open_log(TP) as log:
        active = log.active_segment.base_offset
    now = later()
    rep = run(lm, now)[0]
    model.clean(0, active, now)
    assert [r[:4] for r in parsed(lm)] == [r[:4] for r in model.expected()]
    assert rep.cleaned
    from storage.cleaner.log_cleaner_manager import LogCleanerManager

    assert LogCleanerManager(LogManager(lm.root, fs=lm.fs)).checkpoints()[TP] == active
    check_indexes(lm, 0)
    with lm.open_log(TP) as log:
        assert [r[:4] for r in read_all(log)] == [r[:4] for r in model.expected()]


# ------------------------------------------------------------------ a live appender racing the job


def test_a_live_appender_racing_maintenance_passes_loses_nothing():
    lm = manager({"segment.bytes": "600", "retention.ms": "-1", "file.delete.delay.ms": "0"})
    stop, committed, errors, t = start_appender(
        lambda: LogManager(lm.root, fs=ObjectStoreFileSystem(fsspec.filesystem("memory"))), 20
    )
    merged = 0
    try:
        while len(committed) < 3 and not errors:  # (its first commit pays for imports and compiling)
            time.sleep(0.01)
        for p in range(4):
            reps = run_once(
                lm.root,
                fs=ObjectStoreFileSystem(fsspec.filesystem("memory")),
                now_ms=later(p * 1000),
                cleaner_settings=FAST,
            )
            assert not reps[0].errors, reps[0].errors
            merged += reps[0].merged_groups
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert merged  # the job did merge while the appender appended
    got = [(r[0], r[3]) for r in parsed(lm)]
    assert got == committed == [(i, b"r%04d" % i) for i in range(len(committed))]


# ------------------------------------------------------------------ one job at a time


def test_a_second_job_is_refused_naming_the_holder_and_an_expired_lease_is_taken_over():
    lm = manager({"retention.ms": "-1"})
    append(lm, [(TS0, b"k", b"v", [])])
    now = later()
    first = MaintenanceLease(lm.fs, lm.root, holder="job-A@host1", ttl_ms=60_000, clock=lambda: now).acquire()
    with pytest.raises(MaintenanceLeaseError, match="job-A@host1"):
        run_once(lm.root, fs=lm.fs, now_ms=now + 1000, cleaner_settings=FAST)
    second = MaintenanceLease(lm.fs, lm.root, holder="job-B", ttl_ms=60_000, clock=lambda: now + 61_000).acquire()
    with pytest.raises(MaintenanceLeaseError, match="job-B"):
        first.check()  # the paused first holder finds out before its next commit point
    second.check()
    second.release()
    run(lm, now + 2000)  # released: the next job runs


# ------------------------------------------------------------------ S3 (moto server)


def _fs_args(opts):
    import json

    return [a for k, v in opts.items() for a in ("--fs", f"{k}={json.dumps(v) if isinstance(v, dict) else v}")]


def _fill_s3(url, opts, n=10):
    lm = LogManager(url, opts)
    lm.create_topic("t", 1, {"retention.ms": "-1", "segment.bytes": "100000"})
    for i in range(n):
        append(lm, [(TS0 + i, b"k%d" % (i % 3), b"value-%d" % i, [])])
    return lm


def test_cli_maintain_once_on_s3(s3_root):
    from kafkalog_ds.cli import main

    url, opts = s3_root
    lm = _fill_s3(url, opts)
    before = [r[3] for r in parsed(lm)]
    reader = LogManager(url, opts).open_log(TP)  # in flight across the merge
    out = io.StringIO()
    sys_stdout = sys.stdout
    try:
        sys.stdout = out
        code = main(
            ["maintain", url, "--once", *_fs_args(opts), "--cleaner-config", "kafkalog.segment.merge.min.age.ms=0"]
        )
    finally:
        sys.stdout = sys_stdout
    assert code == 0, out.getvalue()
    assert "merged 9 small segments into 1" in out.getvalue()
    lm = LogManager(url, opts)
    assert list(live_logs(lm)) == [0, 9]
    assert [r[3] for r in parsed(lm)] == before
    check_indexes(lm, 4096)
    assert [r[3] for r in read_all(reader, 0)] == before  # If-Match on the replaced head, twins for the rest


def test_python_m_maintenance_on_s3_and_requests_per_merge(s3_server, s3_root):
    url, opts = s3_root
    _fill_s3(url, opts, n=21)
    mark = s3_server.log.mark()
    code = maintenance_main([url, *_fs_args(opts), "--cleaner-config", "kafkalog.segment.merge.min.age.ms=0"])
    assert code == 0
    reqs = s3_server.log.since(mark)
    assert list(live_logs(LogManager(url, opts))) == [0, 20]
    by = {}
    for r in reqs:
        by[r.method] = by.get(r.method, 0) + 1
    print(f"one pass merging 20 segments of one partition: {len(reqs)} requests {by}")
    # 20 segments x (1 GET + 3 copies) + the swap's puts, a few lists and batched deletes
    assert len(reqs) < 20 * 6 + 40


def test_a_live_appender_racing_a_merge_on_s3(s3_root):
    url, opts = s3_root
    lm = LogManager(url, opts)
    lm.create_topic("t", 1, {"retention.ms": "-1", "file.delete.delay.ms": "0"})
    stop, committed, errors, t = start_appender(lambda: LogManager(url, opts), 8)
    merged = 0
    try:
        while len(committed) < 3 and not errors:
            time.sleep(0.01)
        for p in range(3):
            reps = run_once(url, storage_options=opts, now_ms=later(p * 1000), cleaner_settings=FAST)
            assert not reps[0].errors, reps[0].errors
            merged += reps[0].merged_groups
    finally:
        stop.set()
        t.join()
    assert not errors and merged, errors
    got = [(r[0], r[3]) for r in parsed(LogManager(url, opts))]
    assert got == committed == [(i, b"r%04d" % i) for i in range(len(committed))]


# ------------------------------------------------------------------ the sink's exactly-once check, swaps in flight


def test_merging_the_sinks_commits_keeps_replays_detected():
    """The sink's replay check reads only each segment's first batch header; the job completes the writer-state
    hint below what it merges first, so replays of merged commits are still skipped (no hint at all here)."""
    import json

    from storage.records.record_batch import CompressionType
    from storage.staging.record_stager import RecordStager
    from storage.staging.staged_commit import commit_staged
    from storage.transactions.writer_state import STATE_FILE

    lm = manager({"retention.ms": "-1"})

    def stage(writer, batch):
        st = RecordStager(lm, writer, topic="t", compression=CompressionType.NONE)
        st.add(
            pa.table(
                {
                    "key": pa.array([None] * 3, pa.binary()),
                    "value": [b"w%d-b%d-%d" % (writer, batch, i) for i in range(3)],
                }
            )
        )
        return st.finish()

    order = [(7, 0), (8, 0), (7, 1), (7, 2), (8, 1), (8, 2), (7, 3)]
    for w, b in order:
        assert commit_staged(lm, w, b, [stage(w, b)]).appended
    hint_path = lm.fs.join(lm.partition_dir(TP), STATE_FILE)
    lm.fs.delete(hint_path)  # lost: the check must not depend on a hint it did not complete itself
    assert run(lm, later())[0].merged_groups
    assert list(live_logs(lm)) == [0, 18]
    hint = json.loads(lm.fs.read(hint_path))
    assert hint["asOf"] >= 18 and hint["writers"] == {"7": [2, 9], "8": [2, 15]}
    for w, b in order:  # every replay is recognised, merged or not
        r = commit_staged(LogManager(lm.root, fs=lm.fs), w, b, [stage(w, b)])
        assert r.skipped == [TP] and not r.appended, (w, b)
    assert commit_staged(lm, 8, 3, [stage(8, 3)]).appended == {TP: (21, 23)}
    values = [r[3] for r in parsed(lm)]
    assert values == [b"w%d-b%d-%d" % (w, b, i) for w, b in order + [(8, 3)] for i in range(3)]


def test_a_reader_and_a_writer_see_a_pending_swap_in_place_of_what_it_replaces():
    from storage.cleaner.segment_merger import build_merged
    from storage.segment_swap import complete_pending_swaps, swap_path

    lm = manager({"retention.ms": "-1"})
    for i in range(5):
        append(lm, [(TS0 + i, b"k", b"v%d" % i, [])])
    model = parsed(lm)
    with lm.open_log(TP) as log:
        group = log.segments[1:4]
        data, off_rows, time_rows, nxt = build_merged(log, group)
    d = lm.partition_dir(TP)
    assert lm.fs.create_exclusive(swap_path(lm.fs, d, 1), data)  # a job died right after its commit point
    lm.fs.delete(lm.fs.join(d, f"{2:020d}.log"))  # ... and one step into the completion
    with lm.open_log(TP) as log:
        assert [s.base_offset for s in log.segments] == [0, 1, 4] and read_all(log) == model
    with lm.open_log(TP, writable=True) as log:  # a writer appends at the end, writes nothing else
        assert log.append(kp_batch([(TS0, b"k", b"v5", [])])).first_offset == 5
    assert f"{2:020d}.index" in files(lm)  # (no index objects rebuilt for segments the swap replaces)
    assert complete_pending_swaps(lm.fs, d, lm.topic("t").config, now_ms=later(), abandoned_after_ms=600_000) == []
    assert complete_pending_swaps(
        lm.fs, d, lm.topic("t").config, now_ms=later(700_000), abandoned_after_ms=600_000
    ) == [1]
    assert list(live_logs(lm)) == [0, 1, 4, 5] and [r[3] for r in parsed(lm)] == [b"v%d" % i for i in range(6)]
    check_indexes(lm, 4096)


@pytest.mark.parametrize("damage", ["flipped-byte", "truncated"])
def test_a_damaged_object_swap_replaces_nothing_and_is_set_aside(damage):
    from storage.cleaner.segment_merger import build_merged
    from storage.segment_swap import complete_pending_swaps, swap_path

    lm = manager({"retention.ms": "-1"})
    for i in range(5):
        append(lm, [(TS0 + i, b"k", b"v%d" % i, [])])
    model = parsed(lm)
    with lm.open_log(TP) as log:
        data = bytearray(build_merged(log, log.segments[1:4])[0])
    if damage == "flipped-byte":
        data[len(data) // 2] ^= 0x04
    else:
        data = data[:-9]
    d = lm.partition_dir(TP)
    assert lm.fs.create_exclusive(swap_path(lm.fs, d, 1), bytes(data))
    with lm.open_log(TP) as log:  # readers pass over it: the originals are all there
        assert [s.base_offset for s in log.segments] == [0, 1, 2, 3, 4] and read_all(log) == model
    assert (
        complete_pending_swaps(lm.fs, d, lm.topic("t").config, now_ms=later(700_000), abandoned_after_ms=600_000) == []
    )
    names = files(lm)
    assert f"{1:020d}.log.swap.damaged" in names and f"{1:020d}.log.swap" not in names
    assert list(live_logs(lm)) == [0, 1, 2, 3, 4] and parsed(lm) == model


def test_overlapping_swaps_are_reported_and_a_second_swap_rolls_itself_back():
    from storage.cleaner.segment_merger import build_merged
    from storage.errors import SwapAbortedError
    from storage.segment_swap import publish_swap, swap_path

    lm = manager({"retention.ms": "-1"})
    for i in range(5):
        append(lm, [(TS0 + i, b"k", b"v%d" % i, [])])
    d = lm.partition_dir(TP)
    with lm.open_log(TP) as log:
        a = build_merged(log, log.segments[0:3])
        b = build_merged(log, log.segments[1:4])
    lm.fs.create_exclusive(swap_path(lm.fs, d, 0), a[0])  # another job's swap, just committed
    with pytest.raises(SwapAbortedError, match="another maintenance job"):
        publish_swap(lm.fs, d, 1, b[0], b[1], b[2], next_offset=b[3])
    assert not [n for n in files(lm) if n.startswith(f"{1:020d}") and ".swap" in n]  # ours went back
    lm.fs.create_exclusive(swap_path(lm.fs, d, 1), b[0])  # two jobs' swaps at once: readers refuse to guess
    with pytest.raises(KafkaStorageError, match="overlap"):
        lm.open_log(TP)


def test_a_spark_task_works_under_the_drivers_lease_and_not_without_it():
    import pickle

    from storage.log_maintenance import maintain_partitions

    lm = manager({"retention.ms": "-1"})
    for i in range(4):
        append(lm, [(TS0 + i, b"k", b"v%d" % i, [])])
    now = later()
    lease = MaintenanceLease(lm.fs, lm.root, ttl_ms=60_000, clock=lambda: now).acquire()
    held = (lease.holder, lease.generation, lease.expires_ms, lease.ttl_ms, now)
    fs = pickle.loads(pickle.dumps(lm.fs))  # as shipped to an executor
    [rep] = maintain_partitions([("t", 0)], lm.root, now, None, FAST, held, fs)
    assert not rep.errors and rep.merged_groups == 1
    [rep] = maintain_partitions([("t", 0)], lm.root, now, None, FAST, ("someone-else",) + held[1:], fs)
    assert rep.errors and "lost the maintenance lease" in rep.errors[0] and lease.holder in rep.errors[0]


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_the_merge_is_offered_on_local_disk_too(tmp_path, kind):
    """With locks and append (an opt-in there): the cleaner's swap, same groups, same bytes, Kafka's indexes."""
    from storage.cleaner.segment_merger import merge_small_segments
    from storage.fs.local import LocalFileSystem
    from storage.fs.memory import MemoryFileSystem

    fs, root = (
        (LocalFileSystem(), str(tmp_path / "r")) if kind == "local" else (MemoryFileSystem(), f"/m-{uuid.uuid4().hex}")
    )
    lm = LogManager(root, fs=fs)
    lm.create_topic("t", 1, {"segment.bytes": "330", "index.interval.bytes": "100", "retention.ms": "-1"})
    model = []
    with lm.open_log(TP, writable=True) as log:
        for i in range(9):
            log.roll()  # (a segment.ms roll, say): many small segments
            recs = [(TS0 + i, b"k", b"v%d" % i + b"x" * 40, [])]
            base = log.append(kp_batch(recs)).first_offset
            model.append((base, TS0 + i, b"k", recs[0][2]))
    before = live_logs(lm)
    segs = list(before.items())
    groups = kafka_groups(segs[:-1], 330, 10_485_760, 100)
    with lm.open_log(TP) as log:
        res = merge_small_segments(log)
    assert [g[1] for g in res.groups] == [tuple(g) for g in groups if len(g) > 1]
    want = {g[0]: b"".join(before[b] for b in g) for g in groups}
    want[segs[-1][0]] = segs[-1][1]
    assert live_logs(lm) == want
    check_indexes(lm, 100)
    with lm.open_log(TP, writable=True) as log:  # recovery finds nothing to repair
        assert read_all(log) == model


@pytest.mark.parametrize("where", ["memory", "s3"])
def test_a_reader_pins_the_version_it_listed(where, request):
    """A compaction puts other bytes of the same size under a name a reader listed: the reader reads its
    version (from the .deleted twin), or fails naming the object, never the new bytes."""
    if where == "s3":
        url, opts = request.getfixturevalue("s3_root")
        fs, root = ObjectStoreFileSystem.from_url(url, opts)
    else:
        fs, root = objstore()
    d = fs.join(root, "p")
    name = fs.join(d, f"{0:020d}.log")
    old, new = b"A" * 100, b"B" * 100
    fs.write_atomic(name, old)
    fs.listdir(d)  # what a loader does
    r1, r2 = fs.open_reader(name), fs.open_reader(name)
    assert r1.read(0, 10) == b"A" * 10  # r1 has read already, r2 not yet
    fs.copy(name, name + ".deleted")  # the job keeps the old version, then replaces the name
    other = (
        ObjectStoreFileSystem(fsspec.filesystem("memory"))
        if where == "memory"
        else ObjectStoreFileSystem.from_url(url, opts)[0]
    )
    other.write_atomic(name, new)
    assert fs.read(name, 0, 100) == new  # (an unpinned read sees the new bytes)
    assert r1.read(10, 100) == old[10:] and r2.read(0, 100) == old
    r3 = fs.open_reader(name)  # listed before the replacement too
    fs.delete(name + ".deleted")  # after file.delete.delay.ms
    with pytest.raises(CorruptRecordError, match="replaced or removed while being read"):
        r3.read(0, 100)


def start_appender(open_lm, at_least: int):
    """A thread appending one record per commit to TP until `stop` is set (and at least `at_least`);
    returns (stop, committed [(offset, value)], errors, thread)."""
    stop = threading.Event()
    committed, errors = [], []

    def appender():
        alm = open_lm()
        i = 0
        while not stop.is_set() or i < at_least:
            try:
                with alm.open_log(TP, writable=True) as log:
                    info = log.append(kp_batch([(TS0 + i, b"k", b"r%04d" % i, [])]))
                committed.append((info.first_offset, b"r%04d" % i))
                i += 1
            except Exception as e:  # noqa: BLE001
                errors.append(e)
                return

    t = threading.Thread(target=appender)
    t.start()
    return stop, committed, errors, t


def test_a_pass_with_nothing_due_lists_the_log_dir_a_few_times_not_once_per_partition(s3_server, s3_root):
    """Each partition's listing is refreshed; the log dir's (every partition prefix, so it grows with them)
    is listed a bounded number of times per pass, not once or twice per partition."""

    url, opts = s3_root
    lm = LogManager(url, opts)
    lm.create_topic("p", 20, {"retention.ms": "-1"})
    for p in range(20):
        with lm.open_log(TopicPartition("p", p), writable=True) as log:
            log.append(kp_batch([(TS0, b"k", b"v", [])]))
    mark = s3_server.log.mark()
    reports = run_once(url, storage_options=opts, cleaner_settings={"kafkalog.segment.merge.min.age.ms": str(10**12)})
    assert len(reports) == 20 and not any(r.errors for r in reports)
    root_prefix = url[len("s3://") :].split("/", 1)[1] + "/"
    lists = [r for r in s3_server.log.since(mark) if "list-type" in r.query]
    root_lists = [r for r in lists if "prefix=" + root_prefix.replace("/", "%2F") + "&" in r.query]
    assert 1 <= len(root_lists) <= 4, len(root_lists)
