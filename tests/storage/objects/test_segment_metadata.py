"""Lookups by time on object stores: the hint object's per-segment metadata against a brute-force model
(fresh, stale, rolled back, garbled, version-2 and missing hints, segments rewritten by a merge), the
requests the S3 server answers for a lookup on many segments, and chunked reads fetching each byte once."""

import json
import random
import uuid

import fsspec
import pyarrow as pa
import pytest

import storage.objects.object_reader as object_reader
from storage.cleaner.segment_merger import merge_small_segments
from storage.log_manager import LogManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.objects.segment_metadata import SegmentMetadata
from storage.objects.writer_state_hint import read_hint
from storage.records.builder import build_records
from storage.topic_partition import TopicPartition
from storage.transactions.writer_state import STATE_FILE

TP = TopicPartition("t", 0)
TS0 = 1_700_000_000_000


def memory_manager():
    fs = ObjectStoreFileSystem(fsspec.filesystem("memory"))
    lm = LogManager(f"/meta-{uuid.uuid4().hex}", fs=fs)
    lm.create_topic("t", 1, {"index.interval.bytes": "300"})
    return lm


def random_segments(lm, rng, n):
    """n appends (one segment object each) with timestamps that jump back and forth between and within
    segments; returns the model: the timestamp of every offset."""
    model = []
    with lm.open_log(TP, writable=True) as log:
        for s in range(n):
            k = rng.randint(1, 30)
            centre = TS0 + rng.choice([s * 1000, s * 1000, rng.randint(0, n * 1000)])  # some segments go back
            ts = [centre + rng.randint(-700, 700) for _ in range(k)]
            table = pa.table(
                {
                    "value": [b"v%d" % (len(model) + i) * rng.randint(1, 20) for i in range(k)],
                    "timestamp": pa.array(ts, pa.int64()),
                }
            )
            log.append(build_records(table, max_batch_bytes=rng.choice([150, 400, 10_000])))
            model += ts
    return model


def brute_force(model, t):
    return next((i for i, ts in enumerate(model) if ts >= t), None)


def lookup_all(lm, model, targets):
    with LogManager(lm.root, fs=lm.fs).open_log(TP) as log:
        return [log.offset_for_timestamp(t) for t in targets], [brute_force(model, t) for t in targets]


@pytest.mark.parametrize("seed", range(5))
def test_lookups_match_the_model_whatever_state_the_hint_is_in(seed):
    rng = random.Random(seed)
    lm = memory_manager()
    hint_path = lm.fs.join(lm.partition_dir(TP), STATE_FILE)
    model = random_segments(lm, rng, 25)
    fresh = json.loads(lm.fs.read(hint_path))
    assert fresh["version"] == 3 and len(fresh["segments"]) == 25
    with lm.open_log(TP) as log:  # the entries are each segment's own largest timestamp
        for seg in log.segments:
            assert fresh["segments"][str(seg.base_offset)] == [
                seg.size,
                max(model[seg.base_offset : log.segment_for(seg.base_offset).read_next_offset()]),
            ]
    targets = [TS0 - 10_000, TS0 + 30_000] + [rng.choice(model) + d for d in (-1, 0, 1) for _ in range(8)]

    def stale(doc):  # entries whose size is not the object's: must be ignored, whatever they say
        for e in doc["segments"].values():
            if rng.random() < 0.5:
                e[0] += rng.randint(1, 50)
                e[1] = rng.choice([-1, TS0 - 10**6, TS0 + 10**6])
        return doc

    def rolled_back(doc):  # an older hint won the race: the last segments have no entry
        keep = sorted(doc["segments"], key=int)[: rng.randint(0, 24)]
        doc["segments"] = {b: doc["segments"][b] for b in keep}
        return doc

    def version2(doc):  # written before segments were kept
        return {"version": 2, "asOf": doc["asOf"], "writers": doc["writers"]}

    states = {
        "fresh": lambda d: d,
        "stale": stale,
        "rolled back": rolled_back,
        "version 2": version2,
        "garbled": None,
        "missing": None,
        "bad entry": None,
    }
    for name, change in states.items():
        if name == "missing":
            lm.fs.delete(hint_path)
        elif name == "garbled":
            lm.fs.write_atomic(hint_path, b'{"version": 3, "asOf": ')
        elif name == "bad entry":
            doc = json.loads(json.dumps(fresh))
            doc["segments"]["0"] = ["x", 5]
            lm.fs.write_atomic(hint_path, json.dumps(doc).encode())
        else:
            lm.fs.write_atomic(hint_path, json.dumps(change(json.loads(json.dumps(fresh)))).encode())
        got, want = lookup_all(lm, model, targets)
        assert got == want, name


