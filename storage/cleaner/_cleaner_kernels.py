"""Numba kernels of the log cleaner: key hashing, the offset map's table, a HyperLogLog key counter,
and the two record passes.

Hashing: MurmurHash3 x64/128 of the key bytes, written here because no installed library hashes
many variable-length keys in one vectorized call (pyarrow exposes no hash kernel; hashlib is per key).

Table (SkimpyOffsetMap): n slots (any n, sized once per cleaning) of a uint64 tag and a uint32 offset
(relative to the map's base offset), 12 bytes a slot, Robin Hood linear probing (wrapping at n). A
key's home slot is fastrange(h1, n) = (h1 * n) >> 64; its tag is `top 56 bits of h2 << 8 | probe
distance + 1` (0 = empty). A key is thus identified by its home slot and 56 bits of h2.

HyperLogLog (2**14 one-byte registers, from h1: register = top 14 bits, rank = leading zeros of the
other 50 + 1) counts the distinct keys of the range to map, so that the table is sized once.
"""

from __future__ import annotations

import numpy as np

from ..common.jit import njit
from ..records._record_kernels import (
    E_KEY_LENGTH,
    E_OFFSET_DELTA,
    E_RECORD_LENGTH,
    E_RECORD_SIZE,
    E_TRAILING,
    E_TRUNCATED,
    E_VALUE_LENGTH,
    E_VARINT,
    MIN_RECORD_BYTES,
    copy_bytes,
    read_varint,
    varint_size,
    write_varint,
)

_U = np.uint64
_C1 = np.uint64(0x87C37B91114253D5)
_C2 = np.uint64(0x4CF5AD432745937F)
_F1 = np.uint64(0xFF51AFD7ED558CCD)
_F2 = np.uint64(0xC4CEB9FE1A85EC53)
_N1 = np.uint64(0x52DCE729)
_N2 = np.uint64(0x38495AB5)
_FIVE = np.uint64(5)
_FF = np.uint64(0xFF)
_ONE = np.uint64(1)
MAX_DISTANCE = 254  # probe distances are stored + 1 in a byte
MIN_SLOTS = 256  # smallest table
MAX_SLOTS = 2**32 - 1  # fastrange below keeps n < 2**32
HLL_BITS = 14  # HyperLogLog: 2**14 registers (standard error 1.04 / 128 = 0.8%)
HLL_RANK_BITS = 64 - HLL_BITS  # registers hold 0 (empty) .. HLL_RANK_BITS + 1
_M32 = np.uint64(0xFFFFFFFF)
_TOP = np.uint64(1 << 63)

NEED_ROOM = -1  # status: the batch did not fit (load limit or probe distance); grow or stop before it


@njit(nogil=True, inline="always")
def _rotl(x, r):
    return (x << _U(r)) | (x >> _U(64 - r))


@njit(nogil=True, inline="always")
def _fmix(k):
    k ^= k >> _U(33)
    k *= _F1
    k ^= k >> _U(33)
    k *= _F2
    k ^= k >> _U(33)
    return k


@njit(nogil=True, inline="always")
def _u64le(d, p):
    v = _U(0)
    for i in range(8):
        v |= _U(d[p + i]) << _U(8 * i)
    return v


@njit(nogil=True)
def murmur3_128(d, start, n):  # pragma: no cover - jitted
    """MurmurHash3_x64_128 of d[start:start+n], seed 0: (h1, h2) as uint64."""
    h1 = _U(0)
    h2 = _U(0)
    nblocks = n // 16
    for i in range(nblocks):
        p = start + i * 16
        k1 = _u64le(d, p)
        k2 = _u64le(d, p + 8)
        k1 *= _C1
        k1 = _rotl(k1, 31)
        k1 *= _C2
        h1 ^= k1
        h1 = _rotl(h1, 27)
        h1 += h2
        h1 = h1 * _FIVE + _N1
        k2 *= _C2
        k2 = _rotl(k2, 33)
        k2 *= _C1
        h2 ^= k2
        h2 = _rotl(h2, 31)
        h2 += h1
        h2 = h2 * _FIVE + _N2
    t = start + nblocks * 16
    rem = n & 15
    if rem > 8:
        k2 = _U(0)
        for i in range(8, rem):
            k2 ^= _U(d[t + i]) << _U(8 * (i - 8))
        k2 *= _C2
        k2 = _rotl(k2, 33)
        k2 *= _C1
        h2 ^= k2
    if rem > 0:
        k1 = _U(0)
        for i in range(min(rem, 8)):
            k1 ^= _U(d[t + i]) << _U(8 * i)
        k1 *= _C1
        k1 = _rotl(k1, 31)
        k1 *= _C2
        h1 ^= k1
    h1 ^= _U(n)
    h2 ^= _U(n)
    h1 += h2
    h2 += h1
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 += h2
    h2 += h1
    return h1, h2


