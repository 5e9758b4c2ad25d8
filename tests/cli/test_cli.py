"""The `kafkalog` command: topics, produce, consume and describe, with their errors and exit codes.

References are independent: kafka-python's DefaultPartitioner for keyed placement, kafka-python's
parse of the bytes on disk, and brute-force models of what consume must print.
"""

from __future__ import annotations

import datetime
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
import uuid

import numpy as np
import pytest
from kafka.partitioner import DefaultPartitioner
from kafka.record.memory_records import MemoryRecords

from kafkalog_ds import produce as console
from kafkalog_ds.cli import main
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers import REPO

SEG = "00000000000000000000"


def run(capsys, *argv, stdin: bytes = b""):
    rc = main(list(argv), stdin=io.BytesIO(stdin))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def lines_of(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def produce(capsys, root, topic, records, *extra):
    rc, out, err = run(capsys, "produce", root, "--topic", topic, *extra, stdin=lines_of(records))
    assert rc == 0, err
    return out


def consume(capsys, root, topic, *extra):
    rc, out, err = run(capsys, "consume", root, "--topic", topic, *extra)
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def log_end_offsets(root, topic):
    lm = LogManager(root)
    out = []
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            out.append(log.log_end_offset)
    return out


class _Cluster:
    """The little of kafka-python's ClusterMetadata that its DefaultPartitioner asks for."""

    def __init__(self, topic, n):
        self.topic, self.n = topic, n

    def topics(self):
        return {self.topic}

    def partitions_for_topic(self, topic):
        return set(range(self.n))

    def available_partitions_for_topic(self, topic):
        return set(range(self.n))


# ---------------------------------------------------------------- topics


def test_topics_create_list_describe_alter(capsys, root):
    rc, out, err = run(
        capsys,
        "topics",
        root,
        "--create",
        "--topic",
        "events",
        "--partitions",
        "3",
        "--config",
        "segment.bytes=1000",
        "--config",
        "cleanup.policy=compact,delete",
    )
    assert (rc, out, err) == (0, "Created topic events.\n", "")
    assert run(capsys, "topics", root, "--create", "--topic", "a.b_c-1")[0] == 0
    assert run(capsys, "topics", root, "--list")[1] == "a.b_c-1\nevents\n"
    meta = LogManager(root).topic("events")
    assert meta.partitions == 3 and meta.config.segment_bytes == 1000 and meta.config.compact

    rc, out, _ = run(capsys, "topics", root, "--describe", "--topic", "events")
    lines = out.splitlines()
    assert lines[0] == (
        f"Topic: events\tTopicId: {meta.topic_id}\tPartitionCount: 3\t"
        f"Configs: cleanup.policy=compact,delete,segment.bytes=1000"
    )
    assert lines[1:] == [
        f"\tTopic: events\tPartition: {p}\tLogStartOffset: 0\tLogEndOffset: 0\tSize: 0\tSegments: 1" for p in range(3)
    ]

    rc, out, _ = run(
        capsys,
        "topics",
        root,
        "--alter",
        "--topic",
        "events",
        "--add-config",
        "retention.ms=1000,cleanup.policy=[compact]",
        "--delete-config",
        "segment.bytes",
    )
    assert (rc, out) == (0, "Completed updating config for topic events.\n")
    cfg = LogManager(root).topic("events").config
    assert cfg.overrides == {"cleanup.policy": "compact", "retention.ms": "1000"}

    # --if-not-exists: quiet success; without it: an error, nothing changed
    assert run(capsys, "topics", root, "--create", "--topic", "events", "--if-not-exists")[0:2] == (0, "")
    rc, out, err = run(capsys, "topics", root, "--create", "--topic", "events", "--partitions", "5")
    assert rc == 1 and out == "" and err.startswith("kafkalog: error: ") and "already exists" in err
    assert LogManager(root).topic("events").partitions == 3


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--config", "segmnt.bytes=100"], "Unknown topic config name: 'segmnt.bytes'"),
        (["--config", "segment.bytes=10"], "segment.bytes"),
        (["--config", "cleanup.policy=shred"], "cleanup.policy"),
        (["--config", "retention.ms"], "expected key=value"),
        (["--partitions", "0"], None),
    ],
)
def test_topics_create_bad_config_writes_nothing(capsys, root, argv, needle):
    rc, out, err = run(capsys, "topics", root, "--create", "--topic", "t", *argv)
    if needle is None:
        assert rc == 2  # argparse: not a positive integer
    else:
        assert rc == 1 and needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not os.path.exists(root) or os.listdir(root) == []


