"""Seeded mutators: each damages one copy of a partition directory in place and describes what it did.

`mutate(rng, part_dir, kind=None)` picks a mutation family (weighted) and applies it; every choice
comes from `rng` (a `random.Random` seeded by the runner with f"{seed}:{k}"), so a mutant is
reproduced from (seed, k) alone. The description names the file, the batch (index, byte position,
base offset), the field and the old and new values.

Families:
- header: flip 1-3 bits of one batch header field (baseOffset, batchLength, partitionLeaderEpoch,
  magic, crc, attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch,
  baseSequence, recordCount); for fields covered by the CRC, half the time the CRC is fixed up after.
- payload: flip a bit in the record area (compressed bytes for compressed batches), CRC fixed or not.
- record_length: set one varint of one record (length, keyLength, valueLength, headerCount, a header
  key or value length, offsetDelta, timestampDelta) to an edge value (0, -1, 2**31-1, off by 1..3);
  compressed batches are inflated, edited and compressed again in the same codec. batchLength is
  always fixed up; the CRC is fixed up 3 times in 4 (so the record parser behind the CRC is what must
  catch it); index positions of later batches are shifted when the batch changed size, so only the
  edited field is wrong.
- batch_length / record_count / last_offset_delta: edge values for the header's length and count
  fields (0, -1, 2**31-1, the minimum 49 and 48, off by 1..4, one past the file).
- truncate: cut the last segment (a torn tail) or another segment (corruption) at a random position.
- index: .index damage (garbage, an entry's position moved a few bytes, an entry pointing at a later
  batch, size not a multiple of 8, offsets decreasing, offset past the segment, zero-filled, removed);
  .timeindex damage (garbage, not a multiple of 12, timestamps decreasing, offset moved, removed).
- base_offset: a batch's baseOffset (outside the CRC) changed: to the previous batch's, -1/+1, into
  the next segment's range, negative; the last batch's set to 0 or 2**63-1.
- structure: a batch duplicated in place, two adjacent batches swapped, garbage or zeros appended
  to the last segment, a whole middle segment's .log removed.
- swap (the `swap` partition only): a byte of the `.log.swap` flipped (CRC fixed or not), or the swap
  truncated.
- chunk (drawn only when asked for: the object-store mode's `chunky` partition): damage at the end of
  one of a reader's chunk reads (reading from the segment's start or from one of its index entries),
  where a read through an object store issues its next ranged GET and
  carries the cut-off batch over (storage/file_records.iter_chunks; dump-log's reader rereads it): a
  bit flipped within 2 bytes of the boundary, the straddling batch's batchLength made to end just
  before, at or after it, or to run past the file, the segment truncated within 12 bytes of it, or
  the first batch header after it damaged (baseOffset, magic, batchLength: outside the CRC).
"""

from __future__ import annotations

import gzip as _gzip
import os
import random
import struct
from dataclasses import dataclass

import crc32c

from .reference import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
    decompress,
    encode_varint,
    list_segments,
    parse_records,
)

# name -> (offset in the batch, struct format, covered by the CRC)
FIELDS = {
    "baseOffset": (0, ">q", False),
    "batchLength": (8, ">i", False),
    "partitionLeaderEpoch": (12, ">i", False),
    "magic": (16, ">b", False),
    "crc": (17, ">I", False),
    "attributes": (21, ">h", True),
    "lastOffsetDelta": (23, ">i", True),
    "baseTimestamp": (27, ">q", True),
    "maxTimestamp": (35, ">q", True),
    "producerId": (43, ">q", True),
    "producerEpoch": (51, ">h", True),
    "baseSequence": (53, ">i", True),
    "recordCount": (57, ">i", True),
}

FAMILY_WEIGHTS = {
    "header": 18,
    "payload": 12,
    "record_length": 18,
    "batch_length": 5,
    "record_count": 4,
    "last_offset_delta": 3,
    "truncate": 9,
    "index": 10,
    "timeindex": 5,
    "base_offset": 9,
    "structure": 5,
}
SWAP_WEIGHT = 25  # added for the swap partition
# The readers' chunk reads (storage/file_records.py FIRST_CHUNK_BYTES, growing 4x per read up to
# MAX_CHUNK_BYTES), restated here: the harness never imports the engine
FIRST_CHUNK_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 8 * 1024 * 1024


