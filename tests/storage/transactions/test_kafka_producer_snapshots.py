"""Producer state snapshots Kafka brokers (4.4.0, 3.9.1) wrote, read by storage/transactions/producer_snapshot.py and
`kafkalog dump-log`, held to Kafka's DumpLogSegments and to the log itself; and snapshots we write, read back by Kafka.

The broker writes `<offset>.snapshot` at every segment roll (the producer table as of the new segment's base offset)
and at a clean shutdown (as of the log end). Topics with small segments get two idempotent producer sessions, a
producer without idempotence, and transactional producers whose transactions span several batches (so rolls land
inside open transactions), committed and aborted, and one transactional.id run twice (its epoch bumps). The broker is
then stopped cleanly and every `.snapshot` in its log dir is read: each entry must be what Kafka's DumpLogSegments
prints for the file, and, for these topics, what replaying Kafka's own dump of the log below the snapshot's offset
gives (ProducerStateEntry/ProducerAppendInfo's rules: an epoch change drops the retained batch, a data batch sets it,
a transactional batch opens a transaction, a marker closes it and sets the coordinator epoch and lastTimestamp).
"""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage.log_dirs import open_filesystem
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from storage.transactions import producer_snapshot as ps
from storage.transactions.producer_table import ProducerTable
from tests.helpers import kafka_scenarios as S
from tools.realkafka.broker import KafkaBroker

pytestmark = pytest.mark.kafka

IDEM_TOPIC = "snap-idem"
TXN_TOPIC = "snap-txn"
TOPICS = {IDEM_TOPIC: 2, TXN_TOPIC: 2}
SMALL_SEGMENTS = {"internal.segment.bytes": "1200"}
PAD = "x" * 60
BATCHED = {"linger.ms": "600000", "batch.size": "1048576"}  # only a flush sends: one batch per partition per flush


def _many(count: int, partition: int, tag: str) -> dict:
    return {"sendMany": {"count": count, "partition": partition, "key": f"{tag}-%d", "value": f"{tag} %d {PAD}"}}


def _flushes(n: int, tag: str, per_partition=(3, 2)) -> list[dict]:
    steps = []
    for i in range(n):
        steps += [_many(c, p, f"{tag}{i}") for p, c in enumerate(per_partition) if c] + [{"flush": 1}]
    return steps


def _transactions(txn_id: str, outcomes: list[str], tag: str, per_partition=(3, 2)) -> dict:
    steps = []
    for k, outcome in enumerate(outcomes):
        steps += [{"begin": 1}, *_flushes(3, f"{tag}{k}", per_partition), {outcome: 1}]
    return {
        "op": "produce",
        "topic": TXN_TOPIC,
        "config": {"transactional.id": txn_id, "transaction.timeout.ms": "60000", **BATCHED},
        "steps": steps,
    }


def _commands() -> list[dict]:
    idem = {"enable.idempotence": "true", "acks": "all", **BATCHED}
    return [
        *({"op": "createTopic", "topic": t, "partitions": n, "configs": SMALL_SEGMENTS} for t, n in TOPICS.items()),
        {"op": "produce", "topic": IDEM_TOPIC, "config": idem, "steps": _flushes(6, "a")},
        {"op": "produce", "topic": IDEM_TOPIC, "config": idem, "steps": _flushes(5, "b", (2, 4))},
        {
            "op": "produce",
            "topic": IDEM_TOPIC,
            "config": {"enable.idempotence": "false", "acks": "1", **BATCHED},
            "steps": _flushes(2, "plain"),
        },
        _transactions("snap-txn-1", ["commit", "abort", "commit", "abort"], "t1"),
        _transactions("snap-txn-1", ["commit", "abort"], "t1again"),  # initTransactions again: the epoch bumps
        _transactions("snap-txn-2", ["commit"], "t2", (0, 4)),
    ]


# ---------------------------------------------------------------- Kafka's dump of the log, replayed


BATCH_RE = re.compile(
    r"^baseOffset: (\d+) lastOffset: (\d+) count: \d+ baseSequence: -?\d+ lastSequence: (-?\d+) "
    r"producerId: (-?\d+) producerEpoch: (-?\d+) partitionLeaderEpoch: -?\d+ isTransactional: (true|false) "
    r"isControl: (true|false) .* (?:CreateTime|LogAppendTime): (-?\d+) size: "
)
MARKER_RE = re.compile(
    r"^\| offset: \d+ (?:CreateTime|LogAppendTime): (-?\d+) .*endTxnMarker: (COMMIT|ABORT) coordinatorEpoch: (-?\d+)"
)


@dataclass
class Batch:
    base_offset: int
    last_offset: int
    last_sequence: int
    producer_id: int
    epoch: int
    transactional: bool
    control: bool
    max_timestamp: int
    marker_timestamp: int = -1
    coordinator_epoch: int = -1


