"""Crash injection into the maintenance job on an object store: the job dies at every object operation
(put, create-only put, copy, delete) of a merge, a compaction and a retention pass. After each crash a
reader sees, for every group of segments the job rewrites, the old records or the new ones, never a mix,
every record once; a writer appends at the log end; and the next job completes or redoes the work.

References: kafka-python parses the segment objects; the records a healthy run leaves are the "new"
state, the records before it the "old" one; indexes are checked against Kafka's rebuild rule.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid

import fsspec
import pyarrow as pa
import pytest

from storage.log_maintenance import run_once
from storage.log_manager import LogManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.topic_partition import TopicPartition, parse_segment_file
from tests.helpers.index_checks import expected_indexes
from tests.helpers.kafka_reference import kp_batch, kp_parse

TP = TopicPartition("t", 0)
TS0 = 1_700_000_000_000
SETTINGS = {"kafkalog.segment.merge.min.age.ms": "0", "kafkalog.maintenance.lease.ttl.ms": "1000"}


class Crash(BaseException):
    """The job's process dies (not an error it could report and go on from)."""


class LogicalTimeStore(ObjectStoreFileSystem):
    """fsspec's memory store with object times on the test's clock: an object counts as written no later
    than `ceiling_ms` (the passes' now), so whether a crashed job's swap is abandoned at now + 5 s never
    depends on how long the test took on a busy machine."""

    ceiling_ms: int | None = None

    def __init__(self):
        super().__init__(fsspec.filesystem("memory"))

    def modified_ms(self, path):
        t = super().modified_ms(path)
        return t if self.ceiling_ms is None else min(t, self.ceiling_ms)

    def modified_times(self, path, names=None):
        times = super().modified_times(path, names)
        return times if self.ceiling_ms is None else {n: min(t, self.ceiling_ms) for n, t in times.items()}


class FaultyStore(LogicalTimeStore):
    """Counts every object write, copy and delete of the job's own thread; from operation `crash_at` on,
    every one raises Crash. The lease's keep-alive thread renews every TTL/3 of wall time, so its writes
    are neither counted nor crashed (a lost renewal is tested in test_object_maintenance)."""

    def __init__(self, crash_at=None):
        super().__init__()
        self.crash_at, self.ops = crash_at, []

    def _op(self, what, path):
        if threading.current_thread().name == "kafkalog-lease":
            return  # keep_alive's renewals come on the wall clock: counting them would make the count load-dependent
        if self.crash_at is not None and len(self.ops) >= self.crash_at:
            raise Crash(f"{what} {path}")
        self.ops.append((what, self.basename(path)))

    def write_atomic(self, path, data, *, durable=True):
        self._op("put", path)
        return super().write_atomic(path, data, durable=durable)

    def create_exclusive(self, path, data, *, durable=True):
        self._op("create", path)
        return super().create_exclusive(path, data, durable=durable)

    def copy(self, src, dst):
        self._op("copy", dst)
        return super().copy(src, dst)

    def rename(self, src, dst):
        self._op("rename", dst)
        return super().rename(src, dst)

    def touch(self, path):
        self._op("touch", path)
        return super().touch(path)

    def delete(self, path, *, missing_ok=True):
        self._op("delete", path)
        return super().delete(path, missing_ok=missing_ok)

    def delete_many(self, paths):
        for p in paths:  # a batch may be cut anywhere
            self.delete(p)


def healthy():
    return LogicalTimeStore()


@pytest.fixture(autouse=True)
def _wall_clock_object_times_after_each_test():
    yield
    LogicalTimeStore.ceiling_ms = None


def copy_root(src: str) -> str:
    mem = fsspec.filesystem("memory")
    dst = f"/crash-{uuid.uuid4().hex}"
    for path in mem.find(src):
        mem.pipe_file(dst + path[len(src) :], mem.cat_file(path))
    return dst


def read_records(root) -> list[tuple]:
    with LogManager(root, fs=healthy()).open_log(TP) as log:
        batches = list(log.read_records(log.log_start_offset))
    if not batches:
        return []
    t = pa.Table.from_batches(batches)
    return list(
        zip(t.column("offset").to_pylist(), t.column("key").to_pylist(), t.column("value").to_pylist(), strict=False)
    )


def append_after(root) -> int:
    with LogManager(root, fs=healthy()).open_log(TP, writable=True) as log:
        return log.append(kp_batch([(TS0 + 99, b"z", b"after", [])])).first_offset


def live(root) -> dict[str, bytes]:
    fs = healthy()
    d = fs.join(root, "t-0")
    return {f.name: fs.read(fs.join(d, f.name)) for f in fs.listdir(d) if not f.is_dir}


def check_objects(root, interval):
    """Live segment objects parse, their indexes are Kafka's, no index lacks its .log, no swap is left."""
    names = live(root)
    assert not [n for n in names if n.endswith(".swap")], names
    for name, data in names.items():
        p = parse_segment_file(name)
        if p is None or p.extra:
            continue
        assert f"{p.base_offset:020d}.log" in names, name
        if p.suffix == ".log":
            assert all(b["crc_ok"] for b in kp_parse(data))
            assert (names[f"{p.base_offset:020d}.index"], names[f"{p.base_offset:020d}.timeindex"]) == expected_indexes(
                data, p.base_offset, interval
            )


