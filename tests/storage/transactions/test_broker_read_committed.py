"""read_committed and read_uncommitted against a real Kafka 4.4 broker's consumer, record for record.

Three transactional producers write a topic of this module's own (two partitions, small segments): the seven
transactions of tests/helpers/kafka_scenarios.py (three aborted), then one transaction LEFT OPEN (KafkaTool's
`leaveOpen` step closes the producer at once, so no ABORT is sent; transaction.timeout.ms is long), then a third
producer commits, aborts and commits again after it, so its aborted transaction's lastStableOffset is the open
one's first offset. With the broker running, Kafka's consumer reads the topic at both isolation levels, and
ListOffsets answers latest and by timestamp at both. Then the broker is stopped and its partition directories
are copied, and kafkalog's Log (read_records, last_stable_offset, offset_for_timestamp) is held to those answers
on the copy as written, with every `.txnindex` and `.snapshot` deleted (rebuilt from the log), and with each
`.txnindex` damaged.
"""

from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path

import pytest

from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from storage.transactions.isolation import READ_COMMITTED, READ_UNCOMMITTED
from tests.helpers import kafka_scenarios as S

pytestmark = pytest.mark.kafka

TOPIC = "rc-txn"  # not b2k-: test_kafka_broker_logs reads every b2k- topic and may share the broker
PARTITIONS = 2
LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)
# The later producers' timestamps: a day ahead, past the markers' (which carry the broker's clock), so a lookup
# by time can land at or past the LSO; the topic lets them in (message.timestamp.after.max.ms).
TS = (int(time.time()) + 86_400) * 1000
TOPIC_CONFIG = {**S.TOPICS[S.TXN_TOPIC][1], "message.timestamp.after.max.ms": str(7 * 86_400_000)}


def _commands() -> list[dict]:
    i = 0

    def sends(counts: dict[int, int], tag: str) -> list[dict]:
        nonlocal i
        out = []
        for p, n in counts.items():
            for _ in range(n):
                out.append({"send": S._shaped(i, p, tag, TS + i * 10)})
                i += 1
        return out

    open_steps = [{"begin": 1}, *sends({0: 3, 1: 2}, "open"), {"leaveOpen": 1}]
    after_steps = []
    for outcome, counts in (("commit", {0: 2, 1: 2}), ("abort", {0: 3, 1: 1}), ("commit", {0: 1, 1: 2})):
        after_steps += [{"begin": 1}, *sends(counts, f"after-{outcome}"), {"flush": 1}, {outcome: 1}]
    long_timeout = {"transaction.timeout.ms": "600000", **S.NO_AUTOSEND}
    return [
        *S._txn(TOPIC, "rc-txn-scenario"),
        {"op": "produce", "topic": TOPIC, "config": {"transactional.id": "rc-txn-open", **long_timeout},
         "steps": open_steps},
        {"op": "produce", "topic": TOPIC, "config": {"transactional.id": "rc-txn-after", **long_timeout},
         "steps": after_steps},
    ]  # fmt: skip


def _expected_log_end(commands: list[dict]) -> dict[int, int]:
    """Records sent to each partition plus one marker per ended transaction that touched it (none for the open one)."""
    end = dict.fromkeys(range(PARTITIONS), 0)
    for command in commands:
        touched: set[int] = set()
        for step in command["steps"]:
            if "send" in step:
                end[step["send"]["partition"]] += 1
                touched.add(step["send"]["partition"])
            elif "commit" in step or "abort" in step:
                for p in touched:
                    end[p] += 1
                touched = set()
    return end


def _timestamps(commands: list[dict]) -> list[int]:
    sent = sorted({s["send"]["timestamp"] for c in commands for s in c["steps"] if "send" in s})
    return sorted({t + d for t in sent for d in (-3, 0)} | {sent[0] - 1000, sent[-1] + 1, sent[-1] + 10**9})


