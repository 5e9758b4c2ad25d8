"""Batch-level bytes for the cleaner: record areas (decompressed), rewritten batch headers, empty batches."""

from __future__ import annotations

from collections.abc import Callable

import crc32c as _crc32c
import numpy as np

from ..errors import CorruptRecordError
from ..file_records import BatchChunk, select_batches
from ..records import record_batch as rb
from ..records._record_kernels import MIN_RECORD_BYTES
from ..records.compression import compress_many, decompress_many
from ..records.decoder import DECODE_BUDGET_BYTES, ERROR_MESSAGES
from ..records.record_batch import CompressionType, as_uint8
from ..transactions.control_records import parse_control_type_id
from . import _cleaner_kernels as K

_KEEP_ON_EMPTY = rb.TIMESTAMP_TYPE_MASK | rb.TRANSACTIONAL_FLAG_MASK | rb.CONTROL_FLAG_MASK
_HEADER_TAIL = slice(rb.ATTRIBUTES_OFFSET, rb.RECORD_BATCH_OVERHEAD)


def bounded_chunks(chunks, max_batch_size: int, budget: int = DECODE_BUDGET_BYTES):
    """The chunks, each cut into runs of batches whose record areas, decompressed, hold at most `budget`
    bytes (a compressed batch counted at max.message.bytes, its bound), plus one batch: what the
    cleaner's passes decompress at once stays bounded whatever the batches expand to."""
    for chunk in chunks:
        scan = chunk.scan
        codecs = scan.headers["attributes"].astype(np.int64) & rb.COMPRESSION_CODEC_MASK
        cost = np.where(codecs == 0, scan.sizes, max_batch_size)
        if int(cost.sum()) <= budget:
            yield chunk
            continue
        first, total = 0, 0
        for i, c in enumerate(cost.tolist()):  # per batch, only for chunks over the budget
            if total and total + c > budget:
                yield select_batches(chunk, first, i)
                first, total = i, 0
            total += c
        yield select_batches(chunk, first, len(scan))


def record_areas(chunk, idx: np.ndarray, max_bytes: int):
    """(src, starts, ends): the record area of batches idx of a chunk, decompressed where needed."""
    scan = chunk.scan
    arr = as_uint8(chunk.buf)
    pos = scan.positions[idx]
    start = pos + rb.RECORD_BATCH_OVERHEAD
    end = pos + scan.sizes[idx]
    counts = scan.headers["record_count"][idx].astype(np.int64)
    codecs = scan.headers["attributes"][idx].astype(np.int64) & rb.COMPRESSION_CODEC_MASK
    _refuse_first(chunk, pos, codecs > CompressionType.ZSTD, lambda j: f"unknown compression codec {int(codecs[j])}")
    if codecs.any():
        view = arr.data
        comp = np.flatnonzero(codecs).tolist()
        work = [
            (CompressionType(int(codecs[j])), view[int(start[j]) : int(end[j])], chunk.base_position + int(pos[j]))
            for j in comp
        ]
        pieces = [arr[int(start[j]) : int(end[j])] for j in range(len(idx))]
        for j, data in zip(comp, decompress_many(work, max_bytes=max_bytes, source=chunk.source), strict=False):
            pieces[j] = np.frombuffer(data, np.uint8)
        lengths = np.array([p.size for p in pieces], np.int64)
        end = np.cumsum(lengths)
        start = end - lengths
        arr = np.concatenate(pieces) if pieces else np.empty(0, np.uint8)
    _refuse_first(  # before any kernel sizes scratch by counts
        chunk,
        pos,
        counts * MIN_RECORD_BYTES > end - start,
        lambda j: f"recordCount {int(counts[j])} cannot fit in {int(end[j] - start[j])} bytes of records",
    )
    return arr, start.astype(np.int64), end.astype(np.int64)


def _refuse_first(chunk: BatchChunk, pos: np.ndarray, bad: np.ndarray, why: Callable[[int], str]) -> None:
    """CorruptRecordError at the first batch where `bad` holds, naming its file and position."""
    hits = np.flatnonzero(bad)
    if hits.size:
        j = int(hits[0])
        raise CorruptRecordError(why(j), source=chunk.source, position=chunk.base_position + int(pos[j]))


