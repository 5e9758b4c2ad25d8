"""One partition exported as the directory a Kafka broker loads as its own, with nothing to recover.

It holds the segments at or above the log start offset (and the last one) but those holding no record
(exported_segment.py), their `.txnindex` files (exported_transactions.py), `<log end>.snapshot` (the
producer snapshot a clean shutdown leaves, built from the batches written), `leader-epoch-checkpoint`
(epoch 0 from the first batch) and `partition.metadata`; nothing of kafkalog's own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ExportError
from ..log_manager import LogManager
from ..metadata.checkpoint import CLEANER_OFFSET_CHECKPOINT_FILE
from ..topic_partition import TopicPartition
from ..transactions.producer_snapshot import encode_snapshot, snapshot_file_name
from ..transactions.producer_table import ProducerTable
from .durable_files import fsync_dir, write_new
from .exported_segment import remove_segment, write_segment
from .exported_transactions import aborted_by_segment, open_transaction_error, write_txn_indexes
from .partition_metadata_file import PARTITION_METADATA_FILE, partition_metadata_bytes

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"


@dataclass
class PartitionExport:
    """What was exported of one partition."""

    tp: TopicPartition
    log_start: int = 0
    log_end: int = 0
    first_base: int = 0  # base offset of the first segment written
    segments: int = 0
    skipped_segments: int = 0  # wholly below the log start offset
    recordless_segments: int = 0  # holding only batches compaction emptied
    batches: int = 0
    records: int = 0  # data records
    markers: int = 0  # transaction markers (control records: one offset each, never handed to a consumer)
    bytes: int = 0
    epochs_reset: int = 0  # batches whose partitionLeaderEpoch was not 0 (set to 0)
    producers_cleared: int = 0  # batches whose producer fields Kafka would refuse (cleared)
    txn_batches: int = 0  # transactional data batches and transaction markers carried
    aborted_txns: int = 0  # entries written to `.txnindex` files
    producers: int = 0  # entries of the producer snapshot at the log end
    first_offset: int | None = None  # of the first batch written (the leader epoch's start)
    cleaned_to: int | None = None  # kafkalog's cleaner-offset-checkpoint entry, when it lies in the exported range
    staged: str | None = None  # the temporary directory holding it

    @property
    def needs_log_start_entry(self) -> bool:
        return self.log_start > self.first_base

    @property
    def broker_log_start(self) -> int:
        """The log start offset the broker will have: kafkalog's, or the first segment written if that is above."""
        return max(self.log_start, self.first_base)


def export_partition(lm: LogManager, tp: TopicPartition, topic_id: str, out_dir: str) -> PartitionExport:
    """Write one partition's Kafka directory into out_dir (made here). Segments wholly below the log start
    offset are left out, and so are segments holding no record (only batches compaction emptied), but for
    the last: a broker takes such a segment's largest timestamp from its file's mtime, so ListOffsets by
    time would stop in it and answer "none". A partition with a transaction still open is refused."""
    part = PartitionExport(tp)
    with lm.open_log(tp) as log:
        part.log_start = log.log_start_offset
        part.log_end = log.log_end_offset  # raises when the log's tail is damaged
        lso = log.last_stable_offset
        if lso < part.log_end:
            raise open_transaction_error(log, tp, lso)
        os.mkdir(out_dir)
        segs = log.segments
        kept = [
            (s, segs[i + 1].base_offset if i + 1 < len(segs) else None)
            for i, s in enumerate(segs)
            if i + 1 == len(segs) or segs[i + 1].base_offset > part.log_start
        ]
        part.skipped_segments = len(segs) - len(kept)
        producers = ProducerTable(f"{tp.topic}-{tp.partition}", kept[0][0].base_offset)
        first = None
        written: list[int] = []
        for seg, upper in kept:
            w = write_segment(log, seg, upper, part.log_end, out_dir, producers)
            if not (w.records or w.markers) and upper is not None:
                remove_segment(out_dir, seg.base_offset)
                part.recordless_segments += 1
                continue
            written.append(seg.base_offset)
            if first is None:
                first = seg.base_offset
                part.first_offset = w.first_offset
            part.segments += 1
            part.batches += w.batches
            part.records += w.records
            part.markers += w.markers
            part.bytes += w.bytes
            part.epochs_reset += w.epochs_reset
            part.producers_cleared += w.producers_cleared
            part.txn_batches += w.txn_batches
        assert first is not None  # the last segment is always written
        part.first_base = first
        if producers.txns.ongoing:  # the engine's last stable offset said none: they disagree
            pid, at = next(iter(producers.txns.ongoing.items()))
            raise ExportError(
                f"{tp.topic}-{tp.partition}: producer {pid}'s transaction from offset {at} has no marker in the "
                f"log, yet the partition's transaction state ({lm.url()}) holds none open"
            )
        aborted = aborted_by_segment(log, tp, kept[0][0].base_offset, part.log_end, producers.aborted, written)
        part.aborted_txns = write_txn_indexes(out_dir, aborted)
        # the producer snapshot a clean shutdown leaves at the log end: a broker loads producers and open
        # transactions from it without reading the log (with none after a clean shutdown it would start
        # from an empty producer table, and without a clean shutdown re-read the whole log)
        table = producers.to_array()
        part.producers = len(table)
        write_new(os.path.join(out_dir, snapshot_file_name(part.log_end)), encode_snapshot(table))
    cleaned = lm.read_checkpoint(lm.checkpoint_file(CLEANER_OFFSET_CHECKPOINT_FILE, lm.log_dir_of(tp))).get(tp)
    if cleaned is not None and part.broker_log_start <= cleaned <= part.log_end:
        part.cleaned_to = cleaned
    epochs = f"0\n1\n0 {part.first_offset}\n" if part.first_offset is not None else "0\n0\n"
    write_new(os.path.join(out_dir, LEADER_EPOCH_CHECKPOINT_FILE), epochs.encode())
    write_new(os.path.join(out_dir, PARTITION_METADATA_FILE), partition_metadata_bytes(topic_id))
    fsync_dir(out_dir)
    return part
