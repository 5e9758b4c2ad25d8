"""stamp_commit / stamp_segment: put a sink commit's identity into its batches' headers, where the batches carry
the writer state (object stores: objects/object_producer_state.py reads it back from each segment object's
first batch).

The stamp sets producerId = writer id, producerEpoch 0, baseSequence = batch id and, for a transaction, the
transactional attribute. These fields are inside the CRC, which is updated for the edit alone
(records/crc_update.py): the records are neither read nor checked here, and a batch damaged since it was staged
keeps a CRC that does not match it, so whoever reads its records (the append that follows a copy, a reader
of an adopted segment) reports it.
"""

from __future__ import annotations

import numpy as np

from ..errors import CorruptRecordError
from ..file_records import read_batch_headers
from ..records.crc_update import updated_crcs
from ..records.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_OFFSET,
    SCAN_OK,
    TRANSACTIONAL_FLAG_MASK,
    BatchScan,
    as_uint8,
    scan_batches,
    validate_batches,
)
from .writer_state import check_batch_id

_STAMPED = slice(CRC_OFFSET, RECORDS_COUNT_OFFSET)  # crc .. baseSequence: the header bytes a stamp rewrites


def _stamped_headers(
    scan: BatchScan, writer_id: int, batch_id: int, transactional: bool, source: str, position: int = 0
) -> np.ndarray:
    """The headers of `scan` stamped, CRCs updated; the old headers are checked first (framing, counts)."""
    check_batch_id(writer_id, batch_id, source)
    validate_batches(b"", scan, source=source, base_position=position, check_crc=False, check_offsets=False)
    heads = scan.headers
    if (heads["attributes"] & CONTROL_FLAG_MASK).any():
        raise CorruptRecordError("staged bytes hold a control batch", source=source)
    new = heads.copy()
    if transactional:
        new["attributes"] = heads["attributes"] | TRANSACTIONAL_FLAG_MASK
    new["producer_id"] = writer_id
    new["producer_epoch"] = 0
    new["base_sequence"] = batch_id
    old_bytes = heads.view(np.uint8).reshape(len(heads), RECORD_BATCH_OVERHEAD)[:, ATTRIBUTES_OFFSET:]
    new_bytes = new.view(np.uint8).reshape(len(new), RECORD_BATCH_OVERHEAD)[:, ATTRIBUTES_OFFSET:]
    new["crc"] = updated_crcs(heads["crc"], old_bytes, new_bytes, scan.sizes)
    return new


def stamp_commit(
    buf, writer_id: int, batch_id: int, *, max_batch_size: int, source: str, transactional: bool = False
) -> BatchScan:
    """Stamp every batch of `buf` (whole batches, in memory) in place. Returns the scan, stamped headers."""
    scan = scan_batches(buf, max_batch_size=max_batch_size)
    if scan.end != len(buf):
        raise CorruptRecordError("staged bytes end in a partial or oversized batch", source=source, position=scan.end)
    new = _stamped_headers(scan, writer_id, batch_id, transactional, source)
    arr = as_uint8(buf)
    cols = np.arange(_STAMPED.start, _STAMPED.stop, dtype=np.int64)
    rows = new.view(np.uint8).reshape(len(new), RECORD_BATCH_OVERHEAD)[:, _STAMPED]
    arr[(scan.positions[:, None] + cols[None, :]).ravel()] = rows.ravel()
    return BatchScan(scan.positions, new, scan.end, SCAN_OK)


def stamp_segment(
    fs,
    path: str,
    positions: np.ndarray,
    size: int,
    writer_id: int,
    batch_id: int,
    *,
    max_batch_size: int,
    transactional: bool = False,
) -> np.ndarray:
    """Stamp the batches of a staged segment file in place: its headers (at `positions`, the batches the
    stager wrote, which must tile the file's `size` bytes) are read, and 40 bytes per batch written back
    durably. Returns the stamped headers."""
    source = fs.url(path)
    heads = read_batch_headers(fs, path, positions)
    scan = BatchScan(np.asarray(positions, np.int64), heads, int(size), SCAN_OK)
    sizes = scan.sizes
    ends = np.append(scan.positions[1:], size)
    bad = np.flatnonzero((sizes != ends - scan.positions) | (sizes > max_batch_size))
    if bad.size:
        i = int(bad[0])
        raise CorruptRecordError(
            f"staged batch of {int(sizes[i])} bytes at position {int(scan.positions[i])} does not end where the "
            f"next begins ({int(ends[i])}) or exceeds {max_batch_size} bytes",
            source=source,
            position=int(scan.positions[i]),
        )
    new = _stamped_headers(scan, writer_id, batch_id, transactional, source)
    rows = np.ascontiguousarray(new.view(np.uint8).reshape(len(new), RECORD_BATCH_OVERHEAD)[:, _STAMPED])
    fs.write_at(path, scan.positions + CRC_OFFSET, rows.tobytes(), durable=True)
    return new
