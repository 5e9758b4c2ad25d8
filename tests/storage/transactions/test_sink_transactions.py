"""The sink's micro-batch as one Kafka transaction over every partition it writes (issue 24 part 4).

Checked against kafka-python's parser (attributes, producer fields, CRCs, the markers' records), against
Kafka's own marker encoder in control_records (EndTransactionMarker.to_batch), and against a brute-force
model: for a crash injected between every step of the commit (after the data of partition k of n, after the
decision, after the marker of partition k of n), the next opener must leave a log whose read_committed view
holds exactly the committed micro-batches once, with no offset reused and nothing that was in the log cut.
"""

from __future__ import annotations

import json
import os
import struct

import pyarrow as pa
import pytest
from kafka.record.memory_records import MemoryRecords

from storage.common.time import SYSTEM_TIME, MockTime
from storage.errors import TransactionAbortedError
from storage.log_manager import LogManager
from storage.records.record_batch import CompressionType
from storage.staging import staged_commit as sc
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.control_records import ControlRecordType, EndTransactionMarker
from storage.transactions.producer_state_manager import ProducerStateManager
from storage.transactions.transaction_coordinator import (
    ABORT,
    TRANSACTIONS_DIR,
    decide,
    marker_batch,
)
from storage.transactions.transaction_index import TransactionIndex

PARTITIONS = 3
W = 42  # the writer id
TIMEOUT = 600_000  # transaction.timeout.ms of the timeout tests: far longer than a test runs


# ---------------------------------------------------------------- helpers


def stage(lm, rows, task=0, writer=W, **kw):
    st = RecordStager(lm, writer, topic="t", compression=CompressionType.NONE, task_index=task, **kw)
    st.add(rows)
    return st.finish()


def table(batch, n=30):
    """n rows tagged with the micro-batch they belong to, spread over the partitions by key."""
    return pa.table(
        {
            "key": pa.array([f"k{i}".encode() for i in range(n)], pa.binary()),
            "value": pa.array([f"b{batch}-{i}".encode() for i in range(n)], pa.binary()),
        }
    )


def partition_bytes(root, p):
    d = os.path.join(root, f"t-{p}")
    return b"".join(open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d)) if f.endswith(".log"))


def kp_batches(data: bytes) -> list[dict]:
    """Every batch as kafka-python parses it: header fields and records (control ones included)."""
    out = []
    recs = MemoryRecords(bytes(data))
    while recs.has_next():
        b = recs.next_batch()
        if b is None:
            break
        out.append(
            {
                "base_offset": b.base_offset,
                "last_offset": b.last_offset,
                "transactional": b.is_transactional,
                "control": b.is_control_batch,
                "producer_id": b.producer_id,
                "producer_epoch": b.producer_epoch,
                "base_sequence": b.base_sequence,
                "crc_ok": b.validate_crc(),
                "records": [(r.offset, r.key, r.value) for r in b],
            }
        )
    return out


def txn_index_entries(root, p) -> list[tuple[int, int, int, int]]:
    d = os.path.join(root, f"t-{p}")
    out = []
    for f in sorted(os.listdir(d)):
        if f.endswith(".txnindex"):
            idx = TransactionIndex.for_segment(LogManager(root).fs, d, int(f.split(".")[0]))
            out += [tuple(t) for t in idx.all_aborted_txns()]
    return out


