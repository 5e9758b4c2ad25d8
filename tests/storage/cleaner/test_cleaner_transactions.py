"""Compaction of logs a transactional producer wrote, held to Kafka's rules (tests/helpers/compaction_model.py
TxnModel): aborted batches go, committed transactional keys compact like any other, a marker stays while its
transaction has data and then until its delete horizon, the cleaned `.txnindex` keeps only aborts whose marker
has data, and nothing at or past the last stable offset is cleaned. Batches are built by kafka-python and the
cleaned files parsed by it."""

from __future__ import annotations

import struct
import uuid

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from storage.cleaner.log_cleaner_manager import LogCleanerManager
from storage.records import record_batch as rb
from storage.transactions.transaction_index import AbortedTxn, TransactionIndex
from tests.helpers.compaction_model import ABORT, COMMIT, TxnModel
from tests.helpers.index_checks import live_files
from tests.storage.cleaner.test_cleaner import TP, append, batch_headers, make, parsed_records

MARKER_KEYS = {ABORT: b"\x00\x00\x00\x00", COMMIT: b"\x00\x00\x00\x01"}
MARKER_VALUE = b"\x00\x00\x00\x00\x00\x07"  # version 0, coordinator epoch 7


def txn_batch(records, producer_id: int, codec: int = 0) -> bytes:
    """A transactional data batch built by kafka-python."""
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        batch_size=2**30,
    )
    for i, (ts, key, value, headers) in enumerate(records):
        b.append(i, timestamp=ts, key=key, value=value, headers=list(headers or []))
    return bytes(b.build())


def marker_batch(kind: int, producer_id: int, ts: int) -> bytes:
    """A COMMIT/ABORT control batch: kafka-python's batch of the marker record, attributes set to 0x30."""
    raw = bytearray(txn_batch([(ts, MARKER_KEYS[kind], MARKER_VALUE, [])], producer_id))
    struct.pack_into(">h", raw, rb.ATTRIBUTES_OFFSET, rb.CONTROL_FLAG_MASK | rb.TRANSACTIONAL_FLAG_MASK)
    struct.pack_into(">i", raw, 53, -1)  # baseSequence -1, as Kafka's markers
    struct.pack_into(">I", raw, rb.CRC_OFFSET, rb.compute_crc(raw))
    return bytes(raw)


def append_txn(lm, model: TxnModel, records, producer_id: int, codec: int = 0) -> int:
    with lm.open_log(TP, writable=True) as log:
        base = log.append(txn_batch(records, producer_id, codec)).first_offset
    model.append(base, records, producer_id, transactional=True)
    return base


def end_txn(lm, model: TxnModel, producer_id: int, kind: int, ts: int) -> int:
    """Append the marker and, for an ABORT, the entry a broker writes to the `.txnindex` of the marker's segment."""
    first = model.open[producer_id]
    with lm.open_log(TP, writable=True) as log:
        offset = log.append(marker_batch(kind, producer_id, ts)).first_offset
        active = log.active_segment.base_offset
        end = log.log_end_offset
    model.end_txn(offset, ts, producer_id, kind, MARKER_KEYS[kind], MARKER_VALUE)
    if kind == ABORT:
        index = TransactionIndex.for_segment(lm.fs, lm.partition_dir(TP), active)
        index.append(AbortedTxn(producer_id, first, offset, model.last_stable_offset(end)))
        index.flush()
        index.close()
    return offset


def txn_index_entries(lm) -> set:
    out = set()
    for files in live_files(lm, TP).values():
        raw = files.get(".txnindex", b"")
        rows = np.frombuffer(raw, [("v", ">i2"), ("pid", ">i8"), ("first", ">i8"), ("last", ">i8"), ("lso", ">i8")])
        assert (rows["v"] == 0).all()
        out |= {(int(r["pid"]), int(r["first"]), int(r["last"])) for r in rows}
    return out


