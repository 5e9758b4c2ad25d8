"""Kafka's default partitioner for keyed records: (murmur2(key) & 0x7fffffff) % numPartitions.

murmur2 is Kafka's Utils.murmur2 (MurmurHash2, seed 0x9747b28c), so a key lands on the partition a
Java producer would choose. Written here as a numba kernel over Arrow's offsets and data buffers
because no library ships Kafka's variant of the hash in vectorized form.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..common.constants import INT32_MAX
from ..common.jit import njit

_SEED = np.uint64(0x9747B28C)
_M = np.uint64(0x5BD1E995)
_MASK32 = np.uint64(0xFFFFFFFF)
_R = np.uint64(24)
_S13 = np.uint64(13)
_S15 = np.uint64(15)
_S8 = np.uint64(8)
_S16 = np.uint64(16)


@njit(nogil=True)
def _murmur2_u32(data, start, end):  # pragma: no cover - jitted
    """Kafka's murmur2 of data[start:end] as an unsigned 32-bit value (all math in uint64, masked)."""
    length = end - start
    h = (_SEED ^ np.uint64(length)) & _MASK32
    n4 = length // 4
    for i in range(n4):
        p = start + 4 * i
        k = (
            np.uint64(data[p])
            | (np.uint64(data[p + 1]) << _S8)
            | (np.uint64(data[p + 2]) << _S16)
            | (np.uint64(data[p + 3]) << _R)
        )
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = start + 4 * n4
    rem = length - 4 * n4
    if rem == 3:
        h ^= np.uint64(data[tail + 2]) << _S16
    if rem >= 2:
        h ^= np.uint64(data[tail + 1]) << _S8
    if rem >= 1:
        h ^= np.uint64(data[tail])
        h = (h * _M) & _MASK32
    h ^= h >> _S13
    h = (h * _M) & _MASK32
    h ^= h >> _S15
    return h


@njit(nogil=True)
def _partition_kernel(
    offsets, data, validity, bit_offset, has_validity, num_partitions, null_start, out
):  # pragma: no cover - jitted
    """Fill out[i] for each key; returns -1 on success or the index of a key whose offsets are bad."""
    n = out.shape[0]
    data_len = data.shape[0]
    nulls = np.int64(0)
    for i in range(n):
        if has_validity:
            b = bit_offset + i
            if (validity[b >> 3] >> (b & 7)) & 1 == 0:
                out[i] = np.int32((null_start + nulls) % num_partitions)
                nulls += 1
                continue
        s = np.int64(offsets[i])
        e = np.int64(offsets[i + 1])
        if s < 0 or e < s or e > data_len:
            return i
        h = _murmur2_u32(data, s, e)
        out[i] = np.int32((h & np.uint64(0x7FFFFFFF)) % np.uint64(num_partitions))
    return -1


def murmur2(data: bytes | bytearray | memoryview | str) -> int:
    """Kafka's Utils.murmur2 as a signed int32 (a str is hashed as its UTF-8 bytes)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    arr = np.frombuffer(data, dtype=np.uint8) if len(data) else np.empty(0, np.uint8)
    h = int(_murmur2_u32(arr, 0, arr.shape[0]))
    return h - (1 << 32) if h >= (1 << 31) else h


def partition_for_key(key: bytes | str, num_partitions: int) -> int:
    """The partition Kafka's default partitioner gives one non-null key."""
    _check_num_partitions(num_partitions)
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


def _check_num_partitions(num_partitions) -> None:
    if (
        isinstance(num_partitions, bool)
        or not isinstance(num_partitions, (int, np.integer))
        or not 1 <= int(num_partitions) <= INT32_MAX
    ):
        raise ValueError(f"num_partitions must be an int in [1, 2**31-1], got {num_partitions!r}")


_OFFSET_DTYPES = {
    pa.binary(): np.int32,
    pa.string(): np.int32,
    pa.large_binary(): np.int64,
    pa.large_string(): np.int64,
}


def _chunk_partitions(arr: pa.Array, num_partitions: int, null_start: int, out: np.ndarray) -> int:
    """Partition one Arrow chunk into `out`; returns how many null keys it had."""
    n = len(arr)
    if n == 0:
        return 0
    if arr.type not in _OFFSET_DTYPES:
        arr = arr.cast(pa.large_binary())  # string_view / binary_view and friends
    validity_buf, offsets_buf, data_buf = arr.buffers()[:3]
    odt = _OFFSET_DTYPES[arr.type]
    offsets = np.frombuffer(offsets_buf, dtype=odt)
    if offsets.shape[0] < arr.offset + n + 1:
        raise ValueError(f"key array offsets buffer too short ({offsets.shape[0]} for {arr.offset + n + 1})")
    offsets = offsets[arr.offset : arr.offset + n + 1]  # slices share buffers; arr.offset is in elements
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None and data_buf.size else np.empty(0, np.uint8)
    has_validity = validity_buf is not None and arr.null_count > 0
    validity = np.frombuffer(validity_buf, dtype=np.uint8) if has_validity else np.empty(1, np.uint8)
    if has_validity and validity.shape[0] * 8 < arr.offset + n:
        raise ValueError("key array validity bitmap too short")
    bad = _partition_kernel(offsets, data, validity, arr.offset, has_validity, num_partitions, null_start, out)
    if bad >= 0:
        raise ValueError(f"key array has invalid offsets at index {bad}")
    return arr.null_count


def partition_for_keys(keys, num_partitions: int, *, null_key_start: int = 0) -> np.ndarray:
    """Kafka's partition for each key of an Arrow binary/string array (or chunked array), as int32.

    Non-null keys: (murmur2(key) & 0x7fffffff) % num_partitions, as a Java producer would place them.
    Null keys: Kafka's sticky partitioner picks per producer batch; we spread them evenly instead,
    round-robin in array order: the j-th null key goes to (null_key_start + j) % num_partitions.
    To continue the rotation in a later call, pass null_key_start + (number of nulls seen).
    """
    _check_num_partitions(num_partitions)
    num_partitions = int(num_partitions)
    if isinstance(null_key_start, bool) or not isinstance(null_key_start, (int, np.integer)) or null_key_start < 0:
        raise ValueError(f"null_key_start must be a non-negative int, got {null_key_start!r}")
    null_start = int(null_key_start) % num_partitions
    if not isinstance(keys, (pa.Array, pa.ChunkedArray)):
        keys = pa.array(keys)
    if pa.types.is_dictionary(keys.type):
        keys = keys.cast(keys.type.value_type)
    if not (
        pa.types.is_binary(keys.type)
        or pa.types.is_string(keys.type)
        or pa.types.is_large_binary(keys.type)
        or pa.types.is_large_string(keys.type)
        or pa.types.is_binary_view(keys.type)
        or pa.types.is_string_view(keys.type)
        or pa.types.is_null(keys.type)
    ):
        raise TypeError(f"keys must be an Arrow binary or string array, got {keys.type}")
    out = np.empty(len(keys), dtype=np.int32)
    if pa.types.is_null(keys.type):  # every key null
        out[:] = (null_start + np.arange(len(keys), dtype=np.int64)) % num_partitions
        return out
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    pos = 0
    for chunk in chunks:  # per chunk, not per record
        n = len(chunk)
        nulls = _chunk_partitions(chunk, num_partitions, null_start, out[pos : pos + n])
        null_start = (null_start + nulls) % num_partitions
        pos += n
    return out