def read_committed(batches: list[dict], aborted: list[tuple]) -> tuple[list[bytes], int]:
    """A tiny read_committed consumer (Kafka's Fetcher rules) over the whole partition: values of the data
    records it returns, and the last stable offset. Aborted (producerId, firstOffset) pairs come from the
    .txnindex entries; a producer's batches from an aborted first offset are dropped until its ABORT marker;
    nothing at or past the first offset of a transaction still open is returned."""
    open_first: dict[int, int] = {}  # producer -> first offset of its open transaction
    for b in batches:
        if b["transactional"] and not b["control"]:
            open_first.setdefault(b["producer_id"], b["base_offset"])
        elif b["control"]:
            open_first.pop(b["producer_id"], None)
    lso = min(open_first.values()) if open_first else (batches[-1]["last_offset"] + 1 if batches else 0)
    pending = sorted(aborted, key=lambda t: t[1])
    dropping: set[int] = set()
    values = []
    for b in batches:
        if b["base_offset"] >= lso:
            break
        while pending and pending[0][1] <= b["last_offset"]:
            dropping.add(pending.pop(0)[0])
        if b["control"]:
            key = b["records"][0][1]
            if struct.unpack(">hh", key)[1] == ControlRecordType.ABORT:
                dropping.discard(b["producer_id"])
            continue
        if b["transactional"] and b["producer_id"] in dropping:
            continue
        values += [r[2] for r in b["records"]]
    return values, lso


def committed_view(root, partitions: int = PARTITIONS) -> tuple[dict[int, list[bytes]], dict[int, int]]:
    views, lsos = {}, {}
    for p in range(partitions):
        views[p], lsos[p] = read_committed(kp_batches(partition_bytes(root, p)), txn_index_entries(root, p))
    return views, lsos


def expected_values(batches: list[int]) -> list[bytes]:
    return sorted(f"b{b}-{i}".encode() for b in batches for i in range(30))


# ---------------------------------------------------------------- formats


def test_marker_batch_is_kafkas_end_transaction_marker_byte_for_byte():
    for kind in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
        ours = marker_batch(int(kind), base_offset=17, timestamp=1_700_000_000_123, producer_id=W, producer_epoch=0)
        kafka = EndTransactionMarker(kind, 0).to_batch(
            base_offset=17, timestamp=1_700_000_000_123, producer_id=W, producer_epoch=0
        )
        assert bytes(ours) == bytes(kafka)
        (b,) = kp_batches(ours)
        assert b["control"] and b["transactional"] and b["crc_ok"] and b["base_sequence"] == -1
        assert b["producer_id"] == W and b["producer_epoch"] == 0


def test_a_committed_micro_batch_is_transactional_with_one_commit_marker_per_partition(root):
    lm = LogManager(root)
    lm.create_topic("t", PARTITIONS)
    r = commit_staged(lm, W, 5, [stage(lm, table(5), task=0), stage(lm, table(6), task=1)], transactional=True)
    assert r.records == 60 and sorted(r.appended) == [TopicPartition("t", p) for p in range(PARTITIONS)]
    for p in range(PARTITIONS):
        batches = kp_batches(partition_bytes(root, p))
        assert all(b["crc_ok"] for b in batches)
        *data, marker = batches
        assert data and all(
            b["transactional"]
            and not b["control"]
            and (b["producer_id"], b["producer_epoch"], b["base_sequence"]) == (W, 0, 5)
            for b in data
        )
        assert marker["control"] and marker["transactional"] and marker["producer_id"] == W
        assert marker["records"][0][1:] == (struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 0))  # COMMIT, epoch 0
        assert marker["base_offset"] == data[-1]["last_offset"] + 1
        assert r.appended[TopicPartition("t", p)] == (0, data[-1]["last_offset"])
        state = ProducerStateManager(lm.fs, lm.partition_dir(TopicPartition("t", p)))
        assert state.entry(W).committed_batch_id == 5 and state.entry(W).pending is None
    assert os.listdir(os.path.join(root, TRANSACTIONS_DIR, str(W))) == []  # the decision went with its markers
    views, lsos = committed_view(root)
    assert sorted(v for vs in views.values() for v in vs) == expected_values([5, 6])
    # a replay of the batch is skipped everywhere, and writes nothing
    again = commit_staged(lm, W, 5, [stage(lm, table(5))], transactional=True)
    assert not again.appended and len(again.skipped) == PARTITIONS
    assert committed_view(root)[0] == views


