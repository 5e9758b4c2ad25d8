"""Transactions through the upkeep of object-store logs.

- Merges and compaction: the swap publishes the output's `.txnindex` (when it has entries) and deletes the
  replaced segments' ones, as it does for `.index` and `.timeindex`; a read_committed reader over the result
  gives what Kafka's consumer rule gives over the objects (kafka-python's parse,
  tests/helpers/kafka_reference.kp_committed), and each `.txnindex` holds exactly the aborted transactions
  whose ABORT marker is in its segment (brute force over the parsed batches).
- A writable Log rewrites a lost `.txnindex` object (create-only); a reader only reads around it.
- The cleaner's aborted-transaction list over a range is capped (an injected small cap here).
- The maintenance job writes a Kafka-format producer snapshot at each merged segment's base (its entries against
  a brute-force model of Kafka's ProducerStateEntry rules over the parsed batches), a reader's transaction state
  starts there, and snapshots below the log start go.
"""

from __future__ import annotations

import struct
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pytest

import storage.cleaner.transaction_metadata as transaction_metadata
from storage.cleaner.transaction_metadata import collect_aborted_txns
from storage.common.time import SYSTEM_TIME, MockTime
from storage.errors import TooManyAbortedTransactionsError
from storage.log_maintenance import run_once
from storage.log_manager import LogManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.records.record_batch import CompressionType
from storage.staging import staged_commit as sc
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.producer_snapshot import list_snapshots, read_snapshot
from storage.transactions.transaction_index import ABORTED_TXN_DTYPE
from storage.transactions.transaction_state import TransactionState
from tests.helpers.index_checks import live_files
from tests.helpers.kafka_reference import kp_committed, kp_parse

TP = TopicPartition("t", 0)
T0 = SYSTEM_TIME.milliseconds()
TIMEOUT = 60_000
FAST = {"kafkalog.segment.merge.min.age.ms": "0"}
LIVE, DIES = 21, 22


def make(request, config) -> LogManager:
    if request.param == "s3":
        root, opts = request.getfixturevalue("s3_root")
        lm = LogManager(root, opts)
    else:
        lm = LogManager(f"/obj-{uuid.uuid4().hex}", fs=ObjectStoreFileSystem(fsspec.filesystem("memory")))
    lm.create_topic("t", 1, {"retention.ms": "-1", **config})
    return lm


def commit(lm, writer, batch, clock, keys) -> None:
    st = RecordStager(lm, writer, topic="t", compression=CompressionType.NONE)
    st.add(
        pa.table(
            {
                "key": pa.array([b"k%d" % k for k in keys], pa.binary()),
                "value": pa.array([b"w%d-b%d-%d" % (writer, batch, i) for i in range(len(keys))], pa.binary()),
                "partition": pa.array([0] * len(keys), pa.int32()),
            }
        )
    )
    commit_staged(lm, writer, batch, [st.finish()], transactional=True, transaction_timeout_ms=TIMEOUT, time=clock)


def aborted(lm, monkeypatch, batch, clock, keys) -> None:
    """A transaction whose writer dies before its decision, aborted past its timeout: an ABORT marker
    object and its one-entry `.txnindex` object."""
    with monkeypatch.context() as m:
        m.setattr(sc, "decide", _die)
        with pytest.raises(RuntimeError):
            commit(lm, DIES, batch, clock, keys)
    with lm.open_log(TP, writable=True) as log:
        (line,) = log.producer_state.resolve_pending(log, now_ms=clock.milliseconds() + TIMEOUT + 1)
        assert line.startswith("aborted")


def build(lm, monkeypatch) -> None:
    clock = MockTime(T0)
    for b in range(4):
        commit(lm, LIVE, b, clock, [b % 3, (b + 1) % 3])
        aborted(lm, monkeypatch, b, clock, [(b + 2) % 3, 5])
    commit(lm, LIVE, 4, clock, [0, 1])  # the last segment object: never rewritten


def segment_objects(lm) -> dict[int, dict[str, bytes]]:
    """base -> {suffix: bytes} of the live objects, from a fresh listing (no .swap left; .deleted twins and
    producer snapshots skipped)."""
    lm.fs.invalidate_listings(lm.partition_dir(TP))
    return live_files(lm, TP)


