"""`kafkalog export-to-broker` from where a topic lives, to where a broker keeps it (docs/kafka-broker.md).

- **S3**: a topic on S3 (moto's server): three `kafkalog produce` runs (keys, a null key, null values, headers
  with null values, timestamps that go back; a segment object each), a maintenance pass that merges the first
  two, then a transactional write (`kafkalog_ds.api.write`: data and COMMIT markers, objects of their own);
  exported with `kafkalog export-to-broker s3://... --fs endpoint_url=...` straight into the session broker's
  log dir.
- **The staging route, literally**: a topic on local disk written through the engine with committed and
  aborted transactions of several producers (one abort while another producer's transaction is open, markers
  and data across segment rolls), non-transactional batches between them, and a log start moved into a
  segment with `kafkalog delete-records`. It goes through docs/kafka-broker.md's step 4 staging block, run by
  bash as the doc has it (only its /tmp/events-export replaced), and once the broker runs, the doc's
  `<topic>.delete-records.json` step with Kafka's own DeleteRecordsCommand (what kafka-delete-records.sh runs).
- **Several log dirs on both sides**: a ROOT `log.dirs=d1,d2` whose partitions kafkalog spread over both,
  exported into a second broker started with two log dirs: the command once per broker log dir, each run
  exporting the partitions that log dir holds and naming the others (docs/kafka-broker.md, Limits).

Those topics take one stop/export/start round of their broker. For each, then:
(a) the broker's log since that start has no recovery, index rebuild, truncation, stray directory, WARN or
ERROR naming the topic, and its "Completed load" lines give every partition kafkalog's segment count, log
start and log end; (b) Kafka's Java consumer returns exactly what kafkalog's engine reads, read_committed and
read_uncommitted; (c) Kafka's producer appends on top (plain sends, a committed and an aborted transaction)
and the consumer reads the exported records and the new ones, at both isolation levels.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from kafkalog_ds import api
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from storage.transactions.transaction_coordinator import marker_batch
from tests.helpers import REPO
from tests.helpers.broker_checks import bad_lines, differences, expected_loads, kafkalog_records
from tests.helpers.export_rounds import (
    ISOLATIONS,
    append_on_top,
    check_appended,
    consume_commands,
    consumed_by_isolation,
    create_topics,
    loads,
    log_dirs_of,
    partition_dirs,
    run_cli,
    wait_for_loads,
)
from tools.realkafka.broker import KafkaBroker, java_command
from tools.s3_server import BUCKET

T0 = 1_700_000_000_000
PARTITIONS = 3
S3_TOPIC = "xp-s3"
TXN_TOPIC = "xp-txn"
TXN_SEGMENT_BYTES = 1500
DELETED = TopicPartition(TXN_TOPIC, 1)  # its log start moved into its second segment
P1, P2 = 5151, 6262  # the engine-written transactions' producers
DIRS_TOPIC = "xp-dirs"
DIRS_PARTITIONS = 4
DOC = os.path.join(REPO, "docs", "kafka-broker.md")


# ---------------------------------------------------------------- the topics


pytestmark = pytest.mark.long  # a minute and two broker rounds: the long tier (.ci/run), on both brokers


def _produce_lines(run: int, n: int, partitions: int = PARTITIONS) -> bytes:
    """`kafkalog produce` input: keys, a null key, null values, headers with null values, timestamps going back."""
    rows = []
    for i in range(n):
        r = {
            "partition": i % partitions,
            "value": None if i % 11 == 5 else f"run {run} value {i} " + "x" * (i % 17),
            "timestamp": T0 + 100_000 * run + 10 * i - (25 if i % 5 == 3 else 0),
        }
        if i % 6:
            r["key"] = f"k{i % 13}"
        if i % 4 == 0:
            r["headers"] = [["trace", f"t-{run}-{i}"], ["empty", None]]
        rows.append(json.dumps(r))
    return ("\n".join(rows) + "\n").encode()


def _write_s3(url: str, fs_args: list[str], storage_options: dict) -> None:
    """Three produce runs (a segment object each), a maintenance pass merging the first two (the last is the active
    segment), then a transaction (its data and COMMIT markers, more segment objects)."""
    rc, out, err = run_cli(
        "topics", url, "--create", "--topic", S3_TOPIC, "--partitions", str(PARTITIONS), *fs_args,
        "--config", "retention.ms=-1",
    )  # fmt: skip
    assert rc == 0, out + err
    for run in range(3):
        rc, out, err = run_cli(
            "produce", url, "--topic", S3_TOPIC, "--batch-size", "10", *fs_args, stdin=_produce_lines(run, 60)
        )
        assert rc == 0, out + err
    rc, out, err = run_cli(
        "maintain", url, "--once", "--cleaner-config", "kafkalog.segment.merge.min.age.ms=0", *fs_args
    )
    assert rc == 0 and "merged" in out, out + err
    n = 30
    api.write(
        url,
        S3_TOPIC,
        pa.table(
            {
                "key": pa.array([f"txn-{i}".encode() for i in range(n)], pa.binary()),
                "value": pa.array([f"in a transaction {i}".encode() for i in range(n)], pa.binary()),
                "partition": pa.array([i % PARTITIONS for i in range(n)], pa.int32()),
                "timestamp": pa.array([T0 + 400_000 + i for i in range(n)], pa.timestamp("ms", "UTC")),
            }
        ),
        storage_options=storage_options,
    )


def _txn_batch(records: list[tuple], producer_id: int, sequence: int) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=True, producer_id=producer_id, producer_epoch=0,
        base_sequence=sequence, batch_size=2**20,
    )  # fmt: skip
    for i, (ts, key, value, headers) in enumerate(records):
        b.append(i, timestamp=ts, key=key, value=value, headers=headers)
    return bytes(b.build())


def _plain_batch(records: list[tuple]) -> bytes:
    b = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1, base_sequence=-1,
        batch_size=2**20,
    )  # fmt: skip
    for i, (ts, key, value, headers) in enumerate(records):
        b.append(i, timestamp=ts, key=key, value=value, headers=headers)
    return bytes(b.build())


def _api_write(root: str, tag: str, n: int, ts: int) -> None:
    """One transaction over the partitions, the engine's batch write (the Spark sink's commit path)."""
    api.write(
        root,
        TXN_TOPIC,
        pa.table(
            {
                "key": pa.array([None if i % 7 == 0 else f"{tag}-{i}".encode() for i in range(n)], pa.binary()),
                "value": pa.array([f"{tag} committed {i} ".encode() * 4 for i in range(n)], pa.binary()),
                "partition": pa.array([i % PARTITIONS for i in range(n)], pa.int32()),
                "timestamp": pa.array([ts + i for i in range(n)], pa.timestamp("ms", "UTC")),
            }
        ),
    )


class _Transactions:
    """Appends to one partition through the engine (Log.append): transactional batches of P1 and P2 with their
    sequences, plain batches, markers; timestamps rising by one per record."""

    def __init__(self, log, partition: int):
        self.log, self.p, self.clock = log, partition, T0 + 1000
        self.seq = {P1: 0, P2: 0}

    def _records(self, n: int, key, value, headers) -> list[tuple]:
        recs = [(self.clock + i, key(i), value(i), headers) for i in range(n)]
        self.clock += n
        return recs

    def data(self, pid: int, tag: str, n: int = 5) -> None:
        recs = self._records(
            n, lambda i: f"{tag}-{i}".encode(), lambda i: f"{tag} {self.p} {i} ".encode() * 6, [("p", b"%d" % pid)]
        )
        self.log.append(_txn_batch(recs, pid, self.seq[pid]))
        self.seq[pid] += n

    def plain(self, tag: str) -> None:
        self.log.append(
            _plain_batch(self._records(3, lambda i: None, lambda i: f"{tag} {self.p} {i}".encode(), [("h", None)]))
        )

    def end(self, pid: int, commit: bool) -> None:
        self.clock += 1
        marker = marker_batch(
            1 if commit else 0, base_offset=0, timestamp=self.clock, producer_id=pid, producer_epoch=0
        )
        self.log.append(marker)


def _write_transactional(root: str) -> None:
    """Partitions 0 and 1: P1 and P2 interleaved; P1 aborts while P2's transaction is open (its
    lastStableOffset is P2's first offset), P2 commits, P1 commits a second transaction, P2 aborts one; plain
    batches between; segments of 1500 bytes, so transactions and their markers straddle rolls. The engine's
    transactional write commits before and after (partition 2 has only those). Then delete-records moves
    partition 1's log start into its second segment."""
    LogManager(root).create_topic(
        TXN_TOPIC, PARTITIONS, {"segment.bytes": str(TXN_SEGMENT_BYTES), "retention.ms": "-1"}
    )
    _api_write(root, "first", 24, T0)
    lm = LogManager(root)
    for p in (0, 1):
        with lm.open_log(TopicPartition(TXN_TOPIC, p), writable=True) as log:
            w = _Transactions(log, p)
            w.data(P1, "p1-a")
            w.data(P2, "p2-a")
            w.data(P1, "p1-b")
            w.end(P1, False)  # aborted while P2's transaction is open
            w.plain("x")
            w.data(P2, "p2-b")
            w.end(P2, True)
            w.data(P1, "p1-c")
            w.plain("y")
            w.data(P1, "p1-d")
            w.end(P1, True)
            w.data(P2, "p2-c")
            w.data(P2, "p2-d")
            w.end(P2, False)
    _api_write(root, "last", 24, T0 + 5000)
    with lm.open_log(DELETED) as log:
        deleted_to = log.segments[1].base_offset + 2
    rc, out, err = run_cli(
        "delete-records", root, "--topic", TXN_TOPIC, "--partition", str(DELETED.partition), "--offset",
        str(deleted_to),
    )  # fmt: skip
    assert rc == 0, out + err


