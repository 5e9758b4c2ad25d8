"""CleanedTransactionMetadata: the transactions a cleaning walks through, as Kafka's cleaner tracks them.

Kafka's rules (LogCleaner's CleanedTransactionMetadata), over batches read in offset order:
- the aborted transactions of the range come from the segments' `.txnindex` (collect_aborted_txns); one
  becomes ongoing for its producer once a batch reaches its firstOffset;
- a transactional data batch of a producer with an ongoing aborted transaction is aborted: the offset
  map skips it and the cleaner removes it; any other transactional batch marks its producer's
  transaction as committed data still in the log;
- an ABORT marker ends its producer's aborted transaction; it must stay while that transaction still
  had data in this pass (its entry then goes into the cleaned segment's `.txnindex`), else it may go;
- a COMMIT marker may go when no batch of its transaction was met in this pass; a control batch with
  no record (cleaned already) may go. "May go" means: stamped with a delete horizon (KIP-534) the
  first time, removed by a cleaning past it (the cleaner does that part).
"""

from __future__ import annotations

import numpy as np

from ..log import Log
from ..records import record_batch as rb
from ..transactions.control_records import ControlRecordType
from ..transactions.transaction_index import AbortedTxn, entries_to_txns

_TXN_BITS = rb.TRANSACTIONAL_FLAG_MASK | rb.CONTROL_FLAG_MASK
# the aborted transactions one cleaning holds at most, across every `.txnindex` of its range (each file is capped
# at MAX_TXN_INDEX_BYTES): 34 MB of index rows, a few times that as the pass's per-transaction state. Kafka has
# no such bound; a range with more is an error naming it, as the reader's MAX_OPEN_TRANSACTIONS is
MAX_CLEANER_ABORTED_TXNS = 1_000_000


def collect_aborted_txns(log: Log, lower: int, upper: int, *, max_entries: int | None = None) -> np.ndarray:
    """The aborted transactions overlapping [lower, upper): Log.collect_aborted_txns (Kafka's
    collectAbortedTransactions over the `.txnindex` files, each entry checked against the log's markers, the
    entries rebuilt from the log when they disagree), ABORTED_TXN_DTYPE rows, duplicates removed. More than
    `max_entries` (default MAX_CLEANER_ABORTED_TXNS) rows raise TooManyAbortedTransactionsError naming the
    partition and range, before the next index is read."""
    cap = MAX_CLEANER_ABORTED_TXNS if max_entries is None else max_entries
    return np.unique(log.collect_aborted_txns(lower, upper, max_entries=cap))  # sorted; read below by firstOffset


class CleanedTransactionMetadata:
    """State of one pass over a log: aborted transactions not reached yet (by firstOffset), the ongoing
    aborted transaction of each producer (with whether a batch of it was met), the producers whose
    committed transactional data was met, and the `.txnindex` entries of the output being written.

    Invariant: batches are fed in offset order, each once (snapshot/restore undo a source re-read)."""

    def __init__(self, aborted: np.ndarray):
        order = np.argsort(aborted["first_offset"].astype(np.int64), kind="stable")
        self._pending = entries_to_txns(aborted[order])
        self._firsts = aborted["first_offset"].astype(np.int64)[order]
        self._next = 0
        self._ongoing_aborted: dict[int, tuple[AbortedTxn, bool]] = {}  # producer -> (txn, data met)
        self._ongoing_committed: set[int] = set()
        self.cleaned_entries: list[AbortedTxn] = []  # for the output being written

    @classmethod
    def for_range(cls, log: Log, lower: int, upper: int) -> CleanedTransactionMetadata:
        return cls(collect_aborted_txns(log, lower, upper))

    def _consume_up_to(self, offset: int) -> None:
        stop = int(np.searchsorted(self._firsts, offset, side="right"))
        for txn in self._pending[self._next : stop]:  # per aborted transaction reached
            self._ongoing_aborted.setdefault(txn.producer_id, (txn, False))
        self._next = max(self._next, stop)

    def on_batch_read(self, producer_id: int, last_offset: int, transactional: bool) -> bool:
        """A data batch was read; whether it belongs to an aborted transaction (Kafka's onBatchRead)."""
        self._consume_up_to(last_offset)
        if not transactional:
            return False
        ongoing = self._ongoing_aborted.get(producer_id)
        if ongoing is not None:
            self._ongoing_aborted[producer_id] = (ongoing[0], True)
            return True
        self._ongoing_committed.add(producer_id)
        return False

    def on_control_batch_read(self, producer_id: int, last_offset: int, control_type: int | None) -> bool:
        """A control batch was read (control_type None: it has no record); whether it may be discarded
        (Kafka's onControlBatchRead). An ABORT kept for its data adds its entry to cleaned_entries."""
        self._consume_up_to(last_offset)
        if control_type is None:
            return True
        if control_type == ControlRecordType.ABORT:
            ongoing = self._ongoing_aborted.pop(producer_id, None)
            if ongoing is not None and ongoing[1]:
                self.cleaned_entries.append(ongoing[0])
                return False
            return True
        if control_type == ControlRecordType.COMMIT:
            if producer_id in self._ongoing_committed:
                self._ongoing_committed.discard(producer_id)
                return False
            return True
        return False

    def read_batches(
        self, headers: np.ndarray, idx: np.ndarray, control_types: dict[int, int | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Feed batches idx (in offset order) of a run of HEADER_DTYPE rows; control_types: the type id of
        each control batch's record, by row. Returns (aborted data batches, discardable control batches),
        boolean over idx."""
        h = headers[idx]
        attrs = h["attributes"].astype(np.int64)
        aborted = np.zeros(len(idx), bool)
        discard = np.zeros(len(idx), bool)
        txn_rows = np.flatnonzero((attrs & _TXN_BITS) != 0)
        if txn_rows.size:
            pids = h["producer_id"].astype(np.int64)
            lasts = h["base_offset"].astype(np.int64) + h["last_offset_delta"].astype(np.int64)
            for j in txn_rows.tolist():  # per transactional batch: a sequential state machine
                if attrs[j] & rb.CONTROL_FLAG_MASK:
                    discard[j] = self.on_control_batch_read(int(pids[j]), int(lasts[j]), control_types[int(idx[j])])
                else:
                    aborted[j] = self.on_batch_read(int(pids[j]), int(lasts[j]), True)
        if len(idx):  # non-transactional batches only move the aborted transactions reached
            self._consume_up_to(int(h["base_offset"][-1]) + int(h["last_offset_delta"][-1]))
        return aborted, discard

    def snapshot(self) -> tuple:
        return (self._next, dict(self._ongoing_aborted), set(self._ongoing_committed), len(self.cleaned_entries))

    def restore(self, snap: tuple) -> None:
        self._next, aborted, committed, entries = snap
        self._ongoing_aborted, self._ongoing_committed = dict(aborted), set(committed)
        del self.cleaned_entries[entries:]

    def take_cleaned_entries(self) -> list[AbortedTxn]:
        """The entries of the output just finished; the next output starts with none."""
        entries, self.cleaned_entries = self.cleaned_entries, []
        return entries
