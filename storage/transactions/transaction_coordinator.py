"""The sink's transaction coordinator: Kafka's transaction log as one create-only file per transaction, and the
COMMIT/ABORT markers and `.txnindex` entries that end a transaction in a partition.

A sink transaction is one attempt to commit one micro-batch (writer id, batch id) into every partition it
writes. Its decision lives in `<ROOT>/.kafkalog-transactions/<writer id>/<batch id>-<attempt>`, created
once with a create-only write (link(2) locally, If-None-Match on object stores): the writer creates it
with "commit" after every partition's data is durable; anyone who finds the transaction open past its
timeout, or the writer's own restarted query, creates it with "abort". Whoever creates it first wins and
the other obeys, so a transaction is committed in every partition or aborted in every partition.
"""

from __future__ import annotations

import json
import logging
import struct
import uuid
from dataclasses import dataclass

from ..common.constants import INT64_MAX
from ..errors import KafkaStorageError
from ..fs.filesystem import LogFileSystem
from ..records.record_batch import (
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_SEQUENCE,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    compute_crc,
)
from .transaction_index import AbortedTxn, TransactionIndex

logger = logging.getLogger(__name__)

TRANSACTIONS_DIR = ".kafkalog-transactions"  # under the first log dir; no topic-partition name, Kafka skips it
COMMIT = "commit"
ABORT = "abort"
DECISION_VERSION = 1
MAX_DECISION_BYTES = 1 << 20  # a decision lists a batch's partitions; a larger file is not read
# Kafka's producer transaction.timeout.ms default: a transaction left open longer is aborted by the next
# maintenance pass or writer that opens one of its partitions
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
# one coordinator, whose epoch never changes (Kafka bumps it when the coordinator moves to another broker)
COORDINATOR_EPOCH = 0
# the sink's producerEpoch: constant per writer id, legal for Kafka (a producer that is never re-initialized)
SINK_PRODUCER_EPOCH = 0


@dataclass(frozen=True)
class TransactionRef:
    """What a partition's pending entry records of the transaction its data belongs to: where the
    decision is taken (a path), its timeout and when it began (wall-clock ms), and the producer epoch
    of its batches."""

    decision: str
    timeout_ms: int
    started_ms: int
    producer_epoch: int = SINK_PRODUCER_EPOCH

    def expired(self, now_ms: int) -> bool:
        """Open longer than its timeout (Kafka's coordinator then aborts it)."""
        return now_ms - self.started_ms > self.timeout_ms

    def to_json(self) -> dict:
        return {
            "decision": self.decision,
            "timeout_ms": self.timeout_ms,
            "started_ms": self.started_ms,
            "producer_epoch": self.producer_epoch,
        }

    @classmethod
    def from_json(cls, doc: dict) -> TransactionRef:
        """Parse and check (ValueError, KeyError, TypeError for a bad entry)."""
        decision = doc["decision"]
        if not isinstance(decision, str) or not decision:
            raise ValueError(f"transaction decision path {decision!r} is not a path")
        fields = [doc["timeout_ms"], doc["started_ms"], doc["producer_epoch"]]
        for name, v in zip(("timeout_ms", "started_ms", "producer_epoch"), fields, strict=True):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT64_MAX:
                raise ValueError(f"transaction {name} is not a non-negative 64-bit integer: {v!r}")
        if fields[2] > 0x7FFF:
            raise ValueError(f"transaction producer_epoch {fields[2]} is not an int16")
        return cls(decision, fields[0], fields[1], fields[2])


def decision_dir(fs: LogFileSystem, root: str, writer_id: int) -> str:
    return fs.join(root, TRANSACTIONS_DIR, str(writer_id))


def new_transaction(fs: LogFileSystem, root: str, writer_id: int, batch_id: int, *, timeout_ms: int, now_ms: int):
    """A fresh transaction for one attempt at a batch: a replay of the batch is a new transaction (its
    decision file a new name), as Kafka's producer starts a new transaction for a retried batch."""
    if timeout_ms < 0:
        raise KafkaStorageError(f"transaction timeout {timeout_ms} ms is negative")
    name = f"{batch_id}-{uuid.uuid4().hex[:16]}"
    return TransactionRef(fs.join(decision_dir(fs, root, writer_id), name), timeout_ms, now_ms)


