"""Bad input and faults around a topic's table (issue 30, item 9): each gives ONE line, through the commands a
user runs (`kafkalog table`, `kafkalog maintain --once`, `kafkalog topics`), and the log is never touched: every
file under the partition directories has the same bytes after the failure as before.

- the catalog cannot be reached: a REST catalog on a port nobody listens on; a SQL catalog on a database server
  that is not there (its password never shown);
- someone else changed the table: its schema, its partitioning, kafkalog's properties on it, an append to a new
  table with no kafkalog offsets; dropped it (the line names `kafkalog table ROOT --topic T --forget`, after
  which a pass makes a new table from the log start, equal to the model); dropped and made it again;
- the declared value schema does not parse (`topics --create` and `--alter`);
- a table config changed on a topic that has a table (refused; table.mode=off and back is a pause);
- the tables extra is missing: a table config fails with one line naming `kafkalog-ds[tables]`, and the
  maintenance job reports that line for the table, exits 1, and still does the other topics' retention while
  it holds the table's segments.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import re
import socket
import subprocess
import sys

import pyarrow as pa
import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.table import StaticTable  # noqa: E402
from pyiceberg.transforms import BucketTransform  # noqa: E402
from pyiceberg.types import StringType  # noqa: E402

from kafkalog_ds.cli import main  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402
from storage.tables import table_schema as ts  # noqa: E402
from storage.tables.catalog import open_catalog  # noqa: E402
from storage.tables.table_config import TABLES_EXTRA, TableConfig  # noqa: E402
from storage.tables.table_offsets import NEXT_OFFSETS  # noqa: E402
from storage.tables.table_state import read_state  # noqa: E402
from storage.topic_partition import parse_partition_dir  # noqa: E402
from tests.helpers.table_model import DAY, TopicModel, Workload, table_rows  # noqa: E402

PARTITIONS = 2
EXTRA_LINE = "topic '{topic}' has a table config (table.mode), which needs pyiceberg: pip install 'kafkalog-ds[tables]'"


@pytest.fixture(autouse=True)
def _no_pyiceberg_config_but_the_tests(monkeypatch, tmp_path_factory):
    for k in list(os.environ):
        if k.upper().startswith("PYICEBERG_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path_factory.mktemp("pyiceberg-home")))


# ---------------------------------------------------------------- helpers


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _error_line(rc: int, out: str, err: str) -> str:
    """The message of a command that failed with one line and nothing else: `kafkalog: error: <message>` on
    stderr, or (`kafkalog table`) the pass's report `table of <topic>: FAILED: <message>` on stdout."""
    assert rc == 1, (rc, out, err)
    assert len((out + err).splitlines()) == 1, out + err
    if err:
        assert out == "" and err.startswith("kafkalog: error: ") and err.endswith("\n"), err
        return err[len("kafkalog: error: ") : -1]
    found = re.fullmatch(r"table of \S+: FAILED: (.+)\n", out)
    assert found, out
    return found.group(1)


def _maintain_error_line(root: str, topic: str) -> str:
    """`kafkalog maintain --once`: exit 1, the failed table's one line, every other line a success."""
    rc, out, err = _cli("maintain", root, "--once")
    assert rc == 1 and err == "", (rc, out, err)
    lines = out.splitlines()
    failed = [line for line in lines if ": FAILED: " in line]
    assert len(failed) == 1 and failed[0].startswith(f"table of {topic}: FAILED: "), out
    assert re.fullmatch(r"maintenance pass: \d+ partition\(s\), 0 failed, .* 1 table\(s\) \(1 failed\)", lines[-1]), out
    return failed[0].removeprefix(f"table of {topic}: FAILED: ")


