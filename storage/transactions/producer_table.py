"""A partition's producer table as Kafka's producer snapshot holds it (ProducerStateManager's `producers` map):
one entry per producer id seen in an idempotent or transactional batch, advanced from batch headers, and
written as `<offset>.snapshot` (producer_snapshot.py) when a writer rolls a segment or closes cleanly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from ..common.constants import INT32_MAX
from ..errors import TooManyProducersError
from ..file_records import BatchChunk
from ..records.record_batch import CONTROL_FLAG_MASK, SCAN_OK, BatchScan, validate_batches
from .producer_snapshot import PRODUCER_ENTRY_DTYPE, latest_valid_snapshot, write_snapshot
from .transaction_index import AbortedTxn
from .transaction_state import MAX_OPEN_TRANSACTIONS, TransactionScan, read_end_marker

logger = logging.getLogger(__name__)

#: Producer ids one partition's table tracks. Kafka drops producers idle for producer.id.expiration.ms (a day);
#: a table here has no expiry, so past this many a writer refuses to snapshot the partition
#: (TooManyProducersError) rather than grow without bound.
MAX_PRODUCERS = 100_000

NO_SEQUENCE = -1  # RecordBatch.NO_SEQUENCE
NO_EPOCH = -1  # RecordBatch.NO_PRODUCER_EPOCH
NO_TIMESTAMP = -1  # RecordBatch.NO_TIMESTAMP

# positions in an entry list, in PRODUCER_ENTRY_DTYPE's field order
_EPOCH, _LAST_SEQ, _LAST_OFFSET, _OFFSET_DELTA, _TIMESTAMP, _COORDINATOR_EPOCH = 1, 2, 3, 4, 5, 6


def last_sequences(base_sequence: np.ndarray, last_offset_delta: np.ndarray) -> np.ndarray:
    """Kafka's DefaultRecordBatch.lastSequence per batch: baseSequence + lastOffsetDelta, wrapping past INT32_MAX
    to 0 (incrementSequence); NO_SEQUENCE stays NO_SEQUENCE."""
    base = base_sequence.astype(np.int64)
    last = base + last_offset_delta.astype(np.int64)
    last = np.where(last > INT32_MAX, last - INT32_MAX - 1, last)
    return np.where(base == NO_SEQUENCE, NO_SEQUENCE, last)


def _last_per_producer(pids: np.ndarray, idx: np.ndarray) -> dict[int, int]:
    """producerId -> the index (into the chunk's headers) of its last batch among `idx` (offset order)."""
    if not idx.size:
        return {}
    rev = idx[::-1]
    ids, first = np.unique(pids[rev], return_index=True)
    return dict(zip(ids.tolist(), rev[first].tolist(), strict=True))


class ProducerTable:
    """Each producer's snapshot entry (Kafka's ProducerStateEntry with its last BatchMetadata) as of offset
    `as_of`: producerId -> [producerId, epoch, lastSequence, lastOffset, offsetDelta, timestamp,
    coordinatorEpoch, currentTxnFirstOffset], the open transactions kept by a TransactionScan.

    Rules (ProducerAppendInfo.append): a data batch sets the epoch, its BatchMetadata (lastSequence, lastOffset,
    offsetDelta = lastOffsetDelta) and the timestamp (its maxTimestamp); a control batch with a marker sets the
    epoch (a new epoch drops the BatchMetadata: lastSequence -1, lastOffset -1, offsetDelta 0), the coordinator
    epoch and the timestamp (the marker record's), and closes the transaction; an empty control batch (its
    transaction cleaned away) changes nothing. Only each producer's last data and last marker batch of a chunk
    matter, so a chunk costs numpy over its headers and Python per producer, never per record.

    Invariants: at most max_producers entries; `as_of` only moves up, through advance().
    """

    def __init__(
        self,
        partition: str,
        as_of: int,
        entries: np.ndarray | None = None,
        *,
        max_producers: int | None = None,
        snapshot_offset: int | None = None,
    ):
        self.partition = partition
        self.as_of = as_of
        self.max_producers = MAX_PRODUCERS if max_producers is None else max_producers
        self.snapshot_offset = snapshot_offset  # the offset of the snapshot this table was last written to or read from
        self.entries: dict[int, list[int]] = {}
        ongoing: dict[int, int] = {}
        if entries is not None:
            self._check_size(len(entries), as_of)
            for row in entries.tolist():
                self.entries[row[0]] = list(row[:7])
                if row[7] >= 0:
                    ongoing[row[0]] = row[7]
        self.txns = TransactionScan(partition, ongoing, MAX_OPEN_TRANSACTIONS)
        self.aborted: list[AbortedTxn] = []  # the aborts the scan met since the last snapshot

    @classmethod
    def load(cls, log, end: int, *, max_producers: int | None = None) -> ProducerTable:
        """The table of `log` (a Log) as of `end`: its latest snapshot in [log start, end] that reads back whole
        (a bad one is logged and an older one tried), advanced over the batches after it; with none, a scan
        from the log start (Kafka's loader)."""
        partition = f"{log.tp.topic}-{log.tp.partition}"
        start = log.log_start_offset
        found = latest_valid_snapshot(log.fs, log.dir, start, end)
        if found is not None:
            snap, entries = found
            table = cls(partition, snap.offset, entries, max_producers=max_producers, snapshot_offset=snap.offset)
        else:
            table = cls(partition, start, max_producers=max_producers)
        table.advance(log, end)
        return table

    def _check_size(self, n: int, offset: int) -> None:
        if n > self.max_producers:
            raise TooManyProducersError(
                f"partition {self.partition} has more than {self.max_producers} producer ids at offset {offset}: "
                f"more than a producer snapshot tracks (MAX_PRODUCERS)"
            )

    def advance(self, log, end: int) -> None:
        """Feed the batches of `log` in [as_of, end): the cost is what was appended since the table was last
        advanced."""
        if end > self.as_of:
            for chunk in log.read(self.as_of, end):
                self.feed(chunk)
            self.as_of = end

    def feed_headers(self, headers: np.ndarray, source: str) -> bool:
        """Advance over data batches known by their headers alone, the next ones after `as_of` (an adopted staging
        segment: its records need not be read). The headers are checked first; False, with nothing fed, when
        they do not start at `as_of` or hold a control batch (a marker's records are needed: advance reads them)."""
        if not len(headers) or int(headers["base_offset"][0]) != self.as_of:
            return False
        if (headers["attributes"] & CONTROL_FLAG_MASK).any():
            return False
        positions = np.zeros(len(headers), np.int64)  # no buffer: feed reads records of control batches only
        scan = BatchScan(positions, headers, 0, SCAN_OK)
        validate_batches(b"", scan, source=source, check_crc=False, expected_first_offset=self.as_of)
        self.feed(BatchChunk(b"", scan, 0, source))
        self.as_of = int(scan.last_offsets[-1]) + 1
        return True

    def feed(self, chunk: BatchChunk) -> None:
        """Advance over a chunk of whole batches, in offset order, following the last one."""
        headers = chunk.scan.headers
        pids = headers["producer_id"].astype(np.int64)
        has_pid = pids >= 0
        if not has_pid.any():
            return
        self.aborted += self.txns.feed(chunk)
        attrs = headers["attributes"].astype(np.int64)
        control = attrs & CONTROL_FLAG_MASK != 0
        markers = control & (headers["record_count"].astype(np.int64) > 0)  # Kafka: isControlBatch, bit or not
        last_data = _last_per_producer(pids, np.flatnonzero(has_pid & ~control))
        last_marker = _last_per_producer(pids, np.flatnonzero(has_pid & markers))
        new = (last_data.keys() | last_marker.keys()) - self.entries.keys()
        self._check_size(len(self.entries) + len(new), int(headers["base_offset"][0]))
        last_seq = last_sequences(headers["base_sequence"], headers["last_offset_delta"])
        for pid in sorted(last_data.keys() | last_marker.keys()):
            entry = self.entries.get(pid)
            if entry is None:  # ProducerStateEntry.empty
                entry = self.entries[pid] = [pid, NO_EPOCH, NO_SEQUENCE, -1, 0, NO_TIMESTAMP, -1]
            d = last_data.get(pid)
            m = last_marker.get(pid)
            if m is not None and (d is None or m < d):
                self._apply_marker(entry, chunk, m)
            if d is not None:
                entry[_EPOCH] = int(headers["producer_epoch"][d])
                entry[_LAST_SEQ] = int(last_seq[d])
                entry[_LAST_OFFSET] = int(headers["base_offset"][d]) + int(headers["last_offset_delta"][d])
                entry[_OFFSET_DELTA] = int(headers["last_offset_delta"][d])
                entry[_TIMESTAMP] = int(headers["max_timestamp"][d])
            if m is not None and d is not None and m > d:
                self._apply_marker(entry, chunk, m)

    @staticmethod
    def _apply_marker(entry: list[int], chunk: BatchChunk, i: int) -> None:
        """ProducerStateEntry.update(epoch, coordinatorEpoch, timestamp) for the marker in control batch i."""
        marker, timestamp = read_end_marker(chunk, i)
        epoch = int(chunk.scan.headers["producer_epoch"][i])
        if epoch != entry[_EPOCH]:  # maybeUpdateProducerEpoch: a new epoch drops the batch metadata
            entry[_EPOCH] = epoch
            entry[_LAST_SEQ], entry[_LAST_OFFSET], entry[_OFFSET_DELTA] = NO_SEQUENCE, -1, 0
        entry[_COORDINATOR_EPOCH] = marker.coordinator_epoch
        entry[_TIMESTAMP] = timestamp

    def to_array(self) -> np.ndarray:
        """The entries as rows of PRODUCER_ENTRY_DTYPE, by producer id (what a snapshot file holds)."""
        ongoing = self.txns.ongoing
        rows = [(*self.entries[pid], ongoing.get(pid, -1)) for pid in sorted(self.entries)]
        return np.array(rows, PRODUCER_ENTRY_DTYPE)

    def take_snapshot(self, log, offset: int, index_aborted: Callable[[list[AbortedTxn]], None]) -> str | None:
        """Advance to `offset` and write `<offset>.snapshot` into the log's directory, durably (Kafka's
        takeSnapshot: nothing when a snapshot at that offset was already written or read, or when no producer
        batch was ever seen); returns the path written, else None. First `index_aborted` gets the aborts met
        since the last snapshot: a loader trusts the `.txnindex` files below a snapshot, so they must hold them
        (Kafka writes an abort's entry with its marker)."""
        if offset < self.as_of or offset == self.snapshot_offset:
            return None
        self.advance(log, offset)
        if not self.entries:
            return None
        if self.aborted:
            index_aborted(self.aborted)
            self.aborted = []
        path = write_snapshot(log.fs, log.dir, offset, self.to_array(), durable=True)
        self.snapshot_offset = offset
        logger.info("wrote producer snapshot %s with %d producer ids", log.fs.url(path), len(self.entries))
        return path