class Skip(Exception):
    """This family does not apply to this partition (the caller draws again)."""


@dataclass
class Mutation:
    family: str
    desc: str


# ---------------------------------------------------------------- helpers


def _read(p):
    with open(p, "rb") as f:
        return bytearray(f.read())


def _write(p, data):
    with open(p, "wb") as f:
        f.write(data)


def batches_of(data) -> list[tuple[int, int]]:
    """(position, size) of each framed batch (framing only)."""
    out = []
    pos = 0
    while len(data) - pos >= LOG_OVERHEAD:
        blen = struct.unpack_from(">i", data, pos + 8)[0]
        if blen < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + blen > len(data):
            break
        out.append((pos, LOG_OVERHEAD + blen))
        pos += LOG_OVERHEAD + blen
    return out


def fix_crc(data: bytearray, pos: int, size: int) -> None:
    struct.pack_into(">I", data, pos + 17, crc32c.crc32c(bytes(data[pos + 21 : pos + size])))


def _seg_name(p):
    return os.path.basename(p)


def _pick_segment(rng, part_dir, *, need_batches=1, last=None):
    segs = list_segments(part_dir)
    if last is True:
        segs = segs[-1:]
    elif last is False:
        segs = segs[:-1]
    cands = []
    for s in segs:
        data = _read(s.path)
        bs = batches_of(data)
        if len(bs) >= need_batches:
            cands.append((s, data, bs))
    if not cands:
        raise Skip("no segment with enough batches")
    return rng.choice(cands)


def _pick_batch(rng, bs):
    i = rng.randrange(len(bs))
    return i, bs[i][0], bs[i][1]


def _where(seg, data, i, pos):
    base = struct.unpack_from(">q", data, pos)[0]
    return f"{_seg_name(seg.path)} batch #{i} @ position {pos} (baseOffset {base})"


def _flip_bits(rng, value: int, fmt: str) -> int:
    nbits = struct.calcsize(fmt) * 8
    n = rng.choice([1, 1, 1, 2, 3])
    for b in rng.sample(range(nbits), n):
        value ^= 1 << b
    raw = value & ((1 << nbits) - 1)
    if fmt[-1] in "bhiq" and raw >= 1 << (nbits - 1):
        raw -= 1 << nbits
    return raw


def compress(codec: int, data: bytes) -> bytes:
    """Compress a record area the way Kafka's Java producers frame it."""
    if codec == 1:
        return _gzip.compress(data, mtime=0)
    if codec == 2:
        import cramjam

        out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
        for i in range(0, max(len(data), 1), 32 * 1024):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + 32 * 1024]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec == 3:
        import lz4.frame

        return lz4.frame.compress(
            data, block_linked=False, block_size=lz4.frame.BLOCKSIZE_MAX64KB, content_checksum=False
        )
    if codec == 4:
        import zstandard

        return zstandard.ZstdCompressor().compress(data)
    raise ValueError(codec)


def _shift_index(part_dir, seg, after_pos: int, delta: int) -> None:
    """Keep the .index consistent after a batch at `after_pos` changed size by `delta`."""
    if not delta:
        return
    ip = seg.path[:-4] + ".index"
    if not os.path.exists(ip):
        return
    idx = _read(ip)
    for j in range(0, len(idx) - len(idx) % 8, 8):
        rel, p = struct.unpack_from(">ii", idx, j)
        if p > after_pos:
            struct.pack_into(">ii", idx, j, rel, p + delta)
    _write(ip, idx)


# ---------------------------------------------------------------- families


def m_header(rng, part_dir):
    seg, data, bs = _pick_segment(rng, part_dir)
    i, pos, size = _pick_batch(rng, bs)
    name = rng.choice(list(FIELDS))
    off, fmt, in_crc = FIELDS[name]
    old = struct.unpack_from(fmt, data, pos + off)[0]
    new = _flip_bits(rng, old, fmt)
    struct.pack_into(fmt, data, pos + off, new)
    fixed = in_crc and rng.random() < 0.5
    if fixed:
        fix_crc(data, pos, size)
    _write(seg.path, data)
    return f"{_where(seg, data, i, pos)}: {name} {old} -> {new} (bit flip{', CRC fixed' if fixed else ''})"


