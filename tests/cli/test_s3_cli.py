"""The `kafkalog` CLI on S3 (moto's server on 127.0.0.1, s3fs): every command run as a subprocess with
`--fs endpoint_url=...`, checked against kafka-python parsing the objects and against the same commands on
a local log dir; a produce killed (SIGKILL) between its object writes; empty partitions; and what reads
cost in requests (no HEAD per index object, ranged GETs only)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter

import pytest

from kafkalog_ds.cli import main
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers import REPO
from tests.helpers.kafka_reference import kp_batch, kp_parse
from tests.helpers.s3_objects import check_kafka_files, partition_objects, s3fs_of

TS0 = 1_700_000_000_000


def cli(server, *argv, stdin: bytes = b""):
    """`python -m kafkalog_ds ARGV --fs endpoint_url=...` in a new process: (exit code, stdout, stderr)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    p = subprocess.run(
        [sys.executable, "-m", "kafkalog_ds", *argv, "--fs", f"endpoint_url={server.endpoint_url}"],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=REPO,
        timeout=180,
    )
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def local(capsys, *argv, stdin: bytes = b""):
    """The same command in this process on local disk."""
    import io

    capsys.readouterr()
    rc = main(list(argv), stdin=io.BytesIO(stdin))
    got = capsys.readouterr()
    return rc, got.out, got.err


def lines_of(records) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def make_records(n, first, partitions=(0, 1)):
    """Records with explicit partitions (only `partitions`), some null keys, headers, timestamps that go back."""
    out = []
    for i in range(first, first + n):
        r = {
            "value": f"value-{i}-" + "x" * (i % 23),
            "partition": partitions[i % len(partitions)],
            "timestamp": TS0 + 10 * i - (25 if i % 7 == 3 else 0),
        }
        if i % 5:
            r["key"] = f"k{i % 11}"
        if i % 4 == 0:
            r["headers"] = [["trace", f"t-{i}"], ["empty", None]]
        out.append(r)
    return out


def as_consumed(records, partition):
    """What `kafkalog consume` prints for kafka-python's records (UTF-8 text here)."""
    return [
        {
            "topic": "t",
            "partition": partition,
            "offset": o,
            "timestamp": ts,
            "timestampType": "CreateTime",
            "key": k and k.decode(),
            "value": v and v.decode(),
            "headers": [[hk, hv and hv.decode()] for hk, hv in hs],
        }
        for o, ts, k, v, hs in records
    ]


def parsed(out):
    return [json.loads(line) for line in out.splitlines()]


# ------------------------------------------------------------------ every command, against two oracles


