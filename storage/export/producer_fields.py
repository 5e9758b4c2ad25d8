"""The producer fields (producerId, producerEpoch, baseSequence) of exported batches, as a broker takes them.

A non-transactional batch with a producer id but no sequence (or epoch), as kafkalog's sink writes them,
becomes "no producer" (-1, -1, -1; CRC computed again): Kafka's cleaner refuses to rewrite it otherwise.
Transactional batches and markers are never changed (a marker names its data's producer), so they must
carry all three (a marker needs no sequence).
"""

from __future__ import annotations

import struct

import numpy as np

from ..errors import ExportError
from ..file_records import BatchChunk
from ..records.record_batch import (
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    PRODUCER_ID_OFFSET,
    TRANSACTIONAL_FLAG_MASK,
    BatchScan,
    compute_crc,
)


def clear_invalid_producer_fields(buf: bytearray, scan) -> np.ndarray:
    """Non-transactional batches with a producerId but no sequence (or epoch), as kafkalog's sink writes them
    (its writer id, baseSequence -1), are not valid idempotent batches for Kafka: a broker's cleaner that
    rewrites one fails ("Invalid negative sequence number used") and marks the partition uncleanable. Their
    producer fields go back to "no producer" (-1), as a non-idempotent producer writes them, and the CRC is
    computed again (after the stored one was checked). Transactional and control batches are never changed
    (their marker must name the producer of their data). Returns the indexes of the batches changed."""
    h = scan.headers
    bad = np.flatnonzero(
        (h["producer_id"].astype(np.int64) >= 0)
        & ((h["base_sequence"].astype(np.int64) < 0) | (h["producer_epoch"].astype(np.int64) < 0))
        & ((h["attributes"].astype(np.int64) & (CONTROL_FLAG_MASK | TRANSACTIONAL_FLAG_MASK)) == 0)
    )
    for i in bad.tolist():
        p = int(scan.positions[i])
        struct.pack_into(">qhi", buf, p + PRODUCER_ID_OFFSET, NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE)
        struct.pack_into(">I", buf, p + CRC_OFFSET, compute_crc(memoryview(buf)[p : p + int(scan.sizes[i])]))
    return bad


def check_transactional_batches(chunk, attrs: np.ndarray) -> None:
    """A transactional batch must carry a producer id and epoch, and a data batch a sequence, as Kafka's
    producer writes them: Kafka's cleaner refuses to rewrite one without (MemoryRecordsBuilder), and it cannot
    be cleared as a non-transactional one is (its marker names its producer)."""
    h = chunk.scan.headers
    txn = (attrs & TRANSACTIONAL_FLAG_MASK) != 0
    bad = np.flatnonzero(
        txn
        & (
            (h["producer_id"].astype(np.int64) < 0)
            | (h["producer_epoch"].astype(np.int64) < 0)
            | (((attrs & CONTROL_FLAG_MASK) == 0) & (h["base_sequence"].astype(np.int64) < 0))
        )
    )
    if bad.size:
        i = int(bad[0])
        raise ExportError(
            f"{chunk.source} holds a transactional batch at offset {int(h['base_offset'][i])} (position "
            f"{chunk.base_position + int(chunk.scan.positions[i])}) with producerId {int(h['producer_id'][i])}, "
            f"epoch {int(h['producer_epoch'][i])}, baseSequence {int(h['base_sequence'][i])}: a transaction's "
            f"batches need all three (a Kafka broker's cleaner refuses to rewrite it otherwise)"
        )


def as_exported(chunk, buf: bytearray, cleared: np.ndarray) -> BatchChunk | None:
    """The chunk as written (the rewritten bytes, cleared producer fields in its headers), for the producer
    table; None when no batch in it has a producer. Empty control batches (a transaction compaction removed)
    change no producer state in Kafka (ProducerAppendInfo.append skips them), so they are hidden from it
    too."""
    scan = chunk.scan
    if not (scan.headers["producer_id"] >= 0).any():
        return None
    headers = scan.headers.copy()
    empty_control = ((headers["attributes"].astype(np.int64) & CONTROL_FLAG_MASK) != 0) & (
        headers["record_count"].astype(np.int64) == 0
    )
    hide = np.flatnonzero(empty_control)
    for col, value in (("producer_id", NO_PRODUCER_ID), ("producer_epoch", NO_PRODUCER_EPOCH)):
        headers[col][cleared] = value
        headers[col][hide] = value
    headers["base_sequence"][cleared] = NO_SEQUENCE
    return BatchChunk(
        memoryview(buf), BatchScan(scan.positions, headers, scan.end, scan.reason), chunk.base_position, chunk.source
    )