def parse_batches(dump: str) -> list[Batch]:
    """The batches of DumpLogSegments --deep-iteration output of one .log file, with each marker's record."""
    out: list[Batch] = []
    for line in dump.splitlines():
        if m := BATCH_RE.match(line):
            g = m.groups()
            out.append(Batch(*map(int, g[:5]), g[5] == "true", g[6] == "true", int(g[7])))
        elif m := MARKER_RE.match(line):
            out[-1].marker_timestamp, out[-1].coordinator_epoch = int(m.group(1)), int(m.group(3))
    return out


def replay(batches: list[Batch], below: int) -> dict[int, ps.ProducerStateEntry]:
    """The producer table Kafka builds from these batches (sorted by offset) for offsets below `below`."""
    state: dict[int, dict] = {}
    for b in batches:
        if b.last_offset >= below:
            break
        if b.producer_id < 0:
            continue
        e = state.setdefault(b.producer_id, {"epoch": -1, "coord": -1, "ts": -1, "txn": -1, "batch": None})
        if b.epoch != e["epoch"]:
            e["epoch"], e["batch"] = b.epoch, None
        if b.control:
            assert b.marker_timestamp != -1, f"no marker record under the control batch at {b.base_offset}"
            e.update(coord=b.coordinator_epoch, ts=b.marker_timestamp, txn=-1)
        else:
            e["batch"] = (b.last_sequence, b.last_offset, b.last_offset - b.base_offset)
            e["ts"] = b.max_timestamp
            if b.transactional and e["txn"] < 0:
                e["txn"] = b.base_offset
    return {
        pid: ps.ProducerStateEntry(pid, e["epoch"], *(e["batch"] or (-1, -1, 0)), e["ts"], e["coord"], e["txn"])
        for pid, e in state.items()
    }


# ---------------------------------------------------------------- fixtures


@dataclass
class Snapshots:
    broker: KafkaBroker  # stopped; its classpath runs DumpLogSegments
    log_dir: Path
    files: list[str]  # every .snapshot in the stopped broker's log dir
    kafka_dump: dict[str, str]  # file -> DumpLogSegments output for it
    batches: dict[str, list[Batch]]  # partition dir name (our topics) -> its batches, from DumpLogSegments


@pytest.fixture(scope="module")
def snapshots(kafka_broker_session) -> Snapshots:
    broker = kafka_broker_session.ensure_running()
    produced = broker.tool(*_commands())
    assert all("error" not in r for res in produced[len(TOPICS) :] for r in res), produced
    parts = list(range(max(TOPICS.values())))
    asks = [
        {"op": "listOffsets", "topic": t, "partitions": parts, "spec": "latest", "isolation": iso}
        for t in TOPICS
        for iso in ("read_uncommitted", "read_committed")
    ]

    def markers_written() -> bool:  # the coordinator writes markers after commit/abort returns
        ans = broker.tool(*asks)
        return all(ans[i] == ans[i + 1] for i in range(0, len(ans), 2))

    S.wait_until(broker, markers_written, "every transaction marker in the log (LSO == log end)")
    broker.stop()  # a clean shutdown: a snapshot at each partition's log end
    log_dir = broker.log_dir
    files = sorted(str(p) for p in log_dir.glob("*/*.snapshot"))
    kafka_dump = S.split_dump(S.dump_log_segments(broker, files)[0])
    logs = sorted(str(p) for t, n in TOPICS.items() for i in range(n) for p in (log_dir / f"{t}-{i}").glob("*.log"))
    by_file = S.split_dump(S.dump_log_segments(broker, logs, "--deep-iteration")[0])
    batches: dict[str, list[Batch]] = {}
    for f in logs:
        batches.setdefault(Path(f).parent.name, []).extend(parse_batches(by_file[f]))
    for bs in batches.values():
        bs.sort(key=lambda b: b.base_offset)
    return Snapshots(broker, log_dir, files, kafka_dump, batches)


def kafkalog(*argv: str) -> tuple[int, str, str]:
    from kafkalog_ds.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv), stdin=io.BytesIO())
    return rc, out.getvalue(), err.getvalue()


def ours(path: str) -> list[ps.ProducerStateEntry]:
    fs, p = open_filesystem(path)
    return ps.entries_of(ps.read_snapshot(fs, p))


# ---------------------------------------------------------------- tests


def test_the_broker_wrote_the_cases(snapshots):
    """The scenario reaches what the checks are about: rolls inside open transactions, retained batches, an
    entry whose epoch a marker bumped or not, several producers per partition, and empty snapshots."""
    ours_by_topic = {
        t: [e for f in snapshots.files if Path(f).parent.name.startswith(t + "-") for e in ours(f)] for t in TOPICS
    }
    assert sum(len(list((snapshots.log_dir / f"{t}-0").glob("*.snapshot"))) for t in TOPICS) >= 6
    txn = ours_by_topic[TXN_TOPIC]
    assert any(e.current_txn_first_offset >= 0 for e in txn), "no snapshot taken inside an open transaction"
    assert any(e.coordinator_epoch >= 0 for e in txn)
    if snapshots.broker.major >= 4:  # Kafka 4 bumps a producer's epoch at each marker (3.9 keeps it and its batch)
        assert any(e.last_offset < 0 for e in txn), "no entry whose retained batch a marker's epoch bump dropped"
    assert any(e.last_offset >= 0 and e.current_txn_first_offset >= 0 for e in txn)
    assert len({e.producer_id for e in txn}) >= 2 and len({e.epoch for e in txn}) >= 2
    idem = ours_by_topic[IDEM_TOPIC]
    assert len({e.producer_id for e in idem}) == 2 and all(e.last_offset >= 0 for e in idem)


