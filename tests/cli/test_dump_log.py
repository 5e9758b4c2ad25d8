"""`kafkalog dump-log` against Kafka's DumpLogSegments output shape, cross-checked with kafka-python's
parse of the same bytes, and its reports on damaged files."""

from __future__ import annotations

import io
import json
import os
import re
import struct
import uuid

import crc32c
import numpy as np
import pyarrow as pa
import pytest
from kafka.record.memory_records import MemoryRecords

from kafkalog_ds.cli import main
from storage.records.builder import build_records
from storage.records.record_batch import CONTROL_FLAG_MASK, CRC_OFFSET, compute_crc

SEG = "00000000000000000000"
BATCH_RE = re.compile(
    r"baseOffset: (-?\d+) lastOffset: (-?\d+) count: (\d+) baseSequence: (-?\d+) lastSequence: (-?\d+) "
    r"producerId: (-?\d+) producerEpoch: (-?\d+) partitionLeaderEpoch: (-?\d+) isTransactional: (true|false) "
    r"isControl: (true|false) deleteHorizonMs: (OptionalLong\.empty|OptionalLong\[-?\d+\]) position: (\d+) "
    r"(CreateTime|LogAppendTime): (-?\d+) size: (\d+) magic: (\d+) compresscodec: (\w+) crc: (\d+) "
    r"isvalid: (true|false)$"
)
RECORD_RE = re.compile(
    r"\| offset: (\d+) (CreateTime|LogAppendTime): (-?\d+) keySize: (-?\d+) valueSize: (-?\d+) "
    r"sequence: (-?\d+) headerKeys: \[([^\]]*)\]"
)


def run(capsys, *argv, stdin: bytes = b""):
    rc = main(list(argv), stdin=io.BytesIO(stdin))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def produce(capsys, root, topic, records, *extra):
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    rc, out, err = run(capsys, "produce", root, "--topic", topic, *extra, stdin=data)
    assert rc == 0, err
    return out


def segment(root, topic, partition=0, base=0, suffix=".log"):
    return os.path.join(root, f"{topic}-{partition}", f"{base:020d}{suffix}")


def write_segment(tmp_path, data: bytes, base: int = 0) -> str:
    d = tmp_path / f"seg-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    path = d / f"{base:020d}.log"
    path.write_bytes(data)
    return str(path)


# ---------------------------------------------------------------- the seed's example


def test_seed_example_is_84_bytes_and_prints_like_kafka(capsys, root):
    produce(capsys, root, "demo", [{"key": "DemoKey", "value": "DemoValue", "timestamp": 1599887411245}])
    log = segment(root, "demo")
    rc, out, err = run(capsys, "dump-log", log, "--print-data-log")
    assert rc == 0 and err == ""
    assert out.splitlines() == [
        f"Dumping {log}",
        "Log starting offset: 0",
        "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 "
        "partitionLeaderEpoch: 0 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty "
        "position: 0 CreateTime: 1599887411245 size: 84 magic: 2 compresscodec: none crc: 3888717251 isvalid: true",
        "| offset: 0 CreateTime: 1599887411245 keySize: 7 valueSize: 9 sequence: -1 headerKeys: [] "
        "key: DemoKey payload: DemoValue",
    ]
    # shallow iteration prints only the batch line; --skip-record-metadata keeps Kafka's odd prefixes
    rc, out, _ = run(capsys, "dump-log", log)
    assert len(out.splitlines()) == 3 and "size: 84" in out
    rc, out, _ = run(capsys, "dump-log", log, "--print-data-log", "--skip-record-metadata")
    assert out.splitlines()[-1] == "| key: DemoKey payload: DemoValue"


# ---------------------------------------------------------------- cross-check with kafka-python


def _records(n, seed=3):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        key = None if i % 7 == 3 else f"user-{i % 13}"
        value = None if i % 11 == 5 else "event " * int(rng.integers(0, 30)) + str(i)
        headers = [["trace", f"t{i}"], ["nothing", None]][: i % 3]
        out.append(
            {
                "key": key,
                "value": value,
                "timestamp": 1_700_000_000_000 + int(rng.integers(-5000, 5000)),
                "headers": headers,
            }
        )
    return out


