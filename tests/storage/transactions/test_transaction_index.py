"""TransactionIndex against hand-built `.txnindex` bytes (Kafka's 34-byte AbortedTxn layout): reading and its
checks, append order, collect_aborted as Kafka's collectAbortedTxns, truncate_to, on local disk and in memory."""

from __future__ import annotations

import struct

import pytest

from storage.errors import CorruptIndexError, InvalidOffsetError
from storage.log_dirs import open_filesystem
from storage.transactions.transaction_index import (
    ABORTED_TXN_SIZE,
    AbortedTxn,
    TransactionIndex,
)

BASE = 100


def entry(pid: int, first: int, last: int, lso: int, version: int = 0) -> bytes:
    return struct.pack(">hqqqq", version, pid, first, last, lso)


@pytest.fixture
def seg(any_root):
    """(fs, partition dir): a fresh partition directory on local disk or in memory."""
    fs, root = open_filesystem(any_root)
    d = fs.join(root, "t-0")
    fs.mkdirs(d)
    return fs, d


def index_with(seg, data: bytes, **options) -> TransactionIndex:
    fs, d = seg
    index = TransactionIndex.for_segment(fs, d, BASE, **options)
    fs.write_atomic(index.path, data)
    return index


def test_layout_and_name(seg):
    assert ABORTED_TXN_SIZE == 34 and len(entry(1, 2, 3, 4)) == 34
    index = index_with(seg, entry(5, 100, 120, 101) + entry(6, 105, 130, 105))
    assert index.path.endswith("/t-0/00000000000000000100.txnindex")
    assert index.all_aborted_txns() == [AbortedTxn(5, 100, 120, 101), AbortedTxn(6, 105, 130, 105)]
    assert str(index.all_aborted_txns()[0]) == (
        "AbortedTxn(producerId=5, firstOffset=100, lastOffset=120, lastStableOffset=101)"
    )
    assert index.last_offset == 130 and not index.is_empty
    index.sanity_check()


def test_missing_file_is_empty(seg):
    fs, d = seg
    index = TransactionIndex.for_segment(fs, d, BASE)
    assert index.is_empty and index.last_offset is None and index.all_aborted_txns() == []
    index.flush()
    assert not fs.exists(index.path)  # Kafka creates the file with its first entry


def test_partial_entry(seg):
    index = index_with(seg, entry(5, 100, 120, 101) + entry(6, 105, 130, 105)[:20])
    with pytest.raises(CorruptIndexError, match=r"partial entry at position 34 \(20 of 34 bytes\)") as e:
        index.all_aborted_txns()
    assert "00000000000000000100.txnindex" in str(e.value)


def test_bad_version(seg):
    index = index_with(seg, entry(5, 100, 120, 101) + entry(6, 105, 130, 105, version=1))
    with pytest.raises(CorruptIndexError, match=r"entry 1 at position 34: unexpected aborted transaction version 1"):
        index.all_aborted_txns()
    # the whole int16 counts (Kafka 4.4 reads a short): 0x0100 is version 256, not 1
    index = index_with(seg, entry(5, 100, 120, 101, version=256))
    with pytest.raises(CorruptIndexError, match=r"entry 0 at position 0: unexpected aborted transaction version 256"):
        index.all_aborted_txns()


def test_last_offsets_must_increase(seg):
    index = index_with(seg, entry(5, 100, 120, 101) + entry(6, 105, 130, 105) + entry(7, 110, 130, 110))
    with pytest.raises(CorruptIndexError, match=r"entry 2 at position 68: lastOffset 130 is not greater than .* 130"):
        index.all_aborted_txns()
    index = index_with(seg, entry(5, 100, 120, 101) + entry(6, 90, 110, 90))
    with pytest.raises(CorruptIndexError, match=r"entry 1 at position 34: lastOffset 110 is not greater than .* 120"):
        index.collect_aborted(0, 1000)


def test_last_offset_below_first(seg):
    index = index_with(seg, entry(5, 100, 120, 101) + entry(6, 140, 130, 105))
    with pytest.raises(CorruptIndexError, match=r"entry 1 at position 34: lastOffset 130 is below firstOffset 140"):
        index.all_aborted_txns()


def test_first_bad_entry_is_reported(seg):
    """Several faults: the error names the earliest entry at fault."""
    data = entry(5, 100, 120, 101) + entry(6, 140, 130, 105) + entry(7, 1, 2, 3, version=9) + b"\x00" * 3
    with pytest.raises(CorruptIndexError, match="entry 1 at position 34"):
        index_with(seg, data).all_aborted_txns()


def test_file_over_the_bound_is_not_read(seg, monkeypatch):
    fs, _ = seg
    index = index_with(seg, entry(5, 100, 120, 101) * 3, max_bytes=100)
    monkeypatch.setattr(type(fs), "read", lambda *a, **k: pytest.fail("read a file over the bound"))
    with pytest.raises(CorruptIndexError, match="102 bytes, more than the 100 bytes"):
        index.all_aborted_txns()


