"""Seeded mutators of the `txn` partition's transaction data: control batches (markers), `.txnindex` files and
producer `.snapshot` files. Used as tests/fuzz/mutate.py's families are: `mutate_txn(rng, part_dir)` picks a
family (weighted) and returns a Mutation that names the file, the byte position, the field and the old and
new values. The oracle (reference.committed_view) reads only the log: damage to a `.txnindex` or a
`.snapshot` must not change what a read_committed reader gets; damage to a marker behind a good CRC does.

Families:
- marker: one control batch's marker type (COMMIT <-> ABORT, a type that is no marker), the control
  record's key or value version (negative: unreadable; higher: read as version 0), the control or
  transactional attribute bit (cleared on a marker, or the control bit set on a transactional data batch),
  the producer id or epoch, the coordinator epoch. The CRC is fixed up half the time.
- txnindex (34-byte entries: int16 version, int64 producerId, firstOffset, lastOffset, lastStableOffset):
  garbage, truncated inside an entry, an entry's version changed, an entry removed, an entry added for a
  committed transaction, an entry's offsets shifted, zero-filled, the file removed.
- snapshot (int16 version, uint32 CRC-32C of the rest, int32 count, 46-byte entries): the CRC wrong,
  truncated, the version changed, a hostile entry count (CRC fixed or not), an entry's fields changed with
  the CRC fixed up (a currentTxnFirstOffset that is not an open transaction's, an open transaction's
  erased, the producer id changed), the file removed, a copy named past the log end.
"""

from __future__ import annotations

import os
import random
import shutil
import struct

import crc32c

from .mutate import Mutation, Skip, _read, _write, batches_of, fix_crc
from .reference import ABORT, COMMIT, CONTROL_MASK, HEADER_SIZE, TRANSACTIONAL_MASK, list_segments, parse_records

TXN_FAMILY_WEIGHTS = {"marker": 40, "txnindex": 30, "snapshot": 30}
ENTRY = struct.Struct(">hqqqq")  # a .txnindex entry: version, producerId, firstOffset, lastOffset, lastStableOffset
ENTRY_SIZE = ENTRY.size  # 34
SNAP_HEADER = struct.Struct(">hIi")  # version, CRC-32C (of everything after it), entry count
SNAP_ENTRY_SIZE = 46
# an entry's fields: name -> (offset in the entry, struct format)
SNAP_FIELDS = {
    "producerId": (0, ">q"),
    "epoch": (8, ">h"),
    "lastSequence": (10, ">i"),
    "lastOffset": (14, ">q"),
    "offsetDelta": (22, ">i"),
    "timestamp": (26, ">q"),
    "coordinatorEpoch": (34, ">i"),
    "currentTxnFirstOffset": (38, ">q"),
}


def _batches(part_dir):
    """(segment, data, position, size, header fields) of every framed batch, in file order."""
    out = []
    for seg in list_segments(part_dir):
        data = _read(seg.path)
        for pos, size in batches_of(data):
            base, _, _, _, _, attrs, lod = struct.unpack_from(">qiibIhi", data, pos)
            pid, epoch = struct.unpack_from(">qh", data, pos + 43)
            out.append((seg, data, pos, size, {"base": base, "attrs": attrs, "lod": lod, "pid": pid, "epoch": epoch}))
    return out


def transactions(part_dir) -> list[tuple[int, int, int, int]]:
    """(producerId, firstOffset, markerOffset, type) of each completed transaction, from the batch headers and
    markers as written (the mutators' own reading: they run on the clean copy before any damage)."""
    ongoing: dict[int, int] = {}
    done = []
    for _seg, data, pos, size, h in _batches(part_dir):
        if h["pid"] < 0:
            continue
        if h["attrs"] & CONTROL_MASK:
            recs, err = parse_records(bytes(data[pos + HEADER_SIZE : pos + size]), 1)
            if err or not recs or recs[0].key is None or len(recs[0].key) < 4:
                continue
            first = ongoing.pop(h["pid"], None)
            if first is not None:
                done.append((h["pid"], first, h["base"], struct.unpack_from(">h", recs[0].key, 2)[0]))
        elif h["attrs"] & TRANSACTIONAL_MASK and h["pid"] not in ongoing:
            ongoing[h["pid"]] = h["base"]
    return done


def log_end(part_dir) -> int:
    bs = _batches(part_dir)
    if not bs:
        return list_segments(part_dir)[-1].base_offset
    h = bs[-1][4]
    return h["base"] + h["lod"] + 1


