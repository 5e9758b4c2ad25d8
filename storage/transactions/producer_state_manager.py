"""ProducerStateManager: the writer state of a partition on a filesystem with locks (local disks).

Loaded and changed only by the holder of the partition's write lock. The state lives in `<partition
dir>/kafkalog-producer-state.json` (STATE_FILE, a file Kafka ignores): {"version": 1, "writers": {id:
{committed_batch_id, committed_next_offset, pending, updated_ms}}}, every field checked when read. A
commit is marked pending (durably) before its bytes go in; the next opener finishes or cuts it back.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from ..common.time import SYSTEM_TIME, Time
from ..errors import KafkaStorageError
from ..fs.filesystem import LogFileSystem
from .transaction_coordinator import (
    ABORT,
    COMMIT,
    MARKER_TYPES,
    TransactionRef,
    index_aborted,
    is_marker,
    read_decision,
    write_marker,
)
from .transaction_index import TransactionIndex
from .writer_state import (
    STATE_FILE,
    PendingCommit,
    WriterEntry,
    WriterState,
    check_long,
    find_marker,
    read_bounded,
)


class ProducerStateManager(WriterState):
    """The lock-protected flavour: the state file is the state (see the module docstring)."""

    def __init__(self, fs: LogFileSystem, dir: str, *, time: Time = SYSTEM_TIME):
        self.fs = fs
        self.time = time  # stamps updated_ms
        self.path = fs.join(dir, STATE_FILE)
        self.writers: dict[int, WriterEntry] = {}
        if fs.exists(self.path):
            try:
                self.writers = _parse_state(read_bounded(fs, self.path))
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

    def _begin(self, writer_id: int, pending: PendingCommit) -> None:
        e = self.entry(writer_id)
        if e.pending is not None:
            raise KafkaStorageError(
                f"writer state file {self.fs.url(self.path)}: writer {writer_id} begins batch {pending.batch_id} "
                f"while batch {e.pending.batch_id} is still pending; resolve it first"
            )
        # a log that lost unflushed records (flush.ms topics after a power cut) ends before the last commit's
        # end: say so, so that the rollback check (first_offset >= committed end) holds for every mark we write
        e.committed_next_offset = min(e.committed_next_offset, pending.first_offset)
        e.pending = pending
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

    def _resolve(self, log, opener: int | None, now: int, *, explicit: bool) -> list[str]:
        """Finish or roll back commits a crashed writer left pending (the loader's call too); returns what was done.

        A transactional commit (its data stays, whatever happens) ends as its decision says: "commit"
        rolls forward (the missing COMMIT marker), "abort" rolls back (an ABORT marker and a `.txnindex`
        entry). With no decision yet, the opener aborts it (recording "abort" first: a "commit" found there
        instead rolls forward) when it is the writer's own (a restarted query) or open longer than its
        timeout at `now`; else it stays open and holds the LSO.

        A non-transactional commit with all its bytes present completed; with some, the log is cut back
        to where the commit began, so a replay appends it whole; with none, it never started.
        """
        done = []
        ended: list[PendingCommit] = []
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
            # a transaction's end is durable in the log (its marker, flushed), where find_marker finds it if
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
            if not self._undecided_ends(txn, wid, opener, now):
                return None
            # no decision: never taken, or deleted once every marker was written; the log tells which
            found = find_marker(log, wid, p.first_offset)
            if found is None:
                outcome = self._abort_undecided(log, txn, wid, opener, now)
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


def _parse_state(raw: bytes) -> dict[int, WriterEntry]:
    """The lock-protected state file's writers, every field checked (ValueError, KeyError, TypeError)."""
    out = {}
    for wid, e in json.loads(raw)["writers"].items():
        w = check_long(int(wid), "a writer id")
        pending = None
        if e.get("pending"):
            q = e["pending"]
            pending = PendingCommit(
                check_long(q["batch_id"], "batch_id"),
                check_long(q["first_offset"], "first_offset"),
                check_long(q["next_offset"], "next_offset"),
                TransactionRef.from_json(q["transaction"]) if q.get("transaction") is not None else None,
            )
            if not 0 <= pending.first_offset <= pending.next_offset:
                raise ValueError(
                    f"writer {w}'s pending commit has offsets {pending.first_offset}..{pending.next_offset}"
                )
        out[w] = WriterEntry(
            check_long(e["committed_batch_id"], "committed_batch_id"),
            check_long(e["committed_next_offset"], "committed_next_offset"),
            pending,
            check_long(e.get("updated_ms", 0), "updated_ms"),
        )
    return out
