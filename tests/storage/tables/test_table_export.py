"""A topic kept as an Iceberg table is handed to a real Kafka broker as before (issue 30, item 1).

The topic has table configs (table.mode=append, table.value.format=json with a value schema; one value that
does not parse, so its errors table has a row) and its table is up to date. Then, on the session's broker:

- `kafka-topics.sh --create ... --config table.mode=append` (Kafka's TopicCommand) is refused: the broker
  knows no table.* config (`Unknown topic config name: table.mode`), and no topic is made. The broker keeps
  none of them: they are kafkalog's. The topic is created with the topic's other configs, Kafka's own;
- `kafkalog export-to-broker` writes the partitions into the stopped broker's log dir; the broker loads them
  with no recovery, and Kafka's consumer returns exactly what `kafkalog consume` returns;
- ROOT's table directory is not handed over, and the table is as it was.

One broker stop and start (a few seconds on the shared suite's broker).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import re
import subprocess
import time

import pytest

pytest.importorskip("pyiceberg")

from kafkalog_ds.cli import main  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402
from storage.tables.table_state import TABLES_DIR, read_state  # noqa: E402
from tests.helpers.broker_checks import BAD_SIGNS  # noqa: E402
from tools.realkafka.broker import java_command  # noqa: E402

TOPIC = "kl-table-export"
PARTITIONS = 2
T0 = 1_700_000_000_000
TABLE_CONFIGS = {
    "table.mode": "append",
    "table.value.format": "json",
    "table.value.schema": "id BIGINT, name STRING, tags ARRAY<STRING>",
}
KAFKA_CONFIGS = {"retention.ms": "-1", "cleanup.policy": "delete", "max.message.bytes": "2000000"}


def _cli(*argv: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv), stdin=io.BytesIO(stdin) if stdin is not None else None)
    return rc, out.getvalue(), err.getvalue()


def _records() -> bytes:
    lines = []
    for i in range(60):
        value = {"id": i, "name": f"n{i}", "tags": ["a"] * (i % 3)} if i != 17 else None
        lines.append(
            {
                "key": None if i % 7 == 0 else f"k{i % 11}",
                "value": json.dumps(value) if value is not None else "not json at all",
                "timestamp": T0 + 1000 * i,
                "partition": i % PARTITIONS,
                "headers": [["trace", f"t{i}"]] if i % 4 == 0 else [],
            }
        )
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _text(value: str | None, flagged: bool) -> bytes | None:
    if value is None:
        return None
    return base64.b64decode(value) if flagged else value.encode()


def _kafkalog_consumed(root: str) -> list[tuple]:
    """`kafkalog consume`, as (partition, offset, timestamp, timestampType, key, value, headers)."""
    rc, out, err = _cli("consume", root, "--topic", TOPIC)
    assert rc == 0, err
    rows = []
    for line in out.splitlines():
        r = json.loads(line)
        b64 = set(r.get("base64", ()))
        headers = tuple((k, _text(v, f"headers.{j}" in b64)) for j, (k, v) in enumerate(r["headers"]))
        rows.append(
            (
                r["partition"],
                r["offset"],
                r["timestamp"],
                r["timestampType"],
                _text(r["key"], "key" in b64),
                _text(r["value"], "value" in b64),
                headers,
            )
        )
    return sorted(rows)


def _broker_read(broker) -> tuple[dict, list[tuple]]:
    """The broker's description of the topic, and Kafka's consumer's records (one tool run)."""

    def unb64(text):
        return None if text is None else base64.b64decode(text)

    described, records = broker.tool({"op": "describeTopics", "topics": [TOPIC]}, {"op": "consume", "topic": TOPIC})
    rows = sorted(
        (
            r["partition"],
            r["offset"],
            r["timestamp"],
            r["timestampType"],
            unb64(r["key"]),
            unb64(r["value"]),
            tuple((k, unb64(v)) for k, v in r["headers"]),
        )
        for r in records
    )
    return described[TOPIC], rows


def _kafka_topics(broker, *args: str) -> subprocess.CompletedProcess:
    """The broker's version of Kafka's kafka-topics.sh (org.apache.kafka.tools.TopicCommand) against it."""
    main = "org.apache.kafka.tools.TopicCommand"
    cmd = java_command(broker.version, main, "--bootstrap-server", broker.bootstrap, *args, heap="256m")
    return subprocess.run(cmd, capture_output=True, text=True)


def _wait(condition, what: str, broker, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert broker.running, f"the broker exited while waiting for {what}\n" + broker.log_tail()
        assert time.monotonic() < deadline, f"no sign of {what} after {timeout:.0f} s\n" + broker.log_tail()
        time.sleep(0.1)


@pytest.mark.kafka
def test_a_topic_kept_as_a_table_is_handed_to_a_broker_without_its_table_configs(kafka_broker, tmp_path):
    root = str(tmp_path / "logs")
    lm = LogManager(root)
    lm.create_topic(TOPIC, PARTITIONS, {**TABLE_CONFIGS, **KAFKA_CONFIGS})
    rc, out, err = _cli("produce", root, "--topic", TOPIC, "--no-create", "--compression", "zstd", stdin=_records())
    assert rc == 0, err
    rc, out, err = _cli("table", root, "--topic", TOPIC)
    assert rc == 0 and "committed; 60 row(s) added, 1 value(s) that did not parse (errors table)" in out, out + err
    state = read_state(lm.fs, lm.root, TOPIC)

    # the broker refuses table.* configs: they are kafkalog's, and a topic created with one is not made
    refused = _kafka_topics(
        kafka_broker, "--create", "--topic", TOPIC, "--partitions", str(PARTITIONS), "--replication-factor", "1",
        "--config", "table.mode=append",
    )  # fmt: skip
    assert refused.returncode != 0, refused.stdout + refused.stderr
    assert "Unknown topic config name: table.mode" in refused.stdout + refused.stderr
    carried = {k: v for k, v in lm.topic(TOPIC).config.overrides.items() if not k.startswith("table.")}
    assert carried == KAFKA_CONFIGS
    # (made by the refused command, the topic would exist: this create would fail with TopicExistsException)
    created = kafka_broker.tool({"op": "createTopic", "topic": TOPIC, "partitions": PARTITIONS, "configs": carried})
    topic_id = created[0]["topicId"]

    log_dir = kafka_broker.log_dir
    _wait(
        lambda: all((log_dir / f"{TOPIC}-{p}" / "partition.metadata").exists() for p in range(PARTITIONS)),
        "the topic's partition directories",
        kafka_broker,
    )
    kafka_broker.stop()
    rc, out, err = _cli("export-to-broker", root, "--topic", TOPIC, "--to", str(log_dir))
    assert rc == 0, out + err
    assert not (log_dir / TABLES_DIR).exists()
    kafka_broker.start()
    for p in range(PARTITIONS):
        kafka_broker.wait_for_log(f"Completed load of Log(dir={log_dir / f'{TOPIC}-{p}'}", f"the load of {TOPIC}-{p}")

    broker_log = kafka_broker.log_since_start()
    bad = [
        line
        for line in broker_log.splitlines()
        if (any(s in line for s in BAD_SIGNS) and "__cluster_metadata" not in line)
        or (re.search(r"\] (WARN|ERROR) ", line) and TOPIC in line)
    ]
    assert bad == []
    described, consumed = _broker_read(kafka_broker)
    assert described == {"topicId": topic_id, "partitions": PARTITIONS}
    assert len(consumed) == 60 and consumed == _kafkalog_consumed(root)
    assert read_state(lm.fs, lm.root, TOPIC) == state  # the table is as it was at the hand-off
