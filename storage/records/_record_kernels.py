"""Numba kernels for the sequential parts of the v2 record codec: varint framing and byte copies.

Records are `length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
keyLength varint | key | valueLength varint | value | headerCount varint | headers`, varints
being zigzag LEB128 (written by hand: no library frames Kafka records). Every read is
bounds-checked; errors come back as (code, position) so Python can raise with context.
"""

from __future__ import annotations

import numpy as np
from numba.core import cgutils, types
from numba.extending import intrinsic

from ..common.constants import INT32_MAX
from ..common.jit import njit

_U7 = np.uint64(7)
_U0x7F = np.uint64(0x7F)
_U0x80 = np.uint64(0x80)

# Error codes of `frame_records` (ERROR_MESSAGES in decoder.py turns them into words).
OK = 0
E_TRUNCATED = 1  # a record (or its length varint) runs past the record area
E_VARINT = 2  # a varint longer than 5 bytes (varlong: 10)
E_RECORD_LENGTH = 3  # a record length below the minimum record size
E_KEY_LENGTH = 4
E_VALUE_LENGTH = 5
E_HEADER_COUNT = 6
E_HEADER_KEY_LENGTH = 7
E_HEADER_VALUE_LENGTH = 8
E_RECORD_SIZE = 9  # the fields do not end where the record's length says
E_OFFSET_DELTA = 10  # offsetDelta negative, not increasing, or above lastOffsetDelta
E_TRAILING = 11  # bytes left in the record area after recordCount records

# Error codes of `plan_batches`.
P_TOO_LARGE = 1  # one record does not fit max_batch_bytes
P_NULL_HEADER_KEY = 2
P_BATCH_TOO_LARGE = 3  # no splitting allowed and the batch is larger than the limit

MIN_RECORD_BYTES = 7  # length, attributes, timestampDelta, offsetDelta, keyLength, valueLength, headerCount


@njit(nogil=True, inline="always")
def varint_size(v):
    """Bytes of the zigzag varint of int64 `v`."""
    u = np.uint64((v << 1) ^ (v >> 63))
    n = 1
    while u >= _U0x80:
        u >>= _U7
        n += 1
    return n


@njit(nogil=True, inline="always")
def write_varint(out, pos, v):
    u = np.uint64((v << 1) ^ (v >> 63))
    while u >= _U0x80:
        out[pos] = np.uint8((u & _U0x7F) | _U0x80)
        u >>= _U7
        pos += 1
    out[pos] = np.uint8(u)
    return pos + 1


@njit(nogil=True, inline="always")
def read_varint(buf, pos, end, max_bytes):
    """Zigzag varint (max_bytes 5) or varlong (10) at pos; returns (value, next) or (0, -1) if
    it runs past `end`, (0, -2) if too long. A 5-byte varint keeps its low 32 bits, as Java does."""
    if pos < end and buf[pos] < 0x80:  # fast path: most lengths and deltas fit one byte
        raw = np.int64(buf[pos])
        return (raw >> 1) ^ -(raw & 1), pos + 1
    raw = np.int64(0)
    shift = 0
    i = 0
    while True:
        if pos + i >= end:
            return np.int64(0), np.int64(-1)
        if i == max_bytes:
            return np.int64(0), np.int64(-2)
        b = np.int64(buf[pos + i])
        raw |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            break
        shift += 7
    if max_bytes == 5:
        raw &= 0xFFFFFFFF
        return (raw >> 1) ^ -(raw & 1), pos + i
    return ((raw >> 1) & 0x7FFFFFFFFFFFFFFF) ^ -(raw & 1), pos + i


@intrinsic
def _memcpy(typingctx, dst, dpos, src, spos, n):
    """llvm.memcpy of n bytes between two uint8 arrays (numba's own byte loops run ~15x slower)."""
    sig = types.void(dst, dpos, src, spos, n)

    def codegen(context, builder, signature, args):
        d, dp, s, sp, count = args
        darr = context.make_array(signature.args[0])(context, builder, d)
        sarr = context.make_array(signature.args[2])(context, builder, s)
        cgutils.raw_memcpy(builder, builder.gep(darr.data, [dp]), builder.gep(sarr.data, [sp]), count, 1)

    return sig, codegen


