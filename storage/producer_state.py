"""Per-partition writer state: which (writer id, batch id) a partition already holds.

Kafka's ProducerStateManager remembers each idempotent producer's last sequence so a retried
produce is not appended twice. We do the same for Spark micro-batches: each writer (one streaming
query) records its last committed batch id per partition, and marks a commit "pending" before its
bytes go in, so a crash mid-commit is rolled back (or completed) by the next writer to open the
partition. The state lives in `<partition dir>/kafkalog-producer-state.json`, a file Kafka ignores.

Where there are no locks (immutable segments on object stores) nothing can be marked pending:
ObjectProducerStateManager reads the state from the batches themselves (see its docstring), the
same file holds only a hint, and a sink transaction still open is tied to its decision by the writer's
`kafkalog-txn-<writer id>.json`. producer_state_for(log) picks the flavour.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import asdict, dataclass

import numpy as np

from .common.constants import INT32_MAX, INT64_MAX, INT64_MIN
from .common.time import SYSTEM_TIME, Time
from .errors import ConcurrentAppendError, CorruptRecordError, KafkaStorageError
from .fs.filesystem import LogFileSystem
from .objects.segment_metadata import SegmentMetadata, collect, parse_segments, segments_doc
from .records.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    RecordBatchHeader,
    compute_crc,
    scan_batches,
    validate_batches,
)
from .transactions.transaction_coordinator import (
    ABORT,
    COMMIT,
    COMMIT_MARKER,
    MARKER_TYPES,
    TransactionRef,
    decide,
    index_aborted,
    is_marker,
    marker_record,
    read_decision,
    write_marker,
)
from .transactions.transaction_index import ABORTED_TXN_DTYPE, ABORTED_TXN_VERSION, AbortedTxn, TransactionIndex

logger = logging.getLogger(__name__)

STATE_FILE = "kafkalog-producer-state.json"
# the object-store flavour's file: {"version": 3, "asOf": offset, "writers": {id: [batch, base]},
# "segments": {base: [size, max timestamp]}}; version 2 (no segments) is still read
HINT_VERSION = 3
READABLE_HINT_VERSIONS = (2, 3)
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


@dataclass
class WriterStateHint:
    """The object-store flavour's state file: a cache of what the segments below as_of hold."""

    as_of: int
    writers: dict[int, tuple[int, int]]  # writer id -> (last committed batch id, its segment's base offset)
    segments: dict[int, SegmentMetadata]  # base offset -> size and largest timestamp