@pytest.fixture(scope="module")
def kafka_answers(kafka_broker_session, tmp_path_factory):
    """What the broker's clients answer (records per isolation level, ListOffsets latest and by timestamp), and
    a copy of the partition directories taken after a clean stop."""
    broker = kafka_broker_session.ensure_running()
    commands = _commands()
    create = {"op": "createTopic", "topic": TOPIC, "partitions": PARTITIONS, "configs": TOPIC_CONFIG}
    results = broker.tool(create, *commands)
    for r in results[1:]:
        assert not [x for x in r if "error" in x], r
    end = _expected_log_end(commands)
    parts = list(range(PARTITIONS))

    def markers_written() -> bool:  # a coordinator writes the markers after commit/abort returns
        (latest,) = broker.tool({"op": "listOffsets", "topic": TOPIC, "partitions": parts, "spec": "latest"})
        return {int(p): v["offset"] for p, v in latest.items()} == end

    S.wait_until(broker, markers_written, f"the transaction markers of {TOPIC}")
    times = _timestamps(commands)
    asks = [{"op": "consume", "topic": TOPIC, "isolation": level} for level in LEVELS]
    asks += [{"op": "listOffsets", "topic": TOPIC, "partitions": parts, "spec": "latest", "isolation": level}
             for level in LEVELS]  # fmt: skip
    asks += [{"op": "listOffsets", "topic": TOPIC, "partitions": parts, "spec": t, "isolation": level}
             for level in LEVELS for t in times]  # fmt: skip
    answers = broker.tool(*asks)
    broker.stop()
    root = tmp_path_factory.mktemp("rc-txn-copy")
    for p in parts:
        shutil.copytree(broker.log_dir / f"{TOPIC}-{p}", root / f"{TOPIC}-{p}")
    records = {level: S._tool_records(answers[k]) for k, level in enumerate(LEVELS)}
    latest = {level: {int(p): v["offset"] for p, v in answers[2 + k].items()} for k, level in enumerate(LEVELS)}
    by_time = {}
    k = 4
    for level in LEVELS:
        for t in times:
            by_time[(level, t)] = {int(p): (v["offset"] if v["offset"] >= 0 else None) for p, v in answers[k].items()}
            k += 1
    return {"records": records, "latest": latest, "by_time": by_time, "times": times, "end": end, "root": root}


def _damage_version(raw: bytes) -> bytes:
    return struct.pack(">h", 1) + raw[2:]  # the first entry's version: not 0


def _damage_partial(raw: bytes) -> bytes:
    return raw[:-5]  # a torn last entry


VARIANTS = {
    "as-written": None,
    "no-txnindex-no-snapshot": ("delete", (".txnindex", ".snapshot")),
    "no-snapshot": ("delete", (".snapshot",)),
    "txnindex-bad-version": ("damage", _damage_version),
    "txnindex-partial-entry": ("damage", _damage_partial),
}


@pytest.fixture(params=list(VARIANTS))
def log_root(request, kafka_answers, tmp_path) -> Path:
    """A copy of the broker's partition directories, changed as the variant says."""
    root = tmp_path / "logs"
    shutil.copytree(kafka_answers["root"], root)
    change = VARIANTS[request.param]
    files = sorted(f for d in root.iterdir() for f in d.iterdir())
    if change is not None and change[0] == "delete":
        gone = [f for f in files if f.suffix in change[1]]
        assert gone, f"no {change[1]} files to delete"
        for f in gone:
            f.unlink()
    elif change is not None:
        damaged = [f for f in files if f.suffix == ".txnindex" and f.stat().st_size]
        assert damaged, "no .txnindex with entries to damage"
        for f in damaged:
            f.write_bytes(change[1](f.read_bytes()))
    return root


def _rows(log, level: str) -> list[tuple]:
    out = []
    for batch in log.read_records(log.log_start_offset, isolation_level=level):
        cols = batch.to_pydict()
        for j in range(batch.num_rows):
            headers = [(h["key"], h["value"]) for h in cols["headers"][j] or []]
            out.append((log.tp.partition, cols["offset"][j], cols["timestamp"][j], cols["key"][j], cols["value"][j],
                        headers))  # fmt: skip
    return out


def _kafka_rows(records: list[dict]) -> list[tuple]:
    rows = [(r["partition"], r["offset"], r["timestamp"], r["key"], r["value"], r["headers"]) for r in records]
    return sorted(rows, key=lambda r: (r[0], r[1]))


def test_the_broker_left_one_transaction_open_and_aborted_data_in_the_log(kafka_answers):
    """The scenario holds what the comparisons need: an LSO below the log end in every partition, and records
    read_uncommitted returns that read_committed does not below it (aborted ones)."""
    latest, end = kafka_answers["latest"], kafka_answers["end"]
    assert latest[READ_UNCOMMITTED] == end
    assert all(latest[READ_COMMITTED][p] < end[p] for p in end), (latest, end)
    committed = {(r["partition"], r["offset"]) for r in kafka_answers["records"][READ_COMMITTED]}
    below_lso = [
        r for r in kafka_answers["records"][READ_UNCOMMITTED] if r["offset"] < latest[READ_COMMITTED][r["partition"]]
    ]
    assert len([r for r in below_lso if (r["partition"], r["offset"]) not in committed]) >= 10


