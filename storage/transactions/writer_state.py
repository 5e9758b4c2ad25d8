"""Per-partition writer state: which (writer id, batch id) a partition already holds, and the sink
transactions still open in it.

Kafka's ProducerStateManager remembers each idempotent producer's last sequence so a retried produce is
not appended twice. We do the same for Spark micro-batches: each writer (one streaming query) records its
last committed batch id per partition, and marks a commit under way before its bytes go in, so a crash
mid-commit is rolled back (or completed) by the next writer to open the partition. Two flavours, one
contract (WriterState): the lock-protected state file of local disks
(transactions/producer_state_manager.py) and the state the batches carry on object stores
(objects/object_producer_state.py). The loader picks one for a writable Log (log_loader.producer_state_for).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from ..common.constants import INT32_MAX, INT64_MAX, INT64_MIN
from ..common.time import Time
from ..errors import KafkaStorageError
from ..fs.filesystem import LogFileSystem
from ..records.record_batch import CONTROL_FLAG_MASK
from .transaction_coordinator import ABORT, MARKER_TYPES, TransactionRef, decide, is_marker

logger = logging.getLogger(__name__)

# both flavours keep their state (a hint on object stores) in this file of the partition directory; Kafka ignores it
STATE_FILE = "kafkalog-producer-state.json"
MAX_BATCH_ID = INT32_MAX  # baseSequence is an int32
MAX_STATE_BYTES = 16 << 20  # a state file holds an entry per writer; a larger one is not read whole


@dataclass
class PendingCommit:
    batch_id: int
    first_offset: int  # the log end offset when the commit began
    next_offset: int  # the log end offset it will leave
    # the sink transaction the data belongs to; None: a non-transactional commit (a partial one is cut off)
    transaction: TransactionRef | None = None


@dataclass
class WriterEntry:
    committed_batch_id: int = -1
    committed_next_offset: int = -1
    pending: PendingCommit | None = None
    updated_ms: int = 0


class WriterState(ABC):
    """What the sink's committer, the loader and the maintenance job ask of a partition's writer state.

    The protocol, whichever flavour: begin() before any byte of a commit goes in, complete() once they are
    durable, forget() for a one-off writer; resolve_pending() ends what a crashed writer left pending (a
    transaction as its decision says; with no decision, the opener aborts it when it is the writer's own
    or open longer than its timeout). `stamps_batches`: whether the committer must put the writer id and
    batch id into the batches (where they are the state)."""

    stamps_batches = False
    fs: LogFileSystem
    time: Time  # the clock of resolve_pending's default `now`
    path: str  # the state file (a hint on object stores)

    @abstractmethod
    def entry(self, writer_id: int) -> WriterEntry:
        """The writer's last commit and its commit under way."""

    @abstractmethod
    def save(self, *, durable: bool = True) -> None:
        """Write the state out (where there is a state to write)."""

    @abstractmethod
    def complete(self, writer_id: int) -> None:
        """Record a commit whose bytes are durable as done."""

    @abstractmethod
    def forget(self, writer_id: int) -> None:
        """Drop a one-off writer (a batch write) once its commit is done."""

    @abstractmethod
    def first_unstable_offset(self) -> int | None:
        """Where the earliest commit or transaction still open began (Kafka's firstUnstableOffset), or None:
        the cleaner must leave the log from there alone until it is ended."""

    def begin(
        self,
        writer_id: int,
        batch_id: int,
        first_offset: int,
        next_offset: int,
        transaction: TransactionRef | None = None,
    ) -> None:
        """Durably mark a commit as under way before any of its bytes are appended; `transaction`: the
        sink transaction its data belongs to (its markers end it), None for a non-transactional commit."""
        self._begin(writer_id, PendingCommit(batch_id, first_offset, next_offset, transaction))

    @abstractmethod
    def _begin(self, writer_id: int, pending: PendingCommit) -> None:
        """The flavour's way of making `pending` durable before the commit's bytes go in."""

    def resolve_pending(self, log, *, opener: int | None = None, now_ms: int | None = None) -> list[str]:
        """Finish or roll back what crashed writers left pending in `log`, at `now_ms` (default: this
        state's clock); `opener`: the writer opening the partition, if any. Returns what was done, each
        line logged (a decided commit's marker is the normal second phase: INFO; a recovery: WARNING)."""
        now = self.time.milliseconds() if now_ms is None else now_ms
        done = self._resolve(log, opener, now, explicit=opener is not None or now_ms is not None)
        for line in done:
            level = logging.INFO if line.startswith("committed batch") else logging.WARNING
            logger.log(level, "%s-%d: %s", log.tp.topic, log.tp.partition, line)
        return done

    @abstractmethod
    def _resolve(self, log, opener: int | None, now: int, *, explicit: bool) -> list[str]:
        """The flavour's resolve_pending; `explicit`: whether the caller named an opener or a time."""

    def _undecided_ends(self, txn: TransactionRef, writer_id: int, opener: int | None, now: int) -> bool:
        """Whether a transaction with no decision is ended now: by its own writer's return, or its timeout."""
        return opener == writer_id or txn.expired(now)

    def _abort_undecided(self, log, txn: TransactionRef, writer_id: int, opener: int | None, now: int) -> str:
        """Record "abort" for a transaction with no decision (a "commit" found there instead, recorded by a
        racing writer, wins); returns the outcome now on record."""
        why = "its writer restarted" if opener == writer_id else f"open longer than {txn.timeout_ms} ms"
        where = f"{log.tp.topic}-{log.tp.partition}"
        return decide(self.fs, txn.decision, ABORT, {"partition": where, "reason": why, "timestamp": now})


def find_marker(log, writer_id: int, start: int) -> tuple[str, int] | None:
    """Writer writer_id's first marker at or after `start` (its transaction's, as it held the partition from
    its data to its marker): (COMMIT or ABORT, offset), or None. Reads the log from `start`: only a recovery
    or the decisions' expiry does, when no decision (or no state) says how the transaction ended."""
    if start >= log.log_end_offset or start < log.log_start_offset:
        return None
    for chunk in log.read(start):
        h = chunk.scan.headers
        hits = np.flatnonzero(((h["attributes"] & CONTROL_FLAG_MASK) != 0) & (h["producer_id"] == writer_id))
        for i in hits.tolist():
            pos, size = int(chunk.scan.positions[i]), int(chunk.scan.sizes[i])
            for outcome, marker_type in MARKER_TYPES.items():
                if is_marker(chunk.buf[pos : pos + size], marker_type, writer_id):
                    return outcome, int(chunk.scan.last_offsets[i])
    return None


def read_bounded(fs: LogFileSystem, path: str) -> bytes:
    """A state file's bytes; ValueError when it is larger than MAX_STATE_BYTES (not read whole)."""
    raw = fs.read(path, 0, MAX_STATE_BYTES + 1)
    if len(raw) > MAX_STATE_BYTES:
        raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
    return raw


def check_long(v, what: str) -> int:
    """A JSON field that must be a 64-bit integer (ValueError naming `what` otherwise)."""
    if isinstance(v, bool) or not isinstance(v, int) or not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"{what} is not a 64-bit integer: {v!r}")
    return v


def check_batch_id(writer_id: int, batch_id: int, source: str) -> None:
    """A batch id travels in baseSequence (an int32) where the batches carry the state."""
    if not 0 <= batch_id <= MAX_BATCH_ID:
        raise KafkaStorageError(
            f"{source}: batch id {batch_id} of writer {writer_id} does not fit a batch's baseSequence (int32)"
        )