@pytest.mark.parametrize("name", ["a/b", "bad name", "..", "x" * 250, "ümlaut"])
def test_topics_illegal_names(capsys, root, name):
    rc, out, err = run(capsys, "topics", root, "--create", "--topic", name)
    assert rc == 1 and "is illegal" in err and out == ""
    rc, _, err = run(capsys, "produce", root, "--topic", name, stdin=b'{"value": "x"}\n')
    assert rc == 1 and "is illegal" in err
    assert not os.path.exists(root) or os.listdir(root) == []


def test_topics_alter_errors(capsys, root):
    run(capsys, "topics", root, "--create", "--topic", "t", "--config", "retention.ms=5")
    before = open(os.path.join(root, "t.kafkalog-topic.json")).read()
    for argv, needle in [
        (["--add-config", "nope=1"], "Unknown topic config name"),
        (["--add-config", "retention.ms=-5"], "retention.ms"),
        (["--delete-config", "segment.bytes"], "Invalid config(s): segment.bytes"),
        (["--delete-config", "nope"], "Unknown topic config name"),
    ]:
        rc, _, err = run(capsys, "topics", root, "--alter", "--topic", "t", *argv)
        assert rc == 1 and needle in err, (argv, err)
    assert open(os.path.join(root, "t.kafkalog-topic.json")).read() == before
    assert run(capsys, "topics", root, "--alter", "--topic", "missing", "--add-config", "retention.ms=1")[0] == 1
    assert run(capsys, "topics", root, "--alter", "--topic", "t")[0] == 2
    assert run(capsys, "topics", root)[0] == 2  # one of --create/--list/--describe/--alter is required
    assert run(capsys, "topics", root, "--describe", "--topic", "missing")[0] == 1


# ---------------------------------------------------------------- produce / consume


def test_round_trip_headers_nulls_and_partitions(capsys, root):
    n = 4
    run(capsys, "topics", root, "--create", "--topic", "rt", "--partitions", str(n))
    rng = np.random.default_rng(5)
    records = []
    for i in range(500):
        r = {"value": None if i % 17 == 4 else f"value {i} " + "é" * (i % 3)}
        if i % 5:
            r["key"] = None if i % 9 == 2 else f"key-{rng.integers(0, 80)}"
        if i % 4 == 1:
            r["headers"] = [["trace", f"t{i}"], ["nothing", None], ["trace", ""]][: 1 + i % 3]
        if i % 6 == 0:
            r["timestamp"] = 1_600_000_000_000 + int(rng.integers(0, 10**6))
        if i % 13 == 0:
            r["partition"] = int(rng.integers(0, n))
        records.append(r)
    out = produce(capsys, root, "rt", records, "--compression", "lz4", "--batch-size", "37")
    assert all(line.startswith("Wrote ") for line in out.splitlines())

    # the model: explicit partition wins; keyed rows go where kafka-python's DefaultPartitioner puts them;
    # null keys rotate over the partitions in input order
    kp = DefaultPartitioner()
    cluster = _Cluster("rt", n)
    expected = {p: [] for p in range(n)}
    nulls = 0
    for r in records:
        if r.get("partition") is not None:
            p = r["partition"]
        elif r.get("key") is not None:
            k = r["key"].encode()
            p = kp.partition("rt", k, k, None, None, cluster)
        else:
            p = nulls % n
            nulls += 1
        expected[p].append(r)
    got = consume(capsys, root, "rt")
    assert len(got) == len(records)
    assert [g["partition"] for g in got] == sorted(g["partition"] for g in got)  # partition order
    for p in range(n):
        mine = [g for g in got if g["partition"] == p]
        assert [g["offset"] for g in mine] == list(range(len(expected[p])))
        for g, r in zip(mine, expected[p], strict=False):
            assert g["topic"] == "rt" and g["timestampType"] == "CreateTime"
            assert (g["key"], g["value"]) == (r.get("key"), r["value"])
            assert g["headers"] == r.get("headers", [])
            if "timestamp" in r:
                assert g["timestamp"] == r["timestamp"]
            assert "base64" not in g
    # the bytes on disk parse with kafka-python, lz4 batches of at most 37 records
    for p in range(n):
        data = open(os.path.join(root, f"rt-{p}", f"{SEG}.log"), "rb").read()
        recs = MemoryRecords(data)
        while recs.has_next():
            b = recs.next_batch()
            assert b.compression_type == 3 and b.records_count <= 37


