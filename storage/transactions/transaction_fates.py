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

_NO_MARKER = -1  # the producer has no marker up to the log end: the transaction is open
NOT_DECIDED = -2  # a batch that is not transactional data


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


def marker_types(chunk: BatchChunk, rows: np.ndarray) -> np.ndarray:
    """The ControlRecordType of the marker in each control batch `rows` of the chunk, each checked (CRC, record,
    then Kafka's EndTransactionMarker.deserialize; transaction_state.read_end_marker). A bad one raises
    CorruptRecordError naming the file and the batch's position."""
    from .transaction_state import read_end_marker

    return np.fromiter((int(read_end_marker(chunk, i)[0].control_type) for i in rows.tolist()), np.int64, len(rows))


def check_crcs(chunk: BatchChunk, upto: int) -> None:
    """Raise CorruptRecordError at the first of the chunk's batches [0, upto) whose CRC fails: a batch is served
    at read_committed only when every batch between it and the marker deciding it holds."""
    from ..errors import CorruptRecordError
    from ..file_records import crc_failures, select_batches

    if upto <= 0:
        return
    part = chunk if upto >= len(chunk.scan) else select_batches(chunk, 0, upto)
    bad = crc_failures(part.buf, part.scan)
    if bad.size:
        i = int(bad[0])
        raise CorruptRecordError(
            f"CRC mismatch in batch at offset {int(part.scan.headers['base_offset'][i])}",
            source=chunk.source,
            position=chunk.base_position + int(chunk.scan.positions[i]),
        )


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

    def feed(self, chunk: BatchChunk) -> tuple[np.ndarray, int | None, bool]:
        """(which batches of the chunk to drop: transactional data of aborted transactions; the base offset of
        the first transactional data batch whose producer has no marker up to the log end, or None; whether
        every batch's CRC was checked). A chunk holding markers or transactional data has its CRCs and every
        marker checked before anything of it is served; a bad one raises CorruptRecordError."""
        fate, _, checked = self.decide(chunk)
        drop = fate == ControlRecordType.ABORT
        undecided = np.flatnonzero(fate == _NO_MARKER)
        open_at = int(chunk.scan.headers["base_offset"][undecided[0]]) if undecided.size else None
        return drop, open_at, checked

    def decide(self, chunk: BatchChunk) -> tuple[np.ndarray, np.ndarray, bool]:
        """(per batch: the type of the marker deciding it (ABORT, COMMIT; _NO_MARKER: none up to the log end;
        NOT_DECIDED for a batch that is not transactional data), per batch: that marker's offset (-1 if none),
        whether every batch's CRC was checked)."""
        headers = chunk.scan.headers
        n = len(headers)
        fate = np.full(n, NOT_DECIDED, np.int64)
        marker_at = np.full(n, -1, np.int64)
        data = txn_data_rows(headers)
        markers = marker_rows(headers)
        if not data.any() and not markers.any():
            return fate, marker_at, False
        check_crcs(chunk, n)
        types = np.full(n, _NO_MARKER, np.int64)
        mrows = np.flatnonzero(markers)
        types[mrows] = marker_types(chunk, mrows)
        self.markers_decoded += len(mrows)
        if not data.any():
            return fate, marker_at, True
        bases = headers["base_offset"].astype(np.int64)
        rows = np.flatnonzero(data | markers)
        pids = headers["producer_id"].astype(np.int64)[rows]
        order = np.lexsort((rows, pids))  # by producer, then offset
        srows, spids, is_marker = rows[order], pids[order], markers[rows][order]
        k = len(srows)
        at = np.where(is_marker, np.arange(k), k)
        nxt = np.minimum.accumulate(at[::-1])[::-1]  # the next marker row at or after each, in this order
        same = nxt < k
        same[same] = spids[nxt[same]] == spids[same]
        decided = np.flatnonzero(~is_marker & same)
        fate[srows[decided]] = types[srows[nxt[decided]]]
        marker_at[srows[decided]] = bases[srows[nxt[decided]]]
        pending = np.flatnonzero(~is_marker & ~same)
        if not pending.size:
            return fate, marker_at, True
        chunk_end = int(bases[-1]) + int(headers["last_offset_delta"][-1]) + 1
        wanted = {p for p in np.unique(spids[pending]).tolist() if self._ahead.get(p, (-1, 0))[0] < chunk_end}
        if wanted:
            self._look_ahead(chunk_end, wanted)
        for j in pending.tolist():
            offset, ctype = self._ahead[int(spids[j])]
            row = int(srows[j])
            fate[row] = ctype
            marker_at[row] = -1 if ctype == _NO_MARKER else offset
        return fate, marker_at, True

    def _look_ahead(self, start: int, wanted: set[int]) -> None:
        """Find each wanted producer's first marker at or past `start` from batch headers, checking the CRC of
        every batch and every marker up to the last one found (a bad one raises CorruptRecordError)."""
        for pid in wanted:
            self._ahead.pop(pid, None)
        if start < self._log_end:
            for chunk in self._log.read(start, self._log_end):
                headers = chunk.scan.headers
                self.headers_scanned += len(headers)
                markers = marker_rows(headers)
                pids = headers["producer_id"].astype(np.int64)
                hits = np.flatnonzero(markers & np.isin(pids, np.fromiter(wanted, np.int64, len(wanted))))
                first: dict[int, int] = {}
                for i in hits.tolist():
                    first.setdefault(int(pids[i]), i)
                upto = max(first.values()) + 1 if len(first) == len(wanted) else len(headers)
                check_crcs(chunk, upto)
                mrows = np.flatnonzero(markers[:upto])
                types = marker_types(chunk, mrows)
                self.markers_decoded += len(mrows)
                by_row = dict(zip(mrows.tolist(), types.tolist(), strict=True))
                for pid, i in first.items():
                    self._ahead[pid] = (int(headers["base_offset"][i]), by_row[i])
                    wanted.discard(pid)
                if not wanted:
                    return
        for pid in wanted:
            self._ahead[pid] = (self._log_end, _NO_MARKER)  # open at the log end: not looked up again
