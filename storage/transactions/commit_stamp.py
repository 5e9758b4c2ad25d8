"""stamp_commit: put a sink commit's identity into its batches, where the batches carry the writer state
(object stores: objects/object_producer_state.py reads it back from each segment object's first batch).
"""

from __future__ import annotations

import struct

from ..errors import CorruptRecordError
from ..records.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    PRODUCER_ID_OFFSET,
    TRANSACTIONAL_FLAG_MASK,
    compute_crc,
    scan_batches,
    validate_batches,
)
from .writer_state import check_batch_id


def stamp_commit(
    buf: bytearray, writer_id: int, batch_id: int, *, max_batch_size: int, source: str, transactional: bool = False
):
    """Put a commit's identity into every batch: producerId = writer id, producerEpoch 0, baseSequence =
    batch id, the transactional attribute when `transactional`, and recompute the CRC. The batches are
    validated first, so damaged staged bytes are reported, not given a fresh CRC. Returns the scan."""
    check_batch_id(writer_id, batch_id, source)
    scan = scan_batches(buf, max_batch_size=max_batch_size)
    if scan.end != len(buf):
        raise CorruptRecordError("staged bytes end in a partial or oversized batch", source=source, position=scan.end)
    validate_batches(buf, scan, source=source, check_offsets=False)
    if (scan.headers["attributes"] & CONTROL_FLAG_MASK).any():
        raise CorruptRecordError("staged bytes hold a control batch", source=source)
    fields = struct.Struct(">qhi")
    view = memoryview(buf)
    # per batch: the CRC covers these fields
    for pos, size, attrs in zip(
        scan.positions.tolist(), scan.sizes.tolist(), scan.headers["attributes"].tolist(), strict=True
    ):
        if transactional:
            struct.pack_into(">h", buf, pos + ATTRIBUTES_OFFSET, attrs | TRANSACTIONAL_FLAG_MASK)
        fields.pack_into(buf, pos + PRODUCER_ID_OFFSET, writer_id, 0, batch_id)
        struct.pack_into(">I", buf, pos + CRC_OFFSET, compute_crc(view[pos : pos + size]))
    return scan