def test_keyed_partitioning_equals_kafka_python(capsys, root):
    rng = np.random.default_rng(8)
    keys = [f"k{int(x)}-" + "z" * int(rng.integers(0, 9)) for x in rng.integers(0, 10**6, 300)]
    for n in (1, 3, 7):
        topic = f"keys{n}"
        produce(capsys, root, topic, [{"key": k, "value": "v"} for k in keys], "--partitions", str(n))
        got = {(g["key"], g["partition"]) for g in consume(capsys, root, topic)}
        kp, cluster = DefaultPartitioner(), _Cluster(topic, n)
        assert got == {(k, kp.partition(topic, k.encode(), k.encode(), None, None, cluster)) for k in keys}


def test_non_utf8_bytes_print_as_base64_and_replay(capsys, root):
    # b"\xff\xfe" and b"caf\xe9" are not UTF-8; they are written through the base64 form
    rec = {
        "key": "//4=",
        "value": "Y2Fm6Q==",
        "headers": [["h", "AA=="], ["text", "plain"]],
        "base64": ["key", "value", "headers.0"],
        "timestamp": 7,
    }
    produce(capsys, root, "bin", [rec, {"key": "ok", "value": "AA==", "base64": ["value"]}])
    got = consume(capsys, root, "bin")
    assert got[0]["key"] == "//4=" and got[0]["value"] == "Y2Fm6Q==" and got[0]["base64"] == ["key", "value"]
    assert got[0]["headers"] == [["h", "\u0000"], ["text", "plain"]]  # b"\x00" is valid UTF-8
    assert got[1]["value"] == "\u0000" and "base64" not in got[1]
    lm = LogManager(root)
    with lm.open_log(TopicPartition("bin", 0)) as log:
        batch = next(log.read_records(0))
    assert batch.column("key").to_pylist()[0] == b"\xff\xfe"
    assert batch.column("value").to_pylist()[0] == b"caf\xe9"
    # consume output is valid producer input: replay it into another topic
    rc, out, _ = run(capsys, "consume", root, "--topic", "bin")
    rc, _, err = run(capsys, "produce", root, "--topic", "copy", stdin=out.encode())
    assert rc == 0, err
    again = consume(capsys, root, "copy")
    assert [{k: v for k, v in g.items() if k != "topic"} for g in again] == [
        {k: v for k, v in g.items() if k != "topic"} for g in got
    ]


def test_consume_offsets_max_messages_and_latest(capsys, root):
    produce(capsys, root, "c", [{"value": str(i)} for i in range(20)], "--batch-size", "3")
    assert [g["value"] for g in consume(capsys, root, "c", "--offset", "7", "--max-messages", "4")] == [
        "7",
        "8",
        "9",
        "10",
    ]
    assert consume(capsys, root, "c", "--offset", "latest") == []
    assert consume(capsys, root, "c", "--offset", "20") == []
    assert len(consume(capsys, root, "c", "--from-beginning")) == 20
    for bad in ("21", "-1"):
        rc, out, err = run(capsys, "consume", root, "--topic", "c", "--offset", bad)
        assert rc == 1 and out == ""
        assert err == f"kafkalog: error: offset {bad} is out of range for c-0: log start offset 0, log end offset 20\n"
    # a numeric offset needs --partition when there are several partitions (as Kafka's consumer says)
    produce(capsys, root, "c3", [{"value": "x"}], "--partitions", "3")
    assert run(capsys, "consume", root, "--topic", "c3", "--offset", "0")[0] == 2
    rc, _, err = run(capsys, "consume", root, "--topic", "c3", "--partition", "3")
    assert rc == 1 and "partition 3" in err
    assert run(capsys, "consume", root, "--topic", "nope")[0] == 1


def test_consume_timestamp_across_segments_equals_brute_force(capsys, root):
    rng = np.random.default_rng(21)
    run(
        capsys,
        "topics",
        root,
        "--create",
        "--topic",
        "ts",
        "--partitions",
        "2",
        "--config",
        "segment.bytes=400",
        "--config",
        "index.interval.bytes=120",
    )
    records = []
    t = 1_000_000
    for i in range(600):
        t += int(rng.integers(-30, 45))  # timestamps go backwards now and then
        records.append({"key": f"k{i % 11}", "value": "v" * int(rng.integers(0, 25)), "timestamp": t})
    for start in range(0, 600, 150):  # several appends, each rolling several segments
        produce(capsys, root, "ts", records[start : start + 150], "--batch-size", str(int(rng.integers(1, 6))))
    segs = [f for p in range(2) for f in os.listdir(os.path.join(root, f"ts-{p}")) if f.endswith(".log")]
    assert len(segs) >= 10
    everything = consume(capsys, root, "ts")
    assert len(everything) == 600
    by_part = {p: [g for g in everything if g["partition"] == p] for p in range(2)}
    stamps = sorted({r["timestamp"] for r in records})
    probes = (
        [stamps[0] - 1, stamps[0], stamps[-1], stamps[-1] + 1]
        + [int(x) for x in rng.choice(stamps, 25)]
        + [int(x) + 1 for x in rng.choice(stamps, 10)]
    )
    for T in probes:
        want = []
        for p in range(2):  # brute force: earliest offset with timestamp >= T, then everything from it
            rows = by_part[p]
            first = next((i for i, g in enumerate(rows) if g["timestamp"] >= T), None)
            if first is not None:
                want += rows[first:]
        assert consume(capsys, root, "ts", "--timestamp", str(T)) == want, T
        one = consume(capsys, root, "ts", "--timestamp", str(T), "--partition", "1")
        assert one == [g for g in want if g["partition"] == 1]