def _where(seg, pos, h, what="batch"):
    return f"{os.path.basename(seg.path)} {what} @ position {pos} (baseOffset {h['base']})"


# ---------------------------------------------------------------- marker


def m_marker(rng: random.Random, part_dir: str) -> str:
    bs = _batches(part_dir)
    controls = [b for b in bs if b[4]["attrs"] & CONTROL_MASK]
    if not controls:
        raise Skip("no control batch")
    kind = rng.choice(
        ["type_swap"] * 3
        + ["type_unknown"] * 2
        + ["key_version", "value_version"] * 2
        + ["attr_bits"] * 3
        + ["producer_id"] * 2
        + ["producer_epoch", "coordinator_epoch"]
    )
    if kind == "attr_bits" and rng.random() < 0.3:  # a transactional data batch becomes a control batch
        data_txn = [b for b in bs if b[4]["attrs"] & TRANSACTIONAL_MASK and not b[4]["attrs"] & CONTROL_MASK]
        seg, data, pos, size, h = rng.choice(data_txn)
        old = h["attrs"]
        new = old | CONTROL_MASK
        struct.pack_into(">h", data, pos + 21, new)
        return _finish(
            rng, seg, data, pos, size, f"{_where(seg, pos, h)}: attributes {old:#x} -> {new:#x} (control bit set)"
        )
    seg, data, pos, size, h = rng.choice(controls)
    where = _where(seg, pos, h, "control batch")
    area_at = pos + HEADER_SIZE
    recs, err = parse_records(bytes(data[area_at : pos + size]), 1)
    if err or not recs:
        raise Skip("control batch without a readable record")
    rec = recs[0]
    kp, ks = rec.fields["keyLength"]
    key_at = area_at + kp + ks
    vp, vs = rec.fields["valueLength"]
    value_at = area_at + vp + vs
    if kind in ("type_swap", "type_unknown"):
        old = struct.unpack_from(">h", data, key_at + 2)[0]
        if kind == "type_swap":
            new = {ABORT: COMMIT, COMMIT: ABORT}.get(old, ABORT)
        else:
            new = rng.choice([2, 3, 7, 255, -1, 0x7FFF])
        struct.pack_into(">h", data, key_at + 2, new)
        desc = f"{where}: marker type {old} -> {new} (key byte position {key_at + 2})"
    elif kind in ("key_version", "value_version"):
        at = key_at if kind == "key_version" else value_at
        old = struct.unpack_from(">h", data, at)[0]
        new = rng.choice([-1, -(2**15), 1, 5])
        struct.pack_into(">h", data, at, new)
        desc = f"{where}: {'key' if kind == 'key_version' else 'value'} version {old} -> {new} (byte position {at})"
    elif kind == "attr_bits":
        old = h["attrs"]
        new = old & ~rng.choice([CONTROL_MASK, TRANSACTIONAL_MASK])
        struct.pack_into(">h", data, pos + 21, new)
        desc = f"{where}: attributes {old:#x} -> {new:#x} (byte position {pos + 21})"
    elif kind == "producer_id":
        others = sorted({b[4]["pid"] for b in bs if b[4]["pid"] >= 0 and b[4]["pid"] != h["pid"]})
        new = rng.choice([*others, -1, h["pid"] + 1000])
        struct.pack_into(">q", data, pos + 43, new)
        desc = f"{where}: producerId {h['pid']} -> {new} (byte position {pos + 43})"
    elif kind == "producer_epoch":
        new = rng.choice([h["epoch"] + 1, h["epoch"] - 1, -1, 2**15 - 1])
        struct.pack_into(">h", data, pos + 51, new)
        desc = f"{where}: producerEpoch {h['epoch']} -> {new} (byte position {pos + 51})"
    else:
        old = struct.unpack_from(">i", data, value_at + 2)[0]
        new = rng.choice([old + 1, old - 1, -1, 0, 2**31 - 1])
        struct.pack_into(">i", data, value_at + 2, new)
        desc = f"{where}: coordinatorEpoch {old} -> {new} (byte position {value_at + 2})"
    return _finish(rng, seg, data, pos, size, desc)


def _finish(rng, seg, data, pos, size, desc) -> str:
    fixed = rng.random() < 0.5
    if fixed:
        fix_crc(data, pos, size)
    _write(seg.path, data)
    return desc + (", CRC fixed" if fixed else ", CRC stale")