def test_sanity_check_against_the_base_offset(seg):
    index = index_with(seg, entry(5, 90, 99, 95))
    with pytest.raises(CorruptIndexError, match="is less than start offset 100"):
        index.sanity_check()


def test_append_flush_and_reopen(seg):
    fs, d = seg
    index = TransactionIndex.for_segment(fs, d, BASE)
    index.append(AbortedTxn(5, 100, 120, 101))
    index.append(AbortedTxn(6, 105, 130, 105))
    assert not fs.exists(index.path)  # held until flush, as the offset index does
    index.flush()
    index.append(AbortedTxn(7, 125, 131, 125))
    index.flush()
    index.close()
    assert fs.read(index.path) == entry(5, 100, 120, 101) + entry(6, 105, 130, 105) + entry(7, 125, 131, 125)
    again = TransactionIndex.for_segment(fs, d, BASE)
    assert [t.producer_id for t in again.all_aborted_txns()] == [5, 6, 7]


def test_append_out_of_order(seg):
    fs, d = seg
    index = index_with(seg, entry(5, 100, 120, 101))
    with pytest.raises(InvalidOffsetError, match="120 is not greater than current last offset 120"):
        index.append(AbortedTxn(6, 110, 120, 110))  # the file's last entry counts, after a reopen too
    with pytest.raises(InvalidOffsetError, match="ends before it begins"):
        index.append(AbortedTxn(6, 140, 130, 110))
    index.append(AbortedTxn(6, 110, 121, 110))
    with pytest.raises(InvalidOffsetError, match="119 is not greater than current last offset 121"):
        index.append(AbortedTxn(7, 110, 119, 110))
    index.flush()
    assert fs.read(index.path) == entry(5, 100, 120, 101) + entry(6, 110, 121, 110)


# Kafka's TransactionIndexTest.testCollectAbortedTransactions, and the completeness rule
TXNS = [
    AbortedTxn(0, 0, 10, 11),
    AbortedTxn(1, 5, 15, 13),
    AbortedTxn(2, 18, 35, 25),
    AbortedTxn(3, 32, 50, 40),
]


@pytest.mark.parametrize(
    ("fetch", "upper", "expect", "complete"),
    [
        (0, 32, TXNS[:3], True),  # 32 <= lastStableOffset 40 of the 4th: it is read, not collected (first >= 32)
        (0, 33, TXNS, True),
        (0, 41, TXNS, False),  # no lastStableOffset reaches 41: the next segment may hold an overlapping one
        (16, 33, TXNS[2:], True),
        (11, 12, TXNS[1:2], True),  # stops at the 2nd entry (lastStableOffset 13 >= 12)
        (51, 60, [], False),
        (0, 11, TXNS[:1], True),  # stops at the 1st (LSO 11 >= 11); the 2nd is not read although first 5 < 11
    ],
)
def test_collect_aborted(seg, fetch, upper, expect, complete):
    index = index_with(seg, b"".join(entry(*t) for t in TXNS))
    result = index.collect_aborted(fetch, upper)
    assert (result.aborted_transactions, result.is_complete) == (expect, complete)


def test_collect_aborted_sees_unflushed_appends(seg):
    fs, d = seg
    index = TransactionIndex.for_segment(fs, d, BASE)
    for t in TXNS:
        index.append(t)
    assert index.collect_aborted(16, 33).aborted_transactions == TXNS[2:]


@pytest.mark.parametrize(
    ("offset", "kept"),
    [(0, 0), (10, 0), (11, 1), (15, 1), (16, 2), (35, 2), (36, 3), (50, 3), (51, 4), (1000, 4)],
)
def test_truncate_to(seg, offset, kept):
    """Entries with lastOffset >= offset go, from memory and from the file; appends go on from there."""
    fs, _ = seg
    index = index_with(seg, b"".join(entry(*t) for t in TXNS))
    index.truncate_to(offset)
    assert index.all_aborted_txns() == TXNS[:kept]
    assert fs.size(index.path) == kept * 34
    index.append(AbortedTxn(9, 60, 61, 60))
    index.flush()
    assert fs.read(index.path) == b"".join(entry(*t) for t in [*TXNS[:kept], AbortedTxn(9, 60, 61, 60)])


def test_truncate_drops_unflushed_entries_too(seg):
    fs, d = seg
    index = TransactionIndex.for_segment(fs, d, BASE)
    index.append(TXNS[0])
    index.flush()
    index.append(TXNS[1])
    index.append(TXNS[2])
    index.truncate_to(16)
    index.flush()
    assert fs.read(index.path) == entry(*TXNS[0]) + entry(*TXNS[1])
    index.reset()
    assert index.is_empty and fs.size(index.path) == 0
    index.append(TXNS[3])
    index.flush()
    assert fs.read(index.path) == entry(*TXNS[3])
