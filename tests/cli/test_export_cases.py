"""kafkalog -> broker: the kinds of topic the engine and the CLI write, handed to a real broker (issue 33, items 1
and 3; tests/cli/test_kafka_handoff.py does the topics Spark writes).

One round for every case: the source topics are written, the same topics are created on the session's broker, the
broker is stopped cleanly, the open-transaction topic's export is refused, every other topic is exported into the
broker's log dir, and the broker is started once. Then, per case:

1. `ec-compact`: keys, values and tombstones from `kafkalog produce`, cleaned twice by `kafkalog maintain --once` on
   an injected clock: the tombstones of the first cleaning are past their delete horizon at the second (dropped),
   those of the second are inside it (kept, stamped now + delete.retention.ms), and the last ones written are still
   dirty. The broker serves exactly kafkalog's records, tombstones included; once the broker's producer has
   appended, its own cleaner compacts the topic (its cleaner-offset-checkpoint reaches the active segment) exactly
   as Kafka's rule over kafkalog's records gives.
2. `ec-aborts` (CreateTime) and `ec-last-aborted` (LogAppendTime, its last transaction aborted): transactions
   committed and aborted through the engine's transactional commit (the Spark sink's path), one aborted in one
   partition only after its writer died there. Both isolation levels, before and after a transactional producer of
   the broker's commits and aborts on top.
3. `ec-open`: a transaction still open is refused with one error line, and the target (the stopped broker's log dir,
   an empty staging directory, a staging directory that does not exist) is exactly as it was: every name, dotfiles
   and `.lock` included, byte for byte.
4. `ec-deleted`: `kafkalog delete-records` into a middle segment: the broker's log start (its load, ListOffsets
   earliest, the log-start-offset-checkpoint it writes at shutdown) is kafkalog's.
5. ListOffsets by time at the raw offset: for timestamps on COMMIT and ABORT markers, on records, between and past
   them, on both timestamp types, `Log.offset_for_timestamp` gives the broker's offset and timestamp (a marker's
   own, not the next record's); and earliest and latest at both isolation levels, and maxTimestamp.

For every case the broker loads the partitions without recovery, truncation or index rebuild, each with the
segments, log start and log end kafkalog holds. At the end the broker is stopped and kafkalog reads the broker's log
dir (after the broker's appends and cleaning) exactly as Kafka's consumer did.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os

import pyarrow as pa
import pytest

import storage.log_maintenance
from kafkalog_ds.cli import main
from storage.common.time import SYSTEM_TIME, MockTime
from storage.errors import TransactionAbortedError
from storage.log_manager import LogManager
from storage.metadata.checkpoint import LOG_START_OFFSET_CHECKPOINT_FILE, parse_checkpoint
from storage.records.record_batch import DELETE_HORIZON_FLAG_MASK, CompressionType
from storage.staging import staged_commit as sc
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from storage.transactions.transaction_coordinator import ABORT, decide
from tests.helpers import broker_checks
from tests.helpers.broker_checks import bad_lines, differences, expected_loads, kafkalog_records, wait

PARTITIONS = 2
COMPACT, ABORTS, LAST_ABORTED, DELETED, OPEN = "ec-compact", "ec-aborts", "ec-last-aborted", "ec-deleted", "ec-open"
EXPORTED = [COMPACT, ABORTS, LAST_ABORTED, DELETED]
ALL_TOPICS = [*EXPORTED, OPEN]
TRANSACTIONAL = [ABORTS, LAST_ABORTED]
ISOLATIONS = ("read_uncommitted", "read_committed")
T0 = 1_700_000_000_000
DELETE_RETENTION_MS = 3_600_000
# writer ids as the sink makes them (63-bit hashes): never ids the broker hands its own producers (from 0 up)
WRITER_A, WRITER_B = 0x2F1E_9D3C_7B5A_1234, 0x1A2B_3C4D_5E6F_7081

# the broker's configs of each topic: kafkalog's own where they matter; the compacted topic's cleaner is held off
# (a dirty ratio can never exceed 1) until the comparisons of what was exported are done
BROKER_CONFIGS = {
    COMPACT: {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "1",
        "delete.retention.ms": str(DELETE_RETENTION_MS),
    },
    ABORTS: {"retention.ms": "-1"},
    LAST_ABORTED: {"retention.ms": "-1", "message.timestamp.type": "LogAppendTime"},
    DELETED: {"retention.ms": "-1"},
    OPEN: {"retention.ms": "-1"},
}


def _cli(*argv: str, stdin: bytes = b"") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv), stdin=io.BytesIO(stdin))
    return rc, out.getvalue(), err.getvalue()


def _ok(*argv: str, stdin: bytes = b"") -> str:
    rc, out, err = _cli(*argv, stdin=stdin)
    assert rc == 0, f"kafkalog {' '.join(argv[:1])} failed:\n{out}\n{err}"
    return out


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _segment_bases(d) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(d) if n.endswith(".log") and len(n) == 24)


# ---------------------------------------------------------------- case 1: produce, maintain on an injected clock


class _Keys:
    """JSON lines for `kafkalog produce`: records of key-0..key-29 (partition: the key's number mod 2), with
    timestamps rising from T0 across every call."""

    def __init__(self):
        self.n = 0

    def lines(self, values: dict[int, bool], tag: str) -> list[dict]:
        """key number -> False for a tombstone, True for a value."""
        out = []
        for k, value in values.items():
            out.append(
                {
                    "key": f"key-{k}",
                    "value": f"{tag} value {self.n} of key-{k} ".ljust(40, ".") if value else None,
                    "timestamp": T0 + self.n,
                    "partition": k % PARTITIONS,
                    "headers": [["round", tag]] if self.n % 3 == 0 else [],
                }
            )
            self.n += 1
        return out

    def filler(self, tag: str, n: int) -> list[dict]:
        """n records per partition with keys of their own: they push what came before out of the active segment."""
        out = []
        for i in range(n * PARTITIONS):
            out.append(
                {
                    "key": f"{tag}-{i}",
                    "value": f"filler {tag} {i} ".ljust(60, "."),
                    "timestamp": T0 + self.n,
                    "partition": i % PARTITIONS,
                }
            )
            self.n += 1
        return out


def _produce(root: str, topic: str, lines: list[dict], batch_size: int = 5) -> None:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    _ok("produce", root, "--topic", topic, "--no-create", "--batch-size", str(batch_size), stdin=data)


def _maintain_at(root: str, topic: str, now_ms: int) -> str:
    """`kafkalog maintain ROOT --once --topic T` at `now_ms`: --once takes the time of its pass from the module
    clock of storage/log_maintenance.py (the loop's kafkalog_ds.cli.CLOCK only paces the passes)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(storage.log_maintenance, "SYSTEM_TIME", MockTime(now_ms))
        return _ok("maintain", root, "--once", "--topic", topic)


def _horizons(root: str, topic: str) -> dict[int, dict[int, int]]:
    """partition -> batch base offset -> its delete horizon (batches that carry one)."""
    lm = LogManager(root)
    out = {}
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            out[tp.partition] = {
                int(b): int(ts)
                for chunk in log.read(log.log_start_offset)
                for b, a, ts in zip(
                    chunk.scan.headers["base_offset"],
                    chunk.scan.headers["attributes"],
                    chunk.scan.headers["base_timestamp"],
                    strict=True,
                )
                if int(a) & DELETE_HORIZON_FLAG_MASK
            }
    return out


def _write_compacted(root: str, now_ms: int) -> dict:
    """Tombstones of three generations: `past` (stamped by the first cleaning at now - delete.retention.ms - 10
    min, so past their horizon at the second, at now), `inside` (stamped by the second), `dirty` (written after
    it: not cleaned by kafkalog)."""
    _ok(
        "topics", root, "--create", "--topic", COMPACT, "--partitions", str(PARTITIONS),
        "--config", "cleanup.policy=compact", "--config", "segment.bytes=1024",
        "--config", f"delete.retention.ms={DELETE_RETENTION_MS}", "--config", "min.cleanable.dirty.ratio=0.01",
    )  # fmt: skip
    keys = _Keys()
    past = [k for k in range(30) if k % 5 == 0]
    inside = [k for k in range(30) if k % 5 == 1]
    dirty = [k for k in range(30) if k % 5 == 2]
    _produce(root, COMPACT, keys.lines({k: True for k in range(30)}, "a"))
    _produce(root, COMPACT, keys.lines({k: k % 5 != 0 for k in range(30) if k % 5 in (0, 3)}, "b"))
    _produce(root, COMPACT, keys.filler("f1", 20))
    first = now_ms - DELETE_RETENTION_MS - 600_000
    _maintain_at(root, COMPACT, first)
    after_first = _horizons(root, COMPACT)
    _produce(root, COMPACT, keys.lines({k: k % 5 != 1 for k in range(30) if k % 5 in (1, 4)}, "c"))
    _produce(root, COMPACT, keys.filler("f2", 20))
    _maintain_at(root, COMPACT, now_ms)
    _produce(root, COMPACT, keys.lines({k: k % 5 != 2 for k in range(30) if k % 5 in (2, 3, 4)}, "d"))
    _produce(root, COMPACT, keys.filler("f3", 20))
    return dict(past=past, inside=inside, dirty=dirty, first=first, second=now_ms, after_first=after_first)


# ---------------------------------------------------------------- cases 2, 3, 5: transactions through the engine


def _rows(tag: str, first_ts: int, n: int = 6) -> pa.Table:
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.table(
        {
            "key": pa.array([f"{tag}-k{i}".encode() for i in range(n)], pa.binary()),
            "value": pa.array([f"{tag} value {i}".encode() * 2 for i in range(n)], pa.binary()),
            "timestamp": pa.array([first_ts + 7 * i for i in range(n)], pa.int64()),
            "headers": pa.array(
                [[{"key": "tag", "value": tag.encode()}] if i % 2 else [] for i in range(n)], header_type
            ),
            "partition": pa.array([i % PARTITIONS for i in range(n)], pa.int32()),
        }
    )


class _Crash(BaseException):
    pass


def _transaction(root: str, topic: str, writer: int, batch: int, tag: str, first_ts: int, outcome: str) -> None:
    """One micro-batch of a transactional writer through the engine's commit (storage/staging/staged_commit.py):
    committed; aborted (the decision goes to ABORT first: ABORT markers in every partition); or its writer dies
    once the first partition holds its data (that transaction stays open there until the writer's next commit
    aborts it)."""
    lm = LogManager(root)
    st = RecordStager(lm, writer, topic=topic, compression=CompressionType.NONE)
    st.add(_rows(tag, first_ts))
    staged = [st.finish()]
    if outcome == "commit":
        commit_staged(lm, writer, batch, staged, transactional=True)
    elif outcome == "abort":
        real = sc.decide

        def aborted_first(fs, path, wanted, detail):
            decide(fs, path, ABORT, {"reason": "test"})
            return real(fs, path, wanted, detail)

        sc.decide = aborted_first
        try:
            with pytest.raises(TransactionAbortedError):
                commit_staged(lm, writer, batch, staged, transactional=True)
        finally:
            sc.decide = real
    else:
        assert outcome == "crash"
        real_data = sc._transaction_data

        def die(*a, **kw):
            real_data(*a, **kw)
            raise _Crash()

        sc._transaction_data = die
        try:
            with pytest.raises(_Crash):
                commit_staged(lm, writer, batch, staged, transactional=True)
        finally:
            sc._transaction_data = real_data


def _write_transactions(root: str, topic: str, plan: list[tuple[int, int, str]], configs: dict) -> None:
    """plan: (writer, batch, outcome) in order; record timestamps rise with it (CreateTime, as given)."""
    LogManager(root).create_topic(topic, PARTITIONS, {"segment.bytes": "600", "retention.ms": "-1", **configs})
    for i, (writer, batch, outcome) in enumerate(plan):
        _transaction(root, topic, writer, batch, f"{topic}-{i}", T0 + 1000 * i, outcome)


ABORTS_PLAN = [  # ends committed; A's batch 2 first dies in partition 0, its restart aborts it there and commits it
    (WRITER_A, 0, "commit"),
    (WRITER_A, 1, "abort"),
    (WRITER_A, 2, "crash"),
    (WRITER_A, 2, "commit"),
    (WRITER_B, 0, "commit"),
    (WRITER_A, 3, "commit"),
]
LAST_ABORTED_PLAN = [(WRITER_A, 0, "commit"), (WRITER_A, 1, "abort"), (WRITER_B, 0, "commit"), (WRITER_A, 2, "abort")]


# ---------------------------------------------------------------- case 4: delete-records


def _write_deleted(root: str) -> int:
    """Several segments per partition from `kafkalog produce`; partition 0's log start moved into a middle one."""
    _ok(
        "topics", root, "--create", "--topic", DELETED, "--partitions", str(PARTITIONS),
        "--config", "segment.bytes=700", "--config", "retention.ms=-1",
    )  # fmt: skip
    lines = [
        {
            "key": None if i % 7 == 0 else f"user-{i % 11}",
            "value": f"event {i} ".ljust(50, "-"),
            "timestamp": T0 + 10 * i,
            "partition": i % PARTITIONS,
        }
        for i in range(100)
    ]
    _produce(root, DELETED, lines)
    with LogManager(root).open_log(TopicPartition(DELETED, 0)) as log:
        bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4, bases
    to = bases[len(bases) // 2] + 2
    _ok("delete-records", root, "--topic", DELETED, "--partition", "0", "--offset", str(to))
    return to


# ---------------------------------------------------------------- reading both sides


def _tree(path) -> dict[str, bytes | None]:
    """Every entry below `path`, dotfiles included: relative name -> its bytes (None for a directory)."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        rel = os.path.relpath(dirpath, path)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d)) + "/"] = None
        for f in filenames:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.normpath(os.path.join(rel, f))] = fh.read()
    return out


def _changed(before: dict, after: dict) -> list[str]:
    return sorted(
        [f"+ {n}" for n in after.keys() - before.keys()]
        + [f"- {n}" for n in before.keys() - after.keys()]
        + [f"~ {n}" for n in before.keys() & after.keys() if before[n] != after[n]]
    )


def _loads(root: str, topic: str) -> dict[int, tuple[int, int, int]]:
    """partition -> (segments, log start, log end) the broker must load (broker_checks.expected_loads)."""
    return {tp.partition: v for tp, v in expected_loads(LogManager(root), topic).items()}


def _stamps(root: str, topic: str) -> dict[int, dict[int, tuple[int, str]]]:
    """partition -> offset -> (timestamp, what: "record", "COMMIT" or "ABORT"), every offset of the log."""
    lm = LogManager(root)
    out = {}
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            data = {o for b in log.read_records(log.log_start_offset) for o in b.column("offset").to_pylist()}
            at = {}
            for b in log.read_records(log.log_start_offset, skip_control=False):
                d = b.to_pydict()
                for o, ts, key in zip(d["offset"], d["timestamp"], d["key"], strict=True):
                    at[o] = (ts, "record" if o in data else ("COMMIT" if key[2:4] == b"\x00\x01" else "ABORT"))
        out[tp.partition] = at
    return out


def _time_lookups(root: str, topic: str) -> tuple[list[int], dict[int, dict[int, tuple[int, int]]], dict]:
    """The timestamps to look up in a topic, kafkalog's answer to each per partition as (offset, timestamp) or
    (-1, -1), and how many answers landed on what. Looked up: in partition 0, every marker's timestamp, and of
    each run of data the first record's, the one after it, the one after its last record's (a CreateTime topic's
    records are older than the markers: that lands on the next marker); partition 1's ABORT markers'; one before
    everything, the largest, one past everything."""
    stamps = _stamps(root, topic)
    first = stamps[0]
    offsets = sorted(first)
    wanted = {ts for ts, what in stamps[1].values() if what == "ABORT"}
    for i, o in enumerate(offsets):
        ts, what = first[o]
        if what != "record":
            wanted.add(ts)
        else:
            if i == 0 or first[offsets[i - 1]][1] != "record":
                wanted |= {ts, ts + 1}
            if i + 1 == len(offsets) or first[offsets[i + 1]][1] != "record":
                wanted.add(ts + 1)
    everything = [ts for at in stamps.values() for ts, _ in at.values()]
    wanted |= {min(everything) - 1, max(everything), max(everything) + 1}
    lm = LogManager(root)
    expected: dict[int, dict[int, tuple[int, int]]] = {}
    landed = {"record": 0, "COMMIT": 0, "ABORT": 0, "none": 0}
    for ts in sorted(wanted):
        expected[ts] = {}
        for tp in lm.partitions(topic):
            with lm.open_log(tp) as log:
                off = log.offset_for_timestamp(ts)
            if off is None:
                expected[ts][tp.partition] = (-1, -1)
                landed["none"] += 1
            else:  # the raw offset: a marker's own when the search stops on one
                expected[ts][tp.partition] = (off, stamps[tp.partition][off][0])
                landed[stamps[tp.partition][off][1]] += 1
    return sorted(wanted), expected, landed


def _engine_specs(root: str, topic: str) -> dict[tuple[str, str], dict[int, tuple[int, int]]]:
    """kafkalog's answers to ListOffsets earliest and latest at both isolation levels, and maxTimestamp."""
    lm = LogManager(root)
    stamps = _stamps(root, topic)
    out: dict[tuple[str, str], dict[int, tuple[int, int]]] = {}
    for isolation in ISOLATIONS:
        for spec in ("earliest", "latest") + (("maxTimestamp",) if isolation == "read_uncommitted" else ()):
            out[spec, isolation] = {}
            for tp in lm.partitions(topic):
                with lm.open_log(tp) as log:
                    if spec == "earliest":
                        want = (log.log_start_offset, -1)
                    elif spec == "latest":
                        lso = log.last_stable_offset
                        want = (lso if isolation == "read_committed" else log.log_end_offset, -1)
                    else:  # markers count: the first offset holding the largest timestamp
                        at = stamps[tp.partition]
                        top = max(ts for ts, _ in at.values())
                        want = (min(o for o, (ts, _) in at.items() if ts == top), top)
                out[spec, isolation][tp.partition] = want
    return out


def _list_offsets(topic: str, spec, isolation: str = "read_uncommitted") -> dict:
    return {
        "op": "listOffsets",
        "topic": topic,
        "partitions": list(range(PARTITIONS)),
        "spec": spec,
        "isolation": isolation,
    }


def _answers(result: dict) -> dict[int, tuple[int, int]]:
    return {int(p): (v["offset"], v["timestamp"]) for p, v in result.items()}


# ---------------------------------------------------------------- the round


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    work = tmp_path_factory.mktemp("export-cases")
    root, open_root = str(work / "logs"), str(work / "open-logs")
    now = SYSTEM_TIME.milliseconds()
    compacted = _write_compacted(root, now)
    _write_transactions(root, ABORTS, ABORTS_PLAN, {})
    _write_transactions(root, LAST_ABORTED, LAST_ABORTED_PLAN, {"message.timestamp.type": "LogAppendTime"})
    deleted_to = _write_deleted(root)
    _write_transactions(open_root, OPEN, [(WRITER_A, 0, "commit"), (WRITER_A, 1, "crash")], {})
    with LogManager(open_root).open_log(TopicPartition(OPEN, 0)) as log:
        open_at = log.last_stable_offset
        assert open_at < log.log_end_offset
    return dict(root=root, open_root=open_root, compacted=compacted, deleted_to=deleted_to, open_at=open_at)


@pytest.fixture(scope="module")
def handed(sources, kafka_broker_session, tmp_path_factory):
    """Create every topic on the broker, stop it, refuse the open transaction, export the others, start it and
    wait for its loads (once per broker version; the sources are the same)."""
    root = sources["root"]
    b = kafka_broker_session.ensure_running()
    created = b.tool(
        *({"op": "createTopic", "topic": t, "partitions": PARTITIONS, "configs": BROKER_CONFIGS[t]} for t in ALL_TOPICS)
    )
    topic_ids = {t: r["topicId"] for t, r in zip(ALL_TOPICS, created, strict=True)}
    log_dir = b.log_dir
    wait(
        lambda: all(
            (log_dir / f"{t}-{p}" / "partition.metadata").exists() for t in ALL_TOPICS for p in range(PARTITIONS)
        ),
        "the new topics' partition directories",
        b,
    )
    b.stop()

    # case 3: the refusals, into the stopped broker's log dir and two staging directories
    refusals = {}
    targets = tmp_path_factory.mktemp("open-targets")
    staging, missing = targets / "staging", targets / "missing"
    staging.mkdir()
    for target, path, extra in (
        ("broker log dir", log_dir, []),
        ("empty staging directory", staging, ["--topic-id", topic_ids[OPEN]]),
        ("missing staging directory", missing, ["--topic-id", topic_ids[OPEN]]),
    ):
        before = _tree(path) if path.exists() else None
        rc, out, err = _cli("export-to-broker", sources["open_root"], "--topic", OPEN, "--to", str(path), *extra)
        after = _tree(path) if path.exists() else None
        refusals[target] = dict(rc=rc, out=out, err=err, before=before, after=after)

    exports = {t: _ok("export-to-broker", root, "--topic", t, "--to", str(log_dir)) for t in EXPORTED}
    exported_checkpoints = {
        name: parse_checkpoint((log_dir / name).read_bytes())
        for name in (LOG_START_OFFSET_CHECKPOINT_FILE, "cleaner-offset-checkpoint")
    }

    b.start()
    for t in ALL_TOPICS:
        for p in range(PARTITIONS):
            b.wait_for_log(f"Completed load of Log(dir={log_dir / f'{t}-{p}'},", f"the load of {t}-{p}")
    return dict(
        broker=b,
        log_dir=log_dir,
        topic_ids=topic_ids,
        refusals=refusals,
        exports=exports,
        exported_checkpoints=exported_checkpoints,
        broker_log=b.log_since_start(),
    )


def _sends(topic: str, tag: str, n: int, t0: int) -> list[dict]:
    """n records per partition for Kafka's producer (KafkaTool "send" steps), explicit timestamps from t0."""
    return [
        {
            "partition": p,
            "key": _b64(f"{tag}-{p}-{i}".encode()),
            "value": _b64(f"{topic} {tag} by the broker {p}-{i}".encode()),
            "timestamp": t0 + 10 * i,
            "headers": [["from", _b64(b"kafka")], ["none", None]] if i % 2 else [],
        }
        for p in range(PARTITIONS)
        for i in range(n)
    ]


def _sent(sends: list[dict], acks: list[dict], timestamp_type: str) -> dict[int, list[tuple]]:
    """partition -> the records Kafka's producer appended, at the offsets and timestamps the broker acknowledged."""
    out: dict[int, list[tuple]] = {p: [] for p in range(PARTITIONS)}
    for s, ack in zip(sends, acks, strict=True):
        assert "error" not in ack, ack
        out[ack["partition"]].append(
            (
                ack["offset"],
                ack["timestamp"],
                timestamp_type,
                None if s["key"] is None else base64.b64decode(s["key"]),
                None if s["value"] is None else base64.b64decode(s["value"]),
                tuple((k, None if v is None else base64.b64decode(v)) for k, v in s["headers"]),
            )
        )
    return out


def _joined(*parts: dict[int, list[tuple]]) -> dict[int, list[tuple]]:
    return {p: sorted(r for part in parts for r in part.get(p, [])) for p in range(PARTITIONS)}


T_NEW = T0 + 50_000_000  # the timestamps of what Kafka's producer appends
# one batch per partition and flush: a transactional producer's next batch does not overtake its first while the
# broker still verifies the partition's place in the transaction (Kafka logs that OutOfOrderSequence at ERROR)
ONE_BATCH = {"linger.ms": "600000", "batch.size": "1048576"}
APPENDS = {  # what Kafka's producer appends: (sends committed, sends aborted) of each topic
    **{t: (_sends(t, "committed", 3, T_NEW), _sends(t, "aborted", 2, T_NEW + 100)) for t in TRANSACTIONAL},
    DELETED: (_sends(DELETED, "appended", 3, T_NEW), []),
    COMPACT: (  # new values for a tombstone's key of the last two generations, a tombstone, a new key
        [
            {"partition": p, "key": _b64(k), "value": v and _b64(v), "timestamp": T_NEW + i, "headers": []}
            for i, (p, k, v) in enumerate(
                [(0, b"key-2", b"appended value"), (1, b"key-11", b"appended value"), (1, b"key-13", None)]
                + [(0, b"key-new", b"a new key")]
            )
        ],
        [],
    ),
}


@pytest.fixture(scope="module")
def served(sources, handed):
    """One run of Kafka's clients. First what the broker serves before anything else touches the exported topics:
    every record at both isolation levels, ListOffsets earliest and latest at both and maxTimestamp, ListOffsets by
    time for the timestamps case 5 looks up. Then Kafka's producers append on top of every exported topic (a
    transactional producer commits a transaction and aborts one), and the compacted topic's cleaner is let go
    (min.cleanable.dirty.ratio 0.01)."""
    root, b = sources["root"], handed["broker"]
    assert b.running
    commands, keys = [], []
    for t in EXPORTED:
        for isolation in ISOLATIONS:
            commands.append({"op": "consume", "topic": t, "isolation": isolation})
            keys.append(("consume", t, isolation))
            for spec in ("earliest", "latest") + (("maxTimestamp",) if isolation == "read_uncommitted" else ()):
                commands.append(_list_offsets(t, spec, isolation))
                keys.append((spec, t, isolation))
    lookups = {}
    for t in TRANSACTIONAL:
        lookups[t] = _time_lookups(root, t)
        for ts in lookups[t][0]:
            commands.append(_list_offsets(t, ts))
            keys.append(("time", t, ts))
    for t, (committed, aborted) in APPENDS.items():
        if t in TRANSACTIONAL:
            steps = [{"begin": 1}, *({"send": s} for s in committed), {"commit": 1}]
            steps += [{"begin": 1}, *({"send": s} for s in aborted), {"flush": 1}, {"abort": 1}]
            config = {"transactional.id": f"{t}-after-export", **ONE_BATCH}
        else:
            steps, config = [{"send": s} for s in committed], ONE_BATCH
        commands.append({"op": "produce", "topic": t, "config": config, "steps": steps})
        keys.append(("produce", t))
    commands.append({"op": "alterConfigs", "topic": COMPACT, "set": {"min.cleanable.dirty.ratio": "0.01"}})
    keys.append(("alterConfigs", COMPACT))
    results = dict(zip(keys, b.tool(*commands), strict=True))
    consumed = {
        (t, isolation): broker_checks.consumed_rows(results["consume", t, isolation], PARTITIONS)
        for t in EXPORTED
        for isolation in ISOLATIONS
    }
    appended = {}
    for t, (committed, aborted) in APPENDS.items():
        stamp = "LogAppendTime" if t == LAST_ABORTED else "CreateTime"
        acks = results["produce", t]
        appended[t] = (_sent(committed, acks[: len(committed)], stamp), _sent(aborted, acks[len(committed) :], stamp))
    return dict(results=results, consumed=consumed, lookups=lookups, appended=appended)


@pytest.fixture(scope="module")
def appended(handed, served):
    """The broker's cleaner compacts the compacted topic up to its active segment; then what Kafka's consumer reads
    of every topic; then the broker is stopped cleanly (its checkpoints written) and kafkalog reads its log dir."""
    b, log_dir = handed["broker"], handed["log_dir"]
    assert b.running
    exported_cleaned = handed["exported_checkpoints"]["cleaner-offset-checkpoint"]

    def cleaned_to_active():
        path = log_dir / "cleaner-offset-checkpoint"
        done = parse_checkpoint(path.read_bytes()) if path.exists() else {}
        return all(
            done.get(tp) == _segment_bases(log_dir / f"{COMPACT}-{p}")[-1] and done[tp] > exported_cleaned[tp]
            for p in range(PARTITIONS)
            for tp in [TopicPartition(COMPACT, p)]
        )

    wait(cleaned_to_active, f"the broker's cleaner to compact {COMPACT} up to its active segment", b)
    cleaned_at = SYSTEM_TIME.milliseconds()
    active = {p: _segment_bases(log_dir / f"{COMPACT}-{p}")[-1] for p in range(PARTITIONS)}
    commands = [{"op": "consume", "topic": t, "isolation": i} for t in EXPORTED for i in ISOLATIONS]
    commands += [_list_offsets(DELETED, "earliest", i) for i in ISOLATIONS]
    results = b.tool(*commands)
    consumed = {
        (t, i): broker_checks.consumed_rows(results[n], PARTITIONS)
        for n, (t, i) in enumerate((t, i) for t in EXPORTED for i in ISOLATIONS)
    }
    earliest = {i: _answers(r) for i, r in zip(ISOLATIONS, results[len(consumed) :], strict=True)}
    broker_log = b.log_since_start()
    b.stop()  # a clean shutdown: the broker writes its checkpoints, and kafkalog reads a log dir nobody writes
    checkpoints = {
        name: parse_checkpoint((log_dir / name).read_bytes())
        for name in (LOG_START_OFFSET_CHECKPOINT_FILE, "cleaner-offset-checkpoint")
    }
    read = {(t, i): kafkalog_records(str(log_dir), t, isolation_level=i) for t in EXPORTED for i in ISOLATIONS}
    return dict(
        active=active,
        consumed=consumed,
        earliest=earliest,
        broker_log=broker_log,
        checkpoints=checkpoints,
        read=read,
        horizons=_record_horizons(str(log_dir), COMPACT),
        cleaned_at=cleaned_at,
    )


def _record_horizons(root: str, topic: str) -> dict[int, dict[int, int | None]]:
    """partition -> record offset -> the delete horizon of its batch (None: it has none)."""
    lm = LogManager(root)
    out = {}
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            batches = [
                (int(b), int(b) + int(d), int(ts) if int(a) & DELETE_HORIZON_FLAG_MASK else None)
                for chunk in log.read(log.log_start_offset)
                for b, d, a, ts in zip(
                    chunk.scan.headers["base_offset"],
                    chunk.scan.headers["last_offset_delta"],
                    chunk.scan.headers["attributes"],
                    chunk.scan.headers["base_timestamp"],
                    strict=True,
                )
            ]
        rows = kafkalog_records(root, topic)[tp.partition]
        out[tp.partition] = {r[0]: next(h for b, last, h in batches if b <= r[0] <= last) for r in rows}
    return out


# ---------------------------------------------------------------- (a) every case: the load


@pytest.mark.kafka
@pytest.mark.every_broker
def test_the_broker_loads_every_exported_partition_as_kafkalog_holds_it(sources, handed):
    """No recovery, truncation, index rebuild, stray directory or warning naming the topics; each partition loaded
    with the exported segments, kafkalog's log start and log end (the refused topic: as the broker made it)."""
    bad = bad_lines(handed["broker_log"], ALL_TOPICS)
    assert bad == [], "\n".join(bad[:20])
    loaded = {}
    for m in broker_checks.LOAD_RE.finditer(handed["broker_log"]):
        topic, _, p = os.path.basename(m["dir"]).rpartition("-")
        if topic in ALL_TOPICS:
            assert (topic, int(p)) not in loaded, f"{topic}-{p} loaded twice"
            loaded[topic, int(p)] = (int(m["segments"]), int(m["start"]), int(m["end"]))
    expected = {(t, p): v for t in EXPORTED for p, v in _loads(sources["root"], t).items()}
    expected |= {(OPEN, p): (1, 0, 0) for p in range(PARTITIONS)}
    assert loaded == expected
    assert all(segments > 1 for (t, _), (segments, _, _) in loaded.items() if t != OPEN)


# ---------------------------------------------------------------- (b) every case: the records at both isolation levels


@pytest.mark.kafka
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("topic", EXPORTED)
def test_kafkas_consumer_reads_what_kafkalog_reads(sources, served, topic, isolation):
    want = kafkalog_records(sources["root"], topic, isolation_level=isolation)
    got = served["consumed"][topic, isolation]
    assert differences(want, got) == []
    assert all(want.values())


# ---------------------------------------------------------------- case 1: the compacted topic


@pytest.mark.kafka
def test_kafkalogs_cleaner_dropped_the_tombstones_past_their_horizon_and_kept_the_others(sources):
    """On the injected clock: the first cleaning stamped the first tombstones with its time + delete.retention.ms;
    the second, past that horizon, dropped them (no record of those keys is left) and stamped the tombstones it
    kept with its own time + delete.retention.ms; the tombstones written after it are unstamped."""
    c = sources["compacted"]
    first = c["after_first"]
    assert all(first.values()) and {h for hs in first.values() for h in hs.values()} == {
        c["first"] + DELETE_RETENTION_MS
    }
    records = kafkalog_records(sources["root"], COMPACT)
    horizons = _record_horizons(sources["root"], COMPACT)
    keys = {r[3] for rows in records.values() for r in rows}
    assert not keys & {f"key-{k}".encode() for k in c["past"]}
    tombstones = {(p, r[3]): horizons[p][r[0]] for p, rows in records.items() for r in rows if r[4] is None}
    assert tombstones == {
        **{(k % PARTITIONS, f"key-{k}".encode()): c["second"] + DELETE_RETENTION_MS for k in c["inside"]},
        **{(k % PARTITIONS, f"key-{k}".encode()): None for k in c["dirty"]},
    }
    cleaned = LogManager(sources["root"]).checkpoint_file("cleaner-offset-checkpoint").read()
    for p, rows in records.items():  # below kafkalog's cleaner checkpoint, one record per key
        to = cleaned[TopicPartition(COMPACT, p)]
        below = [r[3] for r in rows if r[0] < to]
        assert 0 < len(below) < to and len(below) == len(set(below)), (p, to, below)
        assert any(r[0] >= to and r[3] in below for r in rows)  # and dirty records of those keys after it


@pytest.mark.kafka
def test_the_broker_serves_the_tombstones_kafkalog_kept(sources, served):
    kept = {
        (p, r[0], r[3]) for p, rows in kafkalog_records(sources["root"], COMPACT).items() for r in rows if r[4] is None
    }
    for isolation in ISOLATIONS:
        given = {
            (p, r[0], r[3]) for p, rows in served["consumed"][COMPACT, isolation].items() for r in rows if r[4] is None
        }
        assert given == kept
    c = sources["compacted"]
    assert {k for _, _, k in kept} == {f"key-{k}".encode() for k in c["inside"] + c["dirty"]}


@pytest.mark.kafka
def test_the_brokers_cleaner_compacts_the_exported_topic_after_its_appends(sources, handed, served, appended):
    """The broker's cleaner, from the cleaner-offset-checkpoint the export wrote up to its active segment, keeps
    exactly what Kafka's rule gives over kafkalog's records and the broker's appends: in that dirty range the
    latest record of each key, below it every record no newer one in the range replaces, at and past the active
    segment everything; tombstones stay (their horizons, kafkalog's and the broker's, are ahead). A tombstone
    kafkalog stamped keeps kafkalog's delete horizon; one it left dirty gets the broker's (its clock + the
    topic's delete.retention.ms)."""
    start = handed["exported_checkpoints"]["cleaner-offset-checkpoint"]
    kafkalogs = LogManager(sources["root"]).checkpoint_file("cleaner-offset-checkpoint").read()
    assert {tp: o for tp, o in start.items() if tp.topic in ALL_TOPICS} == kafkalogs
    old = kafkalog_records(sources["root"], COMPACT)
    new = served["appended"][COMPACT][0]
    dropped = 0
    for p in range(PARTITIONS):
        rows = sorted(old[p] + new[p])
        first_dirty, active = start[TopicPartition(COMPACT, p)], appended["active"][p]
        latest = {}
        for r in rows:
            if first_dirty <= r[0] < active:
                latest[r[3]] = r[0]
        want = [r for r in rows if r[0] >= active or r[0] >= latest.get(r[3], -1)]
        dropped += len(rows) - len(want)
        for isolation in ISOLATIONS:
            got = appended["consumed"][COMPACT, isolation][p]
            assert differences({p: want}, {p: got}) == [], (p, isolation)
        assert appended["checkpoints"]["cleaner-offset-checkpoint"][TopicPartition(COMPACT, p)] == active
    assert dropped > 0
    c = sources["compacted"]
    stamped = {
        r[3]: appended["horizons"][p][r[0]]
        for p, rows in appended["consumed"][COMPACT, "read_uncommitted"].items()
        for r in rows
        if r[4] is None and r[0] < appended["active"][p]
    }
    for k in c["inside"]:
        assert stamped[f"key-{k}".encode()] == c["second"] + DELETE_RETENTION_MS, k
    for k in c["dirty"]:
        if f"key-{k}".encode() in stamped:  # (not replaced by the broker's appends)
            horizon = stamped[f"key-{k}".encode()]
            assert horizon is not None and c["second"] < horizon - DELETE_RETENTION_MS <= appended["cleaned_at"], k
    bad = bad_lines(appended["broker_log"], ALL_TOPICS)
    assert bad == [], "\n".join(bad[:20])


# ---------------------------------------------------------------- case 2: aborted transactions


@pytest.mark.kafka
def test_the_transactional_sources_hold_aborts_and_a_last_abort(sources):
    """ec-aborts: an abort in both partitions and one in partition 0 only, then commits; ec-last-aborted: its last
    transaction aborted in every partition, its records stamped with the append time."""
    lm = LogManager(sources["root"])
    for t in TRANSACTIONAL:
        stamps = _stamps(sources["root"], t)
        for p in range(PARTITIONS):
            with lm.open_log(TopicPartition(t, p)) as log:
                assert log.last_stable_offset == log.log_end_offset
                assert len(log.segments) >= 3
            markers = [what for _, (_, what) in sorted(stamps[p].items()) if what != "record"]
            assert "ABORT" in markers and "COMMIT" in markers
            assert markers[-1] == ("ABORT" if t == LAST_ABORTED else "COMMIT")
        committed = kafkalog_records(sources["root"], t, isolation_level="read_committed")
        everything = kafkalog_records(sources["root"], t)
        assert all(len(committed[p]) < len(everything[p]) for p in range(PARTITIONS))
        types = {r[2] for rows in everything.values() for r in rows}
        assert types == {"LogAppendTime" if t == LAST_ABORTED else "CreateTime"}
    aborts = {
        p: [w for _, (_, w) in sorted(_stamps(sources["root"], ABORTS)[p].items())].count("ABORT") for p in range(2)
    }
    assert aborts == {0: 2, 1: 1}


@pytest.mark.kafka
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("topic", [*TRANSACTIONAL, DELETED])
def test_the_brokers_producer_appends_on_top(sources, served, appended, topic, isolation):
    """The records kafkalog exported, then what Kafka's producer appended (a transaction it aborted only at
    read_uncommitted), at the offsets and timestamps the broker acknowledged."""
    committed, aborted = served["appended"][topic]
    old = kafkalog_records(sources["root"], topic, isolation_level=isolation)
    want = _joined(old, committed) if isolation == "read_committed" else _joined(old, committed, aborted)
    assert differences(want, appended["consumed"][topic, isolation]) == []
    assert all(committed.values())


@pytest.mark.kafka
@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("topic", EXPORTED)
def test_kafkalog_reads_the_brokers_log_dir_as_kafkas_consumer_does(appended, topic, isolation):
    """After the broker's appends, transactions and cleaning, and its clean shutdown."""
    assert differences(appended["consumed"][topic, isolation], appended["read"][topic, isolation]) == []


# ---------------------------------------------------------------- case 3: an open transaction


@pytest.mark.kafka
@pytest.mark.parametrize("target", ["broker log dir", "empty staging directory", "missing staging directory"])
def test_an_open_transaction_is_refused_and_the_target_is_exactly_as_it_was(sources, handed, target):
    r = handed["refusals"][target]
    err = r["err"]
    assert r["rc"] == 1 and r["out"] == "" and err.startswith("kafkalog: error: ") and len(err.splitlines()) == 1, err
    assert f"{OPEN}-0: the transaction of producer {WRITER_A} from offset {sources['open_at']} is still open" in err
    if r["before"] is None:
        assert r["after"] is None, "the export made the missing directory"
    else:  # every name, dotfiles and `.lock` included, byte for byte
        assert _changed(r["before"], r["after"]) == []


# ---------------------------------------------------------------- case 4: delete-records


@pytest.mark.kafka
def test_the_log_start_after_delete_records_is_the_brokers(sources, handed, served, appended):
    """Kafkalog's log start, in a middle segment of partition 0: the log-start-offset-checkpoint the export wrote
    and the one the broker wrote at its shutdown, ListOffsets earliest after the load and after the appends."""
    to = sources["deleted_to"]
    lm = LogManager(sources["root"])
    starts = {}
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition(DELETED, p)) as log:
            starts[p] = log.log_start_offset
            bases = [s.base_offset for s in log.segments]
        if p == 0:
            assert bases[0] < to and to not in bases and bases[1] < to < bases[-1]
    assert starts == {0: to, 1: 0}
    for isolation in ISOLATIONS:
        assert _answers(served["results"]["earliest", DELETED, isolation]) == {p: (o, -1) for p, o in starts.items()}
        assert appended["earliest"][isolation] == {p: (o, -1) for p, o in starts.items()}
    for checkpoints in (handed["exported_checkpoints"], appended["checkpoints"]):  # only above a first segment's base
        ckpt = checkpoints[LOG_START_OFFSET_CHECKPOINT_FILE]
        assert {tp: o for tp, o in ckpt.items() if tp.topic in EXPORTED} == {TopicPartition(DELETED, 0): to}


# ---------------------------------------------------------------- case 5: ListOffsets at the raw offset


@pytest.mark.kafka
@pytest.mark.parametrize("topic", TRANSACTIONAL)
def test_list_offsets_by_time_lands_on_the_raw_offset_as_the_broker_does(sources, served, topic):
    """For each timestamp looked up, kafkalog's offset_for_timestamp and the timestamp at that offset are the
    broker's ListOffsets answer: a transaction marker's own offset where the search stops on one, not the next
    record's."""
    wanted, expected, landed = served["lookups"][topic]
    diffs = []
    for ts in wanted:
        have = _answers(served["results"]["time", topic, ts])
        if have != expected[ts]:
            diffs.append(f"ListOffsets {ts}: broker {have}, kafkalog {expected[ts]}")
    assert diffs == [], "\n".join(diffs)
    # the lookups reached every kind of offset: COMMIT and ABORT markers, records, none
    assert all(landed.values()), landed
    print(f"\n{topic}: {len(wanted)} timestamps x {PARTITIONS} partitions, answers on {landed}: 0 differences")


@pytest.mark.kafka
@pytest.mark.parametrize("topic", EXPORTED)
def test_list_offsets_earliest_latest_and_max_timestamp_are_kafkalogs(sources, served, topic):
    """Earliest: the log start; latest: the log end, and at read_committed the last stable offset; maxTimestamp:
    the first offset holding the largest timestamp, markers counted (they carry the clock of their commit)."""
    diffs = []
    for (spec, isolation), want in _engine_specs(sources["root"], topic).items():
        have = _answers(served["results"][spec, topic, isolation])
        if have != want:
            diffs.append(f"ListOffsets {spec} ({isolation}): broker {have}, kafkalog {want}")
    assert diffs == [], "\n".join(diffs)