def m_payload(rng, part_dir):
    seg, data, bs = _pick_segment(rng, part_dir)
    i, pos, size = _pick_batch(rng, bs)
    if size <= HEADER_SIZE:
        raise Skip("empty batch")
    p = rng.randrange(pos + HEADER_SIZE, pos + size)
    bit = rng.randrange(8)
    old = data[p]
    data[p] ^= 1 << bit
    fixed = rng.random() < 0.5
    if fixed:
        fix_crc(data, pos, size)
    _write(seg.path, data)
    codec = struct.unpack_from(">h", data, pos + 21)[0] & 7
    return (
        f"{_where(seg, data, i, pos)}: record-area byte {p - pos - HEADER_SIZE} (file position {p}, codec {codec})"
        f" {old:#04x} -> {data[p]:#04x}{', CRC fixed' if fixed else ''}"
    )


def _edge_values(rng, old: int) -> int:
    choices = [0, -1, 2**31 - 1, -(2**31), old + rng.choice([1, 2, 3]), old - rng.choice([1, 2, 3])]
    new = rng.choice(choices)
    if new == old:
        new = old + 1
    return new


def m_record_length(rng, part_dir):
    seg, data, bs = _pick_segment(rng, part_dir)
    i, pos, size = _pick_batch(rng, bs)
    attrs = struct.unpack_from(">h", data, pos + 21)[0]
    codec = attrs & 7
    count = struct.unpack_from(">i", data, pos + 57)[0]
    area = bytes(data[pos + HEADER_SIZE : pos + size])
    if codec:
        area = decompress(codec, area, 1 << 26)
    records, err = parse_records(area, count)
    if err or not records:
        raise Skip("batch without records")
    r_i = rng.randrange(len(records))
    rec = records[r_i]
    fname = rng.choice(sorted(rec.fields))
    fpos, fsize = rec.fields[fname]
    old = _zz_decode(area, fpos)
    if fname in ("timestampDelta", "offsetDelta") and rng.random() < 0.5:
        new = old + rng.choice([-1, 1, 2**20])
    else:
        new = _edge_values(rng, old)
    enc = encode_varint(new)
    new_area = area[:fpos] + enc + area[fpos + fsize :]
    body = new_area if not codec else compress(codec, new_area)
    new_batch = bytearray(data[pos : pos + HEADER_SIZE]) + body
    struct.pack_into(">i", new_batch, 8, len(new_batch) - LOG_OVERHEAD)
    fixed = rng.random() < 0.75
    if fixed:
        fix_crc(new_batch, 0, len(new_batch))
    data[pos : pos + size] = new_batch
    _write(seg.path, data)
    _shift_index(part_dir, seg, pos, len(new_batch) - size)
    return (
        f"{_where(seg, data, i, pos)}: record {r_i} {fname} {old} -> {new}"
        f"{f' (codec {codec}, recompressed)' if codec else ''}, batchLength fixed"
        f"{', CRC fixed' if fixed else ', CRC stale'}"
    )


def _zz_decode(buf, pos):
    raw = shift = 0
    while True:
        b = buf[pos]
        raw |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            break
        shift += 7
    return (raw >> 1) ^ -(raw & 1)


def m_batch_length(rng, part_dir):
    seg, data, bs = _pick_segment(rng, part_dir)
    i, pos, size = _pick_batch(rng, bs)
    old = struct.unpack_from(">i", data, pos + 8)[0]
    remaining = len(data) - pos - LOG_OVERHEAD
    new = rng.choice(
        [
            0,
            -1,
            2**31 - 1,
            -(2**31),
            MIN_BATCH_LENGTH,
            MIN_BATCH_LENGTH - 1,
            old + rng.choice([1, 2, 3, 4]),
            old - rng.choice([1, 2, 3, 4]),
            remaining + 1,
        ]
    )
    if new == old:
        new = old - 1
    struct.pack_into(">i", data, pos + 8, new)
    _write(seg.path, data)
    return f"{_where(seg, data, i, pos)}: batchLength {old} -> {new} (outside the CRC)"