def _kp_batches(path):
    data = open(path, "rb").read()
    recs = MemoryRecords(data)
    out, pos = [], 0
    while recs.has_next():
        b = recs.next_batch()
        valid = b.validate_crc()  # before iterating, as kafka-python requires
        records = list(b)
        out.append(
            dict(
                base=b.base_offset,
                last=b.last_offset,
                count=b.records_count,
                crc=b.crc,
                size=b.size_in_bytes,
                position=pos,
                max_ts=b.max_timestamp,
                codec=b.compression_type,
                valid=valid,
                records=[(r.offset, r.timestamp, r.key, r.value, [h[0] for h in r.headers]) for r in records],
            )
        )
        pos += b.size_in_bytes
    return out


CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def _parse_dump(out: str):
    batches = []
    for line in out.splitlines():
        m = BATCH_RE.match(line)
        if m:
            g = m.groups()
            batches.append(
                dict(
                    base=int(g[0]),
                    last=int(g[1]),
                    count=int(g[2]),
                    position=int(g[11]),
                    max_ts=int(g[13]),
                    size=int(g[14]),
                    codec=g[16],
                    crc=int(g[17]),
                    valid=g[18] == "true",
                    records=[],
                )
            )
            continue
        m = RECORD_RE.match(line)
        if m:
            g = m.groups()
            batches[-1]["records"].append((int(g[0]), int(g[2]), int(g[3]), int(g[4]), g[6].split(",") if g[6] else []))
    return batches


@pytest.mark.parametrize("block", [False, True])
def test_dump_matches_kafka_python_parse(capsys, root, block):
    # several codecs in one segment, batches of varying size; big values make batches cross the
    # reader's 64 KiB first chunk and (block=True) exceed it as a single batch
    records = _records(300)
    if block:
        for r in records[::40]:
            r["value"] = "x" * 150_000
    for i, codec in enumerate(["none", "gzip", "snappy", "lz4", "zstd", "none"]):
        produce(capsys, root, "t", records[i * 50 : (i + 1) * 50], "--compression", codec, "--batch-size", str(7 + i))
    log = segment(root, "t")
    rc, out, err = run(capsys, "dump-log", log, "--deep-iteration")
    assert rc == 0 and err == ""
    got = _parse_dump(out)
    want = _kp_batches(log)
    assert len(got) == len(want) > 30
    for g, w in zip(got, want, strict=False):
        for k in ("base", "last", "count", "crc", "size", "position", "max_ts", "valid"):
            assert g[k] == w[k], k
        assert g["codec"] == CODEC_NAMES[w["codec"]]
        assert [(o, t, ks, vs, hk) for o, t, ks, vs, hk in g["records"]] == [
            (o, t, -1 if k is None else len(k), -1 if v is None else len(v), hk) for o, t, k, v, hk in w["records"]
        ]
    assert {g["codec"] for g in got} == set(CODEC_NAMES.values())


def test_print_data_log_prints_keys_and_payloads(capsys, root):
    produce(
        capsys,
        root,
        "t",
        [
            {"key": "k", "value": "v", "timestamp": 5},
            {"key": None, "value": "only"},
            {"key": "tomb", "value": None},
            {"key": None, "value": None},
        ],
    )
    rc, out, _ = run(capsys, "dump-log", segment(root, "t"), "--print-data-log")
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert lines[0].endswith("headerKeys: [] key: k payload: v")
    assert lines[1].endswith("headerKeys: [] payload: only")  # Kafka prints no key for a null key
    assert lines[2].endswith("headerKeys: [] key: tomb")  # nor a payload for a tombstone
    assert lines[3].endswith("headerKeys: []")