@njit(nogil=True, inline="always")
def _slot(h1, h2, n):
    """(home slot, stored remainder) of a key in a table of n < 2**32 slots: (h1 * n) >> 64, h2 >> 8."""
    nn = _U(n)
    hi = (h1 >> _U(32)) * nn + (((h1 & _M32) * nn) >> _U(32))  # < 2**64 as n < 2**32
    return np.int64(hi >> _U(32)), h2 >> _U(8)


@njit(nogil=True, inline="always")
def _hll_add(regs, h1):
    idx = np.int64(h1 >> _U(HLL_RANK_BITS))
    w = h1 << _U(HLL_BITS)
    r = 1
    if w == 0:
        r = HLL_RANK_BITS + 1
    else:
        while (w & _TOP) == 0:
            w <<= _ONE
            r += 1
    if r > regs[idx]:
        regs[idx] = r


@njit(nogil=True, inline="always")
def _insert(tags, offs, n, home, rem, off):
    """Insert or raise a key's offset. 1: new key, 0: updated, NEED_ROOM: probe limit (table unchanged)."""
    pos = home
    d = 0
    while True:
        t = tags[pos]
        if t == 0:
            tags[pos] = (rem << _U(8)) | _U(d + 1)
            offs[pos] = off
            return 1
        td = np.int64(t & _FF) - 1
        if td == d and (t >> _U(8)) == rem:
            if off > offs[pos]:
                offs[pos] = off
            return 0
        if td < d:
            break
        d += 1
        if d > MAX_DISTANCE:
            return NEED_ROOM
        pos += 1
        if pos == n:
            pos = 0
    # Robin Hood: the key goes at pos; the run up to the next empty slot moves one slot on
    q = pos
    while tags[q] != 0:
        if np.int64(tags[q] & _FF) - 1 >= MAX_DISTANCE:
            return NEED_ROOM
        q += 1
        if q == n:
            q = 0
    while q != pos:
        prev = q - 1 if q > 0 else n - 1
        tags[q] = tags[prev] + _ONE
        offs[q] = offs[prev]
        q = prev
    tags[pos] = (rem << _U(8)) | _U(d + 1)
    offs[pos] = off
    return 1


@njit(nogil=True, inline="always")
def _lookup(tags, offs, n, home, rem):
    """The stored relative offset of a key, or -1."""
    pos = home
    d = 0
    while True:
        t = tags[pos]
        if t == 0:
            return np.int64(-1)
        td = np.int64(t & _FF) - 1
        if td < d:
            return np.int64(-1)
        if td == d and (t >> _U(8)) == rem:
            return np.int64(offs[pos])
        d += 1
        if d > MAX_DISTANCE:
            return np.int64(-1)
        pos += 1
        if pos == n:
            pos = 0


@njit(nogil=True)
def put_keys(data, starts, lengths, offsets, base, tags, offs, n, size, max_size):  # pragma: no cover
    """Insert keys data[starts[i]:starts[i]+lengths[i]] -> offsets[i] (null keys: length -1, skipped).
    Returns (keys done, new size, status); stops before the key that would pass max_size."""
    for i in range(starts.shape[0]):
        if lengths[i] < 0:
            continue
        if size >= max_size:
            return i, size, NEED_ROOM
        h1, h2 = murmur3_128(data, starts[i], lengths[i])
        home, rem = _slot(h1, h2, n)
        st = _insert(tags, offs, n, home, rem, _U(offsets[i] - base))
        if st < 0:
            return i, size, NEED_ROOM
        size += st
    return starts.shape[0], size, 0


