"""updated_crcs: the CRC-32C of v2 batches after edits to their headers, without reading their records.

A v2 batch's CRC covers everything from `attributes` (byte 21) to its end. CRC-32C is linear over GF(2): for
two messages of one length, crc(a) ^ crc(b) = crc0(a ^ b), where crc0 has a zero initial value and no final
xor. An edit inside the header's CRC'd part (bytes 21 to 61: attributes .. recordsCount) differs from the
old batch only there, so the new CRC is the old one xor crc0 of the 40-byte difference carried through the
batch's remaining bytes, all zeros in the difference. Carrying a CRC register through n zero bytes multiplies
it by x^(8n) modulo the polynomial: O(log n) steps instead of a pass over n bytes.

Invariant: the update never launders damage. A batch whose records no longer match its stored CRC still
does not after the update, so readers report it as before.

Written by hand (numba): no maintained Python CRC-32C package exposes the shift or combine operation.
"""

from __future__ import annotations

import numpy as np

from ..common.jit import njit
from .record_batch import ATTRIBUTES_OFFSET, RECORD_BATCH_OVERHEAD

HEADER_CRC_SPAN = RECORD_BATCH_OVERHEAD - ATTRIBUTES_OFFSET  # 40 bytes: attributes .. recordsCount
_POLY = np.uint32(0x82F63B78)  # CRC-32C (Castagnoli), bit-reflected: bit 31 holds x^0


@njit(nogil=True)
def _mulmod(a, b):  # pragma: no cover - jitted
    """a * b modulo the polynomial, both bit-reflected."""
    p = np.uint32(0)
    for i in range(32):
        if (a >> np.uint32(31 - i)) & np.uint32(1):
            p ^= b
        b = (b >> np.uint32(1)) ^ (_POLY if b & np.uint32(1) else np.uint32(0))  # b * x
    return p


@njit(nogil=True)
def _powers():  # pragma: no cover - jitted
    """x^(2^k) modulo the polynomial for k = 0 .. 66 (a byte count up to 2^63, times 8)."""
    t = np.empty(67, np.uint32)
    t[0] = np.uint32(1 << 30)  # x^1
    for k in range(1, 67):
        t[k] = _mulmod(t[k - 1], t[k - 1])
    return t


@njit(nogil=True)
def _crc0(data, start, length):  # pragma: no cover - jitted
    """crc0 (zero initial value, no final xor) of data[start:start + length], bit by bit (40 bytes here)."""
    r = np.uint32(0)
    for j in range(length):
        r ^= np.uint32(data[start + j])
        for _ in range(8):
            r = (r >> np.uint32(1)) ^ (_POLY if r & np.uint32(1) else np.uint32(0))
    return r


@njit(nogil=True)
def _update(crcs, old, new, tails, powers):  # pragma: no cover - jitted
    out = np.empty(crcs.shape[0], np.uint32)
    diff = np.empty(old.shape[1], np.uint8)
    for i in range(crcs.shape[0]):
        for j in range(old.shape[1]):
            diff[j] = old[i, j] ^ new[i, j]
        r = _crc0(diff, 0, old.shape[1])
        n = tails[i]  # zero bytes to carry the difference's register through: multiply by x^(8n)
        k = 3
        while n:
            if n & 1:
                r = _mulmod(powers[k], r)
            n >>= 1
            k += 1
        out[i] = np.uint32(crcs[i]) ^ r
    return out


_POWERS: np.ndarray | None = None


def updated_crcs(crcs: np.ndarray, old: np.ndarray, new: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The CRCs of batches whose 40 CRC'd header bytes `old` (n x 40 uint8) became `new`: `crcs` are their
    stored CRCs and `sizes` their whole sizes (batchLength + 12). Returns uint32 CRCs."""
    global _POWERS
    if _POWERS is None:
        _POWERS = _powers()
    tails = np.asarray(sizes, np.int64) - RECORD_BATCH_OVERHEAD
    if len(tails) and int(tails.min()) < 0:
        raise ValueError("a batch is shorter than its header")
    old = np.ascontiguousarray(old, np.uint8).reshape(len(tails), HEADER_CRC_SPAN)
    new = np.ascontiguousarray(new, np.uint8).reshape(len(tails), HEADER_CRC_SPAN)
    return _update(np.asarray(crcs, np.uint32), old, new, tails, _POWERS)
