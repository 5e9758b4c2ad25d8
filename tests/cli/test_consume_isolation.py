"""`kafkalog consume --isolation-level` against Kafka's own consumer, on a partition a real broker holds with
committed, aborted and one open transaction (tests/helpers/open_transaction.py); the broker's log dir is read live
as kafkalog's ROOT, as tests/storage/test_kafka_broker_logs.py does.

- every record at either level is what Kafka's consumer at that level returns (read_committed: no aborted records,
  nothing at or past the LSO; read_uncommitted: everything but the markers);
- `--timestamp` starts where Kafka's offsetsForTimes at that level says (under read_committed, a timestamp found
  at or past the LSO finds nothing, and the partition prints nothing);
- the flag is Kafka's console consumer's: two values, spelled exactly (other spellings are a usage error).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import uuid

import pytest

from tests.helpers import open_transaction as OT
from tools.realkafka.broker import unb64

TOPIC = f"cisolation{uuid.uuid4().hex[:6]}"
LEVELS = ("read_uncommitted", "read_committed")


def kafkalog(*argv: str) -> tuple[int, str, str]:
    """The `kafkalog` command, in process."""
    from kafkalog_ds.cli import main

    out, err = io.StringIO(), io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv), stdin=io.BytesIO())
        except SystemExit as e:  # argparse's usage errors
            rc = int(e.code or 0)
    return rc, out.getvalue(), err.getvalue()


def cli_rows(stdout: str) -> list[tuple]:
    out = []
    for line in stdout.splitlines():
        r = json.loads(line)
        b64 = set(r.get("base64", ()))

        def field(v, name, b64=b64):
            return None if v is None else base64.b64decode(v) if name in b64 else v.encode()

        headers = tuple((k, field(v, f"headers.{j}")) for j, (k, v) in enumerate(r["headers"]))
        out.append(
            (r["partition"], r["offset"], r["timestamp"], field(r["key"], "key"), field(r["value"], "value"), headers)
        )
    return out


def kafka_rows(records: list[dict]) -> list[tuple]:
    return [
        (
            r["partition"],
            r["offset"],
            r["timestamp"],
            unb64(r["key"]),
            unb64(r["value"]),
            tuple((k, unb64(v)) for k, v in r["headers"]),
        )
        for r in records
    ]


@pytest.fixture(scope="module")
def topic(kafka_broker_session):
    broker = kafka_broker_session.ensure_running()
    return broker, OT.produce(broker, TOPIC, "cli")


@pytest.mark.kafka
@pytest.mark.parametrize("level", LEVELS)
def test_consume_prints_what_kafkas_consumer_returns(topic, level):
    broker, t0 = topic
    (theirs,) = broker.tool({"op": "consume", "topic": TOPIC, "isolation": level})
    rc, out, err = kafkalog("consume", str(broker.log_dir), "--topic", TOPIC, "--isolation-level", level)
    assert rc == 0, err
    got, want = sorted(cli_rows(out)), sorted(kafka_rows(theirs))
    assert got == want, f"{level}: kafkalog {len(got)} records, Kafka's consumer {len(want)}"
    # the scenario reaches what the level is about
    values = [r[4].decode() for r in want]
    aborted = [v for v in values if "-abort-" in v]
    open_ = [v for v in values if "-leaveOpen-" in v]
    committed_past_open = [r for r in want if r[0] == 0 and b"-commit-" in r[4] and r[1] > 9]
    if level == "read_committed":
        assert not aborted and not open_ and not committed_past_open
        assert [r for r in want if r[0] == 1 and r[1] >= 6], "partition 1's records of producer B (LSO = log end)"
    else:
        assert len(aborted) == 4 and len(open_) == 2 and len(committed_past_open) == 2


@pytest.mark.kafka
@pytest.mark.parametrize("level", LEVELS)
def test_consume_by_timestamp_starts_where_kafka_does(topic, level):
    """A timestamp before everything, one inside the open transaction, one past it (producer B's records)."""
    broker, t0 = topic
    (everything,) = broker.tool({"op": "consume", "topic": TOPIC, "isolation": level})
    wrong = []
    for ts in (t0, OT.open_ts(t0), OT.open_ts(t0) + 2 * OT.OPEN_TS_STEP):
        (found,) = broker.tool({"op": "offsetsForTimes", "topic": TOPIC, "timestamp": ts, "isolation": level})
        starts = {int(p): (None if v is None else v["offset"]) for p, v in found.items()}
        want = sorted(r for r in kafka_rows(everything) if starts.get(r[0]) is not None and r[1] >= starts[r[0]])
        rc, out, err = kafkalog(
            "consume", str(broker.log_dir), "--topic", TOPIC, "--timestamp", str(ts), "--isolation-level", level
        )
        assert rc == 0, err
        got = sorted(cli_rows(out))
        if got != want:
            wrong.append(f"--timestamp {ts} (Kafka starts at {starts}): kafkalog {len(got)}, Kafka {len(want)}")
    if level == "read_committed":  # Kafka finds nothing in partition 0 from inside the open transaction on
        (inside,) = broker.tool(
            {"op": "offsetsForTimes", "topic": TOPIC, "timestamp": OT.open_ts(t0), "isolation": level}
        )
        assert inside["0"] is None
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("value", ["READ_COMMITTED", "Read_Committed", "committed", ""])
def test_the_flag_takes_kafkas_two_values_spelled_exactly(tmp_path, value):
    """Kafka's consumer refuses any other spelling (ConfigDef.ValidString is case-sensitive): a usage error here."""
    rc, out, err = kafkalog("consume", str(tmp_path), "--topic", "t", "--isolation-level", value)
    assert rc == 2 and out == ""
    assert "read_uncommitted" in err and "read_committed" in err