@njit(nogil=True)
def get_keys(data, starts, lengths, base, tags, offs, n):  # pragma: no cover - jitted
    """Offsets stored for keys (-1: absent or null key)."""
    out = np.full(starts.shape[0], -1, np.int64)
    for i in range(starts.shape[0]):
        if lengths[i] < 0:
            continue
        h1, h2 = murmur3_128(data, starts[i], lengths[i])
        home, rem = _slot(h1, h2, n)
        found = _lookup(tags, offs, n, home, rem)
        if found >= 0:
            out[i] = base + found
    return out


@njit(nogil=True, inline="always")
def _frame(src, p, end, last_delta, prev_delta):
    """One record at p: (err, begin, attributes pos, timestampDelta, offsetDelta pos, offsetDelta,
    key start, key length, value length, end). Header bytes are not walked: they are copied whole."""
    begin = p
    length, p = read_varint(src, p, end, 5)
    if p < 0:
        return (E_TRUNCATED if p == -1 else E_VARINT), begin, 0, 0, 0, 0, 0, 0, 0, 0
    if length < MIN_RECORD_BYTES - 1:
        return E_RECORD_LENGTH, begin, 0, 0, 0, 0, 0, 0, 0, 0
    if length > end - p:
        return E_TRUNCATED, begin, 0, 0, 0, 0, 0, 0, 0, 0
    rend = p + length
    attr = p
    p += 1
    tsd, p = read_varint(src, p, rend, 10)
    if p < 0:
        return (E_RECORD_SIZE if p == -1 else E_VARINT), begin, 0, 0, 0, 0, 0, 0, 0, 0
    od_pos = p
    od, p = read_varint(src, p, rend, 5)
    if p < 0:
        return (E_RECORD_SIZE if p == -1 else E_VARINT), begin, 0, 0, 0, 0, 0, 0, 0, 0
    if od <= prev_delta or od > last_delta:
        return E_OFFSET_DELTA, begin, 0, 0, 0, 0, 0, 0, 0, 0
    kl, p = read_varint(src, p, rend, 5)
    if p < 0:
        return (E_RECORD_SIZE if p == -1 else E_VARINT), begin, 0, 0, 0, 0, 0, 0, 0, 0
    if kl < -1 or kl > rend - p:
        return E_KEY_LENGTH, begin, 0, 0, 0, 0, 0, 0, 0, 0
    ks = p
    if kl > 0:
        p += kl
    vl, p = read_varint(src, p, rend, 5)
    if p < 0:
        return (E_RECORD_SIZE if p == -1 else E_VARINT), begin, 0, 0, 0, 0, 0, 0, 0, 0
    if vl < -1 or vl > rend - p:
        return E_VALUE_LENGTH, begin, 0, 0, 0, 0, 0, 0, 0, 0
    return 0, begin, attr, tsd, od_pos, od, ks, kl, vl, rend


@njit(nogil=True)
def map_batches(
    src,
    area_start,
    area_end,
    counts,
    last_deltas,
    base_offsets,
    mappable,
    min_offset,
    base,
    tags,
    offs,
    n,
    size,
    max_size,
):  # pragma: no cover - jitted
    """Pass 1: put every keyed record with offset >= min_offset of the mappable batches into the table.

    Returns (batches done, size, records read, err, err_pos, err_batch). err NEED_ROOM: batch
    `batches done` did not fit (the table reached max_size or the probe limit; its records already
    put are harmless: they are newer than any record the cleaner then drops, and kept as they are
    past the mapped end); other errors are record framing errors.
    """
    reads = 0
    for b in range(area_start.shape[0]):
        if not mappable[b]:
            continue
        p = area_start[b]
        end = area_end[b]
        prev = -1
        for _ in range(counts[b]):
            err, begin, attr, tsd, od_pos, od, ks, kl, vl, rend = _frame(src, p, end, last_deltas[b], prev)
            if err:
                return b, size, reads, err, begin, b
            prev = od
            p = rend
            offset = base_offsets[b] + od
            if kl >= 0 and offset >= min_offset:
                if size >= max_size:  # at the load factor: stop before this batch
                    return b, size, reads, NEED_ROOM, 0, b
                h1, h2 = murmur3_128(src, ks, kl)
                home, rem = _slot(h1, h2, n)
                st = _insert(tags, offs, n, home, rem, _U(offset - base))
                if st < 0:
                    return b, size, reads, NEED_ROOM, 0, b
                size += st
            reads += 1
        if p != end:
            return b, size, reads, E_TRAILING, p, b
    return area_start.shape[0], size, reads, 0, 0, 0


