"""One hand-off round for the export cases (tests/cli/test_export_places.py, tests/spark/test_export_spark_topics.py):
the topics created on a broker, the broker stopped cleanly, the export, the broker started and its loads awaited;
and what the checks compare: the broker's "Completed load" lines against the partitions' shape in kafkalog, the
records kafkalog's engine reads (any ROOT, S3 included), what Kafka's producer appended on top.

Records have broker_checks' shape: (offset, timestamp, timestampType, key, value, headers).
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
from pathlib import Path

from kafkalog_ds.cli import main
from storage.topic_partition import TopicPartition
from tests.helpers.broker_checks import (
    LOAD_RE,
    consumed_rows,
    differences,
    wait,
)

ISOLATIONS = ("read_uncommitted", "read_committed")


def run_cli(*argv: str, stdin: bytes = b"") -> tuple[int, str, str]:
    """One `kafkalog` command in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv), stdin=io.BytesIO(stdin))
    return rc, out.getvalue(), err.getvalue()


def log_dirs_of(broker) -> list[Path]:
    """The broker's log dirs: several when it was made with log_dirs=n, else its one."""
    return [Path(d) for d in (getattr(broker, "log_dirs", None) or [broker.log_dir])]


def partition_dirs(broker, topic: str, partitions: int) -> dict[int, Path]:
    """partition -> the directory the broker made for it, in whichever of its log dirs it put it."""
    found = {}
    for d in log_dirs_of(broker):
        for p in range(partitions):
            if (d / f"{topic}-{p}" / "partition.metadata").exists():
                found[p] = d / f"{topic}-{p}"
    return found


def create_topics(broker, topics: dict[str, tuple[int, dict]]) -> dict[str, str]:
    """Create each topic (name -> (partitions, configs)) on the running broker and wait until it has made every
    partition's directory; returns name -> TopicId."""
    created = broker.tool(
        *({"op": "createTopic", "topic": t, "partitions": n, "configs": configs} for t, (n, configs) in topics.items())
    )
    wait(
        lambda: all(len(partition_dirs(broker, t, n)) == n for t, (n, _) in topics.items()),
        "the new topics' partition directories",
        broker,
    )
    return {t: r["topicId"] for t, r in zip(topics, created, strict=True)}


def wait_for_loads(broker, topics: dict[str, int]) -> str:
    """After a start: wait for the "Completed load" line of every partition; returns the log since the start."""
    for t, n in topics.items():
        for p, d in partition_dirs(broker, t, n).items():
            broker.wait_for_log(f"Completed load of Log(dir={d},", f"the load of {t}-{p}")
    return broker.log_since_start()


def loads(log: str, topics) -> dict[TopicPartition, tuple[int, int, int]]:
    """(segments, log start, log end) of every "Completed load" line of these topics in a broker's log."""
    out = {}
    for m in LOAD_RE.finditer(log):
        topic, _, p = os.path.basename(m["dir"]).rpartition("-")
        if topic in topics:
            tp = TopicPartition(topic, int(p))
            assert tp not in out, f"{tp} loaded twice:\n{log[-3000:]}"
            out[tp] = (int(m["segments"]), int(m["start"]), int(m["end"]))
    return out


def consume_commands(topics, **consume) -> list[dict]:
    """KafkaTool consume commands: every record of each topic, at each isolation level (topic-major order)."""
    return [{"op": "consume", "topic": t, "isolation": iso, **consume} for t in topics for iso in ISOLATIONS]


def consumed_by_isolation(topics, partitions: int, results: list) -> dict[str, dict[str, dict[int, list[tuple]]]]:
    """The results of consume_commands: isolation -> topic -> partition -> records (broker_checks.consumed's
    shape per isolation level)."""
    out: dict[str, dict] = {iso: {} for iso in ISOLATIONS}
    it = iter(results)
    for t in topics:
        for iso in ISOLATIONS:
            out[iso][t] = consumed_rows(next(it), partitions)
    return out


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def sends(tag: str, partitions: int, n: int, t0: int, *, null_key: bool = True) -> list[dict]:
    """n records per partition for Kafka's producer (KafkaTool "send" steps): keys, a null key (unless a compacted
    topic, which refuses it), headers, explicit timestamps from t0."""
    out = []
    for p in range(partitions):
        for i in range(n):
            out.append(
                {
                    "partition": p,
                    "key": None if i == 1 and null_key else b64(f"after-{p}-{i}".encode()),
                    "value": b64(f"{tag} appended by the broker {p}-{i}".encode()),
                    "timestamp": t0 + 1000 * i,
                    "headers": [["from", b64(b"kafka")], ["none", None]] if i % 2 else [],
                }
            )
    return out