def aborts_by_marker(batches) -> list[tuple[int, int, int]]:
    """(producerId, first offset, ABORT marker offset) of each aborted transaction, by brute force: a producer's
    transaction begins at its first transactional batch after its previous marker (-1: none left)."""
    first: dict[int, int] = {}
    out = []
    for b in batches:
        pid = b["producer_id"]
        if b["is_control"]:
            start = first.pop(pid, -1)
            if int.from_bytes(b["records"][0][2][2:4], "big") == 0:
                out.append((pid, start, b["base_offset"]))
        elif b["is_transactional"]:
            first.setdefault(pid, b["base_offset"])
    return out


def check(lm, *, exact_entries: bool) -> list[int]:
    objs = segment_objects(lm)
    batches = []
    for base, files in objs.items():
        assert set(files) - {".txnindex"} == {".log", ".index", ".timeindex"}, (base, sorted(files))
        batches += kp_parse(files[".log"])
    ends = list(objs)[1:] + [batches[-1]["last_offset"] + 1]
    for (base, files), end in zip(objs.items(), ends, strict=True):
        rows = np.frombuffer(files.get(".txnindex", b""), ABORTED_TXN_DTYPE)
        assert ".txnindex" not in files or len(rows), f"empty .txnindex object at {base}"
        got = [(int(r["producer_id"]), int(r["first_offset"]), int(r["last_offset"])) for r in rows]
        want = [a for a in aborts_by_marker(batches) if base <= a[2] < end]
        if exact_entries:
            assert got == want, base
        else:  # compaction keeps the entries of the ABORT markers it keeps while their data was there to read
            assert {(p, last) for p, _, last in got} <= {(p, last) for p, _, last in want}, base
    model, still_open = kp_committed(batches)
    assert still_open == []
    with lm.open_log(TP) as log:
        t = pa.Table.from_batches(list(log.read_records(0, isolation_level="read_committed")))
        ours = sorted(zip(t.column("offset").to_pylist(), t.column("value").to_pylist(), strict=True))
    assert ours == sorted((r[0], r[3]) for r in model)
    return list(objs)


@pytest.fixture(params=["memory", "s3"])
def merge_lm(request):
    return make(request, {})


@pytest.fixture(params=["memory", "s3"])
def compact_lm(request):
    return make(request, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})


@pytest.mark.parametrize("lost", [False, True])
def test_a_merge_publishes_the_outputs_txnindex_and_deletes_the_replaced_ones(merge_lm, monkeypatch, lost):
    """`lost`: one source's `.txnindex` object is gone (a crash right after its ABORT marker): the output's
    still holds that transaction, taken from the log."""
    lm = merge_lm
    build(lm, monkeypatch)
    before = check(lm, exact_entries=True)
    assert len(before) == 18  # 4 x (data, COMMIT marker, data, ABORT marker) + the last commit's two
    if lost:
        lm.fs.delete(lm.fs.join(lm.partition_dir(TP), f"{before[3]:020d}.txnindex"))
    now = T0 + 10 * TIMEOUT
    reps = run_once(lm.root, fs=lm.fs, now_ms=now, cleaner_settings=FAST, clock=lambda: now)
    assert not reps[0].errors and reps[0].merged_groups == 1 and reps[0].merged_segments == 17
    assert check(lm, exact_entries=True) == [0, before[-1]]


def test_compaction_publishes_the_outputs_txnindex_and_deletes_the_replaced_ones(compact_lm, monkeypatch):
    lm = compact_lm
    build(lm, monkeypatch)
    now = T0 + 10 * TIMEOUT
    reps = run_once(lm.root, fs=lm.fs, now_ms=now, cleaner_settings=FAST, clock=lambda: now)
    assert not reps[0].errors and reps[0].cleaned
    check(lm, exact_entries=False)


@pytest.fixture(params=["memory", "s3"])
def plain_lm(request):
    return make(request, {})


def test_a_writable_log_rewrites_a_lost_txnindex_object_a_reader_does_not(plain_lm, monkeypatch):
    lm = plain_lm
    build(lm, monkeypatch)
    before = segment_objects(lm)
    lost = [b for b, f in before.items() if ".txnindex" in f][1:3]
    for b in lost:
        lm.fs.delete(lm.fs.join(lm.partition_dir(TP), f"{b:020d}.txnindex"))
    with lm.open_log(TP) as log:  # a reader takes the aborts from the log, writes nothing
        assert log.last_stable_offset == log.log_end_offset
    assert all(".txnindex" not in segment_objects(lm)[b] for b in lost)
    check(lm, exact_entries=False)  # read_committed is right without them
    with lm.open_log(TP, writable=True) as log:
        assert log.last_stable_offset == log.log_end_offset
    assert segment_objects(lm) == before  # the same bytes as the ABORT's own index object
    check(lm, exact_entries=True)