def test_produce_creates_topic_and_no_create(capsys, root):
    rc, out, err = run(capsys, "produce", root, "--topic", "fresh", "--no-create", stdin=b'{"value": "x"}\n')
    assert rc == 1 and "fresh" in err and "does not exist" in err
    assert not os.path.exists(root) or "fresh-0" not in os.listdir(root)
    out = produce(capsys, root, "fresh", [{"value": "x"}, {"value": "y"}])
    assert out == "Wrote 2 records to fresh-0 at offsets 0..1\n"
    assert LogManager(root).topic("fresh").partitions == 1
    out = produce(capsys, root, "fresh", [{"value": "z"}], "--no-create")
    assert out == "Wrote 1 record to fresh-0 at offsets 2..2\n"
    rc, _, err = run(capsys, "produce", root, "--topic", "fresh", "--partitions", "4", stdin=b'{"value": "x"}\n')
    assert rc == 1 and "--partitions" in err


BAD_LINES = [
    ('{"key": "a", "value": "b"', "not valid JSON"),
    ('{"key": 5, "value": "b"}', "'key' must be a string or null, got number"),
    ('{"value": true}', "'value' must be a string or null, got boolean"),
    ('["a", "b"]', "expected a JSON object, got array"),
    ('{"value": "b", "vlaue": "c"}', "unknown field 'vlaue'"),
    ('{"value": "b", "value": "c"}', "field 'value' appears twice"),
    ('{"value": "b", "timestamp": 1.5}', "'timestamp' must be an integer"),
    ('{"value": "b", "timestamp": "12"}', "'timestamp' must be an integer"),
    ('{"value": "b", "timestamp": -3}', "invalid timestamp -3"),
    ('{"value": "b", "partition": 2}', "partition 2 is out of range: topic 't' has 2 partition(s)"),
    ('{"value": "b", "partition": -1}', "partition -1 is out of range"),
    ('{"value": "b", "headers": [["k"]]}', "headers[0] must be a [key, value] pair"),
    ('{"value": "b", "headers": [[null, "v"]]}', "headers[0]: the key must be a string"),
    ('{"value": "b", "headers": {"k": "v"}}', "'headers' must be a list"),
    ('{"value": "b", "headers": [["k", 5]]}', "must be a string or null"),
    ('{"value": "b"} {"value": "c"}', "not valid JSON: Extra data"),
    ('{"value": "!!", "base64": ["value"]}', "not valid base64"),
    ('{"value": "b", "base64": ["nothing"]}', "'base64' names 'nothing'"),
    ('{"value": "\\ud800"}', "unpaired UTF-16 surrogate"),
    ("7", "expected a JSON object, got number"),
]


@pytest.mark.parametrize("bad,needle", BAD_LINES)
def test_bad_input_names_the_line_and_writes_nothing(capsys, root, bad, needle):
    run(capsys, "topics", root, "--create", "--topic", "t", "--partitions", "2")
    produce(capsys, root, "t", [{"key": "a", "value": "seed"}])
    before = log_end_offsets(root, "t")
    good = [json.dumps({"key": f"k{i}", "value": "ok"}) for i in range(5)]
    data = ("\n".join(good[:3] + ["", bad] + good[3:]) + "\n").encode()
    rc, out, err = run(capsys, "produce", root, "--topic", "t", stdin=data)
    assert rc == 1 and out == ""
    assert err.startswith("kafkalog: error: stdin line 5: ") and needle in err, err
    assert err.count("\n") == 1 and "nothing was written" in err
    assert log_end_offsets(root, "t") == before