def test_every_snapshot_reads_as_kafka_dumps_it(snapshots):
    """Every .snapshot of the broker (our topics, Kafka's internal ones and any other test's): `kafkalog dump-log`
    prints what Kafka's DumpLogSegments prints for it."""
    assert snapshots.files
    rc, out, err = kafkalog("dump-log", "--files", ",".join(snapshots.files))
    assert (rc, err) == (0, "")
    assert S.split_dump(out) == snapshots.kafka_dump
    assert sum(len(ours(f)) for f in snapshots.files) == out.count("\nproducerId: ")


@pytest.mark.parametrize("topic", list(TOPICS))
def test_entries_are_the_log_replayed(snapshots, topic):
    """Each snapshot of our topics holds exactly the producer table of the log below its offset."""
    checked = 0
    for f in snapshots.files:
        part = Path(f).parent.name
        if not part.startswith(topic + "-"):
            continue
        offset = int(Path(f).name.split(".")[0])
        batches = snapshots.batches[part]
        got = {e.producer_id: e for e in ours(f)}
        assert got == replay(batches, offset), f
        for e in got.values():  # the batch an entry keeps is the producer's last data batch below the offset
            if e.last_offset < 0:
                continue
            mine = [b for b in batches if b.producer_id == e.producer_id and b.last_offset < offset]
            last = [b for b in mine if not b.control][-1]
            assert (last.last_offset, last.epoch, last.last_sequence) == (e.last_offset, e.epoch, e.last_sequence)
            assert mine[-1].epoch == e.epoch
        checked += 1
    assert checked >= 3


def test_kafka_reads_what_we_write(snapshots, tmp_path):
    """write_snapshot of each broker snapshot's entries gives Kafka's bytes, and Kafka's DumpLogSegments reads our
    files as it reads its own; a hand-built file with extreme values (a wrapping firstSequence, an entry without a
    batch, the int64 and int32 bounds) dumps the same from both tools."""
    fs, root = open_filesystem(str(tmp_path))
    written, expected = [], {}
    for i, f in enumerate(snapshots.files):
        d = fs.join(root, f"p{i}")
        fs.mkdirs(d)
        offset = int(Path(f).name.split(".")[0])
        path = ps.write_snapshot(fs, d, offset, ps.read_snapshot(*open_filesystem(f)))
        assert Path(path).read_bytes() == Path(f).read_bytes(), f
        written.append(path)
        expected[path] = snapshots.kafka_dump[f].replace(f, path, 1)
    extremes = ps.write_snapshot(
        fs,
        root,
        2**63 - 1,
        [
            (0, 0, 0, 0, 0, 0, 0, 0),
            (1, 2, 3, 10, 5, 1_700_000_000_000, 7, -1),  # firstSequence 3 - 5 wraps
            (2**63 - 1, 2**15 - 1, 2**31 - 1, 2**63 - 1, 2**31 - 1, 2**63 - 1, 2**31 - 1, 2**63 - 1),
            (5, -1, -1, -1, 0, -(2**63), -(2**31), -5),  # no batch, no transaction (any negative)
        ],
    )
    written.append(extremes)
    rc, out, err = kafkalog("dump-log", extremes)
    assert (rc, err) == (0, "")
    expected[extremes] = out
    kafka_out, kafka_err = S.dump_log_segments(snapshots.broker, written)
    assert S.split_dump(kafka_out) == expected
    assert "orrupt" not in kafka_err


def test_our_producer_table_is_the_brokers_snapshot(snapshots, tmp_path):
    """What a kafkalog writer would snapshot at each of the broker's snapshot offsets (ProducerTable replaying the
    broker's segments, its snapshots removed) is the broker's file, entry for entry and byte for byte."""
    checked = 0
    for topic, n in TOPICS.items():
        for p in range(n):
            part = f"{topic}-{p}"
            shutil.copytree(snapshots.log_dir / part, tmp_path / part)
            for f in (tmp_path / part).glob("*.snapshot"):
                f.unlink()
    lm = LogManager(str(tmp_path))
    for f in snapshots.files:
        part = Path(f).parent.name
        topic, _, p = part.rpartition("-")
        if topic not in TOPICS:
            continue
        offset = int(Path(f).name.split(".")[0])
        with lm.open_log(TopicPartition(topic, int(p))) as log:
            table = ProducerTable.load(log, offset)
        want = ours(f)
        assert ps.entries_of(table.to_array()) == sorted(want), f
        if want:  # Kafka orders entries by its HashMap; the bytes match once ordered the same way
            assert ps.encode_snapshot(table.to_array()) == ps.encode_snapshot(sorted(want))
        checked += 1
    assert checked >= 6
