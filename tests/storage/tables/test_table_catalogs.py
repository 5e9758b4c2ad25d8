"""A topic's table in catalogs other than ROOT's own (storage/tables/catalog.py), against the model
(tests/helpers/table_model.py):

- Iceberg's own REST catalog server (tools/iceberg/rest_catalog.py, started once for the module as the Kafka
  broker is), named by table.catalog=rest and configured the pyiceberg way with PYICEBERG_CATALOG__REST__*
  variables, read anew at each pass: several passes of a random workload, each table equal to the model, and a
  second pyiceberg client of the server sees the rows and the offsets in the snapshot summary;
- a log on S3 (the moto server) with table.catalog naming a pyiceberg SQL catalog (a local SQLite file, set in
  .pyiceberg.yaml) whose warehouse is on the same S3: the FileIO reaches the S3 server with the log's own
  storage options only (the environment holds a wrong key and no endpoint), by `kafkalog table --fs` too;
- ROOT's own catalog needs a ROOT on local disk: on S3 the pass fails with one line saying to set table.catalog.

Without Java or Maven the REST tests skip with one line saying what is missing, unless
KAFKALOG_REQUIRE_ICEBERG=1 (then they fail).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re

import pytest

pytest.importorskip("pyiceberg")

from pyiceberg.catalog import load_catalog  # noqa: E402
from pyiceberg.table import StaticTable  # noqa: E402

from kafkalog_ds.cli import main  # noqa: E402
from storage.log_config import LogConfig
from storage.log_manager import LogManager
from storage.metadata.topic_metadata import TopicMetadata, topic_file_name  # noqa: E402
from storage.tables.catalog import catalog_properties, io_properties  # noqa: E402
from storage.tables.materializer import materialize_topic  # noqa: E402
from storage.tables.table_config import TableConfig  # noqa: E402
from storage.tables.table_offsets import NEXT_OFFSETS  # noqa: E402
from storage.tables.table_state import read_state  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402
from tests.helpers.table_model import TopicModel, Workload, table_rows  # noqa: E402
from tools.iceberg import jars  # noqa: E402
from tools.iceberg.rest_catalog import RestCatalogServer  # noqa: E402

REQUIRE = "KAFKALOG_REQUIRE_ICEBERG"
NAMESPACE = "kl_rest"


@pytest.fixture(autouse=True)
def _no_pyiceberg_config_but_the_tests(monkeypatch, tmp_path_factory):
    """No catalog configuration from the machine: no PYICEBERG_* variable, and an empty PYICEBERG_HOME (looked
    in before the home directory)."""
    for k in list(os.environ):
        if k.upper().startswith("PYICEBERG_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path_factory.mktemp("pyiceberg-home")))


@pytest.fixture(scope="module")
def rest_server(tmp_path_factory):
    """Iceberg's RESTCatalogServer for this module: started once, stopped at the end."""
    server = RestCatalogServer(tmp_path_factory.mktemp("iceberg-rest"))
    error = None
    try:
        server.start()
    except jars.Unavailable as e:
        error = e
    if error is not None:  # outside the except: the skip quotes no traceback of its cause
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"the Iceberg tests cannot run: {error}", pytrace=False)
        pytest.skip(str(error).splitlines()[0])
    yield server
    server.stop()


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _summary_offsets(table) -> dict[int, int]:
    return {int(p): o for p, o in json.loads(table.current_snapshot().summary[NEXT_OFFSETS]).items()}


def _last_stable_offsets(lm, topic: str, partitions: int) -> dict[int, int]:
    out = {}
    for p in range(partitions):
        with lm.open_log(TopicPartition(topic, p)) as log:
            out[p] = log.last_stable_offset
    return out


