"""The sink's writer state, one contract (WriterState) in two flavours: the loader gives a writable Log on local
disk the lock-protected state file, and one on an object store the state its batches carry; both end a crashed
writer's transaction the same way, and the marker lookup the decisions' expiry uses reads either log."""

from __future__ import annotations

import uuid

import fsspec
import pyarrow as pa
import pytest

from storage.common.time import SYSTEM_TIME, MockTime
from storage.log_loader import producer_state_for
from storage.log_manager import LogManager
from storage.objects.object_producer_state import ObjectProducerStateManager
from storage.objects.object_store import ObjectStoreFileSystem
from storage.records.record_batch import CompressionType
from storage.staging import staged_commit as sc
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.producer_state_manager import ProducerStateManager
from storage.transactions.transaction_coordinator import ABORT, COMMIT
from storage.transactions.writer_state import WriterState, find_marker

TP = TopicPartition("t", 0)
W = 7
# a writable open of a local log ends transactions past their timeout by the system clock: T0 is its now, and
# the timeout far longer than any test run, so only the explicit resolve_pending calls below end one
T0 = SYSTEM_TIME.milliseconds()
TIMEOUT = 30 * 24 * 3600 * 1000


def manager(kind: str, tmp_path) -> LogManager:
    if kind == "local":
        return LogManager(str(tmp_path / "logs"))
    return LogManager(f"/ws-{uuid.uuid4().hex}", fs=ObjectStoreFileSystem(fsspec.filesystem("memory")))


def commit(lm, batch: int, clock) -> None:
    st = RecordStager(lm, W, topic="t", compression=CompressionType.NONE)
    st.add(pa.table({"key": pa.array([b"k"], pa.binary()), "value": pa.array([b"v%d" % batch], pa.binary())}))
    commit_staged(lm, W, batch, [st.finish()], transactional=True, transaction_timeout_ms=TIMEOUT, time=clock)


@pytest.mark.parametrize("kind, flavour", [("local", ProducerStateManager), ("object", ObjectProducerStateManager)])
def test_the_loader_picks_the_flavour_and_both_end_an_expired_transaction_alike(kind, flavour, tmp_path, monkeypatch):
    lm = manager(kind, tmp_path)
    lm.create_topic("t", 1)
    clock = MockTime(T0)
    commit(lm, 0, clock)
    with monkeypatch.context() as m:  # the writer dies once its data is in, before its decision
        m.setattr(sc, "decide", _die)
        with pytest.raises(RuntimeError):
            commit(lm, 1, clock)
    with lm.open_log(TP, writable=True) as log:
        state = log.producer_state
        assert type(state) is flavour and isinstance(state, WriterState)
        assert type(producer_state_for(log)) is flavour
        first = state.first_unstable_offset()
        assert first is not None and find_marker(log, W, first) is None
        assert state.resolve_pending(log, now_ms=T0 + TIMEOUT - 1) == []  # not expired: it holds the LSO
        done = state.resolve_pending(log, now_ms=T0 + TIMEOUT + 1)
        assert len(done) == 1 and done[0].startswith(f"aborted batch 1 of writer {W}")
        assert state.first_unstable_offset() is None
        assert find_marker(log, W, first) == (ABORT, log.log_end_offset - 1)
        assert find_marker(log, W, 0) == (COMMIT, 1)  # batch 0's data at offset 0, its marker at 1
        assert state.entry(W).committed_batch_id == 0


def _die(*a, **kw):
    raise RuntimeError("injected: the writer dies here")
