"""The commands around a topic's table (issue 30, item 7), through kafkalog_ds.cli.main:

- `kafkalog table ROOT --topic T` runs one pass of one topic: its last line is `table <namespace>.<name>:
  <metadata file>`, a file that exists and that pyiceberg opens with no catalog; on a terminal a progress bar
  of offsets read is drawn and cleared before the report lines (on a pipe: no control characters);
- `--forget` forgets ROOT's record of the table; the next pass adopts the table still in its catalog and goes
  on from the offsets in its snapshots: no row twice;
- `describe` shows each table's lag in its TABLES section, OFFSETS-BEHIND and TIME-BEHIND-MS, exactly (a log
  of plain batches: the model knows each record's offset and timestamp), and `--json` its "table" object;
- `maintain --once` prints one line per table before the partitions' lines, and counts the tables in its last
  line; `maintain` in a loop runs a pass per interval: two passes ran (stopped by Ctrl-C at the third,
  deterministically), the second catching up with the records appended after the first.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import time

import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.table import StaticTable  # noqa: E402

from kafkalog_ds.cli import INTERRUPTED, main  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402
from storage.tables.table_offsets import NEXT_OFFSETS  # noqa: E402
from storage.tables.table_state import read_state, state_path  # noqa: E402
from tests.helpers.table_model import TopicModel, Workload, table_rows  # noqa: E402

PARTITIONS = 2
LAST_LINE = re.compile(
    r"table (?P<table>[\w.]+): (?P<location>file://\S+/metadata/\d{5}-[0-9a-f-]{36}\.metadata\.json)"
)
REPORT = re.compile(
    r"table (?P<table>[\w.]+) \((?P<mode>append|upsert)\) of (?P<topic>\S+): (?P<state>committed|nothing new); "
    r"(?P<rows>\d+) row\(s\) added, (?:(?P<errors>\d+) value\(s\) that did not parse \(errors table\), )?"
    r"(?P<behind>\d+) offset\(s\) behind the log end \(\d+\.\d\ds\)"
)


class _Terminal(io.StringIO):
    """A stdout that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _cli(*argv: str, out: io.StringIO | None = None) -> tuple[int, str, str]:
    out, err = out if out is not None else io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _rendered(text: str) -> list[str]:
    """The lines a terminal shows for this output: each line from its last carriage return, erases dropped."""
    return [line.rsplit("\r", 1)[-1].replace("\x1b[K", "") for line in text.split("\n")][:-1]


def _topic(root: str, topic: str, seed: int, **config):
    lm = LogManager(root)
    lm.create_topic(topic, PARTITIONS, {"table.mode": "append", "retention.ms": "-1", **config})
    model = TopicModel(topic, PARTITIONS)
    return lm, model, Workload(lm, model, seed)


def _log_ends(lm, topic: str) -> dict[int, int]:
    out = {}
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            out[tp.partition] = log.log_end_offset
    return out


def _table_at(location: str):
    table = StaticTable.from_metadata(location)
    offsets = {int(p): o for p, o in json.loads(table.current_snapshot().summary[NEXT_OFFSETS]).items()}
    return table, offsets


# ---------------------------------------------------------------- kafkalog table


def test_table_runs_one_pass_and_its_last_line_names_the_metadata_file(root, caplog):
    lm, model, work = _topic(root, "t.one", 50, **{"table.namespace": "lake.raw", "table.name": "events_v1"})
    for _ in range(20):
        work.step()
    work.close_transactions()
    rc, out, err = _cli("table", root, "--topic", "t.one")
    assert (rc, err) == (0, "")
    # a library's warning would reach the user's stderr through logging's last resort (pytest captures it here);
    # the engine's own warnings about this workload's logs (aborts with no .txnindex) are the workload's
    libraries = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.split(".")[0] != "storage"
    ]
    assert libraries == []
    assert "\r" not in out and "\x1b" not in out  # not a terminal: no progress bar
    report, last = out.splitlines()
    found = REPORT.fullmatch(report)
    assert found and found["table"] == "lake.raw.events_v1" and found["state"] == "committed", report
    assert found["behind"] == "0" and int(found["rows"]) == len(model.append_rows(_log_ends(lm, "t.one")))
    named = LAST_LINE.fullmatch(last)
    assert named and named["table"] == "lake.raw.events_v1", last
    location = named["location"]
    assert os.path.isfile(location.removeprefix("file://"))
    assert location == read_state(lm.fs, lm.root, "t.one").metadata_location
    table, offsets = _table_at(location)  # no catalog: the metadata file alone
    assert offsets == _log_ends(lm, "t.one") and table_rows(table) == model.append_rows(offsets)

    rc, out, err = _cli("table", root, "--topic", "t.one")  # nothing new: the same metadata file
    assert rc == 0 and REPORT.fullmatch(out.splitlines()[0])["state"] == "nothing new"
    assert out.splitlines()[-1] == last