def _int_field(rng, part_dir, name, values):
    seg, data, bs = _pick_segment(rng, part_dir)
    i, pos, size = _pick_batch(rng, bs)
    off, fmt, _ = FIELDS[name]
    old = struct.unpack_from(fmt, data, pos + off)[0]
    new = rng.choice(values(old))
    if new == old:
        new = old + 1
    struct.pack_into(fmt, data, pos + off, new)
    fixed = rng.random() < 0.75
    if fixed:
        fix_crc(data, pos, size)
    _write(seg.path, data)
    return f"{_where(seg, data, i, pos)}: {name} {old} -> {new}{', CRC fixed' if fixed else ''}"


def m_record_count(rng, part_dir):
    return _int_field(rng, part_dir, "recordCount", lambda o: [0, -1, 2**31 - 1, o + 1, o + 2, o - 1, o - 3])


def m_last_offset_delta(rng, part_dir):
    return _int_field(rng, part_dir, "lastOffsetDelta", lambda o: [-1, 0, o - 1, o + 1, o + 3, 2**31 - 1])


def m_truncate(rng, part_dir):
    segs = list_segments(part_dir)
    last = rng.random() < 0.6 or len(segs) < 2
    seg = segs[-1] if last else rng.choice(segs[:-1])
    data = _read(seg.path)
    if len(data) < 2:
        raise Skip("empty segment")
    # mostly inside a batch (a torn write), sometimes exactly at a batch boundary
    bs = batches_of(data)
    if rng.random() < 0.15 and len(bs) > 1:
        cut = rng.choice(bs[1:])[0]
    else:
        cut = rng.randrange(1, len(data))
    _write(seg.path, data[:cut])
    return (
        f"{_seg_name(seg.path)} ({'last segment: torn tail' if last else 'non-last segment'}) truncated "
        f"from {len(data)} to {cut} bytes"
    )


def m_index(rng, part_dir):
    segs = [s for s in list_segments(part_dir) if os.path.exists(s.path[:-4] + ".index")]
    if not segs:
        raise Skip("no index")
    seg = rng.choice(segs)
    ip = seg.path[:-4] + ".index"
    idx = _read(ip)
    data = _read(seg.path)
    bs = batches_of(data)
    n = len(idx) // 8
    kind = rng.choice(
        [
            "garbage",
            "position_moved",
            "later_batch",
            "bad_size",
            "decreasing",
            "offset_past_segment",
            "zeros",
            "removed",
        ]
    )
    if kind in ("position_moved", "later_batch", "decreasing", "offset_past_segment") and n == 0:
        kind = "garbage"
    name = os.path.basename(ip)
    if kind == "garbage":
        size = rng.choice([len(idx), rng.randrange(1, 64)]) or 8
        new = bytes(rng.randrange(256) for _ in range(size))
        _write(ip, new)
        return f"{name}: replaced by {size} random bytes"
    if kind == "zeros":
        _write(ip, bytes(max(8, len(idx))))
        return f"{name}: zero-filled ({max(8, len(idx))} bytes)"
    if kind == "removed":
        os.remove(ip)
        return f"{name}: removed"
    if kind == "bad_size":
        cut = len(idx) - rng.randrange(1, 8) if len(idx) >= 8 else 0
        new = idx[:cut] if rng.random() < 0.5 else idx + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        _write(ip, new)
        return f"{name}: {len(idx)} -> {len(new)} bytes (not a multiple of 8)"
    j = rng.randrange(n)
    rel, p = struct.unpack_from(">ii", idx, j * 8)
    if kind == "position_moved":
        d = rng.choice([-8, -4, -3, -2, -1, 1, 2, 3, 4, 8])
        struct.pack_into(">ii", idx, j * 8, rel, p + d)
        _write(ip, idx)
        return f"{name}: entry {j} (offset +{rel}) position {p} -> {p + d}"
    if kind == "later_batch":
        later = [b for b, _ in bs if b > p]
        if not later:
            raise Skip("no later batch")
        q = rng.choice(later)
        struct.pack_into(">ii", idx, j * 8, rel, q)
        _write(ip, idx)
        return f"{name}: entry {j} (offset +{rel}) points at a later batch: position {p} -> {q}"
    if kind == "decreasing":
        if n >= 2:
            a, b = rng.sample(range(n), 2)
            ea, eb = bytes(idx[a * 8 : a * 8 + 8]), bytes(idx[b * 8 : b * 8 + 8])
            idx[a * 8 : a * 8 + 8], idx[b * 8 : b * 8 + 8] = eb, ea
            _write(ip, idx)
            return f"{name}: entries {a} and {b} swapped (offsets decrease)"
        struct.pack_into(">ii", idx, j * 8, -rng.randrange(1, 5), p)
        _write(ip, idx)
        return f"{name}: entry {j} relative offset {rel} -> negative"
    # offset_past_segment
    new_rel = rel + rng.choice([1000, 2**20, 2**31 - 1 - rel])
    struct.pack_into(">ii", idx, j * 8, new_rel, p)
    _write(ip, idx)
    return f"{name}: entry {j} relative offset {rel} -> {new_rel} (past the segment)"