@njit(nogil=True, inline="always")
def copy_bytes(dst, dpos, src, spos, n):
    """dst[dpos:dpos+n] = src[spos:spos+n]; callers have bounds-checked both ranges."""
    _memcpy(dst, np.int64(dpos), src, np.int64(spos), np.int64(n))  # type: ignore[call-arg]  # @intrinsic binds typingctx


# ----------------------------------------------------------------------------------------- encode


@njit(nogil=True)
def plan_batches(
    ts, key_len, val_len, hstart, hcount, hk_len, hv_len, use_fixed_base, fixed_base, max_batch_bytes, split, overhead
):  # pragma: no cover - jitted
    """Size every record and split rows greedily into batches of at most max_batch_bytes.

    Returns (body, sizes, bounds, nbatches, err, err_row): body[i] is record i's size after its
    length varint, sizes[i] its whole size (delta fields depend on the batch's first row, so sizing
    and splitting are one pass); bounds[:nbatches+1] are row boundaries.
    """
    n = ts.shape[0]
    body = np.empty(n, np.int64)
    sizes = np.empty(n, np.int64)
    bounds = np.empty(n + 1, np.int64)
    nb = 0
    bounds[0] = 0
    start = 0
    base = fixed_base if use_fixed_base else (ts[0] if n > 0 else 0)
    batch_bytes = overhead
    for i in range(n):
        fixed = 1  # attributes
        kl = key_len[i]
        fixed += varint_size(kl) + (kl if kl > 0 else 0)
        vl = val_len[i]
        fixed += varint_size(vl) + (vl if vl > 0 else 0)
        hc = hcount[i]
        fixed += varint_size(hc)
        h0 = hstart[i]
        for h in range(h0, h0 + hc):
            ln = hk_len[h]
            if ln < 0:
                return body, sizes, bounds, nb, P_NULL_HEADER_KEY, i
            fixed += varint_size(ln) + ln
            ln = hv_len[h]
            fixed += varint_size(ln) + (ln if ln > 0 else 0)
        b = fixed + varint_size(ts[i] - base) + varint_size(i - start)
        size = varint_size(b) + b
        if batch_bytes + size > max_batch_bytes and i > start:
            if not split:
                return body, sizes, bounds, nb, P_BATCH_TOO_LARGE, i
            nb += 1
            bounds[nb] = i
            start = i
            if not use_fixed_base:
                base = ts[i]
            batch_bytes = overhead
            b = fixed + varint_size(ts[i] - base) + 1
            size = varint_size(b) + b
        if overhead + size > max_batch_bytes or b > INT32_MAX:
            return body, sizes, bounds, nb, P_TOO_LARGE, i
        batch_bytes += size
        body[i] = b
        sizes[i] = size
    if n > 0:
        nb += 1
        bounds[nb] = n
    return body, sizes, bounds, nb, 0, 0


@njit(nogil=True)
def write_records(
    out,
    rec_pos,
    bounds,
    nbatches,
    body,
    ts,
    use_fixed_base,
    fixed_base,
    key_start,
    key_len,
    key_data,
    val_start,
    val_len,
    val_data,
    hstart,
    hcount,
    hk_start,
    hk_len,
    hk_data,
    hv_start,
    hv_len,
    hv_data,
):  # pragma: no cover
    """Write the records of batch b at out[rec_pos[b]:]; the layout comes from plan_batches."""
    for bi in range(nbatches):
        r0 = bounds[bi]
        r1 = bounds[bi + 1]
        base = fixed_base if use_fixed_base else ts[r0]
        p = rec_pos[bi]
        for i in range(r0, r1):
            p = write_varint(out, p, body[i])
            out[p] = 0  # record attributes: unused
            p += 1
            p = write_varint(out, p, ts[i] - base)
            p = write_varint(out, p, i - r0)
            kl = key_len[i]
            p = write_varint(out, p, kl)
            if kl > 0:
                copy_bytes(out, p, key_data, key_start[i], kl)
                p += kl
            vl = val_len[i]
            p = write_varint(out, p, vl)
            if vl > 0:
                copy_bytes(out, p, val_data, val_start[i], vl)
                p += vl
            hc = hcount[i]
            p = write_varint(out, p, hc)
            h0 = hstart[i]
            for h in range(h0, h0 + hc):
                ln = hk_len[h]
                p = write_varint(out, p, ln)
                copy_bytes(out, p, hk_data, hk_start[h], ln)
                p += ln
                ln = hv_len[h]
                p = write_varint(out, p, ln)
                if ln > 0:
                    copy_bytes(out, p, hv_data, hv_start[h], ln)
                    p += ln
    return p