# ---------------------------------------------------------------- .txnindex


def m_txnindex(rng: random.Random, part_dir: str) -> str:
    files = sorted(os.path.join(part_dir, n) for n in os.listdir(part_dir) if n.endswith(".txnindex"))
    full = [f for f in files if os.path.getsize(f) >= ENTRY_SIZE]
    if not full:
        raise Skip("no .txnindex with entries")
    kind = rng.choice(
        ["garbage", "truncated", "bad_version", "entry_removed", "entry_added", "offsets_shifted", "zeros", "removed"]
    )
    if kind == "entry_added":
        return _txnindex_add(rng, part_dir)
    path = rng.choice(full)
    name = os.path.basename(path)
    idx = _read(path)
    n = len(idx) // ENTRY_SIZE
    if kind == "garbage":
        size = rng.choice([len(idx), rng.randrange(1, 100)])
        _write(path, bytes(rng.randrange(256) for _ in range(size)))
        return f"{name}: replaced by {size} random bytes"
    if kind == "zeros":
        _write(path, bytes(len(idx)))
        return f"{name}: zero-filled ({len(idx)} bytes)"
    if kind == "removed":
        os.remove(path)
        return f"{name}: removed ({n} entries)"
    if kind == "truncated":
        cut = len(idx) - rng.randrange(1, ENTRY_SIZE)
        _write(path, idx[:cut])
        return f"{name}: truncated from {len(idx)} to {cut} bytes (a partial {ENTRY_SIZE}-byte entry)"
    j = rng.randrange(n)
    version, pid, first, last, lso = ENTRY.unpack_from(idx, j * ENTRY_SIZE)
    if kind == "bad_version":
        new = rng.choice([1, -1, 2, 0x7FFF])
        struct.pack_into(">h", idx, j * ENTRY_SIZE, new)
        _write(path, idx)
        return f"{name}: entry {j} version {version} -> {new} (byte position {j * ENTRY_SIZE})"
    if kind == "entry_removed":
        del idx[j * ENTRY_SIZE : (j + 1) * ENTRY_SIZE]
        _write(path, idx)
        return f"{name}: entry {j} (producerId {pid}, offsets {first}..{last}) removed (byte position {j * ENTRY_SIZE})"
    d = rng.choice([-3, -2, -1, 1, 2, 3])
    field = rng.choice(["firstOffset", "lastOffset", "both"])
    nf = first + d if field in ("firstOffset", "both") else first
    nl = last + d if field in ("lastOffset", "both") else last
    ENTRY.pack_into(idx, j * ENTRY_SIZE, version, pid, nf, nl, lso)
    _write(path, idx)
    return f"{name}: entry {j} (byte position {j * ENTRY_SIZE}) offsets {first}..{last} -> {nf}..{nl}"


def _txnindex_add(rng, part_dir) -> str:
    committed = [t for t in transactions(part_dir) if t[3] == COMMIT]
    if not committed:
        raise Skip("no committed transaction")
    pid, first, last, _ = rng.choice(committed)
    seg = [s for s in list_segments(part_dir) if s.base_offset <= last][-1]
    path = seg.path[:-4] + ".txnindex"
    idx = _read(path) if os.path.exists(path) else bytearray()
    entries = [ENTRY.unpack_from(idx, i) for i in range(0, len(idx) - len(idx) % ENTRY_SIZE, ENTRY_SIZE)]
    at = sum(1 for e in entries if e[3] < last)  # Kafka appends in marker order
    new = ENTRY.pack(0, pid, first, last, last + 1)
    idx[at * ENTRY_SIZE : at * ENTRY_SIZE] = new
    _write(path, idx)
    return (
        f"{os.path.basename(path)}: entry added at {at} (byte position {at * ENTRY_SIZE}) for the committed "
        f"transaction of producerId {pid}, offsets {first}..{last}"
    )


# ---------------------------------------------------------------- .snapshot