def test_cli_on_s3_matches_kafka_python_and_the_same_commands_on_local_disk(s3_server, s3_root, tmp_path, capsys):
    url, _ = s3_root
    loc = str(tmp_path / "logs")
    first, second = make_records(120, 0), make_records(90, 120)
    create = ["--create", "--topic", "t", "--partitions", "3", "--config", "index.interval.bytes=300"]
    assert cli(s3_server, "topics", url, *create) == (0, "Created topic t.\n", "")
    assert local(capsys, "topics", loc, *create)[0] == 0
    for recs, extra in ((first, ["--compression", "lz4"]), (second, [])):
        argv = ["--topic", "t", "--batch-size", "7", *extra]
        rc, out, err = cli(s3_server, "produce", url, *argv, stdin=lines_of(recs))
        assert rc == 0, err
        assert (rc, out) == local(capsys, "produce", loc, *argv, stdin=lines_of(recs))[:2]

    s3 = s3fs_of(s3_server)
    want = {}
    for p in (0, 1):
        objs = partition_objects(s3, url, "t", p)
        assert sorted(objs) == [f"{b:020d}{s}" for b in (0, 60) for s in (".index", ".log", ".timeindex")] + [
            "kafkalog-producer-state.json"
        ]
        want[p] = as_consumed(check_kafka_files(objs, 300), p)
        hint = json.loads(objs["kafkalog-producer-state.json"])  # each segment's size and largest timestamp
        assert hint["segments"] == {
            str(b): [
                len(objs[f"{b:020d}.log"]),
                max(r[1] for bt in kp_parse(objs[f"{b:020d}.log"]) for r in bt["records"]),
            ]
            for b in (0, 60)
        }
        mine = [r for r in first + second if r["partition"] == p]
        assert [(r["value"], r["key"], r["timestamp"]) for r in want[p]] == [
            (r["value"], r.get("key"), r["timestamp"]) for r in mine
        ]
    assert partition_objects(s3, url, "t", 2) == {}  # never written: an object store has no empty directory

    rc, out, err = cli(s3_server, "consume", url, "--topic", "t")
    assert rc == 0, err
    assert parsed(out) == want[0] + want[1]
    T = TS0 + 10 * 150
    cases = [
        ["--topic", "t", "--timestamp", str(T)],
        ["--topic", "t", "--partition", "1", "--offset", "3", "--max-messages", "4"],
        ["--topic", "t", "--partition", "2"],
    ]
    for argv in cases:
        rc, out, err = cli(s3_server, "consume", url, *argv)
        assert (rc, out) == local(capsys, "consume", loc, *argv)[:2], (argv, err)
    assert parsed(cli(s3_server, "consume", url, *cases[0])[1])[0] == next(
        r for p in (0, 1) for r in want[p] if r["timestamp"] >= T
    )  # brute force over partition 0 first

    def offsets(doc):
        return [
            (t["topic"], p["partition"], p["logStartOffset"], p["logEndOffset"], p["size"])
            for t in doc["topics"]
            for p in t["partitions"]
        ]

    rc, out, err = cli(s3_server, "describe", url, "--json")
    assert rc == 0, err
    s3_doc = json.loads(out)
    assert offsets(s3_doc) == offsets(json.loads(local(capsys, "describe", loc, "--json")[1]))
    assert [len(p["segments"]) for p in s3_doc["topics"][0]["partitions"]] == [2, 2, 0]  # one object per append

    def no_ids(text):
        return re.sub(r"TopicId: \w+|\tSegments: \d+", "", text)

    rc, out, err = cli(s3_server, "topics", url, "--describe", "--topic", "t")
    assert rc == 0 and no_ids(out) == no_ids(local(capsys, "topics", loc, "--describe", "--topic", "t")[1])
    assert cli(s3_server, "topics", url, "--list") == (0, "t\n", "")

    # dump-log of the S3 objects prints what it prints for a local copy of the same objects
    copy = tmp_path / "copy" / "t-0"
    copy.mkdir(parents=True)
    names = sorted(partition_objects(s3, url, "t", 0))
    for name, data in partition_objects(s3, url, "t", 0).items():
        (copy / name).write_bytes(data)
    s3_files = ",".join(f"{url}/t-0/{n}" for n in names)
    rc, out, err = cli(s3_server, "dump-log", "--files", s3_files, "--print-data-log")
    rc2, out2, err2 = local(capsys, "dump-log", "--files", ",".join(str(copy / n) for n in names), "--print-data-log")
    assert rc == rc2 == 0, err
    assert out.replace(f"{url}/t-0/", "") == out2.replace(f"{copy}/", "")
    assert err.replace(f"{url}/t-0/", "") == err2.replace(f"{copy}/", "")
    assert out.count("| offset:") == 105

    argv = ["--topic", "t", "--partition", "1", "--offset", "40"]
    assert cli(s3_server, "delete-records", url, *argv)[:2] == local(capsys, "delete-records", loc, *argv)[:2]
    rc, out, err = cli(s3_server, "consume", url, "--topic", "t")
    assert rc == 0 and out == local(capsys, "consume", loc, "--topic", "t")[1]
    assert [r["offset"] for r in parsed(out) if r["partition"] == 1] == list(range(40, 105))
    rc, out, err = cli(s3_server, "delete-records", url, "--topic", "t", "--partition", "2", "--offset", "1")
    assert rc == 1 and "log end offset (high watermark) 0" in err  # the empty partition: a log end of 0