def test_an_adopted_staging_segment_is_stamped_transactional(root):
    from storage.staging.record_stager import ADOPT_MIN_BYTES

    lm = LogManager(root)
    lm.create_topic("t", 1)
    n = ADOPT_MIN_BYTES // 100 + 1000
    big = pa.table({"value": pa.array([os.urandom(120) for _ in range(n)], pa.binary())})
    f = stage(lm, big)
    assert f.partitions[0].adopt
    commit_staged(lm, W, 3, [f], transactional=True)
    *data, marker = kp_batches(partition_bytes(root, 0))
    assert sum(len(b["records"]) for b in data) == n and marker["control"]
    assert all(b["crc_ok"] and b["transactional"] and (b["producer_id"], b["base_sequence"]) == (W, 3) for b in data)


@pytest.mark.parametrize("held", [64, 1])
def test_a_partition_is_opened_once_per_transaction_unless_there_are_too_many(root, monkeypatch, held):
    """Each partition's log stays open from its data to its marker (no second load of the partition), up to
    HELD_LOGS partitions; beyond, each is opened again for its marker. Both end in the same committed view."""
    monkeypatch.setattr(sc, "HELD_LOGS", held)
    lm = LogManager(root)
    lm.create_topic("t", PARTITIONS)
    opened = []
    real = LogManager.open_log

    def counting(self, tp, **kw):
        opened.append(tp.partition)
        return real(self, tp, **kw)

    monkeypatch.setattr(LogManager, "open_log", counting)
    for batch in (0, 1):
        commit_staged(lm, W, batch, [stage(lm, table(batch))], transactional=True)
    assert len(opened) == 2 * PARTITIONS * (1 if held >= PARTITIONS else 2)
    views, _ = committed_view(root)
    assert sorted(v for vs in views.values() for v in vs) == expected_values([0, 1])


def _damage_a_record(piece) -> int:
    """Flip a byte inside the records of a staged segment's second batch (after its CRC was written); returns
    the batch's base offset in the staging log."""
    seg = piece.segments[0]
    path = os.path.join(seg.dir, f"{seg.base_offset:020d}.log")
    with open(path, "r+b") as f:
        f.seek(int(seg.positions[1]) + 70)
        byte = f.read(1)
        f.seek(int(seg.positions[1]) + 70)
        f.write(bytes([byte[0] ^ 0x20]))
    return int(seg.base_offsets[1])


def test_an_adopted_segment_damaged_after_staging_stays_damaged_after_its_stamp(root):
    """The stamp updates CRCs for the header edit alone (no pass over the records): a record damaged since it
    was staged keeps a CRC that does not match, so kafka-python and our reader both still reject that batch."""
    from storage.errors import CorruptRecordError
    from storage.staging.record_stager import ADOPT_MIN_BYTES

    lm = LogManager(root)
    lm.create_topic("t", 1)
    n = ADOPT_MIN_BYTES // 100 + 1000
    f = stage(lm, pa.table({"value": pa.array([os.urandom(120) for _ in range(n)], pa.binary())}))
    assert f.partitions[0].adopt
    _damage_a_record(f.partitions[0])
    commit_staged(lm, W, 3, [f], transactional=True)
    *data, marker = kp_batches(partition_bytes(root, 0))
    assert [b["crc_ok"] for b in data] == [i != 1 for i in range(len(data))]
    assert all(b["transactional"] and (b["producer_id"], b["base_sequence"]) == (W, 3) for b in data)
    with lm.open_log(TopicPartition("t", 0)) as log, pytest.raises(CorruptRecordError, match="CRC"):
        for _ in log.read_records(0):
            pass


def test_a_copied_piece_damaged_after_staging_fails_its_commit_with_nothing_appended(root):
    from storage.errors import CorruptRecordError

    lm = LogManager(root)
    lm.create_topic("t", 1)
    f = stage(
        lm, pa.table({"value": pa.array([os.urandom(120) for _ in range(200)], pa.binary())}), max_batch_bytes=4000
    )
    assert not f.partitions[0].adopt
    _damage_a_record(f.partitions[0])
    with pytest.raises(CorruptRecordError, match="CRC"):
        commit_staged(lm, W, 3, [f], transactional=True)
    with lm.open_log(TopicPartition("t", 0)) as log:
        assert log.log_end_offset == 0