def test_bad_input_line_numbers_across_blocks(root):
    lm = LogManager(root)
    lines = [json.dumps({"key": f"k{i}", "value": "v" * (i % 50)}) for i in range(3000)]
    lines[2718] = '{"key": "x", "value": 12}'
    data = ("\n".join(lines) + "\n").encode()
    with pytest.raises(console.InvalidInputError, match=r"^stdin line 2719: 'value' must be a string"):
        console.produce(lm, "blocks", io.BytesIO(data), io.StringIO(), block_bytes=4096)
    assert lm.topics() == []  # the topic is created only once the whole input is valid
    lines[2718] = '{"key": "x", "value": "fine"}'
    out = io.StringIO()
    res = console.produce(lm, "blocks", io.BytesIO(("\n".join(lines)).encode()), out, block_bytes=4096)
    assert res == {0: (3000, 0, 2999)}
    with lm.open_log(TopicPartition("blocks", 0)) as log:
        values = [v for b in log.read_records(0) for v in b.column("value").to_pylist()]
    assert values == [json.loads(line)["value"].encode() for line in lines]


def test_record_too_large_names_the_line(capsys, root):
    run(capsys, "topics", root, "--create", "--topic", "small", "--config", "max.message.bytes=2000")
    data = lines_of([{"value": "a"}, {"value": "b" * 5000}])
    rc, _, err = run(capsys, "produce", root, "--topic", "small", stdin=data)
    assert rc == 1 and err.startswith("kafkalog: error: stdin line 2: ") and "nothing was written" in err
    assert log_end_offsets(root, "small") == [0]


def test_consume_corrupt_segment_names_file_and_position(capsys, root):
    produce(capsys, root, "bad", [{"key": "k", "value": f"value {i}"} for i in range(10)], "--batch-size", "4")
    path = os.path.join(root, "bad-0", f"{SEG}.log")
    data = bytearray(open(path, "rb").read())
    batches = []
    pos = 0
    while pos < len(data):
        batches.append(pos)
        pos += 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
    data[batches[1] + 80] ^= 0x10  # a record byte of the second batch
    open(path, "wb").write(data)
    rc, out, err = run(capsys, "consume", root, "--topic", "bad")
    assert rc == 1
    assert len(out.splitlines()) in (0, 4)  # at most the batch before the damage (reads go chunk by chunk)
    assert err.startswith("kafkalog: error: ") and path in err and f"position {batches[1]}" in err
    assert "CRC" in err and err.count("\n") == 1
    rc, out, _ = run(capsys, "dump-log", path)
    assert rc == 0 and [ln.endswith("isvalid: false") for ln in out.splitlines()[2:]] == [False, True, False]


def test_describe_human_and_json(capsys, root):
    run(capsys, "topics", root, "--create", "--topic", "d", "--partitions", "2", "--config", "segment.bytes=300")
    produce(
        capsys,
        root,
        "d",
        [{"key": f"k{i}", "value": "x" * 30, "timestamp": 1000 + i} for i in range(40)],
        "--batch-size",
        "2",
    )
    rc, out, _ = run(capsys, "describe", root, "--json")
    doc = json.loads(out)
    assert doc == LogManager(root).describe().to_dict()
    rc, out, _ = run(capsys, "describe", root)
    lines = out.splitlines()
    assert lines[0] == f"Log dir: {root}"
    header = lines[2].split()
    assert header == ["TOPIC", "PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET", "SIZE", "SEGMENTS"]
    parts = doc["topics"][0]["partitions"]
    for p in parts:
        assert lines[3 + p["partition"]].split() == [
            "d",
            str(p["partition"]),
            str(p["logStartOffset"]),
            str(p["logEndOffset"]),
            str(p["size"]),
            str(len(p["segments"])),
        ]
    seg_rows = [ln.split() for ln in lines[7:] if ln.startswith("d ")]
    assert seg_rows == [
        ["d", str(p["partition"]), str(s["baseOffset"]), str(s["size"]), str(s["largestTimestamp"])]
        for p in parts
        for s in p["segments"]
    ]
    total = sum(p["size"] for p in parts)
    assert lines[-1].endswith(f"{total} bytes") and sum(p["logEndOffset"] for p in parts) == 40
    assert run(capsys, "describe", root, "--topic", "nope")[0] == 1


def test_memory_root(capsys):
    root = f"memory://cli-{uuid.uuid4().hex}"
    produce(capsys, root, "m", [{"key": "a", "value": "b", "timestamp": 3}])
    assert consume(capsys, root, "m")[0]["value"] == "b"
    assert run(capsys, "topics", root, "--list")[1] == "m\n"