def m_timeindex(rng, part_dir):
    segs = [s for s in list_segments(part_dir) if os.path.exists(s.path[:-4] + ".timeindex")]
    if not segs:
        raise Skip("no time index")
    seg = rng.choice(segs)
    tp = seg.path[:-4] + ".timeindex"
    ti = _read(tp)
    n = len(ti) // 12
    name = os.path.basename(tp)
    kind = rng.choice(["garbage", "bad_size", "decreasing", "offset_moved", "removed"])
    if kind in ("decreasing", "offset_moved") and n == 0:
        kind = "garbage"
    if kind == "garbage":
        size = rng.choice([len(ti), rng.randrange(1, 64)]) or 12
        _write(tp, bytes(rng.randrange(256) for _ in range(size)))
        return f"{name}: replaced by {size} random bytes"
    if kind == "removed":
        os.remove(tp)
        return f"{name}: removed"
    if kind == "bad_size":
        cut = max(0, len(ti) - rng.randrange(1, 12))
        _write(tp, ti[:cut])
        return f"{name}: {len(ti)} -> {cut} bytes (not a multiple of 12)"
    j = rng.randrange(n)
    ts, rel = struct.unpack_from(">qi", ti, j * 12)
    if kind == "decreasing":
        new = ts - rng.choice([1, 10**6, 10**12])
        struct.pack_into(">qi", ti, j * 12, new, rel)
        _write(tp, ti)
        return f"{name}: entry {j} timestamp {ts} -> {new}"
    d = rng.choice([-3, -1, 1, 5, 1000])
    struct.pack_into(">qi", ti, j * 12, ts, rel + d)
    _write(tp, ti)
    return f"{name}: entry {j} relative offset {rel} -> {rel + d}"


def m_base_offset(rng, part_dir):
    segs = list_segments(part_dir)
    kind = rng.choice(["prev", "minus1", "plus1", "next_segment", "negative", "last_zero", "last_max"])
    if kind in ("last_zero", "last_max"):
        seg, data, bs = _pick_segment(rng, part_dir, last=True)
        i = len(bs) - 1
        pos = bs[i][0]
        new = 0 if kind == "last_zero" else 2**63 - 1
    else:
        seg, data, bs = _pick_segment(rng, part_dir, need_batches=2 if kind == "prev" else 1)
        i, pos, _ = _pick_batch(rng, bs)
        old = struct.unpack_from(">q", data, pos)[0]
        if kind == "prev":
            i = rng.randrange(1, len(bs))
            pos = bs[i][0]
            new = struct.unpack_from(">q", data, bs[i - 1][0])[0]
        elif kind == "minus1":
            new = old - 1
        elif kind == "plus1":
            new = old + 1
        elif kind == "next_segment":
            later = [s.base_offset for s in segs if s.base_offset > seg.base_offset]
            new = (later[0] + rng.randrange(0, 5)) if later else old + 10**6
        else:
            new = -rng.choice([1, 2**40])
    old = struct.unpack_from(">q", data, pos)[0]
    if new == old:
        new = old + 2
    struct.pack_into(">q", data, pos, new)
    _write(seg.path, data)
    return f"{_where(seg, data, i, pos)}: baseOffset {old} -> {new} (outside the CRC; {kind})"


