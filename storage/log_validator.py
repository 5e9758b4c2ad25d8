"""LogValidator: what an append checks and rewrites before its batches reach a segment (Kafka's
LogValidator): framing and CRCs, the topic's compression.type, CreateTime bounds, offsets, and
LogAppendTime stamps. Whole-batch work through numpy and the codecs; no per-record Python."""

from __future__ import annotations

import numpy as np

from .errors import CorruptRecordError, InvalidTimestampError, RecordTooLargeError
from .log_config import LogConfig
from .log_segment import BatchChunk, select_batches
from .records import record_batch as rb
from .records.record_batch import BatchScan, CompressionType, MutableBytes, as_uint8, scan_batches, validate_batches


def validate_input(buf: MutableBytes, max_batch_size: int, where: str) -> BatchScan:
    """Whole, well-framed batches with valid CRCs, each within max.message.bytes."""
    scan = scan_batches(buf, max_batch_size=max_batch_size)
    if scan.reason == rb.SCAN_BAD_LENGTH:
        size = int.from_bytes(buf[scan.end + 8 : scan.end + 12], "big", signed=True) + rb.LOG_OVERHEAD
        if size > max_batch_size:
            raise RecordTooLargeError(
                f"{where}: batch of {size} bytes at position {scan.end} exceeds max.message.bytes ({max_batch_size})"
            )
        raise CorruptRecordError(f"{where}: invalid batch length", source=where, position=scan.end)
    if scan.end != len(buf):
        raise CorruptRecordError(f"{where}: trailing partial batch", source=where, position=scan.end)
    validate_batches(buf, scan, source=where, check_offsets=False)
    return scan


def check_built(scan: BatchScan, size: int, max_batch_size: int, where: str) -> BatchScan:
    """The scan an encoder handed over with its own bytes: it must cover them whole, each batch within
    max.message.bytes (the bytes themselves are trusted: this process just wrote them)."""
    if scan.end != size or scan.reason != rb.SCAN_OK:
        raise CorruptRecordError(
            f"{where}: the encoder's scan covers {scan.end} of {size} bytes", source=where, position=scan.end
        )
    if len(scan):
        sizes = scan.sizes
        i = int(np.argmax(sizes))
        if sizes[i] > max_batch_size:
            raise RecordTooLargeError(
                f"{where}: batch of {int(sizes[i])} bytes at position {int(scan.positions[i])} "
                f"exceeds max.message.bytes ({max_batch_size})"
            )
    return scan


def maybe_recompress(
    buf: MutableBytes, scan: BatchScan, config: LogConfig, where: str
) -> tuple[MutableBytes, BatchScan]:
    """Re-encode batches whose codec differs from the topic's compression.type (unless 'producer')."""
    target = config.compression_type
    if target == "producer":
        return buf, scan
    codec = CompressionType.for_name(target)
    attributes = scan.headers["attributes"]
    codecs = attributes & rb.COMPRESSION_CODEC_MASK
    # Kafka's LogValidator: "Do not compress control records unless they are written compressed"
    uncompressed_control = ((attributes & rb.CONTROL_FLAG_MASK) != 0) & (codecs == int(CompressionType.NONE))
    if np.all((codecs == int(codec)) | uncompressed_control):
        return buf, scan
    from .records.builder import build_batch
    from .records.decoder import decode_batches

    max_batch_size = config.max_message_bytes
    out = bytearray()
    whole = BatchChunk(as_uint8(buf).data, scan, 0, "append")
    for i in range(len(scan)):  # per batch: producer fields are kept batch by batch
        one = select_batches(whole, i, i + 1)
        h = scan.header(i)
        records = decode_batches(one.buf, scan=one.scan, max_message_bytes=max_batch_size, skip_control=False)
        out += build_batch(
            records,
            compression=codec,
            base_offset=h.base_offset,
            timestamp_type=h.timestamp_type,
            producer_id=h.producer_id,
            producer_epoch=h.producer_epoch,
            base_sequence=h.base_sequence,
            partition_leader_epoch=h.partition_leader_epoch,
            is_transactional=h.is_transactional,
            delete_horizon_ms=h.delete_horizon_ms,
            now_ms=h.max_timestamp,
        )
    return out, validate_input(out, max_batch_size, where)


def check_timestamps(buf: MutableBytes, scan: BatchScan, config: LogConfig, now: int, where: str) -> None:
    """Kafka's bounds on CreateTime timestamps, checked only when the topic sets them."""
    bounds = config.create_time_bounds(now)
    if bounds is None:
        return
    from .records.decoder import decode_batches

    records = decode_batches(bytes(buf), scan=scan, max_message_bytes=config.max_message_bytes, skip_control=True)
    ts = records.column("timestamp").to_numpy()
    bad = np.flatnonzero((ts < bounds[0]) | (ts > bounds[1]))
    if bad.size:
        i = int(bad[0])
        raise InvalidTimestampError(
            f"{where}: timestamp {int(ts[i])} of record {i} of the append is out of range; it must be within "
            f"[{bounds[0]}, {bounds[1]}] (message.timestamp.before.max.ms / message.timestamp.after.max.ms)"
        )


def assign_offsets(buf: MutableBytes, scan: BatchScan, next_offset: int) -> np.ndarray:
    """Patch baseOffset (outside the CRC) and partitionLeaderEpoch of every batch, vectorized."""
    counts = scan.headers["last_offset_delta"].astype(np.int64) + 1
    bases = next_offset + np.concatenate(([0], np.cumsum(counts)[:-1]))
    arr = np.frombuffer(buf, np.uint8)
    cols = np.arange(8, dtype=np.int64)
    arr[(scan.positions[:, None] + cols[None, :]).ravel()] = bases.astype(">i8").view(np.uint8)
    cols = np.arange(4, dtype=np.int64) + rb.PARTITION_LEADER_EPOCH_OFFSET
    arr[(scan.positions[:, None] + cols[None, :]).ravel()] = np.zeros(len(scan), ">i4").view(np.uint8)
    scan.headers["base_offset"] = bases
    scan.headers["partition_leader_epoch"] = 0
    return bases


def stamp_log_append_time(buf: MutableBytes, scan: BatchScan, now: int, max_batch_size: int) -> BatchScan:
    """message.timestamp.type=LogAppendTime: every batch carries the append time (CRCs recomputed)."""
    sizes = scan.sizes
    for i, p in enumerate(scan.positions):  # per batch
        rb.set_log_append_time(buf, int(p), int(sizes[i]), now)
    return scan_batches(buf, max_batch_size=max_batch_size)