def _log_files(root: str) -> dict[str, str]:
    """sha256 of every file under the partition directories of ROOT."""
    out = {}
    for d in sorted(os.listdir(root)):
        if parse_partition_dir(d) is None or not os.path.isdir(os.path.join(root, d)):
            continue
        for base, _, files in os.walk(os.path.join(root, d)):
            for f in files:
                path = os.path.join(base, f)
                with open(path, "rb") as fh:
                    out[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    assert out
    return out


def _topic(root: str, topic: str, seed: int, steps: int = 12, **config):
    """A topic with a table config and committed records (every transaction closed), kept from retention."""
    lm = LogManager(root)
    lm.create_topic(topic, PARTITIONS, {"table.mode": "append", "retention.ms": "-1", **config})
    model = TopicModel(topic, PARTITIONS)
    work = Workload(lm, model, seed)
    for _ in range(steps):
        work.step()
    work.close_transactions()
    return lm, model, work


def _pass(root: str, topic: str) -> str:
    """`kafkalog table`: committed; returns the metadata location its last line names."""
    rc, out, err = _cli("table", root, "--topic", topic)
    assert rc == 0 and err == "", out + err
    return out.splitlines()[-1].split(": ", 1)[1]


def _catalog_table(lm, topic: str):
    cfg = TableConfig.of(topic, lm.topic(topic).config)
    catalog = open_catalog(lm, cfg)
    return catalog, cfg, catalog.load_table(cfg.identifier)


def _equals_the_model(location: str, model: TopicModel, lm) -> None:
    """The table holds the model's rows, once each, up to the log end of every partition (caught up)."""
    table = StaticTable.from_metadata(location)
    offsets = {int(p): o for p, o in json.loads(table.current_snapshot().summary[NEXT_OFFSETS]).items()}
    got = table_rows(table)
    assert len(got) == len(set(got)) and got == model.append_rows(offsets)
    for tp in lm.partitions(model.topic):
        with lm.open_log(tp) as log:
            assert offsets[tp.partition] == log.log_end_offset


def _refused_and_untouched(root: str, lm, topic: str, work, *, maintain: bool = False) -> str:
    """New records, then a pass that fails: its one line; the log's files and the table state as before."""
    work.plain_batch(0, 3)
    before, state = _log_files(root), read_state(lm.fs, lm.root, topic)
    line = _maintain_error_line(root, topic) if maintain else _error_line(*_cli("table", root, "--topic", topic))
    assert _log_files(root) == before
    assert read_state(lm.fs, lm.root, topic) == state
    return line


# ---------------------------------------------------------------- the catalog cannot be reached


@pytest.fixture
def closed_port():
    """A port bound and not listening: a connection to it is refused for as long as the test runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_a_rest_catalog_that_cannot_be_reached(root, closed_port, monkeypatch):
    monkeypatch.setenv("PYICEBERG_CATALOG__DOWN__URI", f"http://127.0.0.1:{closed_port}")
    lm, _, work = _topic(root, "u", seed=40, **{"table.catalog": "down"})
    prefix = f"topic 'u': catalog 'down' (http://127.0.0.1:{closed_port}) cannot be reached: ConnectionError: "
    assert _refused_and_untouched(root, lm, "u", work).startswith(prefix)
    assert _refused_and_untouched(root, lm, "u", work, maintain=True).startswith(prefix)
    assert read_state(lm.fs, lm.root, "u") is None  # no pass ever got as far as the table
    assert lm.table_hold(lm.partitions("u")[0]) == 0  # so retention keeps every offset


def test_a_sql_catalog_on_a_database_server_that_cannot_be_reached(root, closed_port, monkeypatch):
    """Whatever stops it (pyiceberg's postgres driver missing, or the refused connection), one line naming the
    catalog, with the password of its URI never shown."""
    uri = f"postgresql+psycopg2://kafkalog:s3cret-pw@127.0.0.1:{closed_port}/tables"
    monkeypatch.setenv("PYICEBERG_CATALOG__PG__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__PG__URI", uri)
    lm, _, work = _topic(root, "pg", seed=41, **{"table.catalog": "pg"})
    line = _refused_and_untouched(root, lm, "pg", work)
    head = f"topic 'pg': catalog 'pg' (postgresql+psycopg2://***@127.0.0.1:{closed_port}/tables) cannot be "
    # without pyiceberg's postgres driver the catalog "cannot be opened: NotInstalledError: ..."; with it, the
    # refused connection "cannot be reached: OperationalError: ..."
    assert line.startswith((head + "opened: NotInstalledError: ", head + "reached: "))
    assert "s3cret-pw" not in line


# ---------------------------------------------------------------- someone else changed the table


def _add_column(table) -> None:
    with table.update_schema() as update:
        update.add_column("added_by_someone", StringType())


def _bucket_the_offsets(table) -> None:
    with table.update_spec() as update:
        update.add_field("offset", BucketTransform(4), "offset_bucket")


def _properties(**props):
    def change(table) -> None:
        with table.transaction() as tx:
            tx.set_properties(props)

    return change


@pytest.mark.parametrize(
    "change,expected",
    [
        (
            _add_column,
            r"table kafkalog\.c of topic 'c': its schema was changed: it is table \{ .* 12: added_by_someone: "
            r"optional string \}; kafkalog will not write to it",
        ),
        (
            _bucket_the_offsets,
            r"table kafkalog\.c of topic 'c': its partitioning was changed: it is \[\('timestamp_day', 'day'\), "
            r"\('offset_bucket', 'bucket\[4\]'\)\], kafkalog writes \[\('timestamp_day', 'day'\)\]; kafkalog will "
            r"not write to it",
        ),
        (
            _properties(**{"kafkalog.topic": "another"}),
            r"table kafkalog\.c of topic 'c': it is not kafkalog's table of topic 'c' \(kafkalog\.topic="
            r"'another', kafkalog\.role='table'\); kafkalog will not write to it",
        ),
        (
            _properties(**{"kafkalog.table-config": '{"table.partition.by":"hour"}'}),
            r"table kafkalog\.c of topic 'c': it was made from other table configs \(\{\"table\.partition\.by\":"
            r"\"hour\"\}\); kafkalog will not write to it",
        ),
        (
            _properties(**{"commit.retry.num-retries": "4"}),
            r"table kafkalog\.c of topic 'c': its property commit\.retry\.num-retries was changed from 0: pyiceberg "
            r"would then re-apply a refused commit with stale offsets; kafkalog will not write to it",
        ),
    ],
    ids=["schema", "partitioning", "topic-property", "config-property", "commit-retries"],
)
def test_a_table_someone_else_changed_is_not_written(root, change, expected):
    lm, model, work = _topic(root, "c", seed=42)
    _pass(root, "c")
    catalog, cfg, table = _catalog_table(lm, "c")
    change(table)
    changed = catalog.load_table(cfg.identifier).metadata_location
    line = _refused_and_untouched(root, lm, "c", work)
    assert re.fullmatch(expected, line), line
    assert catalog.load_table(cfg.identifier).metadata_location == changed  # nothing committed by kafkalog


def test_a_new_table_someone_else_appended_to_is_not_written(root):
    lm = LogManager(root)
    lm.create_topic("n", PARTITIONS, {"table.mode": "append", "retention.ms": "-1"})
    _pass(root, "n")  # an empty topic: the table is made, with no snapshot
    _, _, table = _catalog_table(lm, "n")
    assert table.current_snapshot() is None
    table.append(pa.Table.from_pylist([{"topic": "n", "partition": 0, "offset": 0}], schema=ts.arrow_schema()))
    work = Workload(lm, TopicModel("n", PARTITIONS), 43)
    line = _refused_and_untouched(root, lm, "n", work, maintain=True)
    assert line == (
        "table kafkalog.n has snapshots but none of kafkalog's (kafkalog.next-offsets in its summary): someone "
        "else wrote it; kafkalog will not write to it"
    )


def test_a_dropped_table_names_forget_and_then_a_new_one_starts_from_the_log_start(root):
    lm, model, work = _topic(root, "d", seed=44)
    _pass(root, "d")
    catalog, cfg, _ = _catalog_table(lm, "d")
    held = read_state(lm.fs, lm.root, "d").next_offsets
    catalog.drop_table(cfg.identifier)
    line = _refused_and_untouched(root, lm, "d", work)
    assert line == (
        f"table kafkalog.d of topic 'd' was dropped from ROOT's own catalog (it held offsets partition 0: "
        f"{held[0]}, partition 1: {held[1]}); `kafkalog table ROOT --topic d --forget`, then a pass makes a new "
        f"table from the log start"
    )
    assert lm.table_hold(lm.partitions("d")[0]) == held[0]  # retention still waits where the table was
    assert _cli("table", root, "--topic", "d", "--forget") == (0, "Forgot the table of topic d.\n", "")
    _equals_the_model(_pass(root, "d"), model, lm)


def test_a_table_dropped_and_made_again_by_someone_else_is_not_written(root):
    lm, model, work = _topic(root, "r", seed=45)
    _pass(root, "r")
    catalog, cfg, old = _catalog_table(lm, "r")
    catalog.drop_table(cfg.identifier)
    schema = ts.table_schema()
    new = catalog.create_table(  # as kafkalog makes it: only its uuid tells it from the old one
        cfg.identifier,
        schema=schema,
        partition_spec=ts.partition_spec(schema, "day"),
        sort_order=ts.sort_order(schema),
        properties=ts.table_properties(cfg, lm.topic("r").topic_id, "table"),
    )
    line = _refused_and_untouched(root, lm, "r", work)
    assert line == (
        f"table kafkalog.r of topic 'r' was dropped and made again by someone else (its uuid is "
        f"{new.metadata.table_uuid}, kafkalog's was {old.metadata.table_uuid}); `kafkalog table ROOT --topic r "
        f"--forget` to write to the new one from the log start"
    )
    assert _cli("table", root, "--topic", "r", "--forget")[0] == 0
    _equals_the_model(_pass(root, "r"), model, lm)


# ---------------------------------------------------------------- the declared schema, a config change


SCHEMA_LINE = (
    "Invalid value 'id BIGINTT' for configuration table.value.schema: unknown type 'BIGINTT' (field id, "
    "position 3); the supported types are BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, DECIMAL, "
    "STRING, VARCHAR, CHAR, DATE, TIMESTAMP, TIMESTAMP_LTZ, TIMESTAMP_NTZ, ARRAY<...>, STRUCT<...>"
)


def test_an_invalid_declared_schema_is_refused_in_one_line(root):
    json_table = ["--config", "table.mode=append", "--config", "table.value.format=json"]
    line = _error_line(
        *_cli("topics", root, "--create", "--topic", "j", *json_table, "--config", "table.value.schema=id BIGINTT")
    )
    assert line == SCHEMA_LINE
    assert not os.path.exists(os.path.join(root, "j-0"))
    assert (
        _cli("topics", root, "--create", "--topic", "j", *json_table, "--config", "table.value.schema=id BIGINT")[0]
        == 0
    )
    before = _log_files(root)
    line = _error_line(
        *_cli("topics", root, "--alter", "--topic", "j", "--add-config", "table.value.schema=id BIGINTT")
    )
    assert line == SCHEMA_LINE
    assert LogManager(root).topic("j").config.table_value_schema == "id BIGINT"
    assert _log_files(root) == before


def test_a_table_config_change_is_refused_and_a_pause_is_not(root):
    lm, model, work = _topic(root, "p", seed=46)
    _pass(root, "p")
    before = _log_files(root)
    line = _error_line(*_cli("topics", root, "--alter", "--topic", "p", "--add-config", "table.partition.by=hour"))
    assert line == (
        "topic 'p' already has the table kafkalog.p: its table configs cannot change (table.partition.by: 'day' "
        "-> 'hour'); set table.mode=off to stop it, or `kafkalog table ROOT --topic p --forget` and a new table.name "
        "(or drop the old table) to start a new one"
    )
    line = _error_line(
        *_cli("topics", root, "--alter", "--topic", "p", "--add-config", "table.mode=upsert,cleanup.policy=compact")
    )
    assert "(table.mode: 'append' -> 'upsert')" in line
    assert _log_files(root) == before
    assert LogManager(root).topic("p").config.overrides == {"table.mode": "append", "retention.ms": "-1"}

    # a pause: table.mode=off (or the key deleted), no pass while off, then the same mode again
    assert _cli("topics", root, "--alter", "--topic", "p", "--add-config", "table.mode=off")[0] == 0
    paused = _error_line(*_cli("table", root, "--topic", "p"))
    assert paused.startswith("topic 'p' has no table: set one with kafkalog topics ROOT --alter --topic p")
    line = _error_line(*_cli("topics", root, "--alter", "--topic", "p", "--add-config", "table.name=other"))
    assert "(table.name: 'p' -> 'other')" in line  # paused, the table's configs still cannot change
    assert _cli("topics", root, "--alter", "--topic", "p", "--delete-config", "table.mode")[0] == 0
    for _ in range(6):
        work.step()
    work.close_transactions()
    assert _cli("topics", root, "--alter", "--topic", "p", "--add-config", "table.mode=append")[0] == 0
    _equals_the_model(_pass(root, "p"), model, lm)


def test_a_table_config_changed_behind_kafkalogs_back_is_not_written(root, monkeypatch):
    """A topic file edited by something that did not check (an older kafkalog, a hand): the pass refuses."""
    import storage.log_manager as log_manager

    lm, _, work = _topic(root, "h", seed=47)
    _pass(root, "h")
    monkeypatch.setattr(log_manager, "check_change", lambda *a: None)
    LogManager(root).alter_topic_config("h", {"table.partition.by": "hour"})
    line = _refused_and_untouched(root, lm, "h", work, maintain=True)
    assert line == (
        "topic 'h': its table configs changed since its table kafkalog.h was made (table.partition.by: 'day' -> "
        "'hour'); set them back, or `kafkalog table ROOT --topic h --forget`"
    )


# ---------------------------------------------------------------- the tables extra


def _hide_pyiceberg(monkeypatch) -> None:
    """pyiceberg as not installed, to the check that looks for it (table_config.require_pyiceberg)."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name == "pyiceberg" or name.startswith("pyiceberg.") else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def _old_topic(lm, topic: str, config: dict) -> None:
    """A topic of 20 small segments of records years old, each past retention.ms."""
    lm.create_topic(topic, 1, {"retention.ms": str(DAY), "segment.bytes": "200", **config})
    work = Workload(lm, TopicModel(topic, 1), 48, tombstones=0)
    for _ in range(20):
        work.plain_batch(0, 2)


def test_without_the_tables_extra_a_table_config_fails_in_one_line(root, monkeypatch):
    _hide_pyiceberg(monkeypatch)
    assert TABLES_EXTRA == "kafkalog-ds[tables]"
    line = _error_line(*_cli("topics", root, "--create", "--topic", "k", "--config", "table.mode=append"))
    assert line == EXTRA_LINE.format(topic="k")
    assert LogManager(root).topics() == []
    assert _cli("topics", root, "--create", "--topic", "k")[0] == 0
    line = _error_line(*_cli("topics", root, "--alter", "--topic", "k", "--add-config", "table.mode=append"))
    assert line == EXTRA_LINE.format(topic="k")
    assert _error_line(*_cli("table", root, "--topic", "k")).startswith("topic 'k' has no table")


def test_without_the_tables_extra_maintain_reports_the_table_and_holds_its_segments(root, monkeypatch):
    lm = LogManager(root)
    _old_topic(lm, "tabled", {"table.mode": "append"})
    _old_topic(lm, "plain", {})
    before = _log_files(root)
    _hide_pyiceberg(monkeypatch)

    assert _maintain_error_line(root, "tabled") == EXTRA_LINE.format(topic="tabled")
    after = _log_files(root)
    assert {k: v for k, v in after.items() if k.startswith("tabled-")} == {
        k: v for k, v in before.items() if k.startswith("tabled-")
    }
    lm = LogManager(root)
    with lm.open_log(lm.partitions("plain")[0]) as log:
        assert log.log_start_offset > 0 and len(log.segments) < 20  # the other topic's retention ran
    with lm.open_log(lm.partitions("tabled")[0]) as log:
        assert log.log_start_offset == 0 and log.log_end_offset == 40


MAINTAIN_WITHOUT_PYICEBERG = r"""
import importlib.abc, importlib.util, sys

class NoPyiceberg(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyiceberg" or name.startswith("pyiceberg."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoPyiceberg())
real = importlib.util.find_spec
importlib.util.find_spec = lambda n, *a, **k: None if n == "pyiceberg" else real(n, *a, **k)
from kafkalog_ds.cli import main
code = main(sys.argv[1:])
assert not [m for m in sys.modules if m.startswith("pyiceberg")], "pyiceberg was imported"
sys.exit(code)
"""


def test_without_the_tables_extra_maintain_and_describe_never_import_pyiceberg(root):
    """In a process where `import pyiceberg` fails: the job and describe run, and report the table's line."""
    lm = LogManager(root)
    _old_topic(lm, "tabled", {"table.mode": "append"})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))

    def run(*argv):
        return subprocess.run(
            [sys.executable, "-c", MAINTAIN_WITHOUT_PYICEBERG, *argv], capture_output=True, text=True, env=env
        )

    done = run("maintain", root, "--once")
    assert done.returncode == 1 and done.stderr == "", done.stderr
    assert f"table of tabled: FAILED: {EXTRA_LINE.format(topic='tabled')}" in done.stdout.splitlines()
    done = run("describe", root)
    assert done.returncode == 0 and "kafkalog.tabled" in done.stdout, done.stdout + done.stderr