def _staging_block() -> str:
    """docs/kafka-broker.md's step 4, the staging route: the export, then the copy on the broker host."""
    blocks = re.findall(r"```bash\n(.*?)```", open(DOC).read(), flags=re.S)
    (block,) = [b for b in blocks if "--to /tmp/events-export" in b]
    return block


def _kafka_java(broker, main: str, *args: str) -> subprocess.CompletedProcess:
    """A Kafka tool's main class (what its bin/ script runs), of the broker's Kafka version."""
    return subprocess.run(java_command(broker.version, main, *args, heap="256m"), capture_output=True, text=True)


# ---------------------------------------------------------------- the round on the session's broker


@pytest.fixture(scope="module")
def s3_source(s3_server):
    """The S3 topic (made once for every broker version) and what kafkalog's engine reads of it."""
    url = f"s3://{BUCKET}/xp-{uuid.uuid4().hex[:12]}"
    fs_args = ["--fs", f"endpoint_url={s3_server.endpoint_url}"]
    lm = LogManager(url, s3_server.storage_options)
    _write_s3(url, fs_args, s3_server.storage_options)
    return dict(
        url=url,
        fs_args=fs_args,
        lm=lm,
        expected={iso: kafkalog_records(lm, S3_TOPIC, iso) for iso in ISOLATIONS},
        shape=expected_loads(lm, S3_TOPIC),
    )


