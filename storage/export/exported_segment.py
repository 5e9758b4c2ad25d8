"""One exported segment: `<base>.log` and Kafka's `<base>.index` / `<base>.timeindex` for it.

The `.log` holds the source segment's batches below the log end, each checked before a byte is written
(framing, magic 2, offsets increasing and inside the segment, CRC-32C, every record's framing), with
`partitionLeaderEpoch` set to 0 (outside the CRC) and producer fields cleared where Kafka's cleaner would
refuse them (producer_fields.py). The indexes follow Kafka's append rule (`index.interval.bytes`), trimmed
to their entries; the time index ends at the largest timestamp of a batch holding records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptRecordError, KafkaStorageError
from ..file_records import head
from ..objects.immutable_segment import IndexBuilder
from ..records.decoder import iter_decoded
from ..records.record_batch import (
    CONTROL_FLAG_MASK,
    PARTITION_LEADER_EPOCH_OFFSET,
    TRANSACTIONAL_FLAG_MASK,
    as_uint8,
    validate_batches,
)
from ..topic_partition import INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, segment_file_name
from ..transactions.producer_table import ProducerTable
from .durable_files import write_new
from .producer_fields import as_exported, check_transactional_batches, clear_invalid_producer_fields


@dataclass
class ExportedSegment:
    """One segment as written: its batches, data records, markers, bytes and first batch's base offset."""

    batches: int = 0
    records: int = 0
    markers: int = 0
    bytes: int = 0
    epochs_reset: int = 0
    producers_cleared: int = 0
    txn_batches: int = 0
    first_offset: int | None = None


def write_segment(log, seg, upper: int | None, end: int, out_dir: str, producers: ProducerTable) -> ExportedSegment:
    """Copy one segment's checked batches (epochs set to 0) and write Kafka's indexes for them; `producers`
    is fed the batches as written."""
    w = ExportedSegment()
    builder = IndexBuilder(log.config.index_interval_bytes)
    prev_last = None
    path = os.path.join(out_dir, segment_file_name(seg.base_offset, LOG_FILE_SUFFIX))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for chunk in seg.checked_chunks_from_start(upper=upper):
            base = chunk.scan.headers["base_offset"].astype(np.int64)
            keep = int(np.searchsorted(base, end, side="left"))  # a writer's batches past the log end we read
            if keep < len(chunk.scan):
                if not keep:
                    break
                chunk = head(chunk, keep)
            scan = chunk.scan
            validate_batches(
                chunk.buf,
                scan,
                source=chunk.source,
                base_position=chunk.base_position,
                expected_first_offset=None if prev_last is None else prev_last + 1,
            )
            attrs = scan.headers["attributes"].astype(np.int64)
            check_transactional_batches(chunk, attrs)
            w.txn_batches += int(np.count_nonzero((attrs & (TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK)) != 0))
            for _ in iter_decoded(
                chunk.buf,
                scan=scan,
                source=chunk.source,
                base_position=chunk.base_position,
                max_message_bytes=log.max_batch_size,
                verify_crc=False,
                skip_control=False,
            ):
                pass  # every record's framing, as a consumer will decode it
            if chunk.base_position != w.bytes:
                raise CorruptRecordError(
                    f"batches not contiguous: expected position {w.bytes}",
                    source=chunk.source,
                    position=chunk.base_position,
                )
            buf = bytearray(memoryview(chunk.buf)[: scan.end])
            w.epochs_reset += int(np.count_nonzero(scan.headers["partition_leader_epoch"] != 0))
            at = scan.positions.astype(np.int64)[:, None] + np.arange(
                PARTITION_LEADER_EPOCH_OFFSET, PARTITION_LEADER_EPOCH_OFFSET + 4
            )
            as_uint8(buf)[at.reshape(-1)] = 0
            cleared = clear_invalid_producer_fields(buf, scan)
            w.producers_cleared += int(cleared.size)
            exported = as_exported(chunk, buf, cleared)
            if exported is not None:
                producers.feed(exported)
            view = memoryview(buf)
            while view:
                view = view[os.write(fd, view) :]
            counts = scan.headers["record_count"].astype(np.int64)
            # a batch with no records (kept by compaction) has a maxTimestamp but no record with it: it does not
            # count for the time index, or Kafka's ListOffsets would stop in this segment and find nothing
            max_ts = np.where(counts > 0, scan.headers["max_timestamp"].astype(np.int64), -1)
            builder.add(scan.positions.astype(np.int64) + w.bytes, scan.sizes, scan.last_offsets, max_ts)
            if w.first_offset is None:
                w.first_offset = int(base[0])
            prev_last = int(scan.last_offsets[-1])
            w.bytes += scan.end
            w.batches += len(scan)
            control = (scan.headers["attributes"].astype(np.int64) & CONTROL_FLAG_MASK) != 0
            w.records += int(counts[~control].sum())
            w.markers += int(counts[control].sum())
        os.fsync(fd)
    finally:
        os.close(fd)
        seg.release_readers()
    if os.path.getsize(path) != w.bytes:
        raise KafkaStorageError(f"{path}: wrote {w.bytes} bytes, the file holds {os.path.getsize(path)}")
    off_rows, time_rows = builder.finish(seg.base_offset)
    write_new(os.path.join(out_dir, segment_file_name(seg.base_offset, INDEX_FILE_SUFFIX)), off_rows.tobytes())
    write_new(os.path.join(out_dir, segment_file_name(seg.base_offset, TIME_INDEX_FILE_SUFFIX)), time_rows.tobytes())
    return w


def remove_segment(out_dir: str, base_offset: int) -> None:
    """Take a written segment out again (its `.log`, `.index` and `.timeindex`)."""
    for sfx in (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX):
        os.unlink(os.path.join(out_dir, segment_file_name(base_offset, sfx)))