def test_a_merge_makes_entries_stale_not_wrong_and_the_next_append_renews_them():
    rng = random.Random(7)
    lm = memory_manager()
    model = random_segments(lm, rng, 12)
    targets = [rng.choice(model) + d for d in (-1, 0, 1) for _ in range(10)]
    with lm.open_log(TP) as log:
        res = merge_small_segments(log, min_age_ms=0)
    assert res.groups and res.segments_after < 12
    got, want = lookup_all(lm, model, targets)
    assert got == want
    with lm.open_log(TP, writable=True) as log:  # an append rewrites the hint from the merged segments
        log.append(build_records(pa.table({"value": [b"late"], "timestamp": pa.array([TS0 - 5], pa.int64())})))
        sizes = {s.base_offset: s.size for s in log.segments if s.size}
    model.append(TS0 - 5)
    hint = read_hint(lm.fs, lm.partition_dir(TP))
    assert {b: m.size for b, m in hint.segments.items()} == sizes
    got, want = lookup_all(lm, model, targets + [TS0 - 5])
    assert got == want


def test_only_the_segment_holding_the_answer_is_read(monkeypatch):
    """With a fresh hint a lookup reads one .timeindex and no other segment's objects; without one, it
    reads one 12-byte .timeindex tail per segment it passes over."""
    lm = memory_manager()
    with lm.open_log(TP, writable=True) as log:
        for s in range(40):
            log.append(
                build_records(
                    pa.table(
                        {
                            "value": [b"x" * 50] * 10,
                            "timestamp": pa.array([TS0 + s * 100 + i for i in range(10)], pa.int64()),
                        }
                    ),
                    max_batch_bytes=200,
                )
            )
    reads = []
    real_read, real_get = ObjectStoreFileSystem.read, object_reader.pinned_get

    def read(self, path, start=0, end=None):
        reads.append((path.rsplit("/", 1)[-1], start, end))
        return real_read(self, path, start, end)

    def get(fs, path, start, end, tag):
        reads.append((path.rsplit("/", 1)[-1], start, end))
        return real_get(fs, path, start, end, tag)

    monkeypatch.setattr(ObjectStoreFileSystem, "read", read)
    monkeypatch.setattr(object_reader, "pinned_get", get)
    target = 35 * 10 + 4  # in segment 35
    with LogManager(lm.root, fs=lm.fs).open_log(TP) as log:
        reads.clear()
        assert log.offset_for_timestamp(TS0 + 3504) == target
    seg35 = f"{350:020d}"
    assert {n for n, _, _ in reads} == {STATE_FILE, seg35 + ".timeindex", seg35 + ".index", seg35 + ".log"}
    lm.fs.delete(lm.fs.join(lm.partition_dir(TP), STATE_FILE))
    with LogManager(lm.root, fs=lm.fs).open_log(TP) as log:
        reads.clear()
        assert log.offset_for_timestamp(TS0 + 3504) == target
    tails = [(n, s, e) for n, s, e in reads if n.endswith(".timeindex") and n != seg35 + ".timeindex"]
    assert len(tails) == 35 and all(e - s == 12 for _, s, e in tails)


def test_reading_a_log_fetches_each_byte_once(monkeypatch):
    """Chunked reads continue after the batch a chunk cut off instead of fetching it again, and a read
    from an offset inside a segment scans from the index position once."""
    lm = memory_manager()
    rng = random.Random(3)
    with lm.open_log(TP, writable=True) as log:
        for _ in range(3):
            vals = [bytes(rng.randbytes(rng.randint(10, 3000))) for _ in range(400)]
            log.append(build_records(pa.table({"value": vals}), max_batch_bytes=rng.choice([4000, 40_000, 400_000])))
        sizes = [s.size for s in log.segments if s.size]
    fetched = []
    real_get = object_reader.pinned_get

    def get(fs, path, start, end, tag):
        data, t = real_get(fs, path, start, end, tag)
        if path.endswith(".log"):
            fetched.append((path.rsplit("/", 1)[-1], start, start + len(data)))
        return data, t

    monkeypatch.setattr(object_reader, "pinned_get", get)
    with LogManager(lm.root, fs=lm.fs).open_log(TP) as log:
        fetched.clear()
        assert sum(b.num_rows for b in log.read_records(0)) == 1200
        for name in {n for n, _, _ in fetched}:
            ranges = sorted((s, e) for n, s, e in fetched if n == name)
            assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False)), (name, ranges)  # no byte twice
        assert sum(e - s for _, s, e in fetched) == sum(sizes)
        fetched.clear()
        got = list(log.read_records(1000, 1010))
        assert pa.Table.from_batches(got).column("offset").to_pylist() == list(range(1000, 1010))
        ranges = sorted((s, e) for _, s, e in fetched)
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False)), ranges