def test_empty_partitions_on_s3_read_as_empty(s3_server, s3_root, tmp_path, capsys):
    """A topic whose partitions never got a record has no object under their prefixes: still readable,
    earliest = latest = 0, like a fresh partition directory on local disk."""
    url, opts = s3_root
    lm = LogManager(url, opts)
    lm.create_topic("t", 3)
    with lm.open_log(TopicPartition("t", 1), writable=True) as log:
        log.append(kp_batch([(TS0, b"k", b"v", [])]))
    for p in (0, 2):
        with LogManager(url, opts).open_log(TopicPartition("t", p)) as log:
            assert (log.log_start_offset, log.log_end_offset, log.size) == (0, 0, 0)
            assert log.offset_for_timestamp(0) is None and list(log.read_records(0)) == []
    with pytest.raises(Exception, match="partition 3 does not exist"):
        LogManager(url, opts).open_log(TopicPartition("t", 3))
    rc, out, err = cli(s3_server, "consume", url, "--topic", "t", "--offset", "latest")
    assert (rc, out) == (0, "")
    rc, out, err = cli(s3_server, "consume", url, "--topic", "t", "--partition", "2", "--offset", "0")
    assert (rc, out) == (0, ""), err
    rc, out, err = cli(s3_server, "describe", url, "--json")
    assert rc == 0, err
    assert [(p["logStartOffset"], p["logEndOffset"]) for p in json.loads(out)["topics"][0]["partitions"]] == [
        (0, 0),
        (0, 1),
        (0, 0),
    ]
    # the rule comes from the topic metadata, not from the store: the same on local disk
    loc = str(tmp_path / "logs")
    LogManager(loc).create_topic("t", 2)
    shutil.rmtree(os.path.join(loc, "t-1"))
    assert local(capsys, "consume", loc, "--topic", "t", "--partition", "1", "--offset", "0")[:2] == (0, "")
    # a topic deleted meanwhile stays unknown
    lm.delete_topic("t")
    with pytest.raises(Exception, match="does not exist"):
        LogManager(url, opts).open_log(TopicPartition("t", 0))


# ------------------------------------------------------------------ a produce killed between its object writes