@pytest.fixture(scope="module")
def txn_source(tmp_path_factory):
    """The transactional topic on local disk (made once for every broker version) and what kafkalog reads of it."""
    root = str(tmp_path_factory.mktemp("xp-txn") / "logs")
    _write_transactional(root)
    lm = LogManager(root)
    with lm.open_log(DELETED) as log:
        deleted_to = log.log_start_offset
    return dict(
        root=root,
        expected={iso: kafkalog_records(root, TXN_TOPIC, isolation_level=iso) for iso in ISOLATIONS},
        shape=expected_loads(lm, TXN_TOPIC, staged=True),
        deleted_to=deleted_to,
    )


@pytest.fixture(scope="module")
def places(kafka_broker_session, s3_source, txn_source, tmp_path_factory):
    """One round on the session broker of the version: both topics created, the broker stopped, the S3 topic
    exported into its log dir and the transactional one through the doc's staging route, the broker started,
    the doc's delete-records step run; then what Kafka's consumer reads, at both isolation levels."""
    work = tmp_path_factory.mktemp("places")
    s3_url, fs_args, root = s3_source["url"], s3_source["fs_args"], txn_source["root"]
    expected = {S3_TOPIC: s3_source["expected"], TXN_TOPIC: txn_source["expected"]}
    shape = {**s3_source["shape"], **txn_source["shape"]}
    deleted_to = txn_source["deleted_to"]
    b = kafka_broker_session.ensure_running()
    ids = create_topics(
        b, {S3_TOPIC: (PARTITIONS, {"retention.ms": "-1"}), TXN_TOPIC: (PARTITIONS, {"retention.ms": "-1"})}
    )
    log_dir = b.log_dir
    b.stop()
    assert (log_dir / ".kafka_cleanshutdown").exists()  # the doc's step 3: "present after a clean shutdown"
    # S3 straight into the broker's log dir (the topic id read from the directories the broker made)
    rc, s3_out, err = run_cli("export-to-broker", s3_url, "--topic", S3_TOPIC, "--to", str(log_dir), *fs_args)
    assert rc == 0, s3_out + err
    # the staging route as the doc has it: bash runs its block, with the doc's variables set as in its Procedure
    staging = work / "events-export"
    script = _staging_block().replace("/tmp/events-export", str(staging))
    bin_dir = work / "bin"  # `kafkalog` on PATH: this checkout's
    bin_dir.mkdir()
    (bin_dir / "kafkalog").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m kafkalog_ds "$@"\n')
    (bin_dir / "kafkalog").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
        **{"ROOT": root, "TOPIC": TXN_TOPIC, "TOPIC_ID": ids[TXN_TOPIC], "LOGDIR": str(log_dir)},
    }
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    staging_names = sorted(os.listdir(staging))

    b.start()
    log = wait_for_loads(b, {S3_TOPIC: PARTITIONS, TXN_TOPIC: PARTITIONS})
    # the doc: "once the broker runs, bin/kafka-delete-records.sh --bootstrap-server "$BOOTSTRAP"
    # --offset-json-file /tmp/events-export/events.delete-records.json moves their log start offsets to kafkalog's"
    json_file = staging / f"{TXN_TOPIC}.delete-records.json"
    deleted = _kafka_java(
        b,
        "org.apache.kafka.tools.DeleteRecordsCommand",
        "--bootstrap-server",
        b.bootstrap,
        "--offset-json-file",
        str(json_file),
    )
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    topics = [S3_TOPIC, TXN_TOPIC]
    *results, earliest = b.tool(
        *consume_commands(topics),
        {"op": "listOffsets", "topic": TXN_TOPIC, "partitions": list(range(PARTITIONS)), "spec": "earliest"},
    )
    consumed = consumed_by_isolation(topics, PARTITIONS, results)
    return dict(
        broker=b,
        expected=expected,
        shape=shape,
        ids=ids,
        log_dir=log_dir,
        s3_out=s3_out,
        staging_out=done.stdout,
        staging_names=staging_names,
        json_file=json_file.read_text(),
        deleted_out=deleted.stdout,
        deleted_to=deleted_to,
        earliest={int(p): v["offset"] for p, v in earliest.items()},
        broker_log=log,
        consumed=consumed,
    )


