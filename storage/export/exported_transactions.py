"""An exported partition's transactions: none may be open, and its aborted ones go into `.txnindex` files.

A broker could never end a transaction its own coordinator did not begin, so a partition whose last stable
offset is below its log end is refused. Each aborted transaction whose ABORT marker is exported is an entry
(version 0) of the `.txnindex` of the written segment holding that marker, where Kafka's UnifiedLog.append
puts it, checked against a scan of the batches written.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ExportError
from ..records.record_batch import TRANSACTIONAL_FLAG_MASK
from ..topic_partition import TXN_INDEX_FILE_SUFFIX, TopicPartition, segment_file_name
from ..transactions.transaction_index import ABORTED_TXN_VERSION
from .durable_files import write_new


def open_transaction_error(log, tp: TopicPartition, lso: int) -> ExportError:
    """The refusal of a partition whose transaction is still open at `lso` (the engine's last stable offset)."""
    producer = ""
    for chunk in log.read(lso, lso + 1):
        h = chunk.scan.headers
        if int(h["attributes"][0]) & TRANSACTIONAL_FLAG_MASK:  # (below the log start it may be another's)
            producer = f" of producer {int(h['producer_id'][0])}"
        break
    return ExportError(
        f"{tp.topic}-{tp.partition}: the transaction{producer} from offset {lso} is still open (no COMMIT or "
        f"ABORT marker yet), and a broker must not be handed a transaction no coordinator of its own can end: "
        f"wait for its writer to commit it, or let `kafkalog maintain` abort it once it is older than its "
        f"transaction.timeout.ms, then export again"
    )


def aborted_by_segment(
    log, tp: TopicPartition, first: int, end: int, scanned, bases: list[int]
) -> dict[int, np.ndarray]:
    """The engine's aborted transactions whose ABORT marker is exported (its `.txnindex` entries, checked as it
    reads them), by the written segment holding the marker: Kafka appends an abort's entry to the index of the
    segment its marker went into (UnifiedLog.append, LogSegment.updateTxnIndex).

    Checked against `scanned`, the aborts the exported batches complete by themselves (a scan from the first
    written offset): each must be an entry, with the same first offset where the engine's starts in range and a
    lastStableOffset not above the scan's (a larger one would make a broker's read_committed fetch stop its
    search for aborted transactions too early); an entry the scan lacks must have begun before the first
    written offset."""
    engine = log.collect_aborted_txns(first, end)
    engine = engine[engine["last_offset"].astype(np.int64) < end]
    where = f"{tp.topic}-{tp.partition}"
    by_marker = {(int(r["producer_id"]), int(r["last_offset"])): r for r in engine}
    for txn in scanned:
        row = by_marker.pop((txn.producer_id, txn.last_offset), None)
        if row is None:
            raise ExportError(
                f"{where}: the ABORT marker of producer {txn.producer_id} at offset {txn.last_offset} ends a "
                f"transaction from offset {txn.first_offset}, but the partition's transaction indexes hold no "
                f"entry for it (run `kafkalog maintain` to rebuild them, or report this)"
            )
        efirst, elso = int(row["first_offset"]), int(row["last_stable_offset"])
        if (
            (efirst >= first and efirst != txn.first_offset)
            or efirst > txn.first_offset
            or elso > txn.last_stable_offset
        ):
            raise ExportError(
                f"{where}: the transaction index entry (producerId {txn.producer_id}, firstOffset {efirst}, "
                f"lastOffset {txn.last_offset}, lastStableOffset {elso}) does not match the log, which gives "
                f"firstOffset {txn.first_offset} and lastStableOffset {txn.last_stable_offset}"
            )
    for (pid, last), row in by_marker.items():
        if int(row["first_offset"]) >= first:
            raise ExportError(
                f"{where}: the transaction index names an aborted transaction of producer {pid} (offsets "
                f"{int(row['first_offset'])}..{last}) that the log does not hold as one"
            )
    at = np.searchsorted(np.asarray(bases, np.int64), engine["last_offset"].astype(np.int64), side="right") - 1
    # (a marker in a left-out recordless segment below every written one lies below the broker's log start)
    return {bases[k]: engine[at == k] for k in np.unique(at[at >= 0]).tolist()}


def write_txn_indexes(out_dir: str, aborted: dict[int, np.ndarray]) -> int:
    """Write each segment's `.txnindex` (segments with no entry get none); returns the entries written."""
    written = 0
    for base, rows in aborted.items():
        if len(rows):
            rows = rows.copy()
            rows["version"] = ABORTED_TXN_VERSION
            write_new(os.path.join(out_dir, segment_file_name(base, TXN_INDEX_FILE_SUFFIX)), rows.tobytes())
            written += len(rows)
    return written