def test_producer_fields_sequences_control_and_delete_horizon(capsys, tmp_path):
    t = pa.table(
        {"key": [b"a", b"b", b"c"], "value": [b"1", b"2", b"3"], "timestamp": pa.array([10, 30, 20], pa.int64())}
    )
    # producer batch whose sequence wraps past Integer.MAX_VALUE, then a delete-horizon batch
    b1 = build_records(
        t, producer_id=77, producer_epoch=3, base_sequence=2**31 - 2, is_transactional=True, partition_leader_epoch=4
    )
    b2 = bytearray(build_records(t.slice(0, 1), base_offset=3, delete_horizon_ms=123456, partition_leader_epoch=4))
    # a COMMIT marker: key (version 0, type 1), value (version 0, coordinatorEpoch 9), control bit set
    marker = pa.table(
        {"key": [b"\x00\x00\x00\x01"], "value": [b"\x00\x00\x00\x00\x00\x09"], "timestamp": pa.array([40], pa.int64())}
    )
    b3 = bytearray(build_records(marker, base_offset=4, producer_id=77, producer_epoch=3, is_transactional=True))
    struct.pack_into(">h", b3, 21, struct.unpack_from(">h", b3, 21)[0] | CONTROL_FLAG_MASK)
    struct.pack_into(">I", b3, CRC_OFFSET, compute_crc(b3))
    path = write_segment(tmp_path, bytes(b1) + bytes(b2) + bytes(b3))
    rc, out, err = run(capsys, "dump-log", path, "--print-data-log")
    assert rc == 0, err
    kp = _kp_batches(path)
    lines = out.splitlines()
    first = BATCH_RE.match(lines[2]).groups()
    kb = MemoryRecords(open(path, "rb").read()).next_batch()
    assert (int(first[3]), int(first[4])) == (kb.base_sequence, kb.last_sequence) == (2**31 - 2, 0)
    assert first[5:10] == ("77", "3", "4", "true", "false") and first[12:14] == ("CreateTime", "30")
    seqs = [int(RECORD_RE.match(ln).group(6)) for ln in lines[3:6]]
    assert seqs == [2**31 - 2, 2**31 - 1, 0]
    assert "deleteHorizonMs: OptionalLong[123456]" in lines[6]
    assert BATCH_RE.match(lines[8]).group(10) == "true"
    assert lines[9] == (
        "| offset: 4 CreateTime: 40 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] "
        "endTxnMarker: COMMIT coordinatorEpoch: 9"
    )  # no key/payload for control records
    assert [b["crc"] for b in kp] == [int(BATCH_RE.match(lines[i]).group(18)) for i in (2, 6, 8)]


def test_log_append_time_topic(capsys, root):
    assert (
        run(capsys, "topics", root, "--create", "--topic", "lat", "--config", "message.timestamp.type=LogAppendTime")[0]
        == 0
    )
    produce(capsys, root, "lat", [{"key": "a", "value": "b", "timestamp": 5}])
    rc, out, _ = run(capsys, "dump-log", segment(root, "lat"), "--deep-iteration")
    batch = BATCH_RE.match(out.splitlines()[2])
    assert batch.group(13) == "LogAppendTime" and int(batch.group(14)) > 5
    assert RECORD_RE.match(out.splitlines()[3]).group(2, 3) == ("LogAppendTime", batch.group(14))


# ---------------------------------------------------------------- indexes


def _index_entries(path):
    data = open(path, "rb").read()
    return [struct.unpack_from(">ii", data, i) for i in range(0, len(data) - len(data) % 8, 8)]


def _time_entries(path):
    data = open(path, "rb").read()
    return [struct.unpack_from(">qi", data, i) for i in range(0, len(data) - len(data) % 12, 12)]


@pytest.fixture
def indexed(capsys, root):
    """A partition of several segments with dense indexes and timestamps that go backwards."""
    rng = np.random.default_rng(11)
    assert (
        run(
            capsys,
            "topics",
            root,
            "--create",
            "--topic",
            "ix",
            "--config",
            "segment.bytes=3000",
            "--config",
            "index.interval.bytes=150",
        )[0]
        == 0
    )
    ts = 1_000_000 + np.cumsum(rng.integers(-40, 60, 400))
    for start in range(0, 400, 50):  # several appends: each may roll segments
        produce(
            capsys,
            root,
            "ix",
            [
                {"key": f"k{i}", "value": "v" * int(rng.integers(0, 40)), "timestamp": int(ts[i])}
                for i in range(start, start + 50)
            ],
            "--batch-size",
            "3",
        )
    d = os.path.join(root, "ix-0")
    bases = sorted(int(f[:20]) for f in os.listdir(d) if f.endswith(".log"))
    assert len(bases) >= 4
    return d, bases


def test_index_and_time_index_dump_equal_their_entries(capsys, indexed):
    d, bases = indexed
    checked = 0
    for base in bases:
        idx = os.path.join(d, f"{base:020d}.index")
        tix = os.path.join(d, f"{base:020d}.timeindex")
        rc, out, err = run(capsys, "dump-log", idx, tix)
        assert rc == 0 and err == ""
        lines = out.splitlines()
        entries = _index_entries(idx)
        tentries = _time_entries(tix)
        if entries:
            assert lines[1 : 1 + len(entries)] == [f"offset: {base + r} position: {p}" for r, p in entries]
        else:
            assert lines[1] == f"{idx} is empty."
        assert lines[-len(tentries) :] == [f"timestamp: {t} offset: {base + r}" for t, r in tentries]
        checked += len(entries) + len(tentries)
        # Kafka's entries point at batches whose last offset is the entry's offset
        kp = {b["position"]: b for b in _kp_batches(os.path.join(d, f"{base:020d}.log"))}
        for r, p in entries:
            assert kp[p]["last"] == base + r
    assert checked > 20