@njit(nogil=True)
def put_rows(out, positions, rows):  # pragma: no cover - jitted
    """out[positions[i]:positions[i] + rows.shape[1]] = rows[i] (batch headers, CRC fields)."""
    width = rows.shape[1]
    for i in range(positions.shape[0]):
        p = positions[i]
        for j in range(width):
            out[p + j] = rows[i, j]


# ----------------------------------------------------------------------------------------- decode


@njit(nogil=True)
def _grow(a, need):
    cap = a.shape[1]
    while cap < need:
        cap *= 2
    out = np.empty((a.shape[0], cap), a.dtype)
    out[:, : a.shape[1]] = a
    return out


@njit(nogil=True)
def frame_records(
    src, area_start, area_end, counts, last_deltas, base_offsets, base_ts, ts_override, min_offset, last_offset
):  # pragma: no cover - jitted
    """Walk the records of every batch (record area b is src[area_start[b]:area_end[b]]).

    Keeps records with min_offset <= offset <= last_offset (inclusive: offset 2**63-1 can be kept).
    ts_override[b] != -1 << 63 replaces every record timestamp of batch b (LogAppendTime). Returns
    (recs[8, n], hdrs[4, m], n, m, err, err_pos, err_batch): recs rows are offset, timestamp,
    batch, key start, key length, value start, value length, header count; hdrs rows are key
    start, key length, value start, value length. Lengths are -1 for null.
    """
    nb = area_start.shape[0]
    total = 0
    for b in range(nb):
        total += counts[b]
    recs = np.empty((8, total), np.int64)
    hdrs = np.empty((4, max(16, total)), np.int64)
    n = 0
    m = 0
    for b in range(nb):
        p = area_start[b]
        end = area_end[b]
        prev_delta = -1
        for _ in range(counts[b]):
            rec_begin = p
            length, p = read_varint(src, p, end, 5)
            if p < 0:
                return recs, hdrs, n, m, (E_TRUNCATED if p == -1 else E_VARINT), rec_begin, b
            if length < MIN_RECORD_BYTES - 1:
                return recs, hdrs, n, m, E_RECORD_LENGTH, rec_begin, b
            if length > end - p:
                return recs, hdrs, n, m, E_TRUNCATED, rec_begin, b
            rend = p + length
            p += 1  # attributes
            ts_delta, p = read_varint(src, p, rend, 10)
            if p < 0:
                return recs, hdrs, n, m, (E_RECORD_SIZE if p == -1 else E_VARINT), rec_begin, b
            off_delta, p = read_varint(src, p, rend, 5)
            if p < 0:
                return recs, hdrs, n, m, (E_RECORD_SIZE if p == -1 else E_VARINT), rec_begin, b
            if off_delta <= prev_delta or off_delta > last_deltas[b]:
                return recs, hdrs, n, m, E_OFFSET_DELTA, rec_begin, b
            prev_delta = off_delta
            kl, p = read_varint(src, p, rend, 5)
            if p < 0:
                return recs, hdrs, n, m, (E_RECORD_SIZE if p == -1 else E_VARINT), rec_begin, b
            if kl < -1 or kl > rend - p:
                return recs, hdrs, n, m, E_KEY_LENGTH, rec_begin, b
            ks = p
            if kl > 0:
                p += kl
            vl, p = read_varint(src, p, rend, 5)
            if p < 0:
                return recs, hdrs, n, m, (E_RECORD_SIZE if p == -1 else E_VARINT), rec_begin, b
            if vl < -1 or vl > rend - p:
                return recs, hdrs, n, m, E_VALUE_LENGTH, rec_begin, b
            vs = p
            if vl > 0:
                p += vl
            hc, p = read_varint(src, p, rend, 5)
            if p < 0:
                return recs, hdrs, n, m, (E_RECORD_SIZE if p == -1 else E_VARINT), rec_begin, b
            if hc < 0 or hc * 2 > rend - p:  # each header takes at least two bytes
                return recs, hdrs, n, m, E_HEADER_COUNT, rec_begin, b
            offset = base_offsets[b] + off_delta
            keep = offset >= min_offset and offset <= last_offset
            if keep and m + hc > hdrs.shape[1]:
                hdrs = _grow(hdrs, m + hc)
            h = m
            for _ in range(hc):
                hkl, p = read_varint(src, p, rend, 5)
                if p < 0:
                    return recs, hdrs, n, m, (E_RECORD_SIZE if p == -1 else E_VARINT), rec_begin, b
                if hkl < 0 or hkl > rend - p:
                    return recs, hdrs, n, m, E_HEADER_KEY_LENGTH, rec_begin, b
                hks = p
                p += hkl
                hvl, p = read_varint(src, p, rend, 5)
                if p < 0:
                    return recs, hdrs, n, m, (E_RECORD_SIZE if p == -1 else E_VARINT), rec_begin, b
                if hvl < -1 or hvl > rend - p:
                    return recs, hdrs, n, m, E_HEADER_VALUE_LENGTH, rec_begin, b
                hvs = p
                if hvl > 0:
                    p += hvl
                if keep:
                    hdrs[0, h] = hks
                    hdrs[1, h] = hkl
                    hdrs[2, h] = hvs
                    hdrs[3, h] = hvl
                    h += 1
            if p != rend:
                return recs, hdrs, n, m, E_RECORD_SIZE, rec_begin, b
            if keep:
                recs[0, n] = offset
                recs[1, n] = ts_override[b] if ts_override[b] != -9223372036854775808 else base_ts[b] + ts_delta
                recs[2, n] = b
                recs[3, n] = ks
                recs[4, n] = kl
                recs[5, n] = vs
                recs[6, n] = vl
                recs[7, n] = hc
                n += 1
                m = h
        if p != end:
            return recs, hdrs, n, m, E_TRAILING, p, b
    return recs, hdrs, n, m, OK, 0, 0