@njit(nogil=True)
def hll_batches(
    src, area_start, area_end, counts, last_deltas, base_offsets, mappable, min_offset, regs
):  # pragma: no cover - jitted
    """Count into HyperLogLog registers the keys map_batches would put (same records, same hash).
    Returns (records read, err, err_pos, err_batch); err is a record framing error code or 0."""
    reads = 0
    for b in range(area_start.shape[0]):
        if not mappable[b]:
            continue
        p = area_start[b]
        end = area_end[b]
        prev = -1
        for _ in range(counts[b]):
            err, begin, attr, tsd, od_pos, od, ks, kl, vl, rend = _frame(src, p, end, last_deltas[b], prev)
            if err:
                return reads, err, begin, b
            prev = od
            p = rend
            if kl >= 0 and base_offsets[b] + od >= min_offset:
                h1, h2 = murmur3_128(src, ks, kl)
                _hll_add(regs, h1)
            reads += 1
        if p != end:
            return reads, E_TRAILING, p, b
    return reads, 0, 0, 0


@njit(nogil=True)
def hll_keys(data, starts, lengths, regs):  # pragma: no cover - jitted
    """Count keys data[starts[i]:starts[i]+lengths[i]] (length -1: null, skipped) into HLL registers."""
    for i in range(starts.shape[0]):
        if lengths[i] >= 0:
            h1, h2 = murmur3_128(data, starts[i], lengths[i])
            _hll_add(regs, h1)


# batch outcomes of filter_batches
DROP = 0
VERBATIM = 1
REWRITE = 2  # kept records re-framed, same baseTimestamp
REWRITE_STAMPED = 3  # kept records re-framed against a new delete horizon (KIP-534)


