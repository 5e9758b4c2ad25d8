"""SkimpyOffsetMap: key -> latest offset over a log's dirty section, in 12 bytes a slot.

Kafka's map stores a 16-byte MD5 and an 8-byte offset per slot (24 bytes). Ours stores a uint64 tag
and a uint32 offset relative to the map's base offset (the first dirty offset), Robin Hood linear
probing; see _cleaner_kernels for the layout. The table is allocated once per cleaning, sized from a
HyperLogLog estimate of the distinct keys to map (`reserve`): ceil(estimate * (1 + RESERVE_MARGIN) /
load factor) slots, at least 256, at most the dedupe buffer (budget / 12 slots), never grown (a
grown table would need the old one alongside). At the default load factor 0.9 that is
12 * 1.04 / 0.9 = 13.9 bytes a key, and at most 16 while the estimate is within +15% of the truth
(18 standard errors). The 16 KiB of HLL registers live only before the table is allocated, beside
the 3 KiB empty table, so the map's peak is <= 16 bytes a key from 1,216 keys on (the table alone
from 192). The bound needs a load factor >= 0.79 (12 * 1.04 / 16). If the estimate was low and the
table reaches its load factor, the cleaner maps only a prefix and leaves the rest dirty, as when the
dedupe buffer is full: correctness never depends on the estimate.

Collisions: a key is identified by its home slot of n and 56 bits of its MurmurHash3 h2. Two keys of
one cleaning that share both are merged, and the older of their two latest records is dropped, as a
collision does in Kafka. With m keys in n slots the chance of any collision is about
m**2 / (2 * n * 2**56), ~ 0.43 * m / 2**56 at n = m * 1.04 / 0.9: 6e-13 for 100k keys, 6e-11 for the
10M keys a 128 MiB buffer holds (Kafka's 128-bit MD5: ~m**2 / 2**129).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidConfigError
from . import _cleaner_kernels as K

SLOT_BYTES = 12  # uint64 tag + uint32 relative offset
DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024  # log.cleaner.dedupe.buffer.size
DEFAULT_LOAD_FACTOR = 0.9  # log.cleaner.io.buffer.load.factor
MAX_RELATIVE_OFFSET = 2**32 - 1  # offsets stored relative to the base offset, as uint32
RESERVE_MARGIN = 0.04  # slack over the HLL estimate: 5 standard errors of 2**14 registers
HLL_BYTES = 1 << K.HLL_BITS
_NO_TAGS = np.zeros(0, np.uint64)  # stand-ins while a table is replaced
_NO_OFFS = np.zeros(0, np.uint32)


def _flat_keys(keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, starts, lengths with -1 for None) of a sequence of keys."""
    lens = np.array([-1 if k is None else len(k) for k in keys], np.int64)
    data = np.frombuffer(b"".join(k for k in keys if k is not None), np.uint8)
    sizes = np.maximum(lens, 0)
    starts = np.cumsum(sizes) - sizes
    return data, starts, lens


def _sigma(x: float) -> float:
    if x == 1.0:
        return math.inf
    y, z = 1.0, x
    while True:
        x *= x
        z_old, z = z, z + x * y
        y += y
        if z == z_old:
            return z


def _tau(x: float) -> float:
    if x in (0.0, 1.0):
        return 0.0
    y, z = 1.0, 1.0 - x
    while True:
        x = math.sqrt(x)
        y *= 0.5
        z_old, z = z, z - (1.0 - x) ** 2 * y
        if z == z_old:
            return z / 3


class KeyCounter:
    """HyperLogLog over the offset map's key hash: distinct key count within ~0.8% (one std error)."""

    def __init__(self):
        self.registers = np.zeros(HLL_BYTES, np.uint8)

    @property
    def memory_bytes(self) -> int:
        return self.registers.nbytes

    def add_keys(self, keys) -> None:
        data, starts, lens = _flat_keys(keys)
        K.hll_keys(data, starts, lens, self.registers)

    def estimate(self) -> int:
        """Ertl's improved raw estimator (arXiv:1702.01284), unbiased from 0 keys on without tables."""
        m = HLL_BYTES
        q = K.HLL_RANK_BITS
        c = np.bincount(self.registers, minlength=q + 2).astype(float)
        if c[0] == m:
            return 0
        z = m * _tau(1.0 - c[q + 1] / m)
        for k in range(q, 0, -1):
            z = 0.5 * (z + c[k])
        z += m * _sigma(c[0] / m)
        return int(round(m * m / (2 * math.log(2)) / z))


