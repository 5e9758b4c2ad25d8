"""Per-partition writer state: which (writer id, batch id) a partition already holds.

Kafka's ProducerStateManager remembers each idempotent producer's last sequence so a retried
produce is not appended twice. We do the same for Spark micro-batches: each writer (one streaming
query) records its last committed batch id per partition, and marks a commit "pending" before its
bytes go in, so a crash mid-commit is rolled back (or completed) by the next writer to open the
partition. The state lives in `<partition dir>/kafkalog-producer-state.json`, a file Kafka ignores.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass

from .errors import KafkaStorageError
from .filesystem import LogFileSystem

logger = logging.getLogger(__name__)

STATE_FILE = "kafkalog-producer-state.json"


@dataclass
class PendingCommit:
    batch_id: int
    first_offset: int  # the log end offset when the commit began
    next_offset: int  # the log end offset it will leave


@dataclass
class WriterEntry:
    committed_batch_id: int = -1
    committed_next_offset: int = -1
    pending: PendingCommit | None = None
    updated_ms: int = 0


class ProducerStateManager:
    """Loaded and changed only by the holder of the partition's write lock."""

    def __init__(self, fs: LogFileSystem, dir: str):
        self.fs = fs
        self.path = fs.join(dir, STATE_FILE)
        self.writers: dict[int, WriterEntry] = {}
        if fs.exists(self.path):
            try:
                doc = json.loads(fs.read(self.path))
                for wid, e in doc["writers"].items():
                    pending = PendingCommit(**e["pending"]) if e.get("pending") else None
                    self.writers[int(wid)] = WriterEntry(e["committed_batch_id"], e["committed_next_offset"],
                                                         pending, e.get("updated_ms", 0))
            except (ValueError, KeyError, TypeError) as e:
                raise KafkaStorageError(f"writer state file {fs.url(self.path)} is not valid: {e}") from e

    def entry(self, writer_id: int) -> WriterEntry:
        return self.writers.setdefault(writer_id, WriterEntry())

    def save(self) -> None:
        doc = {"version": 1, "writers": {str(w): {**asdict(e), "pending": asdict(e.pending) if e.pending else None}
                                         for w, e in sorted(self.writers.items())}}
        self.fs.write_atomic(self.path, json.dumps(doc, sort_keys=True).encode())

    def begin(self, writer_id: int, batch_id: int, first_offset: int, next_offset: int) -> None:
        """Durably mark a commit as under way before any of its bytes are appended."""
        e = self.entry(writer_id)
        e.pending = PendingCommit(batch_id, first_offset, next_offset)
        e.updated_ms = int(time.time() * 1000)
        self.save()

    def complete(self, writer_id: int) -> None:
        e = self.entry(writer_id)
        if e.pending is not None:
            e.committed_batch_id, e.committed_next_offset = e.pending.batch_id, e.pending.next_offset
            e.pending = None
        e.updated_ms = int(time.time() * 1000)
        self.save()

    def forget(self, writer_id: int) -> None:
        """Drop a one-off writer (a batch write) once its commit is done."""
        if self.writers.pop(writer_id, None) is not None:
            self.save()

    def resolve_pending(self, log) -> list[str]:
        """Finish or roll back commits a crashed writer left pending; returns what was done.

        All bytes of a pending commit present: it completed. Some: the log is cut back to where the
        commit began, so a replay appends it whole. None: it never started.
        """
        done = []
        for wid, e in self.writers.items():
            p = e.pending
            if p is None:
                continue
            leo = log.log_end_offset
            if leo >= p.next_offset and self._written_by(log, p.first_offset, wid):
                e.committed_batch_id, e.committed_next_offset = p.batch_id, p.next_offset
                done.append(f"completed batch {p.batch_id} of writer {wid} (offsets {p.first_offset}..{p.next_offset - 1})")
            elif p.first_offset < leo and self._written_by(log, p.first_offset, wid):
                log.truncate_to(p.first_offset)
                done.append(f"rolled back a partial commit of batch {p.batch_id} of writer {wid}: "
                            f"cut offsets {p.first_offset}..{leo - 1}")
            else:
                done.append(f"dropped pending batch {p.batch_id} of writer {wid}: nothing of it was written")
            e.pending = None
        if done:
            for line in done:
                logger.warning("%s-%d: %s", log.tp.topic, log.tp.partition, line)
            self.save()
        return done

    @staticmethod
    def _written_by(log, offset: int, writer_id: int) -> bool:
        if offset < log.log_start_offset or offset >= log.log_end_offset:
            return False
        for chunk in log.read(offset, offset + 1):
            return bool(len(chunk.scan)) and int(chunk.scan.headers["producer_id"][0]) == writer_id
        return False