def _check_loads(log: str, shape: dict, topic: str) -> None:
    bad = bad_lines(log, [topic])
    assert bad == [], "\n".join(bad[:20])
    want = {tp: v for tp, v in shape.items() if tp.topic == topic}
    assert want and loads(log, [topic]) == want


def _check_consumed(expected: dict, consumed: dict, topic: str) -> int:
    for iso in ISOLATIONS:
        got = consumed[iso][topic]
        assert differences(expected[iso], got) == [], (topic, iso)
        assert sum(map(len, got.values())) > 0
    return sum(map(len, consumed["read_uncommitted"][topic].values()))


@pytest.mark.kafka
def test_the_s3_topic_holds_merged_and_unmerged_segments_and_a_transaction(s3_source, places):
    """The S3 topic is what the case is about: segment objects from each produce, some merged by the
    maintenance pass, and a transaction's COMMIT markers (offsets no consumer sees)."""
    lm = s3_source["lm"]
    for tp in lm.partitions(S3_TOPIC):
        with lm.open_log(tp) as log:
            sizes = [s.size for s in log.segments]
            end = log.log_end_offset
        assert len(sizes) >= 4 and max(sizes) > 2 * min(sizes), (tp, sizes)  # a merged one among small ones
        offsets = [r[0] for r in places["expected"][S3_TOPIC]["read_uncommitted"][tp.partition]]
        assert len(offsets) < end  # the markers' offsets
    assert "into the broker's log dir" in places["s3_out"].splitlines()[-1]
    assert f"(TopicId {places['ids'][S3_TOPIC]})" in places["s3_out"]


