"""updated_crcs against a full CRC-32C of the edited bytes (the crc32c package), and kafka-python's check."""

import crc32c
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from storage.records.builder import encode_records
from storage.records.crc_update import updated_crcs
from storage.records.record_batch import ATTRIBUTES_OFFSET, CRC_OFFSET, RECORD_BATCH_OVERHEAD


def _full(batch: bytes) -> int:
    return crc32c.crc32c(batch[ATTRIBUTES_OFFSET:])


@settings(max_examples=60, deadline=None)
@given(
    body=st.binary(min_size=0, max_size=3000),
    edits=st.lists(
        st.tuples(st.integers(ATTRIBUTES_OFFSET, RECORD_BATCH_OVERHEAD - 1), st.integers(1, 255)), min_size=1
    ),
    damage=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_an_edit_inside_the_header_gives_the_crc_of_the_edited_batch(body, edits, damage):
    batch = bytearray(b"\x01" * RECORD_BATCH_OVERHEAD + body)
    stored = _full(batch)
    if damage is not None and body:  # a record byte damaged after the CRC was written
        batch[RECORD_BATCH_OVERHEAD + damage % len(body)] ^= 0x20
    old = np.frombuffer(bytes(batch[ATTRIBUTES_OFFSET:RECORD_BATCH_OVERHEAD]), np.uint8)
    for at, x in edits:
        batch[at] ^= x
    new = np.frombuffer(bytes(batch[ATTRIBUTES_OFFSET:RECORD_BATCH_OVERHEAD]), np.uint8)
    (got,) = updated_crcs(np.array([stored], np.uint32), old[None], new[None], np.array([len(batch)]))
    if damage is None or not body:
        assert int(got) == _full(batch)
    else:  # never laundered: the damaged batch still fails its check
        assert int(got) != _full(batch)


@pytest.mark.parametrize("size", [61, 62, (1 << 20) + 61, (5 << 19) + 7])
def test_batches_longer_than_the_zero_buffer(size):
    batch = bytearray(np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes())
    old = np.frombuffer(bytes(batch[ATTRIBUTES_OFFSET:RECORD_BATCH_OVERHEAD]), np.uint8)
    stored = _full(batch)
    batch[ATTRIBUTES_OFFSET] ^= 0x10
    batch[RECORD_BATCH_OVERHEAD - 5] ^= 0x7F
    new = np.frombuffer(bytes(batch[ATTRIBUTES_OFFSET:RECORD_BATCH_OVERHEAD]), np.uint8)
    (got,) = updated_crcs(np.array([stored], np.uint32), old[None], new[None], np.array([size]))
    assert int(got) == _full(batch)


def test_many_real_batches_at_once_pass_kafka_pythons_crc_check():
    rows = pa.table({"value": pa.array([b"v%05d" % i * (1 + i % 7) for i in range(3000)], pa.binary())})
    data, scan = encode_records(rows, max_batch_bytes=2000, producer_id=9, producer_epoch=0)
    buf = bytearray(data.tobytes())
    heads = scan.headers
    old = heads.view(np.uint8).reshape(len(heads), RECORD_BATCH_OVERHEAD)[:, ATTRIBUTES_OFFSET:].copy()
    new_heads = heads.copy()
    new_heads["attributes"] |= 0x10  # transactional
    new_heads["base_sequence"] = 12345
    new = new_heads.view(np.uint8).reshape(len(heads), RECORD_BATCH_OVERHEAD)[:, ATTRIBUTES_OFFSET:]
    crcs = updated_crcs(heads["crc"], old, new, scan.sizes)
    assert len(scan) > 20
    for i, pos in enumerate(scan.positions.tolist()):
        buf[pos + ATTRIBUTES_OFFSET : pos + RECORD_BATCH_OVERHEAD] = new[i].tobytes()
        buf[pos + CRC_OFFSET : pos + ATTRIBUTES_OFFSET] = int(crcs[i]).to_bytes(4, "big")
        batch = DefaultRecordBatch(bytes(buf[pos : pos + int(scan.sizes[i])]))
        assert batch.validate_crc() and batch.is_transactional and batch.base_sequence == 12345