def test_index_mismatches_are_reported_like_kafka(capsys, indexed):
    d, bases = indexed
    base = bases[1]
    idx = os.path.join(d, f"{base:020d}.index")
    entries = _index_entries(idx)
    assert len(entries) >= 3
    data = bytearray(open(idx, "rb").read())
    struct.pack_into(">i", data, 8 + 4, entries[0][1])  # entry 1 points at entry 0's batch
    struct.pack_into(">i", data, 16 + 4, 10**8)  # entry 2 points past the end of the log
    open(idx, "wb").write(data)
    kp = {b["position"]: b for b in _kp_batches(os.path.join(d, f"{base:020d}.log"))}
    rc, out, err = run(capsys, "dump-log", idx, "--verify-index-only")
    assert rc == 0 and out.splitlines() == [f"Dumping {idx}"]
    assert err.splitlines() == [
        f"Mismatches in :{os.path.abspath(idx)}",
        f"  Index offset: {base + entries[2][0]}, log offset: -1",  # Kafka lists the newest first
        f"  Index offset: {base + entries[1][0]}, log offset: {kp[entries[0][1]]['last']}",
    ]


def test_time_index_errors_are_reported_like_kafka(capsys, indexed):
    d, bases = indexed
    base = bases[0]
    tix = os.path.join(d, f"{base:020d}.timeindex")
    t = _time_entries(tix)
    assert len(t) >= 3
    data = bytearray(open(tix, "rb").read())
    struct.pack_into(">q", data, 0, t[0][0] - 1)  # timestamp that no record has
    struct.pack_into(">q", data, 12, t[0][0] - 5)  # ... and goes backwards
    struct.pack_into(">i", data, 24 + 8, t[2][1] - 1)  # an offset that is no batch's last offset
    open(tix, "wb").write(data)
    rc, out, err = run(capsys, "dump-log", tix)
    assert rc == 0
    assert f"timestamp: {t[0][0] - 1} offset: {base + t[0][1]}" in out.splitlines()
    abs_name = os.path.abspath(tix)
    lines = err.splitlines()
    assert lines[0] == f"Found timestamp mismatch in :{abs_name}"
    assert f"  Index timestamp: {t[0][0] - 1}, log timestamp: {t[0][0]}" in lines
    assert f"Found out of order timestamp in :{abs_name}" in lines
    assert f"  Index timestamp: {t[0][0] - 5}, Previously indexed timestamp: {t[0][0] - 1}" in lines
    assert "The following indexed offsets are not found in the log." in lines
    assert any(ln.startswith(f"Indexed offset: {base + t[2][1] - 1}, found log offset: ") for ln in lines)


def test_index_sanity_check(capsys, indexed):
    d, bases = indexed
    idx = os.path.join(d, f"{bases[0]:020d}.index")
    tix = os.path.join(d, f"{bases[0]:020d}.timeindex")
    rc, out, _ = run(capsys, "dump-log", idx, tix, "--index-sanity-check")
    assert rc == 0 and out.splitlines()[1] == f"{idx} passed sanity check."
    assert out.splitlines()[3] == f"{tix} passed sanity check."
    with open(idx, "ab") as f:
        f.write(b"\x00\x00\x00")  # not a multiple of the entry size
    rc, out, err = run(capsys, "dump-log", idx, "--index-sanity-check")
    assert rc == 1 and err.startswith("kafkalog: error: ") and "entry size 8" in err