def as_records(steps: list[dict], results: list[dict]) -> dict[int, list[tuple]]:
    """partition -> the records Kafka's producer appended, in broker_checks' shape: what each send step gave,
    at the offset and timestamp the broker acknowledged."""
    out: dict[int, list[tuple]] = {}
    for step, got in zip(steps, results, strict=True):
        s = step["send"]
        out.setdefault(got["partition"], []).append(
            (
                got["offset"],
                got["timestamp"],
                "CreateTime",
                None if s["key"] is None else base64.b64decode(s["key"]),
                base64.b64decode(s["value"]),
                tuple((k, None if v is None else base64.b64decode(v)) for k, v in s["headers"]),
            )
        )
    return out


def joined(old: dict[int, list[tuple]], *new: dict[int, list[tuple]]) -> dict[int, list[tuple]]:
    """partition -> old records, then the new ones, in offset order."""
    out = {p: list(rows) for p, rows in old.items()}
    for more in new:
        for p, rows in more.items():
            out.setdefault(p, []).extend(rows)
    return {p: sorted(rows) for p, rows in out.items()}


def append_on_top(broker, topics: list[str], partitions: int, t0: int, *, compacted=()) -> dict:
    """Kafka's producer appends to every partition of each topic: plain sends, then a committed and an aborted
    transaction (a transactional producer of its own per topic). Returns the records it appended (plain, committed,
    aborted; partition -> records) and what the consumer then reads of each topic at each isolation level."""
    commands, plans = [], []
    for t in topics:
        null_key = t not in compacted
        plain = [{"send": s} for s in sends(t, partitions, 4, t0, null_key=null_key)]
        committed = [{"send": s} for s in sends(t + "-committed", partitions, 2, t0 + 60_000, null_key=null_key)]
        aborted = [{"send": s} for s in sends(t + "-aborted", partitions, 2, t0 + 120_000, null_key=null_key)]
        commands.append({"op": "produce", "topic": t, "config": {"linger.ms": "0"}, "steps": plain})
        commands.append(
            {
                "op": "produce",
                "topic": t,
                # one request in flight: a first batch the coordinator answers CONCURRENT_TRANSACTIONS is not
                # overtaken by the next (OUT_OF_ORDER_SEQUENCE_NUMBER, retried, but logged by the broker)
                "config": {
                    "transactional.id": f"{t}-after-export",
                    "linger.ms": "0",
                    "max.in.flight.requests.per.connection": "1",
                },
                "steps": [{"begin": 1}, *committed, {"commit": 1}, {"begin": 1}, *aborted, {"flush": 1}, {"abort": 1}],
            }
        )
        plans.append((plain, committed, aborted))
    results = broker.tool(*commands, *consume_commands(topics))
    consumed = consumed_by_isolation(topics, partitions, results[len(commands) :])
    new = {}
    for i, t in enumerate(topics):
        plain, committed, aborted = plans[i]
        txn = results[2 * i + 1]
        new[t] = {
            "plain": as_records(plain, results[2 * i]),
            "committed": as_records(committed, txn[: len(committed)]),
            "aborted": as_records(aborted, txn[len(committed) :]),
        }
    return dict(new=new, consumed=consumed)


def check_appended(expected: dict, appended: dict, topic: str, shape: dict) -> None:
    """What the consumer read after append_on_top: the exported records (`expected`, per isolation level), then the
    broker's, from the exported log end; read_committed without the aborted transaction's."""
    new = appended["new"][topic]
    for p, rows in new["plain"].items():  # the first new record at the exported log end
        assert rows[0][0] == shape[TopicPartition(topic, p)][2], (p, rows[0])
    want = {
        "read_uncommitted": joined(expected["read_uncommitted"], new["plain"], new["committed"], new["aborted"]),
        "read_committed": joined(expected["read_committed"], new["plain"], new["committed"]),
    }
    for iso in ISOLATIONS:
        assert differences(want[iso], appended["consumed"][iso][topic]) == [], (topic, iso)
