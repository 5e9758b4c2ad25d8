"""A Log's transactions as a read_committed reader sees them: the last stable offset and the aborted
transactions over a range of offsets (Kafka's UnifiedLog.lastStableOffset and collectAbortedTransactions)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CorruptIndexError, TooManyAbortedTransactionsError, TransactionStateError
from ..topic_partition import TXN_INDEX_FILE_SUFFIX, segment_file_name
from .transaction_index import ABORTED_TXN_DTYPE, TransactionIndex

if TYPE_CHECKING:  # the transaction state loads Arrow (marker decoding): only a read_committed use imports it
    from .transaction_fates import TransactionFates
    from .transaction_state import TransactionState

log = logging.getLogger(__name__)


class TransactionView:
    """The read side of one Log's transactions: its TransactionState (open transactions, the aborts that stand
    in for missing or bad `.txnindex` files), built on first use from the latest producer snapshot and a header
    scan and kept, and the segments' `.txnindex` files, each opened once.

    Invariants: a Log that never reads read_committed never loads the state; the state is as of the log end the
    Log passes on its first use (a Log reads up to the end it loaded); a writer replaces each index the state
    distrusts with what the state found, a reader only uses them. The owning Log calls forget_index when it
    appends to a segment's `.txnindex` itself, so the next use rereads it. Not thread-safe, as its Log.
    """

    def __init__(self, log, segments) -> None:
        self._log = log  # the Log: its filesystem, reads, log start and writer state
        self._segments = segments  # the Log's LogSegments (read only here)
        self._state: TransactionState | None = None
        self._indexes: dict[int, TransactionIndex] = {}  # by segment base offset, opened on first use

    def state(self, log_end: int) -> TransactionState:
        """The transaction state, loaded on first use (a writer then rewrites the indexes it distrusts)."""
        if self._state is None:
            from .transaction_state import TransactionState

            self._state = TransactionState.load(self._log, log_end)
            self._rewrite_indexes(self._state)
        return self._state

    def _rewrite_indexes(self, state: TransactionState) -> None:
        """A writer puts the aborted transactions the state found in place of each missing or bad `.txnindex`
        (Kafka's loader rebuilds it on recovery); a reader only uses them. On immutable segments the index is
        one whole object, made with a create-only write (another writer's rebuild, made first, holds the
        same entries), and none when there are no entries."""
        owner = self._log
        if not owner.writable or owner.closed:
            return
        from .transaction_index import entries_to_txns

        for seg in self._segments:
            rebuilt = state.rebuilt.get(seg.base_offset)
            if rebuilt is None:
                continue
            index = self.txn_index(seg)
            if owner.fs.exists(index.path):
                owner.fs.delete_many([index.path])  # a bad file is not read again, only replaced
            if owner.immutable:
                self._indexes.pop(seg.base_offset, None)
                if len(rebuilt):
                    owner.fs.create_exclusive(index.path, rebuilt.astype(ABORTED_TXN_DTYPE).tobytes())
                    log.info("rebuilt transaction index %s (%d entries)", owner.fs.url(index.path), len(rebuilt))
                continue
            index = self._indexes[seg.base_offset] = TransactionIndex(owner.fs, index.path, seg.base_offset)
            for txn in entries_to_txns(rebuilt):
                index.append(txn)
            index.flush()
            index.close()
            log.info("rebuilt transaction index %s (%d entries)", owner.fs.url(index.path), len(rebuilt))

    def fates(self, log_end: int) -> TransactionFates:
        """A fresh TransactionFates for one read_committed read of the Log up to `log_end`."""
        from .transaction_fates import TransactionFates

        return TransactionFates(self._log, log_end)

    def open_transaction_found(self, open_at: int, served_below: int, log_end: int) -> int:
        """A read found a transactional data batch at `open_at` with no marker up to the log end, below the
        state's last stable offset: the state missed an open transaction (a snapshot that hid it). The state is
        rebuilt from the log start; the new last stable offset is returned (at most `open_at`). A read that
        served records at or past it (all it served lies below `served_below`) raises TransactionStateError."""
        from .transaction_state import TransactionState

        log.warning(
            "%s: a transaction open at offset %d is missing from the transaction state; scanning the log from "
            "its start",
            self._log.fs.url(self._log.dir),
            open_at,
        )
        self._state = state = TransactionState.load(self._log, log_end, from_log_start=True)
        lso = min(open_at, state.last_stable_offset(self._log.log_start_offset, log_end))
        if lso < served_below:
            raise TransactionStateError(
                f"{self._log.fs.url(self._log.dir)}: read_committed served records up to offset {served_below - 1}, "
                f"past the last stable offset {lso} the log holds (a producer snapshot hid an open transaction); "
                f"read again"
            )
        return lso

    def last_stable_offset(self, log_end: int) -> int:
        """The first offset of the earliest transaction still open, else `log_end` (the Log's end offset)."""
        return self.state(log_end).last_stable_offset(self._log.log_start_offset, log_end)

    def txn_index(self, seg) -> TransactionIndex:
        """The `.txnindex` of a segment of the Log (opened once; read on first use)."""
        path = self._log.fs.join(seg.dir, segment_file_name(seg.base_offset, TXN_INDEX_FILE_SUFFIX)) + seg.file_suffix
        index = self._indexes.get(seg.base_offset)
        if index is None or index.path != path:
            index = self._indexes[seg.base_offset] = TransactionIndex(self._log.fs, path, seg.base_offset)
        return index

    def forget_index(self, base_offset: int) -> None:
        """The `.txnindex` of the segment at base_offset changed on disk: the next use opens it again."""
        self._indexes.pop(base_offset, None)

    def _aborted_entries(self, seg, log_end: int) -> np.ndarray:
        """The aborted transactions of a segment: its `.txnindex`, unless the transaction state found it
        missing or bad (then what the log holds); a bad index before the state's scan makes it rescan the
        log from its start."""
        state = self.state(log_end)
        rebuilt = state.rebuilt.get(seg.base_offset)
        if rebuilt is not None:
            return rebuilt
        index = self.txn_index(seg)
        try:
            index.sanity_check()
            return index.entries()
        except CorruptIndexError as e:
            if state.covers(seg.base_offset):
                raise  # the state checked it: it changed since
            log.warning("%s; scanning the log from its start for its aborted transactions", e)
            from .transaction_state import TransactionState

            self._state = state = TransactionState.load(self._log, log_end, from_log_start=True)
            return state.rebuilt.get(seg.base_offset, np.empty(0, ABORTED_TXN_DTYPE))

    def segment_aborted_txns(self, seg, log_end: int) -> np.ndarray:
        """The aborted transactions whose ABORT marker is in `seg`: its `.txnindex`, or what the log holds where
        that is missing or bad."""
        return self._aborted_entries(seg, log_end)

    def collect_aborted_txns(
        self, start_offset: int, upper_bound_offset: int, log_end: int, *, max_entries: int | None = None
    ) -> np.ndarray:
        """The aborted transactions (ABORTED_TXN_DTYPE rows) overlapping [start_offset, upper_bound_offset), as
        Kafka's UnifiedLog.collectAbortedTransactions (_collect_from_indexes), each checked against the log
        (index_disagrees): an entry the log does not back, or an abort the log holds that no entry covers, makes
        the state rebuild every index's entries from the log (a scan from the log start; a writer rewrites the
        files) and the answer come from those. The cleaner removes what this returns: nothing unverified. More
        than `max_entries` rows raise TooManyAbortedTransactionsError before the next index is read."""
        found = self._collect_from_indexes(start_offset, upper_bound_offset, log_end, max_entries)
        why = self.index_disagrees(found, start_offset, min(upper_bound_offset, log_end), log_end)
        if why is None:
            return found
        from .transaction_state import TransactionState

        log.warning("%s; rebuilding the transaction indexes' entries from the log", why)
        self._state = state = TransactionState.load(self._log, log_end, from_log_start=True, compare_indexes=True)
        self._rewrite_indexes(state)
        return self._collect_from_indexes(start_offset, upper_bound_offset, log_end, max_entries)

    def index_disagrees(self, found: np.ndarray, start: int, end: int, log_end: int) -> str | None:
        """Why the collected entries `found` are not what the log holds over [start, end) (None: they agree):
        every transactional data batch there that its producer's next marker aborts lies in an entry of that
        producer ending at that marker, none that a COMMIT decides lies in one, and each entry whose lastOffset
        falls in the range ends at an ABORT marker of its producer. A header scan of the range (plus the
        forward scan TransactionFates makes for producers undecided at its end)."""
        from .control_records import ControlRecordType
        from .transaction_fates import TransactionFates, marker_rows

        start = max(start, self._log.log_start_offset)  # below it the data is gone: nothing to check
        if start >= end:
            return None
        fates = TransactionFates(self._log, log_end)
        pid_e = found["producer_id"].astype(np.int64)
        first_e = found["first_offset"].astype(np.int64)
        last_e = found["last_offset"].astype(np.int64)
        url = self._log.fs.url(self._log.dir)
        for chunk in self._log.read(start, end):
            fate, marker_at, _ = fates.decide(chunk)
            h = chunk.scan.headers
            bases = h["base_offset"].astype(np.int64)
            pids = h["producer_id"].astype(np.int64)
            for i in np.flatnonzero(fate >= 0).tolist():  # per transactional data batch decided by a marker
                b, p = int(bases[i]), int(pids[i])
                cover = (pid_e == p) & (first_e <= b) & (last_e >= b)
                if fate[i] == ControlRecordType.ABORT and not (cover & (last_e == marker_at[i])).any():
                    return f"{url}: no transaction index entry covers producer {p}'s aborted batch at {b}"
                if fate[i] == ControlRecordType.COMMIT and cover.any():
                    return f"{url}: a transaction index entry of producer {p} covers its committed batch at {b}"
            m = marker_rows(h)
            ends = set(zip(pids[m].tolist(), bases[m].tolist(), strict=True))
            lo, hi = int(bases[0]), int(bases[-1]) + int(h["last_offset_delta"][-1])
            for k in np.flatnonzero((last_e >= lo) & (last_e <= hi)).tolist():
                p, last = int(pid_e[k]), int(last_e[k])
                if (p, last) not in ends:
                    return f"{url}: a transaction index entry of producer {p} ends at {last}, where it has no marker"
        return None

    def _collect_from_indexes(
        self, start_offset: int, upper_bound_offset: int, log_end: int, max_entries: int | None = None
    ) -> np.ndarray:
        """Kafka's UnifiedLog.collectAbortedTransactions over the `.txnindex` files (or the state's stand-ins):
        from the index of the segment holding start_offset on, until an entry's lastStableOffset reaches
        upper_bound_offset. Segments past the bound are searched too: an aborted transaction's entry sits in the
        segment of its ABORT marker, which may lie past the bound."""
        from .transaction_state import collect_aborted

        found = []
        total = 0
        start = max(0, self._segments.floor_index(start_offset))
        for k in range(start, len(self._segments)):
            seg = self._segments[k]
            entries, complete = collect_aborted(self._aborted_entries(seg, log_end), start_offset, upper_bound_offset)
            total += len(entries)
            if max_entries is not None and total > max_entries:
                tp = self._log.tp
                raise TooManyAbortedTransactionsError(
                    f"partition {tp.topic}-{tp.partition}: more than {max_entries} aborted transactions overlap "
                    f"offsets {start_offset}..{upper_bound_offset - 1} (read up to segment {seg.base_offset}): more "
                    f"than one pass holds"
                )
            found.append(entries)
            if complete:
                break
        return np.concatenate(found, dtype=ABORTED_TXN_DTYPE) if found else np.empty(0, ABORTED_TXN_DTYPE)
