"""The materialization pass against the brute-force model (tests/helpers/table_model.py): random workloads of
plain batches, committed, aborted and open transactions, tombstones and keys that come back, with passes in
between; after every pass the table holds exactly the model's rows, none twice, none of an aborted or open
transaction, and its snapshot summary carries the offsets the rows stop at."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.table import StaticTable  # noqa: E402

from storage.cleaner.cleaner_config import CleanerConfig  # noqa: E402
from storage.cleaner.log_cleaner_manager import LogCleanerManager  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402
from storage.tables.materializer import materialize_topic  # noqa: E402
from storage.tables.table_offsets import NEXT_OFFSETS  # noqa: E402
from storage.tables.table_state import read_state  # noqa: E402
from tests.helpers.table_model import DAY, T0, TopicModel, Workload, table_rows  # noqa: E402


def _offsets(table) -> dict[int, int]:
    summary = table.current_snapshot().summary.additional_properties
    return {int(p): o for p, o in json.loads(summary[NEXT_OFFSETS]).items()}


def _run(lm, topic, model, mode, **kwargs):
    rep = materialize_topic(lm, topic, **kwargs)
    assert rep.error is None, rep.error
    table = StaticTable.from_metadata(rep.metadata_location)
    offsets = _offsets(table) if table.current_snapshot() is not None else {}
    want = model.upsert_rows(offsets) if mode == "upsert" else model.append_rows(offsets)
    got = table_rows(table)
    assert len(got) == len(set(got)), "a row twice"
    assert got == want
    return rep, table, offsets


@pytest.mark.parametrize("mode,seed", [("append", 1), ("append", 2), ("upsert", 3), ("upsert", 4)])
def test_table_equals_the_model_after_every_pass(root, mode, seed):
    lm = LogManager(root)
    config = {"table.mode": mode, "cleanup.policy": "compact" if mode == "upsert" else "delete"}
    lm.create_topic("events", 3, config)
    model = TopicModel("events", 3)
    work = Workload(lm, model, seed, keys=12)
    for round_ in range(6):
        for _ in range(25):
            work.step()
        rep, _, offsets = _run(lm, "events", model, mode)
        lso_held = any(p in work.open for p in range(3))
        assert rep.committed or not model.committed(offsets) or lso_held
        if round_ == 3:
            work.close_transactions()
    work.close_transactions()
    _, _, offsets = _run(lm, "events", model, mode)
    with lm.open_log(lm.partitions("events")[0]) as log:
        assert offsets[0] == log.log_end_offset  # caught up: markers included
    state = read_state(lm.fs, lm.root, "events")
    assert state is not None and state.next_offsets == offsets and state.pending == {}


def test_an_open_transaction_holds_the_table_at_its_first_offset(root):
    lm = LogManager(root)
    lm.create_topic("t", 1, {"table.mode": "append"})
    model = TopicModel("t", 1)
    work = Workload(lm, model, 7, tombstones=0)
    work.plain_batch(0, 3)
    work.transactional_batch(0, 2)
    work.plain_batch(0, 2)  # after the open transaction: held too
    _, table, offsets = _run(lm, "t", model, "append")
    assert offsets == {0: 3} and len(table_rows(table)) == 3
    work.end_transaction(0, "abort")
    _, table, offsets = _run(lm, "t", model, "append")
    assert offsets == {0: 8} and len(table_rows(table)) == 5  # the aborted two never appear


def test_upsert_equals_the_model_with_compaction_running_between_passes(root):
    """The cleaner runs while the table is behind (twice, with new records between: the first cleaning stamps
    tombstones, the second drops them) and may only clean what the table already holds: a tombstone the table
    has not seen must not be dropped before it, or its key would stay in the table."""
    lm = LogManager(root)
    config = {
        "table.mode": "upsert",
        "cleanup.policy": "compact",
        "segment.bytes": "400",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0",
    }
    lm.create_topic("c", 2, config)
    model = TopicModel("c", 2)
    work = Workload(lm, model, 11, keys=6, tombstones=0.4)
    cleaner = LogCleanerManager(lm, CleanerConfig.from_dict({}))
    now = T0 + 400 * DAY
    cleaned = 0
    for _ in range(4):
        for _ in range(2):  # a cleaning stamps tombstones; the next, with new dirty records, drops them
            for _ in range(30):
                work.step()
            work.close_transactions()
            for tp in lm.partitions("c"):
                cleaned += bool(cleaner.clean_partition(tp, now).groups)
            now += DAY
        _run(lm, "c", model, "upsert")
    assert cleaned  # the cleaner did clean what the table held


def test_the_cleaner_keeps_a_tombstone_the_table_has_not_seen(root):
    lm = LogManager(root)
    config = {
        "table.mode": "upsert",
        "cleanup.policy": "compact",
        "segment.bytes": "200",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0",
    }
    lm.create_topic("d", 1, config)
    model = TopicModel("d", 1)
    work = Workload(lm, model, 1)
    work.keyed_batch(0, [(b"a", b"1"), (b"b", b"2")])
    _run(lm, "d", model, "upsert")
    work.keyed_batch(0, [(b"a", None)])  # deletes a; the table has not seen it yet
    cleaner = LogCleanerManager(lm, CleanerConfig.from_dict({}))
    tp = lm.partitions("d")[0]
    now = work.now + DAY
    for i in range(3):  # stamps the tombstone's horizon, then (with new dirty records) would drop it
        work.keyed_batch(0, [(b"x%d" % i, b"%d" % i) for _ in range(3)])
        cleaner.clean_partition(tp, now)
        now += DAY
    _, table, _ = _run(lm, "d", model, "upsert")
    assert b"a" not in {row[3] for row in table_rows(table)}


def test_retention_waits_for_the_table(root):
    lm = LogManager(root)
    lm.create_topic("r", 1, {"table.mode": "append", "retention.ms": "1000", "segment.bytes": "300"})
    model = TopicModel("r", 1)
    work = Workload(lm, model, 5, tombstones=0)
    for _ in range(20):
        work.plain_batch(0)
    tp = lm.partitions("r")[0]
    later = work.now + 10 * DAY
    assert lm.table_hold(tp) == 0
    lm.apply_retention(tp, now_ms=later)
    with lm.open_log(tp) as log:
        assert log.log_start_offset == 0  # nothing went: the table holds nothing yet
    rep = materialize_topic(lm, "r")
    assert rep.committed
    lm.apply_retention(tp, now_ms=later)
    with lm.open_log(tp) as log:
        assert log.log_start_offset > 0
        assert log.log_start_offset <= lm.table_hold(tp)
    _run(lm, "r", model, "append")


def test_delete_records_past_the_table_is_a_gap_in_summary_state_and_describe(root):
    lm = LogManager(root)
    lm.create_topic("g", 1, {"table.mode": "append"})
    model = TopicModel("g", 1)
    work = Workload(lm, model, 9)
    for _ in range(4):
        work.plain_batch(0)
    materialize_topic(lm, "g")
    first = lm.table_hold(lm.partitions("g")[0])
    for _ in range(4):
        work.plain_batch(0, 5)
    cut = first + 5
    lm.delete_records(lm.partitions("g")[0], cut)
    rep = materialize_topic(lm, "g")
    assert rep.gaps == [(0, first, cut)]
    assert "GAP: partition 0 offsets" in rep.line()
    table = StaticTable.from_metadata(rep.metadata_location)
    assert json.loads(table.current_snapshot().summary.additional_properties["kafkalog.gaps"]) == [[0, first, cut]]
    model.records = [r for r in model.records if not first <= r.offset < cut]
    assert table_rows(table) == model.append_rows(_offsets(table))
    desc = lm.describe(["g"]).topics[0].table
    assert desc is not None and desc.gaps == ((0, first, cut),)


def test_two_materializers_never_both_commit_a_range(root, monkeypatch):
    """Pass B runs whole while pass A waits to commit (the race, made deterministic): A's commit is refused,
    A removes its files and commits nothing, and the table holds every row once."""
    from storage.tables import materializer as m

    lm = LogManager(root)
    lm.create_topic("race", 2, {"table.mode": "append"})
    model = TopicModel("race", 2)
    work = Workload(lm, model, 21)
    for _ in range(20):
        work.plain_batch(work.rng.randrange(2))
    real_commit = m.TableMaterializer._commit
    reports = []

    def commit_after_another_pass(self, *args):
        monkeypatch.setattr(m.TableMaterializer, "_commit", real_commit)
        reports.append(materialize_topic(LogManager(root), "race"))  # B: the whole pass, committed first
        return real_commit(self, *args)

    monkeypatch.setattr(m.TableMaterializer, "_commit", commit_after_another_pass)
    a = materialize_topic(lm, "race")
    assert reports[0].committed and not a.committed and a.error is None
    assert reports[0].orphans_removed == 0  # A's files, written and not yet committed, were left alone
    assert "another materializer committed first" in a.line()
    _, table, _ = _run(lm, "race", model, "append")
    files = {t.file.file_path for t in table.scan().plan_files()}
    data_dir = lm.fs.join(lm.root, ".kafkalog-tables", "warehouse", "kafkalog", "race", "data")
    on_disk = {"file://" + str(p) for p in __import__("pathlib").Path(data_dir).rglob("*.parquet")}
    assert on_disk == files  # A's files went


def test_an_engines_own_commit_between_is_retried_over(root, monkeypatch):
    """A commit by someone else that moves no kafkalog offsets (an engine rewriting the data files) comes
    between a pass's read and its commit: the refused commit is made again on top of it, nothing lost or
    twice."""
    from storage.tables import materializer as m
    from storage.tables.catalog import open_catalog
    from storage.tables.table_config import TableConfig

    lm = LogManager(root)
    lm.create_topic("eng", 1, {"table.mode": "append"})
    model = TopicModel("eng", 1)
    work = Workload(lm, model, 22)
    work.plain_batch(0)
    materialize_topic(lm, "eng")
    work.plain_batch(0)
    real_commit = m.TableMaterializer._commit

    def commit_after_a_rewrite(self, *args):
        monkeypatch.setattr(m.TableMaterializer, "_commit", real_commit)
        cfg = TableConfig.of("eng", lm.topic("eng").config)
        t = open_catalog(lm, cfg).load_table(cfg.identifier)
        t.overwrite(t.scan().to_arrow())  # the same rows in new files: a compaction by another engine
        return real_commit(self, *args)

    monkeypatch.setattr(m.TableMaterializer, "_commit", commit_after_a_rewrite)
    rep = materialize_topic(lm, "eng")
    assert rep.committed, rep.line()
    _, table, _ = _run(lm, "eng", model, "append")
    ours = [NEXT_OFFSETS in s.summary.additional_properties for s in table.snapshots()]
    assert ours == [True, False, False, True]  # the engine's delete and append came between, ours after


def test_json_values_become_columns_and_the_ones_that_do_not_parse_go_to_the_errors_table(root):
    """Every record is a row (its raw value kept); a value that does not parse leaves its columns null and is
    also a row of `<name>__errors` with its partition, offset and the error. Errors are committed once even
    when a later pass reads their range again (the errors table keeps its own offsets)."""
    import pyarrow as pa

    from storage.records.builder import build_records
    from storage.tables.catalog import open_catalog
    from storage.tables.table_config import TableConfig
    from storage.topic_partition import TopicPartition

    lm = LogManager(root)
    schema = "id BIGINT, name STRING NOT NULL, tags ARRAY<STRING>"
    lm.create_topic("j", 2, {"table.mode": "append", "table.value.format": "json", "table.value.schema": schema})
    values = {
        0: [b'{"id": 1, "name": "a", "tags": ["x"]}', b"not json", b'{"id": "two", "name": "b"}', None],
        1: [b'{"name": "c"}', b'{"id": 4}', b'{"id": 5, "name": "e", "extra": true}'],
    }
    for p, vs in values.items():
        with lm.open_log(TopicPartition("j", p), writable=True) as log:
            t = pa.table({"key": pa.array([b"k"] * len(vs)), "value": pa.array(vs, pa.binary())})
            log.append(build_records(t.append_column("timestamp", pa.array([T0] * len(vs), pa.int64()))))
    rep = materialize_topic(lm, "j")
    assert rep.error is None and rep.committed and rep.error_rows == 3, rep.line()
    cfg = TableConfig.of("j", lm.topic("j").config)
    catalog = open_catalog(lm, cfg)
    rows = (
        catalog.load_table(cfg.identifier)
        .scan()
        .to_arrow()
        .sort_by([("partition", "ascending"), ("offset", "ascending")])
    )
    assert rows.select(["partition", "offset", "id", "name", "tags"]).to_pylist() == [
        {"partition": 0, "offset": 0, "id": 1, "name": "a", "tags": ["x"]},
        {"partition": 0, "offset": 1, "id": None, "name": None, "tags": None},
        {"partition": 0, "offset": 2, "id": None, "name": None, "tags": None},
        {"partition": 0, "offset": 3, "id": None, "name": None, "tags": None},  # a tombstone: no error
        {"partition": 1, "offset": 0, "id": None, "name": "c", "tags": None},
        {"partition": 1, "offset": 1, "id": None, "name": None, "tags": None},
        {"partition": 1, "offset": 2, "id": 5, "name": "e", "tags": None},
    ]
    assert rows["value"].to_pylist() == values[0] + values[1]
    errors_table = catalog.load_table(cfg.errors_identifier)
    errors = errors_table.scan().to_arrow().sort_by([("partition", "ascending"), ("offset", "ascending")])
    assert [(e["partition"], e["offset"], e["value"]) for e in errors.to_pylist()] == [
        (0, 1, b"not json"),
        (0, 2, b'{"id": "two", "name": "b"}'),
        (1, 1, b'{"id": 4}'),
    ]
    assert all(e and "\n" not in e for e in errors["error"].to_pylist())
    assert "name" in errors["error"][2].as_py()  # the NOT NULL field that was missing
    with lm.open_log(TopicPartition("j", 0), writable=True) as log:  # more records; the errors stay once
        log.append(build_records(pa.table({"value": pa.array([b"{bad"]), "timestamp": pa.array([T0])})))
    rep = materialize_topic(lm, "j")
    assert rep.error_rows == 1
    errors = catalog.load_table(cfg.errors_identifier).scan().to_arrow()
    assert sorted(zip(errors["partition"].to_pylist(), errors["offset"].to_pylist(), strict=True)) == [
        (0, 1),
        (0, 2),
        (0, 4),
        (1, 1),
    ]