def read_decision(fs: LogFileSystem, path: str) -> str | None:
    """COMMIT or ABORT, or None when no decision was taken; a damaged file is an error naming it."""
    try:
        if not fs.exists(path):
            return None
        raw = fs.read(path, 0, MAX_DECISION_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(raw) > MAX_DECISION_BYTES:
        raise KafkaStorageError(f"transaction decision {fs.url(path)} is larger than {MAX_DECISION_BYTES} bytes")
    try:
        doc = json.loads(raw)
        outcome = doc["decision"]
        if doc["version"] != DECISION_VERSION or outcome not in (COMMIT, ABORT):
            raise ValueError(f"version {doc['version']!r}, decision {outcome!r}")
    except (ValueError, KeyError, TypeError) as e:
        raise KafkaStorageError(
            f"transaction decision {fs.url(path)} is not valid ({e}); its partitions keep the transaction "
            f"open until it is fixed"
        ) from None
    return outcome


def decide(fs: LogFileSystem, path: str, outcome: str, detail: dict) -> str:
    """Record `outcome` as the transaction's decision unless one was recorded first; the decision that
    holds is returned. The create-only write is the compare-and-set, durable before this returns."""
    if outcome not in (COMMIT, ABORT):
        raise ValueError(f"a decision is {COMMIT!r} or {ABORT!r}, not {outcome!r}")
    body = json.dumps({"version": DECISION_VERSION, "decision": outcome, **detail}, sort_keys=True).encode()
    parent = fs.dirname(path)
    if not fs.isdir(parent):  # the writer's first transaction: its directory, durable too
        fs.mkdirs(parent)
        fs.sync_dir(fs.dirname(parent))
        fs.sync_dir(fs.dirname(fs.dirname(parent)))
    if fs.create_exclusive(path, body, durable=True):
        fs.sync_dir(parent)  # the new name is durable: the decision holds after a crash
        return outcome
    held = read_decision(fs, path)
    if held is None:  # deleted once the transaction was resolved everywhere: only a finished commit is
        raise KafkaStorageError(f"transaction decision {fs.url(path)} vanished while it was being read")
    return held


def leftover_commits(fs: LogFileSystem, root: str, writer_id: int) -> list[tuple[str, list[tuple[str, int]]]]:
    """A writer's commit decisions still on disk (its driver died before every marker was written), each
    with the partitions it names: (decision path, [(topic, partition), ...])."""
    d = decision_dir(fs, root, writer_id)
    out = []
    for f in fs.listdir(d):  # (a missing directory lists as empty)
        path = fs.join(d, f.name)
        if f.is_dir or ".tmp" in f.name or read_decision(fs, path) != COMMIT:
            continue
        doc = json.loads(fs.read(path, 0, MAX_DECISION_BYTES))
        try:
            parts = [(str(t), int(p)) for t, p, _ in doc["partitions"]]
        except (KeyError, TypeError, ValueError) as e:
            raise KafkaStorageError(f"transaction decision {fs.url(path)} names no valid partitions ({e})") from None
        out.append((path, parts))
    return out


# How long an abort decision is kept (Kafka's transactional.id.expiration.ms default, 7 days): every partition
# still open in its transaction finds it and aborts, and a writer that reaches its commit later than this after
# its transaction began aborts instead (COMMIT_HORIZON_MS), so a deleted abort cannot let a late commit win
ABORT_DECISION_RETENTION_MS = 7 * 24 * 3600 * 1000
# the writer's own limit: a transaction older than this when its data is in is aborted, not committed; a day
# below the abort decisions' retention, for a writer paused between its check and its create-only write
COMMIT_HORIZON_MS = ABORT_DECISION_RETENTION_MS - 24 * 3600 * 1000


@dataclass(frozen=True)
class DecisionFile:
    """A decision on disk as the maintenance job sees it: its path, writer id, outcome, the partitions a
    commit names with their first data offsets (an abort names none: [] ), and when it was written (ms)."""

    path: str
    writer_id: int
    outcome: str
    partitions: tuple[tuple[str, int, int], ...]
    modified_ms: int


def list_decisions(fs: LogFileSystem, root: str) -> list[DecisionFile]:
    """Every decision file under the root (all writers); a damaged one is skipped with a warning, kept."""
    out = []
    top = fs.join(root, TRANSACTIONS_DIR)
    for w in fs.listdir(top):
        if not w.is_dir or not w.name.isdigit():
            continue
        d = fs.join(top, w.name)
        for f in fs.listdir(d):
            path = fs.join(d, f.name)
            if f.is_dir or ".tmp" in f.name:
                continue
            try:
                outcome = read_decision(fs, path)
                if outcome is None:
                    continue
                parts: list[tuple[str, int, int]] = []
                if outcome == COMMIT:
                    doc = json.loads(fs.read(path, 0, MAX_DECISION_BYTES))
                    parts = [(str(t), int(p), int(first)) for t, p, first in doc["partitions"]]
                out.append(DecisionFile(path, int(w.name), outcome, tuple(parts), fs.modified_ms(path)))
            except (KafkaStorageError, KeyError, TypeError, ValueError) as e:
                logger.warning("transaction decision %s kept: %s", fs.url(path), e)
    return out


def delete_decision(fs: LogFileSystem, path: str) -> None:
    """Drop a decision whose markers are all written (no partition holds the transaction open any more)."""
    fs.delete(path, missing_ok=True)


# Kafka's ControlRecordType ids of the two transaction markers (control_records.ControlRecordType; that module
# builds its batch with the numba encoder, whose first call compiles for seconds: too slow for a commit)
ABORT_MARKER = 0
COMMIT_MARKER = 1
MARKER_TYPES = {COMMIT: COMMIT_MARKER, ABORT: ABORT_MARKER}


def marker_record(marker_type: int, coordinator_epoch: int = COORDINATOR_EPOCH) -> bytes:
    """The one record of a marker batch, as Kafka's DefaultRecord writes it: attributes 0, timestampDelta 0,
    offsetDelta 0, key `int16 version (0) | int16 type`, value `int16 version (0) | int32 coordinatorEpoch`,
    no headers. Every length fits a one-byte zigzag varint (2n)."""
    key = struct.pack(">hh", 0, marker_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = bytes([0, 0, 0, 2 * len(key)]) + key + bytes([2 * len(value)]) + value + bytes([0])
    return bytes([2 * len(body)]) + body


def marker_batch(marker_type: int, *, base_offset: int, timestamp: int, producer_id: int, producer_epoch: int):
    """The control batch of one transaction marker (Kafka's MemoryRecords.withEndTransactionMarker): attributes
    transactional + control (0x30), uncompressed, CreateTime `timestamp`, the producer's id and epoch,
    baseSequence -1, no partition leader epoch, one record (marker_record)."""
    record = marker_record(marker_type)
    buf = bytearray(RECORD_BATCH_OVERHEAD + len(record))
    HEADER_STRUCT.pack_into(
        buf,
        0,
        base_offset,
        len(buf) - LOG_OVERHEAD,
        NO_PARTITION_LEADER_EPOCH,
        2,
        0,
        TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK,
        0,
        timestamp,
        timestamp,
        producer_id,
        producer_epoch,
        NO_SEQUENCE,
        1,
    )
    buf[RECORD_BATCH_OVERHEAD:] = record
    struct.pack_into(">I", buf, CRC_OFFSET, compute_crc(buf))
    return buf


def is_marker(batch, marker_type: int, producer_id: int) -> bool:
    """Whether a whole batch's bytes are producer_id's marker of this type as marker_batch builds it."""
    view = memoryview(batch)
    if len(view) != RECORD_BATCH_OVERHEAD + len(marker_record(marker_type)):
        return False
    h = HEADER_STRUCT.unpack_from(view, 0)
    attrs, pid = h[5], h[9]
    return (
        attrs & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK) == TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK
        and pid == producer_id
        and bytes(view[RECORD_BATCH_OVERHEAD:]) == marker_record(marker_type)
    )


def write_marker(log, outcome: str, producer_id: int, producer_epoch: int, now_ms: int) -> int:
    """Append the COMMIT or ABORT control batch of a producer's transaction to a writable Log and make it
    durable (also on a flush.ms topic); its offset is returned."""
    batch = marker_batch(
        MARKER_TYPES[outcome],
        base_offset=log.log_end_offset,
        timestamp=now_ms,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
    )
    info = log.append(batch, now=now_ms)
    log.flush()
    return info.first_offset


def index_aborted(log, producer_id: int, first_offset: int, marker_offset: int, last_stable_offset: int) -> None:
    """Record an aborted transaction in the `.txnindex` of the segment holding its ABORT marker, durably."""
    seg = log.segment_for(marker_offset)
    if seg is None:
        raise KafkaStorageError(
            f"{log.tp.topic}-{log.tp.partition}: no segment holds the ABORT marker at offset {marker_offset}"
        )
    index = TransactionIndex.for_segment(log.fs, log.dir, seg.base_offset)
    try:
        index.append(AbortedTxn(producer_id, first_offset, marker_offset, last_stable_offset))
        index.flush()
    finally:
        index.close()