def test_table_shows_its_progress_on_a_terminal(root):
    lm, model, work = _topic(root, "bar", 51)
    for _ in range(30):
        work.plain_batch(work.rng.randrange(PARTITIONS))
    total = sum(_log_ends(lm, "bar").values())
    rc, out, err = _cli("table", root, "--topic", "bar", out=_Terminal())
    assert (rc, err) == (0, "")
    bars = re.findall(r"\r\x1b\[K\[([#.]{30})\] (\d+)/(\d+) offsets read", out)
    assert len(bars) >= 2 and {int(t) for _, _, t in bars} == {total}
    assert bars[0][:2] == ("." * 30, "0") and bars[-1][:2] == ("#" * 30, str(total))
    assert [int(d) for _, d, _ in bars] == sorted(int(d) for _, d, _ in bars)  # it only goes forward
    report, last = _rendered(out)  # the bar is erased: the terminal shows the report lines alone
    assert REPORT.fullmatch(report)["rows"] == str(total) and LAST_LINE.fullmatch(last)
    assert out.rsplit("offsets read", 1)[1].startswith("\r\x1b[Ktable kafkalog.bar (append)")


def test_forget_then_the_next_pass_goes_on_from_the_tables_offsets(root):
    lm, model, work = _topic(root, "f", 52)
    for _ in range(15):
        work.step()
    work.close_transactions()
    rc, out, _ = _cli("table", root, "--topic", "f")
    first = LAST_LINE.fullmatch(out.splitlines()[-1])["location"]
    assert _cli("table", root, "--topic", "f", "--forget") == (0, "Forgot the table of topic f.\n", "")
    assert not os.path.exists(state_path(lm.fs, lm.root, "f"))
    assert _cli("table", root, "--topic", "f", "--forget") == (0, "Topic f has no table to forget.\n", "")
    rc, out, _ = _cli("describe", root, "--json")
    assert json.loads(out)["topics"][0]["table"]["committedAtMs"] == -1  # no record of a commit any more

    for _ in range(6):
        work.plain_batch(0)
    rc, out, err = _cli("table", root, "--topic", "f")
    assert rc == 0, out + err
    report, last = out.splitlines()
    assert REPORT.fullmatch(report)["rows"] == str(
        len(model.append_rows(_log_ends(lm, "f"))) - len(model.append_rows(_table_at(first)[1]))
    )
    table, offsets = _table_at(LAST_LINE.fullmatch(last)["location"])
    assert str(table.metadata.table_uuid) == str(StaticTable.from_metadata(first).metadata.table_uuid)  # adopted
    got = table_rows(table)
    assert len(got) == len(set(got)) and got == model.append_rows(offsets) and offsets == _log_ends(lm, "f")


# ---------------------------------------------------------------- describe


def _tables_section(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("TOPIC") and "OFFSETS-BEHIND" in line)
    assert lines[start].split() == [
        "TOPIC",
        "TABLE",
        "MODE",
        "OFFSETS-BEHIND",
        "TIME-BEHIND-MS",
        "LAST-COMMIT-MS",
        "GAPS",
    ]
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_describe_shows_each_tables_lag(root):
    lm, model, work = _topic(root, "lag", 53)
    for p in range(PARTITIONS):
        work.plain_batch(p, 4)
    before = time.time_ns() // 1_000_000
    assert _cli("table", root, "--topic", "lag")[0] == 0
    after = time.time_ns() // 1_000_000
    committed_at = read_state(lm.fs, lm.root, "lag").committed_at_ms
    assert before <= committed_at <= after
    rc, out, err = _cli("describe", root)
    assert _tables_section(out) == [["lag", "kafkalog.lag", "append", "0", "0", str(committed_at), "0"]]

    in_table = {p: max(r.ts for r in model.records if r.partition == p) for p in range(PARTITIONS)}
    work.plain_batch(0, 3)
    work.plain_batch(1, 2)
    work.plain_batch(0, 1)
    newest = {p: max(r.ts for r in model.records if r.partition == p) for p in range(PARTITIONS)}
    time_behind = max(newest[p] - in_table[p] for p in range(PARTITIONS))
    assert time_behind > 0
    rc, out, err = _cli("describe", root)
    assert rc == 0
    assert _tables_section(out) == [["lag", "kafkalog.lag", "append", "6", str(time_behind), str(committed_at), "0"]]
    rc, out, err = _cli("describe", root, "--json", "--topic", "lag")
    table = json.loads(out)["topics"][0]["table"]
    assert (table["table"], table["offsetsBehind"], table["timeBehindMs"]) == ("kafkalog.lag", 6, time_behind)
    assert table["nextOffsets"] == {"0": 4, "1": 4} and table["committedAtMs"] == committed_at

    assert _cli("topics", root, "--alter", "--topic", "lag", "--add-config", "table.mode=off")[0] == 0
    rc, out, err = _cli("describe", root)
    assert _tables_section(out)[0][2] == "append (paused: table.mode=off)"
    assert _cli("topics", root, "--alter", "--topic", "lag", "--add-config", "table.mode=append")[0] == 0
    assert _cli("table", root, "--topic", "lag")[0] == 0
    rc, out, err = _cli("describe", root, "--json")
    table = json.loads(out)["topics"][0]["table"]
    assert (table["offsetsBehind"], table["timeBehindMs"]) == (0, 0)