def framing_error(chunk, b: int, err: int) -> CorruptRecordError:
    h = chunk.scan.header(b, chunk.base_position)
    return CorruptRecordError(
        f"{ERROR_MESSAGES.get(int(err), f'record error {err}')} in batch at offset {h.base_offset}",
        source=chunk.source,
        position=h.position,
    )


def empty_batch(header: np.ndarray) -> bytes:
    """A batch with no records keeping a batch's offsets and producer fields (Kafka's writeEmptyHeader)."""
    head = header.copy()
    head["attributes"] = head["attributes"] & _KEEP_ON_EMPTY
    head["batch_length"] = rb.RECORD_BATCH_OVERHEAD - rb.LOG_OVERHEAD
    head["base_timestamp"] = head["max_timestamp"]
    head["record_count"] = 0
    raw = bytearray(head.tobytes())
    head["crc"] = _crc32c.crc32c(bytes(raw[_HEADER_TAIL]))
    return head.tobytes()


def rewritten_batches(heads, which, sts, o0, o1, kept, mts, nbase, out):
    """New headers (bytes) and record areas (compressed as before) of rewritten batches, by batch index."""
    heads = heads.copy()
    attrs = heads["attributes"].astype(np.int64)
    codecs = attrs & rb.COMPRESSION_CODEC_MASK
    raw = [memoryview(out[int(a) : int(b)]) for a, b in zip(o0, o1, strict=False)]
    areas = list(raw)
    for codec in np.unique(codecs[codecs != 0]).tolist():
        sel = np.flatnonzero(codecs == codec).tolist()
        for j, data in zip(sel, compress_many(CompressionType(codec), [raw[j] for j in sel]), strict=False):
            areas[j] = data
    sizes = np.array([memoryview(a).nbytes for a in areas], np.int64)
    stamped = sts == K.REWRITE_STAMPED
    heads["attributes"] = np.where(stamped, attrs | rb.DELETE_HORIZON_FLAG_MASK, attrs)
    heads["base_timestamp"] = nbase
    log_append = (attrs & rb.TIMESTAMP_TYPE_MASK) != 0
    heads["max_timestamp"] = np.where(log_append, heads["max_timestamp"].astype(np.int64), mts)
    heads["record_count"] = kept
    heads["batch_length"] = rb.RECORD_BATCH_OVERHEAD - rb.LOG_OVERHEAD + sizes
    rows = heads.view(np.uint8).reshape(len(heads), rb.RECORD_BATCH_OVERHEAD)
    heads["crc"] = [
        _crc32c.crc32c(areas[j], _crc32c.crc32c(rows[j, _HEADER_TAIL].tobytes())) for j in range(len(heads))
    ]  # one C call per batch
    return (
        {int(b): heads[j : j + 1].tobytes() for j, b in enumerate(which.tolist())},
        {int(b): areas[j] for j, b in enumerate(which.tolist())},
    )


def control_types(chunk, idx: np.ndarray, max_bytes: int) -> dict[int, int | None]:
    """The type id in the key of each control batch's record (batches idx of a chunk), None for a batch
    with no record; a key Kafka could not parse (under 4 bytes, negative version) is CorruptRecordError."""
    if not idx.size:
        return {}
    scan = chunk.scan
    src, a0, a1 = record_areas(chunk, idx, max_bytes)
    err, _, eb, ks, kl = K.first_keys(
        src,
        a0,
        a1,
        scan.headers["record_count"][idx].astype(np.int64),
        scan.headers["last_offset_delta"][idx].astype(np.int64),
    )
    if err:
        raise framing_error(chunk, int(idx[eb]), err)
    out: dict[int, int | None] = {}
    for j, b in enumerate(idx.tolist()):  # per control batch (one per transaction and partition)
        if kl[j] == -2:
            out[b] = None
            continue
        key = None if kl[j] < 0 else bytes(src[int(ks[j]) : int(ks[j] + kl[j])])
        out[b] = parse_control_type_id(key, source=chunk.source, position=chunk.base_position + int(scan.positions[b]))
    return out