# ---------------------------------------------------------------- crashes at every step


class Crash(BaseException):
    """A committer killed at a step (BaseException: nothing on the way catches it)."""


def crash_after(monkeypatch, step: str, k: int):
    """Make the commit die right after the k-th (1-based) `step`: 'data' (a partition's durable data),
    'decision', or 'marker' (a partition's marker)."""
    calls = {"n": 0}
    name = {"data": "_transaction_data", "decision": "decide", "marker": "_transaction_marker"}[step]
    real = getattr(sc, name)

    def wrapped(*a, **kw):
        out = real(*a, **kw)
        calls["n"] += 1
        if calls["n"] == k:
            raise Crash(f"after {step} {k}")
        return out

    monkeypatch.setattr(sc, name, wrapped)


CRASH_POINTS = [("data", k) for k in range(1, PARTITIONS + 1)] + [("decision", 1)]
CRASH_POINTS += [("marker", k) for k in range(1, PARTITIONS + 1)]


def _snapshot_batches(root) -> dict[int, list[tuple]]:
    """(base offset, last offset, records) of every batch per partition: what readers may have seen."""
    return {
        p: [(b["base_offset"], b["last_offset"], b["records"]) for b in kp_batches(partition_bytes(root, p))]
        for p in range(PARTITIONS)
    }


@pytest.mark.parametrize("next_opener", ["replay", "timeout"])
@pytest.mark.parametrize("step, k", CRASH_POINTS)
def test_a_crash_at_any_step_leaves_every_micro_batch_committed_once_or_not_at_all(
    root, monkeypatch, step, k, next_opener
):
    lm = LogManager(root)
    lm.create_topic("t", PARTITIONS)
    commit_staged(lm, W, 0, [stage(lm, table(0))], transactional=True)
    with monkeypatch.context() as m:
        crash_after(m, step, k)
        with pytest.raises(Crash):
            commit_staged(LogManager(root), W, 1, [stage(lm, table(1))], transactional=True)
    seen = _snapshot_batches(root)  # everything a reader at read_uncommitted may have read
    decided = step in ("decision", "marker")
    # while the transaction is open, read_committed stops before it: only batch 0 is visible
    views, lsos = committed_view(root)
    if not decided:
        assert sorted(v for vs in views.values() for v in vs) == expected_values([0])
    clock = MockTime(10**13)  # far past any timeout
    if next_opener == "replay":  # Spark replays batch 1 from a restarted query (the same writer id)
        commit_staged(LogManager(root), W, 1, [stage(lm, table(1))], transactional=True)
        model = [0, 1]
    else:  # the writer never comes back: another writer and the maintenance job resolve it after the timeout
        lm2 = LogManager(root)
        for p in range(PARTITIONS):
            with lm2.open_log(TopicPartition("t", p), writable=True) as log:
                log.producer_state.resolve_pending(log, now_ms=clock.milliseconds())
        commit_staged(lm2, 77, 0, [stage(lm2, table(2), writer=77)], transactional=True)
        model = [0, 1, 2] if decided else [0, 2]
    views, lsos = committed_view(root)
    assert sorted(v for vs in views.values() for v in vs) == expected_values(model)
    after = _snapshot_batches(root)
    for p in range(PARTITIONS):
        assert after[p][: len(seen[p])] == seen[p]  # nothing cut, no offset holds other bytes
        offsets = [o for b in after[p] for o in range(b[0], b[1] + 1)]
        assert offsets == sorted(set(offsets))  # no offset reused
        assert lsos[p] == after[p][-1][1] + 1  # nothing left open
        # every ABORT marker has its .txnindex entry (Kafka's consumer finds aborted data only through them)
        aborts = [
            b["base_offset"]
            for b in kp_batches(partition_bytes(root, p))
            if b["control"] and struct.unpack(">hh", b["records"][0][1])[1] == 0
        ]
        assert [e[2] for e in txn_index_entries(root, p)] == aborts
    for p in range(PARTITIONS):
        state = ProducerStateManager(lm.fs, lm.partition_dir(TopicPartition("t", p)))
        assert all(e.pending is None for e in state.writers.values())
    decisions = os.path.join(root, TRANSACTIONS_DIR, str(W))
    left = [json.load(open(os.path.join(decisions, n)))["decision"] for n in os.listdir(decisions)]
    if next_opener == "replay":  # the restarted query removed the commit decision its predecessor left
        assert "commit" not in left


