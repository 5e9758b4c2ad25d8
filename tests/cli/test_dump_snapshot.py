"""`kafkalog dump-log` on producer state snapshots: the lines of Kafka's DumpLogSegments.dumpProducerIdSnapshot
(Kafka 4.4: the entry's fields, then ` firstSequence: ..` only for an entry with a batch; no trailing space),
from hand-built files. tests/storage/transactions/test_kafka_producer_snapshots.py compares with Kafka's tool."""

from __future__ import annotations

import io
import struct

import crc32c

from kafkalog_ds.cli import main

NAME = "00000000000000000250.snapshot"


def snapshot_bytes(entries) -> bytes:
    body = struct.pack(">i", len(entries)) + b"".join(struct.pack(">qhiqiqiq", *e) for e in entries)
    return struct.pack(">hI", 1, crc32c.crc32c(body)) + body


def run(capsys, *argv):
    rc = main(list(argv), stdin=io.BytesIO())
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_lines(tmp_path, capsys):
    path = tmp_path / NAME
    path.write_bytes(
        snapshot_bytes(
            [
                (1000, 3, 41, 199, 4, 1_700_000_000_123, -1, -1),
                (1001, 0, 2, 220, 7, 1_700_000_000_456, 2, 213),  # firstSequence wraps: 2 - 7 -> 2147483643
                (1002, 5, -1, -1, 0, 1_700_000_000_789, 4, -1),  # no batch: the line ends at lastTimestamp
            ]
        )
    )
    rc, out, err = run(capsys, "dump-log", str(path))
    assert (rc, err) == (0, "")
    assert out.splitlines(keepends=True) == [
        f"Dumping {path}\n",
        "producerId: 1000 producerEpoch: 3 coordinatorEpoch: -1 currentTxnFirstOffset: OptionalLong.empty "
        "lastTimestamp: 1700000000123 firstSequence: 37 lastSequence: 41 lastOffset: 199 offsetDelta: 4 "
        "timestamp: 1700000000123\n",
        "producerId: 1001 producerEpoch: 0 coordinatorEpoch: 2 currentTxnFirstOffset: OptionalLong[213] "
        "lastTimestamp: 1700000000456 firstSequence: 2147483643 lastSequence: 2 lastOffset: 220 offsetDelta: 7 "
        "timestamp: 1700000000456\n",
        "producerId: 1002 producerEpoch: 5 coordinatorEpoch: 4 currentTxnFirstOffset: OptionalLong.empty "
        "lastTimestamp: 1700000000789\n",
    ]


def test_empty_snapshot_prints_only_its_header(tmp_path, capsys):
    path = tmp_path / NAME
    path.write_bytes(snapshot_bytes([]))
    assert run(capsys, "dump-log", "--files", str(path)) == (0, f"Dumping {path}\n", "")


def test_corrupt_snapshot_is_an_error_naming_file_and_position(tmp_path, capsys):
    good = tmp_path / "00000000000000000000.snapshot"
    good.write_bytes(snapshot_bytes([(1, 0, 0, 0, 0, 5, -1, -1)]))
    bad = tmp_path / NAME
    bad.write_bytes(snapshot_bytes([(1, 0, 0, 0, 0, 5, -1, -1)])[:-1])
    rc, out, err = run(capsys, "dump-log", str(bad), str(good))
    assert rc == 1
    assert f"corrupt producer snapshot {bad} at position 10" in err
    assert out.count("producerId: 1 ") == 1  # the next file is still dumped
