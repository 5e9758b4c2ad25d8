"""Transactions as a real Kafka 4.4 broker writes them: its `.txnindex` files and transaction markers, read by
storage/transactions and held to Kafka's DumpLogSegments.

The broker's Java transactional producer runs the scenario of tests/helpers/kafka_scenarios.py (seven transactions
over two partitions, three aborted) on a topic of this module's own, then the broker is stopped cleanly and its
partition directories read:

- every `.txnindex` entry against DumpLogSegments' line for it, and `kafkalog dump-log` against the whole output;
- every entry against the ABORT markers DumpLogSegments finds in the `.log` files: lastOffset is the marker's
  offset, firstOffset the first offset of that producer's transaction, lastStableOffset lastOffset + 1 (the only
  producer: Kafka's ProducerStateManager.lastStableOffset when no other transaction is open);
- every marker batch, COMMIT and ABORT, rebuilt by EndTransactionMarker.to_batch byte for byte.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from storage.fs.local import LocalFileSystem
from storage.records.decoder import decode_batches
from storage.transactions.control_records import ControlRecordType, EndTransactionMarker
from storage.transactions.transaction_index import AbortedTxn, TransactionIndex
from tests.helpers import kafka_scenarios as S

pytestmark = pytest.mark.kafka

TOPIC = "txi-txn"  # not b2k-: test_kafka_broker_logs reads every b2k- topic and may share the broker
PARTITIONS = S.TOPICS[S.TXN_TOPIC][0]
FIELD = re.compile(r"(\w+): (\S+)")


def _expected_log_end(commands: list[dict]) -> dict[int, int]:
    """Records sent to each partition plus one marker per transaction that touched it."""
    end = dict.fromkeys(range(PARTITIONS), 0)
    touched: set[int] = set()
    for step in (s for c in commands for s in c["steps"]):
        if "send" in step:
            end[step["send"]["partition"]] += 1
            touched.add(step["send"]["partition"])
        elif "commit" in step or "abort" in step:
            for p in touched:
                end[p] += 1
            touched = set()
    return end


@pytest.fixture(scope="module")
def partition_dirs(kafka_broker_session) -> list[Path]:
    """The topic's partition directories, written by the broker, which is then stopped (SIGTERM)."""
    broker = kafka_broker_session.ensure_running()
    produce = S._txn(TOPIC, "txi-txn-producer")
    config = S.TOPICS[S.TXN_TOPIC][1]
    results = broker.tool({"op": "createTopic", "topic": TOPIC, "partitions": PARTITIONS, "configs": config}, *produce)
    assert not [r for r in results[1] if "error" in r], results[1]
    end = _expected_log_end(produce)

    def markers_written() -> bool:  # a coordinator writes the markers after commit/abort returns
        (latest,) = broker.tool({"op": "listOffsets", "topic": TOPIC, "partitions": list(end), "spec": "latest"})
        return {int(p): v["offset"] for p, v in latest.items()} == end

    S.wait_until(broker, markers_written, f"the transaction markers of {TOPIC}")
    broker.stop()
    return [broker.log_dir / f"{TOPIC}-{p}" for p in range(PARTITIONS)]


def _files(dirs: list[Path], suffix: str) -> list[str]:
    return [str(f) for d in dirs for f in sorted(d.iterdir()) if f.name.endswith(suffix)]


def _kafka_dump(broker, files: list[str], *flags: str) -> dict[str, str]:
    out, _ = S.dump_log_segments(broker, files, *flags)
    return S.split_dump(out)


@pytest.fixture(scope="module")
def kafka_logs(partition_dirs, kafka_broker_session) -> dict[str, list[dict]]:
    """Per .log file, its batches as DumpLogSegments prints them (--deep-iteration), each with its record lines."""
    logs = _files(partition_dirs, ".log")
    out: dict[str, list[dict]] = {}
    for path, text in _kafka_dump(kafka_broker_session, logs, "--deep-iteration").items():
        batches: list[dict] = []
        for line in text.splitlines():
            if line.startswith("baseOffset: "):
                batches.append({**dict(FIELD.findall(line)), "records": []})
            elif line.startswith("| offset: "):
                batches[-1]["records"].append(dict(FIELD.findall(line)))
        out[path] = batches
    return out


