"""SkimpyOffsetMap: key -> latest offset over a log's dirty section, in 12 bytes a slot.

Kafka's map stores a 16-byte MD5 and an 8-byte offset per slot (24 bytes). Ours stores a uint64 tag
and a uint32 offset relative to the map's base offset (the first dirty offset), Robin Hood linear
probing over 2**k slots; see _cleaner_kernels for the layout. The table starts at 2**16 slots and
doubles while the load would pass the load factor, up to the dedupe buffer (the largest power of
two of slots that fits). At the load factor 0.9 a key costs 12 / 0.9 = 13.3 bytes; right after a
doubling 26.7; while doubling, the old and new tables coexist (1.5x the new one).

Collisions: a key is identified by 72 bits of its MurmurHash3 (home slot + stored remainder). Two
keys of one cleaning that share them are merged, and the older of their two latest records is
dropped, as a collision does in Kafka. With n keys in the map the chance of any collision is about
n**2 / 2**73: 1e-12 for 100k keys, 6e-9 for the 7.5M keys a 128 MiB buffer holds (Kafka's 128-bit
MD5: ~n**2 / 2**129). Tables under 2**16 slots (budgets under 768 KiB) keep k + 56 bits.
"""

from __future__ import annotations

import numpy as np

from . import _cleaner_kernels as K
from .errors import InvalidConfigError

SLOT_BYTES = 12  # uint64 tag + uint32 relative offset
DEFAULT_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024  # log.cleaner.dedupe.buffer.size
DEFAULT_LOAD_FACTOR = 0.9  # log.cleaner.io.buffer.load.factor
MAX_RELATIVE_OFFSET = 2**32 - 1  # offsets stored relative to the base offset, as uint32