# ---------------------------------------------------------------- Iceberg's REST catalog


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_table_in_a_rest_catalog_equals_the_model_after_every_pass(rest_server, root, monkeypatch, mode):
    topic = f"rest.{mode}"  # the table: kl_rest.rest_<mode>
    lm = LogManager(root)
    config = {"table.mode": mode, "table.catalog": "rest", "table.namespace": NAMESPACE, "retention.ms": "-1"}
    if mode == "upsert":
        config["cleanup.policy"] = "compact"
    lm.create_topic(topic, 3, config)
    model = TopicModel(topic, 3)
    work = Workload(lm, model, seed=30 if mode == "append" else 31, keys=10)
    for _ in range(10):
        work.step()

    # the catalog is looked up when a pass opens it, not when kafkalog is imported: unset, one line saying how
    rep = materialize_topic(lm, topic)
    assert rep.error == (
        f"topic '{topic}': table.catalog=rest names no pyiceberg catalog: configure it in ~/.pyiceberg.yaml "
        f"(catalog: rest: ...) or with PYICEBERG_CATALOG__REST__URI"
    )
    monkeypatch.setenv("PYICEBERG_CATALOG__REST__URI", rest_server.uri)  # a REST catalog by its URI alone

    reader = load_catalog("another-client", type="rest", uri=rest_server.uri)
    identifier = (NAMESPACE, topic.replace(".", "_"))
    for round_ in range(4):
        for _ in range(20):
            work.step()
        if round_ == 2:
            work.close_transactions()
        rep = materialize_topic(lm, topic)
        assert rep.error is None and rep.committed, rep.line()
        assert rep.metadata_location.startswith("file:" + str(rest_server.warehouse_dir.resolve()))
        table = reader.load_table(identifier)  # the server's answer, not the writer's view
        assert table.metadata_location == rep.metadata_location
        offsets = _summary_offsets(table)
        assert read_state(lm.fs, lm.root, topic).next_offsets == offsets
        want = model.upsert_rows(offsets) if mode == "upsert" else model.append_rows(offsets)
        got = table_rows(table)
        assert len(got) == len(set(got)), "a row twice"
        assert got == want
    assert offsets == _last_stable_offsets(lm, topic, 3)  # caught up: every transaction was closed
    assert [s.summary.operation.value for s in table.snapshots()][0] == "append"
    assert all(NEXT_OFFSETS in s.summary.additional_properties for s in table.snapshots())


# ---------------------------------------------------------------- a SQL catalog with its warehouse on S3


def _signed_with(app, seen: list):
    """Records (method, path, access key id of the request's signature) of every request."""

    def wsgi(environ, start_response):
        found = re.search(r"Credential=([^/]+)/", environ.get("HTTP_AUTHORIZATION", ""))
        seen.append((environ.get("REQUEST_METHOD"), environ.get("PATH_INFO", ""), found and found.group(1)))
        return app(environ, start_response)

    return wsgi


@pytest.fixture
def s3_requests(s3_server, monkeypatch):
    """The session's S3 server, the access key of each request recorded."""
    seen: list = []
    monkeypatch.setattr(s3_server._app, "_app", _signed_with(s3_server._app._app, seen))
    return seen


def test_a_sql_catalog_with_its_warehouse_on_s3_writes_with_the_logs_storage_options(
    s3_root, s3_requests, tmp_path, monkeypatch
):
    from tools.s3_server import ACCESS_KEY, REGION, SECRET_KEY

    url, storage_options = s3_root
    root, warehouse = url + "/logs", url + "/wh"
    home = tmp_path / "home"
    home.mkdir()
    (home / ".pyiceberg.yaml").write_text(
        f"catalog:\n  s3cat:\n    type: sql\n    uri: sqlite:///{tmp_path / 's3cat.db'}\n    warehouse: {warehouse}\n"
    )
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    # only the log's storage options say where the S3 server is and with which key: the environment has a
    # wrong key (moto takes any key, so each request's signature is checked below) and no endpoint
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key-not-to-be-used")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret-not-to-be-used")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    lm = LogManager(root, storage_options)
    lm.create_topic("s3t", 2, {"table.mode": "append", "table.catalog": "s3cat", "retention.ms": "-1"})
    cfg = TableConfig.of("s3t", lm.topic("s3t").config)
    name, props = catalog_properties(lm, cfg, storage_options)
    assert name == "s3cat" and props["type"] == "sql" and props["warehouse"] == warehouse
    assert {k: v for k, v in props.items() if k.startswith("s3.")} == {
        "s3.endpoint": storage_options["endpoint_url"],
        "s3.access-key-id": ACCESS_KEY,
        "s3.secret-access-key": SECRET_KEY,
        "s3.region": REGION,
    }

    model = TopicModel("s3t", 2)
    work = Workload(lm, model, seed=32)
    fs_flags = [
        f"--fs=endpoint_url={storage_options['endpoint_url']}",
        f"--fs=key={ACCESS_KEY}",
        f"--fs=secret={SECRET_KEY}",
        f'--fs=client_kwargs={{"region_name": "{REGION}"}}',
    ]
    for round_ in range(2):
        for _ in range(6):
            work.step()
        if round_ == 1:  # the command's --fs options reach the FileIO too
            rc, out, err = _cli("table", root, *fs_flags, "--topic", "s3t")
            assert rc == 0, out + err
            location = out.splitlines()[-1].split(": ", 1)[1]
        else:
            rep = materialize_topic(lm, "s3t", storage_options=storage_options)
            assert rep.error is None and rep.committed, rep.line()
            location = rep.metadata_location
        assert location.startswith(warehouse + "/kafkalog/s3t/metadata/")
        table = StaticTable.from_metadata(location, properties=io_properties(storage_options))
        offsets = _summary_offsets(table)
        assert table_rows(table) == model.append_rows(offsets)
    work.close_transactions()
    rep = materialize_topic(lm, "s3t", storage_options=storage_options)
    table = StaticTable.from_metadata(rep.metadata_location, properties=io_properties(storage_options))
    assert _summary_offsets(table) == _last_stable_offsets(lm, "s3t", 2)
    assert table_rows(table) == model.append_rows(_summary_offsets(table))

    prefix = "/" + url.removeprefix("s3://") + "/wh/"
    written = [(m, p, key) for m, p, key in s3_requests if p.startswith(prefix) and m in ("PUT", "POST")]
    assert any(p.endswith(".parquet") for _, p, _ in written) and any(p.endswith(".avro") for _, p, _ in written)
    assert {key for _, p, key in s3_requests if p.startswith(prefix)} == {ACCESS_KEY}