def read_hint(fs: LogFileSystem, dir: str) -> WriterStateHint | None:
    """The partition's hint, or None when there is none or it is unreadable (logged: it is only a hint)."""
    path = fs.join(dir, STATE_FILE)
    try:
        raw = _read_bounded(fs, path) if fs.exists(path) else None
    except FileNotFoundError:
        raw = None
    except ValueError as e:
        logger.warning("ignoring writer state hint %s (%s); reading the segments instead", fs.url(path), e)
        return None
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        if doc.get("version") not in READABLE_HINT_VERSIONS:
            raise ValueError(f"version {doc.get('version')!r}, expected one of {READABLE_HINT_VERSIONS}")
        return WriterStateHint(
            int(doc["asOf"]),
            {int(w): (int(e[0]), int(e[1])) for w, e in doc["writers"].items()},
            parse_segments(doc.get("segments")),
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        logger.warning("ignoring writer state hint %s (%s); reading the segments instead", fs.url(path), e)
        return None


class ProducerStateManager:
    """Loaded and changed only by the holder of the partition's write lock."""

    stamps_batches = False  # the committer need not put the batch id into the batches

    def __init__(self, fs: LogFileSystem, dir: str, *, time: Time = SYSTEM_TIME):
        self.fs = fs
        self.time = time  # stamps updated_ms
        self.path = fs.join(dir, STATE_FILE)
        self.writers: dict[int, WriterEntry] = {}
        if fs.exists(self.path):
            try:
                self.writers = _parse_state(_read_bounded(fs, self.path))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise KafkaStorageError(f"writer state file {fs.url(self.path)} is not valid: {e}") from e

    def entry(self, writer_id: int) -> WriterEntry:
        return self.writers.setdefault(writer_id, WriterEntry())

    def save(self, *, durable: bool = True) -> None:
        doc = {
            "version": 1,
            "writers": {
                str(w): {**asdict(e), "pending": asdict(e.pending) if e.pending else None}
                for w, e in sorted(self.writers.items())
            },
        }
        self.fs.write_atomic(self.path, json.dumps(doc, sort_keys=True).encode(), durable=durable)

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
        e = self.entry(writer_id)
        if e.pending is not None:
            raise KafkaStorageError(
                f"writer state file {self.fs.url(self.path)}: writer {writer_id} begins batch {batch_id} while "
                f"batch {e.pending.batch_id} is still pending; resolve it first"
            )
        # a log that lost unflushed records (flush.ms topics after a power cut) ends before the last commit's
        # end: say so, so that the rollback check (first_offset >= committed end) holds for every mark we write
        e.committed_next_offset = min(e.committed_next_offset, first_offset)
        e.pending = PendingCommit(batch_id, first_offset, next_offset, transaction)
        e.updated_ms = self.time.milliseconds()
        self.save()

    def complete(self, writer_id: int) -> None:
        """Record a commit whose bytes are durable as done. This write needs no fsync: if a crash loses
        it, the commit is still pending on disk, and resolve_pending finds all its bytes and completes it."""
        e = self.entry(writer_id)
        if e.pending is not None:
            e.committed_batch_id, e.committed_next_offset = e.pending.batch_id, e.pending.next_offset
            e.pending = None
        e.updated_ms = self.time.milliseconds()
        self.save(durable=False)

    def forget(self, writer_id: int) -> None:
        """Drop a one-off writer (a batch write) once its commit is done (no fsync: see complete)."""
        if self.writers.pop(writer_id, None) is not None:
            self.save(durable=False)

    def first_unstable_offset(self) -> int | None:
        """Where the earliest commit still pending began (Kafka's firstUnstableOffset), or None: the
        cleaner must leave the log from there alone until the commit is resolved."""
        firsts = [e.pending.first_offset for e in self.writers.values() if e.pending is not None]
        return min(firsts) if firsts else None

    def resolve_pending(self, log, *, opener: int | None = None, now_ms: int | None = None) -> list[str]:
        """Finish or roll back commits a crashed writer left pending; returns what was done.

        A transactional commit (its data stays, whatever happens) ends as its decision says: "commit"
        rolls forward (the missing COMMIT marker), "abort" rolls back (an ABORT marker and a `.txnindex`
        entry). With no decision yet, the opener aborts it (recording "abort" first: a "commit" found there
        instead rolls forward) when it is the writer's own (a restarted query) or open longer than its
        timeout at `now_ms` (default: this manager's clock); else it stays open and holds the LSO.

        A non-transactional commit with all its bytes present completed; with some, the log is cut back
        to where the commit began, so a replay appends it whole; with none, it never started.
        """
        done = []
        ended: list[PendingCommit] = []
        now = self.time.milliseconds() if now_ms is None else now_ms
        for wid, e in self.writers.items():
            p = e.pending
            if p is None:
                continue
            ended.append(p)
            if p.transaction is not None:
                line = self._resolve_transaction(log, wid, e, opener, now)
                if line is not None:
                    done.append(line)
                continue
            leo = log.log_end_offset
            if leo >= p.next_offset and self._written_by(log, p.first_offset, wid):
                e.committed_batch_id, e.committed_next_offset = p.batch_id, p.next_offset
                done.append(
                    f"completed batch {p.batch_id} of writer {wid} (offsets {p.first_offset}..{p.next_offset - 1})"
                )
            elif p.first_offset < leo and self._written_by(log, p.first_offset, wid):
                self._check_rollback(log, wid, e, leo)
                log.truncate_to(p.first_offset)
                done.append(
                    f"rolled back a partial commit of batch {p.batch_id} of writer {wid}: "
                    f"cut offsets {p.first_offset}..{leo - 1}"
                )
            else:
                done.append(f"dropped pending batch {p.batch_id} of writer {wid}: nothing of it was written")
            e.pending = None
        if done:
            for line in done:  # a decided commit's marker is the normal second phase, not a recovery
                level = logging.INFO if line.startswith("committed batch") else logging.WARNING
                logger.log(level, "%s-%d: %s", log.tp.topic, log.tp.partition, line)
            # a transaction's end is durable in the log (its marker, flushed), where _find_marker finds it if
            # this update is lost: no fsync then; a cut (non-transactional) must be remembered durably
            self.save(durable=any(p.transaction is None for p in ended))
        return done

    def _resolve_transaction(self, log, wid: int, e: WriterEntry, opener: int | None, now: int) -> str | None:
        """End writer wid's pending transaction in this partition as its decision says (see resolve_pending);
        None when it stays open."""
        p = e.pending
        assert p is not None and p.transaction is not None, "called only for a pending transaction"
        txn = p.transaction
        where = f"{log.tp.topic}-{log.tp.partition}"
        outcome = read_decision(self.fs, txn.decision)
        found = None  # a marker written before a crash lost the state file's update
        if outcome is None:
            if opener != wid and not txn.expired(now):
                return None
            # no decision: never taken, or deleted once every marker was written; the log tells which
            found = self._find_marker(log, wid, p.first_offset)
            if found is None:
                why = "its writer restarted" if opener == wid else f"open longer than {txn.timeout_ms} ms"
                outcome = decide(self.fs, txn.decision, ABORT, {"partition": where, "reason": why, "timestamp": now})
            else:
                outcome = found[0]
        leo = log.log_end_offset
        wrote = p.first_offset < leo and self._written_by(log, p.first_offset, wid)
        if outcome == COMMIT:
            if found is not None:
                marker = found[1]
            else:
                if not (wrote and leo >= p.next_offset):
                    raise KafkaStorageError(
                        f"{where}: transaction {self.fs.url(txn.decision)} of writer {wid} is committed, but "
                        f"the partition lacks its data (offsets {p.first_offset}..{p.next_offset - 1}, log end "
                        f"{leo}); not writing its COMMIT marker"
                    )
                at_end = self._marker_at_end(log, wid, COMMIT)
                marker = write_marker(log, COMMIT, wid, txn.producer_epoch, now) if at_end is None else at_end
            e.committed_batch_id, e.committed_next_offset = p.batch_id, marker + 1
            e.pending = None
            e.updated_ms = now
            return f"committed batch {p.batch_id} of writer {wid} (offsets {p.first_offset}..{marker})"
        if not wrote:
            e.pending = None
            e.updated_ms = now
            return f"aborted batch {p.batch_id} of writer {wid}: nothing of it was written"
        at_end = found[1] if found is not None else self._marker_at_end(log, wid, ABORT)
        marker = write_marker(log, ABORT, wid, txn.producer_epoch, now) if at_end is None else at_end
        seg = log.segment_for(marker)
        index = TransactionIndex.for_segment(self.fs, log.dir, seg.base_offset) if seg is not None else None
        if index is None or not (index.entries()["last_offset"] == marker).any():  # not indexed before a crash
            others = [
                o.pending.first_offset
                for w, o in self.writers.items()
                if w != wid and o.pending is not None and o.pending.first_offset < marker
            ]
            index_aborted(log, wid, p.first_offset, marker, min(others) if others else marker + 1)
        e.pending = None
        e.updated_ms = now
        return f"aborted batch {p.batch_id} of writer {wid} (offsets {p.first_offset}..{marker}, data kept)"

    @staticmethod
    def _find_marker(log, wid: int, start: int) -> tuple[str, int] | None:
        """Writer wid's first marker at or after `start` (its transaction's, as it held the partition lock
        from its data to its marker): (COMMIT or ABORT, offset), or None. Reads the log from `start`: only a
        recovery does, when no decision is left to say how the transaction ended."""
        if start >= log.log_end_offset or start < log.log_start_offset:
            return None
        for chunk in log.read(start):
            h = chunk.scan.headers
            hits = np.flatnonzero(((h["attributes"] & CONTROL_FLAG_MASK) != 0) & (h["producer_id"] == wid))
            for i in hits.tolist():
                pos, size = int(chunk.scan.positions[i]), int(chunk.scan.sizes[i])
                for outcome in (COMMIT, ABORT):
                    if is_marker(chunk.buf[pos : pos + size], MARKER_TYPES[outcome], wid):
                        return outcome, int(chunk.scan.last_offsets[i])
        return None

    @staticmethod
    def _marker_at_end(log, wid: int, outcome: str) -> int | None:
        """The offset of the log's last batch when it is writer wid's marker (written before a crash that
        lost the state file's update), else None."""
        leo = log.log_end_offset
        if leo <= log.log_start_offset:
            return None
        for chunk in log.read(leo - 1, leo):
            scan = chunk.scan
            if not len(scan):
                return None
            pos = int(scan.positions[-1])
            size = int(scan.sizes[-1])
            if is_marker(chunk.buf[pos : pos + size], MARKER_TYPES[outcome], wid):
                return int(scan.last_offsets[-1])
            return None
        return None

    def _check_rollback(self, log, wid: int, e: WriterEntry, leo: int) -> None:
        """The state file is a hint: before cutting the log back, check that the cut holds only what the
        pending commit could have written (after the writer's last commit, every batch its own), so that
        a damaged or edited file cannot make us delete committed records."""
        p = e.pending
        assert p is not None, "called only for a writer with a pending commit"
        where = f"writer state file {self.fs.url(self.path)}, {log.tp.topic}-{log.tp.partition}"
        if p.first_offset < max(e.committed_next_offset, log.log_start_offset):
            raise KafkaStorageError(
                f"{where}: writer {wid}'s pending commit starts at offset {p.first_offset}, "
                f"before its last commit's end {e.committed_next_offset} or the log start "
                f"{log.log_start_offset}; not rolling back. Fix or remove the file"
            )
        for chunk in log.read(p.first_offset, leo):
            ids = chunk.scan.headers["producer_id"]
            if len(ids) and (ids != wid).any():
                raise KafkaStorageError(
                    f"{where}: offsets {p.first_offset}..{leo - 1} hold batches of other "
                    f"writers, so they are not writer {wid}'s partial commit; not rolling "
                    f"back. Fix or remove the file"
                )

    @staticmethod
    def _written_by(log, offset: int, writer_id: int) -> bool:
        if offset < log.log_start_offset or offset >= log.log_end_offset:
            return False
        for chunk in log.read(offset, offset + 1):
            return bool(len(chunk.scan)) and int(chunk.scan.headers["producer_id"][0]) == writer_id
        return False


def _read_bounded(fs: LogFileSystem, path: str) -> bytes:
    raw = fs.read(path, 0, MAX_STATE_BYTES + 1)
    if len(raw) > MAX_STATE_BYTES:
        raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
    return raw


def _long(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"{what} is not a 64-bit integer: {v!r}")
    return v


def _parse_state(raw: bytes) -> dict[int, WriterEntry]:
    """The lock-protected state file's writers, every field checked (ValueError, KeyError, TypeError)."""
    out = {}
    for wid, e in json.loads(raw)["writers"].items():
        w = _long(int(wid), "a writer id")
        pending = None
        if e.get("pending"):
            q = e["pending"]
            pending = PendingCommit(
                _long(q["batch_id"], "batch_id"),
                _long(q["first_offset"], "first_offset"),
                _long(q["next_offset"], "next_offset"),
                TransactionRef.from_json(q["transaction"]) if q.get("transaction") is not None else None,
            )
            if not 0 <= pending.first_offset <= pending.next_offset:
                raise ValueError(
                    f"writer {w}'s pending commit has offsets {pending.first_offset}..{pending.next_offset}"
                )
        out[w] = WriterEntry(
            _long(e["committed_batch_id"], "committed_batch_id"),
            _long(e["committed_next_offset"], "committed_next_offset"),
            pending,
            _long(e.get("updated_ms", 0), "updated_ms"),
        )
    return out


def producer_state_for(log):
    """The writer state of a writable log: the lock-protected state file, or, for immutable segments
    (no append or no locks), the state the committed batches carry."""
    if log.immutable:
        return ObjectProducerStateManager(log)
    return ProducerStateManager(log.fs, log.dir)


def stamp_commit(
    buf: bytearray, writer_id: int, batch_id: int, *, max_batch_size: int, source: str, transactional: bool = False
):
    """Put a commit's identity into every batch: producerId = writer id, producerEpoch 0, baseSequence =
    batch id, the transactional attribute when `transactional`, and recompute the CRC. The batches are
    validated first, so damaged staged bytes are reported, not given a fresh CRC. Returns the scan."""
    if not 0 <= batch_id <= MAX_BATCH_ID:
        raise KafkaStorageError(
            f"{source}: batch id {batch_id} does not fit a batch's baseSequence (int32), which "
            f"carries it on this filesystem"
        )
    scan = scan_batches(buf, max_batch_size=max_batch_size)
    if scan.end != len(buf):
        raise CorruptRecordError("staged bytes end in a partial or oversized batch", source=source, position=scan.end)
    validate_batches(buf, scan, source=source, check_offsets=False)
    if (scan.headers["attributes"] & CONTROL_FLAG_MASK).any():
        raise CorruptRecordError("staged bytes hold a control batch", source=source)
    fields = struct.Struct(">qhi")
    view = memoryview(buf)
    # per batch: the CRC covers these fields
    for pos, size, attrs in zip(
        scan.positions.tolist(), scan.sizes.tolist(), scan.headers["attributes"].tolist(), strict=True
    ):
        if transactional:
            struct.pack_into(">h", buf, pos + ATTRIBUTES_OFFSET, attrs | TRANSACTIONAL_FLAG_MASK)
        fields.pack_into(buf, pos + PRODUCER_ID_OFFSET, writer_id, 0, batch_id)
        struct.pack_into(">I", buf, pos + CRC_OFFSET, compute_crc(view[pos : pos + size]))
    return scan


# what a segment object's first batch is, for the transaction scan of ObjectProducerStateManager
PLAIN = "data"  # a non-transactional data batch (a sink commit of the non-transactional protocol, or any append)
TXN_DATA = "txn"  # a transactional data batch
OTHER_CONTROL = "control"  # a control batch that is no marker of its producer's transaction as marker_batch builds it
# a marker segment object is one marker batch: RECORD_BATCH_OVERHEAD + 17 bytes
FIRST_BATCH_READ_BYTES = RECORD_BATCH_OVERHEAD + len(marker_record(COMMIT_MARKER))
TXN_FILE_PREFIX = "kafkalog-txn-"  # + writer id + ".json": a writer's open sink transaction in a partition
TXN_FILE_VERSION = 1


def txn_file_name(writer_id: int) -> str:
    return f"{TXN_FILE_PREFIX}{writer_id}.json"


@dataclass(frozen=True)
class PendingTransaction:
    """A writer's transaction still open in a partition of immutable segments, found in the log: its first data
    object's base offset and batch id (baseSequence), and the transaction the writer's transaction file names
    for exactly that batch and offset (None when the file is missing or names another)."""

    writer_id: int
    first_offset: int
    batch_id: int
    transaction: TransactionRef | None


class ObjectProducerStateManager:
    """Writer state where every append is an immutable segment object and nothing is locked.

    A sink commit is one segment object whose batches all carry producerId = writer id,
    producerEpoch 0 and baseSequence = batch id (stamp_commit), so a writer's last committed batch
    is in the data from the commit point on, even if the writer dies right after it. The state
    file is a hint, last writer wins: `writers` maps writer id -> [batch id, base offset] and is
    complete for the segments below `asOf` (each writer merges the headers it read into the hint it
    read); `segments` holds each segment's size and largest timestamp (segment_metadata.py). The
    authoritative check reads the first batch header (one 61-byte ranged GET; a marker object's record, one
    more) of each segment from asOf on, newest first, until it meets the writer's commit; below asOf the hint
    answers. Every append rewrites the hint: a sink commit in complete(), any other append right after its segment.

    Transactional commits (issue 24): a transaction's data in a partition is one object of transactional
    batches, ended by its writer's marker, one more object. A transactional data object counts as committed
    once a COMMIT marker of its writer follows it; with no marker after it, it is the writer's open
    transaction, which `kafkalog-txn-<writer id>.json` in the partition directory ties to its decision
    (Kafka ignores the file): the writer writes it, before the data, once any earlier transaction of its own in
    the partition is ended, so the open data is always that file's transaction. The hint's asOf never passes
    the first offset of an open transaction, so open transactions are always found in the headers it reads.
    """

    stamps_batches = True

    def __init__(self, log, headers: dict | None = None, *, time: Time = SYSTEM_TIME):
        self.log = log
        self.fs = log.fs
        self.time = time
        self.path = self.fs.join(log.dir, STATE_FILE)
        hint = read_hint(self.fs, log.dir)
        self.as_of = -1 if hint is None else hint.as_of  # -1, no hint: every segment is read
        self.hint: dict[int, tuple[int, int]] = {} if hint is None else hint.writers
        self.segments: dict[int, SegmentMetadata] = {} if hint is None else hint.segments
        self.headers = {} if headers is None else headers  # base offset -> (producerId, epoch, baseSequence)
        self.kinds: dict[int, str] = {}  # base offset -> PLAIN, TXN_DATA, COMMIT, ABORT or OTHER_CONTROL
        self._pending: dict[int, PendingCommit] = {}
        self._written: dict | None = None

    def header(self, seg) -> tuple[int, int, int]:
        """(producerId, producerEpoch, baseSequence) of a segment's first batch, read once."""
        got = self.headers.get(seg.base_offset)
        if got is None:
            self._read_first_batch(seg)
            got = self.headers[seg.base_offset]
        return got

    def kind(self, seg) -> str:
        """What the segment's first batch is (PLAIN, TXN_DATA, COMMIT, ABORT, OTHER_CONTROL), read once."""
        got = self.kinds.get(seg.base_offset)
        if got is None:
            self._read_first_batch(seg)
            got = self.kinds[seg.base_offset]
        return got

    def _read_first_batch(self, seg) -> None:
        """One ranged GET: the first batch header, and the whole batch when the object is one marker."""
        data = self.fs.read(seg.log_path, 0, RECORD_BATCH_OVERHEAD)
        url = self.fs.url(seg.log_path)
        if not data:
            self.headers[seg.base_offset], self.kinds[seg.base_offset] = (-1, -1, -1), PLAIN
            return
        if len(data) < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(
                f"segment object starts with a partial batch header ({len(data)} bytes)", source=url, position=0
            )
        if data[MAGIC_OFFSET] != 2:
            raise CorruptRecordError(f"first batch has magic {data[MAGIC_OFFSET]}, not 2", source=url, position=0)
        h = RecordBatchHeader.read(data, source=url)
        self.headers[seg.base_offset] = (h.producer_id, h.producer_epoch, h.base_sequence)
        kind = PLAIN
        if h.attributes & CONTROL_FLAG_MASK:
            kind = OTHER_CONTROL
            if seg.size == FIRST_BATCH_READ_BYTES:  # the size of a marker object: its record, one more ranged GET
                data += self.fs.read(seg.log_path, RECORD_BATCH_OVERHEAD, FIRST_BATCH_READ_BYTES)
            whole = h.batch_length + LOG_OVERHEAD == len(data) == seg.size
            for outcome in (COMMIT, ABORT):
                if whole and is_marker(data, MARKER_TYPES[outcome], h.producer_id):
                    if compute_crc(data) != h.crc:
                        raise CorruptRecordError("marker batch fails its CRC", source=url, position=0)
                    kind = outcome
        elif h.attributes & TRANSACTIONAL_FLAG_MASK:
            kind = TXN_DATA
        self.kinds[seg.base_offset] = kind

    @staticmethod
    def is_commit(header: tuple[int, int, int]) -> bool:
        pid, epoch, seq = header
        return pid >= 0 and epoch == 0 and seq >= 0

    def unsummarized(self, below: int | None = None) -> list:
        """Segment objects from asOf on (below `below`): the ones whose commits the hint may lack."""
        return [
            s
            for s in self.log.segments
            if s.size and s.base_offset >= self.as_of and (below is None or s.base_offset < below)
        ]

    def committed(self, writer_id: int) -> tuple[int, int]:
        """(last committed batch id, base offset of its segment) of a writer; (-1, -1) if none. Newest first:
        a transactional data object counts only when the writer's next marker after it is a COMMIT."""
        end = None  # the writer's marker after the segments seen so far (newest first), None: none yet
        for seg in reversed(self.unsummarized()):
            h = self.header(seg)
            if h[0] != writer_id:
                continue
            kind = self.kind(seg)
            if kind in (COMMIT, ABORT):
                end = kind
            elif self.is_commit(h) and (kind == PLAIN or (kind == TXN_DATA and end == COMMIT)):
                return h[2], seg.base_offset
        return self.hint.get(writer_id, (-1, -1))

    def transactions(self, below: int | None = None) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
        """Oldest first over the segments from asOf on: (commits, open), both writer id -> (batch id, base
        offset of its data object): the writers' last commits found there, and their open transactions."""
        commits: dict[int, tuple[int, int]] = {}
        open_: dict[int, tuple[int, int]] = {}
        for seg in self.unsummarized(below):
            h = self.header(seg)
            kind = self.kind(seg)
            if kind == TXN_DATA and h[0] >= 0:
                open_.setdefault(h[0], (h[2], seg.base_offset))
            elif kind == COMMIT:
                got = open_.pop(h[0], None)
                if got is not None and got[0] >= 0:
                    commits[h[0]] = got
            elif kind == ABORT:
                open_.pop(h[0], None)
            elif kind == PLAIN and self.is_commit(h):
                commits[h[0]] = (h[2], seg.base_offset)
        return commits, open_

    def entry(self, writer_id: int) -> WriterEntry:
        batch, base = self.committed(writer_id)
        nxt = -1
        if base >= 0:
            later = [s.base_offset for s in self.log.segments if s.base_offset > base and s.size]
            nxt = later[0] if later else self.log.log_end_offset
        return WriterEntry(batch, nxt, self._pending.get(writer_id))

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest open transaction (Kafka's firstUnstableOffset), or None."""
        _, open_ = self.transactions()
        return min((base for _, base in open_.values()), default=None)

    def save(self) -> None:
        """Nothing to save: the batches hold the state; complete() writes the hint."""

    def begin(
        self,
        writer_id: int,
        batch_id: int,
        first_offset: int,
        next_offset: int,
        transaction: TransactionRef | None = None,
    ) -> None:
        """Remember the commit about to be appended (its segment is the commit). A transactional one writes
        the writer's transaction file first: what ties the data to its decision if the writer dies."""
        if not 0 <= batch_id <= MAX_BATCH_ID:
            raise KafkaStorageError(f"batch id {batch_id} of writer {writer_id} does not fit baseSequence (int32)")
        if transaction is not None:
            doc = {
                "version": TXN_FILE_VERSION,
                "batch_id": batch_id,
                "first_offset": first_offset,  # where the create-only data object goes (rewritten on each retry)
                "transaction": transaction.to_json(),
            }
            self.fs.write_atomic(self.txn_path(writer_id), json.dumps(doc, sort_keys=True).encode())
        self._pending[writer_id] = PendingCommit(batch_id, first_offset, next_offset, transaction)

    def txn_path(self, writer_id: int) -> str:
        return self.fs.join(self.log.dir, txn_file_name(writer_id))

    def read_txn_file(self, writer_id: int) -> tuple[int, int, TransactionRef] | None:
        """(batch id, first offset, transaction) of the writer's transaction file in this partition, None when
        there is none; a damaged file is an error naming it."""
        path = self.txn_path(writer_id)
        try:
            raw = _read_bounded(self.fs, path)
        except FileNotFoundError:
            return None
        except ValueError as e:
            raise KafkaStorageError(f"transaction file {self.fs.url(path)} is {e}") from None
        if not raw:
            return None
        try:
            doc = json.loads(raw)
            if doc["version"] != TXN_FILE_VERSION:
                raise ValueError(f"version {doc['version']!r}, expected {TXN_FILE_VERSION}")
            batch = _long(doc["batch_id"], "batch_id")
            first = _long(doc["first_offset"], "first_offset")
            return batch, first, TransactionRef.from_json(doc["transaction"])
        except (ValueError, KeyError, TypeError) as e:
            raise KafkaStorageError(f"transaction file {self.fs.url(path)} is not valid ({e})") from None

    def appended(self, seg, scan) -> None:
        """Called by the Log after it created an append's segment object (its scan at hand): note the
        segment's header and metadata; an append that is no sink commit writes the hint now."""
        h = scan.headers[0]
        self.headers[seg.base_offset] = (int(h["producer_id"]), int(h["producer_epoch"]), int(h["base_sequence"]))
        attrs = int(h["attributes"])
        if not attrs & CONTROL_FLAG_MASK:  # a marker's type is in its record: kind() reads it when asked
            self.kinds[seg.base_offset] = TXN_DATA if attrs & TRANSACTIONAL_FLAG_MASK else PLAIN
        self.segments[seg.base_offset] = SegmentMetadata(seg.size, seg.largest_timestamp)
        if not self._pending:
            self.update_hint({})

    def complete(self, writer_id: int) -> None:
        """After the commit's segment object is created: write the hint, merged with the headers of the
        segments between the old hint and this commit. A failed write is only logged (it is a hint).
        A transactional commit is not committed yet (its marker does that): no hint then."""
        p = self._pending.pop(writer_id, None)
        if p is not None and p.transaction is None:
            self.update_hint({writer_id: (p.batch_id, p.first_offset)})

    def update_hint(self, commits: dict[int, tuple[int, int]], *, as_of: int | None = None) -> bool:
        """Write the hint complete below `as_of` (default: the log end), never past the first offset of an
        open transaction: the old writers, the commits found in the segments from the old asOf on, then
        `commits`; and every segment's metadata. Returns whether it was written."""
        as_of = self.log.log_end_offset if as_of is None else as_of
        writers = dict(self.hint)
        try:
            found, open_ = self.transactions(below=as_of)
            segments = collect(self.log.segments, self.segments)
        except (OSError, KafkaStorageError, CorruptRecordError) as e:  # e.g. retention removed one
            logger.warning(
                "%s: writer state hint not updated: a segment could not be read (%s); the next "
                "writer reads more headers",
                self.fs.url(self.path),
                e,
            )
            return False  # a hint missing a segment's commit would be wrong; the old one is only stale
        if open_:
            as_of = min(base for _, base in open_.values())
            found = {w: c for w, c in found.items() if c[1] < as_of}
            commits = {w: c for w, c in commits.items() if c[1] < as_of}
        writers.update(found)
        writers.update(commits)
        return self._write_hint(writers, as_of, segments)

    def _write_hint(self, writers: dict, as_of: int, segments: dict[int, SegmentMetadata]) -> bool:
        doc = {
            "version": HINT_VERSION,
            "asOf": as_of,
            "writers": {str(w): list(e) for w, e in sorted(writers.items())},
            "segments": segments_doc(segments),
        }
        try:
            self.fs.write_atomic(self.path, json.dumps(doc, sort_keys=True).encode())
        except (KafkaStorageError, OSError) as e:
            logger.warning(
                "%s: writer state hint not written (%s); the next writer reads more headers", self.fs.url(self.path), e
            )
            return False
        self._written = doc
        self.hint, self.as_of, self.segments = writers, as_of, segments
        return True

    def forget(self, writer_id: int) -> None:
        """Drop a one-off writer (a batch write) from the hint this manager wrote, and its transaction file.
        Another writer may merge it back from its segment's header later; that costs only space."""
        doc = self._written
        if doc is not None and str(writer_id) in doc["writers"]:
            writers = {int(w): tuple(e) for w, e in doc["writers"].items() if int(w) != writer_id}
            self._write_hint(writers, doc["asOf"], self.segments)
        self.fs.delete(self.txn_path(writer_id), missing_ok=True)

    def pending_transactions(self) -> list[PendingTransaction]:
        """The transactions open in this partition (transactional data with no marker of its writer after
        it), each with its writer's transaction file, oldest first."""
        _, open_ = self.transactions()
        out = []
        for wid, (batch, base) in sorted(open_.items(), key=lambda kv: kv[1][1]):
            got = self.read_txn_file(wid)
            # the file names this data (batch id and offset), or it was rewritten by a view newer than ours
            txn = got[2] if got is not None and got[:2] == (batch, base) else None
            if got is not None and txn is None:
                logger.warning(
                    "%s: transaction file of writer %d names batch %d at offset %d, its open data is batch %d at "
                    "offset %d; left open",
                    self.fs.url(self.txn_path(wid)),
                    wid,
                    got[0],
                    got[1],
                    batch,
                    base,
                )
            out.append(PendingTransaction(wid, base, batch, txn))
        return out

    def resolve_pending(self, log, *, opener: int | None = None, now_ms: int | None = None) -> list[str]:
        """End the transactions open in this partition as ProducerStateManager.resolve_pending does: decision
        "commit" rolls forward (COMMIT marker), "abort" rolls back (ABORT marker and the marker segment's
        `.txnindex`); with none, the opener aborts it (recording "abort" first) when it is the writer's own or
        open longer than its timeout at `now_ms`; else it stays open. A marker that loses the race for the log
        end stops the work (this Log is stale): the next opener ends the rest. Returns what was done.

        With neither `opener` nor `now_ms` (the loader's call when a Log is opened for writing) it does nothing:
        finding open transactions reads every segment header from asOf, which a plain append need not pay. The
        sink's transactional writer calls it in every partition it writes, the maintenance job in every
        partition it maintains, each with its clock."""
        if opener is None and now_ms is None:
            return []
        now = self.time.milliseconds() if now_ms is None else now_ms
        done: list[str] = []
        where = f"{log.tp.topic}-{log.tp.partition}"
        pending = self.pending_transactions()
        ended: set[int] = set()  # writers whose transaction this pass ended (no longer open for the LSO)
        for p in pending:
            txn = p.transaction
            if txn is None:
                if opener == p.writer_id:
                    raise KafkaStorageError(
                        f"{where}: writer {p.writer_id}'s transaction at offset {p.first_offset} (batch {p.batch_id}) "
                        f"is open but its transaction file {self.fs.url(self.txn_path(p.writer_id))} does not name "
                        f"it; not appending after it"
                    )
                logger.warning(
                    "%s: transaction of producer %d at offset %d has no transaction file; left open",
                    where,
                    p.writer_id,
                    p.first_offset,
                )
                continue
            outcome = read_decision(self.fs, txn.decision)
            if outcome is None:
                if opener != p.writer_id and not txn.expired(now):
                    continue
                why = "its writer restarted" if opener == p.writer_id else f"open longer than {txn.timeout_ms} ms"
                outcome = decide(self.fs, txn.decision, ABORT, {"partition": where, "reason": why, "timestamp": now})
            others = [q.first_offset for q in pending if q.writer_id != p.writer_id and q.writer_id not in ended]
            # pending while its marker goes in: appended() then leaves the hint to the end of this pass
            self._pending[p.writer_id] = PendingCommit(p.batch_id, p.first_offset, p.first_offset, txn)
            try:
                marker = write_marker(log, outcome, p.writer_id, txn.producer_epoch, now)
            except ConcurrentAppendError:
                logger.info("%s: a marker lost the race for the log end; the next opener ends the transaction", where)
                break
            finally:
                self._pending.pop(p.writer_id, None)
            self.kinds[marker] = outcome
            if outcome == ABORT:
                later = [o for o in others if o < marker]
                write_txn_index_object(
                    log, AbortedTxn(p.writer_id, p.first_offset, marker, min(later, default=marker + 1))
                )
            ended.add(p.writer_id)
            verb = "committed" if outcome == COMMIT else "aborted"
            done.append(f"{verb} batch {p.batch_id} of writer {p.writer_id} (offsets {p.first_offset}..{marker})")
        for line in done:
            level = logging.INFO if line.startswith("committed batch") else logging.WARNING
            logger.log(level, "%s: %s", where, line)
        if done:
            self.update_hint({})  # the hint's asOf may pass the transactions just ended
        return done


def write_txn_index_object(log, txn: AbortedTxn) -> None:
    """The `.txnindex` of an ABORT marker's own segment object, written whole (one entry) with a create-only
    write, where Log.txn_index and Kafka look for it. A crash before it leaves the index missing; readers then
    take the aborted transaction from the marker (TransactionState rebuilds a missing index from the log)."""
    seg = log.segment_for(txn.last_offset)
    if seg is None or seg.base_offset != txn.last_offset:
        raise KafkaStorageError(
            f"{log.tp.topic}-{log.tp.partition}: the ABORT marker at offset {txn.last_offset} is not its own segment"
        )
    entry = np.array([(ABORTED_TXN_VERSION, *txn)], ABORTED_TXN_DTYPE)
    log.fs.create_exclusive(log.txn_index(seg).path, entry.tobytes())