@pytest.mark.kafka
def test_the_broker_loads_the_s3_topic_without_recovery(places):
    log = places["broker_log"]
    assert "Skipping recovery of" in log and "since clean shutdown file was found" in log
    _check_loads(log, places["shape"], S3_TOPIC)


@pytest.mark.kafka
def test_kafkas_consumer_reads_the_s3_topic_as_kafkalog_reads_it(places):
    n = _check_consumed(places["expected"][S3_TOPIC], places["consumed"], S3_TOPIC)
    print(f"\n{S3_TOPIC}: {n} records compared at both isolation levels: 0 differences")


@pytest.mark.kafka
def test_the_staging_route_as_the_doc_has_it(places):
    """The doc's block wrote the partition directories and the delete-records JSON into the staging directory;
    the broker loaded the copies with the first exported segment's base as its log start, and the doc's
    DeleteRecordsCommand step moved it to kafkalog's."""
    assert places["staging_names"] == [
        *(f"{TXN_TOPIC}-{p}" for p in range(PARTITIONS)),
        f"{TXN_TOPIC}.delete-records.json",
    ]
    last = places["staging_out"].splitlines()[-1]
    assert f"(TopicId {places['ids'][TXN_TOPIC]})" in last and "into the staging directory" in last, last
    assert json.loads(places["json_file"]) == {
        "version": 1,
        "partitions": [{"topic": TXN_TOPIC, "partition": DELETED.partition, "offset": places["deleted_to"]}],
    }
    with open(DOC) as f:
        doc = " ".join(f.read().split())
    assert 'bin/kafka-delete-records.sh --bootstrap-server "$BOOTSTRAP" --offset-json-file' in doc
    _, first_base, _ = places["shape"][DELETED]  # the broker's log start at load: "Until then the records
    assert first_base < places["deleted_to"]  # below it are visible"
    assert places["earliest"] == {  # and after the doc's step, kafkalog's
        p: places["deleted_to"] if p == DELETED.partition else places["shape"][TopicPartition(TXN_TOPIC, p)][1]
        for p in range(PARTITIONS)
    }
    assert f"low_watermark: {places['deleted_to']}" in places["deleted_out"], places["deleted_out"]


