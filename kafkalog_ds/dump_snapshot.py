"""`kafkalog dump-log` for .snapshot files: Kafka's DumpLogSegments line per producer state entry."""

from __future__ import annotations

from typing import TextIO

from storage.fs.filesystem import LogFileSystem
from storage.transactions.producer_snapshot import read_snapshot

from .dump_log import DumpOptions, DumpReport, decrement_sequence


def dump_producer_snapshot(
    fs: LogFileSystem, path: str, display: str, opts: DumpOptions, out: TextIO, report: DumpReport, abs_name: str
) -> None:
    """One line per entry, in file order: the entry's state, then its batch when it has one (lastOffset >= 0)."""
    e = read_snapshot(fs, path)
    txn = e["current_txn_first_offset"].tolist()
    first_seq = decrement_sequence(e["last_sequence"], e["offset_delta"]).tolist()
    lines = []
    for i, (pid, epoch, last_seq, last_off, delta, ts, coord) in enumerate(
        zip(
            e["producer_id"].tolist(),
            e["epoch"].tolist(),
            e["last_sequence"].tolist(),
            e["last_offset"].tolist(),
            e["offset_delta"].tolist(),
            e["timestamp"].tolist(),
            e["coordinator_epoch"].tolist(),
            strict=True,
        )
    ):
        current = f"OptionalLong[{txn[i]}]" if txn[i] >= 0 else "OptionalLong.empty"
        line = (
            f"producerId: {pid} producerEpoch: {epoch} coordinatorEpoch: {coord} "
            f"currentTxnFirstOffset: {current} lastTimestamp: {ts}"
        )
        if last_off >= 0:
            line += (
                f" firstSequence: {first_seq[i]} lastSequence: {last_seq} lastOffset: {last_off} "
                f"offsetDelta: {delta} timestamp: {ts}"
            )
        lines.append(line + "\n")
    out.write("".join(lines))