def m_structure(rng, part_dir):
    kind = rng.choice(["duplicate", "swap_adjacent", "garbage_tail", "zeros_tail", "segment_removed"])
    if kind == "segment_removed":
        segs = list_segments(part_dir)
        if len(segs) < 3:
            raise Skip("too few segments")
        s = rng.choice(segs[1:-1])
        os.remove(s.path)
        return f"{_seg_name(s.path)}: removed (a gap between segments)"
    if kind in ("garbage_tail", "zeros_tail"):
        seg = list_segments(part_dir)[-1]
        n = rng.choice([1, 7, 11, 12, 60, 200])
        extra = bytes(n) if kind == "zeros_tail" else bytes(rng.randrange(256) for _ in range(n))
        with open(seg.path, "ab") as f:
            f.write(extra)
        return f"{_seg_name(seg.path)} (last): {n} {'zero' if kind == 'zeros_tail' else 'random'} bytes appended"
    seg, data, bs = _pick_segment(rng, part_dir, need_batches=2)
    i = rng.randrange(len(bs) - 1)
    (p1, s1), (p2, s2) = bs[i], bs[i + 1]
    if kind == "duplicate":
        data[p1 + s1 : p1 + s1] = data[p1 : p1 + s1]
        _write(seg.path, data)
        _shift_index(part_dir, seg, p1, s1)
        return f"{_where(seg, data, i, p1)}: batch duplicated right after itself (same offsets twice)"
    a, b = bytes(data[p1 : p1 + s1]), bytes(data[p2 : p2 + s2])
    data[p1 : p2 + s2] = b + a
    _write(seg.path, data)
    return f"{_where(seg, data, i, p1)}: swapped with the next batch (offsets out of order)"


def m_swap(rng, part_dir):
    swaps = [n for n in os.listdir(part_dir) if n.endswith(".log.swap")]
    if not swaps:
        raise Skip("no swap file")
    p = os.path.join(part_dir, rng.choice(swaps))
    data = _read(p)
    if rng.random() < 0.5:
        cut = rng.randrange(0, len(data))
        _write(p, data[:cut])
        return f"{os.path.basename(p)}: truncated from {len(data)} to {cut} bytes"
    q = rng.randrange(len(data))
    old = data[q]
    data[q] ^= 1 << rng.randrange(8)
    fixed = False
    if q >= 21 and rng.random() < 0.5:
        for bp, bsz in batches_of(data):
            if bp + 21 <= q < bp + bsz:
                fix_crc(data, bp, bsz)
                fixed = True
    _write(p, data)
    return f"{os.path.basename(p)}: byte at {q} {old:#04x} -> {data[q]:#04x}{', CRC fixed' if fixed else ''}"


FAMILIES = {
    "header": m_header,
    "payload": m_payload,
    "record_length": m_record_length,
    "batch_length": m_batch_length,
    "record_count": m_record_count,
    "last_offset_delta": m_last_offset_delta,
    "truncate": m_truncate,
    "index": m_index,
    "timeindex": m_timeindex,
    "base_offset": m_base_offset,
    "structure": m_structure,
    "swap": m_swap,
}


def chunk_boundaries(data, start: int = 0) -> list[int]:
    """Where a reader's chunk reads of a valid segment end when it reads from `start`: each read asks
    for the next chunk size from the end of the last complete batch it got (the cut-off one is
    carried over), 64 KiB first, 4x more each time."""
    out = []
    pos, chunk = start, FIRST_CHUNK_BYTES
    bs = [b for b in batches_of(data) if b[0] >= start]
    while pos < len(data):
        end = min(len(data), pos + chunk)
        if end >= len(data):
            break
        out.append(end)
        whole = [p + n for p, n in bs if p >= pos and p + n <= end]
        if not whole:
            break  # a batch larger than the chunk: read whole next; no more boundaries worth naming
        pos = whole[-1]
        chunk = min(chunk * 4, MAX_CHUNK_BYTES)
    return out