def test_installed_script_and_module(tmp_path):
    exe = shutil.which("kafkalog")
    assert exe is not None
    root = str(tmp_path / "logs")
    rec = b'{"key": "DemoKey", "value": "DemoValue", "timestamp": 1599887411245}\n'
    p = subprocess.run([exe, "produce", root, "--topic", "demo"], input=rec, capture_output=True, timeout=120)
    assert p.returncode == 0 and p.stdout == b"Wrote 1 record to demo-0 at offsets 0..0\n", p.stderr
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "kafkalog_ds",
            "dump-log",
            os.path.join(root, "demo-0", f"{SEG}.log"),
            "--print-data-log",
        ],
        capture_output=True,
        timeout=120,
    )
    assert p.returncode == 0 and b"size: 84" in p.stdout and b"key: DemoKey payload: DemoValue" in p.stdout
    p = subprocess.run([exe, "consume", root, "--topic", "demo", "--offset", "9"], capture_output=True, timeout=120)
    assert p.returncode == 1 and p.stdout == b"" and b"Traceback" not in p.stderr
    assert p.stderr.startswith(b"kafkalog: error: offset 9 is out of range for demo-0")
    p = subprocess.run([exe, "consume", root], capture_output=True, timeout=120)
    assert p.returncode == 2 and b"--topic" in p.stderr


def test_timestamp_bounds_of_the_topic_are_checked_before_writing(capsys, root):
    run(
        capsys,
        "topics",
        root,
        "--create",
        "--topic",
        "tb",
        "--partitions",
        "2",
        "--config",
        "message.timestamp.before.max.ms=3600000",
    )
    data = lines_of([{"key": "a", "value": "now"}, {"key": "b", "value": "old", "timestamp": 1000}])
    rc, out, err = run(capsys, "produce", root, "--topic", "tb", stdin=data)
    assert rc == 1 and out == "" and err.startswith("kafkalog: error: stdin line 2: timestamp 1000 is out of range")
    assert log_end_offsets(root, "tb") == [0, 0]
    assert produce(capsys, root, "tb", [{"key": "a", "value": "now"}]).startswith("Wrote 1 record")


@pytest.mark.parametrize("length", [222, 236, 249])
def test_topics_as_long_as_kafka_allows_work_end_to_end(capsys, root, length):
    """Every file and temporary name made under ROOT or a partition directory fits in 255 bytes."""
    topic = ("t" * length)[: length - 2] + ".x"
    assert (
        run(capsys, "topics", root, "--create", "--topic", topic, "--partitions", "2", "--config", "segment.bytes=200")[
            0
        ]
        == 0
    )
    produce(capsys, root, topic, [{"key": f"k{i}", "value": f"v{i}"} for i in range(20)])
    assert run(capsys, "topics", root, "--alter", "--topic", topic, "--add-config", "retention.ms=99")[0] == 0
    assert run(capsys, "topics", root, "--list")[1].split() == [topic]
    got = consume(capsys, root, topic)
    assert sorted(r["value"] for r in got) == sorted(f"v{i}" for i in range(20))
    assert LogManager(root).topic(topic).config.retention_ms == 99
    assert run(capsys, "maintain", root, "--once")[0] == 0
    assert run(capsys, "topics", root, "--delete", "--topic", topic)[0] == 0
    assert run(capsys, "topics", root, "--list")[1].split() == []
    for _dirpath, dirnames, filenames in os.walk(root):
        assert all(len(n.encode()) <= 255 for n in dirnames + filenames)


def test_topic_names_that_collide_in_metrics_are_refused_and_partition_counts_are_bounded(capsys, root):
    assert run(capsys, "topics", root, "--create", "--topic", "a.b")[0] == 0
    rc, out, err = run(capsys, "topics", root, "--create", "--topic", "a_b")
    assert rc == 1 and "Topic 'a_b' collides with existing topic: a.b" in err
    rc, out, err = run(capsys, "topics", root, "--create", "--topic", "big", "--partitions", "2147483648")
    assert rc in (1, 2) and "100000" in err and "Traceback" not in err
    assert sorted(os.listdir(root)) == sorted(n for n in os.listdir(root) if not n.startswith("big"))
    assert not any(n.startswith("big") for n in os.listdir(root))


# ---------------------------------------------------------------- first run: empty results, summaries


