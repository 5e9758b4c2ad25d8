"""ObjectProducerStateManager: the writer state of a partition whose every append is an immutable segment
object (object stores), read from the batches themselves, with its hint (writer_state_hint.py) and each
writer's transaction file `kafkalog-txn-<writer id>.json` (TXN_FILE_VERSION: {"version": 1, "batch_id",
"first_offset", "transaction"}) tying a sink transaction still open to its decision.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np

from ..common.time import SYSTEM_TIME, Time
from ..errors import ConcurrentAppendError, CorruptRecordError, KafkaStorageError
from ..records.record_batch import (
    CONTROL_FLAG_MASK,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
    RecordBatchHeader,
    compute_crc,
)
from ..transactions.transaction_coordinator import (
    ABORT,
    ABORT_DECISION_RETENTION_MS,
    COMMIT,
    COMMIT_MARKER,
    MARKER_TYPES,
    TransactionRef,
    is_marker,
    marker_record,
    read_decision,
    write_marker,
)
from ..transactions.transaction_index import ABORTED_TXN_DTYPE, ABORTED_TXN_VERSION, AbortedTxn
from ..transactions.writer_state import (
    STATE_FILE,
    PendingCommit,
    WriterEntry,
    WriterState,
    check_batch_id,
    check_long,
    read_bounded,
)
from .segment_metadata import SegmentMetadata, collect, segments_doc
from .writer_state_hint import HINT_VERSION, read_hint

logger = logging.getLogger(__name__)

# what a segment object's first batch is, for the transaction scan of ObjectProducerStateManager
PLAIN = "data"  # a non-transactional data batch (a sink commit of the non-transactional protocol, or any append)
TXN_DATA = "txn"  # a transactional data batch
OTHER_CONTROL = "control"  # a control batch that is no marker of its producer's transaction as marker_batch builds it
# a marker segment object is one marker batch: RECORD_BATCH_OVERHEAD + 17 bytes
FIRST_BATCH_READ_BYTES = RECORD_BATCH_OVERHEAD + len(marker_record(COMMIT_MARKER))
TXN_FILE_PREFIX = "kafkalog-txn-"  # + writer id + ".json": a writer's open sink transaction in a partition
TXN_FILE_VERSION = 1


# a writer's transaction file outlives its last transaction here by this much before the maintenance job removes
# it: past the abort decisions' retention, that transaction can neither be committed (COMMIT_HORIZON_MS) nor
# found aborted by its decision, so the file ties nothing to anything any more
TXN_FILE_RETENTION_MS = ABORT_DECISION_RETENTION_MS


def txn_file_name(writer_id: int) -> str:
    return f"{TXN_FILE_PREFIX}{writer_id}.json"


def txn_file_writer(name: str) -> int | None:
    """The writer id a partition file's name says it is the transaction file of, or None."""
    if not (name.startswith(TXN_FILE_PREFIX) and name.endswith(".json")):
        return None
    digits = name[len(TXN_FILE_PREFIX) : -len(".json")]
    return int(digits) if digits.isdigit() and len(digits) <= 19 else None


@dataclass(frozen=True)
class PendingTransaction:
    """A writer's transaction still open in a partition of immutable segments, found in the log: its first data
    object's base offset and batch id (baseSequence), and the transaction the writer's transaction file names
    for exactly that batch and offset (None when the file is missing or names another)."""

    writer_id: int
    first_offset: int
    batch_id: int
    transaction: TransactionRef | None


class ObjectProducerStateManager(WriterState):
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

    def save(self, *, durable: bool = True) -> None:
        """Nothing to save: the batches hold the state; complete() writes the hint."""

    def _begin(self, writer_id: int, pending: PendingCommit) -> None:
        """Remember the commit about to be appended (its segment is the commit). A transactional one writes
        the writer's transaction file first: what ties the data to its decision if the writer dies."""
        check_batch_id(writer_id, pending.batch_id, self.fs.url(self.log.dir))
        if pending.transaction is not None:
            doc = {
                "version": TXN_FILE_VERSION,
                "batch_id": pending.batch_id,
                # where the create-only data object goes (the file is rewritten on each retry)
                "first_offset": pending.first_offset,
                "transaction": pending.transaction.to_json(),
            }
            self.fs.write_atomic(self.txn_path(writer_id), json.dumps(doc, sort_keys=True).encode())
        self._pending[writer_id] = pending

    def txn_path(self, writer_id: int) -> str:
        return self.fs.join(self.log.dir, txn_file_name(writer_id))

    def read_txn_file(self, writer_id: int) -> tuple[int, int, TransactionRef] | None:
        """(batch id, first offset, transaction) of the writer's transaction file in this partition, None when
        there is none; a damaged file is an error naming it."""
        path = self.txn_path(writer_id)
        try:
            raw = read_bounded(self.fs, path)
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
            batch = check_long(doc["batch_id"], "batch_id")
            first = check_long(doc["first_offset"], "first_offset")
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

    def expire_transaction_files(self, now_ms: int) -> list[str]:
        """Delete the transaction files of writers gone for good (the maintenance job's duty); returns them.

        A file goes once its writer holds no open transaction in this partition and the transaction it names
        began more than TXN_FILE_RETENTION_MS before `now_ms` (by the writer's clock, which stamped it). A live
        writer rewrites its file at every transaction it begins here, so its file is never that old; one that
        stops writing this partition (or dies) leaves a file that goes after the retention. A damaged file is
        kept, with a warning. The check and the delete are two requests: a writer that begins a transaction here
        in between, after TXN_FILE_RETENTION_MS of silence, loses its file, and if it then dies before its
        decision its open transaction stays open (logged by every opener) until the file is rewritten."""
        _, open_ = self.transactions()
        gone = []
        self.fs.invalidate_listings(self.log.dir)
        for f in self.fs.listdir(self.log.dir):
            wid = txn_file_writer(f.name)
            if f.is_dir or wid is None or wid in open_:
                continue
            path = self.txn_path(wid)
            try:
                got = self.read_txn_file(wid)
                if got is None or now_ms - got[2].started_ms <= TXN_FILE_RETENTION_MS:
                    continue
            except KafkaStorageError as e:
                logger.warning("%s kept: %s", self.fs.url(path), e)
                continue
            self.fs.delete(path, missing_ok=True)
            gone.append(path)
        if gone:
            logger.info("%s: removed %d dead writer(s)' transaction files", self.fs.url(self.log.dir), len(gone))
        return gone

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

    def _resolve(self, log, opener: int | None, now: int, *, explicit: bool) -> list[str]:
        """End the transactions open in this partition as ProducerStateManager does: decision
        "commit" rolls forward (COMMIT marker), "abort" rolls back (ABORT marker and the marker segment's
        `.txnindex`); with none, the opener aborts it (recording "abort" first) when it is the writer's own or
        open longer than its timeout at `now`; else it stays open. A marker that loses the race for the log
        end stops the work (this Log is stale): the next opener ends the rest. Returns what was done.

        When not `explicit` (the loader's call when a Log is opened for writing) it does nothing:
        finding open transactions reads every segment header from asOf, which a plain append need not pay. The
        sink's transactional writer calls it in every partition it writes, the maintenance job in every
        partition it maintains, each with its clock."""
        if not explicit:
            return []
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
                if not self._undecided_ends(txn, p.writer_id, opener, now):
                    continue
                outcome = self._abort_undecided(log, txn, p.writer_id, opener, now)
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