def test_a_lookup_on_s3_is_bounded_and_reads_no_log_object_whole(s3_server, s3_root):
    url, opts = s3_root
    lm = LogManager(url, opts)
    lm.create_topic("t", 1)
    with lm.open_log(TP, writable=True) as log:
        for s in range(60):  # 60 segment objects of about 10 KB, ten batches each
            log.append(
                build_records(
                    pa.table(
                        {
                            "value": [b"y" * 180] * 50,
                            "timestamp": pa.array([TS0 + s * 1000 + i for i in range(50)], pa.int64()),
                        }
                    ),
                    max_batch_bytes=1000,
                )
            )
    sizes = {}
    with LogManager(url, opts).open_log(TP) as log:
        sizes = {s.log_path: s.size for s in log.segments}
    for s in (0, 30, 59):
        mark = s3_server.log.mark()
        with LogManager(url, opts).open_log(TP) as log:
            assert log.offset_for_timestamp(TS0 + s * 1000 + 25) == s * 50 + 25
        reqs = s3_server.log.since(mark)
        assert len(reqs) <= 10, [(r.method, r.path, r.range) for r in reqs]  # whatever the segment
        logs = [r for r in reqs if r.path.endswith(".log")]
        for r in logs:
            first, _, last = r.range[len("bytes=") :].partition("-")
            size = next(v for k, v in sizes.items() if r.path.endswith(k.rsplit("/", 1)[-1]))
            assert not (int(first) == 0 and int(last) >= size - 1), r  # never the whole object
    assert read_hint(lm.fs, lm.partition_dir(TP)).segments[0] == SegmentMetadata(next(iter(sizes.values())), TS0 + 49)


def test_an_append_whose_hint_cannot_be_written_or_read_is_still_appended(monkeypatch):
    """The hint is written after the commit point: failing to update it must not fail the append
    (a caller would retry it and append it twice); later lookups only read more."""
    from storage.errors import KafkaStorageError

    lm = memory_manager()
    with lm.open_log(TP, writable=True) as log:
        log.append(build_records(pa.table({"value": [b"a"], "timestamp": pa.array([TS0], pa.int64())})))
    real_write, real_read = ObjectStoreFileSystem.write_atomic, ObjectStoreFileSystem.read

    def write(self, path, data, **kw):
        if path.endswith(STATE_FILE):
            raise KafkaStorageError(f"{path}: injected PUT failure")
        return real_write(self, path, data, **kw)

    def read(self, path, start=0, end=None):
        if path.endswith(".log") and (start, end) == (0, 61):  # a first batch header, read for the hint
            raise KafkaStorageError(f"{path}: injected GET failure")
        return real_read(self, path, start, end)

    for name, fn in (("write_atomic", write), ("read", read)):
        with monkeypatch.context() as mp:
            mp.setattr(ObjectStoreFileSystem, name, fn)
            lm.fs.delete(lm.fs.join(lm.partition_dir(TP), STATE_FILE), missing_ok=True)  # headers must be read
            with LogManager(lm.root, fs=lm.fs).open_log(TP, writable=True) as log:
                n = log.log_end_offset
                info = log.append(
                    build_records(pa.table({"value": [b"b"], "timestamp": pa.array([TS0 + 10 * (n + 1)], pa.int64())}))
                )
                assert info.first_offset == n
    model = [TS0, TS0 + 20, TS0 + 30]
    with LogManager(lm.root, fs=lm.fs).open_log(TP) as log:
        assert log.log_end_offset == 3
    got, want = lookup_all(lm, model, [TS0 - 1, TS0 + 1, TS0 + 25, TS0 + 31])
    assert got == want == [0, 1, 2, None]
