"""Producer snapshots on object stores, written by the maintenance job.

A writer on an object store appends one segment object per commit and never rolls in Kafka's sense, so it
writes no `<offset>.snapshot` (Log._take_producer_snapshot): a reader's transaction state would scan every
batch header from the log start. The maintenance job, which merges small segments under its lease, writes a
Kafka-format snapshot (producer_snapshot.py, the ProducerTable as of that offset) at each merged segment's
base, as Kafka snapshots at each roll, and deletes the snapshots below the log start (Kafka's
deleteSnapshotsBefore). A loader trusts the `.txnindex` objects below a snapshot, so before one is written
every abort met since the previous snapshot must be in its ABORT marker segment's `.txnindex` object: a
missing one is created whole (create-only) from the log's transaction state; one that lacks an abort stops
the snapshot.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import KafkaLogError, KafkaStorageError
from ..transactions.producer_snapshot import delete_snapshots_before
from ..transactions.producer_table import ProducerTable
from ..transactions.transaction_index import ABORTED_TXN_DTYPE, AbortedTxn, TransactionIndex

logger = logging.getLogger(__name__)


def snapshot_merged_segments(log, bases: list[int]) -> list[str]:
    """Write `<base>.snapshot` for each base (merged segments' base offsets) of a reader's `log`; returns the
    paths written. A snapshot is only a loader's shortcut: when the table cannot be built (too many producers,
    a damaged batch) or an abort is not indexed, the error is logged and no (further) snapshot is written."""
    targets = sorted(b for b in set(bases) if log.log_start_offset <= b <= log.log_end_offset)
    if not targets:
        return []
    written = []
    try:
        table = ProducerTable.load(log, targets[0])
        for base in targets:
            path = table.take_snapshot(log, base, lambda txns: _check_indexed(log, txns))
            if path is not None:
                written.append(path)
    except KafkaLogError as e:
        logger.error("%s-%d: producer snapshots not written: %s", log.tp.topic, log.tp.partition, e)
    return written


def delete_snapshots_below_start(log) -> list[str]:
    """Delete the snapshots below the log start offset (those of segments retention removed)."""
    return [s.path for s in delete_snapshots_before(log.fs, log.dir, log.log_start_offset)]


def _check_indexed(log, txns: list[AbortedTxn]) -> None:
    """Make sure each aborted transaction is in the `.txnindex` object of its ABORT marker's segment: a missing
    object is created from the log's transaction state (create-only); KafkaStorageError when one lacks it."""
    by_segment: dict[int, set[int]] = {}
    for txn in txns:
        seg = log.segment_for(txn.last_offset)
        if seg is None:
            raise KafkaStorageError(f"no segment holds the ABORT marker at offset {txn.last_offset}")
        by_segment.setdefault(seg.base_offset, set()).add(txn.last_offset)
    for base, lasts in by_segment.items():
        index = TransactionIndex.for_segment(log.fs, log.dir, base)
        if not log.fs.exists(index.path):
            seg = log.segment_for(base)
            rows = log.segment_aborted_txns(seg)
            if len(rows):
                log.fs.create_exclusive(index.path, rows.astype(ABORTED_TXN_DTYPE).tobytes())
            index = TransactionIndex.for_segment(log.fs, log.dir, base)
        have = set(np.asarray(index.entries()["last_offset"], np.int64).tolist())
        if not lasts <= have:
            raise KafkaStorageError(
                f"transaction index {log.fs.url(index.path)} lacks the aborted transactions ending at offsets "
                f"{sorted(lasts - have)}: no producer snapshot above it"
            )