def test_an_open_transaction_holds_the_lso_until_its_timeout_then_is_aborted(root, monkeypatch):
    """Another writer that opens the partition before transaction.timeout.ms leaves the transaction open (the
    LSO stays at its first offset); past it, the opener aborts it: ABORT marker, .txnindex entry whose
    lastStableOffset is the first offset of the other transaction still open."""
    lm = LogManager(root)
    lm.create_topic("t", 1)
    clock = MockTime(SYSTEM_TIME.milliseconds())  # writable opens also resolve, by the system clock
    with monkeypatch.context() as m:
        crash_after(m, "data", 1)
        with pytest.raises(Crash):
            commit_staged(
                lm, W, 0, [stage(lm, table(0))], transactional=True, transaction_timeout_ms=TIMEOUT, time=clock
            )
    tp = TopicPartition("t", 0)
    with monkeypatch.context() as m:  # writer 77 dies after its data too: two open transactions
        crash_after(m, "data", 1)
        with pytest.raises(Crash):
            commit_staged(
                lm,
                77,
                0,
                [stage(lm, table(1), writer=77)],
                transactional=True,
                transaction_timeout_ms=2 * TIMEOUT,
                time=clock,
            )
    with lm.open_log(tp, writable=True) as log:
        assert log.producer_state.resolve_pending(log, now_ms=clock.milliseconds() + TIMEOUT - 1) == []
    _, lsos = committed_view(root, 1)
    assert lsos[0] == 0
    with lm.open_log(tp, writable=True) as log:
        done = log.producer_state.resolve_pending(log, now_ms=clock.milliseconds() + TIMEOUT + 1)
        assert len(done) == 1 and f"writer {W}" in done[0]
        first77 = log.producer_state.entry(77).pending.first_offset
        marker = log.log_end_offset - 1
    assert txn_index_entries(root, 0) == [(W, 0, marker, first77)]
    views, lsos = committed_view(root, 1)
    assert views[0] == [] and lsos[0] == first77  # writer 77's transaction still holds it
    decision_dir = os.path.join(root, TRANSACTIONS_DIR, str(W))
    (name,) = os.listdir(decision_dir)
    assert json.load(open(os.path.join(decision_dir, name)))["decision"] == ABORT