@pytest.mark.kafka
def test_the_broker_loads_the_staged_transactional_topic_without_recovery(places):
    """The loads give the exported shape, with the first exported segment's base as the log start of the
    partition whose log start lies inside a segment (the staging directory cannot say more: the JSON does)."""
    log = places["broker_log"]
    _check_loads(log, places["shape"], TXN_TOPIC)
    for p in range(PARTITIONS):
        d = places["log_dir"] / f"{TXN_TOPIC}-{p}"
        end = places["shape"][TopicPartition(TXN_TOPIC, p)][2]
        assert (
            f"Loading producer state from snapshot file 'SnapshotFile(offset={end}, file={d / f'{end:020d}.snapshot'}"
            in log
        )


@pytest.mark.kafka
def test_kafkas_consumer_reads_the_transactional_topic_as_kafkalog_reads_it(places):
    expected = places["expected"][TXN_TOPIC]
    for p in (0, 1):  # aborted transactions: the isolation levels differ there
        assert len(expected["read_committed"][p]) < len(expected["read_uncommitted"][p])
    assert expected["read_uncommitted"][DELETED.partition][0][0] >= places["deleted_to"]
    n = _check_consumed(expected, places["consumed"], TXN_TOPIC)
    print(f"\n{TXN_TOPIC}: {n} records compared at both isolation levels: 0 differences")


@pytest.fixture(scope="module")
def places_appended(places):
    b = places["broker"].ensure_running()
    return append_on_top(b, [S3_TOPIC, TXN_TOPIC], PARTITIONS, T0 + 10_000_000)


@pytest.mark.kafka
@pytest.mark.parametrize("topic", [S3_TOPIC, TXN_TOPIC])
def test_the_broker_appends_on_top(places, places_appended, topic):
    check_appended(places["expected"][topic], places_appended, topic, places["shape"])


# ---------------------------------------------------------------- several log dirs, on both sides


@pytest.fixture(scope="module")
def dirs_broker(kafka_broker_session, tmp_path_factory):
    """A second broker, with two log dirs (of the session broker's Kafka version)."""
    b = KafkaBroker(tmp_path_factory.mktemp("kafka-two-dirs"), version=kafka_broker_session.version, log_dirs=2)
    try:
        yield b
    finally:
        b.stop()


def _write_spread(root: str) -> None:
    """4 partitions kafkalog spreads over its two log dirs; small segments; keys, headers, a transaction."""
    LogManager(root).create_topic(DIRS_TOPIC, DIRS_PARTITIONS, {"segment.bytes": "1200", "retention.ms": "-1"})
    for run in range(3):
        rc, out, err = run_cli(
            "produce", root, "--topic", DIRS_TOPIC, "--batch-size", "8",
            stdin=_produce_lines(run, 80, DIRS_PARTITIONS),
        )  # fmt: skip
        assert rc == 0, out + err
    n = 20
    api.write(
        root,
        DIRS_TOPIC,
        pa.table(
            {
                "value": pa.array([f"spread {i}".encode() for i in range(n)], pa.binary()),
                "partition": pa.array([i % DIRS_PARTITIONS for i in range(n)], pa.int32()),
                "timestamp": pa.array([T0 + 500_000 + i for i in range(n)], pa.timestamp("ms", "UTC")),
            }
        ),
    )


@pytest.fixture(scope="module")
def spread_source(tmp_path_factory):
    """ROOT log.dirs=d1,d2 (made once for every broker version) and what kafkalog reads of it."""
    work = tmp_path_factory.mktemp("xp-dirs")
    kl_dirs = [work / "d1", work / "d2"]
    root = "log.dirs=" + ",".join(map(str, kl_dirs))
    _write_spread(root)
    return dict(
        root=root,
        expected={iso: kafkalog_records(root, DIRS_TOPIC, isolation_level=iso) for iso in ISOLATIONS},
        shape=expected_loads(LogManager(root), DIRS_TOPIC),
        kl_placement={
            p: next(i for i, d in enumerate(kl_dirs) if (d / f"{DIRS_TOPIC}-{p}").is_dir())
            for p in range(DIRS_PARTITIONS)
        },
    )