KILL_POINTS = {
    "holding the segment's create-only PUT": r"\.log$",
    "after the segment, holding its .index PUT": r"\.index$",
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_produce_killed_between_object_writes_then_restarted(s3_faults, s3_root, point):
    """SIGKILL while the server holds one of the produce's PUTs of partition 0 (the held request never lands);
    the restart sends what consume does not show: every record once, offsets dense, indexes as Kafka's."""
    server, (url, _) = s3_faults, s3_root
    before = make_records(20, 0)
    assert cli(server, "produce", url, "--topic", "t", "--partitions", "2", stdin=lines_of(before))[0] == 0
    killed = make_records(40, 20)
    prefix = url[len("s3://") :]
    fault = server.add_fault("PUT", rf"^/{prefix}/t-0/\d{{20}}{KILL_POINTS[point]}", hold=True)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kafkalog_ds",
            "produce",
            url,
            "--topic",
            "t",
            "--batch-size",
            "6",
            "--fs",
            f"endpoint_url={server.endpoint_url}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    proc.stdin.write(lines_of(killed))
    proc.stdin.close()
    try:
        assert fault.arrived.wait(120), "the produce never reached the held PUT"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        fault.release()
        proc.kill()
        proc.wait()
    server.clear_faults()

    rc, out, err = cli(server, "consume", url, "--topic", "t")
    assert rc == 0, err
    shown = [r["value"] for r in parsed(out)]
    landed = point != "holding the segment's create-only PUT"
    # partition 0's segment is all or nothing; partition 1 was never reached
    assert shown == [r["value"] for r in before + killed if r["partition"] == 0 and (landed or r in before)] + [
        r["value"] for r in before if r["partition"] == 1
    ]
    missing = [r for r in killed if r["value"] not in set(shown)]
    after = make_records(5, 60)
    rc, out, err = cli(server, "produce", url, "--topic", "t", "--batch-size", "6", stdin=lines_of(missing + after))
    assert rc == 0, err

    s3 = s3fs_of(server)
    everything = before + killed + after
    for p in (0, 1):
        records = check_kafka_files(partition_objects(s3, url, "t", p), 4096)  # the restart wrote missing indexes
        values = [r[3].decode() for r in records]
        assert sorted(values) == sorted(r["value"] for r in everything if r["partition"] == p)
        assert len(set(values)) == len(values)


# ------------------------------------------------------------------ what reads cost on S3


def test_reads_fetch_ranges_and_open_indexes_without_a_head(s3_server, s3_root):
    """A read and a timestamp lookup on a log of many segment objects: no HEAD of any index object (the
    listing gave their sizes), every .log GET is a range (never a whole object here), and the lookup's
    requests do not grow with the segments it skips (the hint object holds their largest timestamps);
    without the hint they grow by one 12-byte .timeindex GET each."""
    url, opts = s3_root
    lm = LogManager(url, opts)
    lm.create_topic("t", 1, {"index.interval.bytes": "512"})
    tp = TopicPartition("t", 0)
    n_segments, per_segment = 12, 60
    with lm.open_log(tp, writable=True) as log:
        for s in range(n_segments):
            log.append(
                b"".join(kp_batch([(TS0 + 1000 * s + i, b"k%d" % i, b"v" * 40, [])]) for i in range(per_segment))
            )
    prefix = "/" + url[len("s3://") :] + "/t-0/"
    sizes = {f.name: f.size for f in LogManager(url, opts).fs.listdir(url + "/t-0")}

    def measured(fn):
        mark = s3_server.log.mark()
        result = fn(LogManager(url, opts))  # a fresh LogManager: nothing cached
        return result, s3_server.log.since(mark)

    def read(lm):
        with lm.open_log(tp) as log:
            return [
                o
                for b in log.read_records(7 * per_segment + 30, 7 * per_segment + 35)
                for o in b.column("offset").to_pylist()
            ]

    def lookup(lm):
        with lm.open_log(tp) as log:
            return log.offset_for_timestamp(TS0 + 1000 * 9 + 40)

    for fn, want in ((read, list(range(450, 455))), (lookup, 9 * per_segment + 40)):
        got, reqs = measured(fn)
        assert got == want
        assert not [r for r in reqs if r.method == "HEAD" and r.path.endswith((".index", ".timeindex"))]
        log_gets = [r for r in reqs if r.method == "GET" and r.path.startswith(prefix) and r.path.endswith(".log")]
        assert log_gets and all(r.range and r.range.startswith("bytes=") for r in log_gets)
        for r in log_gets:  # no .log object was fetched whole
            start, end = map(int, r.range[len("bytes=") :].split("-"))
            assert end - start + 1 < sizes[r.path.rsplit("/", 1)[1]], r
        print(fn.__name__, len(reqs), dict(Counter(r.method for r in reqs)), sum(r.body_bytes for r in reqs))
    # the lookup: LIST of ROOT, GET of the topic file, LIST of the partition, the log end (last .index
    # entry, .log tail), the hint, segment 9's .timeindex and .index, and one ranged GET of its .log
    assert [r.path.rsplit("/", 1)[1] for r in reqs if r.path.endswith(".timeindex")] == [
        f"{9 * per_segment:020d}.timeindex"
    ]
    assert len(reqs) <= 10, [(r.method, r.path, r.range) for r in reqs]
    LogManager(url, opts).fs.delete(url + "/t-0/kafkalog-producer-state.json")
    got, reqs = measured(lookup)
    assert got == 9 * per_segment + 40
    last_entries = [
        r
        for r in reqs
        if r.path.endswith(".timeindex")
        and r.body_bytes == 12
        and r.range.endswith(f"-{sizes[r.path.rsplit('/', 1)[1]] - 1}")
    ]
    # without the hint: one 12-byte read of the last .timeindex entry per segment up to the answer's (9
    # passed over, then segment 9's own), and the rest as above
    assert sorted(int(r.path.rsplit("/", 1)[1][:20]) for r in last_entries) == [per_segment * s for s in range(10)]
    assert len(reqs) - len(last_entries) <= 8