@njit(nogil=True)
def filter_batches(
    src,
    area_start,
    area_end,
    counts,
    last_deltas,
    base_offsets,
    base_ts,
    has_horizon,
    horizon,
    may_stamp,
    keep_all,
    stamp_all,
    tags,
    offs,
    n,
    map_base,
    map_end,
    now,
    new_horizon,
    out,
):  # pragma: no cover - jitted
    """Pass 2: decide every record and write the records of rewritten batches into `out`.

    A record at offset >= map_end is kept (the map does not cover it), as is every record of a batch
    with keep_all[b] (a transaction marker). Below it: a keyless record is kept; a keyed one is kept if
    no newer offset is mapped for its key, and a tombstone only while its batch's delete horizon (if
    set) is in the future. A batch keeping all records and needing no horizon is VERBATIM; one keeping
    none is DROP; else REWRITE, its kept records re-framed against the new baseTimestamp
    (REWRITE_STAMPED: the horizon `new_horizon`, when it keeps a tombstone or stamp_all[b] (a marker
    whose transaction's data is gone), has no horizon yet and may_stamp[b]).
    Returns (status, out_start, out_end, kept, max_ts, new_base_ts, stats[4], err, err_pos, err_batch);
    stats: records dropped, tombstones dropped, keyless kept, out bytes.
    """
    nb = area_start.shape[0]
    status = np.zeros(nb, np.int8)
    o_start = np.zeros(nb, np.int64)
    o_end = np.zeros(nb, np.int64)
    kept = np.zeros(nb, np.int64)
    max_ts = np.full(nb, -1, np.int64)
    new_base = base_ts.copy()
    stats = np.zeros(4, np.int64)
    most = 0
    for b in range(nb):
        most = max(most, counts[b])
    r_begin = np.empty(most, np.int64)
    r_attr = np.empty(most, np.int64)
    r_od = np.empty(most, np.int64)
    r_end = np.empty(most, np.int64)
    r_ts = np.empty(most, np.int64)
    q = 0
    for b in range(nb):
        p = area_start[b]
        end = area_end[b]
        prev = -1
        nk = 0
        tombs = 0
        mts = np.int64(-1)
        for _ in range(counts[b]):
            err, begin, attr, tsd, od_pos, od, ks, kl, vl, rend = _frame(src, p, end, last_deltas[b], prev)
            if err:
                return status, o_start, o_end, kept, max_ts, new_base, stats, err, begin, b
            prev = od
            p = rend
            offset = base_offsets[b] + od
            keep = True
            if offset < map_end and not keep_all[b]:
                if kl < 0:
                    stats[2] += 1
                else:
                    h1, h2 = murmur3_128(src, ks, kl)
                    home, rem = _slot(h1, h2, n)
                    found = _lookup(tags, offs, n, home, rem)
                    if found >= 0 and offset < map_base + found:
                        keep = False
                    elif vl < 0 and has_horizon[b] and now >= horizon[b]:
                        keep = False
                        stats[1] += 1
            if not keep:
                stats[0] += 1
                continue
            if vl < 0 and kl >= 0:
                tombs += 1
            ts = base_ts[b] + tsd
            if ts > mts:
                mts = ts
            r_begin[nk] = begin
            r_attr[nk] = attr
            r_od[nk] = od_pos
            r_end[nk] = rend
            r_ts[nk] = ts
            nk += 1
        if p != end:
            return status, o_start, o_end, kept, max_ts, new_base, stats, E_TRAILING, p, b
        kept[b] = nk
        max_ts[b] = mts
        stamp = (tombs > 0 or stamp_all[b]) and not has_horizon[b] and may_stamp[b]
        if nk == 0:
            status[b] = DROP
            continue
        if nk == counts[b] and not stamp:
            status[b] = VERBATIM
            continue
        status[b] = REWRITE_STAMPED if stamp else REWRITE
        nbt = new_horizon if stamp else base_ts[b]
        new_base[b] = nbt
        o_start[b] = q
        for j in range(nk):
            if nbt == base_ts[b]:  # same base timestamp: the record's bytes are unchanged
                size = r_end[j] - r_begin[j]
                copy_bytes(out, q, src, r_begin[j], size)
                q += size
            else:
                delta = r_ts[j] - nbt
                tail = r_end[j] - r_od[j]
                q = write_varint(out, q, 1 + varint_size(delta) + tail)
                out[q] = src[r_attr[j]]
                q = write_varint(out, q + 1, delta)
                copy_bytes(out, q, src, r_od[j], tail)
                q += tail
        o_end[b] = q
    stats[3] = q
    return status, o_start, o_end, kept, max_ts, new_base, stats, 0, 0, 0


MAX_REFRAME_GROWTH = 14  # bytes a re-framed record may grow: timestampDelta (<= 9) and length varint (<= 4)


@njit(nogil=True)
def first_keys(src, area_start, area_end, counts, last_deltas):  # pragma: no cover - jitted
    """(err, err_pos, key start, key length) of each batch's first record (key length -2: no record)."""
    nb = area_start.shape[0]
    ks_out = np.zeros(nb, np.int64)
    kl_out = np.full(nb, -2, np.int64)
    for b in range(nb):
        if counts[b] == 0:
            continue
        err, begin, attr, tsd, od_pos, od, ks, kl, vl, rend = _frame(
            src, area_start[b], area_end[b], last_deltas[b], -1
        )
        if err:
            return err, begin, b, ks_out, kl_out
        ks_out[b] = ks
        kl_out[b] = kl
    return 0, 0, 0, ks_out, kl_out