def _expected_aborts(kafka_logs: dict[str, list[dict]], partition_dir: Path) -> dict[str, list[AbortedTxn]]:
    """What each segment's .txnindex must hold, from the batches: one entry per ABORT marker, in the index of the
    segment the marker is in."""
    out: dict[str, list[AbortedTxn]] = {}
    first_offset: dict[int, int] = {}  # producer -> first offset of its open transaction
    for log in sorted(p for p in kafka_logs if Path(p).parent == partition_dir):
        entries = out.setdefault(log[: -len(".log")] + ".txnindex", [])
        for b in kafka_logs[log]:
            pid = int(b["producerId"])
            if b["isTransactional"] != "true":
                continue
            if b["isControl"] != "true":
                first_offset.setdefault(pid, int(b["baseOffset"]))
                continue
            ((record),) = b["records"]
            if record["endTxnMarker"] == "ABORT":
                last = int(b["baseOffset"])
                entries.append(AbortedTxn(pid, first_offset[pid], last, last + 1))
            first_offset.pop(pid, None)
    return out


def test_txnindex_entries_match_dump_log_segments_and_the_abort_markers(
    partition_dirs, kafka_logs, kafka_broker_session
):
    fs = LocalFileSystem()
    files = _files(partition_dirs, ".txnindex")
    theirs = _kafka_dump(kafka_broker_session, files)
    assert list(theirs) == files
    expected = {f: e for d in partition_dirs for f, e in _expected_aborts(kafka_logs, d).items()}
    total = 0
    for f in files:
        index = TransactionIndex(fs, f, int(Path(f).name.split(".")[0]))
        index.sanity_check()
        txns = index.all_aborted_txns()
        lines = [
            f"version: 0 producerId: {t.producer_id} firstOffset: {t.first_offset} lastOffset: {t.last_offset} "
            f"lastStableOffset: {t.last_stable_offset}"
            for t in txns
        ]
        assert lines == theirs[f].splitlines()[1:], f
        assert txns == expected.get(f, []), f
        total += len(txns)
    # the scenario aborts three transactions, two of them over both partitions
    assert total == 5 == sum(map(len, expected.values()))
    assert not [f for f, e in expected.items() if e and f not in files], "an abort without a .txnindex"

    from kafkalog_ds.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["dump-log", "--files", ",".join(files)], stdin=io.BytesIO())
    assert (rc, err.getvalue()) == (0, "")
    assert S.split_dump(out.getvalue()) == theirs


def test_collect_aborted_over_the_segments(partition_dirs, kafka_logs):
    """Kafka's UnifiedLog.collectAbortedTransactions for many fetch ranges: the indexes of the segments from the one
    holding the fetch offset on, until one says the search is complete. With one producer, transactions do not
    overlap, so that is every aborted transaction with lastOffset >= fetch and firstOffset < upper bound."""
    fs = LocalFileSystem()
    for d in partition_dirs:
        expected = [t for e in _expected_aborts(kafka_logs, d).values() for t in e]
        assert expected, d
        bases = sorted(int(f.stem) for f in d.glob("*.log"))
        indexes = [TransactionIndex.for_segment(fs, str(d), base) for base in bases]
        log_end = max(int(b["lastOffset"]) for p, bs in kafka_logs.items() if Path(p).parent == d for b in bs) + 1
        for fetch in range(0, log_end + 1, 2):
            for upper in range(fetch + 1, log_end + 2, 3):
                found = []
                first = max(i for i, base in enumerate(bases) if base <= fetch)
                for index in indexes[first:]:
                    result = index.collect_aborted(fetch, upper)
                    found += result.aborted_transactions
                    if result.is_complete:
                        break
                assert found == [t for t in expected if t.last_offset >= fetch and t.first_offset < upper], (
                    d,
                    fetch,
                    upper,
                )


def test_marker_batches_are_rebuilt_byte_for_byte(kafka_logs):
    markers = 0
    for log, batches in kafka_logs.items():
        data = Path(log).read_bytes()
        for b in batches:
            if b["isControl"] != "true":
                continue
            pos, size = int(b["position"]), int(b["size"])
            raw = data[pos : pos + size]
            ((record),) = b["records"]
            (row,) = decode_batches(raw, skip_control=False).to_pylist()
            marker = EndTransactionMarker.deserialize(row["key"], row["value"], source=log, position=pos)
            assert marker == EndTransactionMarker(
                ControlRecordType[record["endTxnMarker"]], int(record["coordinatorEpoch"])
            )
            rebuilt = marker.to_batch(
                base_offset=int(b["baseOffset"]),
                timestamp=int(b["CreateTime"]),
                producer_id=int(b["producerId"]),
                producer_epoch=int(b["producerEpoch"]),
                partition_leader_epoch=int(b["partitionLeaderEpoch"]),
            )
            assert rebuilt == raw, f"{log} position {pos}"
            markers += 1
    assert markers == 12  # seven transactions, five of them over both partitions