def m_snapshot(rng: random.Random, part_dir: str) -> str:
    snaps = sorted(n for n in os.listdir(part_dir) if n.endswith(".snapshot"))
    if not snaps:
        raise Skip("no snapshot")
    name = snaps[-1] if rng.random() < 0.6 else rng.choice(snaps)  # mostly the one a loader starts from
    path = os.path.join(part_dir, name)
    data = _read(path)
    count = (len(data) - SNAP_HEADER.size) // SNAP_ENTRY_SIZE
    kind = rng.choice(
        ["crc_wrong", "truncated", "version", "hostile_count", "entry_changed", "entry_changed", "removed", "past_end"]
    )
    if kind == "removed":
        os.remove(path)
        return f"{name}: removed"
    if kind == "past_end":
        end = log_end(part_dir)
        new = end + rng.choice([1, 2, 1000])
        new_name = f"{new:020d}.snapshot"
        shutil.copyfile(path, os.path.join(part_dir, new_name))
        return f"{name} copied as {new_name}, past the log end offset {end}"
    if kind == "truncated":
        cut = rng.randrange(0, len(data))
        _write(path, data[:cut])
        return f"{name}: truncated from {len(data)} to {cut} bytes"
    if kind == "crc_wrong":
        old = struct.unpack_from(">I", data, 2)[0]
        new = old ^ (1 << rng.randrange(32))
        struct.pack_into(">I", data, 2, new)
        _write(path, data)
        return f"{name}: CRC {old} -> {new} (byte position 2)"
    if kind == "version":
        old = struct.unpack_from(">h", data, 0)[0]
        new = rng.choice([0, 2, -1, 0x7FFF])
        struct.pack_into(">h", data, 0, new)
        _write(path, data)
        return f"{name}: version {old} -> {new} (byte position 0)"
    if kind == "hostile_count":
        new = rng.choice([2**31 - 1, count + 1, -1, 2**24])
        struct.pack_into(">i", data, 6, new)
        fixed = rng.random() < 0.5
        if fixed:
            _fix_snapshot_crc(data)
        _write(path, data)
        return f"{name}: entry count {count} -> {new} (byte position 6){', CRC fixed' if fixed else ''}"
    if not count:
        raise Skip("snapshot without entries")
    j = rng.randrange(count)
    at = SNAP_HEADER.size + j * SNAP_ENTRY_SIZE
    first_at = at + SNAP_FIELDS["currentTxnFirstOffset"][0]
    cur = struct.unpack_from(">q", data, first_at)[0]
    snap_offset = int(name[:20])
    sub = rng.choice(["txn_first_bogus", "txn_first_bogus", "txn_first_erased", "producer_id"])
    if sub == "txn_first_erased":
        opened = [
            k
            for k in range(count)
            if struct.unpack_from(">q", data, SNAP_HEADER.size + k * SNAP_ENTRY_SIZE + 38)[0] >= 0
        ]
        if not opened:
            sub = "txn_first_bogus"
        else:
            j = rng.choice(opened)
            at = SNAP_HEADER.size + j * SNAP_ENTRY_SIZE
            first_at = at + 38
            cur = struct.unpack_from(">q", data, first_at)[0]
    if sub == "producer_id":
        old = struct.unpack_from(">q", data, at)[0]
        new = old + rng.choice([1, 1000, 2**40])
        struct.pack_into(">q", data, at, new)
        desc = f"entry {j} producerId {old} -> {new} (byte position {at})"
    else:
        if sub == "txn_first_erased":
            new = -1
        else:
            committed = [t[1] for t in transactions(part_dir) if t[3] == COMMIT and t[1] < snap_offset]
            new = rng.choice([*committed[-3:], max(0, snap_offset - rng.randrange(1, 20)), snap_offset + 5, 0])
            if new == cur:
                new = cur + 1
        struct.pack_into(">q", data, first_at, new)
        desc = f"entry {j} currentTxnFirstOffset {cur} -> {new} (byte position {first_at}; {sub})"
    _fix_snapshot_crc(data)
    _write(path, data)
    return f"{name}: {desc}, CRC fixed"


def _fix_snapshot_crc(data: bytearray) -> None:
    struct.pack_into(">I", data, 2, crc32c.crc32c(bytes(data[6:])))


TXN_FAMILIES = {"marker": m_marker, "txnindex": m_txnindex, "snapshot": m_snapshot}


def mutate_txn(rng: random.Random, part_dir: str, *, family: str | None = None) -> Mutation:
    for _ in range(50):
        fam = family or rng.choices(list(TXN_FAMILY_WEIGHTS), weights=list(TXN_FAMILY_WEIGHTS.values()))[0]
        try:
            return Mutation(fam, TXN_FAMILIES[fam](rng, part_dir))
        except Skip:
            if family:
                raise
            continue
    raise RuntimeError("no mutation applied")