def expected_end(lm, model: TxnModel) -> int:
    """The first uncleanable offset: the base of the segment holding min(LSO, active segment base)."""
    with lm.open_log(TP) as log:
        bound = min(model.last_stable_offset(log.log_end_offset), log.active_segment.base_offset)
        bases = [s.base_offset for s in log.segments]
    return max(b for b in bases if b <= bound)


# ---------------------------------------------------------------------------------------- model test
KEYS = [b"a", b"b", b"c", MARKER_KEYS[COMMIT], None]  # a data key equal to a marker's key must not touch it
record_st = st.tuples(
    st.integers(0, 4000),
    st.sampled_from(KEYS),
    st.one_of(st.none(), st.binary(max_size=30)),
    st.just([]),
)
op_st = st.one_of(
    st.tuples(st.just("data"), st.lists(record_st, min_size=1, max_size=4), st.sampled_from([0, 1, 3])),
    st.tuples(st.just("txn"), st.lists(record_st, min_size=1, max_size=4), st.sampled_from([1, 2])),
    st.tuples(st.just("commit"), st.just(0), st.sampled_from([1, 2])),
    st.tuples(st.just("abort"), st.just(0), st.sampled_from([1, 2])),
    st.tuples(st.just("clean"), st.integers(0, 3000), st.just(0)),
    st.tuples(st.just("roll"), st.just(0), st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(op_st, min_size=2, max_size=30),
    segment_bytes=st.integers(200, 1200),
    retention=st.sampled_from([0, 700, 2500]),
)
def test_transactional_compaction_matches_kafkas_rules(ops, segment_bytes, retention):
    lm = make(f"memory://kl-{uuid.uuid4().hex}", segment_bytes=segment_bytes, delete_retention_ms=retention)
    mgr = LogCleanerManager(lm)
    model = TxnModel(retention)
    now = 10_000
    fence = 0
    for op, arg, extra in ops + [("commit", 0, 1), ("abort", 0, 2), ("clean", 1000, 0), ("clean", 3000, 0)]:
        if op == "data":
            recs = [(now - 2000 + ts, k, v, hs) for ts, k, v, hs in arg]
            model.append(append(lm, recs, ["none", "gzip", "lz4", "zstd"][extra]), recs)
        elif op == "txn":
            append_txn(lm, model, [(now - 2000 + ts, k, v, hs) for ts, k, v, hs in arg], extra)
        elif op in ("commit", "abort"):
            if extra in model.open:
                end_txn(lm, model, extra, COMMIT if op == "commit" else ABORT, now - 1000)
        elif op == "roll":
            # a record of its own key ends each segment, so no cleaned segment ends in an empty batch
            fence += 1
            recs = [(now - 2000, b"fence-%d" % fence, b"x", [])]
            model.append(append(lm, recs), recs)
            with lm.open_log(TP, writable=True) as log:
                log.roll()
        else:
            now += arg
            end = expected_end(lm, model)
            empties = [
                (h.base_offset, h.producer_id)
                for h in batch_headers(lm)
                if not h.record_count and h.is_transactional and not h.is_control
            ]
            res = mgr.clean_partition(TP, now, force=True)
            assert res.ok, res.error
            assert (res.first_dirty_offset, res.end_offset) == (model.checkpoint, max(end, model.checkpoint))
            model.clean(model.checkpoint, max(end, model.checkpoint), now, empties)
        assert parsed_records(lm) == model.expected()
        for h in batch_headers(lm):
            if h.record_count:
                assert h.delete_horizon_ms == model.horizon.get(h.base_offset), h
        assert txn_index_entries(lm) == model.index


# ---------------------------------------------------------------------------------------- scenarios
def _log_with_one_aborted_and_one_committed(root, **config):
    lm = make(root, **config)
    model = TxnModel(int(config.get("delete_retention_ms", 86_400_000)))
    append_txn(lm, model, [(1000, b"x", b"aborted", [])], producer_id=1)  # 0: its key is written nowhere else
    append_txn(lm, model, [(1000, b"j", b"committed", [])], producer_id=2)  # 1
    end_txn(lm, model, 1, ABORT, 1001)  # 2
    end_txn(lm, model, 2, COMMIT, 1001)  # 3
    recs = [(1002, b"k", b"plain", [])]
    model.append(append(lm, recs), recs)  # 4
    with lm.open_log(TP, writable=True) as log:
        log.roll()
    return lm, model


def test_aborted_batches_go_and_markers_stay_until_their_horizon(root):
    lm, _ = _log_with_one_aborted_and_one_committed(root, delete_retention_ms=1000)
    mgr = LogCleanerManager(lm)
    assert mgr.clean_partition(TP, 5000, force=True).ok
    # the aborted record is gone; its ABORT marker stays (the transaction had data in this pass); the COMMIT
    # marker stays for its data; the .txnindex keeps the abort
    assert [r[0] for r in parsed_records(lm)] == [1, 2, 3, 4]
    assert txn_index_entries(lm) == {(1, 0, 2)}
    assert mgr.clean_partition(TP, 6000, force=True).ok
    # the ABORT's data is gone: stamped with now + delete.retention.ms, dropped from the .txnindex
    horizons = {h.base_offset: h.delete_horizon_ms for h in batch_headers(lm)}
    assert horizons[2] == 7000 and horizons[3] is None
    assert txn_index_entries(lm) == set()
    assert mgr.clean_partition(TP, 6999, force=True).ok
    assert [r[0] for r in parsed_records(lm)] == [1, 2, 3, 4]
    res = mgr.clean_partition(TP, 7000, force=True)
    assert res.ok and res.markers_dropped == 1 and res.records_dropped == 0  # a marker is not a record
    assert [r[0] for r in parsed_records(lm)] == [1, 3, 4]


def test_committed_transactional_keys_are_compacted(root):
    lm, _ = _log_with_one_aborted_and_one_committed(root)
    with lm.open_log(TP, writable=True) as log:
        log.append(txn_batch([(1003, b"j", b"newer", [])], 3))
        log.append(marker_batch(COMMIT, 3, 1004))
        log.roll()
    assert LogCleanerManager(lm).clean_partition(TP, 5000, force=True).ok
    kept = {r[0]: r[3] for r in parsed_records(lm)}
    assert 1 not in kept and kept[5] == b"newer"  # the older committed value of "j" went
    assert 3 in kept  # its COMMIT marker stays this time: its data was read in this pass


def test_an_aborted_value_does_not_shadow_an_older_committed_one(root):
    """Kafka's buildOffsetMap skips aborted batches: the older, committed value of a key stays."""
    lm = make(root)
    model = TxnModel(86_400_000)
    recs = [(1000, b"k", b"committed", [])]
    model.append(append(lm, recs), recs)
    append_txn(lm, model, [(1001, b"k", b"aborted", [])], producer_id=1)
    end_txn(lm, model, 1, ABORT, 1002)
    with lm.open_log(TP, writable=True) as log:
        log.roll()
    assert LogCleanerManager(lm).clean_partition(TP, 5000, force=True).ok
    assert [(r[0], r[3]) for r in parsed_records(lm)][:1] == [(0, b"committed")]


def test_nothing_at_or_past_the_last_stable_offset_is_cleaned(root):
    lm = make(root)
    model = TxnModel(86_400_000)
    recs = [(1000, b"k", b"old", [])]
    model.append(append(lm, recs), recs)  # 0
    with lm.open_log(TP, writable=True) as log:
        log.roll()
    append_txn(lm, model, [(1001, b"k", b"open", [])], producer_id=1)  # 1: stays open
    with lm.open_log(TP, writable=True) as log:
        log.roll()
    recs = [(1002, b"k", b"newest", [])]
    model.append(append(lm, recs), recs)  # 2
    with lm.open_log(TP, writable=True) as log:
        log.roll()
        assert log.last_stable_offset == 1
    res = LogCleanerManager(lm).clean_partition(TP, 5000, force=True)
    assert res.ok and res.first_uncleanable_offset == 1 and res.end_offset == 1
    assert [r[0] for r in parsed_records(lm)] == [0, 1, 2]  # offset 0 would go with offset 2 mapped