def test_records_at_both_isolation_levels_match_kafkas_consumer(kafka_answers, log_root):
    lm = LogManager(str(log_root))
    for level in LEVELS:
        got = []
        for p in range(PARTITIONS):
            with lm.open_log(TopicPartition(TOPIC, p)) as log:
                got += _rows(log, level)
        want = _kafka_rows(kafka_answers["records"][level])
        assert len(got) == len(want) and got == want, f"{level}: kafkalog {len(got)} records, Kafka {len(want)}"


def test_last_stable_offset_and_offsets_by_timestamp_match_list_offsets(kafka_answers, log_root):
    lm = LogManager(str(log_root))
    wrong = []
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition(TOPIC, p)) as log:
            assert log.last_stable_offset == kafka_answers["latest"][READ_COMMITTED][p]
            assert log.log_end_offset == kafka_answers["latest"][READ_UNCOMMITTED][p]
            for level in LEVELS:
                for t in kafka_answers["times"]:
                    want = kafka_answers["by_time"][(level, t)][p]
                    got = log.offset_for_timestamp(t, isolation_level=level)
                    if got != want:
                        wrong.append(f"p{p} {level} T={t}: kafkalog {got}, Kafka {want}")
    answered_none = sum(
        v[p] is None and kafka_answers["by_time"][(READ_UNCOMMITTED, t)][p] is not None
        for (level, t), v in kafka_answers["by_time"].items()
        if level == READ_COMMITTED
        for p in range(PARTITIONS)
    )
    assert answered_none >= 4, {  # Kafka's read_committed answers no offset at or past the LSO
        t: (kafka_answers["by_time"][(READ_UNCOMMITTED, t)], kafka_answers["by_time"][(READ_COMMITTED, t)])
        for t in kafka_answers["times"][-12:]
    }
    assert not wrong, "\n".join(wrong[:25])


def test_a_range_read_from_the_middle_of_an_aborted_transaction(kafka_answers, log_root):
    """Reading from each offset below the LSO gives the tail of the consumer's records from there (the aborted
    transaction a read starts inside is still found: collect_aborted_txns takes entries with lastOffset >= start)."""
    lm = LogManager(str(log_root))
    want_all = _kafka_rows(kafka_answers["records"][READ_COMMITTED])
    for p in range(PARTITIONS):
        want = [r for r in want_all if r[0] == p]
        with lm.open_log(TopicPartition(TOPIC, p)) as log:
            lso = log.last_stable_offset
            for start in range(log.log_start_offset, lso + 1, 3):
                read = log.read_records(start, isolation_level=READ_COMMITTED)
                got = [o for b in read for o in b.column("offset").to_pylist()]
                assert got == [r[1] for r in want if r[1] >= start], f"p{p} from {start}"


def test_aborted_transactions_rebuilt_from_the_log_equal_the_brokers_txnindex(kafka_answers, log_root):
    """What collect_aborted_txns serves over the whole log equals the broker's `.txnindex` entries, field for
    field, in every variant (rebuilt from the log where deleted or damaged), including the lastStableOffset of
    the transaction aborted while another stayed open (its first offset, not lastOffset + 1)."""
    from storage.fs.local import LocalFileSystem
    from storage.transactions.transaction_index import TransactionIndex, entries_to_txns

    fs = LocalFileSystem()
    lm = LogManager(str(log_root))
    held_back = 0
    for p in range(PARTITIONS):
        pdir = kafka_answers["root"] / f"{TOPIC}-{p}"
        want = []
        for f in sorted(pdir.glob("*.txnindex")):
            want += TransactionIndex(fs, str(f), int(f.name.split(".")[0])).all_aborted_txns()
        held_back += sum(t.last_stable_offset != t.last_offset + 1 for t in want)
        with lm.open_log(TopicPartition(TOPIC, p)) as log:
            got = entries_to_txns(log.collect_aborted_txns(log.log_start_offset, log.log_end_offset + 1))
        assert got == want, f"p{p}"
    assert held_back >= 1