def test_the_cleaners_aborted_transactions_over_a_range_are_capped(compact_lm, monkeypatch):
    lm = compact_lm
    build(lm, monkeypatch)  # 4 aborted transactions, one `.txnindex` object each
    with lm.open_log(TP) as log:
        end = log.log_end_offset
        assert len(collect_aborted_txns(log, 0, end, max_entries=4)) == 4
        with pytest.raises(
            TooManyAbortedTransactionsError, match=rf"partition t-0: more than 3 .* offsets 0\.\.{end - 1}"
        ):
            collect_aborted_txns(log, 0, end, max_entries=3)
    monkeypatch.setattr(transaction_metadata, "MAX_CLEANER_ABORTED_TXNS", 3)
    now = T0 + 10 * TIMEOUT
    (rep,) = run_once(lm.root, fs=lm.fs, now_ms=now, cleaner_settings=FAST, clock=lambda: now)
    assert not rep.cleaned and any("more than 3 aborted transactions" in e for e in rep.errors), rep.errors


def producer_model(lm, below: int) -> list[tuple]:
    """Kafka's ProducerStateEntry per producer id after the batches below `below` (ProducerAppendInfo.append),
    by brute force over kafka-python's parse plus the header fields it does not give (epoch, baseSequence)."""
    entries: dict[int, list[int]] = {}
    for files in segment_objects(lm).values():
        raw = files[".log"]
        for b in kp_parse(raw):
            pid = b["producer_id"]
            if b["base_offset"] >= below or pid < 0:
                continue
            epoch, base_seq = struct.unpack_from(">hi", raw, b["position"] + 51)
            e = entries.setdefault(pid, [pid, -1, -1, -1, 0, -1, -1, -1])
            if b["is_control"]:  # same epoch: the batch metadata stays; the marker's timestamp, no open txn
                e[1], e[5], e[6], e[7] = epoch, b["records"][0][1], struct.unpack(">hi", b["records"][0][3])[1], -1
            else:
                delta = b["last_offset"] - b["base_offset"]
                e[1:6] = [epoch, base_seq + delta, b["last_offset"], delta, b["max_timestamp"]]
                if b["is_transactional"] and e[7] < 0:
                    e[7] = b["base_offset"]
    return [tuple(e) for _, e in sorted(entries.items())]


@pytest.fixture(params=["memory", "s3"])
def small_lm(request):
    return make(request, {"segment.bytes": "400"})  # a merge makes several groups


def test_the_job_writes_producer_snapshots_at_merged_bases_and_drops_those_below_the_start(small_lm, monkeypatch):
    lm = small_lm
    build(lm, monkeypatch)
    now = T0 + 10 * TIMEOUT
    (rep,) = run_once(lm.root, fs=lm.fs, now_ms=now, cleaner_settings=FAST, clock=lambda: now)
    assert not rep.errors and rep.merged_groups >= 3, rep.line()
    bases = list(segment_objects(lm))
    snaps = list_snapshots(lm.fs, lm.partition_dir(TP))
    # one at each merged segment's base but the first (offset 0: no producer before it)
    assert rep.snapshots_written == len(snaps) == rep.merged_groups - 1
    assert all(s.offset in bases for s in snaps)
    for s in snaps:
        got = [tuple(int(v) for v in row) for row in read_snapshot(lm.fs, s.path).tolist()]
        assert got == producer_model(lm, s.offset), s.offset
    with lm.open_log(TP) as log:
        state = TransactionState.load(log, log.log_end_offset)
        assert state.scan_start == snaps[-1].offset and state.ongoing == {}
    check(lm, exact_entries=True)
    lm.delete_records(TP, snaps[-1].offset)  # the log start passes every snapshot but the last
    (rep,) = run_once(lm.root, fs=lm.fs, now_ms=now, cleaner_settings=FAST, clock=lambda: now)
    assert not rep.errors and list_snapshots(lm.fs, lm.partition_dir(TP)) == snaps[-1:]


def _die(*a, **kw):
    raise RuntimeError("injected: the writer dies here")