@pytest.fixture(scope="module")
def dirs(dirs_broker, spread_source):
    """The round on the two-dir broker: the command run once per broker log dir."""
    root = spread_source["root"]
    b = dirs_broker.start()
    broker_dirs = log_dirs_of(b)
    ids = create_topics(b, {DIRS_TOPIC: (DIRS_PARTITIONS, {"retention.ms": "-1"})})
    placement = {p: broker_dirs.index(d.parent) for p, d in partition_dirs(b, DIRS_TOPIC, DIRS_PARTITIONS).items()}
    b.stop()
    assert all((d / ".kafka_cleanshutdown").exists() for d in broker_dirs)
    outs = []
    for d in broker_dirs:  # the doc: "Run the command once per log dir"
        rc, out, err = run_cli("export-to-broker", root, "--topic", DIRS_TOPIC, "--to", str(d))
        assert rc == 0, out + err
        outs.append(out)
    b.start()
    log = wait_for_loads(b, {DIRS_TOPIC: DIRS_PARTITIONS})
    consumed = consumed_by_isolation([DIRS_TOPIC], DIRS_PARTITIONS, b.tool(*consume_commands([DIRS_TOPIC])))
    return dict(
        broker=b,
        expected=spread_source["expected"],
        shape=spread_source["shape"],
        ids=ids,
        kl_placement=spread_source["kl_placement"],
        placement=placement,
        broker_dirs=broker_dirs,
        outs=outs,
        broker_log=log,
        consumed=consumed,
    )


@pytest.mark.kafka
def test_each_side_spreads_the_partitions_over_its_log_dirs_and_each_run_exports_its_own(dirs):
    assert sorted(set(dirs["kl_placement"].values())) == [0, 1], dirs["kl_placement"]
    assert sorted(set(dirs["placement"].values())) == [0, 1], dirs["placement"]
    for i, out in enumerate(dirs["outs"]):
        here = sorted(p for p, d in dirs["placement"].items() if d == i)
        others = sorted(p for p, d in dirs["placement"].items() if d != i)
        lines = out.splitlines()
        assert [line.split(":")[0] for line in lines[:-1]] == [f"{DIRS_TOPIC}-{p}" for p in here], out
        assert (
            f"Exported {len(here)} partition(s) of topic {DIRS_TOPIC} (TopicId {dirs['ids'][DIRS_TOPIC]})" in lines[-1]
        )
        assert f"Partition(s) {', '.join(map(str, others))} have no directory in this log dir" in lines[-1], out


@pytest.mark.kafka
def test_the_broker_loads_both_log_dirs_without_recovery(dirs):
    log = dirs["broker_log"]
    for d in dirs["broker_dirs"]:
        assert f"from {d} since clean shutdown file was found" in log, d
    _check_loads(log, dirs["shape"], DIRS_TOPIC)


@pytest.mark.kafka
def test_kafkas_consumer_reads_the_spread_topic_as_kafkalog_reads_it(dirs):
    n = _check_consumed(dirs["expected"], dirs["consumed"], DIRS_TOPIC)
    print(f"\n{DIRS_TOPIC}: {n} records compared at both isolation levels: 0 differences")


@pytest.fixture(scope="module")
def dirs_appended(dirs):
    return append_on_top(dirs["broker"].ensure_running(), [DIRS_TOPIC], DIRS_PARTITIONS, T0 + 10_000_000)


@pytest.mark.kafka
def test_the_two_dir_broker_appends_on_top(dirs, dirs_appended):
    check_appended(dirs["expected"], dirs_appended, DIRS_TOPIC, dirs["shape"])
