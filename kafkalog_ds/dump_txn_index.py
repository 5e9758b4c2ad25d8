"""`kafkalog dump-log` for .txnindex files: Kafka's DumpLogSegments line for each aborted transaction.

The file is read through storage/transactions/transaction_index.py, with its checks: the entries before the first
bad one are printed, then the error names the file and the entry's byte position (Kafka's tool stops at a bad
version too, and leaves out a partial last entry without a word).
"""

from __future__ import annotations

from typing import TextIO

from storage.fs.filesystem import LogFileSystem
from storage.transactions.transaction_index import (
    ABORTED_TXN_VERSION,
    decode_aborted_txns,
    entries_to_txns,
    read_txn_index_bytes,
)

from .dump_log import DumpOptions, DumpReport


def dump_txn_index(
    fs: LogFileSystem, path: str, display: str, opts: DumpOptions, out: TextIO, report: DumpReport, abs_name: str
) -> None:
    """`version: 0 producerId: P firstOffset: F lastOffset: L lastStableOffset: S` per entry, as Kafka 4.4 prints."""
    entries, error = decode_aborted_txns(read_txn_index_bytes(fs, path), fs.url(path))
    out.write(
        "".join(
            f"version: {ABORTED_TXN_VERSION} producerId: {t.producer_id} firstOffset: {t.first_offset} "
            f"lastOffset: {t.last_offset} lastStableOffset: {t.last_stable_offset}\n"
            for t in entries_to_txns(entries)
        )
    )
    if error is not None:
        raise error
