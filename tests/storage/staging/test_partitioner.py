import random

import numpy as np
import pyarrow as pa
import pytest
from kafka.partitioner.default import murmur2 as kp_murmur2  # kafka-python's port of Utils.murmur2

from storage.staging.partitioner import murmur2, partition_for_key, partition_for_keys

# Kafka's own vectors: clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def _signed(u):
    return u - (1 << 32) if u >= (1 << 31) else u


def _kp_partition(key: bytes, n: int) -> int:
    return (kp_murmur2(key) & 0x7FFFFFFF) % n


def _random_keys(rng, count):
    keys = [b"", b"\x00", b"\xff", b"ab", b"abc", b"\x80\x81\x82", b"\xff\xff\xff\xff"]
    for _ in range(count):
        n = rng.choice([rng.randint(0, 8), rng.randint(0, 64), rng.randint(0, 600)])
        keys.append(bytes(rng.getrandbits(8) for _ in range(n)))
    return keys


@pytest.mark.parametrize("key,expected", list(KAFKA_VECTORS.items()))
def test_kafka_vectors(key, expected):
    assert murmur2(key) == expected
    assert murmur2(key.decode()) == expected
    assert _signed(kp_murmur2(key)) == expected  # the reference agrees too


def test_scalar_matches_kafka_python_on_random_keys():
    rng = random.Random(1234)
    for key in _random_keys(rng, 500):
        assert murmur2(key) == _signed(kp_murmur2(key)), key
        assert murmur2(bytearray(key)) == murmur2(memoryview(key)) == murmur2(key)


def test_every_tail_length():
    base = bytes(range(1, 40))
    for n in range(len(base)):
        assert murmur2(base[:n]) == _signed(kp_murmur2(base[:n])), n


@pytest.mark.parametrize("num_partitions", [1, 2, 3, 7, 12, 100, 1009, 2**31 - 1])
def test_vectorized_matches_kafka_python(num_partitions):
    rng = random.Random(num_partitions)
    keys = _random_keys(rng, 800)
    got = partition_for_keys(pa.array(keys, pa.binary()), num_partitions)
    assert got.dtype == np.int32 and got.shape == (len(keys),)
    expected = np.array([_kp_partition(k, num_partitions) for k in keys], dtype=np.int32)
    np.testing.assert_array_equal(got, expected)
    assert partition_for_key(keys[-1], num_partitions) == expected[-1]


def test_unicode_strings_hash_their_utf8_bytes():
    words = ["", "a", "é", "日本語", "ключ", "emoji-😀", "mixed ascii ü 中", "\u0000nul", "𝔘𝔫𝔦"]
    rng = random.Random(7)
    words += [
        "".join(
            chr(
                rng.choice(
                    [
                        rng.randint(32, 126),
                        rng.randint(0x80, 0x7FF),
                        rng.randint(0x800, 0xD7FF),
                        rng.randint(0x10000, 0x10FFFF),
                    ]
                )
            )
            for _ in range(rng.randint(0, 20))
        )
        for _ in range(300)
    ]
    for typ in (pa.string(), pa.large_string(), pa.string_view()):
        got = partition_for_keys(pa.array(words, typ), 13)
        expected = [_kp_partition(w.encode("utf-8"), 13) for w in words]
        assert got.tolist() == expected, typ
    assert murmur2("日本語") == _signed(kp_murmur2("日本語".encode()))


def _expected_with_nulls(keys, n, start=0):
    out, j = [], 0
    for k in keys:
        if k is None:
            out.append((start + j) % n)
            j += 1
        else:
            out.append(_kp_partition(k, n))
    return out


def test_null_keys_round_robin():
    keys = [b"k1", None, None, b"k2", None, None, None, b"", None]
    arr = pa.array(keys, pa.binary())
    assert partition_for_keys(arr, 4).tolist() == _expected_with_nulls(keys, 4)
    assert partition_for_keys(arr, 4, null_key_start=3).tolist() == _expected_with_nulls(keys, 4, 3)
    assert partition_for_keys(arr, 4, null_key_start=11).tolist() == _expected_with_nulls(keys, 4, 11)
    nulls = partition_for_keys(pa.array([None] * 9, pa.binary()), 3)
    assert nulls.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2]  # evenly spread
    assert partition_for_keys(pa.nulls(5), 2, null_key_start=1).tolist() == [1, 0, 1, 0, 1]


def test_slices_with_unaligned_offsets_and_nulls():
    rng = random.Random(99)
    keys = [
        None if rng.random() < 0.3 else bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 12))) for _ in range(200)
    ]
    for typ in (pa.binary(), pa.large_binary()):
        arr = pa.array(keys, typ)
        for start, length in [(0, 200), (1, 50), (3, 17), (7, 0), (13, 187), (199, 1), (64, 64)]:
            sl = arr.slice(start, length)
            assert sl.offset == start
            got = partition_for_keys(sl, 11, null_key_start=5)
            assert got.tolist() == _expected_with_nulls(keys[start : start + length], 11, 5), (typ, start, length)