def m_chunk(rng, part_dir):
    cands = []
    for seg in list_segments(part_dir):
        data = _read(seg.path)
        starts = [0]  # a read from the start, or from an index entry (a read from an offset starts there)
        idx = seg.path[:-4] + ".index"
        if os.path.exists(idx):
            raw = _read(idx)
            starts += [struct.unpack_from(">i", raw, i + 4)[0] for i in range(0, len(raw) - 7, 8)]
        for start in sorted(set(starts)):
            for b in chunk_boundaries(data, start):
                cands.append((seg, data, b))
    if not cands:
        raise Skip("no segment larger than a reader's first chunk")
    seg, data, bound = rng.choice(cands)
    bs = batches_of(data)
    i = next(j for j, (p, n) in enumerate(bs) if p + n > bound)  # the batch holding byte `bound`
    pos, size = bs[i]
    where = f"{_where(seg, data, i, pos)} (size {size}) holds the chunk boundary at {bound}"
    kind = rng.choice(["flip", "flip", "length_to", "length_past", "truncate", "truncate", "next_header"])
    if kind == "flip":
        at = min(max(bound + rng.randint(-2, 2), pos), pos + size - 1)
        bit = rng.randrange(8)
        data[at] ^= 1 << bit
        _write(seg.path, data)
        return f"{where}: bit {bit} of byte {at} flipped (CRC not fixed)"
    if kind == "length_to":
        old = struct.unpack_from(">i", data, pos + 8)[0]
        new = bound + rng.choice([-1, 0, 1]) - pos - LOG_OVERHEAD
        if new == old or new < MIN_BATCH_LENGTH:
            new = old + 1
        struct.pack_into(">i", data, pos + 8, new)
        _write(seg.path, data)
        return f"{where}: batchLength {old} -> {new}, so it ends at {pos + LOG_OVERHEAD + new} (outside the CRC)"
    if kind == "length_past":
        old = struct.unpack_from(">i", data, pos + 8)[0]
        new = rng.choice([len(data) - pos - LOG_OVERHEAD + 1, bound + FIRST_CHUNK_BYTES * 4 - pos, 2**31 - 1])
        struct.pack_into(">i", data, pos + 8, new)
        _write(seg.path, data)
        return f"{where}: batchLength {old} -> {new} (outside the CRC)"
    if kind == "truncate":
        cut = bound + rng.randint(-12, 12)
        _write(seg.path, data[:cut])
        last = seg.path == list_segments(part_dir)[-1].path
        return f"{where}: segment ({'the last' if last else 'not the last'}) truncated from {len(data)} to {cut} bytes"
    j = i + 1 if pos < bound and i + 1 < len(bs) else i  # the first batch that starts at or after the boundary
    pos = bs[j][0]
    name = rng.choice(["baseOffset", "magic", "batchLength"])
    off, fmt, _ = FIELDS[name]
    old = struct.unpack_from(fmt, data, pos + off)[0]
    new = _flip_bits(rng, old, fmt)
    struct.pack_into(fmt, data, pos + off, new)
    _write(seg.path, data)
    return f"{where}: the next batch #{j} @ {pos}: {name} {old} -> {new} (outside the CRC)"


FAMILIES["chunk"] = m_chunk  # not in FAMILY_WEIGHTS: drawn only when asked for


def mutate(rng: random.Random, part_dir: str, *, has_swap: bool = False, family: str | None = None) -> Mutation:
    weights = dict(FAMILY_WEIGHTS)
    if has_swap:
        weights["swap"] = SWAP_WEIGHT
    for _ in range(50):
        fam = family or rng.choices(list(weights), weights=list(weights.values()))[0]
        try:
            return Mutation(fam, FAMILIES[fam](rng, part_dir))
        except Skip:
            if family:
                raise
            continue
    raise RuntimeError("no mutation applied")
