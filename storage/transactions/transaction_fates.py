"""The fate of transactional batches, decided by the log alone: a transactional data batch of producer p belongs
to the transaction that p's next marker in the log ends (the first control batch of p after it that holds a
record, whatever its transactional bit, as Kafka's ProducerAppendInfo and CompletedFetch read it): COMMIT keeps
it, ABORT drops it, no marker up to the log end means the transaction is still open.

This is what a read_committed reader obeys; `.txnindex` files and producer snapshots are hints it checks against
this (the project's rule: indexes and leftovers are hints to verify, never truths to obey).
"""

from __future__ import annotations

import numpy as np

from ..file_records import BatchChunk
from ..records.record_batch import CONTROL_FLAG_MASK, TRANSACTIONAL_FLAG_MASK
from .control_records import ControlRecordType

_NO_MARKER = -1  # in TransactionFates._ahead: the producer has no marker up to the log end


def marker_rows(headers: np.ndarray) -> np.ndarray:
    """Which batches (HEADER_DTYPE rows) are transaction markers: control batches with a producer id that hold a
    record (an empty one is what Kafka's cleaner leaves of a marker whose transaction is gone)."""
    attrs = headers["attributes"].astype(np.int64)
    return (
        (attrs & CONTROL_FLAG_MASK != 0)
        & (headers["producer_id"].astype(np.int64) >= 0)
        & (headers["record_count"].astype(np.int64) > 0)
    )


def txn_data_rows(headers: np.ndarray) -> np.ndarray:
    """Which batches are transactional data batches (transactional bit, no control bit, a producer id)."""
    attrs = headers["attributes"].astype(np.int64)
    return (
        (attrs & TRANSACTIONAL_FLAG_MASK != 0)
        & (attrs & CONTROL_FLAG_MASK == 0)
        & (headers["producer_id"].astype(np.int64) >= 0)
    )


def _marker_type(chunk: BatchChunk, i: int) -> int:
    from .transaction_state import read_end_marker

    marker, _ = read_end_marker(chunk, i)  # CRC and marker checks: a bad marker raises, naming its position
    return int(marker.control_type)


class TransactionFates:
    """The fates of the transactional data batches a read_committed read meets, chunk by chunk in offset order.

    For each chunk: the markers inside it decide the batches before them; a producer still unresolved at the
    chunk's end is looked up by a scan of batch headers forward (decoding only the one marker per producer it
    looks for), up to the log end at most; what that scan finds is kept for later chunks (a batch of p below
    the marker found for p shares its fate). Memory: one entry per producer looked up.

    Invariant: `_ahead[p] = (offset, type)` is p's first marker at or past the end of the chunk that asked for
    it, so it is p's next marker for every batch of p below that offset and at or past that chunk; (log end,
    _NO_MARKER) when p has none up to the log end.
    """

    def __init__(self, log, log_end: int) -> None:
        self._log = log
        self._log_end = log_end
        self._ahead: dict[int, tuple[int, int]] = {}
        self.markers_decoded = 0
        self.headers_scanned = 0

    def feed(self, chunk: BatchChunk) -> tuple[np.ndarray, int | None]:
        """(which batches of the chunk to drop: transactional data of aborted transactions, the base offset of
        the first transactional data batch whose producer has no marker up to the log end, or None)."""
        headers = chunk.scan.headers
        n = len(headers)
        drop = np.zeros(n, bool)
        data = txn_data_rows(headers)
        if not data.any():
            return drop, None
        markers = marker_rows(headers)
        rows = np.flatnonzero(data | markers)
        pids = headers["producer_id"].astype(np.int64)[rows]
        order = np.lexsort((rows, pids))  # by producer, then offset
        srows, spids, is_marker = rows[order], pids[order], markers[rows][order]
        k = len(srows)
        at = np.where(is_marker, np.arange(k), k)
        nxt = np.minimum.accumulate(at[::-1])[::-1]  # the next marker row at or after each, in this order
        same = nxt < k
        same[same] = spids[nxt[same]] == spids[same]
        is_data = ~is_marker
        types: dict[int, int] = {}
        for j in np.unique(nxt[is_data & same]).tolist():
            types[j] = _marker_type(chunk, int(srows[j]))
            self.markers_decoded += 1
        for j in np.flatnonzero(is_data & same).tolist():
            if types[int(nxt[j])] == ControlRecordType.ABORT:
                drop[srows[j]] = True
        pending = np.flatnonzero(is_data & ~same)
        if not pending.size:
            return drop, None
        bases = headers["base_offset"].astype(np.int64)
        chunk_end = int(bases[-1]) + int(headers["last_offset_delta"][-1]) + 1
        wanted = {p for p in np.unique(spids[pending]).tolist() if self._ahead.get(p, (-1, 0))[0] < chunk_end}
        if wanted:
            self._look_ahead(chunk_end, wanted)
        open_at = None
        for j in pending.tolist():
            found = self._ahead.get(int(spids[j]))
            row = int(srows[j])
            if found is None or found[0] < chunk_end or found[1] == _NO_MARKER:
                b = int(bases[row])
                open_at = b if open_at is None else min(open_at, b)
            elif found[1] == ControlRecordType.ABORT:
                drop[row] = True
        return drop, open_at

    def _look_ahead(self, start: int, wanted: set[int]) -> None:
        """Find each wanted producer's first marker at or past `start` (headers only, one decode per producer)."""
        for pid in wanted:
            self._ahead.pop(pid, None)
        if start >= self._log_end:
            return
        want = np.fromiter(wanted, np.int64, len(wanted))
        for chunk in self._log.read(start, self._log_end):
            headers = chunk.scan.headers
            self.headers_scanned += len(headers)
            hits = np.flatnonzero(marker_rows(headers) & np.isin(headers["producer_id"].astype(np.int64), want))
            for i in hits.tolist():
                pid = int(headers["producer_id"][i])
                if pid in wanted:
                    self._ahead[pid] = (int(headers["base_offset"][i]), _marker_type(chunk, i))
                    self.markers_decoded += 1
                    wanted.discard(pid)
            if not wanted:
                return
            want = np.fromiter(wanted, np.int64, len(wanted))
        for pid in wanted:
            self._ahead[pid] = (self._log_end, _NO_MARKER)  # open at the log end: not looked up again