def test_the_maintenance_job_aborts_a_transaction_past_its_timeout(root, monkeypatch):
    from storage.log_maintenance import maintain_partition

    lm = LogManager(root)
    lm.create_topic("t", 1)
    clock = MockTime(SYSTEM_TIME.milliseconds())  # writable opens also resolve, by the system clock
    with monkeypatch.context() as m:
        crash_after(m, "data", 1)
        with pytest.raises(Crash):
            commit_staged(
                lm, W, 0, [stage(lm, table(0))], transactional=True, transaction_timeout_ms=TIMEOUT, time=clock
            )
    rep = maintain_partition(root, TopicPartition("t", 0), now_ms=clock.milliseconds() + TIMEOUT // 2)
    assert not rep.errors and txn_index_entries(root, 0) == []
    rep = maintain_partition(root, TopicPartition("t", 0), now_ms=clock.milliseconds() + TIMEOUT + 1)
    assert not rep.errors and len(txn_index_entries(root, 0)) == 1
    views, lsos = committed_view(root, 1)
    assert views[0] == [] and lsos[0] == kp_batches(partition_bytes(root, 0))[-1]["last_offset"] + 1


def test_a_writer_that_loses_the_decision_aborts_every_partition_and_fails_the_batch(root, monkeypatch):
    lm = LogManager(root)
    lm.create_topic("t", PARTITIONS)
    real = sc.decide

    def aborted_first(fs, path, outcome, detail):  # an opener aborted it (timeout) just before
        decide(fs, path, ABORT, {"reason": "test"})
        return real(fs, path, outcome, detail)

    monkeypatch.setattr(sc, "decide", aborted_first)
    with pytest.raises(TransactionAbortedError, match="aborted by another opener"):
        commit_staged(lm, W, 0, [stage(lm, table(0))], transactional=True)
    monkeypatch.setattr(sc, "decide", real)
    views, lsos = committed_view(root)
    assert views == {p: [] for p in range(PARTITIONS)}
    assert all(len(txn_index_entries(root, p)) == 1 for p in range(PARTITIONS))
    commit_staged(lm, W, 0, [stage(lm, table(0))], transactional=True)  # the replay: a new transaction
    views, _ = committed_view(root)
    assert sorted(v for vs in views.values() for v in vs) == expected_values([0])


@pytest.mark.parametrize("opener", ["restarted writer", "timeout"])
def test_a_lost_state_update_after_the_markers_is_read_back_from_the_log(root, monkeypatch, opener):
    """The state file's update after a marker is not fsynced and the decision is deleted once every marker is
    in: if a crash loses that update, the next opener finds the marker in the log and must not abort a
    committed transaction (an ABORT after it would hide the committed data from read_committed readers)."""
    from storage.transactions.writer_state import STATE_FILE

    lm = LogManager(root)
    lm.create_topic("t", 1)
    path = os.path.join(lm.partition_dir(TopicPartition("t", 0)), STATE_FILE)
    saved = {}
    real = sc._transaction_marker

    def keep_pending_state(*a, **kw):  # the state file as it was before the marker phase
        saved["raw"] = open(path, "rb").read()
        return real(*a, **kw)

    monkeypatch.setattr(sc, "_transaction_marker", keep_pending_state)
    commit_staged(lm, W, 0, [stage(lm, table(0))], transactional=True)
    open(path, "wb").write(saved["raw"])  # the power cut took the update
    assert ProducerStateManager(lm.fs, os.path.dirname(path)).entry(W).pending is not None
    tp = TopicPartition("t", 0)
    with lm.open_log(tp, writable=True) as log:
        if opener == "timeout":
            done = log.producer_state.resolve_pending(log, now_ms=SYSTEM_TIME.milliseconds() + 10**9)
        else:
            done = log.producer_state.resolve_pending(log, opener=W)
        assert done and done[0].startswith("committed batch 0")
        assert log.producer_state.entry(W).committed_batch_id == 0
    views, lsos = committed_view(root, 1)
    assert sorted(views[0]) == sorted(v for v in expected_values([0]) if v in views[0]) and views[0]
    assert (
        txn_index_entries(root, 0) == [] and len([b for b in kp_batches(partition_bytes(root, 0)) if b["control"]]) == 1
    )


def test_markers_stay_uncompressed_control_batches_on_a_compressed_topic(root):
    """Kafka's LogValidator never recompresses an uncompressed control batch, whatever compression.type says."""
    lm = LogManager(root)
    lm.create_topic("t", 1, {"compression.type": "zstd"})
    commit_staged(lm, W, 0, [stage(lm, table(0))], transactional=True)
    *data, marker = kp_batches(partition_bytes(root, 0))
    assert marker["control"] and marker["transactional"] and marker["crc_ok"]
    assert marker["records"][0][1] == struct.pack(">hh", 0, 1)
    raw = partition_bytes(root, 0)
    assert struct.unpack_from(">h", raw, len(raw) - 78 + 21)[0] == 0x30  # attributes: no codec bits
    assert all(b["transactional"] for b in data)
