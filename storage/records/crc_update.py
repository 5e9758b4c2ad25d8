"""updated_crcs: the CRC-32C of v2 batches after edits to their headers, without reading their records.

A v2 batch's CRC covers everything from `attributes` (byte 21) to its end. CRC-32C is linear over GF(2): for
two messages of one length, crc(a) ^ crc(b) = crc0(a ^ b), where crc0 runs the CRC register from zero with no
final xor. A header edit changes only bytes 21 to 61 (attributes .. recordsCount), so the new CRC is the old
one xor crc0 of the 40-byte difference followed by as many zero bytes as the batch has after its header.
The crc32c package runs that (its `value` argument continues a register), over a shared buffer of zeros: no
record byte is read, and the import stays light (no numba), as the driver's commit process needs.

Invariant: the update never launders damage. A batch whose records no longer match its stored CRC still
does not after the update, so readers report it as before.
"""

from __future__ import annotations

import crc32c as _crc32c
import numpy as np

from .record_batch import ATTRIBUTES_OFFSET, RECORD_BATCH_OVERHEAD

HEADER_CRC_SPAN = RECORD_BATCH_OVERHEAD - ATTRIBUTES_OFFSET  # 40 bytes: attributes .. recordsCount
_ONES = 0xFFFFFFFF
_ZEROS = bytes(1 << 20)  # carried through in pieces of at most this much


def _crc0(data, register: int) -> int:
    """The CRC register after `data`, from `register`, with no initial or final xor (crc32c applies both)."""
    return _crc32c.crc32c(data, register ^ _ONES) ^ _ONES


def updated_crcs(crcs: np.ndarray, old: np.ndarray, new: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The CRCs of batches whose 40 CRC'd header bytes `old` (n x 40 uint8) became `new`: `crcs` are their
    stored CRCs and `sizes` their whole sizes (batchLength + 12). Returns uint32 CRCs."""
    tails = np.asarray(sizes, np.int64) - RECORD_BATCH_OVERHEAD
    if len(tails) and int(tails.min()) < 0:
        raise ValueError("a batch is shorter than its header")
    diff = np.bitwise_xor(
        np.asarray(old, np.uint8).reshape(len(tails), HEADER_CRC_SPAN),
        np.asarray(new, np.uint8).reshape(len(tails), HEADER_CRC_SPAN),
    )
    out = np.empty(len(tails), np.uint32)
    zeros = memoryview(_ZEROS)
    for i, (crc, tail) in enumerate(zip(np.asarray(crcs).tolist(), tails.tolist(), strict=True)):  # per batch
        r = _crc0(diff[i].tobytes(), 0)
        while tail > 0:
            step = min(tail, len(_ZEROS))
            r = _crc0(zeros[:step], r)
            tail -= step
        out[i] = crc ^ r
    return out