def test_preallocated_index_stops_at_first_zero_entry(capsys, tmp_path):
    t = pa.table({"value": [b"x" * 100] * 3})
    data = b"".join(build_records(t.slice(i, 1), base_offset=i) for i in range(3))
    log = write_segment(tmp_path, data, base=0)
    idx = log[:-4] + ".index"
    open(idx, "wb").write(struct.pack(">ii", 0, 0) + struct.pack(">ii", 1, len(data) // 3) + b"\x00" * 80)
    rc, out, err = run(capsys, "dump-log", idx)
    assert rc == 0 and err == ""
    assert out.splitlines()[1:] == ["offset: 0 position: 0", f"offset: 1 position: {len(data) // 3}"]


def test_txn_index(capsys, tmp_path):
    path = tmp_path / f"{SEG}.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 0, 5, 10, 20, 15) + struct.pack(">hqqqq", 0, 6, 30, 31, 31))
    rc, out, _ = run(capsys, "dump-log", str(path))
    assert rc == 0 and out.splitlines()[1:] == [
        "version: 0 producerId: 5 firstOffset: 10 lastOffset: 20 lastStableOffset: 15",
        "version: 0 producerId: 6 firstOffset: 30 lastOffset: 31 lastStableOffset: 31",
    ]


@pytest.mark.parametrize(
    ("tail", "problem"),
    [
        (struct.pack(">hqqqq", 0, 6, 30, 31, 31)[:33], "partial entry at position 34 (33 of 34 bytes)"),
        (struct.pack(">hqqqq", 1, 6, 30, 31, 31), "entry 1 at position 34: unexpected aborted transaction version 1"),
        (struct.pack(">hqqqq", 0, 6, 15, 20, 15), "entry 1 at position 34: lastOffset 20 is not greater than"),
    ],
)
def test_damaged_txn_index_prints_the_entries_before_the_damage(capsys, tmp_path, tail, problem):
    path = tmp_path / f"{SEG}.txnindex"
    path.write_bytes(struct.pack(">hqqqq", 0, 5, 10, 20, 15) + tail)
    rc, out, err = run(capsys, "dump-log", str(path))
    assert rc == 1 and out.splitlines()[1:] == [
        "version: 0 producerId: 5 firstOffset: 10 lastOffset: 20 lastStableOffset: 15"
    ]
    assert err.startswith("kafkalog: error: ") and problem in err and str(path) in err


# ---------------------------------------------------------------- damaged files


def test_crc_failure_prints_isvalid_false(capsys, tmp_path):
    t = pa.table({"key": [b"k"] * 3, "value": [b"value-%d" % i for i in range(3)]})
    first = build_records(t.slice(0, 1))
    data = bytearray(first + build_records(t.slice(1, 2), base_offset=1))
    p = len(first)
    data[p + 70] ^= 0x01  # a byte inside the second batch's records: under its CRC
    path = write_segment(tmp_path, bytes(data))
    rc, out, err = run(capsys, "dump-log", path)
    assert rc == 0 and err == ""  # as Kafka: a bad CRC is reported, not fatal
    valid = [BATCH_RE.match(ln).group(19) for ln in out.splitlines()[2:]]
    assert valid == ["true", "false"]
    crc_stored = struct.unpack_from(">I", data, p + CRC_OFFSET)[0]
    assert f"position: {p} " in out and f"crc: {crc_stored} isvalid: false" in out
    assert crc32c.crc32c(bytes(data[p + 21 :])) != crc_stored


def test_impossible_batch_length_names_file_and_position(capsys, tmp_path):
    t = pa.table({"value": [b"abc"] * 2})
    data = bytearray(build_records(t.slice(0, 1)) + build_records(t.slice(1, 1), base_offset=1))
    size = len(data) // 2
    struct.pack_into(">i", data, size + 8, 7)  # batchLength 7 < 49
    path = write_segment(tmp_path, bytes(data))
    rc, out, err = run(capsys, "dump-log", path)
    assert rc == 1
    assert len([ln for ln in out.splitlines() if BATCH_RE.match(ln)]) == 1
    assert err.startswith("kafkalog: error: ") and path in err and f"position {size}" in err
    assert "batchLength 7" in err and "Traceback" not in err


def test_torn_tail_reported_as_invalid_bytes(capsys, tmp_path):
    t = pa.table({"value": [b"abc"] * 2})
    data = build_records(t.slice(0, 1)) + build_records(t.slice(1, 1), base_offset=1)
    path = write_segment(tmp_path, data[:-10])
    rc, out, err = run(capsys, "dump-log", path)
    assert rc == 0 and err == ""
    assert out.splitlines()[-1] == f"Found {len(data) // 2 - 10} invalid bytes at the end of {SEG}.log"
    # --max-bytes cuts the read short without that report
    rc, out, _ = run(capsys, "dump-log", path, "--max-bytes", str(len(data) // 2 + 5))
    assert "invalid bytes" not in out and len(out.splitlines()) == 3


def test_undecodable_records_are_an_error_in_deep_iteration(capsys, tmp_path):
    t = pa.table({"key": [b"k"] * 2, "value": [b"v"] * 2})
    data = bytearray(build_records(t))
    data[61] = 0x7F  # first record's length varint: far beyond the batch
    path = write_segment(tmp_path, bytes(data))
    rc, out, err = run(capsys, "dump-log", path, "--deep-iteration")
    assert rc == 1
    assert "isvalid: false" in out and "| error: " in out
    assert err.startswith("kafkalog: error: ") and f"{path}, position 61" in err  # the record at fault


def test_batch_above_max_message_size_is_refused(capsys, tmp_path):
    t = pa.table({"value": [b"y" * 5000]})
    path = write_segment(tmp_path, build_records(t))
    rc, out, err = run(capsys, "dump-log", path, "--max-message-size", "1000")
    assert rc == 1 and "--max-message-size" in err and "position 0" in err
    assert run(capsys, "dump-log", path, "--max-message-size", "6000")[0] == 0


# ---------------------------------------------------------------- files and filesystems


def test_files_option_unknown_files_and_missing_files(capsys, tmp_path, root):
    produce(capsys, root, "t", [{"key": "a", "value": "b"}])
    log = segment(root, "t")
    other = tmp_path / "notes.txt"
    other.write_text("x")
    rc, out, err = run(capsys, "dump-log", "--files", f"{log},{other}")
    assert out.splitlines()[0] == f"Dumping {log}" and f"Dumping {other}" in out
    assert err == f"Ignoring unknown file {other}\n" and rc == 0
    rc, out, err = run(capsys, "dump-log", str(tmp_path / f"{SEG}.log"))
    assert rc == 1 and "does not exist" in err
    assert run(capsys, "dump-log")[0] == 2


def test_a_partition_directory_dumps_its_segment_files_in_order(capsys, root):
    produce(capsys, root, "t", [{"key": "a", "value": "b"}])
    part = os.path.join(root, "t-0")
    files_rc, files_out, _ = run(capsys, "dump-log", *(os.path.join(part, f"{SEG}{s}") for s in (".log", ".index")))
    rc, out, err = run(capsys, "dump-log", part)
    dumped = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("Dumping ")]
    names = sorted(n for n in os.listdir(part) if n.startswith(SEG))
    assert dumped == [
        os.path.join(part, n) for n in sorted(names, key=lambda n: [".log", ".index", ".timeindex"].index(n[20:]))
    ]
    assert rc == 0 and err == "" and out.startswith(files_out)  # the same lines as naming the files
    rc, out, err = run(capsys, "dump-log", root)  # the log dir: no segment files in it
    assert rc == 1 and out == "" and "is a directory with no segment files" in err


def test_mistyped_or_missing_file_names_are_errors(capsys, root, tmp_path):
    produce(capsys, root, "t", [{"key": "a", "value": "b"}])
    missing = os.path.join(root, "t-0", f"{SEG}.lgo")
    rc, _, err = run(capsys, "dump-log", missing)
    assert rc == 1 and err == f"kafkalog: error: {missing} does not exist\n"
    typo = tmp_path / f"{SEG}.lgo"
    typo.write_bytes(b"x")
    rc, out, err = run(capsys, "dump-log", str(typo))  # Kafka ignores it; nothing dumped is an error
    assert rc == 1 and out == f"Dumping {typo}\n"
    assert err.splitlines() == [
        f"Ignoring unknown file {typo}",
        "kafkalog: error: nothing dumped: dump-log reads .log, .index, .timeindex, .txnindex, .snapshot files "
        "(Kafka's suffixes); 1 file(s) ignored",
    ]


def test_dump_through_memory_filesystem(capsys):
    root = f"memory://dump-{uuid.uuid4().hex}"
    produce(capsys, root, "m", [{"key": "DemoKey", "value": "DemoValue", "timestamp": 1599887411245}])
    rc, out, err = run(capsys, "dump-log", f"{root}/m-0/{SEG}.log", f"{root}/m-0/{SEG}.timeindex")
    assert rc == 0, err
    assert "size: 84" in out and "crc: 3888717251 isvalid: true" in out
    assert "timestamp: 1599887411245 offset: 0" in out