@njit(nogil=True, inline="always")
def _offsets(lens, n):
    """Arrow int32 offsets for lengths (-1 = null, no bytes), or (offsets, -1) past int32."""
    offsets = np.empty(n + 1, np.int32)
    total = np.int64(0)
    offsets[0] = 0
    for i in range(n):
        ln = lens[i]
        if ln > 0:
            total += ln
            if total > INT32_MAX:
                return offsets, np.int64(-1)
        offsets[i + 1] = total
    return offsets, total


@njit(nogil=True)
def gather_records(src, recs, n, hdrs, m):  # pragma: no cover - jitted
    """Copy keys, values, header keys and header values of framed records into Arrow buffers in one
    sweep over src. Returns (ok, ko, kd, vo, vd, hko, hkd, hvo, hvd, lo); ok False if a column
    would pass 2 GiB (int32 offsets)."""
    ko, kt = _offsets(recs[4], n)
    vo, vt = _offsets(recs[6], n)
    hko, hkt = _offsets(hdrs[1], m)
    hvo, hvt = _offsets(hdrs[3], m)
    lo = np.empty(n + 1, np.int32)
    empty = np.empty(0, np.uint8)
    if kt < 0 or vt < 0 or hkt < 0 or hvt < 0 or m > INT32_MAX:
        return False, ko, empty, vo, empty, hko, empty, hvo, empty, lo
    kd = np.empty(kt, np.uint8)
    vd = np.empty(vt, np.uint8)
    hkd = np.empty(hkt, np.uint8)
    hvd = np.empty(hvt, np.uint8)
    h = 0
    lo[0] = 0
    for i in range(n):
        ln = recs[4, i]
        if ln > 0:
            copy_bytes(kd, ko[i], src, recs[3, i], ln)
        ln = recs[6, i]
        if ln > 0:
            copy_bytes(vd, vo[i], src, recs[5, i], ln)
        for _ in range(recs[7, i]):
            ln = hdrs[1, h]
            if ln > 0:
                copy_bytes(hkd, hko[h], src, hdrs[0, h], ln)
            ln = hdrs[3, h]
            if ln > 0:
                copy_bytes(hvd, hvo[h], src, hdrs[2, h], ln)
            h += 1
        lo[i + 1] = h
    return True, ko, kd, vo, vd, hko, hkd, hvo, hvd, lo