def test_a_catalogs_own_s3_properties_win_over_the_logs(root, monkeypatch):
    lm = LogManager(root)
    lm.create_topic("o", 1, {"table.mode": "append", "table.catalog": "elsewhere"})
    monkeypatch.setenv("PYICEBERG_CATALOG__ELSEWHERE__URI", "http://127.0.0.1:1")
    monkeypatch.setenv("PYICEBERG_CATALOG__ELSEWHERE__S3__ENDPOINT", "http://catalog-s3:9000")
    log_options = {"endpoint_url": "http://log-s3:9000", "key": "log-key", "secret": "log-secret"}
    _, props = catalog_properties(lm, TableConfig.of("o", lm.topic("o").config), log_options)
    assert props["s3.endpoint"] == "http://catalog-s3:9000"
    assert props["s3.access-key-id"] == "log-key" and props["uri"] == "http://127.0.0.1:1"


def test_roots_own_catalog_needs_a_root_on_local_disk(s3_root):
    """A table config with no table.catalog on an object-store ROOT is refused when it is set; a topic file
    that has one anyway (written by hand) fails its pass, in one line either way."""
    url, storage_options = s3_root
    root = url + "/logs"
    fs_args = [f"--fs=endpoint_url={storage_options['endpoint_url']}"]
    fs_args += [f"--fs=key={storage_options['key']}", f"--fs=secret={storage_options['secret']}"]
    rc, out, err = _cli("topics", root, *fs_args, "--create", "--topic", "d", "--config", "table.mode=append")
    why = (
        "is not on local disk, so it has no table catalog of its own (SQLite needs a local file): set "
        "table.catalog to a pyiceberg catalog (docs/tables.md, 'Catalogs')"
    )
    assert (rc, out) == (1, "") and err == f"kafkalog: error: topic 'd': {root} {why}\n"
    lm = LogManager(root, storage_options)
    lm.create_topic("d", 1)
    meta = lm.topic("d")
    by_hand = TopicMetadata("d", 1, LogConfig.from_dict({"table.mode": "append"}), meta.topic_id)
    lm.fs.write_atomic(lm.fs.join(lm.root, topic_file_name("d")), by_hand.to_bytes())
    Workload(LogManager(root, storage_options), TopicModel("d", 1), seed=33).plain_batch(0, 3)
    rc, out, err = _cli("table", root, *fs_args, "--topic", "d")
    assert (rc, out) == (1, "")
    assert err == (
        f"kafkalog: error: {root} is not on local disk, so it has no catalog of its own (SQLite needs a local "
        f"file): set table.catalog to a pyiceberg catalog (docs/tables.md, 'Catalogs')\n"
    )