def old_or_new(got, old, new, groups):
    """Whether `got` is, per rewritten range [lo, hi), the old records of it or the new ones (and the same
    elsewhere)."""
    rest = [r for r in old if not any(lo <= r[0] < hi for lo, hi in groups)]
    for choice in itertools.product([0, 1], repeat=len(groups)):
        want = list(rest)
        for (lo, hi), c in zip(groups, choice, strict=False):
            want += [r for r in (new if c else old) if lo <= r[0] < hi]
        if got == sorted(want):
            return True
    return False


WORKLOADS = {
    "merge": (
        {"segment.bytes": "500", "retention.ms": "-1", "index.interval.bytes": "100"},
        [[(TS0 + i, b"k%d" % (i % 3), b"v%02d" % i + b"x" * 40, [])] for i in range(9)],
    ),
    "compaction": (
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.01",
            "segment.bytes": "600",
            "index.interval.bytes": "0",
        },
        [[(TS0 + i, b"k%d" % (i % 3), None if i == 4 else b"v%02d" % i + b"x" * 30, [])] * 2 for i in range(8)],
    ),
    "retention": (
        {"retention.bytes": "400", "retention.ms": "-1", "segment.bytes": "500", "index.interval.bytes": "0"},
        [[(TS0 + i, b"k", b"v%02d" % i + b"x" * 40, [])] for i in range(9)],
    ),
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_a_crash_at_every_object_operation_leaves_old_or_new_per_group(workload):
    config, appends = WORKLOADS[workload]
    fs0 = healthy()
    root0 = f"/crash-{uuid.uuid4().hex}"
    lm = LogManager(root0, fs=fs0)
    lm.create_topic("t", 1, config)
    for recs in appends:
        with lm.open_log(TP, writable=True) as log:
            log.append(kp_batch(recs))
    interval = int(config["index.interval.bytes"])
    now = int(time.time() * 1000) + 10_000  # every pass runs on a fixed clock: the lease never races real time,
    LogicalTimeStore.ceiling_ms = now  # nor do object times
    old = read_records(root0)

    # a healthy run: the "new" records, and the ranges the job rewrites
    ref_root = copy_root(root0)
    ref_fs = FaultyStore()
    reps = run_once(ref_root, fs=ref_fs, now_ms=now, cleaner_settings=SETTINGS, clock=lambda: now)
    assert not reps[0].errors
    new = read_records(ref_root)
    assert new != old or workload == "merge"
    with LogManager(ref_root, fs=healthy()).open_log(TP) as log:
        ref_bases = [s.base_offset for s in log.segments]
        ref_start = log.log_start_offset
    before = sorted(int(n[:20]) for n in live(root0) if n.endswith(".log"))
    groups = []  # the old ranges each rewritten or deleted segment came from
    for i, b in enumerate(ref_bases):
        hi = ref_bases[i + 1] if i + 1 < len(ref_bases) else None
        inside = [x for x in before if x >= b and (hi is None or x < hi)]
        if len(inside) > 1 or live(ref_root).get(f"{b:020d}.log") != live(root0).get(f"{b:020d}.log"):
            groups.append((b, hi if hi is not None else 1 << 62))
    if ref_start:
        groups.append((0, ref_start))  # retention: [0, log start) is all there or all gone
    total = len(ref_fs.ops)
    assert total > 10
    append_after(ref_root)  # the same writer's append and next pass, after a healthy run
    assert not run_once(
        ref_root, fs=healthy(), now_ms=now + 5_000, cleaner_settings=SETTINGS, clock=lambda: now + 5_000
    )[0].errors
    final_new = read_records(ref_root)
    final_new_all = old + [final_new[-1]]

    for k in range(total):
        root = copy_root(root0)
        with pytest.raises(Crash):
            run_once(root, fs=FaultyStore(crash_at=k), now_ms=now, cleaner_settings=SETTINGS, clock=lambda: now)
        got = read_records(root)  # a reader right after the crash
        assert len({r[0] for r in got}) == len(got), k
        assert old_or_new(got, old, new, groups), (k, got)
        assert append_after(root) == old[-1][0] + 1  # a writer goes on at the log end, swap pending or not
        # the next job (the crashed one's lease and swaps are abandoned by then) completes or redoes it
        reps = run_once(root, fs=healthy(), now_ms=now + 5_000, cleaner_settings=SETTINGS, clock=lambda: now + 5_000)
        assert not reps[0].errors, (k, reps[0].errors)
        final = read_records(root)
        if workload == "retention":  # retention.bytes counts the appended record too: a suffix, at least as short
            assert final == [r for r in final_new_all if r[0] >= final[0][0]] and final[0][0] >= new[0][0], k
        else:
            assert final == final_new, k
        check_objects(root, interval)