def _flat_keys(keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, starts, lengths with -1 for None) of a sequence of keys."""
    lens = np.array([-1 if k is None else len(k) for k in keys], np.int64)
    data = np.frombuffer(b"".join(k for k in keys if k is not None), np.uint8)
    starts = np.concatenate(([0], np.cumsum(np.maximum(lens, 0))[:-1])).astype(np.int64)
    return data, starts, lens


class SkimpyOffsetMap:
    """Offsets of the latest record per key hash; `latest_offset` is the last offset mapped so far."""

    def __init__(self, memory: int = DEFAULT_DEDUPE_BUFFER_SIZE, load_factor: float = DEFAULT_LOAD_FACTOR, *,
                 base_offset: int = 0):
        if not 0 < load_factor <= 1:
            raise InvalidConfigError(f"log.cleaner.io.buffer.load.factor must be in (0, 1], got {load_factor}")
        self.memory = int(memory)
        self.load_factor = float(load_factor)
        self.max_bits = self.check_memory(memory)
        self.peak_bytes = 0
        self.clear(base_offset)

    @staticmethod
    def check_memory(memory: int) -> int:
        """log2 of the largest table `memory` bytes hold; raises InvalidConfigError if under the minimum."""
        bits = min(K.MAX_BITS, int(memory // SLOT_BYTES).bit_length() - 1) if memory >= SLOT_BYTES else 0
        if bits < K.MIN_BITS:
            raise InvalidConfigError(
                f"log.cleaner.dedupe.buffer.size {memory} is too small: the offset map needs at least "
                f"{SLOT_BYTES << K.MIN_BITS} bytes ({1 << K.MIN_BITS} slots of {SLOT_BYTES} bytes)")
        return bits

    # ------------------------------------------------------------------ state
    def clear(self, base_offset: int = 0) -> None:
        """Empty the map (back to its initial size) for offsets from base_offset on."""
        self.base_offset = int(base_offset)
        self._alloc(min(K.GROW_MIN_BITS, self.max_bits))
        self.size = 0
        self.latest_offset = -1

    def _alloc(self, bits: int) -> None:
        self.bits = bits
        self._tags = np.zeros(1 << bits, np.uint64)
        self._offs = np.zeros(1 << bits, np.uint32)
        self.peak_bytes = max(self.peak_bytes, self.memory_bytes)

    @property
    def slots(self) -> int:
        return 1 << self.bits

    @property
    def max_size(self) -> int:
        """Keys the table holds at its current size before it must grow (load factor)."""
        return int(self.slots * self.load_factor)

    @property
    def capacity(self) -> int:
        """Keys the map holds at its largest size (the dedupe buffer)."""
        return int((1 << self.max_bits) * self.load_factor)

    @property
    def memory_bytes(self) -> int:
        return self._tags.nbytes + self._offs.nbytes

    @property
    def utilization(self) -> float:
        return self.size / self.slots

    def update_latest_offset(self, offset: int) -> None:
        self.latest_offset = max(self.latest_offset, int(offset))

    def _grow(self) -> bool:
        """Double the table if the dedupe buffer allows; False if it is at its largest."""
        if self.bits >= self.max_bits or self.bits < K.GROW_MIN_BITS:
            return False
        tags = np.zeros(1 << (self.bits + 1), np.uint64)
        offs = np.zeros(1 << (self.bits + 1), np.uint32)
        self.peak_bytes = max(self.peak_bytes, self.memory_bytes + tags.nbytes + offs.nbytes)
        if not K.rehash(self._tags, self._offs, self.bits, tags, offs):
            return False  # probe limit even at half the load: keep the current table
        self._tags, self._offs, self.bits = tags, offs, self.bits + 1
        return True

    # ------------------------------------------------------------------ bulk paths
    def put_batches(self, src, area_start, area_end, counts, last_deltas, base_offsets, mappable,
                    min_offset: int) -> tuple[int, int, int, int, int]:
        """Put the keyed records (offset >= min_offset) of batches whose record areas are
        src[area_start[b]:area_end[b]]. Returns (batches done, records read, err, err_pos, err_batch):
        err 0 all done; K.NEED_ROOM the map is full before batch `done`; else a framing error code.
        The caller keeps every offset below base_offset + MAX_RELATIVE_OFFSET."""
        n = len(area_start)
        i = reads = 0
        while i < n:
            done, size, r, err, pos, eb = K.map_batches(
                src, area_start[i:], area_end[i:], counts[i:], last_deltas[i:], base_offsets[i:], mappable[i:],
                np.int64(min_offset), np.int64(self.base_offset), self._tags, self._offs, self.bits,
                self.size, self.max_size)
            self.size = size
            reads += r
            i += done
            if err == 0:
                break
            if err == K.NEED_ROOM and self._grow():
                continue  # the batch is put again: puts are idempotent (an offset only grows)
            return i, reads, err, pos, i
        return n, reads, 0, 0, 0

    def put(self, keys, offsets) -> None:
        """Put keys (bytes, None skipped) with their offsets; raises if the map is full."""
        data, starts, lens = _flat_keys(keys)
        offsets = np.asarray(offsets, np.int64)
        rel = offsets - self.base_offset
        if len(rel) and (rel.min() < 0 or rel.max() >= MAX_RELATIVE_OFFSET):
            raise ValueError(f"offsets must be in [{self.base_offset}, {self.base_offset + MAX_RELATIVE_OFFSET})")
        i = 0
        while i < len(lens):
            done, self.size, st = K.put_keys(data, starts[i:], lens[i:], offsets[i:], np.int64(self.base_offset),
                                             self._tags, self._offs, self.bits, self.size, self.max_size)
            i += done
            if st and not self._grow():
                raise OverflowError(f"offset map full: {self.size} keys in {self.slots} slots "
                                    f"({self.memory} bytes of dedupe buffer)")
        if len(offsets):
            self.update_latest_offset(int(offsets.max()))

    def get(self, keys) -> np.ndarray:
        """Offsets mapped for keys (-1: absent)."""
        data, starts, lens = _flat_keys(keys)
        return K.get_keys(data, starts, lens, np.int64(self.base_offset), self._tags, self._offs, self.bits)

    @property
    def tables(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(tags, offsets, bits) for the cleaner's kernels."""
        return self._tags, self._offs, self.bits