class SkimpyOffsetMap:
    """Offsets of the latest record per key hash; `latest_offset` is the last offset mapped so far."""

    def __init__(
        self,
        memory: int = DEFAULT_DEDUPE_BUFFER_SIZE,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        *,
        base_offset: int = 0,
    ):
        if not 0 < load_factor <= 1:
            raise InvalidConfigError(f"log.cleaner.io.buffer.load.factor must be in (0, 1], got {load_factor}")
        self.memory = int(memory)
        self.load_factor = float(load_factor)
        self.max_slots = self.check_memory(memory)
        self.peak_bytes = 0
        self.clear(base_offset)

    @staticmethod
    def check_memory(memory: int) -> int:
        """Slots of the largest table `memory` bytes hold; raises InvalidConfigError if under the minimum."""
        slots = min(K.MAX_SLOTS, int(memory) // SLOT_BYTES)
        if slots < K.MIN_SLOTS:
            raise InvalidConfigError(
                f"log.cleaner.dedupe.buffer.size {memory} is too small: the offset map needs at least "
                f"{SLOT_BYTES * K.MIN_SLOTS} bytes ({K.MIN_SLOTS} slots of {SLOT_BYTES} bytes)"
            )
        return slots

    # ------------------------------------------------------------------ state
    def clear(self, base_offset: int = 0) -> None:
        """Empty the map (back to its smallest table, not reserved) for offsets from base_offset on."""
        self.base_offset = int(base_offset)
        self._alloc(K.MIN_SLOTS)
        self.reserved = False
        self.latest_offset = -1

    def _alloc(self, slots: int) -> None:
        self._tags, self._offs = _NO_TAGS, _NO_OFFS  # the old table goes first: never two at once
        self._tags = np.zeros(slots, np.uint64)
        self._offs = np.zeros(slots, np.uint32)
        self.size = 0
        self.peak_bytes = max(self.peak_bytes, self.memory_bytes)

    def slots_for(self, expected_keys: int) -> int:
        """Table slots `reserve(expected_keys)` allocates."""
        want = math.ceil(max(0, int(expected_keys)) * (1 + RESERVE_MARGIN) / self.load_factor)
        return max(K.MIN_SLOTS, min(self.max_slots, want))

    def reserve(self, expected_keys: int) -> None:
        """Allocate the one table of this cleaning (emptying the map), for about expected_keys keys."""
        self._alloc(self.slots_for(expected_keys))
        self.reserved = True

    def note_peak(self, extra_bytes: int) -> None:
        """Count other memory of the map's lifetime (the HyperLogLog) in peak_bytes."""
        self.peak_bytes = max(self.peak_bytes, self.memory_bytes + int(extra_bytes))

    @property
    def slots(self) -> int:
        return len(self._tags)

    @property
    def max_size(self) -> int:
        """Keys the table holds (load factor)."""
        return int(self.slots * self.load_factor)

    @property
    def capacity(self) -> int:
        """Keys the map holds at its largest size (the dedupe buffer)."""
        return int(self.max_slots * self.load_factor)

    @property
    def memory_bytes(self) -> int:
        return self._tags.nbytes + self._offs.nbytes

    @property
    def utilization(self) -> float:
        return self.size / self.slots

    def update_latest_offset(self, offset: int) -> None:
        self.latest_offset = max(self.latest_offset, int(offset))

    # ------------------------------------------------------------------ bulk paths
    def put_batches(
        self, src, area_start, area_end, counts, last_deltas, base_offsets, mappable, min_offset: int
    ) -> tuple[int, int, int, int, int]:
        """Put the keyed records (offset >= min_offset) of batches whose record areas are
        src[area_start[b]:area_end[b]]. Returns (batches done, records read, err, err_pos, err_batch):
        err 0 all done; K.NEED_ROOM the table is full before batch `done`; else a framing error code.
        If not even the map's first batch fits (an estimate far too low), the table is reallocated
        larger within the budget first. The caller keeps every offset below base_offset + MAX_RELATIVE_OFFSET."""
        while True:
            done, size, reads, err, pos, eb = K.map_batches(
                src,
                area_start,
                area_end,
                counts,
                last_deltas,
                base_offsets,
                mappable,
                np.int64(min_offset),
                np.int64(self.base_offset),
                *self._insert_state(),
            )
            self.size = size
            if (
                err == K.NEED_ROOM
                and self.latest_offset < self.base_offset
                and not mappable[:done].any()
                and self.slots < self.max_slots
            ):
                # nothing is mapped but parts of this first keyed batch: start over in a table that holds it
                need = math.ceil((int(counts[done]) + 1) / self.load_factor) + 1
                self._alloc(min(self.max_slots, max(2 * self.slots, need)))
                continue
            return done, reads, err, pos, eb

    def put(self, keys, offsets) -> None:
        """Put keys (bytes, None skipped) with their offsets; the first put of an unreserved map
        reserves for its own keys. Raises OverflowError if the table is full."""
        data, starts, lens = _flat_keys(keys)
        offsets = np.asarray(offsets, np.int64)
        rel = offsets - self.base_offset
        if len(rel) and (rel.min() < 0 or rel.max() >= MAX_RELATIVE_OFFSET):
            raise ValueError(f"offsets must be in [{self.base_offset}, {self.base_offset + MAX_RELATIVE_OFFSET})")
        if not self.reserved:
            counter = KeyCounter()
            K.hll_keys(data, starts, lens, counter.registers)
            self.note_peak(counter.memory_bytes)
            self.reserve(counter.estimate())
        done, self.size, st = K.put_keys(
            data,
            starts,
            lens,
            offsets,
            np.int64(self.base_offset),
            *self._insert_state(),
        )
        if st:
            raise OverflowError(
                f"offset map full: {self.size} keys in {self.slots} slots ({self.memory} bytes of dedupe buffer)"
            )
        if len(offsets):
            self.update_latest_offset(int(offsets.max()))

    def get(self, keys) -> np.ndarray:
        """Offsets mapped for keys (-1: absent)."""
        data, starts, lens = _flat_keys(keys)
        return K.get_keys(data, starts, lens, np.int64(self.base_offset), self._tags, self._offs, self.slots)

    def _insert_state(self) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """What the inserting kernels take after their input: the table, its slots, and fill and limit."""
        return self._tags, self._offs, self.slots, self.size, self.max_size

    @property
    def tables(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(tags, offsets, slots) for the cleaner's kernels."""
        return self._tags, self._offs, self.slots