# ---------------------------------------------------------------- maintain


def test_maintain_once_prints_a_line_per_table(root):
    lm, model, work = _topic(root, "m", 54)
    for _ in range(10):
        work.plain_batch(work.rng.randrange(PARTITIONS))
    values = [b'{"id": 1, "name": "a"}', b'{"id": 2}', b"not json", b'{"id": "three"}']
    LogManager(root).create_topic(
        "j", 1, {"table.mode": "append", "table.value.format": "json", "table.value.schema": "id BIGINT, name STRING"}
    )
    json_work = Workload(lm, TopicModel("j", 1), 55)
    json_work.keyed_batch(0, [(b"k", v) for v in values])

    rc, out, err = _cli("maintain", root, "--once")
    assert (rc, err) == (0, ""), out
    lines = out.splitlines()
    j, m = REPORT.fullmatch(lines[0]), REPORT.fullmatch(lines[1])
    assert j and m, out
    assert (j["topic"], j["state"], j["rows"], j["errors"], j["behind"]) == ("j", "committed", "4", "2", "0")
    assert (m["topic"], m["state"], m["rows"], m["behind"]) == ("m", "committed", str(len(model.records)), "0")
    assert all(not line.startswith("table ") for line in lines[2:])
    assert lines[-1] == "maintenance pass: 3 partition(s), 0 failed, 0 bytes freed, 2 table(s) (0 failed)"

    rc, out, err = _cli("maintain", root, "--once", "--topic", "m")
    assert rc == 0
    assert REPORT.fullmatch(out.splitlines()[0])["state"] == "nothing new"
    assert out.splitlines()[-1].endswith(", 1 table(s) (0 failed)")


def test_maintain_in_a_loop_runs_a_pass_per_interval(root, monkeypatch):
    import storage.log_maintenance as maintenance

    lm, model, work = _topic(root, "loop", 56)
    for _ in range(8):
        work.plain_batch(work.rng.randrange(PARTITIONS))
    real = maintenance.run_once
    passes = []

    def one_pass(*args, **kwargs):
        if len(passes) == 1:  # records come in between the first pass and the second
            for _ in range(5):
                work.plain_batch(work.rng.randrange(PARTITIONS))
        if len(passes) == 2:
            raise KeyboardInterrupt  # Ctrl-C at the third
        reports = real(*args, **kwargs)
        passes.append((reports.tables[0], read_state(lm.fs, lm.root, "loop").next_offsets, _log_ends(lm, "loop")))
        return reports

    monkeypatch.setattr(maintenance, "run_once", one_pass)
    rc, out, err = _cli("maintain", root, "--interval-ms", "1")
    assert rc == INTERRUPTED and err.endswith("kafkalog: interrupted\n"), err
    assert len(passes) == 2
    waits = err.splitlines()[:-1]  # after each pass, the line saying when the next one runs
    assert len(waits) == 2 and all(re.fullmatch(r"next pass at .+ \(in 0(\.001)? s\); Ctrl-C stops", w) for w in waits)
    reports = [REPORT.fullmatch(line) for line in out.splitlines() if line.startswith("table ")]
    assert [(r["state"], r["behind"]) for r in reports] == [("committed", "0"), ("committed", "0")]
    first, second = passes
    assert first[1] == first[2] and second[1] == second[2] and second[2] != first[2]  # caught up, each time
    assert int(reports[0]["rows"]) == len(model.append_rows(first[2]))
    assert int(reports[1]["rows"]) == len(model.append_rows(second[2])) - len(model.append_rows(first[2]))
    assert len([line for line in out.splitlines() if line.startswith("maintenance pass: ")]) == 2
    table, offsets = _table_at(second[0].metadata_location)
    assert offsets == second[2] and table_rows(table) == model.append_rows(offsets)