def test_chunked_arrays_continue_the_null_rotation():
    keys = [b"a", None, None, b"b", None, b"c", None, None, None]
    chunked = pa.chunked_array(
        [
            pa.array(keys[:2], pa.binary()),
            pa.array([], pa.binary()),
            pa.array(keys[2:5], pa.binary()),
            pa.array(keys[5:], pa.binary()),
        ]
    )
    assert partition_for_keys(chunked, 5, null_key_start=2).tolist() == _expected_with_nulls(keys, 5, 2)


def test_other_inputs():
    keys = [b"x", b"yy", None, b"zzz"]
    expected = _expected_with_nulls(keys, 6)
    assert partition_for_keys(keys, 6).tolist() == expected  # a Python list goes through pa.array
    dict_arr = pa.array(keys, pa.binary()).dictionary_encode()
    assert partition_for_keys(dict_arr, 6).tolist() == expected
    assert partition_for_keys(pa.array([], pa.binary()), 6).tolist() == []
    assert partition_for_keys(pa.chunked_array([], pa.string()), 6).tolist() == []
    assert partition_for_keys(pa.array([b"k"] * 10), 1).tolist() == [0] * 10


def test_all_empty_keys_without_data_buffer():
    arr = pa.array([b"", b"", None], pa.binary())
    assert partition_for_keys(arr, 7).tolist() == [_kp_partition(b"", 7)] * 2 + [0]


def test_bad_arguments():
    arr = pa.array([b"a"])
    for n in (0, -1, 2**31, 1.5, True):
        with pytest.raises(ValueError, match="num_partitions"):
            partition_for_keys(arr, n)
    with pytest.raises(ValueError, match="null_key_start"):
        partition_for_keys(arr, 3, null_key_start=-1)
    with pytest.raises(TypeError, match="binary or string"):
        partition_for_keys(pa.array([1, 2, 3]), 3)
    with pytest.raises(ValueError, match="num_partitions"):
        partition_for_key(b"a", 0)


def test_kernel_bounds_checks_offsets():
    # pyarrow validates arrays it builds, so drive the kernel directly with offsets a hostile
    # producer of Arrow buffers could hand us: past the data, and decreasing.
    from storage.staging.partitioner import _partition_kernel

    data = np.frombuffer(b"abcd", np.uint8)
    out = np.zeros(2, np.int32)
    no_validity = np.empty(1, np.uint8)
    for offsets in ([0, 2, 50], [0, 3, 1], [-1, 2, 3]):
        bad = _partition_kernel(np.array(offsets, np.int32), data, no_validity, 0, False, 3, 0, out)
        assert bad == (0 if offsets[0] < 0 else 1)
    ok = _partition_kernel(np.array([0, 2, 4], np.int64), data, no_validity, 0, False, 3, 0, out)
    assert ok == -1 and out.tolist() == [_kp_partition(b"ab", 3), _kp_partition(b"cd", 3)]


def test_large_batch_matches_scalar():
    rng = np.random.default_rng(5)
    lens = rng.integers(0, 40, size=20000)
    data = rng.integers(0, 256, size=int(lens.sum()), dtype=np.uint8).tobytes()
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    arr = pa.Array.from_buffers(pa.binary(), len(lens), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])
    got = partition_for_keys(arr, 64)
    sample = rng.choice(len(lens), size=300, replace=False)
    for i in sample:
        key = data[offsets[i] : offsets[i + 1]]
        assert got[i] == _kp_partition(key, 64)
    counts = np.bincount(got, minlength=64)
    assert counts.min() > 0  # every partition gets keys


def test_the_stager_routes_keyed_rows_around_explicit_partitions_and_rotates_null_keys(tmp_path):
    """RecordStager: rows with a partition go there; the others by murmur2, their null keys round-robin across
    chunks of the task (counted over the keyed rows only), as a brute-force model places them."""
    from storage.log_manager import LogManager
    from storage.records.record_batch import CompressionType
    from storage.staging.record_stager import RecordStager
    from storage.staging.staged_commit import commit_staged
    from storage.topic_partition import TopicPartition

    lm = LogManager(str(tmp_path))
    lm.create_topic("t", 3)
    rows = []
    for i in range(40):
        key = None if i % 3 == 0 else f"k{i}".encode()
        part = i % 3 if i % 4 == 0 else None
        rows.append((key, f"v{i}".encode(), part))
    st = RecordStager(lm, 5, topic="t", compression=CompressionType.NONE)
    for lo in (0, 20):  # two add() calls: the null-key rotation carries over
        chunk = rows[lo : lo + 20]
        st.add(
            pa.table(
                {
                    "key": pa.array([r[0] for r in chunk], pa.binary()),
                    "value": pa.array([r[1] for r in chunk], pa.binary()),
                    "partition": pa.array([r[2] for r in chunk], pa.int32()),
                }
            )
        )
        st._drain()
    commit_staged(lm, 5, 0, [st.finish()])
    want: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    nulls = 0
    for key, value, part in rows:
        if part is None:
            if key is None:
                part, nulls = nulls % 3, nulls + 1
            else:
                part = partition_for_key(key, 3)
        want[part].append(value)
    for p in range(3):
        with lm.open_log(TopicPartition("t", p)) as log:
            got = [v for b in log.read_records(0) for v in b.column("value").to_pylist()]
        assert got == want[p], p