def test_describe_json_is_the_document_alone_on_stdout(tmp_path):
    """`describe --json` in a real process: stdout parses as one JSON document and agrees with the files
    on disk (each segment's base offset is its file name, its size the file's size); warnings go to stderr."""
    root = str(tmp_path / "logs")
    rc = main(
        ["produce", root, "--topic", "j", "--batch-size", "1"],
        stdin=io.BytesIO(lines_of({"value": f"record {i}"} for i in range(20))),
    )
    assert rc == 0
    LogManager(root).alter_topic_config("j", {"segment.bytes": "200"})
    assert (
        main(
            ["produce", root, "--topic", "j", "--batch-size", "1"],
            stdin=io.BytesIO(lines_of({"value": f"more {i}"} for i in range(20))),
        )
        == 0
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    p = subprocess.run(
        [sys.executable, "-m", "kafkalog_ds", "describe", root, "--json", "--topic", "j"], capture_output=True, env=env
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # the whole of stdout, nothing before or after
    (part,) = doc["topics"][0]["partitions"]
    on_disk = sorted(
        (int(n[:-4]), os.path.getsize(os.path.join(root, "j-0", n)))
        for n in os.listdir(os.path.join(root, "j-0"))
        if n.endswith(".log")
    )
    assert [(s["baseOffset"], s["size"]) for s in part["segments"]] == on_disk and len(on_disk) > 2
    assert part["logEndOffset"] == 40 and part["size"] == sum(size for _, size in on_disk)


def test_describe_says_when_root_is_not_a_log_dir(capsys, tmp_path):
    root = str(tmp_path / "logs")
    produce(capsys, root, "ev", [{"value": "x"}])
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("not a log")
    rc, out, err = run(capsys, "describe", str(project))
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert err.startswith(f"kafkalog: error: {project} is not a log dir") and "notes.txt" in err
    rc, out, err = run(capsys, "describe", str(project), "--json")
    assert rc == 1 and out == "" and "is not a log dir" in err
    # a partition directory: named, with the log dir to describe instead
    rc, out, err = run(capsys, "describe", os.path.join(root, "ev-0"))
    assert rc == 1 and out == ""
    assert "partition 0 of topic 'ev', not a log dir" in err and f"kafkalog describe {root} --topic ev" in err
    # a file: a clear error, pointing a segment file at dump-log
    seg = os.path.join(root, "ev-0", SEG + ".log")
    rc, out, err = run(capsys, "describe", seg)
    assert rc == 1 and out == "" and f"{seg} is a file, not a log dir" in err and f"kafkalog dump-log {seg}" in err
    rc, out, err = run(capsys, "consume", str(project / "notes.txt"), "--topic", "ev")
    assert rc == 1 and "is a file, not a log dir" in err
    # an empty directory is an empty log dir: it says so
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, out, err = run(capsys, "describe", str(empty))
    assert rc == 0 and "No topics" in out and err == ""
    rc, out, err = run(capsys, "describe", str(empty), "--json")
    assert rc == 0 and json.loads(out) == {"root": str(empty), "topics": []}
    # a log dir whose topics were all deleted is still a log dir
    assert run(capsys, "topics", root, "--delete", "--topic", "ev")[0] == 0
    rc, out, err = run(capsys, "describe", root)
    assert rc == 0 and "No topics" in out


def test_produce_prints_a_summary_on_stderr(capsys, root):
    rc, out, err = run(
        capsys,
        "produce",
        root,
        "--topic",
        "s",
        "--partitions",
        "2",
        stdin=lines_of({"value": f"v{i}"} for i in range(30)),
    )
    assert rc == 0 and out.count("Wrote ") == 2
    size = sum(os.path.getsize(os.path.join(root, f"s-{p}", SEG + ".log")) for p in range(2))
    assert re.fullmatch(rf"Wrote 30 records \({size} bytes\) to 2 partition\(s\) of s in \d+\.\d\d s\n", err), err
    rc, out, err = run(capsys, "produce", root, "--topic", "s", stdin=b"\n\n")
    assert (rc, out, err) == (0, "", "Wrote 0 records to s: stdin held no records\n")


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_produce_shows_progress_on_a_terminal_only(capsys, root, monkeypatch):
    monkeypatch.setattr(console.ProduceProgress, "PROGRESS_INTERVAL_S", 0.0)  # draw on every update
    monkeypatch.setattr(sys.modules["kafkalog_ds.cli"], "produce", functools.partial(console.produce, block_bytes=1024))
    records = lines_of({"value": f"value {i}"} for i in range(500))
    rc, out, err = run(capsys, "produce", root, "--topic", "p", stdin=records)  # not a terminal: no status line
    assert rc == 0 and "\r" not in err and "\r" not in out
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    rc = main(["produce", root, "--topic", "p"], stdin=io.BytesIO(records))
    cap = capsys.readouterr()
    text = term.getvalue()
    assert rc == 0 and "\r" not in cap.out
    drawn = re.findall(r"\r\x1b\[K([^\r]*)", text)
    assert any(re.fullmatch(r"reading stdin: [\d,]+ records, [\d,.]+ (bytes|KiB), [\d,]+ records/s", d) for d in drawn)
    assert any(
        re.fullmatch(r"appending: [\d,]+ of 500 records, [\d,.]+ (bytes|KiB), [\d,]+ records/s", d) for d in drawn
    ), drawn
    # the line is cleared before the summary, which stands alone at the end
    assert re.search(r"\r\x1b\[KWrote 500 records \(\d+ bytes\) to 1 partition\(s\) of p in [\d.]+ s\n$", text)


def test_maintain_spark_passes_master_storage_and_cleaner_options_on(root, capsys, monkeypatch):
    """`kafkalog maintain --once --spark` runs the pass as a Spark job with the same ROOT, topics, --fs,
    --cleaner-config and --master; `python -m kafkalog_ds.maintenance` is that command with --once."""
    import kafkalog_ds.maintenance as maintenance
    from kafkalog_ds.maintenance.__main__ import main as maintenance_main

    run(capsys, "topics", root, "--create", "--topic", "a", "--partitions", "1")
    seen = []
    monkeypatch.setattr(maintenance, "run_on_spark", lambda root, **kw: seen.append((root, kw)) or [])
    code, _, _ = run(
        capsys,
        "maintain",
        root,
        "--once",
        "--spark",
        "--master",
        "spark://h:7077",
        "--topic",
        "a",
        "--fs",
        "anon=true",
        "--cleaner-config",
        "log.cleaner.io.buffer.load.factor=0.5",
    )
    assert code == 0
    [(given_root, kw)] = seen
    assert given_root == root and kw["master"] == "spark://h:7077" and kw["topics"] == ["a"]
    assert kw["storage_options"] == {"anon": True}
    assert kw["cleaner_settings"] == {"log.cleaner.io.buffer.load.factor": "0.5"}
    code, _, err = run(capsys, "maintain", root, "--spark")
    assert code == 2 and "use it with --once" in err
    monkeypatch.undo()
    assert maintenance_main([root, "--once"]) == 0  # the module's entry takes --once too


def _clock_time(ms: int, fmt: str = "%H:%M:%S") -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).strftime(fmt)


def test_maintain_in_a_loop_says_when_its_next_pass_runs(root, capsys, monkeypatch):
    """Without --once, each pass is followed by one line on stderr: the next pass's time of day and the wait,
    counted from the start of the pass just run. The loop waits on cli.CLOCK, a MockTime here: no sleep."""
    import kafkalog_ds.cli as cli
    import storage.log_maintenance as maintenance
    from storage.common.time import MockTime

    run(capsys, "topics", root, "--create", "--topic", "a")
    start = 1_700_000_000_000
    clock = MockTime(start)
    real, starts = maintenance.run_once, []

    def one_pass(*args, **kwargs):
        starts.append(clock.milliseconds())
        if len(starts) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the third pass
        reports = real(*args, **kwargs)
        clock.sleep(1500 if len(starts) == 1 else 0)  # the first pass takes 1.5 s
        return reports

    monkeypatch.setattr(cli, "CLOCK", clock)
    monkeypatch.setattr(maintenance, "run_once", one_pass)
    rc, out, err = run(capsys, "maintain", root, "--interval-ms", "60000")
    assert rc == 130
    assert starts == [start, start + 60_000, start + 120_000]  # a pass every interval, from one start to the next
    assert err == (
        f"next pass at {_clock_time(start + 60_000)} (in 58.5 s); Ctrl-C stops\n"
        f"next pass at {_clock_time(start + 120_000)} (in 60 s); Ctrl-C stops\n"
        "kafkalog: interrupted\n"
    )
    assert out.count("maintenance pass: 1 partition(s), 0 failed") == 2


def test_the_next_pass_line_names_the_date_when_it_is_not_today():
    from kafkalog_ds.cli import _next_pass_line

    now = 1_700_000_000_000
    day = 86_400_000
    assert _next_pass_line(now, day) == (
        f"next pass at {_clock_time(now + day, '%Y-%m-%d %H:%M:%S')} (in 86400 s); Ctrl-C stops\n"
    )
    assert _next_pass_line(now, 1) == f"next pass at {_clock_time(now + 1)} (in 0.001 s); Ctrl-C stops\n"
